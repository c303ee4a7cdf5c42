//! Workers for the cluster tests, as threads with connections of their own (sync Diesel and
//! diesel-async, side by side on one key space), fed by an in-process queue with at-least-once
//! delivery: a delivery is acknowledged only after its job returned `Ok`, and a failed one goes
//! back to the queue marked redelivered. A worker whose database went away reconnects, trying
//! each server it knows in turn.
//!
//! The queue keeps a log of what happened, in order, so that a test can tell what came before a
//! fault it injected from what came after.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use diesel::connection::CacheSize;
use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

diesel::table! {
    effects (id) {
        id -> BigInt,
        job_id -> Text,
    }
}

/// The effects table, one row per run of a job's body that committed.
pub const EFFECTS_POSTGRES: &str =
    "CREATE TABLE effects (id BIGSERIAL PRIMARY KEY, job_id VARCHAR(200) NOT NULL)";
pub const EFFECTS_MYSQL: &str = "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, job_id VARCHAR(200) NOT NULL) ENGINE = InnoDB";

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// Called inside every job's body, after its effect: where a test pauses a job on purpose.
pub type Hook = Arc<dyn Fn(usize, &str) + Send + Sync>;

pub fn no_hook() -> Hook {
    Arc::new(|_, _| {})
}

/// A hook that holds each of `jobs` once inside its transaction, after telling the queue, until
/// the test lets it go ([`Broker::release`]): the test injects its fault while the job holds its
/// transaction open, for as long as that takes on a busy machine. A job not let go within two
/// minutes goes on by itself, so a test that forgets fails on its counts instead of hanging.
pub fn hold_once(broker: &Arc<Broker>, jobs: &[String]) -> Hook {
    let broker = Arc::clone(broker);
    let pending = Mutex::new(
        jobs.iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
    );
    Arc::new(move |worker, job| {
        let first_time = pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(job);
        if first_time {
            broker.event(Event::Paused {
                worker,
                job: job.to_owned(),
            });
            broker.until_released(job, Duration::from_secs(120));
        }
    })
}

// ---- the job, sync and async: one job, one key space ----------------------------------------------

pub trait SyncDb: idempotent_jobs::JobStore + Connection + Send + 'static {
    fn insert_effect(&mut self, job_id: &str) -> QueryResult<()>;
}

macro_rules! impl_sync_db {
    ($conn:ty) => {
        impl SyncDb for $conn {
            fn insert_effect(&mut self, job_id: &str) -> QueryResult<()> {
                diesel::insert_into(effects::table)
                    .values(effects::job_id.eq(job_id))
                    .execute(self)
                    .map(drop)
            }
        }
    };
}

impl_sync_db!(diesel::PgConnection);
impl_sync_db!(diesel::MysqlConnection);

pub trait AsyncDb:
    idempotent_jobs::AsyncJobStore + diesel_async::AsyncConnection + Send + 'static
{
    fn insert_effect(&mut self, job_id: &str) -> impl Future<Output = QueryResult<()>> + Send;

    /// Connects to `url` as a worker behind a transaction pooler should (docs/clusters.md):
    /// `pooler::establish_async_pg` on PostgreSQL, whose own `establish` sends its session setup
    /// outside a transaction; `establish` elsewhere.
    fn establish_through_pooler(
        url: &str,
    ) -> impl Future<Output = diesel::ConnectionResult<Self>> + Send;
}

macro_rules! impl_async_db {
    ($conn:ty, |$url:ident| $pooled:expr) => {
        impl AsyncDb for $conn {
            async fn insert_effect(&mut self, job_id: &str) -> QueryResult<()> {
                diesel_async::RunQueryDsl::execute(
                    diesel::insert_into(effects::table).values(effects::job_id.eq(job_id)),
                    self,
                )
                .await
                .map(drop)
            }

            async fn establish_through_pooler($url: &str) -> diesel::ConnectionResult<Self> {
                $pooled.await
            }
        }
    };
}

impl_async_db!(diesel_async::AsyncPgConnection, |url| {
    idempotent_jobs::pooler::establish_async_pg(url)
});
impl_async_db!(diesel_async::AsyncMysqlConnection, |url| {
    <diesel_async::AsyncMysqlConnection as diesel_async::AsyncConnection>::establish(url)
});

