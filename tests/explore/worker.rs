//! Worker mode: this test binary again, run by the controller with `IDEMPOTENT_EXPLORE_WORKER` set.
//! It reads commands (JSON lines) on stdin and reports events as lines starting with `@@ ` on
//! stdout; everything else it prints (libtest's chatter) is ignored.

use std::cell::Cell;
use std::io::{BufRead as _, Write as _};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use idempotent_jobs::fingerprint::Fingerprint;
use idempotent_jobs::outbox::{self, OutboxMessage, Relay};
use idempotent_jobs::{Job, JobCall, JobKey, Outcome, WhileInProgress};
use serde::{Deserialize, Serialize};

use super::model::{Db, Fail, HoldPoint, JobSpec, MAX_ATTEMPTS, Mode, Res};

/// The environment variable that turns the test binary into a worker; its value is a [`Config`].
pub const WORKER_ENV: &str = "IDEMPOTENT_EXPLORE_WORKER";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub db: Db,
    pub mode: Mode,
    pub url: String,
    /// A broken worker, to prove the checker catches one: its sync deliveries that neither fail
    /// nor hold do their work without the library (no claim, no transaction) and report `Ran`.
    #[serde(default)]
    pub sabotage: bool,
    /// Session settings of the user's own, sent on each new connection ([`Db::session_settings`]).
    #[serde(default)]
    pub session: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Command {
    Job(JobSpec),
    Relay {
        hold_at: Option<u32>,
        cancel_ms: Option<u64>,
    },
    Go,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Event {
    Ready,
    Hold {
        id: String,
        backend_pid: Option<i64>,
    },
    Outcome {
        id: String,
        res: Res,
    },
    Received {
        msg: String,
    },
    RelayDone {
        leased: u64,
        delivered: u64,
        failed: u64,
        parked: u64,
        lease_lost: u64,
        error: Option<String>,
    },
    /// The worker's stdout closed (it exited or was killed).
    Exited,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Payload {
    pub key: String,
    pub run: String,
    pub poison: u32,
}

static JOBS: [Job; 4] = [
    Job::new("explore_forever", "explore:0:<n>").fingerprint_inputs(&["n"]),
    Job::new("explore_keep1", "explore:1:<n>")
        .keep_for(Duration::from_secs(1))
        .fingerprint_inputs(&["n"]),
    Job::new("explore_keep2", "explore:2:<n>")
        .keep_for(Duration::from_secs(2))
        .fingerprint_inputs(&["n"]),
    Job::new("explore_keep3", "explore:3:<n>")
        .keep_for(Duration::from_secs(3))
        .fingerprint_inputs(&["n"]),
];

#[derive(Debug, thiserror::Error)]
enum WorkerError {
    #[error(transparent)]
    Lib(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    #[error("the body failed on purpose after its work")]
    Body,
    /// The job ran inside the caller's transaction, whose own end then failed: what the job
    /// committed with it is unknown.
    #[error("the caller's transaction failed at its end after the job returned: {0}")]
    CallerEnded(String),
}

/// `job` inside a transaction of the caller's (Diesel's `transaction` on a sync connection): it
/// commits when the job completed, and rolls back on anything else (an error, a panic, which is
/// caught inside it and returned after the rollback). The job's own result is kept: where the
/// caller's `ROLLBACK` fails, Diesel returns that error instead of the closure's.
fn in_callers_transaction<C, T>(
    c: &mut C,
    job: impl FnOnce(&mut C) -> std::thread::Result<Result<T, WorkerError>>,
) -> std::thread::Result<Result<T, WorkerError>>
where
    C: diesel::Connection,
{
    let mut kept = None;
    let ended = c.transaction::<(), diesel::result::Error, _>(|c| {
        let ran = job(c);
        let completed = matches!(ran, Ok(Ok(_)));
        kept = Some(ran);
        match completed {
            true => Ok(()),
            false => Err(diesel::result::Error::RollbackTransaction),
        }
    });
    match (kept, ended) {
        (None, Err(error)) => Ok(Err(WorkerError::Db(error))),
        (None, Ok(())) => unreachable!("the caller's transaction ran its closure"),
        (Some(Ok(Ok(_))), Err(error)) => Ok(Err(WorkerError::CallerEnded(error.to_string()))),
        (Some(ran), _) => ran,
    }
}

#[derive(QueryableByName)]
struct Number {
    #[diesel(sql_type = BigInt)]
    v: i64,
}

pub fn emit(event: &Event) {
    let line = serde_json::to_string(event).expect("an event serializes");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "@@ {line}");
    let _ = out.flush();
}

fn read_command() -> Option<Command> {
    loop {
        let mut line = String::new();
        if std::io::stdin().lock().read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Ok(command) = serde_json::from_str(line.trim()) {
            return Some(command);
        }
    }
}

/// Waits for the controller's `Go`; exits when the controller is gone.
fn wait_go() {
    match read_command() {
        Some(Command::Go) => {}
        Some(other) => panic!("expected Go while held, got {other:?}"),
        None => std::process::exit(0),
    }
}

pub fn effect_sql(db: Db) -> &'static str {
    match db {
        Db::Postgres => {
            "INSERT INTO effects (job_key, run_id, result, at_us, msg_id) VALUES ($1, $2, $3, CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT), $4)"
        }
        Db::Mariadb => {
            "INSERT INTO effects (job_key, run_id, result, at_us, msg_id) VALUES (?, ?, ?, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED), ?)"
        }
        Db::Sqlite => {
            "INSERT INTO effects (job_key, run_id, result, at_us, msg_id) VALUES (?, ?, ?, CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER), ?)"
        }
    }
}

fn pid_sql(db: Db) -> &'static str {
    match db {
        Db::Postgres => "SELECT CAST(pg_backend_pid() AS BIGINT) AS v",
        Db::Mariadb => "SELECT CAST(CONNECTION_ID() AS SIGNED) AS v",
        Db::Sqlite => "SELECT 0 AS v",
    }
}

