//! The handlers under test: each written once for sync connections and once as an `async fn`,
//! both generic over the connection and sharing one job name, which both give explicitly (two
//! handlers sharing a default name would be two jobs refusing to run).

use diesel::prelude::*;
use idempotent_jobs::{Job, JobKey, idempotent_job};
use serde::{Deserialize, Serialize};

use crate::harness::Server;

diesel::table! {
    charges (id) {
        id -> Integer,
        order_id -> Text,
        amount -> BigInt,
        charge_ref -> Text,
    }
}

diesel::table! {
    test_outbox (id) {
        id -> Integer,
        topic -> Text,
        payload -> Text,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TestError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    #[error("the card was declined")]
    Declined,
    #[error("the payment service failed: {0}")]
    Service(String),
}

/// What the charge handler does after writing its effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Succeed,
    Fail,
    Panic,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub charge_ref: String,
    pub amount: i64,
}

/// The job the plain-API calls share with `charge`.
pub static CHARGE: Job = Job::new("charge", "charge:<order_id>");

/// `charge`'s key, built as the attribute builds it.
pub fn charge_key(order_id: &str) -> JobKey {
    JobKey::builder()
        .text("charge:")
        .value(order_id)
        .build()
        .expect("one value")
}

/// A reference no two runs share, so a test can tell which run produced a stored result.
pub fn fresh_charge_ref() -> String {
    crate::harness::unique_name("ch")
}

/// `CREATE TABLE` for the tests' own tables.
pub fn test_tables(server: Server) -> [String; 2] {
    let id = match server {
        Server::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
        Server::Postgres => "SERIAL PRIMARY KEY",
        Server::Mysql => "INTEGER PRIMARY KEY AUTO_INCREMENT",
    };
    [
        format!(
            "CREATE TABLE charges (id {id}, order_id TEXT NOT NULL, amount BIGINT NOT NULL, charge_ref TEXT NOT NULL)"
        ),
        format!("CREATE TABLE test_outbox (id {id}, topic TEXT NOT NULL, payload TEXT NOT NULL)"),
    ]
}

/// The tests' data access, with the same DSL for sync (`[]`) and async (`[.await]`) connections.
macro_rules! test_queries {
    (insert_charge, $conn:expr, $order_id:expr, $amount:expr, $charge_ref:expr, [$($aw:tt)*]) => {
        diesel::insert_into(charges::table)
            .values((
                charges::order_id.eq($order_id),
                charges::amount.eq($amount),
                charges::charge_ref.eq($charge_ref),
            ))
            .execute($conn)$($aw)*
            .map(drop)
    };
    (insert_message, $conn:expr, $topic:expr, $payload:expr, [$($aw:tt)*]) => {
        diesel::insert_into(test_outbox::table)
            .values((test_outbox::topic.eq($topic), test_outbox::payload.eq($payload)))
            .execute($conn)$($aw)*
            .map(drop)
    };
    (count_charges, $conn:expr, $order_id:expr, [$($aw:tt)*]) => {
        charges::table
            .filter(charges::order_id.eq($order_id))
            .count()
            .get_result::<i64>($conn)$($aw)*
    };
    (count_topic, $conn:expr, $topic:expr, [$($aw:tt)*]) => {
        test_outbox::table
            .filter(test_outbox::topic.eq($topic))
            .count()
            .get_result::<i64>($conn)$($aw)*
    };
    (count_messages, $conn:expr, [$($aw:tt)*]) => {
        test_outbox::table.count().get_result::<i64>($conn)$($aw)*
    };
    (count_done, $conn:expr, [$($aw:tt)*]) => {
        idempotent_jobs::schema::done_jobs::table.count().get_result::<i64>($conn)$($aw)*
    };
    (outbox_rows, $conn:expr, [$($aw:tt)*]) => {{
        use idempotent_jobs::schema::outbox::dsl as o;
        o::outbox
            .order(o::id)
            .select((o::message_id, o::job_key))
            .load::<(String, Option<String>)>($conn)$($aw)*
    }};
    (done_rows, $conn:expr, [$($aw:tt)*]) => {{
        use idempotent_jobs::schema::done_jobs::dsl as dj;
        dj::done_jobs
            .select((dj::job_key, dj::job_name, dj::result))
            .order(dj::job_key)
            .load::<(String, String, Option<String>)>($conn)$($aw)*
    }};
}

