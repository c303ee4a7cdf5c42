//! PostgreSQL servers of the cluster tests' own (PostgreSQL 15 from `/usr/lib/postgresql/15/bin`):
//! a primary with a streaming standby made by `pg_basebackup -R`, and PgBouncer in front of a
//! server. Run as the `postgres` system user when the tests run as root (PostgreSQL refuses root).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;

use super::processes::{Owner, RunDir, free_ports, require, signal, start_again, wait_until};

const BIN: &str = "/usr/lib/postgresql/15/bin";

fn bin(name: &str) -> Command {
    Command::new(format!("{BIN}/{name}"))
}

pub struct Pg {
    pub port: u16,
    data: PathBuf,
    server: Option<usize>,
}

/// Commit durability across the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'`: a commit returns once the standby has flushed it.
    Synchronous,
    /// No synchronous standby: a commit returns once the primary has flushed it.
    Asynchronous,
}

pub struct Postgres {
    pub dir: RunDir,
    owner: Option<Owner>,
    pub primary: Pg,
    pub standby: Option<Pg>,
}

impl Postgres {
    /// One server, with a database `test`.
    pub fn single(setup: &str) -> Postgres {
        require(
            &format!("{BIN}/postgres"),
            "PostgreSQL 15 (Debian package `postgresql-15`)",
        );
        let mut dir = RunDir::new(setup);
        let owner = Owner::when_root("postgres");
        let port = free_ports(1)[0];
        let primary = init_and_start(&mut dir, owner, "primary", port, &[]);
        let cluster = Postgres {
            dir,
            owner,
            primary,
            standby: None,
        };
        cluster.admin("CREATE DATABASE test");
        cluster
    }

    /// A primary and a streaming standby of it.
    pub fn replicated(replication: Replication) -> Postgres {
        Self::replicated_with(replication, &[])
    }