fn fingerprint(n: u64) -> Fingerprint {
    Fingerprint::builder()
        .input("n", &n)
        .finish()
        .expect("a number serializes")
}

fn value(spec: &JobSpec) -> Option<String> {
    (!spec.null_result).then(|| format!("res:{}", spec.id))
}

fn payload(spec: &JobSpec, poison: u32) -> Payload {
    Payload {
        key: spec.key.clone(),
        run: spec.id.clone(),
        poison,
    }
}

fn error_res(error: WorkerError) -> Res {
    match error {
        WorkerError::Body => Res::BodyErr,
        WorkerError::CallerEnded(e) => Res::Unknown(e),
        WorkerError::Db(e) => Res::BodyDbErr(e.to_string()),
        WorkerError::Lib(e) => {
            let debug = format!("{e:?}");
            let variant = debug
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or("?")
                .to_owned();
            let nothing_committed = !matches!(
                e,
                idempotent_jobs::Error::CommitOutcomeUnknown { .. }
                    | idempotent_jobs::Error::TransactionEndedInBody { .. }
                    | idempotent_jobs::Error::ClaimNotTakenBack { .. }
                    | idempotent_jobs::Error::CannotRollBack { .. }
                    // What the body ran after its transaction ended may be committed.
                    | idempotent_jobs::Error::TransactionRolledBackInBody { outside: true, .. }
                    | idempotent_jobs::Error::CallersTransactionRolledBack { outside: true, .. }
            );
            Res::Error {
                variant,
                text: with_causes(&e),
                retryable: e.is_retryable(),
                nothing_committed,
            }
        }
    }
}

use super::names::with_causes;

fn outcome_res(outcome: Outcome<Option<String>>) -> Res {
    match outcome {
        Outcome::Ran(v) => Res::Ran(v),
        Outcome::Replayed(v) => Res::Replayed(v),
    }
}

fn deliver_message(
    message: &OutboxMessage,
    count: &Cell<u32>,
    hold_at: Option<u32>,
) -> Result<(), String> {
    count.set(count.get() + 1);
    let poison = message.payload::<Payload>().map_or(0, |p| p.poison);
    if message.attempts() <= poison {
        return Err(format!(
            "poisoned: attempt {} of the first {poison} fails",
            message.attempts()
        ));
    }
    emit(&Event::Received {
        msg: message.message_id().to_owned(),
    });
    if hold_at == Some(count.get()) {
        emit(&Event::Hold {
            id: "relay".into(),
            backend_pid: None,
        });
        wait_go();
    }
    Ok(())
}

