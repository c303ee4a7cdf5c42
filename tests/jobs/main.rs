//! Behaviour tests, written once in `behaviour.rs` and instantiated here for every connection
//! type whose feature is on: `SqliteConnection`, `PgConnection`, `MysqlConnection`, and
//! diesel-async's `SyncConnectionWrapper<SqliteConnection>`, `AsyncPgConnection` and
//! `AsyncMysqlConnection`. `scripts/test` turns them all on.

#[cfg(feature = "async")]
mod async_effects;
mod backends;
mod behaviour;
#[cfg(feature = "async")]
mod cancellation;
mod capture;
mod effects;
#[path = "../support/figures.rs"]
mod figures;
mod handlers;
mod harness;
mod holes;
#[cfg(feature = "sqlite")]
mod identity;
#[cfg(feature = "postgres")]
mod isolation;
mod key_spaces;
#[cfg(feature = "sqlite")]
mod keys;
#[path = "../support/names.rs"]
mod names;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod nested;
mod operate;
#[path = "../support/operator_cli.rs"]
mod operator_cli;
mod operator_truth;
mod outbox_faults;
#[cfg(feature = "async-postgres")]
mod pipeline;
#[cfg(feature = "sqlite")]
mod pools;
mod proxy;
mod prune;
mod receiver;
mod relay_truth;
#[cfg(all(feature = "sqlite", feature = "async-sqlite"))]
mod replay_equality;
#[cfg(feature = "sqlite")]
mod savepoint_after_claim;
mod schema;
mod second_run;
#[cfg(feature = "postgres")]
mod security;
mod signals;
#[cfg(feature = "mysql")]
mod snapshot_isolation;
#[cfg(feature = "async")]
mod spawnable;
#[cfg(feature = "async-postgres")]
mod statements_outside;
#[cfg(all(feature = "sqlite", feature = "metrics"))]
mod telemetry;
mod truth;

