//! One MariaDB server of the test's own, started with options the machine's server does not have
//! (binary logging, say): its own data directory and port, removed when the test ends.

use std::process::Command;
use std::time::{Duration, Instant};

use diesel::prelude::*;

use super::processes::{RunDir, free_ports, require};

const MARIADBD: &str = "/usr/sbin/mariadbd";

pub struct MariaDb {
    /// The server stops, and its files go, when this drops.
    _dir: RunDir,
    pub port: u16,
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
        let mut command = Command::new(MARIADBD);
        command
            .args([
                "--no-defaults".to_owned(),
                "--user=root".to_owned(),
                format!("--datadir={}", data.display()),
                format!("--socket={}/mysqld.sock", data.display()),
                format!("--pid-file={}/mysqld.pid", data.display()),
                format!("--port={port}"),
                "--bind-address=127.0.0.1".to_owned(),
                "--skip-name-resolve".to_owned(),
                "--innodb-buffer-pool-size=64M".to_owned(),
            ])
            .args(options);
        let server = dir.spawn("mariadbd", command);
        let url = format!("mysql://root@127.0.0.1:{port}/mysql");
        let deadline = Instant::now() + Duration::from_secs(60);
        while MysqlConnection::establish(&url).is_err() {
            assert!(
                !dir.exited(server),
                "mariadbd exited while starting:\n{}",
                dir.log_tail("mariadbd")
            );
            assert!(
                Instant::now() < deadline,
                "mariadbd took no connection within 60 s:\n{}",
                dir.log_tail("mariadbd")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        MariaDb { _dir: dir, port }
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}", self.port)
    }
}