/// The job: one effect row. Returns the attempt that ran, so a replay returns another's.
#[idempotent_job(key = "job:<job_id>", name = "cluster_job")]
fn apply_sync<C: SyncDb>(
    conn: &mut C,
    job_id: &str,
    attempt: u64,
    hook: &(dyn Fn(&str) + Sync),
) -> Result<u64, WorkerError> {
    conn.insert_effect(job_id)?;
    hook(job_id);
    Ok(attempt)
}

/// `apply_sync` as an async handler, under the same job name and key template.
#[idempotent_job(key = "job:<job_id>", name = "cluster_job")]
async fn apply_async<C: AsyncDb>(
    conn: &mut C,
    job_id: &str,
    attempt: u64,
    hook: &(dyn Fn(&str) + Sync),
) -> Result<u64, WorkerError> {
    conn.insert_effect(job_id).await?;
    hook(job_id);
    Ok(attempt)
}

// ---- connections ---------------------------------------------------------------------------------

/// How a worker's connections are set up.
#[derive(Debug, Clone)]
pub struct ConnOptions {
    /// Diesel's prepared-statement cache (on by default in Diesel and diesel-async).
    pub statement_cache: bool,
    /// SQL run once on each new connection.
    pub session: Option<String>,
    /// Whether the connections go through a transaction pooler (PgBouncer in transaction mode):
    /// async PostgreSQL connections are then made as docs/clusters.md says.
    pub through_pooler: bool,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            statement_cache: true,
            session: None,
            through_pooler: false,
        }
    }
}

/// One worker's connection, sync or async.
pub trait WorkerConn: Sized {
    fn connect(url: &str, options: &ConnOptions) -> Result<Self, String>;
    fn migrate(&mut self) -> Result<(), String>;
    fn apply(
        &mut self,
        job_id: &str,
        attempt: u64,
        hook: &(dyn Fn(&str) + Sync),
    ) -> Result<u64, WorkerError>;
    /// Whether the connection still answers (a simple query: no prepared statement).
    fn alive(&mut self) -> bool;
}

impl<C: SyncDb + diesel::connection::SimpleConnection> WorkerConn for C {
    fn connect(url: &str, options: &ConnOptions) -> Result<Self, String> {
        let mut conn = C::establish(url).map_err(|e| e.to_string())?;
        if !options.statement_cache {
            conn.set_prepared_statement_cache_size(CacheSize::Disabled);
        }
        if let Some(sql) = &options.session {
            conn.batch_execute(sql).map_err(|e| e.to_string())?;
        }
        Ok(conn)
    }

    fn migrate(&mut self) -> Result<(), String> {
        idempotent_jobs::migrate(self).map_err(|e| with_causes(&e))
    }

    fn apply(
        &mut self,
        job_id: &str,
        attempt: u64,
        hook: &(dyn Fn(&str) + Sync),
    ) -> Result<u64, WorkerError> {
        apply_sync(self, job_id, attempt, hook)
    }

    fn alive(&mut self) -> bool {
        self.batch_execute("SELECT 1").is_ok()
    }
}

/// A diesel-async connection with the runtime that drives it.
pub struct Async<C> {
    runtime: tokio::runtime::Runtime,
    conn: C,
}

impl<C: AsyncDb + diesel_async::SimpleAsyncConnection> WorkerConn for Async<C> {
    fn connect(url: &str, options: &ConnOptions) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let conn = runtime.block_on(async {
            let mut conn = if options.through_pooler {
                C::establish_through_pooler(url).await
            } else {
                C::establish(url).await
            }
            .map_err(|e| e.to_string())?;
            if !options.statement_cache {
                conn.set_prepared_statement_cache_size(CacheSize::Disabled);
            }
            if let Some(sql) = &options.session {
                conn.batch_execute(sql).await.map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(conn)
        })?;
        Ok(Async { runtime, conn })
    }

    fn migrate(&mut self) -> Result<(), String> {
        self.runtime
            .block_on(idempotent_jobs::migrate_async(&mut self.conn))
            .map_err(|e| with_causes(&e))
    }

