//! The six connection types behind one trait, so every behaviour test is written once.
//!
//! A sync backend calls the sync handlers on a Diesel connection; an async backend calls the
//! `async fn` handlers on a diesel-async connection, driven by a runtime of its own.

use std::time::Duration;

use idempotent_jobs::keys::{self, JobCount, KeyQuery, KeyRecord};
use idempotent_jobs::testing::Snapshot;
use idempotent_jobs::{Error, Job, JobKey, Outcome, WhileInProgress};

use crate::handlers::{Mode, Receipt, TestError};
use crate::harness::Server;

/// The job of the plain-function-API tests.
pub static PLAIN: Job = Job::new("plain", "plain:<n>");

/// `held_job` through the plain function API: the same job, so the same definition.
pub static HELD: Job = Job::new("held_job", "held:<id>").keep_for(Duration::from_secs(1));

/// A job whose fingerprint covers the inputs each call names: as deploys of one job that change
/// its `fingerprint(...)` would.
pub static DEPLOYED: Job = Job::new("deployed", "deployed:<id>");

/// [`DEPLOYED`]'s key for `id`.
fn deployed_key(id: &str) -> JobKey {
    JobKey::builder()
        .text("deployed:")
        .value(id)
        .build()
        .expect("one value")
}

/// A fingerprint of `inputs`, by name.
fn fingerprint_of(inputs: &[(&str, i64)]) -> idempotent_jobs::fingerprint::Fingerprint {
    inputs
        .iter()
        .fold(
            idempotent_jobs::fingerprint::Fingerprint::builder(),
            |builder, (name, value)| builder.input(name, value),
        )
        .finish()
        .expect("numbers serialize")
}

fn held_key(id: &str) -> JobKey {
    JobKey::builder()
        .text("held:")
        .value(id)
        .build()
        .expect("one value")
}

