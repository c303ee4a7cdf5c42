//! An [apalis](https://docs.rs/apalis) worker on Redis whose Diesel handler is safe to run twice.
//!
//! apalis delivers a task at least once: apalis-redis moves a fetched task into the worker's
//! in-flight set, and only the worker's acknowledgement (the handler's result, written back after
//! the handler returned) takes it out. A worker that dies in between, after its transaction
//! committed, leaves the task in flight; once the worker has missed its heartbeats, another worker
//! re-enqueues it and runs it again. The producer may also push the same job twice. Here the
//! handler's work is an `#[idempotent_job]` on diesel-async: the key is claimed in the same
//! transaction as the work, so a second delivery of a job that committed replays instead of
//! running, whichever worker gets it.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example apalis_worker --features async-postgres
//! ```
//!
//! Environment: `DATABASE_URL` (required, `postgres://...`), `REDIS_URL` (default
//! `redis://127.0.0.1:6379`), `QUEUE` (the apalis-redis namespace, default `payments`), and the
//! liveness settings `HEARTBEAT_SECS` (default 1) and `MISSED_HEARTBEATS` (default 3): a worker
//! silent for `HEARTBEAT_SECS × MISSED_HEARTBEATS` seconds is taken for dead, and another worker
//! re-enqueues the tasks it held at its next heartbeat. These defaults make a dead worker's task
//! come back within seconds; apalis-redis's own are 30 s × 10. A worker that is only slow, taken
//! for dead, does the jobs no harm (its task's second run replays), but apalis ends that worker
//! with an error at its next heartbeat: keep the product well above any pause of the process.
//! Tasks are JSON, `{"job_id": "invoice-42", "amount": 1200}`, pushed with apalis-redis's
//! `RedisStorage::<Payment>` on the same queue (see `tests/apalis.rs`). A task that does not
//! decode as a `Payment` ends the worker with an error too (apalis 1.0 treats it as a backend
//! error), and the task stays in that worker's in-flight set, to be re-enqueued like any other.
//!
//! Errors: a job that can succeed later (`Error::is_retryable()`: a lost connection, a deadlock,
//! a key still in progress) returns a plain error: apalis-redis marks the task `Failed` and
//! schedules it again, `attempt` seconds later, for up to 25 attempts. One that cannot (the same
//! job id pushed with another amount, which `fingerprint(amount)` refuses) returns apalis's
//! `AbortError`: the task is marked `Killed` and goes to the dead set, not run again.
//!
//! It prints `STARTING` once it handles signals, `READY` once the worker is registered with
//! Redis, one line per task, `OUTCOME <job_id> <ran|replayed> task=<task id> attempt=<n>`,
//! `RETRYING <job_id> ...` or `ABORTED <job_id> ...` for errors (and `RECONNECTING` when the
//! database connection was lost), and `STOPPED` at the end. On SIGTERM or SIGINT it stops
//! fetching, lets the tasks in hand finish, writes their acknowledgements, puts back what it
//! fetched and had not started, and exits 0. Test hook, off unless set:
//! `IDEMPOTENT_PAUSE_BEFORE_ACK` lists job ids (comma separated) at which the handler, after the
//! job committed and before it returns, prints `PAUSE-BEFORE-ACK <job_id>` and waits for a line on
//! its stdin (the test SIGKILLs it meanwhile).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use apalis::prelude::{
    AbortError, Attempt, BoxDynError, Data, Event, EventListenerExt as _, TaskId, WorkerBuilder,
};
use apalis_redis::{Config, RedisStorage};
use diesel::ExpressionMethods as _;
use diesel_async::{AsyncConnection as _, AsyncPgConnection, RunQueryDsl as _};
use idempotent_jobs::idempotent_job;
use serde::{Deserialize, Serialize};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::Mutex;

diesel::table! {
    effects (id) {
        id -> BigInt,
        job_id -> Text,
        amount -> BigInt,
    }
}

