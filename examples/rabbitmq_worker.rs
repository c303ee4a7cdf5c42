//! A RabbitMQ worker whose handler is safe to run twice.
//!
//! It consumes with manual acknowledgement and a prefetch window, runs an `#[idempotent_job]` async
//! handler on diesel-async (PostgreSQL or MySQL/MariaDB, by the URL), and acknowledges only after
//! the job's transaction committed. A redelivery of a job that already committed (the worker died
//! before its ack, or the producer published twice) replays instead of running again.
//!
//! On SIGTERM or SIGINT it stops taking work, finishes the job in hand, closes its channel (the
//! broker requeues whatever was prefetched and not acknowledged) and exits 0. A database that goes
//! away (a restart, a killed connection) fails the job in hand, which is returned to the queue
//! (`nack` with requeue), and the worker reconnects instead of dying. A job that can never succeed
//! (`Error::is_retryable()` is false: here, the same job id sent again with another amount, which
//! the handler's fingerprint refuses) goes to the dead-letter queue `<QUEUE>.dead-letter` with its
//! error in the `x-error` header, and is acknowledged: a poison message does not loop.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run --example rabbitmq_worker --features async-postgres,async-mysql
//! ```
//!
//! Environment: `DATABASE_URL` (required), `AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`),
//! `QUEUE` (default `idempotent-jobs`), `PREFETCH` (default 8). Messages are JSON:
//! `{"job_id": "invoice-42", "amount": 1200}`.
//!
//! It prints `STARTING` once it handles signals (a SIGTERM from then on, even before it is ready,
//! exits 0) and `READY` once it consumes. Each handled delivery prints one line, `OUTCOME <job_id> <copy> <ran|replayed> redelivered=<bool>`,
//! then `ACKED <copy>` once acknowledged, or `DEAD-LETTERED <job_id> <copy>: <error>`; the chaos tests
//! read them. Test hooks, off unless set:
//! `IDEMPOTENT_CHAOS_PAUSE_MID_JOB` and `IDEMPOTENT_CHAOS_PAUSE_BEFORE_ACK` list job ids (comma
//! separated) that pause inside the transaction, or between the commit and the ack: the worker
//! prints `PAUSE-MID-JOB <job_id>` or `PAUSE-BEFORE-ACK <job_id>` and waits for a line on its stdin
//! (the test acts on it meanwhile: a SIGKILL, a terminated connection, a restart). Each listed job
//! pauses once across all workers, not again when redelivered: the pauses are recorded as files in
//! `IDEMPOTENT_CHAOS_PAUSED_DIR`, which the lists need. With the lists set, `ACKED` also means the
//! broker has processed the ack, so a SIGKILL at a later pause cannot lose it.

use std::time::Duration;

use diesel::{ExpressionMethods as _, QueryResult};
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection};
use futures_util::StreamExt as _;
use idempotent_jobs::{AsyncJobStore, idempotent_job};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde::Deserialize;
use tokio::signal::unix::{SignalKind, signal};

diesel::table! {
    effects (id) {
        id -> BigInt,
        job_id -> Text,
        amount -> BigInt,
    }
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

/// A job as published to the queue.
#[derive(Debug, Deserialize)]
struct JobMessage {
    job_id: String,
    amount: i64,
    /// Which published copy this is, when a producer published the job more than once.
    #[serde(default)]
    copy: Option<String>,
}

/// What the worker needs from its database, per backend.
trait WorkerDb: AsyncJobStore + Sized + 'static {
    async fn create_tables(&mut self) -> QueryResult<()>;
    async fn insert_effect(&mut self, job_id: &str, amount: i64) -> QueryResult<()>;
    async fn ping(&mut self) -> QueryResult<()>;
}

macro_rules! impl_worker_db {
    ($conn:ty, $id:literal) => {
        impl WorkerDb for $conn {
            async fn create_tables(&mut self) -> QueryResult<()> {
                use diesel_async::RunQueryDsl;
                diesel::sql_query(concat!(
                    "CREATE TABLE IF NOT EXISTS effects (id ",
                    $id,
                    ", job_id VARCHAR(200) NOT NULL, amount BIGINT NOT NULL)"
                ))
                .execute(self)
                .await
                .map(drop)
            }

            async fn insert_effect(&mut self, job_id: &str, amount: i64) -> QueryResult<()> {
                use diesel_async::RunQueryDsl;
                diesel::insert_into(effects::table)
                    .values((effects::job_id.eq(job_id), effects::amount.eq(amount)))
                    .execute(self)
                    .await
                    .map(drop)
            }

            async fn ping(&mut self) -> QueryResult<()> {
                use diesel_async::RunQueryDsl;
                diesel::sql_query("SELECT 1").execute(self).await.map(drop)
            }
        }
    };
}