/// What a behaviour test can do through one connection type.
pub trait Backend: Sized + 'static {
    const SERVER: Server;
    /// For printed figures.
    const NAME: &'static str;
    /// What a test holds: a connection, and for async backends the runtime that drives it.
    type Conn: Send;

    fn try_connect(url: &str) -> Result<Self::Conn, String>;
    fn try_execute(conn: &mut Self::Conn, sql: &str) -> Result<(), String>;
    /// The column `n` of the one row `sql` returns.
    fn query_i64(conn: &mut Self::Conn, sql: &str) -> i64;
    /// Runs the runtime's migrations and creates the tests' tables.
    fn prepare(conn: &mut Self::Conn);
    /// Runs the runtime's migrations only.
    fn migrate(conn: &mut Self::Conn) -> Result<(), idempotent_jobs::Error>;
    /// Runs the runtime's migrations, waiting at most `timeout` for another migration's lock.
    fn migrate_waiting(
        conn: &mut Self::Conn,
        timeout: Duration,
    ) -> Result<(), idempotent_jobs::Error>;
    fn verify(conn: &mut Self::Conn) -> Result<(), idempotent_jobs::Error>;
    /// Drains the outbox; the ids of the messages delivered.
    fn drain_outbox(conn: &mut Self::Conn) -> Vec<String>;

    fn connect(url: &str) -> Self::Conn {
        Self::try_connect(url).unwrap_or_else(|e| panic!("{e}"))
    }

    fn execute(conn: &mut Self::Conn, sql: &str) {
        Self::try_execute(conn, sql).unwrap_or_else(|e| panic!("`{sql}` failed: {e}"));
    }

    // The handlers.
    fn charge(
        conn: &mut Self::Conn,
        order_id: &str,
        amount: i64,
        mode: Mode,
    ) -> Result<Receipt, TestError>;
    /// `charge`, told by [`idempotent_jobs::redelivered`] (`redelivered_async` for async) whether
    /// its message is a redelivery.
    fn charge_redelivered(
        conn: &mut Self::Conn,
        order_id: &str,
        amount: i64,
        redelivered: bool,
    ) -> Result<Receipt, TestError>;
    fn refund(conn: &mut Self::Conn, order_id: &str) -> Result<(), TestError>;
    fn pair(conn: &mut Self::Conn, left: &str, right: &str) -> Result<(), TestError>;
    fn charge_v2(conn: &mut Self::Conn, order_id: &str) -> Result<Vec<u32>, TestError>;
    /// `charge`'s body through the plain function API, which says whether it ran.
    fn charge_outcome(conn: &mut Self::Conn, order_id: &str)
    -> Result<Outcome<Receipt>, TestError>;
    /// The plain function API around the annotated `charge`: the same job and key twice over.
    fn charge_wrapped(conn: &mut Self::Conn, order_id: &str)
    -> Result<Outcome<Receipt>, TestError>;
    /// The plain function API on job [`PLAIN`]: the body returns `value`, or panics when `None`.
    fn plain(
        conn: &mut Self::Conn,
        key: &JobKey,
        value: Option<u32>,
    ) -> Result<Outcome<u32>, TestError>;
    /// `charge` inside a transaction the test opens; returns the charges it saw inside, and
    /// commits when `commit`, else rolls back.
    fn charge_in_transaction(
        conn: &mut Self::Conn,
        order_id: &str,
        commit: bool,
    ) -> Result<i64, TestError>;
    /// The test kit's rule check on `charge`.
    fn assert_charge_idempotent(conn: &mut Self::Conn, order_id: &str) -> Receipt;
    /// The test kit's crash variant on `charge`, with connections to `url`.
    fn assert_charge_survives_crash(url: &str, order_id: &str) -> Receipt;
    /// The test kit's rule check on a handler that is not idempotent: the panic's message.
    fn test_kit_on_sloppy_handler(conn: &mut Self::Conn, order_id: &str) -> String;
    /// The test kit's messages on [`handlers::charge_audited_elsewhere`], whose side connection
    /// opens `url`: `assert_idempotent` on `order-1`, then `assert_rerun_after_crash` on `order-2`.
    fn test_kit_on_audit_elsewhere(conn: &mut Self::Conn, url: &str) -> [String; 2];
    fn charge_checked(
        conn: &mut Self::Conn,
        order_id: &str,
        amount: i64,
        currency: &str,
    ) -> Result<Receipt, TestError>;
    /// [`DEPLOYED`] for `id`, its fingerprint of `inputs`: writes a `deployed` message, returns
    /// the sum of the inputs.
    fn deployed(conn: &mut Self::Conn, id: &str, inputs: &[(&str, i64)]) -> Result<i64, TestError>;
    fn remind(conn: &mut Self::Conn, user_id: i64) -> Result<(), TestError>;
    fn hostile(conn: &mut Self::Conn, value: &str) -> Result<usize, TestError>;
    /// `held_job`: signals `id` once it holds the claim, then works `hold_ms`.
    fn held(conn: &mut Self::Conn, id: &str, hold_ms: u64) -> Result<(), TestError>;
    /// `held_job`'s key through the plain API, retrying its claim for at most `window`.
    fn held_retrying(conn: &mut Self::Conn, id: &str, window: Duration) -> Result<(), TestError>;
    /// `held_job`'s key through the plain API, with an in-progress policy.
    fn held_with_policy(
        conn: &mut Self::Conn,
        id: &str,
        policy: WhileInProgress,
    ) -> Result<(), TestError>;
    fn hourly(conn: &mut Self::Conn, id: &str) -> Result<(), TestError>;
    fn ddl_in_body(conn: &mut Self::Conn, id: &str, fail: bool) -> Result<(), TestError>;
    fn rolled_back_in_body(
        conn: &mut Self::Conn,
        id: &str,
        hand_over: bool,
    ) -> Result<(), TestError>;
    fn big_result(conn: &mut Self::Conn, id: &str, bytes: usize) -> Result<usize, TestError>;
    /// `statements_in_body`: runs `statements` (`;;`-separated) in its body, catching failures.
    fn statements_in_body(
        conn: &mut Self::Conn,
        id: &str,
        statements: &str,
        fail: bool,
    ) -> Result<Receipt, TestError>;
    /// Inside a transaction of the caller's, which writes topic `caller` before and after it:
    /// [`handlers::careless_unit`], or with `value` [`handlers::careless_value`]. The job's
    /// result, and then the caller's transaction's.
    fn careless_in_callers_transaction(
        conn: &mut Self::Conn,
        id: &str,
        statements: &str,
        value: bool,
    ) -> (Result<(), TestError>, Result<(), TestError>);
    /// Inside a transaction of the caller's (`conn.transaction(..)`), which writes topic
    /// `caller:<id>` before the job and, when the job returns `Ok`, after it (and commits), else
    /// rolls back: [`handlers::statements_in_body`] (`value`) or
    /// [`handlers::statements_in_unit_body`]. The job's result, and then the caller's
    /// transaction's.
    fn statements_in_callers_transaction(
        conn: &mut Self::Conn,
        id: &str,
        statements: &str,
        fail: bool,
        value: bool,
    ) -> (Result<Option<Receipt>, TestError>, Result<(), TestError>);
    /// `statements_in_unit_body`: the same, returning `()`.
    fn statements_in_unit_body(
        conn: &mut Self::Conn,
        id: &str,
        statements: &str,
        fail: bool,
    ) -> Result<(), TestError>;
    fn write_skew(
        conn: &mut Self::Conn,
        barrier: &str,
        side: &str,
        other: &str,
    ) -> Result<(), TestError>;
    /// Job [`PLAIN`] with `key` inside a transaction of the caller's (`conn.transaction(..)`),
    /// its body inserting a message of `topic` into `test_outbox`.
    fn plain_in_callers_transaction(
        conn: &mut Self::Conn,
        key: &JobKey,
        topic: &str,
    ) -> Result<Outcome<u32>, TestError>;
    /// Job [`PLAIN`] with `key`, whose body calls the same job with the same key on `other`.
    fn plain_nested_elsewhere(
        conn: &mut Self::Conn,
        other: &mut Self::Conn,
        key: &JobKey,
    ) -> Result<Outcome<u32>, TestError>;
    fn count_topic(conn: &mut Self::Conn, topic: &str) -> i64;
    /// A job whose result's `Serialize` panics.
    fn explode_on_store(conn: &mut Self::Conn, id: &str) -> Result<(), TestError>;
    /// A job whose stored result's `Deserialize` panics when [`handlers::REPLAYS_EXPLODE`] is set.
    fn explode_on_replay(conn: &mut Self::Conn, id: &str) -> Result<u32, TestError>;
    fn greet(conn: &mut Self::Conn, email: &str) -> Result<(), TestError>;
    fn prune(
        conn: &mut Self::Conn,
        options: &idempotent_jobs::Prune,
    ) -> idempotent_jobs::PruneReport;
    /// [`prune`](Self::prune), its error returned.
    fn try_prune(
        conn: &mut Self::Conn,
        options: &idempotent_jobs::Prune,
    ) -> Result<idempotent_jobs::PruneReport, Error>;
    fn keys_lookup(conn: &mut Self::Conn, key: &JobKey) -> Result<Option<KeyRecord>, Error>;
    fn keys_lookup_digest(
        conn: &mut Self::Conn,
        digest: &[u8; 32],
    ) -> Result<Option<KeyRecord>, Error>;
    fn keys_forget(conn: &mut Self::Conn, key: &JobKey) -> Result<bool, Error>;
    fn keys_forget_digest(conn: &mut Self::Conn, digest: &[u8; 32]) -> Result<bool, Error>;
    fn keys_list(conn: &mut Self::Conn, query: &KeyQuery) -> Result<Vec<KeyRecord>, Error>;
    fn keys_job_counts(conn: &mut Self::Conn) -> Result<Vec<JobCount>, Error>;

    // What the tests look at.
    fn snapshot(conn: &mut Self::Conn) -> Snapshot;
    fn count_charges(conn: &mut Self::Conn, order_id: &str) -> i64;
    fn count_messages(conn: &mut Self::Conn) -> i64;
    fn count_done(conn: &mut Self::Conn) -> i64;
    /// `(job_key, job_name, result)` of every done job, by key.
    fn done_rows(conn: &mut Self::Conn) -> Vec<(String, String, Option<String>)>;
}