    fn apply(
        &mut self,
        job_id: &str,
        attempt: u64,
        hook: &(dyn Fn(&str) + Sync),
    ) -> Result<u64, WorkerError> {
        self.runtime
            .block_on(apply_async(&mut self.conn, job_id, attempt, hook))
    }

    fn alive(&mut self) -> bool {
        self.runtime
            .block_on(self.conn.batch_execute("SELECT 1"))
            .is_ok()
    }
}

// ---- the queue -----------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Delivery {
    pub job: String,
    pub redelivered: bool,
}

/// Why a job failed, as far as the worker can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Failure {
    /// Deadlock 1213 at `COMMIT`: Galera's certification found a conflicting write ordered first.
    CertificationAtCommit,
    /// Deadlock before the commit: a replicated write aborted the local transaction (Galera's
    /// brute-force abort), or the database's own deadlock detector.
    ConflictBeforeCommit,
    /// The connection failed during `COMMIT`: the commit may or may not have happened.
    CommitInDoubt,
    /// Any other failure (most often a connection that went away).
    Other,
}

#[derive(Debug, Clone)]
#[allow(
    dead_code,
    reason = "every field is shown in failure messages, through Debug"
)]
pub enum Event {
    Ran {
        worker: usize,
        job: String,
    },
    Replayed {
        worker: usize,
        job: String,
    },
    Failed {
        worker: usize,
        job: String,
        failure: Failure,
        error: String,
    },
    Connected {
        worker: usize,
        url: String,
    },
    MigrateFailed {
        worker: usize,
        error: String,
    },
    ConnectFailed {
        worker: usize,
        error: String,
    },
    /// A job paused inside its transaction by the test's hook.
    Paused {
        worker: usize,
        job: String,
    },
    /// Set by a test: what it did to the servers, and when.
    Fault(String),
}

#[derive(Debug, Default)]
pub struct State {
    ready: VecDeque<Delivery>,
    pub in_flight: usize,
    pub acked: usize,
    pub published: usize,
    pub events: Vec<Event>,
    pub gave_up: Vec<String>,
    /// Jobs held by [`hold_once`] that the test has let go.
    released: std::collections::BTreeSet<String>,
    stop: bool,
}

pub struct Broker {
    state: Mutex<State>,
    changed: Condvar,
}

impl Broker {
    pub fn new() -> Arc<Broker> {
        Arc::new(Broker {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        })
    }

    /// The queue's state, for a test to read.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.lock()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `copies` of each job; copies of one job are adjacent, so that different workers
    /// take them at the same moment and race on the key.
    pub fn publish(&self, jobs: &[(String, usize)]) {
        let mut state = self.lock();
        for (job, copies) in jobs {
            for _ in 0..*copies {
                state.ready.push_back(Delivery {
                    job: job.clone(),
                    redelivered: false,
                });
                state.published += 1;
            }
        }
        self.changed.notify_all();
    }

    fn take(&self) -> Option<Delivery> {
        let mut state = self.lock();
        loop {
            if state.stop {
                return None;
            }
            if let Some(delivery) = state.ready.pop_front() {
                state.in_flight += 1;
                return Some(delivery);
            }
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(200))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    fn ack(&self, worker: usize, delivery: &Delivery, ran: bool) {
        let mut state = self.lock();
        state.in_flight -= 1;
        state.acked += 1;
        let job = delivery.job.clone();
        state.events.push(if ran {
            Event::Ran { worker, job }
        } else {
            Event::Replayed { worker, job }
        });
        self.changed.notify_all();
    }

    fn nack(&self, worker: usize, mut delivery: Delivery, failure: Failure, error: String) {
        let mut state = self.lock();
        state.in_flight -= 1;
        state.events.push(Event::Failed {
            worker,
            job: delivery.job.clone(),
            failure,
            error,
        });
        delivery.redelivered = true;
        state.ready.push_back(delivery);
        self.changed.notify_all();
    }

    pub fn event(&self, event: Event) {
        self.lock().events.push(event);
        self.changed.notify_all();
    }

    /// Lets a job held by [`hold_once`] go on.
    pub fn release(&self, job: &str) {
        self.lock().released.insert(job.to_owned());
        self.changed.notify_all();
    }

    /// Waits until the test lets `job` go, or `limit` has passed.
    fn until_released(&self, job: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut state = self.lock();
        while !state.released.contains(job) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// The job the `n`-th hold (counted from 1) held, once it has.
    pub fn held(state: &State, n: usize) -> Option<&str> {
        state
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Paused { job, .. } => Some(job.as_str()),
                _ => None,
            })
            .nth(n - 1)
    }

