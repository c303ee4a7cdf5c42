//! The controller: sets up a database of the run's own, starts the workers (this binary again), runs
//! a schedule's steps against them, then the fault-free final round, reads what the database holds,
//! and checks it against the history.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use idempotent_jobs::JobKey;

use super::mariadb::MariaDb;
use super::model::{
    Db, Delivery, Effect, Fail, Forget, History, HoldPoint, JobSpec, Mode, Nemesis, Observed,
    Operation, Res, Schedule, Step, Verdict, check,
};
use super::postgres_cluster::Postgres;
use super::worker::{self, Command as WorkerCommand, Config, Event};

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

use super::names::unique_name as unique;

pub fn postgres_url() -> String {
    std::env::var("IDEMPOTENT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub fn mysql_url() -> String {
    std::env::var("IDEMPOTENT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// The port of a URL's `host:port`.
fn port_of(url: &str, default: u16) -> u16 {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let host = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = host.rsplit('@').next().unwrap_or(host);
    host.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(default)
}

/// `url` with its `host:port` replaced by `127.0.0.1:port`.
fn via_port(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let userinfo = authority.rsplit_once('@').map(|(u, _)| format!("{u}@"));
    format!(
        "{scheme}://{}127.0.0.1:{port}{path}",
        userinfo.unwrap_or_default()
    )
}

// ---- a database of the run's own -----------------------------------------------------------------

pub struct Database {
    pub db: Db,
    /// Schema (PostgreSQL), database (MariaDB) or file (SQLite).
    pub name: String,
    /// What the controller connects to.
    pub url: String,
    dir: Option<std::path::PathBuf>,
    /// The server of the run's own, which `Step::RestartServer` crashes and starts again; `None`
    /// on the machine's server (`IDEMPOTENT_POSTGRES_URL`, `IDEMPOTENT_MYSQL_URL`) and for SQLite.
    server: Option<OwnServer>,
}

/// A database server a run starts for itself.
enum OwnServer {
    Postgres(Postgres),
    Mariadb(MariaDb),
}

impl OwnServer {
    fn crash_and_restart(&mut self) {
        match self {
            OwnServer::Postgres(server) => server.crash_and_restart_primary(),
            OwnServer::Mariadb(server) => server.crash_and_restart(),
        }
    }
}

pub enum Conn {
    Sqlite(SqliteConnection),
    Pg(PgConnection),
    My(MysqlConnection),
}

macro_rules! on_conn {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn {
            Conn::Sqlite($c) => $body,
            Conn::Pg($c) => $body,
            Conn::My($c) => $body,
        }
    };
}

fn down(db: Db, url: &str, e: impl std::fmt::Display) -> ! {
    let (server, variable) = match db {
        Db::Postgres => ("PostgreSQL", "IDEMPOTENT_POSTGRES_URL"),
        _ => ("MariaDB", "IDEMPOTENT_MYSQL_URL"),
    };
    panic!(
        "the explorer needs {server} at {url} ({variable}), which refused: {e}. \
         Start it with scripts/test (it starts PostgreSQL and MariaDB when they are down), \
         or point {variable} at a running server"
    )
}

impl Database {
    /// A database of its own for one run; on PostgreSQL and MariaDB with `own_server`, on a
    /// server the run starts for itself (so that it can crash it), else on the machine's.
    pub fn fresh(db: Db, own_server: bool) -> Database {
        let name = unique(&format!("explore_{}", db.name()));
        match db {
            Db::Sqlite => {
                let dir = std::env::temp_dir().join(&name);
                std::fs::create_dir_all(&dir).expect("a temporary directory");
                let url = dir.join("explore.db").to_string_lossy().into_owned();
                let database = Database {
                    db,
                    name,
                    url,
                    dir: Some(dir),
                    server: None,
                };
                database.setup();
                database
            }
            Db::Postgres => {
                let server = own_server.then(|| Postgres::single("explore"));
                let base = server.as_ref().map_or_else(postgres_url, Postgres::url);
                let server = server.map(OwnServer::Postgres);
                let mut admin =
                    PgConnection::establish(&base).unwrap_or_else(|e| down(db, &base, e));
                admin
                    .batch_execute(&format!("CREATE SCHEMA {name}"))
                    .expect("CREATE SCHEMA");
                let separator = if base.contains('?') { '&' } else { '?' };
                let url = format!(
                    "{base}{separator}options=-csearch_path%3D{name}&application_name={name}"
                );
                let database = Database {
                    db,
                    name,
                    url,
                    dir: None,
                    server,
                };
                database.setup();
                database
            }
            Db::Mariadb => {
                let server = own_server.then(|| MariaDb::start("explore", &[]));
                let base = server
                    .as_ref()
                    .map_or_else(mysql_url, |server| server.url("mysql"));
                let server = server.map(OwnServer::Mariadb);
                let mut admin =
                    MysqlConnection::establish(&base).unwrap_or_else(|e| down(db, &base, e));
                admin
                    .batch_execute(&format!(
                        "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                    ))
                    .expect("CREATE DATABASE");
                let address = base.rsplit_once('/').map_or(base.as_str(), |(s, _)| s);
                let url = format!("{address}/{name}");
                let database = Database {
                    db,
                    name,
                    url,
                    dir: None,
                    server,
                };
                database.setup();
                database
            }
        }
    }

    pub fn connect(&self) -> Conn {
        match self.db {
            Db::Sqlite => {
                let mut c = SqliteConnection::establish(&self.url).expect("the SQLite file");
                c.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL")
                    .expect("PRAGMAs");
                Conn::Sqlite(c)
            }
            Db::Postgres => Conn::Pg(
                PgConnection::establish(&self.url).unwrap_or_else(|e| down(self.db, &self.url, e)),
            ),
            Db::Mariadb => Conn::My(
                MysqlConnection::establish(&self.url)
                    .unwrap_or_else(|e| down(self.db, &self.url, e)),
            ),
        }
    }

    fn setup(&self) {
        let table = match self.db {
            Db::Postgres => {
                "CREATE TABLE effects (id BIGSERIAL PRIMARY KEY, job_key TEXT NOT NULL, run_id TEXT NOT NULL, result TEXT, at_us BIGINT NOT NULL, msg_id TEXT)"
            }
            Db::Mariadb => {
                "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, job_key VARCHAR(200) NOT NULL, run_id VARCHAR(64) NOT NULL, result TEXT, at_us BIGINT NOT NULL, msg_id VARCHAR(100))"
            }
            Db::Sqlite => {
                "CREATE TABLE effects (id INTEGER PRIMARY KEY AUTOINCREMENT, job_key TEXT NOT NULL, run_id TEXT NOT NULL, result TEXT, at_us BIGINT NOT NULL, msg_id TEXT)"
            }
        };
        let mut conn = self.connect();
        on_conn!(&mut conn, |c| {
            c.batch_execute(table).expect("the effects table");
            idempotent_jobs::migrate(c).expect("migrate");
        });
    }

    /// The worker's URL: through its proxy for a server.
    fn worker_url(&self, proxy: Option<&Proxy>) -> String {
        match (self.db, proxy) {
            (Db::Sqlite, _) | (_, None) => self.url.clone(),
            (_, Some(proxy)) => via_port(&self.url, proxy.port),
        }
    }

    fn upstream_port(&self) -> u16 {
        match self.db {
            Db::Postgres => port_of(&self.url, 5432),
            _ => port_of(&self.url, 3306),
        }
    }

    /// Terminates the server connection `pid` (PostgreSQL) or thread `pid` (MariaDB).
    fn terminate(&self, pid: i64) {
        match self.db {
            Db::Postgres => {
                let mut c = PgConnection::establish(&self.url).expect("PostgreSQL");
                let _ = c.batch_execute(&format!("SELECT pg_terminate_backend({pid}, 5000)"));
            }
            Db::Mariadb => {
                let mut c = MysqlConnection::establish(&self.url).expect("MariaDB");
                let _ = c.batch_execute(&format!("KILL {pid}"));
                std::thread::sleep(Duration::from_millis(100));
            }
            Db::Sqlite => {}
        }
    }

    pub fn observe(&self) -> Observed {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = Text)]
            job_key: String,
            #[diesel(sql_type = Text)]
            run_id: String,
            #[diesel(sql_type = Nullable<Text>)]
            result: Option<String>,
            #[diesel(sql_type = BigInt)]
            at_us: i64,
            #[diesel(sql_type = Nullable<Text>)]
            msg_id: Option<String>,
        }
        #[derive(QueryableByName)]
        struct Msg {
            #[diesel(sql_type = Text)]
            message_id: String,
        }
        let mut conn = self.connect();
        on_conn!(&mut conn, |c| {
            let rows: Vec<Row> = diesel::sql_query(
                "SELECT job_key, run_id, result, at_us, msg_id FROM effects ORDER BY id",
            )
            .load(c)
            .expect("the effects");
            let ids: Vec<Msg> = diesel::sql_query("SELECT message_id FROM outbox")
                .load(c)
                .expect("the outbox");
            let parked = idempotent_jobs::outbox::parked(c).expect("parked messages");
            let unsent = idempotent_jobs::outbox::unsent(c, 100_000).expect("unsent messages");
            Observed {
                effects: rows
                    .into_iter()
                    .map(|r| Effect {
                        key: r.job_key,
                        run_id: r.run_id,
                        result: r.result,
                        at_us: r.at_us,
                        msg_id: r.msg_id,
                    })
                    .collect(),
                outbox_ids: ids.into_iter().map(|m| m.message_id).collect(),
                parked: parked
                    .iter()
                    .map(|m| (m.message_id().to_owned(), m.attempts()))
                    .collect(),
                unsent: unsent.iter().map(|m| m.message_id().to_owned()).collect(),
            }
        })
    }

    fn unsent(&self) -> usize {
        let mut conn = self.connect();
        on_conn!(&mut conn, |c| idempotent_jobs::outbox::unsent(c, 100_000)
            .map(|u| u.len())
            .unwrap_or(usize::MAX))
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if std::env::var_os("IDEMPOTENT_EXPLORE_KEEP").is_some() {
            eprintln!("explore: kept {} ({})", self.name, self.url);
            return;
        }
        match self.db {
            Db::Sqlite => {
                if let Some(dir) = &self.dir {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
            // A server of the run's own goes with its data when `server` drops.
            _ if self.server.is_some() => {}
            Db::Postgres => {
                if let Ok(mut c) = PgConnection::establish(&postgres_url()) {
                    let _ =
                        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
                }
            }
            Db::Mariadb => {
                if let Ok(mut c) = MysqlConnection::establish(&mysql_url()) {
                    let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {}", self.name));
                }
            }
        }
    }
}

// ---- a TCP proxy that can cut, stall, and lose replies --------------------------------------------

const PASS: u8 = 0;
const STALL: u8 = 1;
const LOSE_REPLIES: u8 = 2;
/// Counting the client's writes down; at zero, [`LOSE_REPLIES`].
const ARMED: u8 = 3;

pub struct Proxy {
    port: u16,
    mode: Arc<AtomicU8>,
    countdown: Arc<AtomicU32>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let mode = Arc::new(AtomicU8::new(PASS));
        let countdown = Arc::new(AtomicU32::new(0));
        let sockets: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (m, s, d) = (
            Arc::clone(&mode),
            Arc::clone(&sockets),
            Arc::clone(&countdown),
        );
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut list = s.lock().unwrap_or_else(|p| p.into_inner());
                    list.push(client.try_clone().expect("a handle"));
                    list.push(server.try_clone().expect("a handle"));
                }
                pump(
                    client.try_clone().expect("a handle"),
                    server.try_clone().expect("a handle"),
                    Arc::clone(&m),
                    Some(Arc::clone(&d)),
                );
                pump(server, client, Arc::clone(&m), None);
            }
        });
        Proxy {
            port,
            mode,
            countdown,
            sockets,
        }
    }

    /// Drops the server's replies once the client has written `after` more times.
    fn lose_replies_after(&self, after: u32) {
        if after == 0 {
            self.set(LOSE_REPLIES);
        } else {
            self.countdown.store(after, Ordering::SeqCst);
            self.set(ARMED);
        }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    /// Cuts every connection through the proxy.
    fn cut(&self) {
        let mut list = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        for socket in list.drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

/// Forwards `from` to `to`: the client's writes when `countdown` is given (which they count down
/// while armed), else the server's replies.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    mode: Arc<AtomicU8>,
    countdown: Option<Arc<AtomicU32>>,
) {
    let replies = countdown.is_none();
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(countdown) = &countdown
                && mode.load(Ordering::SeqCst) == ARMED
                && countdown.fetch_sub(1, Ordering::SeqCst) <= 1
            {
                mode.store(LOSE_REPLIES, Ordering::SeqCst);
            }
            while mode.load(Ordering::SeqCst) == STALL {
                std::thread::sleep(Duration::from_millis(5));
            }
            if replies && mode.load(Ordering::SeqCst) == LOSE_REPLIES {
                continue;
            }
            if to.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

// ---- workers ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Busy {
    Starting,
    /// A delivery, and when it was sent (µs since the epoch).
    Job(JobSpec, i64),
    Relay,
}

struct Slot {
    mode: Mode,
    generation: u64,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    busy: Option<Busy>,
    held: Option<(String, Option<i64>)>,
    skew: Option<String>,
    proxy: Option<Proxy>,
    log: std::path::PathBuf,
}

/// Figures of one run.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    pub steps: usize,
    pub deliveries: usize,
    pub final_deliveries: usize,
    pub keys: usize,
    pub outcomes: BTreeMap<String, u64>,
    pub faults: BTreeMap<String, u64>,
    pub checks: BTreeMap<&'static str, u64>,
    pub received: usize,
    pub duplicates_received: usize,
    pub relay_rounds: usize,
    pub effects: usize,
    pub duration: Duration,
}