/// What a job called inside a caller's transaction returned: its own error where it failed (the
/// caller's `ROLLBACK` on a lost connection would put its own error in its place), else the
/// caller's error, else its outcome.
fn the_jobs_result(
    job: Option<Result<Outcome<u32>, TestError>>,
    caller: Result<(), TestError>,
) -> Result<Outcome<u32>, TestError> {
    match (job, caller) {
        (Some(Err(error)), _) | (_, Err(error)) => Err(error),
        (Some(Ok(outcome)), Ok(())) => Ok(outcome),
        (None, Ok(())) => unreachable!("the caller's transaction ran the job"),
    }
}

/// A one-number row.
#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// The message of a caught panic, or a note that there was none.
fn panic_message<T>(caught: std::thread::Result<T>) -> String {
    match caught {
        Ok(_) => "no panic".to_owned(),
        Err(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic without a message".to_owned()),
    }
}

fn body_value(value: Option<u32>) -> Result<u32, TestError> {
    match value {
        Some(value) => Ok(value),
        None => panic!("a replay must not run the body"),
    }
}

#[allow(unused_macros)] // each is used when one of its backends' features is on
macro_rules! sync_backend {
    ($name:ident, $server:expr, $conn:ty) => {
        pub struct $name;

        impl Backend for $name {
            const SERVER: Server = $server;
            const NAME: &'static str = stringify!($name);
            type Conn = $conn;

            fn try_connect(url: &str) -> Result<Self::Conn, String> {
                <$conn as diesel::Connection>::establish(url)
                    .map_err(|e| $server.unreachable(url, &e))
            }

            fn try_execute(conn: &mut Self::Conn, sql: &str) -> Result<(), String> {
                diesel::connection::SimpleConnection::batch_execute(conn, sql)
                    .map_err(|e| e.to_string())
            }

            fn query_i64(conn: &mut Self::Conn, sql: &str) -> i64 {
                let row: N = diesel::RunQueryDsl::get_result(diesel::sql_query(sql), conn)
                    .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
                row.n
            }

            fn migrate(conn: &mut Self::Conn) -> Result<(), idempotent_jobs::Error> {
                idempotent_jobs::migrate(conn)
            }

            fn migrate_waiting(
                conn: &mut Self::Conn,
                timeout: Duration,
            ) -> Result<(), idempotent_jobs::Error> {
                idempotent_jobs::Migrate::new()
                    .lock_timeout(timeout)
                    .run(conn)
            }

            fn verify(conn: &mut Self::Conn) -> Result<(), idempotent_jobs::Error> {
                idempotent_jobs::verify(conn)
            }

            fn drain_outbox(conn: &mut Self::Conn) -> Vec<String> {
                let mut delivered = Vec::new();
                idempotent_jobs::outbox::Relay::new()
                    .drain(conn, |message| {
                        delivered.push(message.message_id().to_owned());
                        Ok::<_, String>(())
                    })
                    .expect("a relay");
                delivered
            }

            fn prepare(conn: &mut Self::Conn) {
                idempotent_jobs::migrate(conn).expect("the runtime's migrations run");
                for sql in handlers::test_tables($server) {
                    Self::execute(conn, &sql);
                }
            }

            fn charge(
                conn: &mut Self::Conn,
                order_id: &str,
                amount: i64,
                mode: Mode,
            ) -> Result<Receipt, TestError> {
                handlers::charge(conn, order_id, amount, mode)
            }

            fn charge_redelivered(
                conn: &mut Self::Conn,
                order_id: &str,
                amount: i64,
                redelivered: bool,
            ) -> Result<Receipt, TestError> {
                idempotent_jobs::redelivered(redelivered, || {
                    handlers::charge(conn, order_id, amount, Mode::Succeed)
                })
            }

            fn refund(conn: &mut Self::Conn, order_id: &str) -> Result<(), TestError> {
                handlers::refund(conn, order_id)
            }

            fn pair(conn: &mut Self::Conn, left: &str, right: &str) -> Result<(), TestError> {
                handlers::pair(conn, left, right)
            }

            fn charge_v2(conn: &mut Self::Conn, order_id: &str) -> Result<Vec<u32>, TestError> {
                handlers::charge_v2(conn, order_id)
            }

            fn charge_outcome(
                conn: &mut Self::Conn,
                order_id: &str,
            ) -> Result<Outcome<Receipt>, TestError> {
                idempotent_jobs::run(
                    conn,
                    &handlers::CHARGE,
                    &handlers::charge_key(order_id),
                    |conn| handlers::charge_body(conn, order_id, 4200, Mode::Succeed),
                )
            }

            fn charge_wrapped(
                conn: &mut Self::Conn,
                order_id: &str,
            ) -> Result<Outcome<Receipt>, TestError> {
                idempotent_jobs::run(
                    conn,
                    &handlers::CHARGE,
                    &handlers::charge_key(order_id),
                    |conn| handlers::charge(conn, order_id, 4200, Mode::Succeed),
                )
            }

            fn plain(
                conn: &mut Self::Conn,
                key: &JobKey,
                value: Option<u32>,
            ) -> Result<Outcome<u32>, TestError> {
                idempotent_jobs::run(conn, &PLAIN, key, |_| body_value(value))
            }

            fn charge_in_transaction(
                conn: &mut Self::Conn,
                order_id: &str,
                commit: bool,
            ) -> Result<i64, TestError> {
                diesel::Connection::transaction(conn, |conn| {
                    handlers::charge(conn, order_id, 4200, Mode::Succeed)?;
                    let seen = handlers::TestConn::count_charges(conn, order_id)?;
                    if commit {
                        Ok(seen)
                    } else {
                        Err(TestError::Declined)
                    }
                })
            }

            fn assert_charge_idempotent(conn: &mut Self::Conn, order_id: &str) -> Receipt {
                idempotent_jobs::testing::assert_idempotent(conn, |conn| {
                    handlers::charge(conn, order_id, 4200, Mode::Succeed)
                })
            }

            fn assert_charge_survives_crash(url: &str, order_id: &str) -> Receipt {
                idempotent_jobs::testing::assert_rerun_after_crash(
                    || Self::connect(url),
                    |conn| handlers::charge(conn, order_id, 4200, Mode::Succeed),
                )
            }

            fn test_kit_on_sloppy_handler(conn: &mut Self::Conn, order_id: &str) -> String {
                panic_message(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || {
                        idempotent_jobs::testing::assert_idempotent(conn, |conn| {
                            handlers::sloppy_audit_then_charge(conn, order_id)
                        })
                    },
                )))
            }

            fn test_kit_on_audit_elsewhere(conn: &mut Self::Conn, url: &str) -> [String; 2] {
                let kit = panic_message(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || {
                        idempotent_jobs::testing::assert_idempotent(conn, |conn| {
                            handlers::charge_audited_elsewhere(conn, url, "order-1")
                        })
                    },
                )));
                let crash = panic_message(std::panic::catch_unwind(|| {
                    idempotent_jobs::testing::assert_rerun_after_crash(
                        || Self::connect(url),
                        |conn| handlers::charge_audited_elsewhere(conn, url, "order-2"),
                    )
                }));
                [kit, crash]
            }

            fn charge_checked(
                conn: &mut Self::Conn,
                order_id: &str,
                amount: i64,
                currency: &str,
            ) -> Result<Receipt, TestError> {
                handlers::charge_checked(conn, order_id, amount, currency)
            }

            fn remind(conn: &mut Self::Conn, user_id: i64) -> Result<(), TestError> {
                handlers::remind(conn, user_id)
            }

            fn hostile(conn: &mut Self::Conn, value: &str) -> Result<usize, TestError> {
                handlers::hostile(conn, value)
            }

            fn held(conn: &mut Self::Conn, id: &str, hold_ms: u64) -> Result<(), TestError> {
                handlers::held_job(conn, id, hold_ms)
            }

            fn deployed(
                conn: &mut Self::Conn,
                id: &str,
                inputs: &[(&str, i64)],
            ) -> Result<i64, TestError> {
                idempotent_jobs::JobCall::new(&DEPLOYED, &deployed_key(id))
                    .fingerprint(fingerprint_of(inputs))
                    .run(conn, |conn| {
                        handlers::TestConn::insert_message(conn, "deployed", id)?;
                        Ok::<_, TestError>(inputs.iter().map(|(_, value)| value).sum())
                    })
                    .map(Outcome::into_inner)
            }

            fn held_retrying(
                conn: &mut Self::Conn,
                id: &str,
                window: Duration,
            ) -> Result<(), TestError> {
                idempotent_jobs::JobCall::new(&HELD, &held_key(id))
                    .retry_for(window)
                    .run(conn, |conn| {
                        handlers::TestConn::insert_message(conn, "held", id)?;
                        Ok::<_, TestError>(())
                    })
                    .map(Outcome::into_inner)
            }

            fn held_with_policy(
                conn: &mut Self::Conn,
                id: &str,
                policy: WhileInProgress,
            ) -> Result<(), TestError> {
                idempotent_jobs::JobCall::new(&HELD, &held_key(id))
                    .while_in_progress(policy)
                    .run(conn, |conn| {
                        handlers::TestConn::insert_message(conn, "held", id)?;
                        Ok::<_, TestError>(())
                    })
                    .map(Outcome::into_inner)
            }

            fn hourly(conn: &mut Self::Conn, id: &str) -> Result<(), TestError> {
                handlers::hourly(conn, id)
            }

            fn ddl_in_body(conn: &mut Self::Conn, id: &str, fail: bool) -> Result<(), TestError> {
                handlers::ddl_in_body(conn, id, fail)
            }

            fn rolled_back_in_body(
                conn: &mut Self::Conn,
                id: &str,
                hand_over: bool,
            ) -> Result<(), TestError> {
                handlers::rolled_back_in_body(conn, id, hand_over)
            }

            fn statements_in_body(
                conn: &mut Self::Conn,
                id: &str,
                statements: &str,
                fail: bool,
            ) -> Result<Receipt, TestError> {
                handlers::statements_in_body(conn, id, statements, fail)
            }

            fn careless_in_callers_transaction(
                conn: &mut Self::Conn,
                id: &str,
                statements: &str,
                value: bool,
            ) -> (Result<(), TestError>, Result<(), TestError>) {
                let mut job = Ok(());
                let caller = diesel::Connection::transaction(conn, |conn| {
                    handlers::TestConn::insert_message(conn, "caller", id)?;
                    job = match value {
                        true => handlers::careless_value(conn, id, statements).map(drop),
                        false => handlers::careless_unit(conn, id, statements),
                    };
                    handlers::TestConn::insert_message(conn, "caller", id)?;
                    Ok::<_, TestError>(())
                });
                (job, caller)
            }

            fn statements_in_callers_transaction(
                conn: &mut Self::Conn,
                id: &str,
                statements: &str,
                fail: bool,
                value: bool,
            ) -> (Result<Option<Receipt>, TestError>, Result<(), TestError>) {
                let caller_topic = format!("caller:{id}");
                let mut job = Ok(None);
                let caller = diesel::Connection::transaction(conn, |conn| {
                    handlers::TestConn::insert_message(conn, &caller_topic, id)?;
                    job = match value {
                        true => handlers::statements_in_body(conn, id, statements, fail).map(Some),
                        false => handlers::statements_in_unit_body(conn, id, statements, fail)
                            .map(|()| None),
                    };
                    if job.is_err() {
                        // The caller returns the job's error: its transaction rolls back.
                        return Err(TestError::Declined);
                    }
                    handlers::TestConn::insert_message(conn, &caller_topic, id)?;
                    Ok::<_, TestError>(())
                });
                (job, caller)
            }

            fn statements_in_unit_body(
                conn: &mut Self::Conn,
                id: &str,
                statements: &str,
                fail: bool,
            ) -> Result<(), TestError> {
                handlers::statements_in_unit_body(conn, id, statements, fail)
            }

            fn big_result(
                conn: &mut Self::Conn,
                id: &str,
                bytes: usize,
            ) -> Result<usize, TestError> {
                handlers::big_result(conn, id, bytes).map(|r| r.len())
            }

            fn write_skew(
                conn: &mut Self::Conn,
                barrier: &str,
                side: &str,
                other: &str,
            ) -> Result<(), TestError> {
                handlers::write_skew(conn, barrier, side, other)
            }

            fn plain_in_callers_transaction(
                conn: &mut Self::Conn,
                key: &JobKey,
                topic: &str,
            ) -> Result<Outcome<u32>, TestError> {
                let mut job = None;
                let caller = diesel::Connection::transaction::<_, TestError, _>(conn, |conn| {
                    let ran = idempotent_jobs::run(conn, &PLAIN, key, |conn| {
                        handlers::TestConn::insert_message(conn, topic, "x")?;
                        Ok::<_, TestError>(1)
                    });
                    let failed = ran.is_err();
                    job = Some(ran);
                    match failed {
                        true => Err(TestError::Service("the job failed".into())),
                        false => Ok(()),
                    }
                });
                the_jobs_result(job, caller)
            }

            fn plain_nested_elsewhere(
                conn: &mut Self::Conn,
                other: &mut Self::Conn,
                key: &JobKey,
            ) -> Result<Outcome<u32>, TestError> {
                idempotent_jobs::run(conn, &PLAIN, key, |_| {
                    idempotent_jobs::run(other, &PLAIN, key, |_| Ok::<_, TestError>(1))
                        .map(Outcome::into_inner)
                })
            }

            fn count_topic(conn: &mut Self::Conn, topic: &str) -> i64 {
                handlers::TestConn::count_topic(conn, topic).expect("counting a topic")
            }

            fn explode_on_store(conn: &mut Self::Conn, id: &str) -> Result<(), TestError> {
                handlers::explode_on_store(conn, id).map(drop)
            }

            fn explode_on_replay(conn: &mut Self::Conn, id: &str) -> Result<u32, TestError> {
                handlers::explode_on_replay(conn, id).map(|r| r.0)
            }

            fn greet(conn: &mut Self::Conn, email: &str) -> Result<(), TestError> {
                handlers::greet(conn, email)
            }

            fn prune(
                conn: &mut Self::Conn,
                options: &idempotent_jobs::Prune,
            ) -> idempotent_jobs::PruneReport {
                idempotent_jobs::prune(conn, options).expect("pruning")
            }

            fn try_prune(
                conn: &mut Self::Conn,
                options: &idempotent_jobs::Prune,
            ) -> Result<idempotent_jobs::PruneReport, Error> {
                idempotent_jobs::prune(conn, options)
            }

            fn keys_lookup(
                conn: &mut Self::Conn,
                key: &JobKey,
            ) -> Result<Option<KeyRecord>, Error> {
                keys::lookup(conn, key)
            }

            fn keys_lookup_digest(
                conn: &mut Self::Conn,
                digest: &[u8; 32],
            ) -> Result<Option<KeyRecord>, Error> {
                keys::lookup_digest(conn, digest)
            }

            fn keys_forget(conn: &mut Self::Conn, key: &JobKey) -> Result<bool, Error> {
                keys::forget(conn, key, "a test")
            }

            fn keys_forget_digest(conn: &mut Self::Conn, digest: &[u8; 32]) -> Result<bool, Error> {
                keys::forget_digest(conn, digest, "a test")
            }

            fn keys_list(conn: &mut Self::Conn, query: &KeyQuery) -> Result<Vec<KeyRecord>, Error> {
                keys::list(conn, query)
            }

            fn keys_job_counts(conn: &mut Self::Conn) -> Result<Vec<JobCount>, Error> {
                keys::job_counts(conn)
            }

            fn snapshot(conn: &mut Self::Conn) -> Snapshot {
                Snapshot::take(conn).expect("reading every table")
            }

            fn count_charges(conn: &mut Self::Conn, order_id: &str) -> i64 {
                handlers::TestConn::count_charges(conn, order_id).expect("counting charges")
            }

            fn count_messages(conn: &mut Self::Conn) -> i64 {
                handlers::TestConn::count_messages(conn).expect("counting messages")
            }

            fn count_done(conn: &mut Self::Conn) -> i64 {
                handlers::TestConn::count_done(conn).expect("counting done jobs")
            }

            fn done_rows(conn: &mut Self::Conn) -> Vec<(String, String, Option<String>)> {
                handlers::TestConn::done_rows(conn).expect("reading done_jobs")
            }
        }
    };
}