fn relay() -> Relay {
    Relay::new()
        .lease(Duration::from_millis(1500))
        .max_attempts(MAX_ATTEMPTS)
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
        .batch_size(8)
}

/// Connects, retrying for a while (the proxy may be stalled, the server busy).
fn connect_retrying<T>(
    what: &str,
    mut connect: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match connect() {
            Ok(conn) => return Ok(conn),
            Err(e) if Instant::now() > deadline => return Err(format!("{what}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

// ---- sync ------------------------------------------------------------------------------------------

enum SyncConn {
    Sqlite(SqliteConnection),
    Pg(PgConnection),
    My(MysqlConnection),
}

macro_rules! on_sync {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn {
            SyncConn::Sqlite($c) => $body,
            SyncConn::Pg($c) => $body,
            SyncConn::My($c) => $body,
        }
    };
}

fn connect_sync(config: &Config) -> Result<SyncConn, String> {
    connect_retrying("connecting", || {
        Ok(match config.db {
            Db::Sqlite => {
                let mut c = SqliteConnection::establish(&config.url).map_err(|e| e.to_string())?;
                diesel::connection::SimpleConnection::batch_execute(
                    &mut c,
                    "PRAGMA busy_timeout = 5000",
                )
                .map_err(|e| e.to_string())?;
                SyncConn::Sqlite(c)
            }
            Db::Postgres => {
                SyncConn::Pg(PgConnection::establish(&config.url).map_err(|e| e.to_string())?)
            }
            Db::Mariadb => {
                SyncConn::My(MysqlConnection::establish(&config.url).map_err(|e| e.to_string())?)
            }
        })
        .and_then(|mut conn| {
            if !config.session.is_empty() {
                on_sync!(&mut conn, |c| {
                    diesel::connection::SimpleConnection::batch_execute(c, &config.session)
                })
                .map_err(|e| format!("the session's settings: {e}"))?;
            }
            Ok(conn)
        })
    })
}

fn run_sync_job(conn: &mut SyncConn, spec: &JobSpec, db: Db) -> Res {
    let key = JobKey::new(spec.key.clone());
    let job: &'static Job = &JOBS[spec.job as usize];
    let mut call = JobCall::new(job, &key).redelivered(spec.redelivered);
    if let Some(ms) = spec.in_progress_ms {
        call = call.while_in_progress(if ms == 0 {
            WhileInProgress::Fail
        } else {
            WhileInProgress::WaitAtMost(Duration::from_millis(ms))
        });
    }
    if let Some(fp) = spec.fp {
        call = call.fingerprint(fingerprint(fp));
    }
    let sql = effect_sql(db);
    let result = on_sync!(conn, |c| {
        let job = |c: &mut _| {
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                call.run(c, |c| -> Result<Option<String>, WorkerError> {
                    let msg = match spec.outbox {
                        Some(poison) => Some(outbox::push(c, "explore", &payload(spec, poison))?),
                        None => None,
                    };
                    diesel::sql_query(sql)
                        .bind::<Text, _>(&spec.key)
                        .bind::<Text, _>(&spec.id)
                        .bind::<Nullable<Text>, _>(value(spec))
                        .bind::<Nullable<Text>, _>(msg)
                        .execute(c)?;
                    if spec.hold.is_some_and(|h| h.at == HoldPoint::Body) {
                        let backend_pid = if db.is_server() {
                            diesel::sql_query(pid_sql(db))
                                .get_result::<Number>(c)
                                .ok()
                                .map(|n| n.v)
                        } else {
                            None
                        };
                        emit(&Event::Hold {
                            id: spec.id.clone(),
                            backend_pid,
                        });
                        wait_go();
                    }
                    if spec.slow_ms > 0 {
                        std::thread::sleep(Duration::from_millis(spec.slow_ms));
                    }
                    match spec.fail {
                        Fail::Err => Err(WorkerError::Body),
                        Fail::Panic => panic!("explore: the body panics after its work"),
                        Fail::No => Ok(value(spec)),
                    }
                })
            }))
        };
        match spec.nested {
            true => in_callers_transaction(c, job),
            false => job(c),
        }
    });
    match result {
        Ok(Ok(outcome)) => outcome_res(outcome),
        Ok(Err(error)) => error_res(error),
        Err(_) => Res::Panicked,
    }
}