pub struct Report {
    pub figures: Figures,
    pub verdict: Verdict,
    #[allow(dead_code)]
    pub history: History,
}

enum Timer {
    Resume(usize, u64),
    Pass(usize),
    CutAndPass(usize),
}

pub struct Runner {
    db: Database,
    slots: Vec<Slot>,
    events: Receiver<(usize, u64, Event)>,
    sender: Sender<(usize, u64, Event)>,
    history: History,
    ops: Vec<std::thread::JoinHandle<OpDone>>,
    timers: Vec<(Instant, Timer)>,
    figures: Figures,
    next_final: u64,
    keys: BTreeMap<String, (u8, bool)>,
    dir: std::path::PathBuf,
    sabotage: bool,
}

thread_local! {
    /// Set while shrinking: the trials' worker logs are not kept.
    pub static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// How long the controller waits for a worker before calling it a hang.
const HANG: Duration = Duration::from_secs(90);

impl Runner {
    /// A runner on `db`; on PostgreSQL with `own_server`, on a server of its own (see
    /// [`Database::fresh`]).
    pub fn new(db: Db, modes: &[Mode], own_server: bool) -> Runner {
        Runner::with_sabotage(db, modes, own_server, false)
    }

    /// A runner whose sync workers skip the library (see [`Config::sabotage`]).
    pub fn with_sabotage(db: Db, modes: &[Mode], own_server: bool, sabotage: bool) -> Runner {
        let database = Database::fresh(db, own_server);
        let (sender, events) = channel();
        let dir = std::env::temp_dir().join(format!("{}-logs", database.name));
        std::fs::create_dir_all(&dir).expect("a log directory");
        let mut runner = Runner {
            slots: Vec::new(),
            events,
            sender,
            history: History::default(),
            ops: Vec::new(),
            timers: Vec::new(),
            figures: Figures::default(),
            next_final: 0,
            keys: BTreeMap::new(),
            dir,
            db: database,
            sabotage,
        };
        for (i, mode) in modes.iter().enumerate() {
            let proxy = db
                .is_server()
                .then(|| Proxy::start(runner.db.upstream_port()));
            runner.slots.push(Slot {
                mode: *mode,
                generation: 0,
                child: None,
                stdin: None,
                busy: None,
                held: None,
                skew: None,
                proxy,
                log: runner.dir.join(format!("worker-{i}.log")),
            });
            runner.start(i);
        }
        for i in 0..runner.slots.len() {
            runner.wait_idle(i);
        }
        runner
    }

    fn start(&mut self, w: usize) {
        let slot = &mut self.slots[w];
        slot.generation += 1;
        let config = Config {
            db: self.db.db,
            mode: slot.mode,
            url: self.db.worker_url(slot.proxy.as_ref()),
            sabotage: self.sabotage,
            session: self
                .db
                .db
                .session_settings(w as u64 + slot.generation)
                .to_owned(),
        };
        let mut command = Command::new(std::env::current_exe().expect("the test binary"));
        command
            .args(["worker", "--exact", "--nocapture", "--test-threads=1"])
            .env(
                worker::WORKER_ENV,
                serde_json::to_string(&config).expect("config"),
            )
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&slot.log)
                    .expect("a log file"),
            );
        if let Some(skew) = &slot.skew {
            assert!(
                std::path::Path::new(FAKETIME).exists(),
                "{FAKETIME} is missing: install the Debian package libfaketime (scripts/test does)"
            );
            command
                .env("LD_PRELOAD", FAKETIME)
                .env("FAKETIME", skew)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_DONT_RESET", "1");
        }
        let mut child = command.spawn().expect("a worker process");
        let stdout = child.stdout.take().expect("its stdout");
        slot.stdin = child.stdin.take();
        slot.child = Some(child);
        slot.busy = Some(Busy::Starting);
        slot.held = None;
        let (sender, generation) = (self.sender.clone(), slot.generation);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(at) = line.find("@@ ")
                    && let Ok(event) = serde_json::from_str(&line[at + 3..])
                {
                    let _ = sender.send((w, generation, event));
                }
            }
            let _ = sender.send((w, generation, Event::Exited));
        });
    }

    fn kill(&mut self, w: usize, why: &str) {
        let slot = &mut self.slots[w];
        if let Some(mut child) = slot.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        slot.stdin = None;
        if let Some(Busy::Job(spec, start_us)) = slot.busy.take() {
            self.history.deliveries.push(delivery(
                &spec,
                w,
                false,
                start_us,
                Res::Unknown(why.into()),
            ));
        }
        slot.held = None;
        self.timers
            .retain(|(_, t)| !matches!(t, Timer::Resume(x, _) if *x == w));
        self.start(w);
    }

    fn send(&mut self, w: usize, command: &WorkerCommand) {
        let line = serde_json::to_string(command).expect("a command");
        let ok = self.slots[w]
            .stdin
            .as_mut()
            .is_some_and(|s| writeln!(s, "{line}").and_then(|()| s.flush()).is_ok());
        if !ok {
            self.history.anomalies.push(format!(
                "worker {w} took no command ({line}): its stdin is closed"
            ));
        }
    }

    /// Handles one event or timer; returns after at most `wait`.
    fn pump(&mut self, wait: Duration) {
        let now = Instant::now();
        let mut due = Vec::new();
        self.timers.retain(|(at, t)| {
            if *at <= now {
                due.push(match t {
                    Timer::Resume(w, g) => Timer::Resume(*w, *g),
                    Timer::Pass(w) => Timer::Pass(*w),
                    Timer::CutAndPass(w) => Timer::CutAndPass(*w),
                });
                false
            } else {
                true
            }
        });
        for timer in due {
            match timer {
                Timer::Resume(w, g) => {
                    if self.slots[w].generation == g {
                        if let Some(child) = &self.slots[w].child {
                            signal("CONT", child.id());
                        }
                        self.send(w, &WorkerCommand::Go);
                    }
                }
                Timer::Pass(w) => {
                    if let Some(p) = &self.slots[w].proxy {
                        p.set(PASS);
                    }
                }
                Timer::CutAndPass(w) => {
                    if let Some(p) = &self.slots[w].proxy {
                        p.cut();
                        p.set(PASS);
                    }
                }
            }
        }
        let wait = self
            .timers
            .iter()
            .map(|(at, _)| at.saturating_duration_since(now))
            .min()
            .map_or(wait, |t| t.min(wait));
        match self.events.recv_timeout(wait) {
            Ok((w, generation, event)) => self.handle(w, generation, event),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => unreachable!("the runner holds a sender"),
        }
    }

    fn handle(&mut self, w: usize, generation: u64, event: Event) {
        if let Event::Received { msg } = event {
            // A receiver got it, whatever became of the relay since.
            self.history.received.push(msg);
            return;
        }
        if self.slots[w].generation != generation {
            return;
        }
        match event {
            Event::Ready => {
                if matches!(self.slots[w].busy, Some(Busy::Starting)) {
                    self.slots[w].busy = None;
                }
            }
            Event::Hold { id, backend_pid } => self.slots[w].held = Some((id, backend_pid)),
            Event::Outcome { id, res } => {
                let slot = &mut self.slots[w];
                slot.held = None;
                match slot.busy.take() {
                    Some(Busy::Job(spec, start_us)) if spec.id == id => {
                        let final_round = spec.id.starts_with('f');
                        *self.figures.outcomes.entry(res.label()).or_default() += 1;
                        self.history.deliveries.push(delivery(
                            &spec,
                            w,
                            final_round,
                            start_us,
                            res,
                        ));
                    }
                    other => {
                        self.history.anomalies.push(format!(
                            "worker {w} reported {id} while busy with {other:?}"
                        ));
                    }
                }
            }
            Event::RelayDone { .. } => {
                self.figures.relay_rounds += 1;
                self.slots[w].held = None;
                self.slots[w].busy = None;
            }
            Event::Exited => {
                let log = std::fs::read_to_string(&self.slots[w].log).unwrap_or_default();
                let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                self.history.anomalies.push(format!(
                    "worker {w} exited on its own while {:?}; its log ends: {tail}",
                    self.slots[w].busy
                ));
                self.kill(w, "the worker exited");
            }
            Event::Received { .. } => {}
        }
    }

    fn wait_for(&mut self, w: usize, what: &str, mut done: impl FnMut(&Slot) -> bool) -> bool {
        let deadline = Instant::now() + HANG;
        while !done(&self.slots[w]) {
            if Instant::now() > deadline {
                self.history.anomalies.push(format!(
                    "worker {w} ({:?}, skew {:?}) hung: not {what} after {HANG:?} while busy with {:?}",
                    self.slots[w].mode, self.slots[w].skew, self.slots[w].busy
                ));
                self.kill(w, "hung");
                return false;
            }
            self.pump(Duration::from_millis(50));
        }
        true
    }

    fn wait_idle(&mut self, w: usize) -> bool {
        self.wait_for(w, "idle", |s| s.busy.is_none())
    }

    /// Waits until the worker is held, or done without reaching its hold.
    fn wait_held(&mut self, w: usize) -> Option<(String, Option<i64>)> {
        self.wait_for(w, "held", |s| s.held.is_some() || s.busy.is_none());
        self.slots[w].held.clone()
    }

    fn apply(&mut self, w: usize, nemesis: Nemesis, at: HoldPoint, backend_pid: Option<i64>) {
        match (nemesis, at) {
            (Nemesis::Kill, _) => self.kill(w, "SIGKILL while held"),
            (_, HoldPoint::AfterCommit) | (Nemesis::Go, _) => self.send(w, &WorkerCommand::Go),
            (Nemesis::StopFor { ms }, _) => {
                if let Some(child) = &self.slots[w].child {
                    signal("STOP", child.id());
                }
                let generation = self.slots[w].generation;
                self.timers.push((
                    Instant::now() + Duration::from_millis(ms),
                    Timer::Resume(w, generation),
                ));
            }
            (Nemesis::Terminate, _) => {
                if let Some(pid) = backend_pid {
                    self.db.terminate(pid);
                }
                self.send(w, &WorkerCommand::Go);
            }
            (Nemesis::Cut, _) => {
                if let Some(p) = &self.slots[w].proxy {
                    p.cut();
                }
                self.send(w, &WorkerCommand::Go);
            }
            (Nemesis::LoseReplies { after }, _) => {
                if let Some(p) = &self.slots[w].proxy {
                    p.lose_replies_after(after);
                }
                self.send(w, &WorkerCommand::Go);
                self.timers.push((
                    Instant::now() + Duration::from_millis(300),
                    Timer::CutAndPass(w),
                ));
            }
            (Nemesis::Stall { ms }, _) => {
                if let Some(p) = &self.slots[w].proxy {
                    p.set(STALL);
                }
                self.send(w, &WorkerCommand::Go);
                self.timers
                    .push((Instant::now() + Duration::from_millis(ms), Timer::Pass(w)));
            }
        }
    }

    pub fn step(&mut self, step: &Step) {
        self.figures.steps += 1;
        if let Some(fault) = step.fault() {
            *self.figures.faults.entry(fault).or_default() += 1;
        }
        match step {
            Step::Deliver { w, job } => {
                let w = *w % self.slots.len();
                if !self.wait_idle(w) {
                    return;
                }
                let mut job = job.clone();
                if self.slots[w].mode == Mode::Sync {
                    job.cancel_ms = None;
                }
                if !self.db.db.is_server()
                    && let Some(hold) = &mut job.hold
                    && !matches!(
                        hold.then,
                        Nemesis::Go | Nemesis::Kill | Nemesis::StopFor { .. }
                    )
                {
                    hold.then = Nemesis::Go;
                }
                self.keys
                    .insert(job.key.clone(), (job.job, job.null_result));
                self.figures.deliveries += 1;
                self.slots[w].busy = Some(Busy::Job(job.clone(), now_us()));
                self.send(w, &WorkerCommand::Job(job.clone()));
                if let Some(hold) = job.hold
                    && let Some((_, pid)) = self.wait_held(w)
                {
                    self.slots[w].held = None;
                    self.apply(w, hold.then, hold.at, pid);
                }
            }
            Step::Relay {
                w,
                hold_at,
                then,
                cancel_ms,
            } => {
                let w = *w % self.slots.len();
                if !self.wait_idle(w) {
                    return;
                }
                let cancel_ms = cancel_ms.filter(|_| self.slots[w].mode == Mode::Async);
                self.slots[w].busy = Some(Busy::Relay);
                self.send(
                    w,
                    &WorkerCommand::Relay {
                        hold_at: *hold_at,
                        cancel_ms,
                    },
                );
                if hold_at.is_some() && self.wait_held(w).is_some() {
                    self.slots[w].held = None;
                    match then {
                        Nemesis::Kill => self.kill(w, "SIGKILL while delivering"),
                        _ => self.send(w, &WorkerCommand::Go),
                    }
                }
            }
            Step::Prune => {
                let db = self.db.db;
                let url = self.db.url.clone();
                self.ops.push(std::thread::spawn(move || {
                    let mut conn = connect_to(db, &url);
                    on_conn!(&mut conn, |c| {
                        let _ =
                            idempotent_jobs::prune(c, &idempotent_jobs::Prune::default().pace(0));
                    });
                    OpDone::Nothing
                }));
            }
            Step::Forget { key, cli } => {
                let db = self.db.db;
                let url = self.db.url.clone();
                let key = key.clone();
                let wanted = *cli;
                let cli = cli_binary().filter(|_| wanted);
                if wanted && cli.is_none() {
                    *self
                        .figures
                        .faults
                        .entry("forget-cli-not-built".into())
                        .or_default() += 1;
                }
                self.ops.push(std::thread::spawn(move || {
                    let mut conn = connect_to(db, &url);
                    let start_us = now_us();
                    let found = match cli {
                        // Exit 0: forgotten, 1: no such key; anything else: an error, after
                        // which the row may be gone or not.
                        Some(binary) => Command::new(binary)
                            .args([
                                "keys", "forget", "--yes", "--reason", "explore", "-D", &url, &key,
                            ])
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .status()
                            .map_err(|e| e.to_string())
                            .and_then(|status| match status.code() {
                                Some(0) => Ok(true),
                                Some(1) => Ok(false),
                                _ => Err(format!("the CLI exited with {status}")),
                            }),
                        None => on_conn!(&mut conn, |c| idempotent_jobs::keys::forget(
                            c,
                            &JobKey::new(key.clone()),
                            "explore"
                        ))
                        .map_err(|e| e.to_string()),
                    };
                    let end_us = now_us();
                    OpDone::Forget(Forget {
                        key,
                        start_us,
                        end_us,
                        found: *found.as_ref().unwrap_or(&true),
                        error: found.err(),
                    })
                }));
            }
            Step::RestartServer => match &mut self.db.server {
                Some(server) => server.crash_and_restart(),
                None => {
                    *self
                        .figures
                        .faults
                        .entry("restart-server-skipped (the machine's server)".into())
                        .or_default() += 1;
                }
            },
            Step::Operate { op } => {
                let (db, url, op) = (self.db.db, self.db.url.clone(), *op);
                self.ops
                    .push(std::thread::spawn(move || operate(db, &url, op)));
            }
            Step::Sleep { ms } => {
                let until = Instant::now() + Duration::from_millis(*ms);
                while Instant::now() < until {
                    self.pump(until.saturating_duration_since(Instant::now()));
                }
            }
            Step::Kill { w } => {
                let w = *w % self.slots.len();
                self.kill(w, "SIGKILL at a random time");
            }
            Step::Cut { w } => {
                if let Some(p) = &self.slots[*w % self.slots.len()].proxy {
                    p.cut();
                }
            }
            Step::Stall { w, ms } => {
                let w = *w % self.slots.len();
                if let Some(p) = &self.slots[w].proxy {
                    p.set(STALL);
                    self.timers
                        .push((Instant::now() + Duration::from_millis(*ms), Timer::Pass(w)));
                }
            }
            Step::Restart { w, skew } => {
                let w = *w % self.slots.len();
                self.slots[w].skew = skew.clone().filter(|_| self.db.db.is_server());
                self.kill(w, "restarted");
            }
        }
        self.reap_ops(false);
    }

    fn reap_ops(&mut self, all: bool) {
        let mut left = Vec::new();
        for op in self.ops.drain(..) {
            if all || op.is_finished() {
                match op.join() {
                    Ok(OpDone::Forget(forget)) => self.history.forgets.push(forget),
                    Ok(OpDone::Anomaly(anomaly)) => self.history.anomalies.push(anomaly),
                    Ok(OpDone::Figure(figure)) => {
                        *self.figures.faults.entry(figure).or_default() += 1;
                    }
                    Ok(OpDone::Nothing) => {}
                    Err(_) => self
                        .history
                        .anomalies
                        .push("an operator's command panicked".into()),
                }
            } else {
                left.push(op);
            }
        }
        self.ops = left;
    }

    /// Ends the faults: resumes stopped workers, passes every proxy, waits for every worker.
    fn calm(&mut self) {
        let now = Instant::now();
        for (at, _) in &mut self.timers {
            *at = now;
        }
        self.pump(Duration::ZERO);
        for w in 0..self.slots.len() {
            self.wait_idle(w);
        }
        self.reap_ops(true);
    }

    /// The final round: every key once more, fault-free, until it completes (retryable errors are
    /// retried); then relays until the outbox has nothing left to send.
    fn final_round(&mut self) {
        let keys: Vec<(String, (u8, bool))> =
            self.keys.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let mut w = 0;
        for (key, (job, null_result)) in keys {
            for _attempt in 0..5 {
                w = (w + 1) % self.slots.len();
                if !self.wait_idle(w) {
                    continue;
                }
                self.next_final += 1;
                let spec = JobSpec {
                    id: format!("f{}", self.next_final),
                    key: key.clone(),
                    job,
                    redelivered: true,
                    fp: None,
                    null_result,
                    outbox: None,
                    fail: Fail::No,
                    slow_ms: 0,
                    hold: None,
                    cancel_ms: None,
                    in_progress_ms: None,
                    nested: false,
                };
                self.figures.final_deliveries += 1;
                self.slots[w].busy = Some(Busy::Job(spec.clone(), now_us()));
                self.send(w, &WorkerCommand::Job(spec));
                self.wait_idle(w);
                let last = self.history.deliveries.last().map(|d| d.res.clone());
                // A session that holds a transaction of its own (MariaDB's `completion_type =
                // CHAIN` after a caller's commit, or `autocommit = 0`) refuses every job, truly
                // and for good: as a user told so would end that transaction, the worker starts
                // again on a new connection, and the key goes to the next one.
                if matches!(&last, Some(Res::Error { variant, .. }) if variant == "InsideTransaction")
                {
                    *self
                        .figures
                        .faults
                        .entry("final-round-restart (its session held a transaction)".into())
                        .or_default() += 1;
                    self.kill(w, "restarted: its session held a transaction of its own");
                    continue;
                }
                let retry = matches!(
                    &last,
                    Some(Res::Error {
                        retryable: true,
                        ..
                    }) | Some(Res::NoConnection(_))
                        | Some(Res::Unknown(_))
                );
                if !retry {
                    break;
                }
            }
        }
        for w in 0..self.slots.len() {
            self.wait_idle(w);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.db.unsent() == 0 {
                break;
            }
            if Instant::now() > deadline {
                self.history.anomalies.push(format!(
                    "the outbox still holds {} unsent messages 60 s after the faults stopped",
                    self.db.unsent()
                ));
                break;
            }
            self.wait_idle(0);
            self.slots[0].busy = Some(Busy::Relay);
            self.send(
                0,
                &WorkerCommand::Relay {
                    hold_at: None,
                    cancel_ms: None,
                },
            );
            self.wait_idle(0);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs the final round, reads the database and checks.
    pub fn finish(mut self, started: Instant) -> Report {
        self.calm();
        self.final_round();
        self.calm();
        for slot in &mut self.slots {
            slot.stdin = None;
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let observed = self.db.observe();
        let verdict = check(&self.history, &observed);
        let mut figures = self.figures.clone();
        figures.keys = self.keys.len();
        figures.checks = verdict.checks.clone();
        figures.received = self.history.received.len();
        let distinct: std::collections::BTreeSet<&String> = self.history.received.iter().collect();
        figures.duplicates_received = self.history.received.len() - distinct.len();
        figures.effects = observed.effects.len();
        let failed_forgets = self
            .history
            .forgets
            .iter()
            .filter(|f| f.error.is_some())
            .count();
        if failed_forgets > 0 {
            figures
                .faults
                .insert("forget-failed".into(), failed_forgets as u64);
        }
        figures.duration = started.elapsed();
        let keep = std::env::var_os("IDEMPOTENT_EXPLORE_KEEP").is_some()
            || (!verdict.violations.is_empty() && !self.sabotage && !QUIET.with(|q| q.get()));
        if keep {
            eprintln!("explore: worker logs are in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        Report {
            figures,
            verdict,
            history: std::mem::take(&mut self.history),
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(child) = &mut slot.child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A connection of the controller's own; a server that refuses is asked again for a minute (the
/// nemesis may be restarting it).
fn connect_to(db: Db, url: &str) -> Conn {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let connected = match db {
            Db::Sqlite => {
                let mut c = SqliteConnection::establish(url).expect("the SQLite file");
                let _ = c.batch_execute("PRAGMA busy_timeout = 10000");
                return Conn::Sqlite(c);
            }
            Db::Postgres => PgConnection::establish(url).map(Conn::Pg),
            Db::Mariadb => MysqlConnection::establish(url).map(Conn::My),
        };
        match connected {
            Ok(conn) => return conn,
            Err(e) if Instant::now() >= deadline => down(db, url, e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The CLI binary (`idempotent-jobs`), when built: `IDEMPOTENT_EXPLORE_CLI`, or beside this test
/// binary's directory (`target/debug/idempotent-jobs`, which `cargo test --workspace` builds).
fn cli_binary() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("IDEMPOTENT_EXPLORE_CLI") {
        return Some(path.into());
    }
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("idempotent-jobs");
    path.is_file().then_some(path)
}

/// What an operator's command left for the history.
enum OpDone {
    Nothing,
    Forget(Forget),
    /// A violation: what the command said that was not true.
    Anomaly(String),
    /// A figure: an outcome worth counting (a command that failed under the faults).
    Figure(String),
}

/// Runs an operator's command beside the workers. Errors of the API's commands and the CLI's exit
/// codes 3 and 5 (cannot connect, a database error: under the nemesis, a lock timeout) are counted;
/// a CLI that says the runtime's tables are missing (exit 4) while workers use them, or exits with a
/// code it does not document, is a violation.
fn operate(db: Db, url: &str, op: Operation) -> OpDone {
    let failed = |what: String| OpDone::Figure(format!("{}-failed ({what})", op.label()));
    let args: &[&str] = match op {
        Operation::RetryParked | Operation::PruneDelivered => {
            let mut conn = connect_to(db, url);
            let done = on_conn!(&mut conn, |c| match op {
                Operation::RetryParked =>
                    idempotent_jobs::outbox::retry_parked(c, None).map(|_| ()),
                _ => idempotent_jobs::outbox::prune_delivered(
                    c,
                    Duration::ZERO,
                    &idempotent_jobs::Prune::default().pace(0)
                )
                .map(|_| ()),
            });
            return match done {
                Ok(()) => OpDone::Nothing,
                Err(e) => failed(error_variant(&e)),
            };
        }
        Operation::CliPrune => &["prune", "--pace", "0"],
        Operation::CliRetryParked => &["outbox", "retry", "--all"],
        Operation::CliVerify => &["verify"],
        Operation::CliList => &["keys", "list", "--json"],
    };
    let Some(binary) = cli_binary() else {
        return OpDone::Figure(format!("{}-not-built", op.label()));
    };
    let output = Command::new(binary)
        .args(args)
        .args(["-D", url])
        .stdin(Stdio::null())
        .output();
    let output = match output {
        Ok(output) => output,
        Err(e) => return failed(e.to_string()),
    };
    match output.status.code() {
        Some(0) => OpDone::Nothing,
        // `outbox retry --all` with nothing parked is "not found".
        Some(1) if op == Operation::CliRetryParked => OpDone::Nothing,
        Some(code @ (3 | 5)) => failed(format!("exit {code}")),
        code => OpDone::Anomaly(format!(
            "`idempotent-jobs {}` exited with {code:?} beside the workers: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
}

/// The runtime error's variant, for a figure.
fn error_variant(error: &idempotent_jobs::Error) -> String {
    let text = format!("{error:?}");
    text.split(['(', ' ', '{'])
        .next()
        .unwrap_or("error")
        .to_owned()
}

fn delivery(spec: &JobSpec, worker: usize, final_round: bool, start_us: i64, res: Res) -> Delivery {
    Delivery {
        id: spec.id.clone(),
        key: spec.key.clone(),
        job: spec.job,
        worker,
        final_round,
        null_result: spec.null_result,
        res,
        start_us,
        end_us: now_us(),
    }
}

fn signal(signal: &str, pid: u32) {
    let _ = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status();
}

/// Runs `schedule` from start to end (no time limit), then the final round and the checks.
pub fn run_schedule(schedule: &Schedule) -> Report {
    run_schedule_with(schedule, false)
}

/// [`run_schedule`], with sabotaged workers when `sabotage`.
pub fn run_schedule_with(schedule: &Schedule, sabotage: bool) -> Report {
    let started = Instant::now();
    let own_server = schedule.steps.contains(&Step::RestartServer);
    let mut runner = Runner::with_sabotage(schedule.db, &schedule.modes, own_server, sabotage);
    for step in &schedule.steps {
        runner.step(step);
    }
    runner.finish(started)
}
