//! What the CLI's integration tests share: a database of each test's own on SQLite, PostgreSQL or
//! MariaDB, running the binary, and jobs that leave keys and outbox messages behind.
//!
//! Servers are found at `IDEMPOTENT_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`)
//! and `IDEMPOTENT_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a server that cannot be
//! reached fails its tests with a message saying how to start it.

#![allow(dead_code)] // each test binary uses a part of it
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection, PgConnection, SqliteConnection};
use idempotent_runtime::keys::{self, KeyQuery};
use idempotent_runtime::outbox;
use idempotent_runtime::{Error, Job, JobKey, JobStore, Outcome};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_idempotent-jobs");

pub static CHARGE: Job = Job::new("charge", "charge:<order>");
pub static HOOK: Job = Job::new("hook", "hook:<order>");
/// Keys that lapse the moment their run commits: what `prune` deletes.
pub static DIGEST: Job = Job::new("digest", "digest:<user>").keep_for(Duration::ZERO);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Sqlite,
    Postgres,
    Mysql,
}

impl Server {
    pub fn base_url(self) -> String {
        match self {
            Server::Sqlite => String::new(),
            Server::Postgres => std::env::var("IDEMPOTENT_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned()),
            Server::Mysql => std::env::var("IDEMPOTENT_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned()),
        }
    }

    pub fn unreachable(self, url: &str, error: &dyn std::fmt::Display) -> String {
        match self {
            Server::Sqlite => format!("opening the SQLite database {url} failed: {error}"),
            Server::Postgres => format!(
                "PostgreSQL is not reachable at {url}: {error}\n\
                 Start it with `pg_ctlcluster --skip-systemctl-redirect 15 main start` \
                 (scripts/test does this), or point IDEMPOTENT_POSTGRES_URL at a server."
            ),
            Server::Mysql => format!(
                "MariaDB/MySQL is not reachable at {url}: {error}\n\
                 Start it with `start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd` \
                 (scripts/test does this), or point IDEMPOTENT_MYSQL_URL at a server."
            ),
        }
    }
}

/// A sync connection type the tests set data up with.
pub trait Backend: JobStore + Connection {
    const SERVER: Server;

    fn open(url: &str) -> Self {
        Self::establish(url).unwrap_or_else(|e| panic!("{}", Self::SERVER.unreachable(url, &e)))
    }
}

impl Backend for SqliteConnection {
    const SERVER: Server = Server::Sqlite;
}

impl Backend for PgConnection {
    const SERVER: Server = Server::Postgres;
}

impl Backend for MysqlConnection {
    const SERVER: Server = Server::Mysql;
}

pub fn unique_name() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "idempotent_cli_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// An empty database of one test's own, dropped at the end.
pub struct TestDb {
    pub url: String,
    pub server: Server,
    pub cleanup: Cleanup,
}

pub enum Cleanup {
    File(std::path::PathBuf),
    Sql { admin_url: String, sql: String },
}

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "expected success: {self:#?}");
        self
    }

    pub fn exit(self, code: i32) -> Self {
        assert_eq!(self.code, code, "expected exit code {code}: {self:#?}");
        self
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:#?}"))
    }
}

impl TestDb {
    pub fn empty<C: Backend>() -> Self {
        let server = C::SERVER;
        let name = unique_name();
        match server {
            Server::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.db"));
                let url = path.to_string_lossy().into_owned();
                // Create the file: the CLI refuses a SQLite path that does not exist.
                drop(C::open(&url));
                TestDb {
                    url,
                    server,
                    cleanup: Cleanup::File(path),
                }
            }
            Server::Postgres => {
                let base = server.base_url();
                C::open(&base)
                    .batch_execute(&format!("CREATE SCHEMA {name}"))
                    .expect("creating a schema");
                let separator = if base.contains('?') { '&' } else { '?' };
                TestDb {
                    url: format!("{base}{separator}options=-csearch_path%3D{name}"),
                    server,
                    cleanup: Cleanup::Sql {
                        admin_url: base,
                        sql: format!("DROP SCHEMA IF EXISTS {name} CASCADE"),
                    },
                }
            }
            Server::Mysql => {
                let base = server.base_url();
                C::open(&base)
                    .batch_execute(&format!(
                        "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                    ))
                    .expect("creating a database");
                let after_scheme = base.find("://").map_or(0, |i| i + 3);
                let server_part = match base[after_scheme..].find('/') {
                    Some(slash) => &base[..after_scheme + slash],
                    None => &base,
                };
                TestDb {
                    url: format!("{server_part}/{name}"),
                    server,
                    cleanup: Cleanup::Sql {
                        admin_url: base.clone(),
                        sql: format!("DROP DATABASE IF EXISTS {name}"),
                    },
                }
            }
        }
    }

    pub fn connect<C: Backend>(&self) -> C {
        C::open(&self.url)
    }

    /// Runs the binary with `args`, `DATABASE_URL` pointing here and stdin not a terminal.
    pub fn cli(&self, args: &[&str]) -> Run {
        run_cli(&self.url, args)
    }

    /// Runs the binary on a pseudo-terminal (through util-linux `script`), typing `input`;
    /// stdout and stderr come back together in `stdout`.
    pub fn cli_on_terminal(&self, args: &str, input: &str) -> Run {
        let mut child = Command::new("script")
            .args(["-qec", &format!("{BIN} {args}"), "/dev/null"])
            .env("DATABASE_URL", &self.url)
            .current_dir(empty_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running `script` (util-linux) to give the CLI a terminal");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("typing the answer");
        let output = child.wait_with_output().expect("waiting for `script`");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::File(path) => {
                let path = path.to_string_lossy();
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    let _ = std::fs::remove_file(format!("{path}{suffix}"));
                }
            }
            // Nothing here may panic: this also runs while a failed test unwinds.
            Cleanup::Sql { admin_url, sql } => match self.server {
                Server::Postgres => {
                    if let Ok(mut admin) = PgConnection::establish(admin_url) {
                        let _ = admin.batch_execute(sql);
                    }
                }
                Server::Mysql => {
                    if let Ok(mut admin) = MysqlConnection::establish(admin_url) {
                        let _ = admin.batch_execute(sql);
                    }
                }
                Server::Sqlite => {}
            },
        }
    }
}

