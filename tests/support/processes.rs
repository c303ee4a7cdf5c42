//! Database servers the cluster tests start for themselves: each in a directory of its own under
//! the system's temporary folder, on loopback ports nobody else holds, killed and removed when the
//! test ends however it ends, and cleaned up at the next start if a crashed run left them behind.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where every run directory lives; a run directory's name ends in the owning test process's id.
fn base() -> PathBuf {
    std::env::temp_dir().join("idempotent-cluster")
}

/// A directory for one setup's servers. Every process started through it is recorded in its `pids`
/// file, so a later run can tell its leftovers from another live test's servers.
pub struct RunDir {
    path: PathBuf,
    processes: Vec<Server>,
}

impl RunDir {
    /// Removes what crashed runs left behind, then makes a fresh directory for `setup`.
    pub fn new(setup: &str) -> RunDir {
        clean_leftovers();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = base().join(format!("{setup}-{nanos}-{}", std::process::id()));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        RunDir {
            path,
            processes: Vec::new(),
        }
    }

    /// A subdirectory, created (empty) and, when the tests run as root, owned by `owner`.
    pub fn subdir(&self, name: &str, owner: Option<Owner>) -> PathBuf {
        let dir = self.path.join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        if let Some(owner) = owner {
            owner.chown(&dir);
        }
        dir
    }

    /// Starts a long-running server in a process group of its own (so that a kill takes its
    /// helpers too, as a machine that dies would), output to `<name>.log`.
    pub fn spawn(&mut self, name: &str, mut command: Command) -> usize {
        use std::os::unix::process::CommandExt as _;
        let log = self.log_path(name);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        command
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .process_group(0);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({command:?}): {e}"));
        self.record(child.id());
        self.processes.push(Server { child: Some(child) });
        self.processes.len() - 1
    }

    /// Runs a setup command to its end (`initdb`, `pg_basebackup`, ...); panics with its output
    /// if it fails.
    pub fn run(&mut self, name: &str, mut command: Command) {
        let started = Instant::now();
        let output = command
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {name} ({command:?}): {e}"));
        assert!(
            output.status.success(),
            "{name} failed ({}) after {:.1?}: {}{}",
            output.status,
            started.elapsed(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    pub fn log_path(&self, name: &str) -> PathBuf {
        self.path.join(format!("{name}.log"))
    }

    /// The last lines a server wrote, for a failure message.
    pub fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.log_path(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// SIGKILL to the server and everything it started, at once.
    pub fn kill(&mut self, server: usize) {
        self.processes[server].kill();
    }

    /// Whether the server has exited (by itself or killed).
    pub fn exited(&mut self, server: usize) -> bool {
        match self.processes[server].child.as_mut() {
            None => true,
            Some(child) => child.try_wait().ok().flatten().is_some(),
        }
    }

    fn record(&self, pid: u32) {
        let pids = self.path.join("pids");
        if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(pids) {
            let _ = writeln!(file, "{pid}");
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        for server in &mut self.processes {
            server.kill();
        }
        if std::env::var_os("IDEMPOTENT_KEEP_CLUSTER_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

struct Server {
    child: Option<Child>,
}

impl Server {
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group("KILL", child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends `signal` to the process group led by `pid`.
fn signal_group(signal: &str, pid: u32) {
    let _ = Command::new("kill")
        .args(["-s", signal, "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`) to one process.
pub fn signal(signal: &str, pid: u32) {
    let status = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -s {signal} {pid} failed: {status}");
}

/// Kills the servers of runs whose test process is gone, and removes their directories. A live
/// run's directory (another worktree testing at the same time) is left alone, and a pid is only
/// signalled while its command line still names the dead run's directory.
fn clean_leftovers() {
    let Ok(entries) = std::fs::read_dir(base()) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let owner = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.rsplit('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if owner.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
            continue;
        }
        let marker = dir.to_string_lossy().into_owned();
        let pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
        for pid in pids.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&marker) {
                signal_group("KILL", pid);
                let _ = Command::new("kill")
                    .args(["-s", "KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `count` loopback ports that are free right now (held together while chosen, so distinct).
pub fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    let ports: BTreeSet<u16> = listeners
        .iter()
        .map(|l| l.local_addr().expect("port").port())
        .collect();
    assert_eq!(ports.len(), count);
    ports.into_iter().collect()
}

/// Polls `done` until it holds; panics naming `what` did not happen within `limit`.
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts a server again after a crash: `start` is tried up to ten times, half a second apart,
/// since the killed server's processes take a moment to be gone (its shared memory, its port, its
/// lock files) and a start meanwhile exits at once; panics with every failure.
pub fn start_again<T>(what: &str, mut start: impl FnMut() -> Result<T, String>) -> T {
    let mut failures = Vec::new();
    while failures.len() < 10 {
        match start() {
            Ok(server) => return server,
            Err(error) => failures.push(error),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!(
        "{what} did not start again after a crash, 10 tries:\n{}",
        failures.join("\n---\n")
    );
}

/// A system user that owns a server's files when the tests run as root: PostgreSQL refuses to run
/// as root, and the rsync that copies a Galera node's data drops to `nobody`.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// `name` from `/etc/passwd` when this process is root; `None` (run as ourselves) otherwise.
    pub fn when_root(name: &str) -> Option<Owner> {
        use std::os::unix::fs::MetadataExt as _;
        let me = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
        if me != 0 {
            return None;
        }
        let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
        let fields: Vec<&str> = passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&name))
            .unwrap_or_else(|| {
                panic!("the tests run as root and need the system user `{name}` to own a server's files; it comes with the server's Debian package")
            });
        Some(Owner {
            uid: fields[2].parse().expect("uid"),
            gid: fields[3].parse().expect("gid"),
        })
    }

    pub fn chown(self, path: &Path) {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }

    /// Runs `command` as this user.
    pub fn apply(owner: Option<Owner>, command: &mut Command) {
        use std::os::unix::process::CommandExt as _;
        if let Some(owner) = owner {
            command.uid(owner.uid).gid(owner.gid);
        }
    }
}

/// Panics with how to get `what` when `path` is missing: nothing is skipped.
pub fn require(path: &str, what: &str) {
    assert!(
        Path::new(path).exists(),
        "{path} is missing: install {what} (scripts/test installs it with apt-get)"
    );
}