    fn give_up(&self, why: String) {
        self.lock().gave_up.push(why);
        self.changed.notify_all();
    }

    /// Waits until `done` holds; panics naming `what` did not happen, with the queue's state.
    pub fn wait(&self, what: &str, limit: Duration, done: impl Fn(&State) -> bool) {
        let deadline = Instant::now() + limit;
        let mut state = self.lock();
        while !done(&state) {
            let now = Instant::now();
            let failures: Vec<&Event> = state
                .events
                .iter()
                .filter(|e| matches!(e, Event::Failed { .. }))
                .rev()
                .take(5)
                .collect();
            assert!(
                now < deadline,
                "{what} did not happen within {limit:?}: {} of {} deliveries acknowledged, {} in flight, {} waiting; workers that gave up: {:?}; last failures: {failures:?}",
                state.acked,
                state.published,
                state.in_flight,
                state.ready.len(),
                state.gave_up
            );
            assert!(
                state.gave_up.is_empty(),
                "while waiting for {what}, workers gave up: {:?}",
                state.gave_up
            );
            state = self
                .changed
                .wait_timeout(state, (deadline - now).min(Duration::from_millis(200)))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Waits until every published delivery is acknowledged.
    pub fn wait_all_acked(&self, limit: Duration) {
        self.wait("every delivery acknowledged", limit, |s| {
            s.acked == s.published
        });
    }

    pub fn stop(&self) {
        self.lock().stop = true;
        self.changed.notify_all();
    }

    /// What the workers saw, from the log.
    pub fn tally(&self) -> Tally {
        let state = self.lock();
        let mut tally = Tally::default();
        let mut after_fault = false;
        for event in &state.events {
            match event {
                Event::Ran { job, .. } => *tally.ran.entry(job.clone()).or_default() += 1,
                Event::Replayed { .. } => tally.replays += 1,
                Event::Failed {
                    failure,
                    job,
                    error,
                    ..
                } => {
                    *tally.failures.entry(*failure).or_default() += 1;
                    if *failure == Failure::CommitInDoubt {
                        tally.in_doubt.push(job.clone());
                    }
                    if !after_fault
                        && !matches!(
                            failure,
                            Failure::CertificationAtCommit | Failure::ConflictBeforeCommit
                        )
                    {
                        tally.unexpected.push(error.clone());
                    }
                }
                Event::Connected { .. } => tally.connects += 1,
                Event::MigrateFailed { error, .. } => tally.migrate_failures.push(error.clone()),
                Event::ConnectFailed { .. } => tally.connect_failures += 1,
                Event::Paused { .. } => tally.paused += 1,
                Event::Fault(_) => after_fault = true,
            }
        }
        tally
    }

    pub fn acked(&self) -> usize {
        self.lock().acked
    }

    /// How many jobs the hook has paused so far.
    pub fn paused(state: &State) -> usize {
        state
            .events
            .iter()
            .filter(|e| matches!(e, Event::Paused { .. }))
            .count()
    }
}

/// What the log adds up to.
#[derive(Debug, Default)]
pub struct Tally {
    /// Per job: how many times a worker saw its body run and commit.
    pub ran: BTreeMap<String, usize>,
    pub replays: usize,
    pub failures: BTreeMap<Failure, usize>,
    /// Jobs whose commit failed with the connection: committed or not, only the database knows.
    pub in_doubt: Vec<String>,
    /// Failures before any fault was injected that are not write conflicts.
    pub unexpected: Vec<String>,
    pub connects: usize,
    pub connect_failures: usize,
    pub migrate_failures: Vec<String>,
    pub paused: usize,
}

impl Tally {
    pub fn failed(&self, failure: Failure) -> usize {
        self.failures.get(&failure).copied().unwrap_or(0)
    }

    pub fn total_failures(&self) -> usize {
        self.failures.values().sum()
    }

    pub fn runs(&self) -> usize {
        self.ran.values().sum()
    }
}

fn is_deadlock(error: &diesel::result::Error) -> bool {
    match error {
        diesel::result::Error::DatabaseError(kind, info) => {
            matches!(
                kind,
                diesel::result::DatabaseErrorKind::SerializationFailure
            ) || info.message().contains("Deadlock")
                || info.message().contains("deadlock")
        }
        _ => false,
    }
}

pub use super::names::with_causes;

pub fn classify(error: &WorkerError) -> Failure {
    use idempotent_jobs::Error;
    match error {
        WorkerError::Idempotent(Error::Database { step, source, .. }) => {
            let commit = matches!(step, idempotent_jobs::Step::Commit);
            match (commit, is_deadlock(source)) {
                (true, true) => Failure::CertificationAtCommit,
                (true, false) => Failure::CommitInDoubt,
                (false, true) => Failure::ConflictBeforeCommit,
                (false, false) => Failure::Other,
            }
        }
        // The connection failed while COMMIT was on its way (a node SIGKILLed at that moment):
        // the runtime says the outcome is unknown; the commit may well have replicated.
        WorkerError::Idempotent(Error::CommitOutcomeUnknown { .. }) => Failure::CommitInDoubt,
        WorkerError::Database(source) if is_deadlock(source) => Failure::ConflictBeforeCommit,
        // The body's statement met the brute-force abort and the handler carried on: the runtime
        // finds the transaction gone before recording, and leaves the key's row alone.
        WorkerError::Idempotent(Error::TransactionRolledBackInBody { .. }) => {
            Failure::ConflictBeforeCommit
        }
        _ => Failure::Other,
    }
}

// ---- workers -------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    SyncPostgres,
    AsyncPostgres,
    SyncMysql,
    AsyncMysql,
}

/// One worker: its connection type and the servers it knows, first choice first.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub kind: Kind,
    pub urls: Vec<String>,
    pub options: ConnOptions,
}