pub fn run_cli(url: &str, args: &[&str]) -> Run {
    Cli::new().env("DATABASE_URL", url).run(args)
}

/// A run of the binary to be set up: its environment and working directory.
pub struct Cli {
    command: Command,
}

impl Cli {
    /// The binary with no `DATABASE_URL`, stdin not a terminal, in a directory of its own (so that
    /// no `.env` of the machine's is read).
    pub fn new() -> Self {
        let mut command = Command::new(BIN);
        command
            .env_remove("DATABASE_URL")
            .current_dir(empty_dir())
            .stdin(Stdio::null());
        Self { command }
    }

    /// Sets an environment variable.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.command.env(name, value);
        self
    }

    /// Runs in `dir`.
    pub fn dir(mut self, dir: &std::path::Path) -> Self {
        self.command.current_dir(dir);
        self
    }

    /// Runs the binary with `args` and waits for it.
    pub fn run(mut self, args: &[&str]) -> Run {
        let output = self
            .command
            .args(args)
            .output()
            .expect("running the idempotent-jobs binary");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// An empty directory the tests run the binary in (none writes to it).
pub fn empty_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join("idempotent-cli-tests-empty-dir");
    std::fs::create_dir_all(&dir).expect("creating a temporary directory");
    dir
}

/// A new empty directory under the system's temporary directory.
pub fn fresh_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique_name());
    std::fs::create_dir_all(&dir).expect("creating a temporary directory");
    dir
}

pub fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn key_count<C: Backend>(conn: &mut C) -> usize {
    keys::list(conn, &KeyQuery::default().limit(1_000))
        .expect("listing keys")
        .len()
}

pub fn charge<C: Backend>(conn: &mut C, order: u32) -> (Outcome<u32>, bool) {
    let mut ran = false;
    let outcome = idempotent_runtime::run(
        conn,
        &CHARGE,
        &JobKey::new(format!("charge:order-{order}")),
        |conn| {
            ran = true;
            outbox::push(conn, "receipt", &serde_json::json!({ "order": order }))?;
            Ok::<_, Error>(42)
        },
    )
    .expect("running the charge job");
    (outcome, ran)
}

/// Runs the hook job (one `webhook` message, order 77), then a relay round whose every delivery
/// fails its one allowed attempt ("HTTP 503 from the partner"): every message pending then is
/// parked.
pub fn park_hook<C: Backend>(conn: &mut C) {
    let _: Outcome<()> =
        idempotent_runtime::run(conn, &HOOK, &JobKey::new("hook:order-77"), |conn| {
            outbox::push(conn, "webhook", &serde_json::json!({ "order": 77 }))?;
            Ok::<_, Error>(())
        })
        .expect("running the hook job");
    idempotent_runtime::outbox::Relay::new()
        .max_attempts(1)
        .run_once(conn, |_message| Err::<(), _>("HTTP 503 from the partner"))
        .expect("a relay round");
}

/// Two keys of `job` (a template `...:<name>`, as `welcome:<name>`): `welcome:older` done 59m57s
/// ago and `welcome:newer` 10 minutes ago (SQLite): an hour's window that the older one leaves a
/// few seconds later.
pub fn keys_done_almost_an_hour_ago(conn: &mut SqliteConnection, job: &'static Job) {
    for (name, ago) in [("older", 3_597), ("newer", 600)] {
        let key = JobKey::new(format!("welcome:{name}"));
        let _: Outcome<()> =
            idempotent_runtime::run(conn, job, &key, |_| Ok::<_, Error>(())).expect("welcome");
        conn.batch_execute(&format!(
            "UPDATE done_jobs SET done_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '-{ago} seconds') \
             WHERE job_key = 'welcome:{name}'"
        ))
        .expect("backdating");
    }
}
