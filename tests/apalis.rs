//! The apalis worker (`examples/apalis_worker.rs`: apalis 1.0 on Redis, its Diesel handler an
//! `#[idempotent_job]`) run as separate processes against real Redis and PostgreSQL, under the two
//! ways apalis delivers a job twice:
//!
//! * the same job pushed twice: one run, one replay, one effect;
//! * a worker SIGKILLed between the job's commit and apalis's acknowledgement: the task stays in
//!   the dead worker's in-flight set until another worker, at a heartbeat, finds the dead one
//!   silent for longer than the orphan timeout and re-enqueues its tasks. That worker's delivery
//!   replays: still one effect.
//!
//! The kill lands where the test chose: the worker pauses after the commit (before its handler
//! returns, so before the acknowledgement is written) and waits on its stdin while the test kills
//! it. Every wait is bounded and fails saying what did not happen and what the workers said.
//!
//! Each test has its own PostgreSQL schema and apalis namespace (Redis keys `<namespace>:*`),
//! removed at the end. Needs Redis at `REDIS_URL` (default `redis://127.0.0.1:6379`) and
//! PostgreSQL at `IDEMPOTENT_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`);
//! `scripts/test` starts both. The worker binary must be built: `cargo test --all-features` builds
//! it, `cargo test --test apalis` does not.

use std::future::Future;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use apalis::prelude::{FetchById as _, Status, TaskBuilder, TaskId, TaskSink as _};
use apalis_redis::{Config, RedisStorage};
use diesel::QueryDsl as _;
use diesel_async::{
    AsyncConnection as _, AsyncPgConnection, RunQueryDsl as _, SimpleAsyncConnection as _,
};
use serde::{Deserialize, Serialize};

#[path = "support/figures.rs"]
mod figures;
#[path = "support/names.rs"]
mod names;

/// How long one step may take: a worker starting, a task reaching a worker, a dead worker's task
/// coming back. Generous, so that a loaded machine makes a run slower, not red.
const STEP: Duration = Duration::from_secs(60);

/// The worker's liveness settings in these tests (the example's defaults, set here so that the
/// figures say what they were): a dead worker's tasks are re-enqueued once it has been silent for
/// `HEARTBEAT_SECS × MISSED_HEARTBEATS` seconds, at another worker's next heartbeat.
const HEARTBEAT_SECS: u64 = 1;
const MISSED_HEARTBEATS: u64 = 3;

/// A task as the worker reads it: the same JSON (apalis-redis's codec).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    job_id: String,
    amount: i64,
}

use names::unique_name as unique;

fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

// ---- PostgreSQL ---------------------------------------------------------------------------------

/// A schema of this test's own; the workers' connections use it through `search_path`.
struct Schema {
    name: String,
    base: String,
    /// What the workers connect to.
    url: String,
}

impl Schema {
    fn fresh() -> Schema {
        let base = std::env::var("IDEMPOTENT_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let name = unique("idempotent_apalis");
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-csearch_path%3D{name}");
        let schema = Schema { name, base, url };
        schema.admin(&format!("CREATE SCHEMA {}", schema.name));
        schema
    }

    /// Runs SQL on the shared database, failing with how to start PostgreSQL if it is not there.
    fn admin(&self, sql: &str) {
        block_on(async {
            let mut conn = tokio::time::timeout(
                Duration::from_secs(10),
                AsyncPgConnection::establish(&self.base),
            )
            .await
            .map_err(|_| "no answer within 10 s".to_owned())
            .and_then(|conn| conn.map_err(|e| e.to_string()))
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is not reachable at {}: {e}. Start it with \
                     `pg_ctlcluster --skip-systemctl-redirect 15 main start` (scripts/test does \
                     this), or set IDEMPOTENT_POSTGRES_URL.",
                    self.base
                )
            });
            conn.batch_execute(sql)
                .await
                .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
        });
    }

    /// The rows in `effects` for `job_id`, and the rows in `done_jobs`.
    fn counts(&self, job_id: &str) -> (i64, i64) {
        #[derive(diesel::QueryableByName)]
        struct Count {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        block_on(async {
            let mut conn = AsyncPgConnection::establish(&self.url)
                .await
                .unwrap_or_else(|e| panic!("PostgreSQL at {}: {e}", self.url));
            let effects: Count =
                diesel::sql_query("SELECT COUNT(*) AS n FROM effects WHERE job_id = $1")
                    .bind::<diesel::sql_types::Text, _>(job_id)
                    .get_result(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("counting the effects in {}: {e}", self.name));
            let done: i64 = idempotent_jobs::schema::done_jobs::table
                .count()
                .get_result(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("counting done_jobs in {}: {e}", self.name));
            (effects.n, done)
        })
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        block_on(async {
            if let Ok(mut conn) = AsyncPgConnection::establish(&self.base).await {
                let _ = conn.batch_execute(&sql).await;
            }
        });
    }
}

