//! A three-node MariaDB Galera cluster on loopback: Debian's galera-4 provider with the machine's
//! `mariadbd`, each node with its own data directory and ports, the first bootstrapped with
//! `--wsrep-new-cluster`, the others joining by state transfer (rsync).

use std::process::Command;
use std::time::Duration;

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;

use super::processes::{Owner, RunDir, free_ports, require, wait_until};

const MARIADBD: &str = "/usr/sbin/mariadbd";
const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

pub struct Node {
    pub port: u16,
    server: Option<usize>,
    name: String,
}

pub struct Galera {
    pub dir: RunDir,
    pub nodes: Vec<Node>,
}

impl Galera {
    /// Starts `count` nodes and waits until every one is synced in one primary component.
    pub fn start(count: usize) -> Galera {
        require(MARIADBD, "MariaDB (Debian package `mariadb-server`)");
        require(PROVIDER, "the Galera provider (Debian package `galera-4`)");
        require(
            "/usr/bin/rsync",
            "rsync (Debian package `rsync`), Galera's state transfer",
        );
        let mut dir = RunDir::new("galera");
        // Per node: the client port, group communication, incremental and full state transfer.
        let ports = free_ports(count * 4);
        let group: Vec<String> = (0..count)
            .map(|i| format!("127.0.0.1:{}", ports[i * 4 + 1]))
            .collect();
        let mut nodes = Vec::new();
        for i in 0..count {
            let [port, gcomm, ist, sst] = [0, 1, 2, 3].map(|k| ports[i * 4 + k]);
            let name = format!("node{i}");
            // A joiner's data comes whole from the donor; the rsync daemon that receives it runs
            // as `nobody` when started by root, so it must own the empty directory.
            let data = dir.subdir(
                &name,
                if i == 0 {
                    None
                } else {
                    Owner::when_root("nobody")
                },
            );
            if i == 0 {
                let mut install = Command::new("mariadb-install-db");
                install.args([
                    "--no-defaults",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    &format!("--datadir={}", data.display()),
                ]);
                dir.run("mariadb-install-db", install);
            }
            let mut command = Command::new(MARIADBD);
            command.args([
                "--no-defaults".to_owned(),
                "--user=root".to_owned(),
                format!("--datadir={}", data.display()),
                format!("--socket={}/mysqld.sock", data.display()),
                format!("--pid-file={}/mysqld.pid", data.display()),
                format!("--port={port}"),
                "--bind-address=127.0.0.1".to_owned(),
                "--skip-name-resolve".to_owned(),
                "--skip-log-bin".to_owned(),
                // What Galera requires of every node.
                "--binlog-format=ROW".to_owned(),
                "--default-storage-engine=InnoDB".to_owned(),
                "--innodb-autoinc-lock-mode=2".to_owned(),
                "--innodb-buffer-pool-size=64M".to_owned(),
                // A commit is durable once the cluster has it in order: the kill below is of a
                // node, and its peers hold every commit it acknowledged.
                "--innodb-flush-log-at-trx-commit=2".to_owned(),
                "--max-connections=200".to_owned(),
                "--wsrep-on=ON".to_owned(),
                format!("--wsrep-provider={PROVIDER}"),
                "--wsrep-cluster-name=idempotent".to_owned(),
                format!("--wsrep-cluster-address=gcomm://{}", group.join(",")),
                format!("--wsrep-node-name={name}"),
                format!("--wsrep-node-address=127.0.0.1:{gcomm}"),
                // A dead node is suspected after 2 s (default 5 s) so the run's kill costs
                // seconds, not half a minute.
                format!(
                    "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{gcomm};ist.recv_addr=127.0.0.1:{ist};\
                     evs.suspect_timeout=PT2S;evs.inactive_timeout=PT4S;evs.keepalive_period=PT0.5S;\
                     evs.inactive_check_period=PT0.5S;gcache.size=64M"
                ),
                "--wsrep-sst-method=rsync".to_owned(),
                format!("--wsrep-sst-receive-address=127.0.0.1:{sst}"),
            ]);
            if i == 0 {
                command.arg("--wsrep-new-cluster");
            }
            let server = dir.spawn(&name, command);
            let node = Node {
                port,
                server: Some(server),
                name,
            };
            if i == 0 {
                // The joiners need a primary component to join.
                wait_synced(&mut dir, &node, Duration::from_secs(60));
            }
            nodes.push(node);
        }
        let mut galera = Galera { dir, nodes };
        for i in 1..count {
            let node = &galera.nodes[i];
            wait_synced(&mut galera.dir, node, Duration::from_secs(120));
        }
        galera.wait_cluster_size(0, count);
        galera
    }

    /// The URL of database `db` on node `i`.
    pub fn url(&self, i: usize, db: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}", self.nodes[i].port)
    }

    /// SIGKILL to node `i`, as a machine that dies.
    pub fn kill(&mut self, i: usize) {
        if let Some(server) = self.nodes[i].server.take() {
            self.dir.kill(server);
        }
    }

    /// Runs SQL on node `i`.
    pub fn admin(&self, i: usize, sql: &str) {
        let mut conn = MysqlConnection::establish(&self.url(i, "mysql"))
            .unwrap_or_else(|e| panic!("node {i}: {e}"));
        conn.batch_execute(sql)
            .unwrap_or_else(|e| panic!("node {i}: `{sql}`: {e}"));
    }

    /// A status variable of node `i`.
    pub fn status(&self, i: usize, variable: &str) -> Option<String> {
        status(self.nodes[i].port, variable)
    }

    /// Waits until node `i` sees a primary component of `size` nodes.
    pub fn wait_cluster_size(&self, i: usize, size: usize) {
        wait_until(
            &format!("node {i} seeing a cluster of {size} nodes"),
            Duration::from_secs(60),
            || {
                self.status(i, "wsrep_cluster_size").as_deref() == Some(&size.to_string())
                    && self.status(i, "wsrep_cluster_status").as_deref() == Some("Primary")
            },
        );
    }
}

fn status(port: u16, variable: &str) -> Option<String> {
    #[derive(QueryableByName)]
    struct Value {
        #[diesel(sql_type = diesel::sql_types::Text)]
        value: String,
    }
    let mut conn =
        MysqlConnection::establish(&format!("mysql://root@127.0.0.1:{port}/mysql")).ok()?;
    diesel::sql_query(
        "SELECT CAST(variable_value AS CHAR) AS value FROM information_schema.global_status WHERE variable_name = ?",
    )
    .bind::<diesel::sql_types::Text, _>(variable.to_uppercase())
    .get_result::<Value>(&mut conn)
    .ok()
    .map(|v| v.value)
}

fn wait_synced(dir: &mut RunDir, node: &Node, limit: Duration) {
    let server = node.server.expect("a started node");
    let deadline = std::time::Instant::now() + limit;
    loop {
        if status(node.port, "wsrep_local_state_comment").as_deref() == Some("Synced") {
            return;
        }
        assert!(
            !dir.exited(server),
            "Galera {} exited while starting:\n{}",
            node.name,
            dir.log_tail(&node.name)
        );
        assert!(
            std::time::Instant::now() < deadline,
            "Galera {} was not synced within {limit:?}:\n{}",
            node.name,
            dir.log_tail(&node.name)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
