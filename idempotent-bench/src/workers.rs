//! `macro` on 1, 2, 4 and 8 connections against the database's own benchmark tool running a
//! hand-written job (`BEGIN`, the claim, the body, `COMMIT`: the floor's statements, one round
//! trip each) with as many clients. Rounds alternate the two; the ratio is the median of the
//! rounds' own ratios. Keys are made on the server by the cheapest unique function there is (no
//! hashing, no UUID strings), so the tool does no work the library does not.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::db::BenchDb;
use crate::stats::median;
use crate::variants::macro_job;

#[derive(Debug, Serialize)]
pub struct Workers {
    pub backend: &'static str,
    /// The tool, and what it sends.
    pub tool: &'static str,
    pub jobs_per_worker: u64,
    pub rounds: usize,
    pub points: Vec<WorkerPoint>,
}

#[derive(Debug, Serialize)]
pub struct WorkerPoint {
    pub workers: usize,
    /// Median jobs per second of `macro`, all workers together.
    pub library_jobs_per_second: f64,
    /// Median jobs per second of the tool, as many clients.
    pub native_jobs_per_second: f64,
    /// Time per job, library over the tool.
    pub library_over_native: f64,
}

pub fn measure<C: BenchDb>(
    url: &str,
    native: &dyn Fn(usize, u64) -> f64,
    tool: &'static str,
    rounds: usize,
) -> Workers {
    const JOBS_PER_WORKER: u64 = 300;
    let mut points = Vec::new();
    let mut first: i64 = 100_000_000;
    for workers in [1usize, 2, 4, 8] {
        let (mut library, mut tool_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut pair = [0.0; 2];
            for side in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
                pair[side] = if side == 0 {
                    first += 10_000_000;
                    library_rate::<C>(url, workers, JOBS_PER_WORKER, first)
                } else {
                    native(workers, JOBS_PER_WORKER)
                };
            }
            library.push(pair[0]);
            tool_rates.push(pair[1]);
            ratios.push(pair[1] / pair[0]);
        }
        points.push(WorkerPoint {
            workers,
            library_jobs_per_second: median(library),
            native_jobs_per_second: median(tool_rates),
            library_over_native: median(ratios),
        });
    }
    Workers {
        backend: C::NAME,
        tool,
        jobs_per_worker: JOBS_PER_WORKER,
        rounds,
        points,
    }
}

/// Jobs per second of `macro` on `workers` connections, `jobs` each, timed from when all are
/// connected.
fn library_rate<C: BenchDb>(url: &str, workers: usize, jobs: u64, first: i64) -> f64 {
    let barrier = std::sync::Barrier::new(workers + 1);
    let elapsed = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut conn = C::establish(url).expect("a worker's connection");
                    barrier.wait();
                    let start = first + worker as i64 * jobs as i64;
                    for job in start..start + jobs as i64 {
                        macro_job(&mut conn, job).expect("a job");
                    }
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        for handle in handles {
            handle.join().expect("a worker");
        }
        started.elapsed()
    });
    (workers as u64 * jobs) as f64 / elapsed.as_secs_f64()
}

pub const PGBENCH_TOOL: &str = "pgbench (prepared BEGIN, claim, body, COMMIT: 4 round trips)";

/// A hand-written job as a pgbench script: the key's digest is the job number, zero-padded.
pub const PGBENCH_SCRIPT: &str = "\\set n random(1, 9000000000000000)
BEGIN;
INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, done_at) VALUES (decode(lpad(to_hex(CAST(:n AS bigint)), 64, '0'), 'hex'), 'native:' || CAST(:n AS text), 'native', NULL, :n, (clock_timestamp() AT TIME ZONE 'UTC')) ON CONFLICT DO NOTHING;
INSERT INTO bench_effects (job) VALUES (:n);
COMMIT;
";

/// Jobs per second of `pgbench` (prepared statements, `clients` connections, `jobs` each).
pub fn pgbench(url: &str, script: &Path, clients: usize, jobs: u64) -> f64 {
    let output = std::process::Command::new("pgbench")
        .args(["--no-vacuum", "--protocol=prepared"])
        .arg(format!("--client={clients}"))
        .arg(format!("--jobs={clients}"))
        .arg(format!("--transactions={jobs}"))
        .arg(format!("--file={}", script.display()))
        .arg(url)
        .output()
        .unwrap_or_else(|e| {
            panic!("running pgbench: {e}; install PostgreSQL's client programs (Debian: apt-get install postgresql-client)")
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|tps| tps.parse().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench's output: {stdout}"))
}

pub const SLAP_TOOL: &str = "mariadb-slap (text BEGIN, claim, body, COMMIT: 4 round trips)";

/// A hand-written job for `mariadb-slap`: the key's digest is `UUID_SHORT()`, zero-padded.
const SLAP_QUERY: &str = "BEGIN;\
INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, done_at) VALUES (UNHEX(LPAD(HEX(UUID_SHORT()), 64, '0')), 'native', 'native', NULL, 1, UTC_TIMESTAMP(6));\
INSERT INTO bench_effects (job) VALUES (1);\
COMMIT";
const SLAP_STATEMENTS: u64 = 4;

/// A MySQL URL's parts, for command-line tools.
pub struct MysqlServer {
    host: String,
    port: String,
    user: String,
    password: Option<String>,
}

impl MysqlServer {
    pub fn parse(url: &str) -> Self {
        let rest = url.strip_prefix("mysql://").unwrap_or(url);
        let (credentials, address) = rest.rsplit_once('@').unwrap_or(("root", rest));
        let address = address.split('/').next().unwrap_or(address);
        let (user, password) = match credentials.split_once(':') {
            Some((user, password)) => (user, Some(password.to_owned())),
            None => (credentials, None),
        };
        let (host, port) = address.split_once(':').unwrap_or((address, "3306"));
        Self {
            host: host.to_owned(),
            port: port.to_owned(),
            user: user.to_owned(),
            password,
        }
    }
}

/// Jobs per second of `mariadb-slap` (`clients` connections, `jobs` each) in `database`.
pub fn mariadb_slap(server: &MysqlServer, database: &str, clients: usize, jobs: u64) -> f64 {
    let mut command = std::process::Command::new("mariadb-slap");
    command
        .arg(format!("--host={}", server.host))
        .arg(format!("--port={}", server.port))
        .arg(format!("--user={}", server.user))
        .arg(format!("--create-schema={database}"))
        .args(["--no-drop", "--iterations=1", "--delimiter=;"])
        .arg(format!("--concurrency={clients}"))
        // The limit is on all clients together.
        .arg(format!(
            "--number-of-queries={}",
            clients as u64 * jobs * SLAP_STATEMENTS
        ))
        .arg(format!("--query={SLAP_QUERY}"));
    if let Some(password) = &server.password {
        command.arg(format!("--password={password}"));
    }
    let output = command.output().unwrap_or_else(|e| {
        panic!("running mariadb-slap: {e}; install MariaDB's client programs (Debian: apt-get install mariadb-client)")
    });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "mariadb-slap failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seconds: f64 = stdout
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("Average number of seconds to run all queries:")
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no time in mariadb-slap's output: {stdout}"));
    (clients as u64 * jobs) as f64 / seconds
}