/// A task as pushed to the queue (JSON, apalis-redis's codec).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    job_id: String,
    amount: i64,
}

#[derive(Debug, thiserror::Error)]
enum WorkerError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

impl WorkerError {
    /// Whether the job can succeed later: the runtime says so for its own errors; a database error
    /// of the body's own statements is taken as passing (a lost connection, a deadlock).
    fn is_retryable(&self) -> bool {
        match self {
            WorkerError::Idempotent(error) => error.is_retryable(),
            WorkerError::Database(_) => true,
        }
    }
}

/// The job: apply a payment once. The same job id with another amount is not a redelivery but a
/// mistake, which the fingerprint refuses (`Error::FingerprintMismatch`, not retryable).
#[idempotent_job(key = "payment:<job_id>", fingerprint(amount))]
async fn apply_payment(
    conn: &mut AsyncPgConnection,
    job_id: &str,
    amount: i64,
) -> Result<(), WorkerError> {
    diesel::insert_into(effects::table)
        .values((effects::job_id.eq(job_id), effects::amount.eq(amount)))
        .execute(conn)
        .await?;
    Ok(())
}

/// What every task gets through apalis's `Data`: one connection, taken in turn. (With the
/// `deadpool` or `bb8` feature, a pool of them does the same, and the handler takes
/// `&mut deadpool::Object<AsyncPgConnection>` instead.)
#[derive(Clone)]
struct Db {
    conn: Arc<Mutex<AsyncPgConnection>>,
    url: Arc<str>,
}

