//! Faults as production has them: a real at-least-once broker (RabbitMQ), several worker processes
//! (`examples/rabbitmq_worker.rs`), SIGKILLs at the worst moments, database connections terminated
//! mid-job, a PostgreSQL restart, and eight workers racing on one hot key and on ten thousand.
//!
//! Every fault lands where the test chose, not where timing put it: a worker pauses at jobs the
//! test listed (inside the transaction, or between the commit and the ack), says so, and waits on
//! its stdin while the test kills it, terminates its connection or restarts PostgreSQL; the test
//! then waits for the effect (the failure, the reconnect) before it goes on. So the counts asserted
//! are the counts arranged, in every run.
//!
//! Bounded in time and count, self-stopping, loopback only: each wait has a deadline and fails
//! saying what did not happen and what the workers said last. The tests take a lock so that they
//! run one at a time (a PostgreSQL restart must not meet another test's connections).
//!
//! Needs RabbitMQ at `AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`), PostgreSQL and
//! MariaDB as for the other tests; `scripts/test` starts them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
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
#[path = "support/names.rs"]
mod names;

/// One chaos test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

use names::unique_name as unique;

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
                // With a timeout, `pg_terminate_backend` returns once the backend is gone (false if
                // it is not gone by then): the worker resumes against a connection that is dead.
                let rows: Vec<Terminated> = diesel::sql_query(
                    "SELECT pg_terminate_backend(pid, 10000) AS terminated FROM pg_stat_activity \
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
                let connections = |conn: &mut MysqlConnection| -> Vec<i64> {
                    diesel::sql_query(
                        "SELECT CAST(id AS SIGNED) AS id FROM information_schema.processlist \
                         WHERE db = ? AND id <> CONNECTION_ID()",
                    )
                    .bind::<diesel::sql_types::Text, _>(&self.name)
                    .load::<Id>(conn)
                    .expect("processlist")
                    .into_iter()
                    .map(|c| c.id)
                    .collect()
                };
                let ids = connections(&mut conn);
                for id in &ids {
                    conn.batch_execute(&format!("KILL {id}"))
                        .unwrap_or_else(|e| panic!("KILL {id}: {e}"));
                }
                // A killed connection lingers in the processlist until its thread has closed it;
                // the worker resumes only once it is gone.
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let left: Vec<i64> = connections(&mut conn)
                        .into_iter()
                        .filter(|id| ids.contains(id))
                        .collect();
                    if left.is_empty() {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "MariaDB still lists the killed connections {left:?} of {} after 10 s",
                        self.name
                    );
                    std::thread::sleep(Duration::from_millis(10));
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
    let bodies: Vec<String> = messages
        .iter()
        .map(|(job_id, copy)| {
            format!("{{\"job_id\":\"{job_id}\",\"amount\":100,\"copy\":\"{copy}\"}}")
        })
        .collect();
    publish_bodies(queue, &bodies);
}