/// How long a worker keeps trying to reach a database before it gives up.
const CONNECT_LIMIT: Duration = Duration::from_secs(60);

pub fn spawn(broker: &Arc<Broker>, specs: Vec<WorkerSpec>, hook: &Hook) -> Vec<JoinHandle<()>> {
    specs
        .into_iter()
        .enumerate()
        .map(|(id, spec)| {
            let broker = Arc::clone(broker);
            let hook = Arc::clone(hook);
            std::thread::Builder::new()
                .name(format!("worker-{id}"))
                .spawn(move || match spec.kind {
                    Kind::SyncPostgres => work::<diesel::PgConnection>(id, &broker, &spec, &hook),
                    Kind::AsyncPostgres => {
                        work::<Async<diesel_async::AsyncPgConnection>>(id, &broker, &spec, &hook);
                    }
                    Kind::SyncMysql => work::<diesel::MysqlConnection>(id, &broker, &spec, &hook),
                    Kind::AsyncMysql => {
                        work::<Async<diesel_async::AsyncMysqlConnection>>(
                            id, &broker, &spec, &hook,
                        );
                    }
                })
                .expect("a worker thread")
        })
        .collect()
}

/// Stops the workers and waits for them.
pub fn stop(broker: &Broker, workers: Vec<JoinHandle<()>>) {
    broker.stop();
    for worker in workers {
        worker.join().expect("a worker panicked");
    }
}

