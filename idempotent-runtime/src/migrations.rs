//! The migration SQL, per backend, for runs through an async connection (sync runs use Diesel's
//! embedded migrations of the same directories; a test checks that both list the same files).

/// `(version, up.sql)` of each PostgreSQL migration, oldest first.
#[allow(dead_code)] // used when the backend's async feature is on
pub(crate) const POSTGRES: &[(&str, &str)] = &[
    (
        "20261130000001",
        include_str!("../migrations/postgres/2026-11-30-000001_idempotent_done_jobs/up.sql"),
    ),
    (
        "20261130000002",
        include_str!("../migrations/postgres/2026-11-30-000002_idempotent_outbox/up.sql"),
    ),
];

/// `(version, up.sql)` of each MySQL migration, oldest first.
#[allow(dead_code)] // used when the backend's async feature is on
pub(crate) const MYSQL: &[(&str, &str)] = &[
    (
        "20261130000001",
        include_str!("../migrations/mysql/2026-11-30-000001_idempotent_done_jobs/up.sql"),
    ),
    (
        "20261130000002",
        include_str!("../migrations/mysql/2026-11-30-000002_idempotent_outbox/up.sql"),
    ),
];

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn on_disk(backend: &str) -> Vec<(String, String)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(backend);
        let mut found: Vec<(String, String)> = std::fs::read_dir(&dir)
            .expect("migrations directory")
            .map(|entry| {
                let path = entry.expect("entry").path();
                let name = path
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned();
                let version = name.split('_').next().expect("version").replace('-', "");
                let up = std::fs::read_to_string(path.join("up.sql")).expect("up.sql");
                (version, up)
            })
            .collect();
        found.sort();
        found
    }

    fn listed(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(v, up)| ((*v).to_owned(), (*up).to_owned()))
            .collect()
    }

    #[test]
    fn async_lists_match_the_migration_directories() {
        assert_eq!(listed(super::POSTGRES), on_disk("postgres"));
        assert_eq!(listed(super::MYSQL), on_disk("mysql"));
    }
}