impl_worker_db!(AsyncPgConnection, "BIGSERIAL PRIMARY KEY");
impl_worker_db!(AsyncMysqlConnection, "BIGINT AUTO_INCREMENT PRIMARY KEY");

/// The job: apply a payment once. The same job id with another amount is not a redelivery but a
/// mistake, which the fingerprint refuses (`Error::FingerprintMismatch`, not retryable).
#[idempotent_job(key = "job:<job_id>", fingerprint(amount))]
async fn apply_payment<C: WorkerDb>(
    conn: &mut C,
    job_id: &str,
    amount: i64,
) -> Result<(), WorkerError> {
    conn.insert_effect(job_id, amount).await?;
    pause_if_chosen("IDEMPOTENT_CHAOS_PAUSE_MID_JOB", "PAUSE-MID-JOB", job_id).await;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL to a postgres:// or mysql:// URL")?;
    if database_url.starts_with("mysql") {
        run::<AsyncMysqlConnection>(&database_url).await
    } else {
        run::<AsyncPgConnection>(&database_url).await
    }
}

async fn run<C: WorkerDb>(database_url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let amqp_url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "idempotent-jobs".to_owned());
    let prefetch: u16 = std::env::var("PREFETCH")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8);

    // Signals first: a worker told to stop while it is still starting exits cleanly too.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    println!("STARTING");
    let started = tokio::select! {
        biased;
        _ = terminate.recv() => None,
        _ = interrupt.recv() => None,
        started = start::<C>(database_url, &amqp_url, &queue, prefetch) => Some(started?),
    };
    let Some(Started {
        mut conn,
        amqp,
        channel,
        mut consumer,
        tag,
    }) = started
    else {
        println!("STOPPED before taking any work");
        return Ok(());
    };
    println!("READY");

    loop {
        // Signals are looked at between jobs: the job in hand always finishes first.
        let delivery = tokio::select! {
            biased;
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            next = consumer.next() => match next {
                Some(Ok(delivery)) => delivery,
                Some(Err(error)) => return Err(error.into()),
                None => break,
            },
        };
        let message: JobMessage = match serde_json::from_slice(&delivery.data) {
            Ok(message) => message,
            Err(error) => {
                eprintln!("dropping a message that is not a job ({error})");
                delivery
                    .nack(BasicNackOptions {
                        requeue: false,
                        ..Default::default()
                    })
                    .await?;
                continue;
            }
        };
        let copy = message
            .copy
            .clone()
            .unwrap_or_else(|| message.job_id.clone());
        // The companion's `outcome` runs the handler and says whether it ran or replayed. A
        // message the broker redelivers has likely been done: its key is read first, and a
        // committed result replays from that one read, with no transaction.
        let handled = idempotent_jobs::redelivered_async(
            delivery.redelivered,
            apply_payment::outcome(&mut conn, &message.job_id, message.amount),
        );
        match handled.await {
            Ok(done) => {
                let outcome = if done.is_ran() { "ran" } else { "replayed" };
                println!(
                    "OUTCOME {} {copy} {outcome} redelivered={}",
                    message.job_id, delivery.redelivered
                );
                pause_if_chosen(
                    "IDEMPOTENT_CHAOS_PAUSE_BEFORE_ACK",
                    "PAUSE-BEFORE-ACK",
                    &message.job_id,
                )
                .await;
                delivery.ack(BasicAckOptions::default()).await?;
                settle_if_pausing(&channel, &queue).await?;
                println!("ACKED {copy}");
            }
            Err(error) if !error.is_retryable() => {
                // It would fail the same way every time: park it where people look, with why.
                let error = with_causes(&error);
                println!("DEAD-LETTERED {} {copy}: {error}", message.job_id);
                dead_letter(&channel, &queue, &delivery.data, &error).await?;
                delivery.ack(BasicAckOptions::default()).await?;
            }
            Err(error) => {
                // Rolled back whole: give the job back to the queue and make sure the database is
                // reachable before taking the next one.
                println!("FAILED {} {copy}: {}", message.job_id, with_causes(&error));
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await?;
                if conn.ping().await.is_err() {
                    println!("RECONNECTING");
                    conn = connect::<C>(database_url).await;
                    println!("RECONNECTED");
                }
            }
        }
    }

    // Stop: no more deliveries; closing the channel hands unacknowledged prefetched messages back.
    channel
        .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
        .await?;
    channel.close(200, "worker stopping".into()).await?;
    amqp.close(200, "worker stopping".into()).await?;
    println!("STOPPED");
    Ok(())
}