fn connect<W: WorkerConn>(id: usize, broker: &Broker, spec: &WorkerSpec) -> Option<W> {
    let deadline = Instant::now() + CONNECT_LIMIT;
    let mut delay = Duration::from_millis(50);
    let mut last = String::new();
    while Instant::now() < deadline {
        for url in &spec.urls {
            // Diesel's `PgConnection::establish` panics ("Is never none") where libpq has no
            // result right after its session setup was sent: through a PgBouncer that other
            // clients crossed, which answered it with another client's messages. A failed connect.
            let connected = std::panic::catch_unwind(|| W::connect(url, &spec.options))
                .unwrap_or_else(|_| Err("the connect panicked".to_owned()));
            match connected {
                Ok(conn) => {
                    broker.event(Event::Connected {
                        worker: id,
                        url: url.clone(),
                    });
                    return Some(conn);
                }
                Err(error) => {
                    broker.event(Event::ConnectFailed {
                        worker: id,
                        error: error.clone(),
                    });
                    last = error;
                }
            }
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(500));
    }
    broker.give_up(format!(
        "worker {id} ({:?}) reached none of {:?} within {CONNECT_LIMIT:?}: {last}",
        spec.kind, spec.urls
    ));
    None
}

fn work<W: WorkerConn>(id: usize, broker: &Broker, spec: &WorkerSpec, hook: &Hook) {
    let Some(mut conn) = connect::<W>(id, broker, spec) else {
        return;
    };
    // Every worker migrates at start, as a deployment of many workers does.
    let mut tries = 0;
    while let Err(error) = conn.migrate() {
        broker.event(Event::MigrateFailed {
            worker: id,
            error: error.clone(),
        });
        tries += 1;
        if tries == 10 {
            broker.give_up(format!("worker {id}: migrate failed 10 times: {error}"));
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
        if !conn.alive() {
            let Some(fresh) = connect::<W>(id, broker, spec) else {
                return;
            };
            conn = fresh;
        }
    }
    let hook = |job: &str| hook(id, job);
    let mut attempts = 0u64;
    while let Some(delivery) = broker.take() {
        attempts += 1;
        let attempt = ((id as u64 + 1) << 32) | attempts;
        // A job that panics is a failed delivery, as a worker framework treats it: the delivery
        // goes back to the queue and the worker goes on, on a new connection (Diesel's
        // `PgConnection` panics, "Is never none", when libpq has no result right after it sent a
        // statement, as through a PgBouncer that other clients crossed).
        let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            conn.apply(&delivery.job, attempt, &hook)
        }));
        match applied {
            Ok(Ok(ran_in)) => broker.ack(id, &delivery, ran_in == attempt),
            Ok(Err(error)) => {
                broker.nack(id, delivery, classify(&error), with_causes(&error));
                if !conn.alive() {
                    let Some(fresh) = connect::<W>(id, broker, spec) else {
                        return;
                    };
                    conn = fresh;
                }
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|m| (*m).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                broker.nack(id, delivery, Failure::Other, format!("panicked: {message}"));
                let Some(fresh) = connect::<W>(id, broker, spec) else {
                    return;
                };
                conn = fresh;
            }
        }
    }
}

/// Effects per job, and the number of claims in `done_jobs`.
pub struct Counts {
    pub effects: BTreeMap<String, i64>,
    pub claims: i64,
}

impl Counts {
    pub fn total_effects(&self) -> i64 {
        self.effects.values().sum()
    }
}

#[derive(QueryableByName)]
struct EffectCount {
    #[diesel(sql_type = diesel::sql_types::Text)]
    job_id: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

macro_rules! counts_on {
    ($name:ident, $conn:ty) => {
        /// What the database at `url` holds.
        pub fn $name(url: &str) -> Counts {
            let mut conn = <$conn>::establish(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            let rows: Vec<EffectCount> =
                diesel::sql_query("SELECT job_id, COUNT(*) AS n FROM effects GROUP BY job_id")
                    .load(&mut conn)
                    .unwrap_or_else(|e| panic!("reading effects at {url}: {e}"));
            let claims = idempotent_jobs::schema::done_jobs::table
                .count()
                .get_result(&mut conn)
                .unwrap_or_else(|e| panic!("reading done_jobs at {url}: {e}"));
            Counts {
                effects: rows.into_iter().map(|r| (r.job_id, r.n)).collect(),
                claims,
            }
        }
    };
}

counts_on!(counts_postgres, diesel::PgConnection);
counts_on!(counts_mysql, diesel::MysqlConnection);