/// The tests' tables through a sync connection.
pub trait TestConn: idempotent_jobs::JobStore + Send {
    fn insert_charge(&mut self, order_id: &str, amount: i64, charge_ref: &str) -> QueryResult<()>;
    fn insert_message(&mut self, topic: &str, payload: &str) -> QueryResult<()>;
    fn count_charges(&mut self, order_id: &str) -> QueryResult<i64>;
    fn count_messages(&mut self) -> QueryResult<i64>;
    fn count_done(&mut self) -> QueryResult<i64>;
    /// `(job_key, job_name, result)` of every done job, by key.
    fn done_rows(&mut self) -> QueryResult<Vec<(String, String, Option<String>)>>;
    /// `(message_id, job_key)` of every outbox message, in order.
    fn outbox_rows(&mut self) -> QueryResult<Vec<(String, Option<String>)>>;
    fn count_topic(&mut self, topic: &str) -> QueryResult<i64>;
    fn execute_sql(&mut self, sql: &str) -> QueryResult<()>;
}

macro_rules! impl_test_conn {
    ($conn:ty) => {
        impl TestConn for $conn {
            fn insert_charge(
                &mut self,
                order_id: &str,
                amount: i64,
                charge_ref: &str,
            ) -> QueryResult<()> {
                test_queries!(insert_charge, self, order_id, amount, charge_ref, [])
            }

            fn insert_message(&mut self, topic: &str, payload: &str) -> QueryResult<()> {
                test_queries!(insert_message, self, topic, payload, [])
            }

            fn count_charges(&mut self, order_id: &str) -> QueryResult<i64> {
                test_queries!(count_charges, self, order_id, [])
            }

            fn count_messages(&mut self) -> QueryResult<i64> {
                test_queries!(count_messages, self, [])
            }

            fn count_done(&mut self) -> QueryResult<i64> {
                test_queries!(count_done, self, [])
            }

            fn done_rows(&mut self) -> QueryResult<Vec<(String, String, Option<String>)>> {
                test_queries!(done_rows, self, [])
            }

            fn outbox_rows(&mut self) -> QueryResult<Vec<(String, Option<String>)>> {
                test_queries!(outbox_rows, self, [])
            }

            fn count_topic(&mut self, topic: &str) -> QueryResult<i64> {
                test_queries!(count_topic, self, topic, [])
            }

            fn execute_sql(&mut self, sql: &str) -> QueryResult<()> {
                diesel::connection::SimpleConnection::batch_execute(self, sql)
            }
        }
    };
}

#[cfg(feature = "sqlite")]
impl_test_conn!(diesel::SqliteConnection);
#[cfg(feature = "postgres")]
impl_test_conn!(diesel::PgConnection);
#[cfg(feature = "mysql")]
impl_test_conn!(diesel::MysqlConnection);

/// Charges an order once: a charge row and an outbox message, then succeeds, fails or panics.
#[idempotent_job(key = "charge:<order_id>", name = "charge")]
pub fn charge<C: TestConn>(
    conn: &mut C,
    order_id: &str,
    amount: i64,
    mode: Mode,
) -> Result<Receipt, TestError> {
    charge_body(conn, order_id, amount, mode)
}

/// What `charge` does, without the attribute: for the plain-function-API tests.
pub fn charge_body<C: TestConn>(
    conn: &mut C,
    order_id: &str,
    amount: i64,
    mode: Mode,
) -> Result<Receipt, TestError> {
    let charge_ref = fresh_charge_ref();
    conn.insert_charge(order_id, amount, &charge_ref)?;
    conn.insert_message("charge-succeeded", order_id)?;
    match mode {
        Mode::Succeed => Ok(Receipt { charge_ref, amount }),
        Mode::Fail => Err(TestError::Declined),
        Mode::Panic => panic!("the card service exploded mid-job"),
    }
}

/// A different job whose key space overlaps `charge`'s (a bug the runtime must refuse to hide).
#[idempotent_job(key = "charge:<order_id>", name = "refund")]
pub fn refund<C: TestConn>(conn: &mut C, order_id: &str) -> Result<(), TestError> {
    conn.insert_message("refund", order_id)?;
    Ok(())
}

