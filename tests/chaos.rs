//! Faults as production has them: a real at-least-once broker (RabbitMQ), several worker processes
//! (`examples/rabbitmq_worker.rs`), SIGKILLs at the worst moments, database connections terminated
//! mid-job, a PostgreSQL restart, and eight workers racing on one hot key and on ten thousand.
//!
//! Bounded in time and count, self-stopping, loopback only. The tests take a lock so that they
//! run one at a time (a PostgreSQL restart must not meet another test's connections).
//!
//! Needs RabbitMQ at `AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`), PostgreSQL and
//! MariaDB as for the other tests; `scripts/test` starts them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection as Amqp, ConnectionProperties};

#[path = "support/figures.rs"]
mod figures;

/// One chaos test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}_{}_{nanos}", std::process::id())
}

// ---- databases ---------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Postgres,
    Mysql,
}

/// Runs `$body` with `$conn` bound to a new connection to `$url`, of the server's type.
macro_rules! with_connection {
    ($server:expr, $url:expr, |$conn:ident| $body:expr) => {
        match $server {
            Server::Postgres => {
                let $conn = &mut PgConnection::establish($url).unwrap_or_else(|e| {
                    panic!("PostgreSQL at {}: {e}; scripts/test starts it", $url)
                });
                $body
            }
            Server::Mysql => {
                let $conn = &mut MysqlConnection::establish($url)
                    .unwrap_or_else(|e| panic!("MariaDB at {}: {e}; scripts/test starts it", $url));
                $body
            }
        }
    };
}

/// A database of this run's own: a schema on PostgreSQL, a database on MariaDB.
struct Db {
    server: Server,
    name: String,
    base: String,
    /// What the workers connect to.
    url: String,
}

impl Db {
    fn fresh(server: Server) -> Db {
        let name = unique("idempotent_chaos");
        let (base, url) = match server {
            Server::Postgres => {
                let base = std::env::var("IDEMPOTENT_POSTGRES_URL")
                    .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
                let separator = if base.contains('?') { '&' } else { '?' };
                let url = format!(
                    "{base}{separator}options=-csearch_path%3D{name}&application_name={name}"
                );
                (base, url)
            }
            Server::Mysql => {
                let base = std::env::var("IDEMPOTENT_MYSQL_URL")
                    .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
                let server_part = base
                    .rsplit_once('/')
                    .map_or(base.as_str(), |(s, _)| s)
                    .to_owned();
                (base, format!("{server_part}/{name}"))
            }
        };
        let db = Db {
            server,
            name,
            base,
            url,
        };
        db.admin(&match server {
            Server::Postgres => format!(
                "CREATE SCHEMA {0}; CREATE TABLE {0}.effects (id BIGSERIAL PRIMARY KEY, job_id VARCHAR(200) NOT NULL, amount BIGINT NOT NULL)",
                db.name
            ),
            Server::Mysql => format!(
                "CREATE DATABASE {0} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin; \
                 CREATE TABLE {0}.effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, job_id VARCHAR(200) NOT NULL, amount BIGINT NOT NULL)",
                db.name
            ),
        });
        db
    }

    /// Runs SQL on the shared database (not this run's).
    fn admin(&self, sql: &str) {
        with_connection!(self.server, &self.base, |conn| conn.batch_execute(sql))
            .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
    }

    /// `(job_id, effects)` for every job with an effect, and the number of done jobs.
    fn effects(&self) -> (BTreeMap<String, i64>, i64) {
        #[derive(QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::Text)]
            job_id: String,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let (rows, done): (Vec<Count>, i64) = with_connection!(self.server, &self.url, |conn| {
            let rows =
                diesel::sql_query("SELECT job_id, COUNT(*) AS n FROM effects GROUP BY job_id")
                    .load(conn)
                    .unwrap_or_default();
            let done = idempotent_jobs::schema::done_jobs::table
                .count()
                .get_result(conn)
                .unwrap_or(0);
            (rows, done)
        });
        (rows.into_iter().map(|c| (c.job_id, c.n)).collect(), done)
    }

