//! One isolated database per test: a file (SQLite), a schema (PostgreSQL) or a database (MySQL),
//! reached by whichever connection type the backend under test uses.
//!
//! Backends are chosen with cargo features; a backend whose server cannot be reached fails its
//! tests with a message saying how to start it.

use std::marker::PhantomData;

use crate::backends::Backend;

/// Which server a backend talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Sqlite,
    Postgres,
    Mysql,
}

pub const POSTGRES_URL_VAR: &str = "IDEMPOTENT_POSTGRES_URL";
pub const MYSQL_URL_VAR: &str = "IDEMPOTENT_MYSQL_URL";

impl Server {
    /// The URL of the server's shared database, where tests create their own.
    pub fn base_url(self) -> String {
        match self {
            Server::Sqlite => String::new(),
            Server::Postgres => std::env::var(POSTGRES_URL_VAR)
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned()),
            Server::Mysql => std::env::var(MYSQL_URL_VAR)
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned()),
        }
    }

    /// What to do when the server cannot be reached.
    pub fn unreachable(self, url: &str, error: &dyn std::fmt::Display) -> String {
        match self {
            Server::Sqlite => format!("opening the SQLite database {url} failed: {error}"),
            Server::Postgres => format!(
                "PostgreSQL is not reachable at {url}: {error}\n\
                 Start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
                 (scripts/test does this), or point {POSTGRES_URL_VAR} at a server. \
                 To leave PostgreSQL out, build without the `postgres` and `async-postgres` features."
            ),
            Server::Mysql => format!(
                "MariaDB/MySQL is not reachable at {url}: {error}\n\
                 Start it with `start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd` \
                 (scripts/test does this), or point {MYSQL_URL_VAR} at a server. \
                 To leave MySQL out, build without the `mysql` and `async-mysql` features."
            ),
        }
    }
}

pub use crate::names::{unique_name, with_causes};

/// A fresh database for one test, with the runtime's and the tests' tables, dropped at the end.
pub struct Db<B: Backend> {
    url: String,
    /// Where to connect, and what to run, to drop it; `None` for an attached database.
    cleanup: Option<Cleanup>,
    backend: PhantomData<fn() -> B>,
}

enum Cleanup {
    Files(String),
    Sql { admin_url: String, sql: String },
}

impl<B: Backend> Db<B> {
    pub fn fresh() -> Self {
        let db = Self::empty();
        let mut conn = db.connect();
        B::prepare(&mut conn);
        db
    }

    /// A database of this test's own with nothing in it: no runtime tables, no test tables.
    pub fn empty() -> Self {
        let server = B::SERVER;
        let name = unique_name("idempotent_test");
        let (url, cleanup) = match server {
            Server::Sqlite => {
                let path = std::env::temp_dir()
                    .join(format!("{name}.db"))
                    .to_string_lossy()
                    .into_owned();
                (path.clone(), Cleanup::Files(path))
            }
            Server::Postgres => {
                let base = server.base_url();
                B::execute(&mut B::connect(&base), &format!("CREATE SCHEMA {name}"));
                let separator = if base.contains('?') { '&' } else { '?' };
                (
                    format!("{base}{separator}options=-csearch_path%3D{name}"),
                    Cleanup::Sql {
                        admin_url: base,
                        sql: format!("DROP SCHEMA IF EXISTS {name} CASCADE"),
                    },
                )
            }
            Server::Mysql => {
                let base = server.base_url();
                B::execute(
                    &mut B::connect(&base),
                    &format!("CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"),
                );
                let after_scheme = base.find("://").map_or(0, |i| i + 3);
                let server_part = match base[after_scheme..].find('/') {
                    Some(slash) => &base[..after_scheme + slash],
                    None => &base,
                };
                (
                    format!("{server_part}/{name}"),
                    Cleanup::Sql {
                        admin_url: base.clone(),
                        sql: format!("DROP DATABASE IF EXISTS {name}"),
                    },
                )
            }
        };
        Db {
            url,
            cleanup: Some(cleanup),
            backend: PhantomData,
        }
    }