// ---- Redis and apalis ---------------------------------------------------------------------------

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A reply of Redis's protocol (RESP2).
#[derive(Debug)]
enum Reply {
    Status,
    Int(i64),
    Bulk(Option<String>),
    Array(Vec<Reply>),
}

/// Just enough of a Redis client to check that the server is there and to remove a namespace's
/// keys, which apalis-redis has no call for. Pushing and reading tasks go through apalis-redis.
struct RedisConn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl RedisConn {
    /// Connects to `REDIS_URL` (`redis://[[user]:password@]host[:port][/db]`).
    fn open() -> Result<RedisConn, String> {
        let url = redis_url();
        let rest = url
            .strip_prefix("redis://")
            .ok_or_else(|| format!("REDIS_URL={url}: this test speaks only redis:// URLs"))?;
        let rest = rest.split('?').next().unwrap_or(rest);
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let (host, db) = match rest.split_once('/') {
            Some((host, db)) => (host, (!db.is_empty()).then_some(db)),
            None => (rest, None),
        };
        let host = if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:6379")
        };
        let address = host
            .to_socket_addrs()
            .map_err(|e| format!("{host}: {e}"))?
            .next()
            .ok_or_else(|| format!("{host}: no address"))?;
        let stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))
            .map_err(|e| format!("{host}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let mut conn = RedisConn {
            reader: BufReader::new(stream.try_clone().map_err(|e| e.to_string())?),
            writer: stream,
        };
        if let Some((user, password)) = auth.and_then(|auth| auth.split_once(':')) {
            if user.is_empty() {
                conn.call(&["AUTH", password])?;
            } else {
                conn.call(&["AUTH", user, password])?;
            }
        }
        if let Some(db) = db {
            conn.call(&["SELECT", db])?;
        }
        Ok(conn)
    }

    fn call(&mut self, args: &[&str]) -> Result<Reply, String> {
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        self.writer
            .write_all(request.as_bytes())
            .map_err(|e| format!("sending {args:?}: {e}"))?;
        self.reply().map_err(|e| format!("{args:?}: {e}"))
    }

    fn reply(&mut self) -> Result<Reply, String> {
        let mut line = String::new();
        self.reader
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let line = line.trim_end_matches(['\r', '\n']);
        let Some(kind) = line.chars().next() else {
            return Err("the connection closed".to_owned());
        };
        let rest = &line[1..];
        let number = || {
            rest.parse::<i64>()
                .map_err(|_| format!("not a number: {line:?}"))
        };
        match kind {
            '+' => Ok(Reply::Status),
            '-' => Err(rest.to_owned()),
            ':' => Ok(Reply::Int(number()?)),
            '$' => {
                let Ok(len) = usize::try_from(number()?) else {
                    return Ok(Reply::Bulk(None));
                };
                let mut bytes = vec![0; len + 2];
                self.reader
                    .read_exact(&mut bytes)
                    .map_err(|e| e.to_string())?;
                bytes.truncate(len);
                Ok(Reply::Bulk(Some(
                    String::from_utf8_lossy(&bytes).into_owned(),
                )))
            }
            '*' => {
                let len = usize::try_from(number()?).unwrap_or(0);
                (0..len)
                    .map(|_| self.reply())
                    .collect::<Result<_, _>>()
                    .map(Reply::Array)
            }
            _ => Err(format!("unexpected reply {line:?}")),
        }
    }
}