    /// [`replicated`](Self::replicated), the standby started with `standby_settings` too (such as
    /// `recovery_min_apply_delay=3s`: a standby that lags the primary by that much).
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn replicated_with(replication: Replication, standby_settings: &[&str]) -> Postgres {
        let setup = match replication {
            Replication::Synchronous => "pg-sync",
            Replication::Asynchronous => "pg-async",
        };
        let mut cluster = Postgres::single(setup);
        let port = free_ports(1)[0];
        let data = cluster.dir.subdir("standby", cluster.owner);
        // PostgreSQL starts only on a data directory no one else can read.
        std::fs::set_permissions(&data, {
            let mut p = perms(&data);
            std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o700);
            p
        })
        .expect("chmod 700 the standby's data directory");
        let mut backup = bin("pg_basebackup");
        backup.args([
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.primary.port.to_string(),
            "-U",
            "postgres",
            "-D",
            &data.to_string_lossy(),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ]);
        Owner::apply(cluster.owner, &mut backup);
        cluster.dir.run("pg_basebackup", backup);
        let standby = start(
            &mut cluster.dir,
            cluster.owner,
            "standby",
            data,
            port,
            standby_settings,
        );
        cluster.standby = Some(standby);
        // Only now: the standby's copy of the configuration must not name a synchronous standby
        // of its own, or the promoted server would wait for one that does not exist.
        let standby_names = match replication {
            Replication::Synchronous => "*",
            Replication::Asynchronous => "",
        };
        cluster.admin(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{standby_names}'"
        ));
        cluster.admin("SELECT pg_reload_conf()");
        wait_until(
            "the standby streaming from the primary",
            Duration::from_secs(30),
            || {
                query_text(
                    cluster.primary.port,
                    "SELECT COALESCE(MAX(sync_state), '') AS value FROM pg_stat_replication WHERE state = 'streaming'",
                )
                .is_some_and(|state| {
                    state
                        == match replication {
                            Replication::Synchronous => "sync",
                            Replication::Asynchronous => "async",
                        }
                })
            },
        );
        cluster
    }

    /// Every server, in the order a multi-host URL lists them.
    fn ports(&self) -> Vec<u16> {
        std::iter::once(self.primary.port)
            .chain(self.standby.as_ref().map(|s| s.port))
            .collect()
    }

    /// The URL workers use: every host, and libpq's (and tokio-postgres's) choice of the one that
    /// accepts writes.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "postgres://postgres@{}/test?target_session_attrs=read-write&connect_timeout=5",
            hosts.join(",")
        )
    }

    /// The URL of one server.
    pub fn url_of(port: u16, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{db}")
    }

    /// Runs SQL on the primary's `postgres` database.
    pub fn admin(&self, sql: &str) {
        execute(&Self::url_of(self.primary.port, "postgres"), sql);
    }

    /// The primary's WAL sender process: stopping it leaves the standby behind the primary, as a
    /// slow or cut network would; what the primary commits from then on never reaches the standby.
    pub fn wal_sender_pid(&self) -> u32 {
        let mut pid = None;
        wait_until(
            "the primary's WAL sender streaming",
            Duration::from_secs(30),
            || {
                pid = query_text(
                self.primary.port,
                "SELECT CAST(pid AS TEXT) AS value FROM pg_stat_replication WHERE state = 'streaming'",
            )
            .and_then(|p| p.parse().ok());
                pid.is_some()
            },
        );
        pid.expect("a pid")
    }

    /// The standby's URL for database `db`.
    pub fn standby_url(&self, db: &str) -> String {
        Self::url_of(self.standby.as_ref().expect("a standby").port, db)
    }

    /// SIGKILL to the primary and every process of it, as a machine that dies.
    ///
    /// A signal to the postmaster's process group does not reach its backends: each runs in a
    /// session of its own (`setsid`), and notices the postmaster's death only when it next waits.
    /// A WAL sender stopped by [`pause`](Self::pause) while it held `SyncRepLock` then left every
    /// backend committing behind it blocked on that lock for good, its client waiting with it (the
    /// synchronous failover test hung 1 run in 6; every run left the stopped WAL sender behind).
    /// The postmaster is stopped first (it forks nothing more), then each of its processes and
    /// the postmaster are killed.
    pub fn kill_primary(&mut self) {
        let postmaster = std::fs::read_to_string(self.primary.data.join("postmaster.pid"))
            .ok()
            .and_then(|pid| pid.lines().next()?.trim().parse::<u32>().ok());
        if let Some(postmaster) = postmaster {
            signal("STOP", postmaster);
            for child in children_of(postmaster) {
                let _ = Command::new("kill")
                    .args(["-s", "KILL", &child.to_string()])
                    .status();
            }
        }
        if let Some(server) = self.primary.server.take() {
            self.dir.kill(server);
        }
        if let Some(postmaster) = postmaster {
            let _ = Command::new("kill")
                .args(["-s", "KILL", &postmaster.to_string()])
                .status();
        }
    }

    /// SIGKILL to the primary and every process of it, then the same server started again on its
    /// data (crash recovery); returns once it accepts connections.
    #[allow(
        dead_code,
        reason = "the explorer's fault; tests/cluster.rs fails over instead"
    )]
    pub fn crash_and_restart_primary(&mut self) {
        self.kill_primary();
        let (data, port) = (self.primary.data.clone(), self.primary.port);
        let (dir, owner) = (&mut self.dir, self.owner);
        self.primary = start_again("PostgreSQL", || {
            try_start(dir, owner, "primary", data.clone(), port, &[])
        });
    }

    /// Promotes the standby; returns once it accepts writes.
    pub fn promote_standby(&mut self) {
        let standby = self.standby.as_ref().expect("a standby");
        let mut promote = bin("pg_ctl");
        promote.args([
            "promote",
            "-D",
            &standby.data.to_string_lossy(),
            "-w",
            "-t",
            "60",
        ]);
        Owner::apply(self.owner, &mut promote);
        self.dir.run("pg_ctl promote", promote);
        let port = standby.port;
        wait_until(
            "the promoted standby accepting writes",
            Duration::from_secs(60),
            || {
                query_text(port, "SELECT CAST(pg_is_in_recovery() AS TEXT) AS value").as_deref()
                    == Some("false")
            },
        );
    }

    /// Stops a process where it is (SIGSTOP).
    pub fn pause(pid: u32) {
        signal("STOP", pid);
    }
}

/// The processes whose parent is `parent`, from `/proc`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid ...`; `comm` may hold spaces and parentheses.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

fn perms(path: &std::path::Path) -> std::fs::Permissions {
    std::fs::metadata(path).expect("a directory").permissions()
}