    /// A new connection to this test's database.
    pub fn connect(&self) -> B::Conn {
        B::connect(&self.url)
    }

    /// Where a child process finds this database.
    pub fn locator(&self) -> &str {
        &self.url
    }

    /// The database a parent process made, by its locator; not dropped by this process.
    pub fn attach(locator: &str) -> Self {
        Db {
            url: locator.to_owned(),
            cleanup: None,
            backend: PhantomData,
        }
    }
}

impl<B: Backend> Drop for Db<B> {
    fn drop(&mut self) {
        match self.cleanup.take() {
            Some(Cleanup::Files(path)) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{path}{suffix}"));
                }
            }
            Some(Cleanup::Sql { admin_url, sql }) => {
                // Nothing here may panic: this also runs while a failed test unwinds.
                if let Ok(mut admin) = B::try_connect(&admin_url) {
                    let _ = B::try_execute(&mut admin, &sql);
                }
            }
            None => {}
        }
    }
}

/// How long a child process may take to reach its marker: generous, so that a loaded machine makes
/// a test slower rather than failing it.
const CHILD_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// This test binary, started again to run one test as a child process, with `env` telling it
/// what role to play; returned once the child has printed `marker` (and is ready to be killed).
/// Fails, saying which child, which line and what it printed instead, if the child exits or has
/// not printed `marker` within two minutes.
pub fn spawn_child_until(
    test_path: &str,
    env: &[(&str, &str)],
    marker: &str,
) -> std::process::Child {
    spawn_child_until_line(test_path, env, marker).0
}

/// [`spawn_child_until`], also returning the line that had the marker.
pub fn spawn_child_until_line(
    test_path: &str,
    env: &[(&str, &str)],
    marker: &str,
) -> (std::process::Child, String) {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};
    use std::time::Instant;

    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args([test_path, "--exact", "--nocapture", "--test-threads=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawning the child process");
    let stdout = child.stdout.take().expect("the child's stdout");
    // Read on a thread of its own, so that a child that prints nothing cannot hold the test past
    // its deadline.
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Drains to the end even once the test stopped listening: a child whose stdout closed
        // under it would fail writing its own test summary.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let deadline = Instant::now() + CHILD_DEADLINE;
    let mut printed = Vec::new();
    let ended = loop {
        match received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains(marker) => return (child, line),
            Ok(line) => printed.push(line),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                break format!("had not printed it within {CHILD_DEADLINE:?}, and was killed");
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break "exited".to_owned(),
        }
    };
    let status = child.wait().expect("reaping the child");
    panic!(
        "the child process running {test_path} was to print {marker:?}, but {ended} ({status}); \
         it printed (its stderr is above):\n{}",
        printed.join("\n")
    );
}

/// In a child process started by `spawn_child_until`: holds it where it is (after its marker)
/// until the parent kills it. Should the parent go away instead, its end of the pipe closes, and
/// the child exits here without going on (without committing, inside a job).
pub fn hold_until_killed() -> ! {
    let _ = std::io::stdin().read_line(&mut String::new());
    std::process::exit(101)
}

/// SIGKILLs a child, as an operator or the OOM killer would, and reaps it.
pub fn kill(mut child: std::process::Child) {
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reaping the child");
    assert!(
        !status.success(),
        "the child was killed, not finished: {status}"
    );
}

/// Waits for a child that ends itself (a worker that dies) to exit with `code`.
pub fn exits_with(mut child: std::process::Child, code: i32) {
    drop(child.stdin.take());
    let deadline = std::time::Instant::now() + CHILD_DEADLINE;
    loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            assert_eq!(
                status.code(),
                Some(code),
                "the child process ended with {status}"
            );
            return;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child process did not exit within {CHILD_DEADLINE:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits for a child that has done its part to exit, and checks that it succeeded.
pub fn finish(mut child: std::process::Child) {
    drop(child.stdin.take());
    let deadline = std::time::Instant::now() + CHILD_DEADLINE;
    loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            assert!(status.success(), "the child process failed: {status}");
            return;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child process did not exit within {CHILD_DEADLINE:?} after its work");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