/// Publishes each body as it is, with publisher confirms.
fn publish_bodies(queue: &str, bodies: &[String]) {
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
        for chunk in bodies.chunks(500) {
            let mut confirms = Vec::new();
            for body in chunk {
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
    let rebuild = "`cargo test --all-features` builds it, `cargo test --test chaos` does not: \
                   run `cargo build --all-features --example rabbitmq_worker` (scripts/test does)";
    let built = std::fs::metadata(&worker)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}; {rebuild}", worker.display()));
    // The test and the worker's protocol change together; a stale worker would test old code.
    let source =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rabbitmq_worker.rs");
    let edited = std::fs::metadata(&source)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    assert!(
        built >= edited,
        "{} is older than {}; {rebuild}",
        worker.display(),
        source.display()
    );
    worker
}

/// How long one step may take: a worker reaching a chosen job, a fault's effect showing. Generous,
/// so that a loaded machine makes a run slower, not red; a step that does not happen fails, saying
/// what was expected and what the workers said instead.
const STEP: Duration = Duration::from_secs(60);

/// What a worker's reader thread sends once the worker's stdout closes: the worker has exited.
const EXITED: &str = "(stdout closed: the worker exited)";

/// Worker processes and their output, line by line.
struct Workers {
    db_url: String,
    queue: String,
    env: Vec<(String, String)>,
    /// Where the workers record the chosen jobs that have paused (`IDEMPOTENT_CHAOS_PAUSED_DIR`),
    /// so that a redelivered job does not pause again.
    paused_dir: PathBuf,
    children: HashMap<usize, Child>,
    /// Per worker: its stdin, where a line lets it go on from a pause.
    stdins: HashMap<usize, ChildStdin>,
    /// Per worker: whether it has said `STARTING`, i.e. handles SIGTERM.
    handling_signals: HashMap<usize, Arc<AtomicBool>>,
    lines: Receiver<(usize, String)>,
    sender: Sender<(usize, String)>,
    next: usize,
    /// The last lines read, for the message of a step that did not happen.
    recent: VecDeque<(usize, String)>,
    /// The workers the test SIGKILLed: held at a pause, they must say nothing more.
    killed: HashSet<usize>,
}

impl Workers {
    fn new(db: &Db, queue: &str, env: &[(&str, &str)]) -> Workers {
        let (sender, lines) = channel();
        let paused_dir = std::env::temp_dir().join(format!("{queue}-paused"));
        std::fs::create_dir_all(&paused_dir)
            .unwrap_or_else(|e| panic!("creating {}: {e}", paused_dir.display()));
        Workers {
            db_url: db.url.clone(),
            queue: queue.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            paused_dir,
            children: HashMap::new(),
            stdins: HashMap::new(),
            handling_signals: HashMap::new(),
            lines,
            sender,
            next: 0,
            recent: VecDeque::new(),
            killed: HashSet::new(),
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
            .env("IDEMPOTENT_CHAOS_PAUSED_DIR", &self.paused_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.stderr_path(id)).expect("a worker log"));
        for (name, value) in &self.env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("starting a worker");
        let stdout = child.stdout.take().expect("worker stdout");
        let stdin = child.stdin.take().expect("worker stdin");
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
                    return;
                }
            }
            let _ = sender.send((id, EXITED.to_owned()));
        });
        self.children.insert(id, child);
        self.stdins.insert(id, stdin);
        id
    }

    /// Where worker `id` writes its errors.
    fn stderr_path(&self, id: usize) -> PathBuf {
        std::env::temp_dir().join(format!("{}-worker-{id}.log", self.queue))
    }

    /// Lets worker `id`, held at a pause, go on.
    fn resume(&mut self, id: usize) {
        let stdin = self
            .stdins
            .get_mut(&id)
            .unwrap_or_else(|| panic!("worker {id} is not running"));
        writeln!(stdin, "go")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("telling worker {id} to go on: {e}"));
    }

    /// SIGKILLs worker `id` and reaps it. Its stdin is closed only after it is dead: an end of
    /// stdin lets a paused worker go on, and it would ack the job the test meant to kill it on.
    fn kill(&mut self, id: usize) {
        self.handling_signals.remove(&id);
        if let Some(mut child) = self.children.remove(&id) {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.stdins.remove(&id);
        self.killed.insert(id);
    }

    /// Reads the workers' lines into `figures` until `done` holds of them. Fails, saying `what` did
    /// not happen and what the workers said last, after `limit` or as soon as a worker the test did
    /// not stop exits.
    fn until(
        &mut self,
        figures: &mut Figures,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&Figures) -> bool,
    ) {
        self.until_with(figures, what, limit, &mut done, |_, _, _| {});
    }

    /// `until`, calling `on_line` with each line and who said it after `figures` has read it.
    fn until_with(
        &mut self,
        figures: &mut Figures,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&Figures) -> bool,
        mut on_line: impl FnMut(&mut Workers, usize, &str),
    ) {
        let deadline = Instant::now() + limit;
        while !done(figures) {
            let wait = deadline.saturating_duration_since(Instant::now());
            let Ok((worker, line)) = self.lines.recv_timeout(wait) else {
                panic!(
                    "expected {what}, and it did not happen within {limit:?}. So far: {}. The last lines seen:{}",
                    figures.summary(),
                    self.seen()
                );
            };
            if self.recent.len() == 30 {
                self.recent.pop_front();
            }
            self.recent.push_back((worker, line.clone()));
            if line == EXITED && self.children.contains_key(&worker) {
                panic!(
                    "worker {worker} exited by itself while the test expected {what}. Its stderr ({}):\n{}\nThe last lines seen:{}",
                    self.stderr_path(worker).display(),
                    std::fs::read_to_string(self.stderr_path(worker)).unwrap_or_default(),
                    self.seen()
                );
            }
            assert!(
                line == EXITED || !self.killed.contains(&worker),
                "worker {worker} went on after the test killed it at a pause, saying {line:?}. The last lines seen:{}",
                self.seen()
            );
            figures.read(worker, &line);
            on_line(self, worker, &line);
        }
    }

    fn seen(&self) -> String {
        if self.recent.is_empty() {
            return " none".to_owned();
        }
        self.recent
            .iter()
            .map(|(worker, line)| format!("\n  worker {worker}: {line}"))
            .collect()
    }

    /// Reads lines until every published `(job, copy)` is acknowledged.
    fn until_all_acked(
        &mut self,
        figures: &mut Figures,
        copies: &[(String, String)],
        limit: Duration,
    ) {
        self.until_all_acked_with(figures, copies, limit, |_, _, _| {});
    }

    /// `until_all_acked`, calling `on_line` with each line and who said it.
    fn until_all_acked_with(
        &mut self,
        figures: &mut Figures,
        copies: &[(String, String)],
        limit: Duration,
        on_line: impl FnMut(&mut Workers, usize, &str),
    ) {
        figures.published = copies.iter().map(|(_, copy)| copy.clone()).collect();
        self.until_with(
            figures,
            &format!("`ACKED <copy>` for all {} published copies", copies.len()),
            limit,
            |figures| figures.acked.len() >= figures.published.len(),
            on_line,
        );
    }

    /// SIGTERM to every worker; each must stop by itself and exit 0, even one still starting. (A
    /// worker just spawned is given until it says `STARTING`: no process handles a signal before
    /// it has installed its handler.)
    fn stop_all(&mut self) -> usize {
        let mut stopped = 0;
        self.stdins.clear();
        let children: Vec<(usize, Child)> = self.children.drain().collect();
        for (id, mut child) in children {
            let handling = Arc::clone(&self.handling_signals[&id]);
            let deadline = Instant::now() + STEP;
            while !handling.load(Ordering::SeqCst) && child.try_wait().ok().flatten().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "worker {id} did not say STARTING within {STEP:?}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let deadline = Instant::now() + STEP;
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
                assert!(
                    Instant::now() < deadline,
                    "worker {id} was still running {STEP:?} after SIGTERM"
                );
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
        self.stdins.clear();
        let _ = std::fs::remove_dir_all(&self.paused_dir);
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
    replayed_per_job: HashMap<String, u64>,
    failed_per_job: HashMap<String, u64>,
    acked: HashSet<String>,
    /// `(worker, point, job)` for each pause, in the order they were said.
    paused: Vec<(usize, String, String)>,
    /// Every line, by worker.
    said: HashMap<usize, Vec<String>>,
    /// The copies published, once a test waits for them to be acknowledged.
    published: Vec<String>,
}

impl Figures {
    fn read(&mut self, worker: usize, line: &str) {
        self.said.entry(worker).or_default().push(line.to_owned());
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["OUTCOME", job, _copy, outcome, redelivered] => {
                self.outcomes += 1;
                if *outcome == "ran" {
                    self.ran += 1;
                    *self.ran_per_job.entry((*job).to_owned()).or_default() += 1;
                } else {
                    self.replays += 1;
                    *self.replayed_per_job.entry((*job).to_owned()).or_default() += 1;
                }
                if *redelivered == "redelivered=true" {
                    self.redelivered += 1;
                }
            }
            ["ACKED", copy] => {
                self.acked.insert((*copy).to_owned());
            }
            ["FAILED", job, ..] => {
                self.failed += 1;
                *self.failed_per_job.entry((*job).to_owned()).or_default() += 1;
            }
            ["RECONNECTED"] => self.reconnects += 1,
            [point @ ("PAUSE-MID-JOB" | "PAUSE-BEFORE-ACK"), job] => {
                self.paused
                    .push((worker, (*point).to_owned(), (*job).to_owned()));
            }
            _ => {}
        }
    }

    /// For failure messages: what every worker said about `job`, in order, by worker.
    fn lines_about(&self, job: &str) -> Vec<String> {
        let mut about = Vec::new();
        for (worker, said) in &self.said {
            for line in said {
                if line.split_whitespace().any(|word| {
                    word == job
                        || word
                            .strip_suffix(":")
                            .unwrap_or(word)
                            .starts_with(&format!("{job}#"))
                }) {
                    about.push(format!("worker {worker}: {line}"));
                }
            }
        }
        about
    }

    /// For failure messages: the first `FAILED` lines, by worker.
    fn failures(&self) -> Vec<String> {
        let mut failures: Vec<String> = self
            .said
            .iter()
            .flat_map(|(worker, said)| {
                said.iter()
                    .filter(|line| line.starts_with("FAILED "))
                    .map(move |line| format!("worker {worker}: {line}"))
            })
            .collect();
        failures.truncate(10);
        failures
    }

    /// For failure messages: the counts, not every job.
    fn summary(&self) -> String {
        let unacked: Vec<&String> = self
            .published
            .iter()
            .filter(|copy| !self.acked.contains(*copy))
            .take(10)
            .collect();
        format!(
            "outcomes {}, ran {}, replays {}, redelivered {}, failed {}, reconnects {}, acked {} (not yet, at most 10: {unacked:?}), paused {:?}",
            self.outcomes,
            self.ran,
            self.replays,
            self.redelivered,
            self.failed,
            self.reconnects,
            self.acked.len(),
            self.paused
        )
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

// ---- the tests -----------------------------------------------------------------------------------

/// 2,000 jobs, 200 of them published twice, four workers, and 24 SIGKILLs at jobs the test chose:
/// 12 inside the job's transaction, 12 between its commit and its ack. Each chosen job pauses once
/// at its point and the test kills the worker holding it, so the kills, and the replays they cause,
/// are the same in every run.
fn chaos(server: Server) {
    const JOBS: usize = 2_000;
    const DUPLICATES: usize = 200;
    const WORKERS: usize = 4;
    let _serial = serial();
    let db = Db::fresh(server);
    let queue = unique("idempotent_chaos");
    let messages = jobs_with_duplicates("job", JOBS, DUPLICATES);
    publish(&queue, &messages);

    // Spread over the run; job-7, job-173 and job-90 are among those published twice.
    let mid_job: BTreeSet<String> = (0..12).map(|i| format!("job-{}", 7 + i * 166)).collect();
    let before_ack: BTreeSet<String> = (0..12).map(|i| format!("job-{}", 90 + i * 166)).collect();
    let list = |jobs: &BTreeSet<String>| jobs.iter().cloned().collect::<Vec<_>>().join(",");
    let mut workers = Workers::new(
        &db,
        &queue,
        &[
            ("PREFETCH", "8"),
            ("IDEMPOTENT_CHAOS_PAUSE_MID_JOB", &list(&mid_job)),
            ("IDEMPOTENT_CHAOS_PAUSE_BEFORE_ACK", &list(&before_ack)),
        ],
    );
    for _ in 0..WORKERS {
        workers.start();
    }
    let started = Instant::now();
    let mut figures = Figures::default();
    let (mut killed_mid_job, mut killed_before_ack) = (BTreeSet::new(), BTreeSet::new());
    workers.until_all_acked_with(
        &mut figures,
        &messages,
        Duration::from_secs(300),
        |workers, worker, line| {
            let (killed, chosen, job) = match line.split_once(' ') {
                Some(("PAUSE-MID-JOB", job)) => (&mut killed_mid_job, &mid_job, job),
                Some(("PAUSE-BEFORE-ACK", job)) => (&mut killed_before_ack, &before_ack, job),
                _ => return,
            };
            assert!(
                chosen.contains(job),
                "worker {worker} paused at a job the test did not choose: {line}"
            );
            assert!(
                killed.insert(job.to_owned()),
                "a redelivered job paused again: worker {worker} said {line}"
            );
            // A SIGKILL while the job is held at that point, and a worker in its place.
            workers.kill(worker);
            workers.start();
        },
    );
    let stopped = workers.stop_all();
    let elapsed = started.elapsed();
    delete_queue(&queue);

    let (effects, done) = db.effects();
    figures::report(&format!(
        "chaos ({server:?}): jobs {JOBS}, duplicate publishes {DUPLICATES}, workers {WORKERS} (+{} replacements), \
         kills {} ({} mid-job, {} between commit and ack), deliveries handled {}, \
         redelivered {}, replays {}, ran {}, effects {}, done jobs {done}, in {elapsed:.1?}",
        workers.next - WORKERS,
        killed_mid_job.len() + killed_before_ack.len(),
        killed_mid_job.len(),
        killed_before_ack.len(),
        figures.outcomes,
        figures.redelivered,
        figures.replays,
        figures.ran,
        effects.values().sum::<i64>(),
    ));
    assert_eq!(
        killed_mid_job, mid_job,
        "every job chosen to be killed mid-job was"
    );
    assert_eq!(
        killed_before_ack, before_ack,
        "every job chosen to be killed between commit and ack was"
    );
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
    // Each copy published twice replays once, and each job killed between its commit and its ack
    // replays once more, on redelivery; no other delivery replays.
    let mut expected_replays: BTreeMap<String, u64> =
        (0..DUPLICATES).map(|i| (format!("job-{i}"), 1)).collect();
    for job in &before_ack {
        *expected_replays.entry(job.clone()).or_default() += 1;
    }
    let replays: BTreeMap<String, u64> = figures
        .replayed_per_job
        .iter()
        .map(|(job, n)| (job.clone(), *n))
        .collect();
    let differing: Vec<String> = expected_replays
        .keys()
        .chain(replays.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|job| expected_replays.get(*job) != replays.get(*job))
        .map(|job| {
            format!(
                "{job}: replayed {} times, expected {}; it said: {:?}",
                replays.get(job).unwrap_or(&0),
                expected_replays.get(job).unwrap_or(&0),
                figures.lines_about(job)
            )
        })
        .collect();
    assert!(
        differing.is_empty(),
        "every duplicate publish and every redelivery of a committed job replayed, nothing else:\n{}",
        differing.join("\n")
    );
    assert_eq!(figures.replays, (DUPLICATES + before_ack.len()) as u64);
    assert_eq!(
        figures.failed,
        0,
        "a killed worker's job fails nowhere else: {:#?}",
        figures.failures()
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
/// queue, and is done once after its redelivery; the worker reconnects instead of dying. The
/// worker holds each of four chosen jobs inside its transaction while the test terminates its
/// connection, then goes on into the dead connection.
fn terminated_connections(server: Server) {
    const JOBS: usize = 60;
    let chosen: BTreeSet<String> = ["fault-0", "fault-21", "fault-38", "fault-59"]
        .map(str::to_owned)
        .into();
    let _serial = serial();
    let db = Db::fresh(server);
    let queue = unique("idempotent_faults");
    let messages = jobs_with_duplicates("fault", JOBS, 0);
    publish(&queue, &messages);
    let list = chosen.iter().cloned().collect::<Vec<_>>().join(",");
    let mut workers = Workers::new(
        &db,
        &queue,
        &[("PREFETCH", "4"), ("IDEMPOTENT_CHAOS_PAUSE_MID_JOB", &list)],
    );
    let worker = workers.start();
    let mut figures = Figures::default();
    let mut terminated = BTreeSet::new();
    for n in 0..chosen.len() {
        workers.until(
            &mut figures,
            &format!("worker {worker} to pause (`PAUSE-MID-JOB <job>`) at the next of {chosen:?}"),
            STEP,
            |figures| figures.paused.len() > n,
        );
        let (_, _, job) = figures.paused[n].clone();
        assert!(
            chosen.contains(&job) && terminated.insert(job.clone()),
            "worker {worker} paused at {job}, which is not one of {chosen:?} or paused before"
        );
        assert_eq!(
            db.terminate_worker_connections(),
            1,
            "the worker's one connection, inside {job}'s transaction, terminated"
        );
        workers.resume(worker);
        workers.until(
            &mut figures,
            &format!("worker {worker} to say `FAILED {job} ...` and then `RECONNECTED`"),
            STEP,
            |figures| figures.failed_per_job.contains_key(&job) && figures.reconnects > n as u64,
        );
    }
    workers.until_all_acked(&mut figures, &messages, Duration::from_secs(120));
    assert_eq!(
        workers.stop_all(),
        1,
        "the worker survived every termination"
    );
    delete_queue(&queue);
    let (effects, _) = db.effects();
    figures::report(&format!(
        "terminated connections ({server:?}): jobs {JOBS}, terminations {}, failed jobs {}, reconnects {}, effects {}",
        terminated.len(),
        figures.failed,
        figures.reconnects,
        effects.values().sum::<i64>()
    ));
    assert_eq!(terminated, chosen);
    for job in &chosen {
        assert_eq!(
            figures.failed_per_job.get(job),
            Some(&1),
            "{job} failed once, when its connection was terminated, and went back to the queue"
        );
    }
    assert_eq!(
        figures.failed,
        chosen.len() as u64,
        "no other job failed: {:#?}",
        figures.failures()
    );
    assert_eq!(
        figures.reconnects,
        chosen.len() as u64,
        "one reconnect per termination"
    );
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

/// PostgreSQL restarts while two workers each hold a job inside its transaction: those two jobs
/// roll back and are done once after redelivery, both workers reconnect, and the run completes.
#[test]
fn postgres_restart_during_a_run() {
    const JOBS: usize = 400;
    let chosen: BTreeSet<String> = ["restart-200", "restart-201"].map(str::to_owned).into();
    let _serial = serial();
    let db = Db::fresh(Server::Postgres);
    let queue = unique("idempotent_restart");
    let messages = jobs_with_duplicates("restart", JOBS, 0);
    publish(&queue, &messages);
    // One unacknowledged message per worker: the worker held at restart-200 is given nothing more,
    // so restart-201 goes to the other one, and both are inside a transaction at the restart.
    let list = chosen.iter().cloned().collect::<Vec<_>>().join(",");
    let mut workers = Workers::new(
        &db,
        &queue,
        &[("PREFETCH", "1"), ("IDEMPOTENT_CHAOS_PAUSE_MID_JOB", &list)],
    );
    workers.start();
    workers.start();
    let mut figures = Figures::default();
    workers.until(
        &mut figures,
        &format!("both workers to pause (`PAUSE-MID-JOB <job>`), at {chosen:?}"),
        STEP,
        |figures| figures.paused.len() == chosen.len(),
    );
    let held: BTreeMap<usize, String> = figures
        .paused
        .iter()
        .map(|(worker, _, job)| (*worker, job.clone()))
        .collect();
    assert_eq!(
        held.len(),
        2,
        "each worker holds one of the chosen jobs: {:?}",
        figures.paused
    );
    assert_eq!(held.values().cloned().collect::<BTreeSet<_>>(), chosen);

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
    let restart_took = started.elapsed();
    for worker in held.keys() {
        workers.resume(*worker);
    }
    workers.until(
        &mut figures,
        &format!("each worker of {held:?} to say `FAILED <its job> ...` and then `RECONNECTED`"),
        STEP,
        |figures| {
            chosen
                .iter()
                .all(|job| figures.failed_per_job.contains_key(job))
                && figures.reconnects >= 2
        },
    );
    workers.until_all_acked(&mut figures, &messages, Duration::from_secs(180));
    assert_eq!(workers.stop_all(), 2, "both workers survived the restart");
    delete_queue(&queue);
    let (effects, _) = db.effects();
    figures::report(&format!(
        "postgres restart: jobs {JOBS}, in flight at the restart {}, restart took {restart_took:.1?}, failed jobs {}, reconnects {}, effects {}",
        held.len(),
        figures.failed,
        figures.reconnects,
        effects.values().sum::<i64>()
    ));
    for job in &chosen {
        assert_eq!(
            figures.failed_per_job.get(job),
            Some(&1),
            "{job}, in flight at the restart, failed once and went back to the queue"
        );
    }
    assert_eq!(
        figures.failed,
        2,
        "no job failed but the two in flight: {:#?}",
        figures.failures()
    );
    assert_eq!(figures.reconnects, 2, "each worker reconnected once");
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
    // The worker retries an unreachable database for as long as it takes (it never gives up), so
    // an exit 0 that says it stopped before taking any work, with no READY, can only come from
    // the signal: no duration to measure (stop_all fails the test if it is still running a
    // minute after SIGTERM).
    assert_eq!(workers.stop_all(), 1);
    // Its last lines may still be on their way from the pipe's reader thread.
    let mut figures = Figures::default();
    workers.until(
        &mut figures,
        &format!("the end of worker {id}'s output"),
        STEP,
        |figures| {
            figures
                .said
                .get(&id)
                .is_some_and(|said| said.iter().any(|l| l == EXITED))
        },
    );
    let said = &figures.said[&id];
    assert!(
        said.iter().any(|l| l == "STOPPED before taking any work"),
        "{said:?}"
    );
    assert!(!said.iter().any(|l| l == "READY"), "{said:?}");
}

/// Takes every message from `queue`: its body and its `x-error` header.
fn take_all(queue: &str) -> Vec<(String, String)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let amqp = Amqp::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ");
        let channel = amqp.create_channel().await.expect("channel");
        let mut taken = Vec::new();
        while let Some(message) = channel
            .basic_get(
                queue.into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap_or_else(|e| panic!("reading {queue}: {e}"))
        {
            let error = message
                .delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|headers| headers.inner().get("x-error").cloned())
                .map(|value| match value {
                    lapin::types::AMQPValue::LongString(text) => text.to_string(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            taken.push((
                String::from_utf8_lossy(&message.delivery.data).into_owned(),
                error,
            ));
        }
        let _ = amqp.close(200, "done".into()).await;
        taken
    })
}

/// A job that can never succeed (the same job id again with another amount, which the handler's
/// fingerprint refuses: `Error::is_retryable()` is false) goes to the dead-letter queue once, with
/// its error, and is acknowledged; the worker goes on with the next job. Before, it was requeued
/// for ever.
#[test]
fn poison_messages_go_to_the_dead_letter_queue() {
    let _serial = serial();
    let db = Db::fresh(Server::Postgres);
    let queue = unique("idempotent_poison");
    let dead = format!("{queue}.dead-letter");
    let body = |job: &str, amount: i64, copy: &str| {
        format!("{{\"job_id\":\"{job}\",\"amount\":{amount},\"copy\":\"{copy}\"}}")
    };
    publish_bodies(
        &queue,
        &[
            body("p1", 100, "p1"),
            body("p1", 250, "p1-other-amount"),
            body("p2", 100, "p2"),
        ],
    );
    let mut workers = Workers::new(&db, &queue, &[]);
    let id = workers.start();
    let mut figures = Figures::default();
    workers.until(
        &mut figures,
        "p1 and p2 acknowledged and the other p1 dead-lettered",
        STEP,
        |figures| {
            figures.said.get(&id).is_some_and(|said| {
                said.iter()
                    .any(|l| l.starts_with("DEAD-LETTERED p1 p1-other-amount"))
                    && said.iter().any(|l| l == "ACKED p1")
                    && said.iter().any(|l| l == "ACKED p2")
            })
        },
    );
    assert_eq!(workers.stop_all(), 1);
    let said = &figures.said[&id];
    assert_eq!(
        said.iter()
            .filter(|l| l.starts_with("DEAD-LETTERED"))
            .count(),
        1,
        "dead-lettered once, not looping: {said:?}"
    );
    assert!(!said.iter().any(|l| l.starts_with("FAILED")), "{said:?}");
    let letters = take_all(&dead);
    delete_queue(&dead);
    delete_queue(&queue);
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(letters[0].0.contains("\"amount\":250"), "{letters:?}");
    assert!(
        letters[0].1.contains("other values of its inputs (amount)"),
        "{letters:?}"
    );
    let (per_job, done) = db.effects();
    assert_eq!(done, 2, "two jobs done: {per_job:?}");
    assert_eq!(per_job.get("p1"), Some(&1));
    assert_eq!(per_job.get("p2"), Some(&1));
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
    workers.until_all_acked(&mut figures, &messages, Duration::from_secs(300));
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
        figures.failed,
        0,
        "no error (deadlocks included) reached a worker: {:#?}",
        figures.failures()
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