/// Runs SQL at `url`.
pub fn execute(url: &str, sql: &str) {
    let mut conn = PgConnection::establish(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    conn.batch_execute(sql)
        .unwrap_or_else(|e| panic!("`{sql}` at {url}: {e}"));
}

/// One text value from a query on a server's `test` database (or `postgres` before it exists).
pub fn query_text(port: u16, sql: &str) -> Option<String> {
    #[derive(QueryableByName)]
    struct Value {
        #[diesel(sql_type = diesel::sql_types::Text)]
        value: String,
    }
    let mut conn = PgConnection::establish(&Postgres::url_of(port, "postgres")).ok()?;
    diesel::sql_query(sql)
        .get_result::<Value>(&mut conn)
        .ok()
        .map(|v| v.value)
}

fn init_and_start(
    dir: &mut RunDir,
    owner: Option<Owner>,
    name: &str,
    port: u16,
    settings: &[&str],
) -> Pg {
    let data = dir.subdir(name, owner);
    let mut initdb = bin("initdb");
    initdb.args([
        "-D",
        &data.to_string_lossy(),
        "-U",
        "postgres",
        "--auth=trust",
        "-E",
        "UTF8",
        "--no-sync",
        "--no-instructions",
    ]);
    Owner::apply(owner, &mut initdb);
    dir.run("initdb", initdb);
    start(dir, owner, name, data, port, settings)
}

fn start(
    dir: &mut RunDir,
    owner: Option<Owner>,
    name: &str,
    data: PathBuf,
    port: u16,
    settings: &[&str],
) -> Pg {
    try_start(dir, owner, name, data, port, settings).unwrap_or_else(|error| panic!("{error}"))
}

/// [`start`], saying why the server did not come up instead of panicking.
fn try_start(
    dir: &mut RunDir,
    owner: Option<Owner>,
    name: &str,
    data: PathBuf,
    port: u16,
    settings: &[&str],
) -> Result<Pg, String> {
    let mut postgres = bin("postgres");
    postgres.arg("-D").arg(&data);
    let port_setting = format!("port={port}");
    let socket_setting = format!("unix_socket_directories={}", data.display());
    for setting in [
        port_setting.as_str(),
        "listen_addresses=127.0.0.1",
        socket_setting.as_str(),
        "max_connections=100",
        "shared_buffers=32MB",
        "wal_level=replica",
        "max_wal_senders=5",
        "logging_collector=off",
    ]
    .iter()
    .chain(settings)
    {
        postgres.arg("-c").arg(setting);
    }
    Owner::apply(owner, &mut postgres);
    let server = dir.spawn(name, postgres);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while query_text(port, "SELECT 'up' AS value").is_none() {
        if dir.exited(server) {
            return Err(format!(
                "PostgreSQL {name} exited while starting:\n{}",
                dir.log_tail(name)
            ));
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "PostgreSQL {name} did not accept connections on port {port} within 60 s:\n{}",
                dir.log_tail(name)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(Pg {
        port,
        data,
        server: Some(server),
    })
}

/// PgBouncer in transaction pooling mode in front of `server`'s database `test`.
pub struct PgBouncer {
    pub port: u16,
}

impl PgBouncer {
    /// Listens on a free loopback port; `pool_size` server connections are shared by all clients.
    pub fn start(cluster: &mut Postgres, pool_size: u32) -> PgBouncer {
        Self::start_with(cluster, pool_size, "")
    }

    /// [`start`](Self::start) with `settings` (lines of `pgbouncer.ini`'s `[pgbouncer]` section,
    /// each ending in a newline) added.
    pub fn start_with(cluster: &mut Postgres, pool_size: u32, settings: &str) -> PgBouncer {
        require(
            "/usr/sbin/pgbouncer",
            "PgBouncer (Debian package `pgbouncer`)",
        );
        let port = free_ports(1)[0];
        let dir = cluster.dir.subdir("pgbouncer", cluster.owner);
        let ini = dir.join("pgbouncer.ini");
        let users = dir.join("users.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n").expect("users.txt");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 test = host=127.0.0.1 port={server} dbname=test\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 pool_mode = transaction\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 200\n\
                 admin_users = postgres\n\
                 {settings}",
                server = cluster.primary.port,
                users = users.display(),
            ),
        )
        .expect("pgbouncer.ini");
        if let Some(owner) = cluster.owner {
            owner.chown(&ini);
            owner.chown(&users);
        }
        let mut command = Command::new("/usr/sbin/pgbouncer");
        command.arg(&ini);
        Owner::apply(cluster.owner, &mut command);
        let server = cluster.dir.spawn("pgbouncer", command);
        let url = format!("postgres://postgres@127.0.0.1:{port}/test");
        wait_until(
            &format!("PgBouncer accepting connections on port {port}"),
            Duration::from_secs(30),
            || {
                assert!(
                    !cluster.dir.exited(server),
                    "PgBouncer exited while starting:\n{}",
                    cluster.dir.log_tail("pgbouncer")
                );
                PgConnection::establish(&url).is_ok()
            },
        );
        PgBouncer { port }
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }
}