/// The apalis task handler: the task, then what apalis injects (`Data`, the task's id, its
/// attempt). Its `Result` is the acknowledgement: `Ok` marks the task done, an error is retried,
/// an `AbortError` is not.
async fn handle_payment(
    payment: Payment,
    db: Data<Db>,
    task_id: TaskId,
    attempt: Attempt,
) -> Result<(), BoxDynError> {
    let result = {
        let mut conn = db.conn.lock().await;
        // The companion's `outcome` runs the handler and says whether it ran or replayed.
        let result = apply_payment::outcome(&mut conn, &payment.job_id, payment.amount).await;
        if result.is_err() && ping(&mut conn).await.is_err() {
            // The connection is gone (a restart, a terminated backend): the next task gets a new
            // one. This task rolled back whole and is retried.
            println!("RECONNECTING");
            *conn = connect(&db.url).await;
        }
        result
    };
    let attempt = attempt.current();
    match result {
        Ok(done) => {
            let outcome = if done.is_ran() { "ran" } else { "replayed" };
            println!(
                "OUTCOME {} {outcome} task={task_id} attempt={attempt}",
                payment.job_id
            );
            pause_if_chosen(&payment.job_id).await;
            Ok(())
        }
        Err(error) if error.is_retryable() => {
            // apalis-redis marks the task `Failed` and schedules it again (`attempt` s later).
            println!(
                "RETRYING {} task={task_id} attempt={attempt}: {error}",
                payment.job_id
            );
            Err(error.into())
        }
        Err(error) => {
            // It would fail the same way every time: `Killed`, to the dead set, not run again.
            println!(
                "ABORTED {} task={task_id} attempt={attempt}: {error}",
                payment.job_id
            );
            Err(AbortError::new(error).into())
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxDynError> {
    let database_url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL to a postgres:// URL (PostgreSQL through diesel-async)")?;
    let redis_url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "payments".to_owned());
    let heartbeat: u64 = env_number("HEARTBEAT_SECS", 1)?;
    let missed: usize = env_number("MISSED_HEARTBEATS", 3)?;
    if heartbeat == 0 || missed == 0 {
        return Err("HEARTBEAT_SECS and MISSED_HEARTBEATS must be at least 1".into());
    }

    // Signals first: a worker told to stop while it is still starting exits cleanly too.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    println!("STARTING");
    let started = tokio::select! {
        biased;
        () = stop_requested(&mut terminate, &mut interrupt) => None,
        started = start(&database_url, &redis_url) => Some(started?),
    };
    let Some((conn, redis)) = started else {
        println!("STOPPED before taking any work");
        return Ok(());
    };

    let config = Config::default()
        .queue(&queue)
        .heartbeat_interval(Duration::from_secs(heartbeat))
        .missed_heartbeats(missed);
    let storage = RedisStorage::<Payment>::new(redis).with_config(config);
    let db = Db {
        conn: Arc::new(Mutex::new(conn)),
        url: database_url.into(),
    };
    // Names must be unique among live workers: apalis-redis refuses to register a name that has
    // sent a heartbeat within the orphan timeout.
    let name = format!("{queue}-worker-{}", std::process::id());
    let registered = AtomicBool::new(false);
    let worker = WorkerBuilder::new(name)
        .backend(storage)
        .data(db)
        .on_event(move |_, event| {
            // The first heartbeat follows the worker's registration with Redis.
            if matches!(event, Event::HeartBeat) && !registered.swap(true, Ordering::SeqCst) {
                println!("READY");
            }
        })
        .build(handle_payment);

    // On a signal, apalis stops fetching, waits for the tasks in hand, flushes their
    // acknowledgements and re-enqueues the fetched tasks it had not started.
    worker
        .run_until(async move {
            stop_requested(&mut terminate, &mut interrupt).await;
            Ok::<(), std::io::Error>(())
        })
        .await?;
    println!("STOPPED");
    Ok(())
}

/// Connects to the database (creating the tables) and to Redis.
async fn start(
    database_url: &str,
    redis_url: &str,
) -> Result<(AsyncPgConnection, apalis_redis::ConnectionManager), BoxDynError> {
    let mut conn = connect(database_url).await;
    // Every worker may migrate at start: the migration takes a lock, so one does the work.
    idempotent_jobs::migrate_async(&mut conn).await?;
    diesel::sql_query(
        "CREATE TABLE IF NOT EXISTS effects \
         (id BIGSERIAL PRIMARY KEY, job_id TEXT NOT NULL, amount BIGINT NOT NULL)",
    )
    .execute(&mut conn)
    .await?;
    let redis = apalis_redis::connect(redis_url)
        .await
        .map_err(|error| format!("Redis at {redis_url}: {error}"))?;
    Ok((conn, redis))
}

/// Connects, retrying for as long as the database is down (a restart, say).
async fn connect(url: &str) -> AsyncPgConnection {
    let mut delay = Duration::from_millis(100);
    loop {
        match AsyncPgConnection::establish(url).await {
            Ok(conn) => return conn,
            Err(error) => {
                eprintln!("database unreachable ({error}); retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn ping(conn: &mut AsyncPgConnection) -> diesel::QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn).await.map(drop)
}

async fn stop_requested(terminate: &mut Signal, interrupt: &mut Signal) {
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map_err(|_| format!("{name}={value:?} is not a number")),
        Err(_) => Ok(default),
    }
}

/// The test hook: if `job_id` is listed in `IDEMPOTENT_PAUSE_BEFORE_ACK`, say so and wait for a
/// line on stdin, with the job committed and its acknowledgement not yet written. The test decides
/// the fault and acts while the task is held at a known point, so nothing depends on timing.
async fn pause_if_chosen(job_id: &str) {
    let Ok(chosen) = std::env::var("IDEMPOTENT_PAUSE_BEFORE_ACK") else {
        return;
    };
    if !chosen.split(',').any(|chosen| chosen.trim() == job_id) {
        return;
    }
    println!("PAUSE-BEFORE-ACK {job_id}");
    // Any line, or the end of stdin, lets the task go on. Read on a blocking thread so that the
    // worker keeps polling Redis (its heartbeats) while the task is held.
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new())).await;
}