/// An apalis-redis namespace of this test's own (the worker's `QUEUE`).
struct Namespace {
    name: String,
}

impl Namespace {
    fn fresh(tag: &str) -> Namespace {
        let pong = RedisConn::open().and_then(|mut redis| redis.call(&["PING"]));
        if let Err(e) = pong {
            panic!(
                "Redis is not reachable at {}: {e}. Start it with `redis-server --daemonize yes` \
                 (scripts/test does this), or set REDIS_URL.",
                redis_url()
            );
        }
        Namespace {
            name: unique(&format!("idempotent_apalis_{tag}")),
        }
    }

    /// apalis-redis's storage on this namespace, as the worker builds it.
    async fn storage(&self) -> RedisStorage<Payment> {
        let conn = apalis_redis::connect(redis_url())
            .await
            .unwrap_or_else(|e| panic!("Redis at {}: {e}", redis_url()));
        RedisStorage::new(conn).with_config(Config::default().queue(&self.name))
    }

    /// Pushes each `(task id, job id, amount)` with apalis-redis, the way a producer does.
    fn push(&self, tasks: &[(&str, &str, i64)]) {
        block_on(async {
            let mut storage = self.storage().await;
            for (task_id, job_id, amount) in tasks {
                let payment = Payment {
                    job_id: (*job_id).to_owned(),
                    amount: *amount,
                };
                let task = TaskBuilder::new(payment)
                    .task_id(TaskId::from_string(*task_id))
                    .build();
                storage
                    .push_task(task)
                    .await
                    .unwrap_or_else(|e| panic!("pushing task {task_id}: {e}"));
            }
        });
    }

    /// What apalis-redis has on a task: its status, and the worker holding it.
    fn task(&self, task_id: &str) -> (Status, Option<String>) {
        block_on(async {
            let task = self
                .storage()
                .await
                .fetch_by_id(&TaskId::from_string(task_id))
                .await
                .unwrap_or_else(|e| panic!("reading task {task_id}: {e}"))
                .unwrap_or_else(|| panic!("apalis-redis has no task {task_id}"));
            (task.ctx().status(), task.ctx().lock_by().map(str::to_owned))
        })
    }