    /// Terminates every connection a worker has to this run's database, mid-whatever.
    fn terminate_worker_connections(&self) -> usize {
        match self.server {
            Server::Postgres => {
                #[derive(QueryableByName)]
                struct Terminated {
                    #[diesel(sql_type = diesel::sql_types::Bool)]
                    terminated: bool,
                }
                let mut conn = PgConnection::establish(&self.base).expect("PostgreSQL");
                let rows: Vec<Terminated> = diesel::sql_query(
                    "SELECT pg_terminate_backend(pid) AS terminated FROM pg_stat_activity \
                     WHERE application_name = $1 AND pid <> pg_backend_pid()",
                )
                .bind::<diesel::sql_types::Text, _>(&self.name)
                .load(&mut conn)
                .expect("pg_terminate_backend");
                rows.iter().filter(|r| r.terminated).count()
            }
            Server::Mysql => {
                #[derive(QueryableByName)]
                struct Id {
                    #[diesel(sql_type = diesel::sql_types::BigInt)]
                    id: i64,
                }
                let mut conn = MysqlConnection::establish(&self.base).expect("MariaDB");
                let ids: Vec<Id> = diesel::sql_query(
                    "SELECT CAST(id AS SIGNED) AS id FROM information_schema.processlist \
                     WHERE db = ? AND id <> CONNECTION_ID()",
                )
                .bind::<diesel::sql_types::Text, _>(&self.name)
                .load(&mut conn)
                .expect("processlist");
                for id in &ids {
                    let _ = conn.batch_execute(&format!("KILL {}", id.id));
                }
                ids.len()
            }
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let sql = match self.server {
            Server::Postgres => format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
            Server::Mysql => format!("DROP DATABASE IF EXISTS {}", self.name),
        };
        let _ = match self.server {
            Server::Postgres => {
                PgConnection::establish(&self.base).map(|mut c| c.batch_execute(&sql))
            }
            Server::Mysql => {
                MysqlConnection::establish(&self.base).map(|mut c| c.batch_execute(&sql))
            }
        };
    }
}

// ---- the broker ----------------------------------------------------------------------------------

/// Publishes every job as JSON with publisher confirms, so none is lost before the test starts.
fn publish(queue: &str, messages: &[(String, String)]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let amqp = Amqp::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "RabbitMQ is not reachable at {}: {e}. Start it with `rabbitmq-server -detached` (scripts/test does this), or set AMQP_URL.",
                    amqp_url()
                )
            });
        let channel = amqp.create_channel().await.expect("channel");
        channel.confirm_select(ConfirmSelectOptions::default()).await.expect("confirms");
        channel
            .queue_declare(queue.into(), QueueDeclareOptions::default(), FieldTable::default())
            .await
            .expect("queue");
        for chunk in messages.chunks(500) {
            let mut confirms = Vec::new();
            for (job_id, copy) in chunk {
                let body = format!("{{\"job_id\":\"{job_id}\",\"amount\":100,\"copy\":\"{copy}\"}}");
                confirms.push(
                    channel
                        .basic_publish("".into(), queue.into(), BasicPublishOptions::default(), body.as_bytes(), BasicProperties::default())
                        .await
                        .expect("publish"),
                );
            }
            for confirm in confirms {
                confirm.await.expect("broker confirm");
            }
        }
        let _ = amqp.close(200, "published".into()).await;
    });
}

fn delete_queue(queue: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        if let Ok(amqp) = Amqp::connect(&amqp_url(), ConnectionProperties::default()).await {
            if let Ok(channel) = amqp.create_channel().await {
                let _ = channel
                    .queue_delete(queue.into(), QueueDeleteOptions::default())
                    .await;
            }
            let _ = amqp.close(200, "done".into()).await;
        }
    });
}

// ---- worker processes ----------------------------------------------------------------------------

fn worker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    let target = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let worker = target.join("examples").join("rabbitmq_worker");
    assert!(
        worker.exists(),
        "{} is built by `cargo test --all-features`",
        worker.display()
    );
    worker
}