/// A worker ready to consume.
struct Started<C> {
    conn: C,
    amqp: Connection,
    channel: lapin::Channel,
    consumer: lapin::Consumer,
    tag: String,
}

/// Connects to the database (migrating it) and to the broker, and starts consuming.
async fn start<C: WorkerDb>(
    database_url: &str,
    amqp_url: &str,
    queue: &str,
    prefetch: u16,
) -> Result<Started<C>, Box<dyn std::error::Error>> {
    let mut conn = connect::<C>(database_url).await;
    idempotent_jobs::migrate_async(&mut conn).await?;
    conn.create_tables().await?;

    let amqp = Connection::connect(amqp_url, ConnectionProperties::default()).await?;
    let channel = amqp.create_channel().await?;
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    // Publisher confirms, for the dead-letter queue: a poison message is acknowledged only once the
    // broker has its dead letter.
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let tag = format!("worker-{}", std::process::id());
    let consumer = channel
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok(Started {
        conn,
        amqp,
        channel,
        consumer,
        tag,
    })
}

/// An error and its causes: the runtime's message says what happened to the job, and the
/// database's own error is its source.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(source) = cause {
        text.push_str(": ");
        text.push_str(&source.to_string());
        cause = source.source();
    }
    text
}

/// Connects, retrying for as long as the database is down (a restart, say).
async fn connect<C: WorkerDb>(url: &str) -> C {
    let mut delay = Duration::from_millis(100);
    loop {
        match C::establish(url).await {
            Ok(conn) => return conn,
            Err(error) => {
                eprintln!("database unreachable ({error}); retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// The chaos tests' hook: if the test chose `job_id` for this point and it has not paused here
/// before (in any worker), say so and wait for the test's go-ahead on stdin. The test decides the
/// faults and acts while the job is held at a known point, so nothing depends on timing.
async fn pause_if_chosen(variable: &str, line: &str, job_id: &str) {
    let Ok(chosen) = std::env::var(variable) else {
        return;
    };
    if !chosen.split(',').any(|chosen| chosen.trim() == job_id) {
        return;
    }
    let record = std::env::var_os("IDEMPOTENT_CHAOS_PAUSED_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("{variable} needs IDEMPOTENT_CHAOS_PAUSED_DIR"))
        .join(format!("{line}-{job_id}"));
    // Created once: a redelivery of a job that paused here (this worker or a killed one) goes on.
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&record)
    {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => return,
        Err(error) => panic!("recording the pause at {}: {error}", record.display()),
    }
    println!("{line} {job_id}");
    // Any line, or the end of stdin (the test is gone), lets the job go on. Read on a blocking
    // thread so that the broker connection keeps being served while the job is held.
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new())).await;
}

/// Publishes `body` to the dead-letter queue `<queue>.dead-letter` with the error in its `x-error`
/// header, and waits for the broker's confirm: only then is the original acknowledged.
async fn dead_letter(
    channel: &lapin::Channel,
    queue: &str,
    body: &[u8],
    error: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let dead = format!("{queue}.dead-letter");
    channel
        .queue_declare(
            dead.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    let mut headers = FieldTable::default();
    headers.insert("x-error".into(), AMQPValue::LongString(error.into()));
    let confirmation = channel
        .basic_publish(
            "".into(),
            dead.as_str().into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default()
                .with_headers(headers)
                .with_delivery_mode(2),
        )
        .await?
        .await?;
    if confirmation.is_nack() {
        return Err(format!("the broker refused the dead letter on {dead}").into());
    }
    Ok(())
}

/// The chaos tests' hook after an ack, when they pause workers: a round trip on the channel (a
/// passive declare of the queue), answered only once the broker has handled the frames sent
/// before it, the ack included. Without it, a SIGKILL at the next pause can take an ack the
/// broker has not handled yet with it, and the job is redelivered although it was acked: a
/// replay the test did not arrange.
async fn settle_if_pausing(channel: &lapin::Channel, queue: &str) -> lapin::Result<()> {
    if std::env::var_os("IDEMPOTENT_CHAOS_PAUSE_MID_JOB").is_none()
        && std::env::var_os("IDEMPOTENT_CHAOS_PAUSE_BEFORE_ACK").is_none()
    {
        return Ok(());
    }
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map(drop)
}