    /// Waits until apalis-redis has `status` for the task (its acknowledgement is written after
    /// the handler returns, by the worker's next poll of Redis).
    fn until_status(&self, task_id: &str, status: &Status) {
        let deadline = Instant::now() + STEP;
        loop {
            let (now, by) = self.task(task_id);
            if now == *status {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "apalis-redis still has task {task_id} {now:?} (held by {by:?}) after {STEP:?}, \
                 expected {status:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the task is a member of the set `<namespace>:<set>` (`done`, `dead`).
    fn in_set(&self, set: &str, task_id: &str) -> bool {
        let key = format!("{}:{set}", self.name);
        match RedisConn::open().and_then(|mut redis| redis.call(&["SISMEMBER", &key, task_id])) {
            Ok(Reply::Int(n)) => n == 1,
            other => panic!("SISMEMBER {key} {task_id}: {other:?}"),
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let Ok(mut redis) = RedisConn::open() else {
            return;
        };
        let pattern = format!("{}:*", self.name);
        let mut cursor = "0".to_owned();
        loop {
            let Ok(Reply::Array(reply)) =
                redis.call(&["SCAN", &cursor, "MATCH", &pattern, "COUNT", "1000"])
            else {
                return;
            };
            let mut reply = reply.into_iter();
            let (Some(Reply::Bulk(Some(next))), Some(Reply::Array(keys))) =
                (reply.next(), reply.next())
            else {
                return;
            };
            let keys: Vec<String> = keys
                .into_iter()
                .filter_map(|key| match key {
                    Reply::Bulk(Some(key)) => Some(key),
                    _ => None,
                })
                .collect();
            if !keys.is_empty() {
                let mut del = vec!["DEL"];
                del.extend(keys.iter().map(String::as_str));
                let _ = redis.call(&del);
            }
            if next == "0" {
                break;
            }
            cursor = next;
        }
        // apalis-redis lists every queue it has seen here.
        let workers = format!("{}:workers", self.name);
        let _ = redis.call(&["ZREM", "core:apalis:queues:list", &workers]);
    }
}

// ---- worker processes ---------------------------------------------------------------------------

fn worker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    let target = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let worker = target.join("examples").join("apalis_worker");
    let rebuild = "`cargo test --all-features` builds it, `cargo test --test apalis` does not: \
                   run `cargo build --all-features --example apalis_worker`";
    let built = std::fs::metadata(&worker)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}; {rebuild}", worker.display()));
    // The test and the worker's protocol change together; a stale worker would test old code.
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/apalis_worker.rs");
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

/// What a worker's reader thread sends once the worker's stdout closes: the worker has exited.
const EXITED: &str = "(stdout closed: the worker exited)";

/// Worker processes and everything they said, line by line. Dropping it kills what still runs.
struct Workers {
    db_url: String,
    namespace: String,
    children: Vec<Option<(Child, ChildStdin)>>,
    lines: Receiver<(usize, String)>,
    sender: Sender<(usize, String)>,
    /// Every line read so far, with who said it.
    seen: Vec<(usize, String)>,
}

impl Workers {
    fn new(schema: &Schema, namespace: &Namespace) -> Workers {
        let (sender, lines) = channel();
        Workers {
            db_url: schema.url.clone(),
            namespace: namespace.name.clone(),
            children: Vec::new(),
            lines,
            sender,
            seen: Vec::new(),
        }
    }

    /// Starts a worker with these extra variables; returns its number.
    fn start(&mut self, env: &[(&str, &str)]) -> usize {
        let id = self.children.len();
        let mut command = Command::new(worker_binary());
        command
            .env("DATABASE_URL", &self.db_url)
            .env("REDIS_URL", redis_url())
            .env("QUEUE", &self.namespace)
            .env("HEARTBEAT_SECS", HEARTBEAT_SECS.to_string())
            .env("MISSED_HEARTBEATS", MISSED_HEARTBEATS.to_string())
            .env_remove("IDEMPOTENT_PAUSE_BEFORE_ACK")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.stderr_path(id)).expect("a worker log"));
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("starting a worker");
        let stdout = child.stdout.take().expect("worker stdout");
        let stdin = child.stdin.take().expect("worker stdin");
        let sender = self.sender.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send((id, line)).is_err() {
                    return;
                }
            }
            let _ = sender.send((id, EXITED.to_owned()));
        });
        self.children.push(Some((child, stdin)));
        id
    }

    fn stderr_path(&self, id: usize) -> PathBuf {
        std::env::temp_dir().join(format!("{}-worker-{id}.log", self.namespace))
    }

    /// Reads lines until `done` holds of everything said so far. Fails, saying `what` did not
    /// happen and what the workers said, after `limit` or as soon as a running worker exits.
    fn until(
        &mut self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&[(usize, String)]) -> bool,
    ) {
        let deadline = Instant::now() + limit;
        while !done(&self.seen) {
            let wait = deadline.saturating_duration_since(Instant::now());
            let Ok((worker, line)) = self.lines.recv_timeout(wait) else {
                panic!(
                    "expected {what}, and it did not happen within {limit:?}.{}",
                    self.said()
                );
            };
            let running = self.children.get(worker).is_some_and(Option::is_some);
            self.seen.push((worker, line));
            if self.seen.last().is_some_and(|(_, line)| line == EXITED) && running {
                panic!(
                    "worker {worker} exited by itself while the test expected {what}.{}",
                    self.said()
                );
            }
        }
    }

    /// Waits for worker `id` to say `line`.
    fn until_said(&mut self, id: usize, line: &str) {
        self.until(&format!("worker {id} to say `{line}`"), STEP, |seen| {
            seen.iter().any(|(who, said)| *who == id && said == line)
        });
    }

    /// The `OUTCOME` lines said so far: `(worker, job id, ran|replayed)`.
    fn outcomes(&self) -> Vec<(usize, String, String)> {
        outcomes(&self.seen)
    }

    /// SIGKILLs worker `id` and reaps it. Its stdin is closed only once it is dead: an end of
    /// stdin lets a paused worker go on, and it would acknowledge the task it was killed on.
    fn kill(&mut self, id: usize) {
        if let Some((mut child, stdin)) = self.children[id].take() {
            let _ = child.kill();
            let _ = child.wait();
            drop(stdin);
        }
    }

    /// SIGTERMs worker `id` and waits for it to exit by itself.
    fn terminate(&mut self, id: usize) -> ExitStatus {
        let (mut child, stdin) = self.children[id].take().expect("a running worker");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + STEP;
        let status = loop {
            if let Some(status) = child.try_wait().expect("worker status") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "worker {id} was still running {STEP:?} after SIGTERM.{}",
                    self.said()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        drop(stdin);
        // Its last lines, `STOPPED` among them.
        while let Ok((worker, line)) = self.lines.recv_timeout(Duration::from_secs(5)) {
            let exited = worker == id && line == EXITED;
            self.seen.push((worker, line));
            if exited {
                break;
            }
        }
        status
    }

    /// Everything said, and each worker's stderr, for a failure's message.
    fn said(&self) -> String {
        let mut said = String::from(" The workers said:");
        for (worker, line) in &self.seen {
            said.push_str(&format!("\n  worker {worker}: {line}"));
        }
        for id in 0..self.children.len() {
            let stderr = std::fs::read_to_string(self.stderr_path(id)).unwrap_or_default();
            if !stderr.trim().is_empty() {
                said.push_str(&format!("\nworker {id}'s stderr:\n{stderr}"));
            }
        }
        said
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (mut child, _stdin) in self.children.iter_mut().filter_map(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
        if !std::thread::panicking() {
            for id in 0..self.children.len() {
                let _ = std::fs::remove_file(self.stderr_path(id));
            }
        }
    }
}

/// `(worker, job id, ran|replayed)` for each `OUTCOME <job_id> <ran|replayed> ...` line.
fn outcomes(seen: &[(usize, String)]) -> Vec<(usize, String, String)> {
    seen.iter()
        .filter_map(|(worker, line)| {
            let mut words = line.split_whitespace();
            (words.next() == Some("OUTCOME")).then(|| {
                let job = words.next().unwrap_or_default().to_owned();
                let outcome = words.next().unwrap_or_default().to_owned();
                (*worker, job, outcome)
            })
        })
        .collect()
}

fn stopped_cleanly(workers: &mut Workers, id: usize) {
    let status = workers.terminate(id);
    assert!(
        status.success(),
        "worker {id} exited {status} after SIGTERM.{}",
        workers.said()
    );
    assert!(
        workers
            .seen
            .iter()
            .any(|(who, line)| *who == id && line == "STOPPED"),
        "worker {id} exited without saying STOPPED.{}",
        workers.said()
    );
}

// ---- the tests ----------------------------------------------------------------------------------

/// The producer pushes the same payment twice: two apalis tasks, one effect. Then the same job id
/// with another amount: refused by the fingerprint, aborted, not retried by apalis.
#[test]
fn a_job_pushed_twice_runs_once() {
    let schema = Schema::fresh();
    let namespace = Namespace::fresh("twice");
    let mut workers = Workers::new(&schema, &namespace);

    namespace.push(&[("copy-1", "p-twice", 100), ("copy-2", "p-twice", 100)]);
    let worker = workers.start(&[]);
    workers.until(
        "two `OUTCOME p-twice` lines, one for each task",
        STEP,
        |seen| outcomes(seen).len() >= 2,
    );
    let mut said: Vec<String> = workers
        .outcomes()
        .into_iter()
        .map(|(_, job, outcome)| format!("{job} {outcome}"))
        .collect();
    said.sort();
    assert_eq!(
        said,
        ["p-twice ran", "p-twice replayed"],
        "one task ran and the other replayed.{}",
        workers.said()
    );
    assert_eq!(
        schema.counts("p-twice"),
        (1, 1),
        "one effect and one done_jobs row.{}",
        workers.said()
    );
    // apalis took both as successes: the replay is acknowledged like the run.
    for task in ["copy-1", "copy-2"] {
        namespace.until_status(task, &Status::Done);
        assert!(
            namespace.in_set("done", task),
            "{task} is in apalis's done set"
        );
    }

    // The same job id with another amount is a mistake, not a redelivery: the handler's error is
    // not retryable, the worker returns an AbortError, and apalis marks the task Killed (its dead
    // set) instead of scheduling it again.
    namespace.push(&[("copy-3", "p-twice", 999)]);
    workers.until("`ABORTED p-twice` for the other amount", STEP, |seen| {
        seen.iter()
            .any(|(_, line)| line.starts_with("ABORTED p-twice "))
    });
    namespace.until_status("copy-3", &Status::Killed);
    assert!(
        namespace.in_set("dead", "copy-3"),
        "copy-3 is in apalis's dead set"
    );
    assert_eq!(
        schema.counts("p-twice"),
        (1, 1),
        "the other amount changed nothing"
    );

    stopped_cleanly(&mut workers, worker);
    figures::report(
        "apalis (Redis): the same payment pushed twice: 1 ran, 1 replayed, 1 effect, both tasks \
         Done; the same job id with another amount: aborted, Killed, in the dead set, not retried",
    );
}

/// A worker SIGKILLed after the job committed and before apalis's acknowledgement: another worker
/// re-enqueues the dead one's task at a heartbeat, and its run replays.
#[test]
fn a_worker_killed_between_commit_and_ack() {
    let schema = Schema::fresh();
    let namespace = Namespace::fresh("kill");
    let mut workers = Workers::new(&schema, &namespace);

    let first = workers.start(&[("IDEMPOTENT_PAUSE_BEFORE_ACK", "p-kill")]);
    namespace.push(&[("kill-1", "p-kill", 100)]);
    workers.until_said(first, "PAUSE-BEFORE-ACK p-kill");
    assert_eq!(
        schema.counts("p-kill"),
        (1, 1),
        "the job committed before the pause.{}",
        workers.said()
    );
    // In flight, not acknowledged: apalis marks the task Running (its lease, written once the
    // worker's next poll of Redis has seen the task start) and leaves it in the worker's set.
    namespace.until_status("kill-1", &Status::Running);
    let (_, held_by) = namespace.task("kill-1");

    workers.kill(first);
    let killed = Instant::now();
    let second = workers.start(&[]);
    workers.until(
        "`OUTCOME p-kill replayed` from the second worker, once the dead worker's task is \
         re-enqueued",
        STEP,
        |seen| {
            outcomes(seen).iter().any(|(who, job, outcome)| {
                *who == second && job == "p-kill" && outcome == "replayed"
            })
        },
    );
    let back_after = killed.elapsed();
    // apalis's own attempt count, as the second worker saw it: the killed run is not counted.
    let attempt = workers
        .seen
        .iter()
        .filter(|(who, _)| *who == second)
        .find_map(|(_, line)| line.strip_prefix("OUTCOME p-kill replayed "))
        .and_then(|rest| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix("attempt="))
        })
        .unwrap_or("?")
        .to_owned();

    let outcomes = workers.outcomes();
    assert_eq!(
        outcomes,
        [
            (first, "p-kill".to_owned(), "ran".to_owned()),
            (second, "p-kill".to_owned(), "replayed".to_owned())
        ],
        "the first worker ran it, the second replayed it.{}",
        workers.said()
    );
    assert_eq!(
        schema.counts("p-kill"),
        (1, 1),
        "still one effect and one done_jobs row.{}",
        workers.said()
    );
    namespace.until_status("kill-1", &Status::Done);
    let (_, done_by) = namespace.task("kill-1");

    stopped_cleanly(&mut workers, second);
    figures::report(&format!(
        "apalis (Redis): worker SIGKILLed between commit and ack (task held by {}); its task \
         re-enqueued by another worker and replayed {:.1} s after the kill (heartbeat \
         {HEARTBEAT_SECS} s x {MISSED_HEARTBEATS} missed) as apalis attempt {attempt}, \
         acknowledged by {}; 1 effect, 1 done_jobs row",
        held_by.as_deref().unwrap_or("?"),
        back_after.as_secs_f64(),
        done_by.as_deref().unwrap_or("?"),
    ));
}
