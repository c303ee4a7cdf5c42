//! Behaviour tests, written once in `behaviour.rs` and instantiated here for every backend.
//!
//! `cargo test` runs them on SQLite; `cargo test --features postgres` adds PostgreSQL (the server
//! must be up: `scripts/test` starts it).

mod behaviour;
mod handlers;
mod harness;
mod key_spaces;
mod keys;
mod pools;

/// One module of tests per backend, each test one line.
macro_rules! backend_tests {
    ($module:ident, $backend:ty) => {
        mod $module {
            use crate::behaviour;

            #[test]
            fn second_run_changes_nothing() {
                behaviour::second_run_changes_nothing::<$backend>();
            }

            #[test]
            fn replay_returns_the_stored_result() {
                behaviour::replay_returns_the_stored_result::<$backend>();
            }

            #[test]
            fn error_then_retry_runs_once() {
                behaviour::error_then_retry_runs_once::<$backend>();
            }

            #[test]
            fn panic_then_retry_runs_once() {
                behaviour::panic_then_retry_runs_once::<$backend>();
            }

            #[test]
            fn racing_workers_run_once() {
                behaviour::racing_workers_run_once::<$backend>();
            }

            #[test]
            fn crash_between_commit_and_ack() {
                behaviour::crash_between_commit_and_ack::<$backend>(concat!(
                    stringify!($module),
                    "::crash_between_commit_and_ack"
                ));
            }

            #[test]
            fn separators_inside_values_keep_keys_apart() {
                behaviour::separators_inside_values_keep_keys_apart::<$backend>();
            }

            #[test]
            fn another_jobs_key_is_an_error() {
                behaviour::another_jobs_key_is_an_error::<$backend>();
            }

            #[test]
            fn undecodable_stored_result_is_an_error() {
                behaviour::undecodable_stored_result_is_an_error::<$backend>();
            }

            #[test]
            fn claims_join_the_callers_transaction() {
                behaviour::claims_join_the_callers_transaction::<$backend>();
            }

            #[test]
            fn outcome_tells_ran_from_replayed() {
                behaviour::outcome_tells_ran_from_replayed::<$backend>();
            }

            #[test]
            fn unit_results_store_nothing() {
                behaviour::unit_results_store_nothing::<$backend>();
            }
        }
    };
}

backend_tests!(sqlite, crate::harness::Sqlite);
#[cfg(feature = "postgres")]
backend_tests!(postgres, crate::harness::Postgres);
#[cfg(feature = "mysql")]
backend_tests!(mysql, crate::harness::Mysql);