/// One module of tests per connection type, each test one line.
macro_rules! backend_tests {
    ($module:ident, $backend:ty) => {
        mod $module {
            use crate::{behaviour, holes, operate, schema, second_run};

            #[test]
            fn redeliveries_replay_from_one_read() {
                holes::redeliveries_replay_from_one_read::<$backend>();
            }

            #[test]
            fn calls_inside_a_callers_text_transaction_are_refused_and_change_nothing() {
                holes::calls_inside_a_callers_text_transaction_are_refused_and_change_nothing::<
                    $backend,
                >();
            }

            #[test]
            fn a_migration_with_no_time_limit_migrates() {
                schema::a_migration_with_no_time_limit_migrates::<$backend>();
            }

            #[test]
            fn a_careless_job_inside_a_callers_transaction_leaves_the_caller_whole() {
                holes::a_careless_job_inside_a_callers_transaction_leaves_the_caller_whole::<
                    $backend,
                >();
            }

            #[test]
            fn in_progress_policies_bound_the_wait() {
                holes::in_progress_policies_bound_the_wait::<$backend>();
            }

            #[test]
            fn a_key_is_found_explained_and_forgotten() {
                operate::a_key_is_found_explained_and_forgotten::<$backend>();
            }

            #[test]
            fn keys_are_listed_counted_and_forgotten_by_digest() {
                operate::keys_are_listed_counted_and_forgotten_by_digest::<$backend>();
            }

            #[test]
            fn paging_lists_keys_done_at_one_instant_each_once() {
                operate::paging_lists_keys_done_at_one_instant_each_once::<$backend>();
            }

            #[test]
            fn forgetting_a_key_in_progress_forgets_nothing() {
                operate::forgetting_a_key_in_progress_forgets_nothing::<$backend>();
            }

            #[test]
            fn keys_without_tables_fail_clearly() {
                operate::keys_without_tables_fail_clearly::<$backend>();
            }

            #[test]
            fn a_rollback_that_cannot_undo_the_body_is_reported_truly() {
                crate::truth::a_rollback_that_cannot_undo_the_body_is_reported_truly::<$backend>();
            }

            #[test]
            fn a_claim_that_cannot_be_taken_back_is_reported_truly() {
                crate::truth::a_claim_that_cannot_be_taken_back_is_reported_truly::<$backend>();
            }

            #[test]
            fn statements_in_the_body_never_make_a_call_lie() {
                crate::truth::statements_in_the_body_never_make_a_call_lie::<$backend>();
            }

            #[test]
            fn a_record_the_database_refuses_is_the_databases_error() {
                crate::truth::a_record_the_database_refuses_is_the_databases_error::<$backend>();
            }

            #[test]
            fn statements_in_a_nested_body_never_make_a_call_lie() {
                crate::truth::statements_in_a_nested_body_never_make_a_call_lie::<$backend>();
            }

            #[test]
            fn a_claim_committed_without_its_result_is_finished_by_the_next_delivery() {
                crate::truth::a_claim_committed_without_its_result_is_finished_by_the_next_delivery::<
                    $backend,
                >(concat!(
                    stringify!($module),
                    "::a_claim_committed_without_its_result_is_finished_by_the_next_delivery"
                ));
            }

            #[test]
            fn operations_commit_or_refuse_in_a_session_holding_a_transaction() {
                crate::truth::operations_commit_or_refuse_in_a_session_holding_a_transaction::<
                    $backend,
                >();
            }

            #[test]
            fn a_job_in_a_session_holding_a_transaction_diesel_does_not_know_of() {
                crate::truth::a_job_in_a_session_holding_a_transaction_diesel_does_not_know_of::<
                    $backend,
                >();
            }

            #[test]
            fn a_session_that_opens_a_transaction_with_any_statement_is_left_with_none_open() {
                crate::truth::a_session_that_opens_a_transaction_with_any_statement_is_left_with_none_open::<
                    $backend,
                >();
            }

            #[test]
            fn without_tables_every_operation_says_to_migrate() {
                crate::truth::without_tables_every_operation_says_to_migrate::<$backend>();
            }

            #[test]
            fn keep_counts_from_the_commit() {
                holes::keep_counts_from_the_commit::<$backend>();
            }

            #[test]
            fn own_key_on_another_connection_is_refused() {
                holes::own_key_on_another_connection_is_refused::<$backend>();
            }

            #[test]
            fn concurrent_first_migrations_all_succeed() {
                schema::concurrent_first_migrations_all_succeed::<$backend>();
            }

            #[test]
            fn the_applications_own_migrations_keep_working() {
                schema::the_applications_own_migrations_keep_working::<$backend>();
            }

            #[test]
            fn upgrades_keep_keys_and_messages() {
                schema::upgrades_keep_keys_and_messages::<$backend>();
            }

            #[test]
            fn migrate_refuses_an_applications_table_of_the_same_name() {
                schema::migrate_refuses_an_applications_table_of_the_same_name::<$backend>();
            }

            #[test]
            fn a_table_lost_after_migrate_is_named_with_its_repair() {
                schema::a_table_lost_after_migrate_is_named_with_its_repair::<$backend>();
            }

            #[test]
            fn verify_lists_what_is_missing() {
                schema::verify_lists_what_is_missing::<$backend>();
            }

            #[test]
            fn a_failed_step_names_its_table() {
                schema::a_failed_step_names_its_table::<$backend>();
            }

            #[test]
            fn an_index_step_is_made_on_upgrade_and_found_when_made_already() {
                schema::an_index_step_is_made_on_upgrade_and_found_when_made_already::<$backend>();
            }

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
            fn panic_in_serialize_leaves_no_transaction() {
                behaviour::panic_in_serialize_leaves_no_transaction::<$backend>();
            }

            #[test]
            fn panic_in_replay_decode_leaves_no_transaction() {
                behaviour::panic_in_replay_decode_leaves_no_transaction::<$backend>();
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
            fn a_job_inside_its_own_body_runs_once() {
                behaviour::a_job_inside_its_own_body_runs_once::<$backend>();
            }

            #[test]
            fn hostile_values_claim_and_replay() {
                behaviour::hostile_values_claim_and_replay::<$backend>();
            }

            #[test]
            fn unit_results_store_nothing() {
                behaviour::unit_results_store_nothing::<$backend>();
            }

            #[test]
            fn fingerprints_guard_replays() {
                second_run::fingerprints_guard_replays::<$backend>();
            }

            #[test]
            fn a_changed_fingerprint_definition_replays() {
                second_run::a_changed_fingerprint_definition_replays::<$backend>();
            }

            #[test]
            fn lapsed_keys_run_again() {
                second_run::lapsed_keys_run_again::<$backend>();
            }

            #[test]
            fn prune_removes_lapsed_claims_in_batches() {
                second_run::prune_removes_lapsed_claims_in_batches::<$backend>();
            }

            #[test]
            fn events_say_what_happened() {
                second_run::events_say_what_happened::<$backend>();
            }

            #[test]
            fn redacted_keys_stay_out_of_logs() {
                second_run::redacted_keys_stay_out_of_logs::<$backend>();
            }

            #[test]
            fn test_kit_crash_variant_passes_a_sound_handler() {
                second_run::test_kit_crash_variant_passes_a_sound_handler::<$backend>();
            }

            #[test]
            fn test_kit_catches_a_handler_that_is_not_idempotent() {
                second_run::test_kit_catches_a_handler_that_is_not_idempotent::<$backend>();
            }

            #[test]
            fn test_kit_catches_a_write_on_another_connection() {
                second_run::test_kit_catches_a_write_on_another_connection::<$backend>();
            }

            #[test]
            fn snapshots_see_small_changes_to_floats() {
                second_run::snapshots_see_small_changes_to_floats::<$backend>();
            }

            #[test]
            fn snapshots_cover_tables_named_like_sqlites_own() {
                second_run::snapshots_cover_tables_named_like_sqlites_own::<$backend>();
            }
        }
    };
}

/// What only async connections can do wrong (be dropped mid-transaction), and the outbox
/// relayed through them.
#[allow(unused_macros)] // used when an async feature is on
macro_rules! async_tests {
    ($module:ident, $backend:ty) => {
        mod $module {
            use crate::{async_effects, cancellation};

            #[test]
            fn dropped_job_never_commits() {
                cancellation::dropped_job_never_commits::<$backend, _>();
            }

            #[test]
            fn a_job_on_a_broken_connection_sends_nothing() {
                cancellation::a_job_on_a_broken_connection_sends_nothing::<$backend, _>();
            }

            #[test]
            fn every_call_dropped_at_each_await_leaves_a_whole_or_broken_connection() {
                cancellation::every_call_dropped_at_each_await_leaves_a_whole_or_broken_connection::<
                    $backend,
                    _,
                >();
            }

            #[test]
            fn dropped_job_in_a_pool_never_reaches_the_next_job() {
                cancellation::dropped_job_in_a_pool_never_reaches_the_next_job::<$backend, _>();
            }

            #[test]
            fn a_redelivery_after_a_drop_is_not_held_by_the_pool() {
                cancellation::a_redelivery_after_a_drop_is_not_held_by_the_pool::<$backend, _>();
            }

            #[test]
            fn pooled_connections_work_through_deref() {
                cancellation::pooled_connections_work_through_deref::<$backend, _>();
            }

            #[test]
            fn job_futures_are_send() {
                cancellation::job_futures_are_send::<$backend, _>();
            }

            #[test]
            fn async_relay_delivers_each_message_once() {
                async_effects::async_relay_delivers_each_message_once::<$backend, _>();
            }

            #[test]
            fn two_async_relays_deliver_no_message_twice() {
                async_effects::two_async_relays_deliver_no_message_twice::<$backend, _>();
            }

            #[test]
            fn failing_async_deliveries_park_then_retry() {
                async_effects::failing_async_deliveries_park_then_retry::<$backend, _>();
            }

            #[test]
            fn what_the_database_cannot_hold_is_refused_whole_async() {
                async_effects::what_the_database_cannot_hold_is_refused_whole_async::<$backend, _>(
                );
            }

            #[test]
            fn failed_async_job_leaves_no_message() {
                async_effects::failed_async_job_leaves_no_message::<$backend, _>();
            }

            #[test]
            fn a_panicking_async_delivery_fails_alone() {
                async_effects::a_panicking_async_delivery_fails_alone::<$backend, _>();
            }

            #[test]
            fn dropped_relay_never_leaves_a_transaction_open() {
                async_effects::dropped_relay_never_leaves_a_transaction_open::<$backend, _>();
            }

            #[test]
            fn a_dropped_round_gives_back_what_it_never_tried() {
                async_effects::a_dropped_round_gives_back_what_it_never_tried::<$backend, _>();
            }
        }
    };
}

/// Effects beyond the database, for the sync connection types (killed workers and relays are
/// child processes; `async_tests` covers the async relay).
#[allow(unused_macros)] // used when a sync backend's feature is on
macro_rules! effects_tests {
    ($module:ident, $backend:ty) => {
        mod $module {
            use crate::effects;

            #[test]
            fn running_a_job_twice_leaves_one_message() {
                effects::running_a_job_twice_leaves_one_message::<$backend, _>();
            }

            #[test]
            fn the_key_inside_the_body_is_stable() {
                effects::the_key_inside_the_body_is_stable::<$backend, _>();
            }

            #[test]
            fn killed_worker_charges_once() {
                effects::killed_worker_charges_once::<$backend, _>(concat!(
                    stringify!($module),
                    "::killed_worker_charges_once"
                ));
            }

            #[test]
            fn killed_relay_delivers_once() {
                effects::killed_relay_delivers_once::<$backend, _>(concat!(
                    stringify!($module),
                    "::killed_relay_delivers_once"
                ));
            }

            #[test]
            fn two_relays_deliver_no_message_twice() {
                effects::two_relays_deliver_no_message_twice::<$backend, _>();
            }

            #[test]
            fn what_the_database_cannot_hold_is_refused_whole() {
                crate::outbox_faults::what_the_database_cannot_hold_is_refused_whole::<$backend, _>(
                );
            }

            #[test]
            fn message_ids_are_unique_per_run() {
                crate::outbox_faults::message_ids_are_unique_per_run::<$backend, _>();
            }

            #[test]
            fn raw_keys_sharing_a_readable_form_get_their_own_ids() {
                crate::outbox_faults::raw_keys_sharing_a_readable_form_get_their_own_ids::<
                    $backend,
                    _,
                >();
            }

            #[test]
            fn push_on_another_connection_is_refused() {
                crate::outbox_faults::push_on_another_connection_is_refused::<$backend, _>();
            }

            #[test]
            fn a_message_that_kills_the_relay_is_parked() {
                crate::outbox_faults::a_message_that_kills_the_relay_is_parked::<$backend, _>(
                    concat!(
                        stringify!($module),
                        "::a_message_that_kills_the_relay_is_parked"
                    ),
                );
            }

            #[test]
            fn a_mark_that_fails_leaves_the_untried_messages_untried() {
                crate::outbox_faults::a_mark_that_fails_leaves_the_untried_messages_untried::<
                    $backend,
                    _,
                >();
            }

            #[test]
            fn a_message_at_its_last_attempt_is_never_taken_again() {
                crate::outbox_faults::a_message_at_its_last_attempt_is_never_taken_again::<
                    $backend,
                    _,
                >();
            }

            #[test]
            fn a_relay_that_stops_says_what_it_did() {
                crate::outbox_faults::a_relay_that_stops_says_what_it_did::<$backend, _>();
            }

            #[test]
            fn a_relay_takes_messages_in_the_order_they_became_due() {
                crate::outbox_faults::a_relay_takes_messages_in_the_order_they_became_due::<
                    $backend,
                    _,
                >();
            }

            #[test]
            fn a_panicking_delivery_fails_alone() {
                crate::outbox_faults::a_panicking_delivery_fails_alone::<$backend, _>();
            }

            #[test]
            fn delivery_errors_are_stored_sanitized() {
                crate::outbox_faults::delivery_errors_are_stored_sanitized::<$backend, _>();
            }

            #[test]
            fn relay_copies_keep_their_own_leases() {
                crate::outbox_faults::relay_copies_keep_their_own_leases::<$backend, _>();
            }

            #[test]
            fn a_message_that_would_arrive_changed_is_refused_and_the_job_goes_on() {
                crate::outbox_faults::a_message_that_would_arrive_changed_is_refused_and_the_job_goes_on::<
                    $backend,
                    _,
                >();
            }

            #[test]
            fn a_release_that_fails_is_not_reported_done() {
                crate::outbox_faults::a_release_that_fails_is_not_reported_done::<$backend, _>();
            }

            #[test]
            fn a_delivery_that_outlived_its_lease_is_recorded_when_nobody_holds_it() {
                crate::outbox_faults::a_delivery_that_outlived_its_lease_is_recorded_when_nobody_holds_it::<
                    $backend,
                    _,
                >();
            }

            #[test]
            fn a_failed_delivery_that_lost_its_lease_is_reported_lost() {
                crate::outbox_faults::a_failed_delivery_that_lost_its_lease_is_reported_lost::<
                    $backend,
                    _,
                >();
            }

            #[test]
            fn relays_refuse_to_run_inside_a_transaction() {
                crate::outbox_faults::relays_refuse_to_run_inside_a_transaction::<$backend, _>();
            }

            #[test]
            fn redacted_keys_stay_out_of_the_outbox() {
                crate::outbox_faults::redacted_keys_stay_out_of_the_outbox::<$backend, _>();
            }

            #[test]
            fn deliveries_are_counted_and_reported() {
                crate::outbox_faults::deliveries_are_counted_and_reported::<$backend, _>();
            }

            #[test]
            fn overlong_durations_are_errors() {
                effects::overlong_durations_are_errors::<$backend, _>();
            }

            #[test]
            fn failing_deliveries_back_off_then_park() {
                effects::failing_deliveries_back_off_then_park::<$backend, _>();
            }
        }
    };
}

#[cfg(feature = "sqlite")]
effects_tests!(sqlite_outbox, crate::backends::Sqlite);
#[cfg(feature = "postgres")]
effects_tests!(postgres_outbox, crate::backends::Postgres);
#[cfg(feature = "mysql")]
effects_tests!(mysql_outbox, crate::backends::Mysql);

/// What concerns one database (or two), instantiated for its sync and async connections.
#[allow(unused_macros)] // each is used when one of its backends' features is on
macro_rules! server_tests {
    ($module:ident, $backend:ty) => {
        mod $module {
            #[test]
            fn every_call_works_in_sessions_of_their_own() {
                crate::truth::every_call_works_in_sessions_of_their_own::<$backend>();
            }

            #[test]
            fn a_snapshot_sees_every_change() {
                crate::behaviour::a_snapshot_sees_every_change::<$backend>();
            }

            #[test]
            fn a_take_back_that_meets_a_passing_failure_is_retried() {
                crate::truth::a_take_back_that_meets_a_passing_failure_is_retried::<$backend>();
            }

            #[test]
            fn a_lost_release_inside_a_callers_transaction_commits_nothing() {
                crate::holes::a_lost_release_inside_a_callers_transaction_commits_nothing::<
                    $backend,
                >();
            }

            #[test]
            fn lost_commit_replies_leave_an_unknown_outcome() {
                crate::holes::lost_commit_replies_leave_an_unknown_outcome::<$backend>();
            }

            #[test]
            fn skewed_clocks_agree_on_keep() {
                crate::holes::skewed_clocks_agree_on_keep::<$backend>(concat!(
                    stringify!($module),
                    "::skewed_clocks_agree_on_keep"
                ));
            }
        }
    };
}

#[allow(unused_macros)]
macro_rules! mysql_tests {
    ($module:ident, $backend:ty) => {
        mod $module {
            #[test]
            fn an_unfinished_claim_is_finished_where_empty_strings_read_as_null() {
                crate::truth::an_unfinished_claim_is_finished_where_empty_strings_read_as_null::<
                    $backend,
                >();
            }

            #[test]
            fn verify_names_a_session_clock_of_its_own() {
                crate::schema::verify_names_a_session_clock_of_its_own::<$backend>();
            }

            #[test]
            fn verify_names_a_session_character_set_that_is_not_utf8mb4() {
                crate::schema::verify_names_a_session_character_set_that_is_not_utf8mb4::<
                    $backend,
                >();
            }

            #[test]
            fn an_interrupted_step_resumes() {
                crate::schema::an_interrupted_step_resumes::<$backend>();
            }

            #[test]
            fn a_held_migration_lock_times_out_clearly() {
                crate::schema::a_held_migration_lock_times_out_clearly::<$backend>(
                    "SELECT GET_LOCK(CONCAT('idempotent_jobs:', DATABASE()), 0)",
                    "SELECT RELEASE_LOCK(CONCAT('idempotent_jobs:', DATABASE()))",
                );
            }

            #[test]
            fn a_relay_before_the_leased_index_reads_no_delivered_message() {
                crate::schema::a_relay_before_the_leased_index_reads_no_delivered_message::<$backend>();
            }

            #[test]
            fn implicit_commits_are_detected() {
                crate::holes::implicit_commits_are_detected::<$backend>();
            }

            #[test]
            fn a_rolled_back_run_leaves_another_runs_claim_alone() {
                crate::holes::a_rolled_back_run_leaves_another_runs_claim_alone::<$backend>();
            }

            #[test]
            fn results_too_large_are_refused() {
                crate::holes::results_too_large_are_refused::<$backend>();
            }

            #[test]
            fn exhausted_retries_name_their_cause() {
                crate::holes::exhausted_retries_name_their_cause::<$backend>(
                    "SET SESSION innodb_lock_wait_timeout = 1",
                );
            }

            /// A session's statement time limit that ends the claim's wait for another run of
            /// its key is a wait that passes, as the lock wait timeout is: retried, then
            /// retryable. Before, `Database { retryable: false }`: a worker trusting
            /// `is_retryable` dead-lettered the message while the other run could still roll back.
            #[test]
            fn a_statement_time_limit_on_the_claim_is_retried() {
                crate::holes::exhausted_retries_name_their_cause::<$backend>(
                    "SET SESSION max_statement_time = 0.5",
                );
            }

            #[test]
            fn an_unknown_error_is_never_read_as_another() {
                crate::holes::an_unknown_error_is_never_read_as_another::<$backend>();
            }

            /// The server's messages in the session's language: a lock wait timeout reads
            /// "Beim Warten auf eine Sperre wurde die zulässige Wartezeit überschritten", and is
            /// still a wait that passes.
            #[test]
            fn waits_that_pass_are_known_in_every_message_language() {
                crate::holes::exhausted_retries_name_their_cause::<$backend>(
                    "SET SESSION innodb_lock_wait_timeout = 1; SET SESSION lc_messages = 'de_DE'",
                );
                crate::holes::exhausted_retries_name_their_cause::<$backend>(
                    "SET SESSION max_statement_time = 0.5; SET SESSION lc_messages = 'ja_JP'",
                );
            }
        }
    };
}

#[allow(unused_macros)]
macro_rules! postgres_tests {
    ($module:ident, $backend:ty) => {
        mod $module {
            #[test]
            fn verify_names_a_session_client_encoding_that_is_not_utf8() {
                crate::schema::verify_names_a_session_client_encoding_that_is_not_utf8::<
                    $backend,
                >();
            }

            #[test]
            fn a_record_refused_inside_a_callers_transaction_is_the_databases_error() {
                crate::holes::a_record_refused_inside_a_callers_transaction_is_the_databases_error::<
                    $backend,
                >();
            }

            /// As for MySQL's `max_statement_time`: PostgreSQL's `statement_timeout` ending the
            /// claim's wait for another run of its key is retried, then retryable.
            #[test]
            fn a_statement_time_limit_on_the_claim_is_retried() {
                crate::holes::exhausted_retries_name_their_cause::<$backend>(
                    "SET statement_timeout = '500ms'",
                );
            }

            #[test]
            fn a_commit_cut_by_the_server_in_its_language_is_an_unknown_outcome() {
                crate::holes::a_commit_cut_by_the_server_in_its_language_is_an_unknown_outcome::<
                    $backend,
                >();
            }

            #[test]
            fn waits_that_pass_are_known_in_every_message_language() {
                crate::holes::waits_that_pass_are_known_in_the_servers_language::<$backend>();
            }

            #[test]
            fn a_failed_take_back_with_nothing_to_take_is_no_alarm() {
                crate::truth::a_failed_take_back_with_nothing_to_take_is_no_alarm::<$backend>();
            }

            #[test]
            fn a_failed_take_back_after_a_nested_body_ended_the_callers_transaction_is_no_alarm() {
                crate::truth::a_failed_take_back_after_a_nested_body_ended_the_callers_transaction_is_no_alarm::<$backend>();
            }

            #[test]
            fn a_held_migration_lock_times_out_clearly() {
                crate::schema::a_held_migration_lock_times_out_clearly::<$backend>(
                    "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('idempotent_jobs:' || current_schema(), 0))",
                    "COMMIT",
                );
            }

            #[test]
            fn an_invalid_index_is_not_the_step_made() {
                crate::schema::an_invalid_index_is_not_the_step_made::<$backend>();
            }

            #[test]
            fn time_conditions_search_their_indexes() {
                crate::schema::time_conditions_search_their_indexes::<$backend>();
            }

            #[test]
            fn a_probe_that_fails_on_its_own_is_not_read_as_an_aborted_transaction() {
                crate::truth::a_probe_that_fails_on_its_own_is_not_read_as_an_aborted_transaction::<
                    $backend,
                >();
            }

            #[test]
            fn serialization_failures_at_commit_are_retryable() {
                crate::holes::serialization_failures_at_commit_are_retryable::<$backend>();
            }

            #[test]
            fn a_body_that_committed_before_the_connection_died_is_no_unknown_outcome() {
                crate::holes::a_body_that_committed_before_the_connection_died_is_no_unknown_outcome::<
                    $backend,
                >();
            }

            #[test]
            fn a_poolers_farewell_at_commit_is_an_unknown_outcome() {
                crate::holes::a_poolers_farewell_at_commit_is_an_unknown_outcome::<$backend>();
            }

            #[test]
            fn a_poolers_farewell_inside_a_callers_transaction_commits_nothing() {
                crate::holes::a_poolers_farewell_inside_a_callers_transaction_commits_nothing::<
                    $backend,
                >();
            }

            #[test]
            fn a_commit_refused_by_a_deferred_trigger_says_so() {
                crate::holes::a_commit_refused_by_a_deferred_trigger_says_so::<$backend>();
            }
        }
    };
}

#[allow(unused_macros)]
macro_rules! sqlite_tests {
    ($module:ident, $backend:ty) => {
        mod $module {
            #[test]
            fn a_held_migration_lock_times_out_clearly() {
                crate::schema::a_held_migration_lock_times_out_clearly::<$backend>(
                    "BEGIN IMMEDIATE",
                    "COMMIT",
                );
            }

            #[test]
            fn many_workers_share_one_sqlite_file() {
                crate::holes::many_workers_share_one_sqlite_file::<$backend>();
            }

            #[test]
            fn exhausted_retries_name_their_cause() {
                crate::holes::exhausted_retries_name_their_cause::<$backend>("");
            }

            #[test]
            fn verify_names_a_journal_a_killed_process_cannot_undo() {
                crate::schema::verify_names_a_journal_a_killed_process_cannot_undo::<$backend>();
            }
        }
    };
}

/// The migration lock of a dropped `migrate_async`, per async server backend.
#[allow(unused_macros)]
macro_rules! dropped_migration_test {
    ($module:ident, $backend:ty, $lock_is_free:expr) => {
        mod $module {
            #[test]
            fn a_dropped_migration_never_keeps_the_lock() {
                crate::schema::a_dropped_migration_never_keeps_the_lock::<$backend, _>(
                    $lock_is_free,
                    "DROP TABLE IF EXISTS outbox, done_jobs, idempotent_schema",
                );
            }
        }
    };
}

#[cfg(feature = "async-postgres")]
dropped_migration_test!(
    async_postgres_migration,
    crate::backends::AsyncPostgres,
    "SELECT CAST(pg_try_advisory_xact_lock(hashtextextended('idempotent_jobs:' || current_schema(), 0)) AS INTEGER)::BIGINT AS n"
);
#[cfg(feature = "async-mysql")]
dropped_migration_test!(
    async_mysql_migration,
    crate::backends::AsyncMysql,
    "SELECT CAST(IS_FREE_LOCK(CONCAT('idempotent_jobs:', DATABASE())) AS SIGNED) AS n"
);

#[cfg(feature = "postgres")]
server_tests!(postgres_server, crate::backends::Postgres);
#[cfg(feature = "async-postgres")]
server_tests!(async_postgres_server, crate::backends::AsyncPostgres);
#[cfg(feature = "mysql")]
server_tests!(mysql_server, crate::backends::Mysql);
#[cfg(feature = "async-mysql")]
server_tests!(async_mysql_server, crate::backends::AsyncMysql);
#[cfg(feature = "mysql")]
mysql_tests!(mysql_holes, crate::backends::Mysql);
#[cfg(feature = "async-mysql")]
mysql_tests!(async_mysql_holes, crate::backends::AsyncMysql);
#[cfg(feature = "postgres")]
postgres_tests!(postgres_holes, crate::backends::Postgres);
#[cfg(feature = "async-postgres")]
postgres_tests!(async_postgres_holes, crate::backends::AsyncPostgres);
#[cfg(feature = "sqlite")]
sqlite_tests!(sqlite_holes, crate::backends::Sqlite);
#[cfg(feature = "async-sqlite")]
sqlite_tests!(async_sqlite_holes, crate::backends::AsyncSqlite);

#[cfg(feature = "sqlite")]
#[test]
fn a_commit_that_finds_the_database_busy_says_so() {
    holes::a_commit_that_finds_the_database_busy_says_so();
}

#[cfg(feature = "postgres")]
#[test]
fn a_body_that_goes_past_a_failed_statement_is_reported_as_such() {
    holes::a_body_that_goes_past_a_failed_statement_is_reported_as_such();
}

#[cfg(feature = "mysql")]
#[test]
fn a_deadlock_the_body_returns_at_is_the_bodys_own_error() {
    holes::a_deadlock_the_body_returns_at_is_the_bodys_own_error();
}

#[cfg(feature = "mysql")]
#[test]
fn a_deadlock_at_the_claim_inside_a_callers_transaction_says_the_caller_was_rolled_back() {
    holes::a_deadlock_at_the_claim_inside_a_callers_transaction_says_the_caller_was_rolled_back();
}

#[cfg(all(feature = "sqlite", feature = "async-sqlite"))]
#[test]
fn results_that_replay_as_other_values_are_refused() {
    replay_equality::results_that_replay_as_other_values_are_refused();
}

#[cfg(all(feature = "sqlite", feature = "async-sqlite"))]
#[test]
fn results_without_partial_eq_are_compared_as_serde_shows_them() {
    replay_equality::results_without_partial_eq_are_compared_as_serde_shows_them();
}

#[cfg(feature = "sqlite")]
#[test]
fn a_result_that_would_replay_as_another_value_is_refused() {
    truth::a_result_that_would_replay_as_another_value_is_refused();
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_relay_never_waits_for_a_job_that_pushed() {
    outbox_faults::a_relay_never_waits_for_a_job_that_pushed::<crate::backends::Postgres, _>();
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_relay_never_waits_for_a_job_that_pushed() {
    outbox_faults::a_relay_never_waits_for_a_job_that_pushed::<crate::backends::Mysql, _>();
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_lease_hides_no_message_it_does_not_take() {
    outbox_faults::a_lease_hides_no_message_it_does_not_take::<crate::backends::Postgres, _>();
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_lease_hides_no_message_it_does_not_take() {
    outbox_faults::a_lease_hides_no_message_it_does_not_take::<crate::backends::Mysql, _>();
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_retrying_parked_messages_never_waits_for_a_job_that_pushed() {
    outbox_faults::retrying_parked_messages_never_waits_for_a_job_that_pushed::<
        crate::backends::Postgres,
        _,
    >();
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_retrying_parked_messages_never_waits_for_a_job_that_pushed() {
    outbox_faults::retrying_parked_messages_never_waits_for_a_job_that_pushed::<
        crate::backends::Mysql,
        _,
    >();
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_read_uncommitted_session_reports_only_what_was_committed() {
    outbox_faults::a_read_uncommitted_session_reports_only_what_was_committed::<
        crate::backends::Mysql,
        _,
    >();
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_redeliveries_never_replay_from_a_callers_old_snapshot() {
    holes::redeliveries_never_replay_from_a_callers_old_snapshot::<crate::backends::Postgres>(
        "",
        "BEGIN ISOLATION LEVEL REPEATABLE READ",
        false,
    );
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_wal_redeliveries_never_replay_from_a_callers_old_snapshot() {
    holes::redeliveries_never_replay_from_a_callers_old_snapshot::<crate::backends::Sqlite>(
        "PRAGMA journal_mode = WAL",
        "BEGIN",
        true,
    );
}

#[cfg(feature = "sqlite")]
backend_tests!(sqlite, crate::backends::Sqlite);
#[cfg(feature = "postgres")]
backend_tests!(postgres, crate::backends::Postgres);
#[cfg(feature = "mysql")]
backend_tests!(mysql, crate::backends::Mysql);
#[cfg(feature = "mysql")]
#[test]
fn mysql_a_job_that_pushes_never_waits_for_a_relays_mark() {
    crate::outbox_faults::a_job_that_pushes_never_waits_for_a_relays_mark::<
        crate::backends::Mysql,
        _,
    >();
}
#[cfg(feature = "mysql")]
#[test]
fn mysql_redeliveries_never_read_an_old_snapshot() {
    holes::redeliveries_never_read_an_old_snapshot::<crate::backends::Mysql>();
}
#[cfg(feature = "async-mysql")]
#[test]
fn async_mysql_redeliveries_never_read_an_old_snapshot() {
    holes::redeliveries_never_read_an_old_snapshot::<crate::backends::AsyncMysql>();
}

/// A MySQL session with `completion_type` `CHAIN` or `RELEASE`: every call leaves it as it was.
#[cfg(feature = "mysql")]
#[test]
fn mysql_completion_type_chain_or_release_is_left_as_it_was() {
    truth::a_session_that_chains_or_releases_its_commits_is_left_as_it_was::<crate::backends::Mysql>(
    );
}
#[cfg(feature = "async-mysql")]
#[test]
fn async_mysql_completion_type_chain_or_release_is_left_as_it_was() {
    truth::a_session_that_chains_or_releases_its_commits_is_left_as_it_was::<
        crate::backends::AsyncMysql,
    >();
}

/// A `()` job whose body rolls back to the runtime's savepoint by name: reported as what it did
/// where the claim comes before the savepoint; where the savepoint rides with `BEGIN`, the known
/// limit, pinned (see `truth::claim_precedes_savepoint`).
mod undo_to_the_jobs_savepoint {
    use crate::truth::a_unit_job_whose_body_undoes_its_claim_by_the_savepoints_name_is_not_reported_as_ran as undo;

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite() {
        undo::<crate::backends::Sqlite>();
    }

    #[cfg(feature = "async-sqlite")]
    #[test]
    fn async_sqlite() {
        undo::<crate::backends::AsyncSqlite>();
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql() {
        undo::<crate::backends::Mysql>();
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres() {
        undo::<crate::backends::Postgres>();
    }

    #[cfg(feature = "async-postgres")]
    #[test]
    fn async_postgres() {
        undo::<crate::backends::AsyncPostgres>();
    }

    #[cfg(feature = "async-mysql")]
    #[test]
    fn async_mysql() {
        undo::<crate::backends::AsyncMysql>();
    }
}

#[cfg(feature = "async-sqlite")]
backend_tests!(async_sqlite, crate::backends::AsyncSqlite);
#[cfg(feature = "async-postgres")]
backend_tests!(async_postgres, crate::backends::AsyncPostgres);
#[cfg(feature = "async-mysql")]
backend_tests!(async_mysql, crate::backends::AsyncMysql);
#[cfg(feature = "async-sqlite")]
async_tests!(async_sqlite_only, crate::backends::AsyncSqlite);
#[cfg(feature = "async-postgres")]
async_tests!(async_postgres_only, crate::backends::AsyncPostgres);
#[cfg(feature = "async-mysql")]
async_tests!(async_mysql_only, crate::backends::AsyncMysql);

/// A relay's give-back dropped while a row lock holds it (the server backends: a dropped statement
/// there leaves the connection broken, not waiting in place as diesel-async's SQLite does).
#[cfg(feature = "async-postgres")]
#[test]
fn a_give_back_dropped_midway_loses_nothing_async_postgres() {
    async_effects::a_give_back_dropped_midway_loses_nothing::<crate::backends::AsyncPostgres, _>();
}

/// The same on MySQL.
#[cfg(feature = "async-mysql")]
#[test]
fn a_give_back_dropped_midway_loses_nothing_async_mysql() {
    async_effects::a_give_back_dropped_midway_loses_nothing::<crate::backends::AsyncMysql, _>();
}

/// Diesel sends a sync MySQL connection's `BEGIN` and `COMMIT` as text batches, three round trips
/// each (multi-statement mode on, the statement, off again); the runtime sends them as prepared
/// statements. What the server counted for 20 jobs (10 run, 10 replayed) on one session. The
/// server counts a switch of multi-statement mode and a `SET` statement alike (`Com_set_option`):
/// each job's `CALL` runs one `SET`, its refusal of a transaction the session holds of its own.
#[cfg(feature = "mysql")]
#[test]
fn mysql_jobs_switch_no_multi_statement_mode() {
    use crate::backends::{Backend as _, Mysql};
    let db = harness::Db::<Mysql>::fresh();
    let mut conn = db.connect();
    let status = |conn: &mut <Mysql as backends::Backend>::Conn, name: &str| {
        Mysql::query_i64(
            conn,
            &format!(
                "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS n FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = '{name}'"
            ),
        )
    };
    // One job first: its statements are prepared once per connection.
    Mysql::charge(&mut conn, "warm-up", 1, handlers::Mode::Succeed).expect("a job");
    let (options, executes) = (
        status(&mut conn, "COM_SET_OPTION"),
        status(&mut conn, "COM_STMT_EXECUTE"),
    );
    for round in 0..2 {
        for n in 0..10 {
            Mysql::charge(
                &mut conn,
                &format!("order-{n}"),
                100,
                handlers::Mode::Succeed,
            )
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
    // Less each job's `SET` inside its `CALL`.
    let options = status(&mut conn, "COM_SET_OPTION") - options - 20;
    // Less the status reads' own statements (prepared too; one after the first snapshot).
    let executes = status(&mut conn, "COM_STMT_EXECUTE") - executes - 1;
    figures::report(&format!(
        "sync MySQL, 20 jobs (10 ran, 10 replayed): {options} multi-statement switches, {executes} prepared statement executions"
    ));
    assert_eq!(options, 0, "no job switched multi-statement mode");
    assert_eq!(Mysql::count_charges(&mut conn, "order-3"), 1);
}

/// A redelivery's replay on Diesel's sync `PgConnection` is the read alone: one statement, one
/// round trip, no transaction (`AsyncPgConnection` reads inside the job's transaction, where a
/// transaction pooler keeps its prepare and execute on one server connection).
#[cfg(feature = "postgres")]
#[test]
fn a_postgres_redelivery_replays_in_one_statement() {
    use std::sync::{Arc, Mutex};

    use crate::backends::{Backend as _, Postgres};
    use diesel::connection::{Connection as _, InstrumentationEvent};

    let db = harness::Db::<Postgres>::fresh();
    let mut conn = db.connect();
    Postgres::charge_redelivered(&mut conn, "order-1", 100, false).expect("the first run");
    let statements = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&statements);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            seen.lock().expect("statements").push(query.to_string());
        }
    });
    let receipt = Postgres::charge_redelivered(&mut conn, "order-1", 100, true).expect("a replay");
    let statements = statements.lock().expect("statements").clone();
    assert_eq!(statements.len(), 1, "{statements:?}");
    assert!(statements[0].starts_with("SELECT"), "{statements:?}");
    assert_eq!(
        Postgres::count_charges(&mut conn, "order-1"),
        1,
        "{receipt:?}"
    );
}

/// A replay through the claim (a redelivery told nothing) wrote nothing: its transaction ends
/// with one `ROLLBACK`, and the job's savepoint, which only a body could need, is never set nor
/// released. The charge stays the first run's, and the connection is left with no transaction.
fn a_replay_through_the_claim_ends_with_a_rollback<B>()
where
    B: crate::backends::Backend,
    B::Conn: diesel::Connection,
{
    use std::sync::{Arc, Mutex};

    use diesel::connection::{Connection as _, InstrumentationEvent};

    let db = harness::Db::<B>::fresh();
    let mut conn = db.connect();
    B::charge_redelivered(&mut conn, "order-1", 100, false).expect("the first run");
    let statements = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&statements);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            seen.lock().expect("statements").push(query.to_string());
        }
    });
    let receipt = B::charge_redelivered(&mut conn, "order-1", 100, false).expect("a replay");
    let statements = statements.lock().expect("statements").clone();
    assert!(
        statements
            .iter()
            .all(|s| !s.contains("SAVEPOINT idempotent_job")
                || s.starts_with("BEGIN")
                || s.contains("START TRANSACTION")
                || s.starts_with("CALL")),
        "a replay set or released the job's savepoint: {statements:?}"
    );
    assert!(
        statements.last().is_some_and(|s| s.trim() == "ROLLBACK"),
        "{statements:?}"
    );
    assert_eq!(B::count_charges(&mut conn, "order-1"), 1, "{receipt:?}");
    let depth = <<B::Conn as diesel::Connection>::TransactionManager as diesel::connection::TransactionManager<B::Conn>>::transaction_manager_status_mut(&mut conn)
        .transaction_depth()
        .expect("Diesel's count");
    assert_eq!(depth, None, "{statements:?}");
    // The server agrees: the next job opens a transaction of its own, and commits.
    B::charge_redelivered(&mut conn, "order-2", 100, false).expect("the next job");
    assert_eq!(B::count_charges(&mut conn, "order-2"), 1);
}

#[cfg(feature = "sqlite")]
#[test]
fn a_replay_through_the_claim_ends_with_a_rollback_sqlite() {
    a_replay_through_the_claim_ends_with_a_rollback::<crate::backends::Sqlite>();
}

#[cfg(feature = "postgres")]
#[test]
fn a_replay_through_the_claim_ends_with_a_rollback_postgres() {
    a_replay_through_the_claim_ends_with_a_rollback::<crate::backends::Postgres>();
}

/// A result whose `Deserialize` panics once `PANIC_ON_DESERIALIZE` is set on its thread: its replay panics.
#[derive(Debug, serde::Serialize)]
struct PanicsOnReplay(u32);

thread_local! {
    // Per thread: the tests run side by side, each job on its test's thread.
    static PANIC_ON_DESERIALIZE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl<'de> serde::Deserialize<'de> for PanicsOnReplay {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if PANIC_ON_DESERIALIZE.get() {
            panic!("the result's Deserialize panics");
        }
        u32::deserialize(deserializer).map(Self)
    }
}

static PANICS_ON_REPLAY: idempotent_jobs::Job =
    idempotent_jobs::Job::new("panics_on_replay", "panics-on-replay:<n>");

/// A replay through the claim whose result's `Deserialize` panics: the panic reaches the caller,
/// and the replay's transaction, which wrote nothing, is rolled back with one `ROLLBACK`, not
/// taken for one a statement of the body ended (no take-back, no second transaction, no
/// `ClaimNotTakenBack` beside the panic). The key's row is left as the first run committed it.
fn a_replay_that_panics_ends_with_a_rollback<B>()
where
    B: crate::backends::Backend,
    B::Conn: diesel::Connection + idempotent_jobs::JobStore,
{
    use std::sync::{Arc, Mutex};

    use diesel::connection::{Connection as _, InstrumentationEvent};

    let db = harness::Db::<B>::fresh();
    let mut conn = db.connect();
    let key = idempotent_jobs::JobKey::new("panics-on-replay:1");
    let first = idempotent_jobs::run(&mut conn, &PANICS_ON_REPLAY, &key, |_| {
        Ok::<_, idempotent_jobs::Error>(PanicsOnReplay(7))
    });
    assert!(
        matches!(first, Ok(idempotent_jobs::Outcome::Ran(_))),
        "{first:?}"
    );
    let statements = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&statements);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            seen.lock().expect("statements").push(query.to_string());
        }
    });
    PANIC_ON_DESERIALIZE.set(true);
    let replay = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        idempotent_jobs::run(&mut conn, &PANICS_ON_REPLAY, &key, |_| {
            Ok::<_, idempotent_jobs::Error>(PanicsOnReplay(8))
        })
    }));
    PANIC_ON_DESERIALIZE.set(false);
    assert!(replay.is_err(), "the replay's panic reaches the caller");
    let sent: Vec<String> = statements
        .lock()
        .expect("statements")
        .iter()
        .map(|s| s.chars().take(60).collect())
        .collect();
    // The claim's transaction (where one was opened: MySQL's procedure rolls back its own and the
    // key is read outside any) ends with its rollback, and nothing is begun after it.
    let begun = sent
        .iter()
        .filter(|s| {
            s.contains("BEGIN")
                || s.contains("START TRANSACTION")
                || s.starts_with("CALL idempotent_begin")
        })
        .count();
    assert_eq!(begun, 1, "{sent:?}");
    assert!(
        !sent.iter().any(|s| s.starts_with("DELETE")),
        "the replay was taken for a transaction its body ended: {sent:?}"
    );
    if !sent[0].starts_with("CALL") {
        assert!(
            sent.last()
                .is_some_and(|s| s.trim().starts_with("ROLLBACK")),
            "{sent:?}"
        );
    }
    assert_eq!(B::count_done(&mut conn), 1, "{sent:?}");
    let depth = <<B::Conn as diesel::Connection>::TransactionManager as diesel::connection::TransactionManager<B::Conn>>::transaction_manager_status_mut(&mut conn)
        .transaction_depth()
        .expect("Diesel's count");
    assert_eq!(depth, None, "{sent:?}");
}

