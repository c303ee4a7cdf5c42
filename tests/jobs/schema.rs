//! The runtime's own tables: created once however many workers start together, found where the
//! job statements find them, upgraded in place. Written once for every connection type.

use std::sync::Barrier;

use crate::backends::Backend;
use crate::harness::Db;

/// Eight workers start at once on an empty database and each calls `migrate`: all succeed, and
/// the schema exists once, at the latest version.
pub fn concurrent_first_migrations_all_succeed<B: Backend>() {
    const WORKERS: usize = 8;
    let db = Db::<B>::empty();
    let barrier = Barrier::new(WORKERS);
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (db, barrier) = (&db, &barrier);
                scope.spawn(move || {
                    let mut conn = db.connect();
                    barrier.wait();
                    B::migrate(&mut conn).map_err(|e| e.to_string())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker thread"))
            .collect()
    });
    for result in &results {
        assert!(result.is_ok(), "{results:?}");
    }
    let mut conn = db.connect();
    let snapshot = B::snapshot(&mut conn);
    assert_eq!(
        snapshot.rows("idempotent_schema").len(),
        2,
        "two steps recorded once each: {:?}",
        snapshot.rows("idempotent_schema")
    );
    assert!(snapshot.table_names().any(|t| t.ends_with("done_jobs")));
    assert!(snapshot.table_names().any(|t| t.ends_with("outbox")));
}