fn sync_relay(conn: &mut SyncConn, hold_at: Option<u32>) -> Event {
    let relay = relay();
    let count = Cell::new(0);
    let mut total = (0, 0, 0, 0, 0);
    let mut error = None;
    for _ in 0..4 {
        let round = on_sync!(&mut *conn, |c| relay
            .run_once(c, |m| deliver_message(m, &count, hold_at)));
        match round {
            Ok(r) => {
                total.0 += r.leased;
                total.1 += r.delivered;
                total.2 += r.failed;
                total.3 += r.parked;
                total.4 += r.lease_lost;
                if r.leased == 0 {
                    break;
                }
            }
            Err(e) => {
                error = Some(with_causes(&e));
                break;
            }
        }
    }
    Event::RelayDone {
        leased: total.0,
        delivered: total.1,
        failed: total.2,
        parked: total.3,
        lease_lost: total.4,
        error,
    }
}

fn sync_worker(config: &Config) {
    let mut conn = None;
    emit(&Event::Ready);
    while let Some(command) = read_command() {
        if conn.is_none() {
            match connect_sync(config) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    match command {
                        Command::Job(spec) => emit(&Event::Outcome {
                            id: spec.id,
                            res: Res::NoConnection(e),
                        }),
                        Command::Relay { .. } => emit(&Event::RelayDone {
                            leased: 0,
                            delivered: 0,
                            failed: 0,
                            parked: 0,
                            lease_lost: 0,
                            error: Some(e),
                        }),
                        Command::Go => {}
                    }
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected");
        match command {
            Command::Job(spec)
                if config.sabotage && spec.fail == Fail::No && spec.hold.is_none() =>
            {
                let sql = effect_sql(config.db);
                let done = on_sync!(c, |c| diesel::sql_query(sql)
                    .bind::<Text, _>(&spec.key)
                    .bind::<Text, _>(&spec.id)
                    .bind::<Nullable<Text>, _>(value(&spec))
                    .bind::<Nullable<Text>, _>(None::<String>)
                    .execute(c));
                let res = match done {
                    Ok(_) => Res::Ran(value(&spec)),
                    Err(e) => Res::BodyDbErr(e.to_string()),
                };
                emit(&Event::Outcome { id: spec.id, res });
            }
            Command::Job(spec) => {
                let res = run_sync_job(c, &spec, config.db);
                if !res.completed() {
                    conn = None;
                }
                after_commit(&spec, &res);
                emit(&Event::Outcome { id: spec.id, res });
            }
            Command::Relay { hold_at, .. } => {
                let event = sync_relay(c, hold_at);
                if matches!(event, Event::RelayDone { error: Some(_), .. }) {
                    conn = None;
                }
                emit(&event);
            }
            Command::Go => {}
        }
    }
}

fn after_commit(spec: &JobSpec, res: &Res) {
    if res.completed() && spec.hold.is_some_and(|h| h.at == HoldPoint::AfterCommit) {
        emit(&Event::Hold {
            id: spec.id.clone(),
            backend_pid: None,
        });
        wait_go();
    }
}

// ---- async -------------------------------------------------------------------------------------------

mod asynchronous {
    use super::*;
    use diesel_async::pg::AsyncPgConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};

    #[allow(clippy::large_enum_variant)] // one per worker process
    pub enum AsyncConn {
        Sqlite(SyncConnectionWrapper<SqliteConnection>),
        Pg(AsyncPgConnection),
        My(AsyncMysqlConnection),
    }

    macro_rules! on_async {
        ($conn:expr, |$c:ident| $body:expr) => {
            match $conn {
                AsyncConn::Sqlite($c) => $body,
                AsyncConn::Pg($c) => $body,
                AsyncConn::My($c) => $body,
            }
        };
    }

    fn no_socket(url: &str) -> String {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}prefer_socket=false")
    }

    async fn connect(config: &Config) -> Result<AsyncConn, String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let attempt: Result<AsyncConn, String> = match config.db {
                Db::Sqlite => {
                    match SyncConnectionWrapper::<SqliteConnection>::establish(&config.url).await {
                        Ok(mut c) => c
                            .batch_execute("PRAGMA busy_timeout = 5000")
                            .await
                            .map(|()| AsyncConn::Sqlite(c))
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                }
                Db::Postgres => AsyncPgConnection::establish(&config.url)
                    .await
                    .map(AsyncConn::Pg)
                    .map_err(|e| e.to_string()),
                // mysql_async moves a loopback connection to the server's Unix socket unless told
                // not to, which would take it past the proxy (and its cuts and stalls).
                Db::Mariadb => AsyncMysqlConnection::establish(&no_socket(&config.url))
                    .await
                    .map(AsyncConn::My)
                    .map_err(|e| e.to_string()),
            };
            let attempt = match attempt {
                Ok(mut c) if !config.session.is_empty() => {
                    let set = match &mut c {
                        AsyncConn::Sqlite(c) => c.batch_execute(&config.session).await,
                        AsyncConn::Pg(c) => c.batch_execute(&config.session).await,
                        AsyncConn::My(c) => c.batch_execute(&config.session).await,
                    };
                    set.map(|()| c)
                        .map_err(|e| format!("the session's settings: {e}"))
                }
                other => other,
            };
            match attempt {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() > deadline => return Err(format!("connecting: {e}")),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn run_job(
        conn: &mut AsyncConn,
        spec: &JobSpec,
        db: Db,
    ) -> Result<Outcome<Option<String>>, WorkerError> {
        let key = JobKey::new(spec.key.clone());
        let job: &'static Job = &JOBS[spec.job as usize];
        let mut call = JobCall::new(job, &key).redelivered(spec.redelivered);
        if let Some(ms) = spec.in_progress_ms {
            call = call.while_in_progress(if ms == 0 {
                WhileInProgress::Fail
            } else {
                WhileInProgress::WaitAtMost(Duration::from_millis(ms))
            });
        }
        if let Some(fp) = spec.fp {
            call = call.fingerprint(fingerprint(fp));
        }
        let sql = effect_sql(db);
        on_async!(conn, |c| {
            let job = async |c: &mut _| {
                call.run_async(c, async |c| -> Result<Option<String>, WorkerError> {
                    let msg = match spec.outbox {
                        Some(poison) => {
                            Some(outbox::push_async(c, "explore", &payload(spec, poison)).await?)
                        }
                        None => None,
                    };
                    diesel::sql_query(sql)
                        .bind::<Text, _>(&spec.key)
                        .bind::<Text, _>(&spec.id)
                        .bind::<Nullable<Text>, _>(value(spec))
                        .bind::<Nullable<Text>, _>(msg)
                        .execute(c)
                        .await?;
                    if spec.hold.is_some_and(|h| h.at == HoldPoint::Body) {
                        let backend_pid = if db.is_server() {
                            diesel::sql_query(pid_sql(db))
                                .get_result::<Number>(c)
                                .await
                                .ok()
                                .map(|n| n.v)
                        } else {
                            None
                        };
                        emit(&Event::Hold {
                            id: spec.id.clone(),
                            backend_pid,
                        });
                        wait_go();
                    }
                    if spec.slow_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(spec.slow_ms)).await;
                    }
                    match spec.fail {
                        Fail::Err => Err(WorkerError::Body),
                        Fail::Panic => panic!("explore: the body panics after its work"),
                        Fail::No => Ok(value(spec)),
                    }
                })
                .await
            };
            match spec.nested {
                false => job(c).await,
                // Inside a transaction of the caller's (diesel-async's `transaction`), which
                // commits when the job completed and rolls back on anything else. The job's own
                // result is kept: a failed `ROLLBACK` would replace it. A panic unwinds through
                // it (the task reports `Panicked`), and the connection is dropped after it.
                true => {
                    let mut kept = None;
                    let ended = c
                        .transaction::<(), WorkerError, _>(async |c| {
                            let ran = job(c).await;
                            let completed = ran.is_ok();
                            kept = Some(ran);
                            match completed {
                                true => Ok(()),
                                false => Err(WorkerError::Body),
                            }
                        })
                        .await;
                    match (kept, ended) {
                        (None, Err(error)) => Err(error),
                        (None, Ok(())) => unreachable!("the caller's transaction ran its closure"),
                        (Some(Ok(_)), Err(error)) => {
                            Err(WorkerError::CallerEnded(error.to_string()))
                        }
                        (Some(ran), _) => ran,
                    }
                }
            }
        })
    }

    async fn relay_rounds(conn: &mut AsyncConn, hold_at: Option<u32>) -> Event {
        let relay = relay();
        let count = Cell::new(0);
        let mut total = (0, 0, 0, 0, 0);
        let mut error = None;
        for _ in 0..4 {
            let round = on_async!(&mut *conn, |c| {
                relay
                    .run_once_async(c, async |m: &OutboxMessage| {
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        deliver_message(m, &count, hold_at)
                    })
                    .await
            });
            match round {
                Ok(r) => {
                    total.0 += r.leased;
                    total.1 += r.delivered;
                    total.2 += r.failed;
                    total.3 += r.parked;
                    total.4 += r.lease_lost;
                    if r.leased == 0 {
                        break;
                    }
                }
                Err(e) => {
                    error = Some(with_causes(&e));
                    break;
                }
            }
        }
        Event::RelayDone {
            leased: total.0,
            delivered: total.1,
            failed: total.2,
            parked: total.3,
            lease_lost: total.4,
            error,
        }
    }

    pub fn worker(config: &Config) {
        // Multi-threaded: diesel-async's SyncConnectionWrapper blocks in place, which a
        // current-thread runtime refuses (with a panic in a destructor, which aborts).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let mut conn: Option<AsyncConn> = None;
        emit(&Event::Ready);
        while let Some(command) = read_command() {
            if conn.is_none() {
                match runtime.block_on(connect(config)) {
                    Ok(c) => conn = Some(c),
                    Err(e) => {
                        match command {
                            Command::Job(spec) => emit(&Event::Outcome {
                                id: spec.id,
                                res: Res::NoConnection(e),
                            }),
                            Command::Relay { .. } => emit(&Event::RelayDone {
                                leased: 0,
                                delivered: 0,
                                failed: 0,
                                parked: 0,
                                lease_lost: 0,
                                error: Some(e),
                            }),
                            Command::Go => {}
                        }
                        continue;
                    }
                }
            }
            match command {
                Command::Job(spec) => {
                    let mut c = conn.take().expect("connected");
                    let db = config.db;
                    let cancel = spec.cancel_ms;
                    let job = spec.clone();
                    let task = runtime.spawn(async move {
                        let res = match cancel {
                            Some(ms) => match tokio::time::timeout(
                                Duration::from_millis(ms),
                                run_job(&mut c, &job, db),
                            )
                            .await
                            {
                                Ok(Ok(outcome)) => outcome_res(outcome),
                                Ok(Err(e)) => error_res(e),
                                Err(_) => Res::Cancelled,
                            },
                            None => match run_job(&mut c, &job, db).await {
                                Ok(outcome) => outcome_res(outcome),
                                Err(e) => error_res(e),
                            },
                        };
                        (c, res)
                    });
                    let res = match runtime.block_on(task) {
                        Ok((c, res)) => {
                            if res.completed() {
                                conn = Some(c);
                            }
                            res
                        }
                        Err(_) => Res::Panicked,
                    };
                    after_commit(&spec, &res);
                    emit(&Event::Outcome { id: spec.id, res });
                }
                Command::Relay { hold_at, cancel_ms } => {
                    let c = conn.as_mut().expect("connected");
                    let event = match cancel_ms {
                        Some(ms) => runtime
                            .block_on(async {
                                tokio::time::timeout(
                                    Duration::from_millis(ms),
                                    relay_rounds(c, hold_at),
                                )
                                .await
                            })
                            .unwrap_or(Event::RelayDone {
                                leased: 0,
                                delivered: 0,
                                failed: 0,
                                parked: 0,
                                lease_lost: 0,
                                error: Some("cancelled".into()),
                            }),
                        None => runtime.block_on(relay_rounds(c, hold_at)),
                    };
                    if matches!(event, Event::RelayDone { error: Some(_), .. }) {
                        conn = None;
                    }
                    emit(&event);
                }
                Command::Go => {}
            }
        }
    }
}

/// The worker's entry: runs until stdin closes when `IDEMPOTENT_EXPLORE_WORKER` is set, returns
/// at once otherwise.
pub fn main_if_worker() {
    let Ok(config) = std::env::var(WORKER_ENV) else {
        return;
    };
    let config: Config = serde_json::from_str(&config).expect("the worker's configuration");
    // A panicking body is part of the exploration: keep its message short.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("worker panic: {info}");
    }));
    match config.mode {
        Mode::Sync => sync_worker(&config),
        Mode::Async => asynchronous::worker(&config),
    }
    std::process::exit(0);
}