/// Worker processes and their output, line by line.
struct Workers {
    db_url: String,
    queue: String,
    env: Vec<(String, String)>,
    children: HashMap<usize, Child>,
    /// Per worker: whether it has said `STARTING`, i.e. handles SIGTERM.
    handling_signals: HashMap<usize, Arc<AtomicBool>>,
    lines: Receiver<(usize, String)>,
    sender: Sender<(usize, String)>,
    next: usize,
}

impl Workers {
    fn new(db: &Db, queue: &str, env: &[(&str, &str)]) -> Workers {
        let (sender, lines) = channel();
        Workers {
            db_url: db.url.clone(),
            queue: queue.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            children: HashMap::new(),
            handling_signals: HashMap::new(),
            lines,
            sender,
            next: 0,
        }
    }

    fn start(&mut self) -> usize {
        let id = self.next;
        self.next += 1;
        let mut command = Command::new(worker_binary());
        command
            .env("DATABASE_URL", &self.db_url)
            .env("AMQP_URL", amqp_url())
            .env("QUEUE", &self.queue)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.stderr_path(id)).expect("a worker log"));
        for (name, value) in &self.env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("starting a worker");
        let stdout = child.stdout.take().expect("worker stdout");
        let sender = self.sender.clone();
        let handling_signals = Arc::new(AtomicBool::new(false));
        self.handling_signals
            .insert(id, Arc::clone(&handling_signals));
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == "STARTING" {
                    handling_signals.store(true, Ordering::SeqCst);
                }
                if sender.send((id, line)).is_err() {
                    break;
                }
            }
        });
        self.children.insert(id, child);
        id
    }

    /// Where worker `id` writes its errors.
    fn stderr_path(&self, id: usize) -> PathBuf {
        std::env::temp_dir().join(format!("{}-worker-{id}.log", self.queue))
    }

    fn kill(&mut self, id: usize) {
        self.handling_signals.remove(&id);
        if let Some(mut child) = self.children.remove(&id) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM to every worker; each must stop by itself and exit 0, even one still starting. (A
    /// worker just spawned is given until it says `STARTING`: no process handles a signal before
    /// it has installed its handler.)
    fn stop_all(&mut self) -> usize {
        let mut stopped = 0;
        let children: Vec<(usize, Child)> = self.children.drain().collect();
        for (id, mut child) in children {
            let handling = Arc::clone(&self.handling_signals[&id]);
            let deadline = Instant::now() + Duration::from_secs(30);
            while !handling.load(Ordering::SeqCst) && child.try_wait().ok().flatten().is_none() {
                assert!(Instant::now() < deadline, "worker {id} never started");
                std::thread::sleep(Duration::from_millis(5));
            }
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(status) = child.try_wait().expect("worker status") {
                    assert!(
                        status.success(),
                        "worker {id} exited {status} after SIGTERM; it said: {}",
                        std::fs::read_to_string(self.stderr_path(id)).unwrap_or_default()
                    );
                    stopped += 1;
                    break;
                }
                assert!(Instant::now() < deadline, "worker {id} ignored SIGTERM");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        stopped
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, mut child) in self.children.drain() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What the workers said.
#[derive(Debug, Default)]
struct Figures {
    outcomes: u64,
    ran: u64,
    replays: u64,
    redelivered: u64,
    failed: u64,
    reconnects: u64,
    ran_per_job: HashMap<String, u64>,
    acked: HashSet<String>,
}

impl Figures {
    fn read(&mut self, line: &str) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["OUTCOME", job, _copy, outcome, redelivered] => {
                self.outcomes += 1;
                if *outcome == "ran" {
                    self.ran += 1;
                    *self.ran_per_job.entry((*job).to_owned()).or_default() += 1;
                } else {
                    self.replays += 1;
                }
                if *redelivered == "redelivered=true" {
                    self.redelivered += 1;
                }
            }
            ["ACKED", copy] => {
                self.acked.insert((*copy).to_owned());
            }
            ["FAILED", ..] => self.failed += 1,
            ["RECONNECTED"] => self.reconnects += 1,
            _ => {}
        }
    }
}

/// The jobs `0..jobs`, each published once, and the first `duplicates` of them published a second
/// time further down the queue (a producer that retried).
fn jobs_with_duplicates(prefix: &str, jobs: usize, duplicates: usize) -> Vec<(String, String)> {
    let mut messages: Vec<(String, String)> = (0..jobs)
        .map(|i| (format!("{prefix}-{i}"), format!("{prefix}-{i}#1")))
        .collect();
    for i in 0..duplicates {
        let at = (i * 7 + jobs / 3).min(messages.len());
        messages.insert(at, (format!("{prefix}-{i}"), format!("{prefix}-{i}#2")));
    }
    messages
}

/// Reads worker lines until every published copy is acknowledged, calling `on_line` for each.
fn until_all_acked(
    workers: &mut Workers,
    figures: &mut Figures,
    copies: usize,
    limit: Duration,
    mut on_line: impl FnMut(&mut Workers, usize, &str, usize),
) {
    let deadline = Instant::now() + limit;
    while figures.acked.len() < copies {
        let now = Instant::now();
        assert!(
            now < deadline,
            "only {} of {copies} copies acknowledged within {limit:?}: {figures:?}",
            figures.acked.len()
        );
        if let Ok((worker, line)) = workers.lines.recv_timeout(deadline - now) {
            figures.read(&line);
            on_line(workers, worker, &line, figures.acked.len());
        }
    }
}

// ---- the tests -----------------------------------------------------------------------------------

fn chaos(server: Server) {
    const JOBS: usize = 2_000;
    const DUPLICATES: usize = 200;
    const WORKERS: usize = 4;
    const MAX_KILLS: u64 = 30;
    let _serial = serial();
    let db = Db::fresh(server);
    let queue = unique("idempotent_chaos");
    let messages = jobs_with_duplicates("job", JOBS, DUPLICATES);
    publish(&queue, &messages);

    let mut workers = Workers::new(
        &db,
        &queue,
        &[
            ("PREFETCH", "8"),
            ("IDEMPOTENT_CHAOS_PAUSE_MID_JOB", "12"),
            ("IDEMPOTENT_CHAOS_PAUSE_BEFORE_ACK", "12"),
            ("IDEMPOTENT_CHAOS_PAUSE_MS", "400"),
        ],
    );
    for _ in 0..WORKERS {
        workers.start();
    }
    let started = Instant::now();
    let mut figures = Figures::default();
    let (mut kills_mid_job, mut kills_before_ack, mut coin) = (0u64, 0u64, 0u64);
    until_all_acked(
        &mut workers,
        &mut figures,
        messages.len(),
        Duration::from_secs(240),
        |workers, worker, line, _| {
            let pause = line.starts_with("PAUSE-MID-JOB") || line.starts_with("PAUSE-BEFORE-ACK");
            coin += 1;
            // Kill about half of the paused workers, a SIGKILL at the worst moment, and start another.
            if pause && kills_mid_job + kills_before_ack < MAX_KILLS && coin % 2 == 0 {
                workers.kill(worker);
                if line.starts_with("PAUSE-MID-JOB") {
                    kills_mid_job += 1;
                } else {
                    kills_before_ack += 1;
                }
                workers.start();
            }
        },
    );
    let stopped = workers.stop_all();
    let elapsed = started.elapsed();
    delete_queue(&queue);

    let (effects, done) = db.effects();
    figures::report(&format!(
        "chaos ({server:?}): jobs {JOBS}, duplicate publishes {DUPLICATES}, workers {WORKERS} (+{} replacements), \
         kills {} ({kills_mid_job} mid-job, {kills_before_ack} between commit and ack), deliveries handled {}, \
         redelivered {}, replays {}, ran {}, effects {}, done jobs {done}, in {elapsed:.1?}",
        workers.next - WORKERS,
        kills_mid_job + kills_before_ack,
        figures.outcomes,
        figures.redelivered,
        figures.replays,
        figures.ran,
        effects.values().sum::<i64>(),
    ));
    assert_eq!(effects.len(), JOBS, "every job has its effect: none lost");
    assert!(
        effects.values().all(|n| *n == 1),
        "no job's effect exists twice"
    );
    assert_eq!(done, JOBS as i64);
    assert_eq!(
        figures.ran, JOBS as u64,
        "each job ran once, as the workers saw it"
    );
    assert!(figures.ran_per_job.values().all(|n| *n == 1));
    assert_eq!(
        figures.replays,
        DUPLICATES as u64 + kills_before_ack,
        "every duplicate publish and every redelivery of a committed job replayed, nothing else"
    );
    assert!(
        kills_mid_job + kills_before_ack > 0,
        "the run killed workers"
    );
    assert_eq!(
        stopped, WORKERS,
        "every worker left stopped cleanly on SIGTERM"
    );
}

#[test]
fn chaos_on_postgres() {
    chaos(Server::Postgres);
}

#[test]
fn chaos_on_mariadb() {
    chaos(Server::Mysql);
}

/// A job's database connection is terminated mid-job: the job rolls back whole, goes back to the
/// queue, and is done once after its redelivery; the worker reconnects instead of dying.
fn terminated_connections(server: Server) {
    const JOBS: usize = 60;
    const TERMINATIONS: u64 = 4;
    let _serial = serial();
    let db = Db::fresh(server);
    let queue = unique("idempotent_faults");
    publish(&queue, &jobs_with_duplicates("fault", JOBS, 0));
    let mut workers = Workers::new(
        &db,
        &queue,
        &[
            ("PREFETCH", "4"),
            ("IDEMPOTENT_CHAOS_PAUSE_MID_JOB", "150"),
            ("IDEMPOTENT_CHAOS_PAUSE_MS", "300"),
        ],
    );
    workers.start();
    let mut figures = Figures::default();
    let mut terminated = 0u64;
    until_all_acked(
        &mut workers,
        &mut figures,
        JOBS,
        Duration::from_secs(120),
        |_, _, line, _| {
            if line.starts_with("PAUSE-MID-JOB")
                && terminated < TERMINATIONS
                && db.terminate_worker_connections() > 0
            {
                terminated += 1;
            }
        },
    );
    assert_eq!(
        workers.stop_all(),
        1,
        "the worker survived every termination"
    );
    delete_queue(&queue);
    let (effects, _) = db.effects();
    figures::report(&format!(
        "terminated connections ({server:?}): jobs {JOBS}, terminations {terminated}, failed jobs {}, reconnects {}, effects {}",
        figures.failed,
        figures.reconnects,
        effects.values().sum::<i64>()
    ));
    assert_eq!(terminated, TERMINATIONS);
    assert!(
        figures.failed >= TERMINATIONS,
        "each terminated job failed and went back to the queue"
    );
    assert!(figures.reconnects >= 1);
    assert_eq!(effects.len(), JOBS);
    assert!(
        effects.values().all(|n| *n == 1),
        "rolled back whole, then done once"
    );
}

#[test]
fn terminated_connections_on_postgres() {
    terminated_connections(Server::Postgres);
}

#[test]
fn killed_connections_on_mariadb() {
    terminated_connections(Server::Mysql);
}

/// PostgreSQL restarts while two workers run: jobs in flight roll back and are done once after
/// redelivery, and the workers reconnect.
#[test]
fn postgres_restart_during_a_run() {
    const JOBS: usize = 400;
    let _serial = serial();
    let db = Db::fresh(Server::Postgres);
    let queue = unique("idempotent_restart");
    publish(&queue, &jobs_with_duplicates("restart", JOBS, 0));
    let mut workers = Workers::new(&db, &queue, &[("PREFETCH", "4")]);
    workers.start();
    workers.start();
    let mut figures = Figures::default();
    let mut restart_took = None;
    until_all_acked(
        &mut workers,
        &mut figures,
        JOBS,
        Duration::from_secs(180),
        |_, _, _, acked| {
            if acked >= JOBS / 4 && restart_took.is_none() {
                let started = Instant::now();
                let status = Command::new("sh")
                .args([
                    "-c",
                    "pg_ctlcluster --skip-systemctl-redirect \"$(ls /etc/postgresql | head -n 1)\" main restart",
                ])
                .status()
                .expect("running pg_ctlcluster");
                assert!(
                    status.success(),
                    "restarting the local PostgreSQL cluster failed: {status}"
                );
                restart_took = Some(started.elapsed());
            }
        },
    );
    assert_eq!(workers.stop_all(), 2, "both workers survived the restart");
    delete_queue(&queue);
    let (effects, _) = db.effects();
    figures::report(&format!(
        "postgres restart: jobs {JOBS}, restart took {:.1?}, failed jobs {}, reconnects {}, effects {}",
        restart_took.unwrap_or_default(),
        figures.failed,
        figures.reconnects,
        effects.values().sum::<i64>()
    ));
    assert!(restart_took.is_some());
    assert_eq!(effects.len(), JOBS, "every job done");
    assert!(effects.values().all(|n| *n == 1), "none twice");
}

/// A worker told to stop while it is still starting (here: waiting for a database that does not
/// answer) exits 0 at once, having taken no work.
#[test]
fn sigterm_while_starting_exits_cleanly() {
    let _serial = serial();
    let db = Db::fresh(Server::Postgres);
    let mut workers = Workers::new(&db, &unique("idempotent_starting"), &[]);
    workers.db_url = "postgres://postgres@127.0.0.1:1/test".to_owned();
    let id = workers.start();
    let started = Instant::now();
    assert_eq!(workers.stop_all(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it stopped at once, not after giving up on the database"
    );
    // Its last lines may still be on their way from the pipe's reader thread.
    let mut said = Vec::new();
    while let Ok((worker, line)) = workers.lines.recv_timeout(Duration::from_secs(5)) {
        let last = line.starts_with("STOPPED");
        if worker == id {
            said.push(line);
        }
        if last {
            break;
        }
    }
    assert!(
        said.iter().any(|l| l == "STOPPED before taking any work"),
        "{said:?}"
    );
    assert!(!said.iter().any(|l| l == "READY"), "{said:?}");
}

/// Eight worker processes on one hot key and on ten thousand distinct keys: no deadlock escapes
/// the runtime's retries, no effect twice, every job done.
fn racing_at_scale(server: Server) {
    const DISTINCT: usize = 10_000;
    const HOT_COPIES: usize = 1_000;
    let _serial = serial();
    let db = Db::fresh(server);
    let queue = unique("idempotent_race");
    let mut messages = jobs_with_duplicates("key", DISTINCT, 0);
    for copy in 0..HOT_COPIES {
        messages.insert(copy * 10, ("hot".to_owned(), format!("hot#{copy}")));
    }
    publish(&queue, &messages);
    let mut workers = Workers::new(&db, &queue, &[("PREFETCH", "16")]);
    for _ in 0..8 {
        workers.start();
    }
    let started = Instant::now();
    let mut figures = Figures::default();
    until_all_acked(
        &mut workers,
        &mut figures,
        messages.len(),
        Duration::from_secs(300),
        |_, _, _, _| {},
    );
    let elapsed = started.elapsed();
    assert_eq!(workers.stop_all(), 8);
    delete_queue(&queue);
    let (effects, done) = db.effects();
    figures::report(&format!(
        "racing ({server:?}): 8 workers, {DISTINCT} keys + {HOT_COPIES} deliveries of one hot key, ran {}, replays {}, failed {}, effects {}, in {elapsed:.1?}",
        figures.ran,
        figures.replays,
        figures.failed,
        effects.values().sum::<i64>()
    ));
    assert_eq!(
        figures.failed, 0,
        "no error (deadlocks included) reached a worker"
    );
    assert_eq!(effects.len(), DISTINCT + 1);
    assert!(effects.values().all(|n| *n == 1));
    assert_eq!(done, (DISTINCT + 1) as i64);
    assert_eq!(figures.replays, (HOT_COPIES - 1) as u64);
}

#[test]
fn racing_at_scale_on_postgres() {
    racing_at_scale(Server::Postgres);
}

#[test]
fn racing_at_scale_on_mariadb() {
    racing_at_scale(Server::Mysql);
}