/// Two placeholders separated by `:`, for the key-escaping checks.
#[idempotent_job(key = "pair:<left>:<right>", name = "pair")]
pub fn pair<C: TestConn>(conn: &mut C, left: &str, right: &str) -> Result<(), TestError> {
    conn.insert_message("pair", &format!("{left:?} {right:?}"))?;
    Ok(())
}

/// Same name and key as `charge`, but a result type the stored JSON does not decode into.
#[idempotent_job(key = "charge:<order_id>", name = "charge")]
pub fn charge_v2<C: TestConn>(conn: &mut C, order_id: &str) -> Result<Vec<u32>, TestError> {
    conn.insert_message("charge-v2", order_id)?;
    Ok(vec![1, 2, 3])
}

/// A charge whose amount and currency must match when its key comes back.
#[idempotent_job(
    key = "checked:<order_id>",
    fingerprint(amount, currency),
    name = "charge_checked"
)]
pub fn charge_checked<C: TestConn>(
    conn: &mut C,
    order_id: &str,
    amount: i64,
    currency: &str,
) -> Result<Receipt, TestError> {
    charge_body(conn, order_id, amount, Mode::Succeed).map(|receipt| Receipt {
        charge_ref: format!("{}-{currency}", receipt.charge_ref),
        ..receipt
    })
}

/// A reminder that may be sent again a second after the last one.
#[idempotent_job(key = "remind:<user_id>", keep = "1s", name = "remind")]
pub fn remind<C: TestConn>(conn: &mut C, user_id: i64) -> Result<(), TestError> {
    conn.insert_message("reminder", &user_id.to_string())?;
    Ok(())
}

/// A job whose key carries personal data.
#[idempotent_job(key = "greet:<email>", redact_key, name = "greet")]
pub fn greet<C: TestConn>(conn: &mut C, email: &str) -> Result<(), TestError> {
    conn.insert_message("greeting", "hello")?;
    let _ = email;
    Ok(())
}

/// A job keyed by whatever a caller sends: NUL bytes, separators, SQL, megabytes.
#[idempotent_job(key = "hostile:<value>", name = "hostile")]
pub fn hostile<C: TestConn>(conn: &mut C, value: &str) -> Result<usize, TestError> {
    conn.insert_message("hostile", &value.len().to_string())?;
    Ok(value.len())
}

/// A result whose `Serialize` panics: the panic comes after the body, while the runtime stores
/// the result.
#[derive(Debug, serde::Deserialize)]
pub struct ExplodesWhenStored;

impl Serialize for ExplodesWhenStored {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("the result's Serialize exploded")
    }
}

/// A result that stores fine and whose `Deserialize` panics: the panic comes during a replay.
#[derive(Debug, Serialize)]
pub struct ExplodesWhenReplayed(pub u32);

impl<'de> Deserialize<'de> for ExplodesWhenReplayed {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = u32::deserialize(deserializer)?;
        if REPLAYS_EXPLODE.with(std::cell::Cell::get) {
            panic!("the stored result's Deserialize exploded");
        }
        Ok(Self(value))
    }
}

