//! What [`verify`](crate::verify) finds wrong with the runtime's tables: one typed problem each, with
//! what to do about it in its `Display`.

/// One thing [`verify`](crate::verify) found wrong with the runtime's tables, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaProblem {
    /// A table is not where the connection looks for it (`searched` says where that is).
    MissingTable {
        table: &'static str,
        searched: String,
    },
    /// A table lacks a column the runtime's statements use.
    MissingColumn {
        table: &'static str,
        column: &'static str,
    },
    /// The connection's role or user lacks a privilege a worker needs; `grant` gives it.
    MissingPrivilege {
        privilege: &'static str,
        object: String,
        grant: String,
    },
    /// A column the claims rely on being unique has no unique index.
    NoUniqueIndex {
        table: &'static str,
        column: &'static str,
    },
    /// The schema is older than this release needs.
    Older { found: i32, needed: i32 },
    /// The schema was made by a newer release.
    Newer { found: i32, known: i32 },
}

impl SchemaProblem {
    /// Whether the problem keeps `idempotent_schema` from being read.
    pub(crate) fn hides_the_version(&self) -> bool {
        match self {
            SchemaProblem::MissingTable { table, .. } => *table == "idempotent_schema",
            SchemaProblem::MissingPrivilege { object, .. } => object.contains("idempotent_schema"),
            _ => false,
        }
    }
}

impl std::fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaProblem::MissingTable { table, searched } => write!(
                f,
                "the table `{table}` is missing from {searched}: run migrate as the schema's owner"
            ),
            SchemaProblem::MissingColumn { table, column } => {
                write!(
                    f,
                    "the table `{table}` has no column `{column}`: run migrate as the schema's owner"
                )
            }
            SchemaProblem::MissingPrivilege {
                privilege,
                object,
                grant,
            } => write!(f, "this connection lacks {privilege} on {object}: {grant}"),
            SchemaProblem::NoUniqueIndex { table, column } => write!(
                f,
                "`{table}.{column}` has no unique index: two workers could both claim"
            ),
            SchemaProblem::Older { found, needed } => write!(
                f,
                "the schema is at version {found}, this release needs {needed}: run migrate as the schema's owner"
            ),
            SchemaProblem::Newer { found, known } => write!(
                f,
                "the schema is at version {found}, made by a newer release than this one (which knows up to {known}): upgrade this worker"
            ),
        }
    }
}
