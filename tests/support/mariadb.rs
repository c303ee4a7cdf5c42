//! One MariaDB server of the test's own, started with options the machine's server does not have
//! (binary logging, say): its own data directory and port, removed when the test ends.

use std::process::Command;
use std::time::{Duration, Instant};

use diesel::prelude::*;

use super::processes::{RunDir, free_ports, require, start_again};

const MARIADBD: &str = "/usr/sbin/mariadbd";

pub struct MariaDb {
    /// The server stops, and its files go, when this drops.
    dir: RunDir,
    pub port: u16,
    /// How the server was started, to start it again.
    command: Vec<String>,
    server: usize,
}

impl MariaDb {
    /// Starts a server with `options` on top of a minimal configuration and waits until it
    /// takes connections.
    pub fn start(setup: &str, options: &[&str]) -> MariaDb {
        require(MARIADBD, "MariaDB (Debian package `mariadb-server`)");
        let mut dir = RunDir::new(setup);
        let port = free_ports(1)[0];
        let data = dir.subdir("data", None);
        let mut install = Command::new("mariadb-install-db");
        install.args([
            "--no-defaults",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            &format!("--datadir={}", data.display()),
        ]);
        dir.run("mariadb-install-db", install);
        let mut command = vec![
            "--no-defaults".to_owned(),
            "--user=root".to_owned(),
            format!("--datadir={}", data.display()),
            format!("--socket={}/mysqld.sock", data.display()),
            format!("--pid-file={}/mysqld.pid", data.display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--skip-name-resolve".to_owned(),
            "--innodb-buffer-pool-size=64M".to_owned(),
        ];
        command.extend(options.iter().map(|option| (*option).to_owned()));
        let server = spawn(&mut dir, &command, port).unwrap_or_else(|error| panic!("{error}"));
        MariaDb {
            dir,
            port,
            command,
            server,
        }
    }

    /// SIGKILL to the server (a machine that dies), then the same server started again on its
    /// data (InnoDB's crash recovery); returns once it takes connections.
    #[allow(
        dead_code,
        reason = "the explorer's fault; the other tests start servers only"
    )]
    pub fn crash_and_restart(&mut self) {
        self.dir.kill(self.server);
        let (dir, command, port) = (&mut self.dir, &self.command, self.port);
        self.server = start_again("mariadbd", || spawn(dir, command, port));
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}", self.port)
    }
}

/// Starts `mariadbd` with `args` and waits until it takes connections on `port`.
fn spawn(dir: &mut RunDir, args: &[String], port: u16) -> Result<usize, String> {
    let mut command = Command::new(MARIADBD);
    command.args(args);
    let server = dir.spawn("mariadbd", command);
    let url = format!("mysql://root@127.0.0.1:{port}/mysql");
    let deadline = Instant::now() + Duration::from_secs(60);
    while MysqlConnection::establish(&url).is_err() {
        if dir.exited(server) {
            return Err(format!(
                "mariadbd exited while starting:\n{}",
                dir.log_tail("mariadbd")
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "mariadbd took no connection within 60 s:\n{}",
                dir.log_tail("mariadbd")
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(server)
}