thread_local! {
    /// Whether [`ExplodesWhenReplayed`] panics when decoded on this thread: not during the first
    /// run's round-trip check, only in the replay (per thread, as tests run in parallel).
    pub static REPLAYS_EXPLODE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[idempotent_job(key = "explode-store:<id>", name = "explode_on_store")]
pub fn explode_on_store<C: TestConn>(
    conn: &mut C,
    id: &str,
) -> Result<ExplodesWhenStored, TestError> {
    conn.insert_message("explode-on-store", id)?;
    Ok(ExplodesWhenStored)
}

#[idempotent_job(key = "explode-replay:<id>", name = "explode_on_replay")]
pub fn explode_on_replay<C: TestConn>(
    conn: &mut C,
    id: &str,
) -> Result<ExplodesWhenReplayed, TestError> {
    conn.insert_message("explode-on-replay", id)?;
    Ok(ExplodesWhenReplayed(7))
}

/// A job whose key holds for a second after its commit; its body tells the test (signal `id`)
/// that it holds the claim, then works for `hold_ms`.
#[idempotent_job(key = "held:<id>", keep = "1s", name = "held_job")]
pub fn held_job<C: TestConn>(conn: &mut C, id: &str, hold_ms: u64) -> Result<(), TestError> {
    conn.insert_message("held", id)?;
    crate::signals::notify(id);
    std::thread::sleep(std::time::Duration::from_millis(hold_ms));
    crate::signals::notify(&crate::signals::body_done(id));
    Ok(())
}

/// A job whose key holds for an hour after its commit.
#[idempotent_job(key = "hourly:<id>", keep = "1h", name = "hourly")]
pub fn hourly<C: TestConn>(conn: &mut C, id: &str) -> Result<(), TestError> {
    conn.insert_message("hourly", id)?;
    Ok(())
}

/// A body that runs DDL between two writes, which MySQL commits implicitly.
#[idempotent_job(key = "ddl:<id>", name = "ddl_in_body")]
pub fn ddl_in_body<C: TestConn>(conn: &mut C, id: &str, fail: bool) -> Result<(), TestError> {
    conn.insert_message("before-ddl", id)?;
    conn.execute_sql("CREATE TABLE IF NOT EXISTS ddl_probe (id INTEGER)")?;
    conn.insert_message("after-ddl", id)?;
    if fail {
        Err(TestError::Declined)
    } else {
        Ok(())
    }
}

/// A body whose transaction the server rolls back under it (a `ROLLBACK` stands in for a caught
/// deadlock, or a Galera brute-force abort): with `hand_over`, it then lets the test run the same key
/// to completion elsewhere before it returns `Ok`.
#[idempotent_job(key = "rolled:<id>", name = "rolled_back_in_body")]
pub fn rolled_back_in_body<C: TestConn>(
    conn: &mut C,
    id: &str,
    hand_over: bool,
) -> Result<(), TestError> {
    conn.insert_message("rolled", id)?;
    if hand_over {
        conn.execute_sql("ROLLBACK")?;
        crate::signals::meet(id);
        crate::signals::meet(id);
    }
    Ok(())
}

/// Runs the statements of `statements` (separated by `;;`) in its body between two effects,
/// catching each one's failure and going on, as bodies that "try and ignore" do; then returns a
/// stored result, or fails when `fail`. The statement `EXIT` ends the process there (a worker that
/// dies). Whatever the statements do to the job's transaction, what the call reports must be what
/// the database holds.
#[idempotent_job(key = "in-body:<id>", name = "statements_in_body")]
pub fn statements_in_body<C: TestConn>(
    conn: &mut C,
    id: &str,
    statements: &str,
    fail: bool,
) -> Result<Receipt, TestError> {
    run_statements(conn, id, statements, fail)?;
    Ok(Receipt {
        charge_ref: format!("in-body-{id}"),
        amount: 1,
    })
}

/// The body of [`statements_in_body`] and [`statements_in_unit_body`].
fn run_statements<C: TestConn>(
    conn: &mut C,
    id: &str,
    statements: &str,
    fail: bool,
) -> Result<(), TestError> {
    conn.insert_message(&format!("before:{id}"), id)?;
    let mut wrote_after = false;
    for statement in statements.split(";;").filter(|s| !s.is_empty()) {
        match statement {
            "EXIT" => std::process::exit(3),
            AFTER => {
                conn.insert_message(&format!("after:{id}"), id)?;
                wrote_after = true;
            }
            _ => {
                let _caught = conn.execute_sql(statement);
            }
        }
    }
    if !wrote_after {
        conn.insert_message(&format!("after:{id}"), id)?;
    }
    if fail {
        // Returns at a failed statement, as a body that `?`s one does.
        conn.execute_sql(A_FAILING_STATEMENT)?;
        return Err(TestError::Declined);
    }
    Ok(())
}

/// In the statements of [`statements_in_body`], where the body writes its `after:` row (else it
/// writes it after the last statement): between a statement that ends the job's transaction and
/// one that begins another, it runs outside any.
pub const AFTER: &str = "AFTER";

/// The statement a failing [`statements_in_body`] returns at: it fails on every database, and
/// takes nothing with it but (on PostgreSQL) the transaction it runs in.
pub const A_FAILING_STATEMENT: &str = "SELECT * FROM no_such_table";

/// [`statements_in_body`] as a job that returns `()`: its claim is its whole record (no result is
/// stored after the body, so no later statement of the runtime finds the claim gone).
#[idempotent_job(key = "in-unit-body:<id>", name = "statements_in_unit_body")]
pub fn statements_in_unit_body<C: TestConn>(
    conn: &mut C,
    id: &str,
    statements: &str,
    fail: bool,
) -> Result<(), TestError> {
    run_statements(conn, id, statements, fail)
}

/// A job returning `()` whose body writes its effect, then runs `statements` and carries on
/// whatever they answer ("try it, ignore the failure").
#[idempotent_job(key = "careless:<id>", name = "careless_unit")]
pub fn careless_unit<C: TestConn>(
    conn: &mut C,
    id: &str,
    statements: &str,
) -> Result<(), TestError> {
    careless_body(conn, id, statements)
}

/// What the careless jobs run.
fn careless_body<C: TestConn>(conn: &mut C, id: &str, statements: &str) -> Result<(), TestError> {
    conn.insert_message("careless", id)?;
    for statement in statements.split(";;").filter(|s| !s.is_empty()) {
        let _caught = conn.execute_sql(statement);
    }
    Ok(())
}

/// [`careless_unit`] as a job that stores a result after its body.
#[idempotent_job(key = "careless-value:<id>", name = "careless_value")]
pub fn careless_value<C: TestConn>(
    conn: &mut C,
    id: &str,
    statements: &str,
) -> Result<u32, TestError> {
    careless_body(conn, id, statements).map(|()| 7)
}

/// A job whose result is `bytes` long.
#[idempotent_job(key = "big:<id>", name = "big_result")]
pub fn big_result<C: TestConn>(conn: &mut C, id: &str, bytes: usize) -> Result<String, TestError> {
    conn.insert_message("big", id)?;
    Ok("x".repeat(bytes))
}

/// Write skew: reads the other side's rows, meets the other side's body, then writes its own.
#[idempotent_job(key = "skew:<barrier>:<side>", name = "write_skew")]
pub fn write_skew<C: TestConn>(
    conn: &mut C,
    barrier: &str,
    side: &str,
    other: &str,
) -> Result<(), TestError> {
    // Both read, then both write, then both commit: the conflict surfaces at the second COMMIT
    // (a unit result stores nothing, so COMMIT is the next statement).
    conn.count_topic(other)?;
    crate::signals::meet(barrier);
    conn.insert_message(side, barrier)?;
    crate::signals::meet(barrier);
    Ok(())
}

/// Not idempotent: it writes an audit row outside the job's claim, so a rerun writes it again.
pub fn sloppy_audit_then_charge<C: TestConn>(
    conn: &mut C,
    order_id: &str,
) -> Result<Receipt, TestError> {
    conn.insert_message("audit", order_id)?;
    charge(conn, order_id, 4200, Mode::Succeed)
}

/// Not idempotent: writes an audit row on a connection of its own, opened at `url`, before its
/// work on `conn`. A replay skips the body, so only a first delivery that failed before its
/// commit, then its redelivery, write that row twice.
#[idempotent_job(
    key = "audited-elsewhere:<order_id>",
    name = "charge_audited_elsewhere"
)]
pub fn charge_audited_elsewhere<C: TestConn>(
    conn: &mut C,
    url: &str,
    order_id: &str,
) -> Result<Receipt, TestError> {
    let mut side = C::establish(url).map_err(|e| TestError::Service(e.to_string()))?;
    side.insert_message("audit", order_id)?;
    charge_body(conn, order_id, 4200, Mode::Succeed)
}