#[cfg(feature = "sqlite")]
#[test]
fn a_replay_that_panics_ends_with_a_rollback_sqlite() {
    a_replay_that_panics_ends_with_a_rollback::<crate::backends::Sqlite>();
}

#[cfg(feature = "postgres")]
#[test]
fn a_replay_that_panics_ends_with_a_rollback_postgres() {
    a_replay_that_panics_ends_with_a_rollback::<crate::backends::Postgres>();
}

#[cfg(feature = "mysql")]
#[test]
fn a_replay_that_panics_ends_with_a_rollback_mysql() {
    a_replay_that_panics_ends_with_a_rollback::<crate::backends::Mysql>();
}

#[cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod nested_jobs {
    use crate::nested;

    #[test]
    fn a_nested_unit_job_ends_in_one_statement_postgres() {
        nested::a_nested_unit_job_ends_in_one_statement::<crate::backends::Postgres>();
    }

    #[test]
    fn a_job_calling_itself_fails_and_differs_as_any_call_does_sqlite() {
        nested::a_job_calling_itself_fails_and_differs_as_any_call_does::<crate::backends::Sqlite>(
        );
    }

    #[test]
    fn a_job_calling_itself_fails_and_differs_as_any_call_does_postgres() {
        nested::a_job_calling_itself_fails_and_differs_as_any_call_does::<crate::backends::Postgres>(
        );
    }

    #[test]
    fn a_job_calling_itself_fails_and_differs_as_any_call_does_mysql() {
        nested::a_job_calling_itself_fails_and_differs_as_any_call_does::<crate::backends::Mysql>();
    }

    #[test]
    fn a_unit_job_whose_body_takes_its_claim_never_says_ran_sqlite() {
        nested::a_unit_job_whose_body_takes_its_claim_never_says_ran::<crate::backends::Sqlite>();
    }

    #[test]
    fn a_unit_job_whose_body_takes_its_claim_never_says_ran_postgres() {
        nested::a_unit_job_whose_body_takes_its_claim_never_says_ran::<crate::backends::Postgres>();
    }

    #[test]
    fn a_unit_job_whose_body_takes_its_claim_never_says_ran_mysql() {
        nested::a_unit_job_whose_body_takes_its_claim_never_says_ran::<crate::backends::Mysql>();
    }

    #[test]
    fn a_body_that_releases_the_jobs_savepoint_is_told_truly_sqlite() {
        nested::a_body_that_releases_the_jobs_savepoint_is_told_truly::<crate::backends::Sqlite>();
    }

    #[test]
    fn a_body_that_releases_the_jobs_savepoint_is_told_truly_postgres() {
        nested::a_body_that_releases_the_jobs_savepoint_is_told_truly::<crate::backends::Postgres>(
        );
    }

    #[test]
    fn a_body_that_releases_the_jobs_savepoint_is_told_truly_mysql() {
        nested::a_body_that_releases_the_jobs_savepoint_is_told_truly::<crate::backends::Mysql>();
    }

    #[test]
    fn a_body_that_takes_a_savepoint_of_the_callers_is_told_truly_sqlite() {
        nested::a_body_that_takes_a_savepoint_of_the_callers_is_told_truly::<crate::backends::Sqlite>(
        );
    }

    #[test]
    fn a_body_that_takes_a_savepoint_of_the_callers_is_told_truly_postgres() {
        nested::a_body_that_takes_a_savepoint_of_the_callers_is_told_truly::<
            crate::backends::Postgres,
        >();
    }

    #[test]
    fn a_body_that_takes_a_savepoint_of_the_callers_is_told_truly_mysql() {
        nested::a_body_that_takes_a_savepoint_of_the_callers_is_told_truly::<crate::backends::Mysql>(
        );
    }

    #[test]
    fn a_body_that_ends_a_doubly_nested_callers_transaction_leaves_the_callers_errors_theirs_sqlite()
     {
        nested::a_body_that_ends_a_doubly_nested_callers_transaction_leaves_the_callers_errors_theirs::<
            crate::backends::Sqlite,
        >();
    }

    #[test]
    fn a_body_that_ends_a_doubly_nested_callers_transaction_leaves_the_callers_errors_theirs_postgres()
     {
        nested::a_body_that_ends_a_doubly_nested_callers_transaction_leaves_the_callers_errors_theirs::<
            crate::backends::Postgres,
        >();
    }

    #[test]
    fn a_body_that_ends_a_doubly_nested_callers_transaction_leaves_the_callers_errors_theirs_mysql()
    {
        nested::a_body_that_ends_a_doubly_nested_callers_transaction_leaves_the_callers_errors_theirs::<
            crate::backends::Mysql,
        >();
    }

    #[test]
    fn a_deadlock_the_body_catches_says_the_callers_transaction_is_gone() {
        nested::a_deadlock_the_body_catches_says_the_callers_transaction_is_gone();
    }

    #[test]
    fn a_job_called_after_the_callers_transaction_died_does_not_run() {
        nested::a_job_called_after_the_callers_transaction_died_does_not_run();
    }

    #[test]
    fn a_job_called_two_levels_deep_after_the_caller_ended_its_transaction_returns_its_error() {
        nested::a_job_called_two_levels_deep_after_the_caller_ended_its_transaction_returns_its_error();
    }

    #[test]
    fn a_job_calling_a_job_after_a_caught_deadlock_runs_neither() {
        nested::a_job_calling_a_job_after_a_caught_deadlock_runs_neither();
    }

    #[cfg(feature = "async-mysql")]
    #[test]
    fn an_async_job_called_after_the_caller_ended_its_transaction_does_not_run() {
        nested::an_async_job_called_after_the_caller_ended_its_transaction_does_not_run();
    }

    #[test]
    fn a_claim_behind_a_stale_snapshot_says_to_retry_the_enclosing_transaction() {
        nested::a_claim_behind_a_stale_snapshot_says_to_retry_the_enclosing_transaction();
    }
}