/// An async connection and the runtime that drives it.
#[cfg(feature = "async")]
pub struct AsyncConn<C> {
    pub runtime: tokio::runtime::Runtime,
    pub conn: C,
}

#[allow(unused_macros)] // each is used when one of its backends' features is on
macro_rules! async_backend {
    ($name:ident, $server:expr, $conn:ty) => {
        pub struct $name;

        impl Backend for $name {
            const SERVER: Server = $server;
            const NAME: &'static str = stringify!($name);
            type Conn = AsyncConn<$conn>;

            fn try_connect(url: &str) -> Result<Self::Conn, String> {
                // Multi-threaded, as `#[tokio::main]` is: diesel-async's SQLite wrapper blocks in
                // place when a future is dropped mid-statement, which a current-thread runtime
                // cannot do.
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let conn = runtime
                    .block_on(<$conn as diesel_async::AsyncConnection>::establish(url))
                    .map_err(|e| $server.unreachable(url, &e))?;
                Ok(AsyncConn { runtime, conn })
            }

            fn query_i64(c: &mut Self::Conn, sql: &str) -> i64 {
                let row: N = c
                    .runtime
                    .block_on(diesel_async::RunQueryDsl::get_result(
                        diesel::sql_query(sql),
                        &mut c.conn,
                    ))
                    .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
                row.n
            }

            fn try_execute(c: &mut Self::Conn, sql: &str) -> Result<(), String> {
                c.runtime
                    .block_on(diesel_async::SimpleAsyncConnection::batch_execute(
                        &mut c.conn,
                        sql,
                    ))
                    .map_err(|e| e.to_string())
            }

            fn migrate(c: &mut Self::Conn) -> Result<(), idempotent_jobs::Error> {
                c.runtime
                    .block_on(idempotent_jobs::migrate_async(&mut c.conn))
            }

            fn migrate_waiting(
                c: &mut Self::Conn,
                timeout: Duration,
            ) -> Result<(), idempotent_jobs::Error> {
                c.runtime.block_on(
                    idempotent_jobs::Migrate::new()
                        .lock_timeout(timeout)
                        .run_async(&mut c.conn),
                )
            }

            fn verify(c: &mut Self::Conn) -> Result<(), idempotent_jobs::Error> {
                c.runtime
                    .block_on(idempotent_jobs::verify_async(&mut c.conn))
            }

            fn drain_outbox(c: &mut Self::Conn) -> Vec<String> {
                let mut delivered = Vec::new();
                c.runtime
                    .block_on(idempotent_jobs::outbox::Relay::new().drain_async(
                        &mut c.conn,
                        async |message| {
                            delivered.push(message.message_id().to_owned());
                            Ok::<_, String>(())
                        },
                    ))
                    .expect("a relay");
                delivered
            }

            fn prepare(c: &mut Self::Conn) {
                c.runtime
                    .block_on(idempotent_jobs::migrate_async(&mut c.conn))
                    .expect("the runtime's migrations run");
                for sql in handlers::test_tables($server) {
                    Self::execute(c, &sql);
                }
            }

            fn charge(
                c: &mut Self::Conn,
                order_id: &str,
                amount: i64,
                mode: Mode,
            ) -> Result<Receipt, TestError> {
                c.runtime
                    .block_on(handlers::charge_async(&mut c.conn, order_id, amount, mode))
            }

            fn charge_redelivered(
                c: &mut Self::Conn,
                order_id: &str,
                amount: i64,
                redelivered: bool,
            ) -> Result<Receipt, TestError> {
                c.runtime.block_on(idempotent_jobs::redelivered_async(
                    redelivered,
                    handlers::charge_async(&mut c.conn, order_id, amount, Mode::Succeed),
                ))
            }

            fn refund(c: &mut Self::Conn, order_id: &str) -> Result<(), TestError> {
                c.runtime
                    .block_on(handlers::refund_async(&mut c.conn, order_id))
            }

            fn pair(c: &mut Self::Conn, left: &str, right: &str) -> Result<(), TestError> {
                c.runtime
                    .block_on(handlers::pair_async(&mut c.conn, left, right))
            }

            fn charge_v2(c: &mut Self::Conn, order_id: &str) -> Result<Vec<u32>, TestError> {
                c.runtime
                    .block_on(handlers::charge_v2_async(&mut c.conn, order_id))
            }

            fn charge_outcome(
                c: &mut Self::Conn,
                order_id: &str,
            ) -> Result<Outcome<Receipt>, TestError> {
                c.runtime.block_on(idempotent_jobs::run_async(
                    &mut c.conn,
                    &handlers::CHARGE,
                    &handlers::charge_key(order_id),
                    async |conn| {
                        handlers::charge_body_async(conn, order_id, 4200, Mode::Succeed).await
                    },
                ))
            }

            fn charge_wrapped(
                c: &mut Self::Conn,
                order_id: &str,
            ) -> Result<Outcome<Receipt>, TestError> {
                c.runtime.block_on(idempotent_jobs::run_async(
                    &mut c.conn,
                    &handlers::CHARGE,
                    &handlers::charge_key(order_id),
                    async |conn| handlers::charge_async(conn, order_id, 4200, Mode::Succeed).await,
                ))
            }

            fn plain(
                c: &mut Self::Conn,
                key: &JobKey,
                value: Option<u32>,
            ) -> Result<Outcome<u32>, TestError> {
                c.runtime.block_on(idempotent_jobs::run_async(
                    &mut c.conn,
                    &PLAIN,
                    key,
                    async |_| body_value(value),
                ))
            }

            fn charge_in_transaction(
                c: &mut Self::Conn,
                order_id: &str,
                commit: bool,
            ) -> Result<i64, TestError> {
                c.runtime
                    .block_on(diesel_async::AsyncConnection::transaction(
                        &mut c.conn,
                        async |conn| {
                            handlers::charge_async(conn, order_id, 4200, Mode::Succeed).await?;
                            let seen =
                                handlers::AsyncTestConn::count_charges(conn, order_id).await?;
                            if commit {
                                Ok(seen)
                            } else {
                                Err(TestError::Declined)
                            }
                        },
                    ))
            }

            fn assert_charge_idempotent(c: &mut Self::Conn, order_id: &str) -> Receipt {
                c.runtime
                    .block_on(idempotent_jobs::testing::assert_idempotent_async(
                        &mut c.conn,
                        async |conn| {
                            handlers::charge_async(conn, order_id, 4200, Mode::Succeed).await
                        },
                    ))
            }

            fn assert_charge_survives_crash(url: &str, order_id: &str) -> Receipt {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(idempotent_jobs::testing::assert_rerun_after_crash_async(
                    async || {
                        <$conn as diesel_async::AsyncConnection>::establish(url)
                            .await
                            .unwrap_or_else(|e| panic!("{}", $server.unreachable(url, &e)))
                    },
                    async |conn| handlers::charge_async(conn, order_id, 4200, Mode::Succeed).await,
                ))
            }

            fn test_kit_on_sloppy_handler(c: &mut Self::Conn, order_id: &str) -> String {
                let AsyncConn { runtime, conn } = c;
                panic_message(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || {
                        runtime.block_on(idempotent_jobs::testing::assert_idempotent_async(
                            conn,
                            async |conn| {
                                handlers::sloppy_audit_then_charge_async(conn, order_id).await
                            },
                        ))
                    },
                )))
            }

            fn test_kit_on_audit_elsewhere(c: &mut Self::Conn, url: &str) -> [String; 2] {
                let AsyncConn { runtime, conn } = c;
                let kit = panic_message(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || {
                        runtime.block_on(idempotent_jobs::testing::assert_idempotent_async(
                            conn,
                            async |conn| {
                                handlers::charge_audited_elsewhere_async(conn, url, "order-1").await
                            },
                        ))
                    },
                )));
                let crash = panic_message(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                    || {
                        runtime.block_on(idempotent_jobs::testing::assert_rerun_after_crash_async(
                            async || {
                                <$conn as diesel_async::AsyncConnection>::establish(url)
                                    .await
                                    .unwrap_or_else(|e| panic!("{}", $server.unreachable(url, &e)))
                            },
                            async |conn| {
                                handlers::charge_audited_elsewhere_async(conn, url, "order-2").await
                            },
                        ))
                    },
                )));
                [kit, crash]
            }

            fn charge_checked(
                c: &mut Self::Conn,
                order_id: &str,
                amount: i64,
                currency: &str,
            ) -> Result<Receipt, TestError> {
                c.runtime.block_on(handlers::charge_checked_async(
                    &mut c.conn,
                    order_id,
                    amount,
                    currency,
                ))
            }

            fn remind(c: &mut Self::Conn, user_id: i64) -> Result<(), TestError> {
                c.runtime
                    .block_on(handlers::remind_async(&mut c.conn, user_id))
            }

            fn hostile(c: &mut Self::Conn, value: &str) -> Result<usize, TestError> {
                c.runtime
                    .block_on(handlers::hostile_async(&mut c.conn, value))
            }

            fn held(c: &mut Self::Conn, id: &str, hold_ms: u64) -> Result<(), TestError> {
                c.runtime
                    .block_on(handlers::held_job_async(&mut c.conn, id, hold_ms))
            }

            fn held_with_policy(
                c: &mut Self::Conn,
                id: &str,
                policy: WhileInProgress,
            ) -> Result<(), TestError> {
                c.runtime
                    .block_on(
                        idempotent_jobs::JobCall::new(&HELD, &held_key(id))
                            .while_in_progress(policy)
                            .run_async(&mut c.conn, async |conn| {
                                handlers::AsyncTestConn::insert_message(conn, "held", id).await?;
                                Ok::<_, TestError>(())
                            }),
                    )
                    .map(Outcome::into_inner)
            }

            fn deployed(
                c: &mut Self::Conn,
                id: &str,
                inputs: &[(&str, i64)],
            ) -> Result<i64, TestError> {
                c.runtime
                    .block_on(
                        idempotent_jobs::JobCall::new(&DEPLOYED, &deployed_key(id))
                            .fingerprint(fingerprint_of(inputs))
                            .run_async(&mut c.conn, async |conn| {
                                handlers::AsyncTestConn::insert_message(conn, "deployed", id)
                                    .await?;
                                Ok::<_, TestError>(inputs.iter().map(|(_, value)| value).sum())
                            }),
                    )
                    .map(Outcome::into_inner)
            }

            fn held_retrying(
                c: &mut Self::Conn,
                id: &str,
                window: Duration,
            ) -> Result<(), TestError> {
                c.runtime
                    .block_on(
                        idempotent_jobs::JobCall::new(&HELD, &held_key(id))
                            .retry_for(window)
                            .run_async(&mut c.conn, async |conn| {
                                handlers::AsyncTestConn::insert_message(conn, "held", id).await?;
                                Ok::<_, TestError>(())
                            }),
                    )
                    .map(Outcome::into_inner)
            }

            fn hourly(c: &mut Self::Conn, id: &str) -> Result<(), TestError> {
                c.runtime.block_on(handlers::hourly_async(&mut c.conn, id))
            }

            fn ddl_in_body(c: &mut Self::Conn, id: &str, fail: bool) -> Result<(), TestError> {
                c.runtime
                    .block_on(handlers::ddl_in_body_async(&mut c.conn, id, fail))
            }

            fn rolled_back_in_body(
                c: &mut Self::Conn,
                id: &str,
                hand_over: bool,
            ) -> Result<(), TestError> {
                c.runtime.block_on(handlers::rolled_back_in_body_async(
                    &mut c.conn,
                    id,
                    hand_over,
                ))
            }

            fn statements_in_body(
                c: &mut Self::Conn,
                id: &str,
                statements: &str,
                fail: bool,
            ) -> Result<Receipt, TestError> {
                c.runtime.block_on(handlers::statements_in_body_async(
                    &mut c.conn,
                    id,
                    statements,
                    fail,
                ))
            }

            fn careless_in_callers_transaction(
                c: &mut Self::Conn,
                id: &str,
                statements: &str,
                value: bool,
            ) -> (Result<(), TestError>, Result<(), TestError>) {
                let mut job = Ok(());
                let caller = c
                    .runtime
                    .block_on(diesel_async::AsyncConnection::transaction(
                        &mut c.conn,
                        async |conn| {
                            handlers::AsyncTestConn::insert_message(conn, "caller", id).await?;
                            job = match value {
                                true => handlers::careless_value_async(conn, id, statements)
                                    .await
                                    .map(drop),
                                false => handlers::careless_unit_async(conn, id, statements).await,
                            };
                            handlers::AsyncTestConn::insert_message(conn, "caller", id).await?;
                            Ok::<_, TestError>(())
                        },
                    ));
                (job, caller)
            }

            fn statements_in_callers_transaction(
                c: &mut Self::Conn,
                id: &str,
                statements: &str,
                fail: bool,
                value: bool,
            ) -> (Result<Option<Receipt>, TestError>, Result<(), TestError>) {
                let caller_topic = format!("caller:{id}");
                let mut job = Ok(None);
                let caller = c
                    .runtime
                    .block_on(diesel_async::AsyncConnection::transaction(
                        &mut c.conn,
                        async |conn| {
                            handlers::AsyncTestConn::insert_message(conn, &caller_topic, id)
                                .await?;
                            job = match value {
                                true => {
                                    handlers::statements_in_body_async(conn, id, statements, fail)
                                        .await
                                        .map(Some)
                                }
                                false => handlers::statements_in_unit_body_async(
                                    conn, id, statements, fail,
                                )
                                .await
                                .map(|()| None),
                            };
                            if job.is_err() {
                                return Err(TestError::Declined);
                            }
                            handlers::AsyncTestConn::insert_message(conn, &caller_topic, id)
                                .await?;
                            Ok::<_, TestError>(())
                        },
                    ));
                (job, caller)
            }

            fn statements_in_unit_body(
                c: &mut Self::Conn,
                id: &str,
                statements: &str,
                fail: bool,
            ) -> Result<(), TestError> {
                c.runtime.block_on(handlers::statements_in_unit_body_async(
                    &mut c.conn,
                    id,
                    statements,
                    fail,
                ))
            }

            fn big_result(c: &mut Self::Conn, id: &str, bytes: usize) -> Result<usize, TestError> {
                c.runtime
                    .block_on(handlers::big_result_async(&mut c.conn, id, bytes))
                    .map(|r| r.len())
            }

            fn write_skew(
                c: &mut Self::Conn,
                barrier: &str,
                side: &str,
                other: &str,
            ) -> Result<(), TestError> {
                c.runtime.block_on(handlers::write_skew_async(
                    &mut c.conn,
                    barrier,
                    side,
                    other,
                ))
            }

            fn plain_in_callers_transaction(
                c: &mut Self::Conn,
                key: &JobKey,
                topic: &str,
            ) -> Result<Outcome<u32>, TestError> {
                let job = std::sync::Mutex::new(None);
                let caller =
                    c.runtime.block_on(
                        diesel_async::AsyncConnection::transaction::<_, TestError, _>(
                            &mut c.conn,
                            async |conn| {
                                let ran =
                                    idempotent_jobs::run_async(conn, &PLAIN, key, async |conn| {
                                        handlers::AsyncTestConn::insert_message(conn, topic, "x")
                                            .await?;
                                        Ok::<_, TestError>(1)
                                    })
                                    .await;
                                let failed = ran.is_err();
                                *job.lock().expect("the job's result") = Some(ran);
                                match failed {
                                    true => Err(TestError::Service("the job failed".into())),
                                    false => Ok(()),
                                }
                            },
                        ),
                    );
                the_jobs_result(job.into_inner().expect("the job's result"), caller)
            }

            fn plain_nested_elsewhere(
                c: &mut Self::Conn,
                other: &mut Self::Conn,
                key: &JobKey,
            ) -> Result<Outcome<u32>, TestError> {
                let other = &mut other.conn;
                c.runtime.block_on(idempotent_jobs::run_async(
                    &mut c.conn,
                    &PLAIN,
                    key,
                    async |_| {
                        idempotent_jobs::run_async(other, &PLAIN, key, async |_| {
                            Ok::<_, TestError>(1)
                        })
                        .await
                        .map(Outcome::into_inner)
                    },
                ))
            }

            fn count_topic(c: &mut Self::Conn, topic: &str) -> i64 {
                c.runtime
                    .block_on(handlers::AsyncTestConn::count_topic(&mut c.conn, topic))
                    .expect("counting a topic")
            }

            fn explode_on_store(c: &mut Self::Conn, id: &str) -> Result<(), TestError> {
                c.runtime
                    .block_on(handlers::explode_on_store_async(&mut c.conn, id))
                    .map(drop)
            }

            fn explode_on_replay(c: &mut Self::Conn, id: &str) -> Result<u32, TestError> {
                c.runtime
                    .block_on(handlers::explode_on_replay_async(&mut c.conn, id))
                    .map(|r| r.0)
            }

            fn greet(c: &mut Self::Conn, email: &str) -> Result<(), TestError> {
                c.runtime
                    .block_on(handlers::greet_async(&mut c.conn, email))
            }

            fn prune(
                c: &mut Self::Conn,
                options: &idempotent_jobs::Prune,
            ) -> idempotent_jobs::PruneReport {
                c.runtime
                    .block_on(idempotent_jobs::prune_async(&mut c.conn, options))
                    .expect("pruning")
            }

            fn try_prune(
                c: &mut Self::Conn,
                options: &idempotent_jobs::Prune,
            ) -> Result<idempotent_jobs::PruneReport, Error> {
                c.runtime
                    .block_on(idempotent_jobs::prune_async(&mut c.conn, options))
            }

            fn keys_lookup(c: &mut Self::Conn, key: &JobKey) -> Result<Option<KeyRecord>, Error> {
                c.runtime.block_on(keys::lookup_async(&mut c.conn, key))
            }

            fn keys_lookup_digest(
                c: &mut Self::Conn,
                digest: &[u8; 32],
            ) -> Result<Option<KeyRecord>, Error> {
                c.runtime
                    .block_on(keys::lookup_digest_async(&mut c.conn, digest))
            }

            fn keys_forget(c: &mut Self::Conn, key: &JobKey) -> Result<bool, Error> {
                c.runtime
                    .block_on(keys::forget_async(&mut c.conn, key, "a test"))
            }

            fn keys_forget_digest(c: &mut Self::Conn, digest: &[u8; 32]) -> Result<bool, Error> {
                c.runtime
                    .block_on(keys::forget_digest_async(&mut c.conn, digest, "a test"))
            }

            fn keys_list(c: &mut Self::Conn, query: &KeyQuery) -> Result<Vec<KeyRecord>, Error> {
                c.runtime.block_on(keys::list_async(&mut c.conn, query))
            }

            fn keys_job_counts(c: &mut Self::Conn) -> Result<Vec<JobCount>, Error> {
                c.runtime.block_on(keys::job_counts_async(&mut c.conn))
            }

            fn snapshot(c: &mut Self::Conn) -> Snapshot {
                c.runtime
                    .block_on(Snapshot::take_async(&mut c.conn))
                    .expect("reading every table")
            }

            fn count_charges(c: &mut Self::Conn, order_id: &str) -> i64 {
                c.runtime
                    .block_on(handlers::AsyncTestConn::count_charges(
                        &mut c.conn,
                        order_id,
                    ))
                    .expect("counting charges")
            }

            fn count_messages(c: &mut Self::Conn) -> i64 {
                c.runtime
                    .block_on(handlers::AsyncTestConn::count_messages(&mut c.conn))
                    .expect("counting messages")
            }

            fn count_done(c: &mut Self::Conn) -> i64 {
                c.runtime
                    .block_on(handlers::AsyncTestConn::count_done(&mut c.conn))
                    .expect("counting done jobs")
            }

            fn done_rows(c: &mut Self::Conn) -> Vec<(String, String, Option<String>)> {
                c.runtime
                    .block_on(handlers::AsyncTestConn::done_rows(&mut c.conn))
                    .expect("reading done_jobs")
            }
        }
    };
}

use crate::handlers;

#[cfg(feature = "sqlite")]
sync_backend!(Sqlite, Server::Sqlite, diesel::SqliteConnection);
#[cfg(feature = "postgres")]
sync_backend!(Postgres, Server::Postgres, diesel::PgConnection);
#[cfg(feature = "mysql")]
sync_backend!(Mysql, Server::Mysql, diesel::MysqlConnection);
#[cfg(feature = "async-sqlite")]
async_backend!(
    AsyncSqlite,
    Server::Sqlite,
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
);
#[cfg(feature = "async-postgres")]
async_backend!(
    AsyncPostgres,
    Server::Postgres,
    diesel_async::AsyncPgConnection
);
#[cfg(feature = "async-mysql")]
async_backend!(
    AsyncMysql,
    Server::Mysql,
    diesel_async::AsyncMysqlConnection
);