#[cfg(feature = "async")]
pub use asynchronous::*;

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use diesel_async::RunQueryDsl;
    use idempotent_jobs::AsyncJobStore;

    /// The tests' tables through an async connection.
    pub trait AsyncTestConn: AsyncJobStore + Send {
        fn insert_charge(
            &mut self,
            order_id: &str,
            amount: i64,
            charge_ref: &str,
        ) -> impl Future<Output = QueryResult<()>> + Send;
        fn insert_message(
            &mut self,
            topic: &str,
            payload: &str,
        ) -> impl Future<Output = QueryResult<()>> + Send;
        fn count_charges(
            &mut self,
            order_id: &str,
        ) -> impl Future<Output = QueryResult<i64>> + Send;
        fn count_messages(&mut self) -> impl Future<Output = QueryResult<i64>> + Send;
        fn count_done(&mut self) -> impl Future<Output = QueryResult<i64>> + Send;
        fn done_rows(
            &mut self,
        ) -> impl Future<Output = QueryResult<Vec<(String, String, Option<String>)>>> + Send;
        fn outbox_rows(
            &mut self,
        ) -> impl Future<Output = QueryResult<Vec<(String, Option<String>)>>> + Send;
        fn count_topic(&mut self, topic: &str) -> impl Future<Output = QueryResult<i64>> + Send;
        fn execute_sql(&mut self, sql: &str) -> impl Future<Output = QueryResult<()>> + Send;
    }

    macro_rules! impl_async_test_conn {
        ($conn:ty) => {
            impl AsyncTestConn for $conn {
                async fn insert_charge(&mut self, order_id: &str, amount: i64, charge_ref: &str) -> QueryResult<()> {
                    test_queries!(insert_charge, self, order_id, amount, charge_ref, [.await])
                }

                async fn insert_message(&mut self, topic: &str, payload: &str) -> QueryResult<()> {
                    test_queries!(insert_message, self, topic, payload, [.await])
                }

                async fn count_charges(&mut self, order_id: &str) -> QueryResult<i64> {
                    test_queries!(count_charges, self, order_id, [.await])
                }

                async fn count_messages(&mut self) -> QueryResult<i64> {
                    test_queries!(count_messages, self, [.await])
                }

                async fn count_done(&mut self) -> QueryResult<i64> {
                    test_queries!(count_done, self, [.await])
                }

                async fn done_rows(&mut self) -> QueryResult<Vec<(String, String, Option<String>)>> {
                    test_queries!(done_rows, self, [.await])
                }

                async fn outbox_rows(&mut self) -> QueryResult<Vec<(String, Option<String>)>> {
                    test_queries!(outbox_rows, self, [.await])
                }

                async fn count_topic(&mut self, topic: &str) -> QueryResult<i64> {
                    test_queries!(count_topic, self, topic, [.await])
                }

                async fn execute_sql(&mut self, sql: &str) -> QueryResult<()> {
                    diesel_async::SimpleAsyncConnection::batch_execute(self, sql).await
                }
            }
        };
    }

    #[cfg(feature = "async-postgres")]
    impl_async_test_conn!(diesel_async::AsyncPgConnection);
    #[cfg(feature = "async-mysql")]
    impl_async_test_conn!(diesel_async::AsyncMysqlConnection);
    #[cfg(feature = "async-sqlite")]
    impl_async_test_conn!(
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
    );

    /// `charge`, as an async handler.
    #[idempotent_job(key = "charge:<order_id>", name = "charge")]
    pub async fn charge_async<C: AsyncTestConn>(
        conn: &mut C,
        order_id: &str,
        amount: i64,
        mode: Mode,
    ) -> Result<Receipt, TestError> {
        charge_body_async(conn, order_id, amount, mode).await
    }

    /// What `charge_async` does, without the attribute.
    pub async fn charge_body_async<C: AsyncTestConn>(
        conn: &mut C,
        order_id: &str,
        amount: i64,
        mode: Mode,
    ) -> Result<Receipt, TestError> {
        let charge_ref = fresh_charge_ref();
        conn.insert_charge(order_id, amount, &charge_ref).await?;
        conn.insert_message("charge-succeeded", order_id).await?;
        match mode {
            Mode::Succeed => Ok(Receipt { charge_ref, amount }),
            Mode::Fail => Err(TestError::Declined),
            Mode::Panic => panic!("the card service exploded mid-job"),
        }
    }

    #[idempotent_job(key = "charge:<order_id>", name = "refund")]
    pub async fn refund_async<C: AsyncTestConn>(
        conn: &mut C,
        order_id: &str,
    ) -> Result<(), TestError> {
        conn.insert_message("refund", order_id).await?;
        Ok(())
    }

    #[idempotent_job(key = "pair:<left>:<right>", name = "pair")]
    pub async fn pair_async<C: AsyncTestConn>(
        conn: &mut C,
        left: &str,
        right: &str,
    ) -> Result<(), TestError> {
        conn.insert_message("pair", &format!("{left:?} {right:?}"))
            .await?;
        Ok(())
    }

    #[idempotent_job(key = "charge:<order_id>", name = "charge")]
    pub async fn charge_v2_async<C: AsyncTestConn>(
        conn: &mut C,
        order_id: &str,
    ) -> Result<Vec<u32>, TestError> {
        conn.insert_message("charge-v2", order_id).await?;
        Ok(vec![1, 2, 3])
    }

    #[idempotent_job(
        key = "checked:<order_id>",
        fingerprint(amount, currency),
        name = "charge_checked"
    )]
    pub async fn charge_checked_async<C: AsyncTestConn>(
        conn: &mut C,
        order_id: &str,
        amount: i64,
        currency: &str,
    ) -> Result<Receipt, TestError> {
        charge_body_async(conn, order_id, amount, Mode::Succeed)
            .await
            .map(|receipt| Receipt {
                charge_ref: format!("{}-{currency}", receipt.charge_ref),
                ..receipt
            })
    }

    #[idempotent_job(key = "remind:<user_id>", keep = "1s", name = "remind")]
    pub async fn remind_async<C: AsyncTestConn>(
        conn: &mut C,
        user_id: i64,
    ) -> Result<(), TestError> {
        conn.insert_message("reminder", &user_id.to_string())
            .await?;
        Ok(())
    }

    #[idempotent_job(key = "greet:<email>", redact_key, name = "greet")]
    pub async fn greet_async<C: AsyncTestConn>(conn: &mut C, email: &str) -> Result<(), TestError> {
        conn.insert_message("greeting", "hello").await?;
        let _ = email;
        Ok(())
    }

    #[idempotent_job(key = "hostile:<value>", name = "hostile")]
    pub async fn hostile_async<C: AsyncTestConn>(
        conn: &mut C,
        value: &str,
    ) -> Result<usize, TestError> {
        conn.insert_message("hostile", &value.len().to_string())
            .await?;
        Ok(value.len())
    }

    #[idempotent_job(key = "explode-store:<id>", name = "explode_on_store")]
    pub async fn explode_on_store_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
    ) -> Result<ExplodesWhenStored, TestError> {
        conn.insert_message("explode-on-store", id).await?;
        Ok(ExplodesWhenStored)
    }

    #[idempotent_job(key = "explode-replay:<id>", name = "explode_on_replay")]
    pub async fn explode_on_replay_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
    ) -> Result<ExplodesWhenReplayed, TestError> {
        conn.insert_message("explode-on-replay", id).await?;
        Ok(ExplodesWhenReplayed(7))
    }

    #[idempotent_job(key = "held:<id>", keep = "1s", name = "held_job")]
    pub async fn held_job_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        hold_ms: u64,
    ) -> Result<(), TestError> {
        conn.insert_message("held", id).await?;
        crate::signals::notify(id);
        std::thread::sleep(std::time::Duration::from_millis(hold_ms));
        crate::signals::notify(&crate::signals::body_done(id));
        Ok(())
    }

    #[idempotent_job(key = "hourly:<id>", keep = "1h", name = "hourly")]
    pub async fn hourly_async<C: AsyncTestConn>(conn: &mut C, id: &str) -> Result<(), TestError> {
        conn.insert_message("hourly", id).await?;
        Ok(())
    }

    #[idempotent_job(key = "rolled:<id>", name = "rolled_back_in_body")]
    pub async fn rolled_back_in_body_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        hand_over: bool,
    ) -> Result<(), TestError> {
        conn.insert_message("rolled", id).await?;
        if hand_over {
            conn.execute_sql("ROLLBACK").await?;
            crate::signals::meet(id);
            crate::signals::meet(id);
        }
        Ok(())
    }

    #[idempotent_job(key = "ddl:<id>", name = "ddl_in_body")]
    pub async fn ddl_in_body_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        fail: bool,
    ) -> Result<(), TestError> {
        conn.insert_message("before-ddl", id).await?;
        conn.execute_sql("CREATE TABLE IF NOT EXISTS ddl_probe (id INTEGER)")
            .await?;
        conn.insert_message("after-ddl", id).await?;
        if fail {
            Err(TestError::Declined)
        } else {
            Ok(())
        }
    }

    #[idempotent_job(key = "in-body:<id>", name = "statements_in_body")]
    pub async fn statements_in_body_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        statements: &str,
        fail: bool,
    ) -> Result<Receipt, TestError> {
        run_statements_async(conn, id, statements, fail).await?;
        Ok(Receipt {
            charge_ref: format!("in-body-{id}"),
            amount: 1,
        })
    }

    /// The body of [`statements_in_body_async`] and [`statements_in_unit_body_async`].
    async fn run_statements_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        statements: &str,
        fail: bool,
    ) -> Result<(), TestError> {
        conn.insert_message(&format!("before:{id}"), id).await?;
        let mut wrote_after = false;
        for statement in statements.split(";;").filter(|s| !s.is_empty()) {
            match statement {
                "EXIT" => std::process::exit(3),
                super::AFTER => {
                    conn.insert_message(&format!("after:{id}"), id).await?;
                    wrote_after = true;
                }
                _ => {
                    let _caught = conn.execute_sql(statement).await;
                }
            }
        }
        if !wrote_after {
            conn.insert_message(&format!("after:{id}"), id).await?;
        }
        if fail {
            conn.execute_sql(super::A_FAILING_STATEMENT).await?;
            return Err(TestError::Declined);
        }
        Ok(())
    }

    #[idempotent_job(key = "careless:<id>", name = "careless_unit")]
    pub async fn careless_unit_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        statements: &str,
    ) -> Result<(), TestError> {
        careless_body_async(conn, id, statements).await
    }

    async fn careless_body_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        statements: &str,
    ) -> Result<(), TestError> {
        conn.insert_message("careless", id).await?;
        for statement in statements.split(";;").filter(|s| !s.is_empty()) {
            let _caught = conn.execute_sql(statement).await;
        }
        Ok(())
    }

    #[idempotent_job(key = "careless-value:<id>", name = "careless_value")]
    pub async fn careless_value_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        statements: &str,
    ) -> Result<u32, TestError> {
        careless_body_async(conn, id, statements).await.map(|()| 7)
    }

    #[idempotent_job(key = "in-unit-body:<id>", name = "statements_in_unit_body")]
    pub async fn statements_in_unit_body_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        statements: &str,
        fail: bool,
    ) -> Result<(), TestError> {
        run_statements_async(conn, id, statements, fail).await
    }

    #[idempotent_job(key = "big:<id>", name = "big_result")]
    pub async fn big_result_async<C: AsyncTestConn>(
        conn: &mut C,
        id: &str,
        bytes: usize,
    ) -> Result<String, TestError> {
        conn.insert_message("big", id).await?;
        Ok("x".repeat(bytes))
    }

    #[idempotent_job(key = "skew:<barrier>:<side>", name = "write_skew")]
    pub async fn write_skew_async<C: AsyncTestConn>(
        conn: &mut C,
        barrier: &str,
        side: &str,
        other: &str,
    ) -> Result<(), TestError> {
        conn.count_topic(other).await?;
        crate::signals::meet(barrier);
        conn.insert_message(side, barrier).await?;
        crate::signals::meet(barrier);
        Ok(())
    }

    pub async fn sloppy_audit_then_charge_async<C: AsyncTestConn>(
        conn: &mut C,
        order_id: &str,
    ) -> Result<Receipt, TestError> {
        conn.insert_message("audit", order_id).await?;
        charge_async(conn, order_id, 4200, Mode::Succeed).await
    }

    /// `charge_audited_elsewhere`, as an async handler.
    #[idempotent_job(
        key = "audited-elsewhere:<order_id>",
        name = "charge_audited_elsewhere"
    )]
    pub async fn charge_audited_elsewhere_async<C: AsyncTestConn>(
        conn: &mut C,
        url: &str,
        order_id: &str,
    ) -> Result<Receipt, TestError> {
        let mut side = C::establish(url)
            .await
            .map_err(|e| TestError::Service(e.to_string()))?;
        side.insert_message("audit", order_id).await?;
        charge_body_async(conn, order_id, 4200, Mode::Succeed).await
    }

    /// Charges, tells the test it is inside its transaction, then never finishes: the test drops
    /// it there, as a timeout or a shut-down would.
    #[idempotent_job(key = "charge:<order_id>", name = "charge")]
    pub async fn charge_and_hang<C: AsyncTestConn>(
        conn: &mut C,
        order_id: &str,
        inside: tokio::sync::oneshot::Sender<()>,
    ) -> Result<Receipt, TestError> {
        conn.insert_charge(order_id, 4200, "hung").await?;
        let _ = inside.send(());
        std::future::pending::<()>().await;
        unreachable!("the test drops this job while it waits")
    }
}