mod relay_reports {
    #[cfg(feature = "sqlite")]
    #[test]
    fn a_run_that_parks_lapsed_messages_reports_them_sqlite() {
        crate::relay_truth::a_run_that_parks_lapsed_messages_reports_them::<crate::backends::Sqlite>(
        );
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn a_run_that_parks_lapsed_messages_reports_them_postgres() {
        crate::relay_truth::a_run_that_parks_lapsed_messages_reports_them::<
            crate::backends::Postgres,
        >();
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn a_run_that_parks_lapsed_messages_reports_them_mysql() {
        crate::relay_truth::a_run_that_parks_lapsed_messages_reports_them::<crate::backends::Mysql>(
        );
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn a_delivery_error_that_panics_when_shown_is_a_failed_delivery_sqlite() {
        crate::relay_truth::a_delivery_error_that_panics_when_shown_is_a_failed_delivery::<
            crate::backends::Sqlite,
        >();
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn a_delivery_error_that_panics_when_shown_is_a_failed_delivery_postgres() {
        crate::relay_truth::a_delivery_error_that_panics_when_shown_is_a_failed_delivery::<
            crate::backends::Postgres,
        >();
    }
}

/// MariaDB sessions with `innodb_snapshot_isolation = ON` (error 1020).
#[cfg(feature = "mysql")]
mod snapshot_isolation_tests {
    use crate::snapshot_isolation;

    #[test]
    fn a_claim_behind_a_changed_row_says_to_retry_the_callers_transaction() {
        snapshot_isolation::a_claim_behind_a_changed_row_says_to_retry_the_callers_transaction();
    }

    #[test]
    fn a_job_whose_read_failed_midway_runs_at_its_next_delivery() {
        snapshot_isolation::a_job_whose_read_failed_midway_runs_at_its_next_delivery();
    }

    #[test]
    fn racing_relays_deliver_every_message_once() {
        snapshot_isolation::racing_relays_deliver_every_message_once();
    }
}

/// Where `verify` and `migrate` find the runtime's tables, and what a failed step says to do.
mod schema_placement {
    macro_rules! shadow_test {
        ($name:ident, $feature:literal, $backend:ty) => {
            #[cfg(feature = $feature)]
            #[test]
            fn $name() {
                crate::schema::a_temporary_table_that_hides_the_runtimes_is_named::<$backend>();
            }
        };
    }
    shadow_test!(
        a_temporary_table_that_hides_the_runtimes_is_named_sqlite,
        "sqlite",
        crate::backends::Sqlite
    );
    shadow_test!(
        a_temporary_table_that_hides_the_runtimes_is_named_postgres,
        "postgres",
        crate::backends::Postgres
    );
    shadow_test!(
        a_temporary_table_that_hides_the_runtimes_is_named_mysql,
        "mysql",
        crate::backends::Mysql
    );
    shadow_test!(
        a_temporary_table_that_hides_the_runtimes_is_named_async_postgres,
        "async-postgres",
        crate::backends::AsyncPostgres
    );
    shadow_test!(
        a_temporary_table_that_hides_the_runtimes_is_named_async_mysql,
        "async-mysql",
        crate::backends::AsyncMysql
    );

    #[cfg(feature = "sqlite")]
    #[test]
    fn tables_in_an_attached_database_are_found_there_sqlite() {
        crate::schema::tables_in_an_attached_database_are_found_there::<crate::backends::Sqlite>();
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn an_applications_table_in_an_attached_database_is_foreign_sqlite() {
        crate::schema::an_applications_table_in_an_attached_database_is_foreign::<
            crate::backends::Sqlite,
        >();
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn a_step_that_fails_the_same_way_says_what_to_do_postgres() {
        crate::schema::a_step_that_fails_the_same_way_says_what_to_do::<crate::backends::Postgres>(
        );
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn a_step_that_fails_the_same_way_says_what_to_do_mysql() {
        crate::schema::a_step_that_fails_the_same_way_says_what_to_do::<crate::backends::Mysql>();
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn a_user_without_create_is_told_the_grant_mysql() {
        crate::schema::a_user_without_create_is_told_the_grant::<crate::backends::Mysql>();
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn a_later_migrate_makes_the_procedures_an_earlier_one_could_not_mysql() {
        crate::schema::a_later_migrate_makes_the_procedures_an_earlier_one_could_not::<
            crate::backends::Mysql,
        >();
    }
}
