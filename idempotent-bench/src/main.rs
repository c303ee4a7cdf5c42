//! The wrapper costs one indexed insert, and nothing more: `#[idempotent_job]` side by side with
//! the true floor (the fewest round trips a hand-written job needs, with the best transport each
//! backend offers), with idiomatic Diesel, and with the databases' own benchmark tools, on SQLite,
//! PostgreSQL and MariaDB, in one run. Then round trips per job, counted; what claims and replays
//! cost as `done_jobs` grows; and claims' throughput and p99 while a prune runs.
//!
//! Run it with `cargo bench --bench jobs` from the repository root (the servers must be up;
//! `scripts/test` starts them; `pgbench` and `mariadb-slap` must be on the `PATH`). Options, after
//! `--` (or as `IDEMPOTENT_BENCH_*` variables):
//!
//! * `--quick`: a smoke run at small sizes (a minute or two);
//! * `--big` (`IDEMPOTENT_BENCH_BIG=1`): the sizes: growth to 10,000,000 rows on the
//!   servers, and the prune of 1,000,000 lapsed of 6,000,000 rows (about an hour; ~6 GB of disk at
//!   the peak, each big database dropped as soon as it is measured);
//! * `--only=throughput,round-trips,growth,relay,prune,async,workers,compile` (`IDEMPOTENT_BENCH_ONLY`;
//!   `async`: diesel-async's PostgreSQL connection, macro beside hand-written);
//! * `--backends=sqlite,sqlite-wal,postgres,mariadb` (`IDEMPOTENT_BENCH_BACKENDS`);
//! * `IDEMPOTENT_BENCH_ROUNDS`, `IDEMPOTENT_BENCH_JOBS` (9 rounds of 500 jobs of each variant) and
//!   `IDEMPOTENT_BENCH_WORKER_ROUNDS` (9); `IDEMPOTENT_BENCH_GROWTH=0,1000000,5000000`: the
//!   growth sizes.
//!
//! * `IDEMPOTENT_BENCH_LATENCY_US=<µs>`: the throughput section on PostgreSQL and MariaDB through
//!   a loopback proxy that holds each round trip that long (a network's latency; every variant
//!   alike);
//! * `IDEMPOTENT_BENCH_PROFILE=<variant>:<jobs>` (say `macro:20000`): that variant alone, on the
//!   first backend of `--backends`, that many jobs in a loop, and the time per job: a process to
//!   run under `valgrind --tool=callgrind`, `strace -c` or `perf`, variant against variant.
//!
//! It prints a table and writes `target/bench/jobs.json` (every figure) and `target/bench/jobs.svg`
//! (throughput by variant and backend).

mod async_pg;
mod backend;
mod chart;
mod compile;
mod databases;
mod db;
mod growth;
mod prune;
mod relay;
mod report;
mod roundtrips;
mod stats;
mod throughput;
mod transport;
mod variants;
mod workers;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use diesel::prelude::*;

use crate::backend::{Plan, prepared};
use crate::databases::Databases;
use crate::report::{BackendReport, Machine, Report};

/// The command line and the `IDEMPOTENT_BENCH_*` variables.
struct Options {
    quick: bool,
    big: bool,
    only: Option<Vec<String>>,
    backends: Vec<String>,
}

impl Options {
    fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let value = |flag: &str, var: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("--{flag}=")).map(str::to_owned))
                .or_else(|| std::env::var(var).ok())
        };
        let list = |s: String| {
            s.split(',')
                .map(|p| p.trim().to_owned())
                .collect::<Vec<_>>()
        };
        let truthy = |var: &str| std::env::var(var).is_ok_and(|v| v == "1" || v == "true");
        Self {
            quick: args.iter().any(|a| a == "--quick") || truthy("IDEMPOTENT_BENCH_QUICK"),
            big: args.iter().any(|a| a == "--big") || truthy("IDEMPOTENT_BENCH_BIG"),
            only: value("only", "IDEMPOTENT_BENCH_ONLY").map(list),
            backends: value("backends", "IDEMPOTENT_BENCH_BACKENDS").map_or_else(
                || list("sqlite,sqlite-wal,postgres,mariadb".to_owned()),
                list,
            ),
        }
    }

    fn wants(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|s| s == section))
    }

    fn backend(&self, name: &str) -> bool {
        self.backends.iter().any(|b| b == name)
    }

    /// What to measure on a backend; `server`: PostgreSQL or MariaDB (the big sizes are theirs).
    fn plan(&self, default_port: Option<u16>, grows: bool) -> Plan {
        let server = default_port.is_some();
        let growth_sizes = match (self.quick, self.big && server) {
            (true, _) => vec![0, 100_000],
            (false, false) => vec![0, 1_000_000],
            (false, true) => vec![0, 1_000_000, 10_000_000],
        };
        let prune = match (self.quick, self.big) {
            (true, _) => (50_000, 10_000),
            (false, false) => (500_000, 100_000),
            (false, true) => (5_000_000, 1_000_000),
        };
        let growth_sizes =
            std::env::var("IDEMPOTENT_BENCH_GROWTH")
                .ok()
                .map_or(growth_sizes, |sizes| {
                    sizes
                        .split(',')
                        .filter_map(|n| n.trim().parse().ok())
                        .collect()
                });
        Plan {
            throughput: self.wants("throughput"),
            round_trips: self.wants("round-trips"),
            rounds: number("IDEMPOTENT_BENCH_ROUNDS").unwrap_or(if self.quick { 2 } else { 9 }),
            jobs_per_round: number("IDEMPOTENT_BENCH_JOBS").unwrap_or(if self.quick {
                100
            } else {
                500
            }),
            growth_sizes: if grows && self.wants("growth") {
                growth_sizes
            } else {
                Vec::new()
            },
            growth_samples: if self.quick { 200 } else { 1_000 },
            relay_sizes: if self.wants("relay") {
                if self.quick {
                    vec![0, 100_000]
                } else {
                    vec![0, 1_000_000]
                }
            } else {
                Vec::new()
            },
            relay_rounds: if self.quick { 10 } else { 50 },
            prune: (grows && self.wants("prune")).then_some(prune),
            prune_baseline: Duration::from_secs(if self.quick {
                1
            } else if self.big {
                5
            } else {
                3
            }),
            default_port,
        }
    }

    fn describe(&self) -> String {
        format!(
            "quick={}, big={}, only={}, backends={}, latency per round trip={}",
            self.quick,
            self.big,
            self.only.as_ref().map_or("all".to_owned(), |o| o.join(",")),
            self.backends.join(","),
            backend::latency().map_or("none (loopback)".to_owned(), |d| format!("{d:?} (proxy)"))
        )
    }
}

fn main() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), PathBuf::from)
        .join("bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    let started = Instant::now();
    let options = Options::parse();
    let mut report = Report {
        machine: machine(&options),
        ..Report::default()
    };
    let pg_base = std::env::var("IDEMPOTENT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let my_base = std::env::var("IDEMPOTENT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    if let Ok(profile) = std::env::var("IDEMPOTENT_BENCH_PROFILE") {
        return profile_one(&profile, &options, &out, &pg_base, &my_base);
    }

    // SQLite as the README has users run it (a rollback journal, synchronous = FULL), and with the
    // WAL setting it recommends for throughput; growth and prune on the WAL one.
    if options.backend("sqlite") {
        let plan = options.plan(None, false);
        let mut dbs = Databases::sqlite(out.clone(), false);
        report
            .backends
            .push(backend::run::<SqliteConnection>("SQLite", &mut dbs, &plan));
    }
    if options.backend("sqlite-wal") {
        let plan = options.plan(None, true);
        let mut dbs = Databases::sqlite(out.clone(), true);
        report.backends.push(backend::run::<SqliteConnection>(
            "SQLite WAL",
            &mut dbs,
            &plan,
        ));
    }
    if options.backend("postgres") {
        let plan = options.plan(Some(5432), true);
        let mut dbs = Databases::postgres(&pg_base);
        let mut postgres = backend::run::<PgConnection>("PostgreSQL", &mut dbs, &plan);
        partition_trial(&mut dbs, &plan, &mut postgres);
        report.backends.push(postgres);
        if options.wants("async") {
            eprintln!("async PostgreSQL...");
            let url = dbs.create("async");
            drop(prepared::<PgConnection>(&url));
            report.async_postgres = Some(async_pg::measure(&url, plan.rounds, plan.jobs_per_round));
            dbs.drop("async");
        }
    }
    if options.backend("mariadb") {
        let plan = options.plan(Some(3306), true);
        let mut dbs = Databases::mysql(&my_base);
        report
            .backends
            .push(backend::run::<MysqlConnection>("MariaDB", &mut dbs, &plan));
    }
    if options.wants("workers") {
        workers(&options, &out, &pg_base, &my_base, &mut report);
    }
    if options.wants("compile") && !options.quick {
        eprintln!("compile time...");
        report.compile_time = compile::measure(&workspace, &out);
    }
    finish(report, &out, started);
}

/// PostgreSQL's prune by dropping a partition, beside its other prunes.
fn partition_trial(dbs: &mut Databases, plan: &Plan, postgres: &mut BackendReport) {
    let (Some((live, lapsed)), Some(figures)) = (plan.prune, postgres.prune.as_mut()) else {
        return;
    };
    eprintln!("  partitioned done_jobs...");
    let url = dbs.create("partition");
    drop(prepared::<PgConnection>(&url));
    let connect = move || PgConnection::establish(&url).expect("PostgreSQL");
    figures.trials.push(prune::partition_trial(
        &connect,
        live,
        lapsed,
        plan.prune_baseline,
    ));
    dbs.drop("partition");
}

fn workers(options: &Options, out: &Path, pg_base: &str, my_base: &str, report: &mut Report) {
    eprintln!("workers against pgbench and mariadb-slap...");
    let rounds =
        number("IDEMPOTENT_BENCH_WORKER_ROUNDS").unwrap_or(if options.quick { 1 } else { 9 });
    if options.backend("postgres") {
        let mut dbs = Databases::postgres(pg_base);
        let url = dbs.create("workers");
        drop(prepared::<PgConnection>(&url));
        let script = out.join("pgbench-job.sql");
        std::fs::write(&script, workers::PGBENCH_SCRIPT).expect("the pgbench script");
        let native = |clients: usize, jobs: u64| workers::pgbench(&url, &script, clients, jobs);
        report.workers.push(workers::measure::<PgConnection>(
            &url,
            &native,
            workers::PGBENCH_TOOL,
            rounds,
        ));
    }
    if options.backend("mariadb") {
        let mut dbs = Databases::mysql(my_base);
        let url = dbs.create("workers");
        drop(prepared::<MysqlConnection>(&url));
        let server = workers::MysqlServer::parse(my_base);
        let name = dbs.name("workers");
        let native =
            |clients: usize, jobs: u64| workers::mariadb_slap(&server, &name, clients, jobs);
        report.workers.push(workers::measure::<MysqlConnection>(
            &url,
            &native,
            workers::SLAP_TOOL,
            rounds,
        ));
    }
}

/// A number from the environment.
fn number<T: std::str::FromStr>(var: &str) -> Option<T> {
    std::env::var(var).ok()?.parse().ok()
}

fn machine(options: &Options) -> Machine {
    let busiest = std::process::Command::new("ps")
        .args(["-eo", "pcpu,comm", "--sort=-pcpu"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .skip(1)
                .take(6)
                .map(|l| l.trim().to_owned())
                .collect()
        })
        .unwrap_or_default();
    Machine {
        cores: std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get),
        memory: meminfo_total(),
        load_at_start: load_average(),
        load_at_end: String::new(),
        busiest_at_start: busiest,
        options: options.describe(),
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn meminfo_total() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let kib: f64 = s.lines().next()?.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.1} GiB", kib / 1_048_576.0))
        })
        .unwrap_or_default()
}

fn finish(mut report: Report, out: &Path, started: Instant) {
    report.machine.load_at_end = load_average();
    report.seconds = started.elapsed().as_secs_f64();
    report::print(&report);
    let json = serde_json::to_string_pretty(&report).expect("JSON");
    std::fs::write(out.join("jobs.json"), json).expect("target/bench/jobs.json");
    std::fs::write(out.join("jobs.svg"), chart::svg(&report)).expect("target/bench/jobs.svg");
    println!();
    println!(
        "wrote {} and {} in {:.0?}",
        out.join("jobs.json").display(),
        out.join("jobs.svg").display(),
        Duration::from_secs(started.elapsed().as_secs())
    );
}

/// `IDEMPOTENT_BENCH_PROFILE=<variant>:<jobs>`: one variant in a loop on the first backend named,
/// after a warm-up of a tenth as many jobs, for a profiler to compare with another variant's run.
fn profile_one(profile: &str, options: &Options, out: &Path, pg_base: &str, my_base: &str) {
    let (name, jobs) = profile.split_once(':').unwrap_or((profile, "10000"));
    let jobs: i64 = jobs
        .parse()
        .expect("IDEMPOTENT_BENCH_PROFILE=<variant>:<jobs>");
    let variant = variants::VARIANTS
        .into_iter()
        .find(|v| v.name() == name)
        .unwrap_or_else(|| panic!("no variant {name}"));
    let backend = options.backends.first().map_or("sqlite", String::as_str);
    fn run<C: db::BenchDb>(mut dbs: Databases, variant: variants::Variant, jobs: i64) {
        let url = dbs.create("profile");
        let mut conn = prepared::<C>(&url);
        for job in 0..jobs / 10 {
            variant.run(&mut conn, -1 - job).expect("a warm-up job");
        }
        let started = Instant::now();
        for job in 0..jobs {
            variant.run(&mut conn, job).expect("a job");
        }
        let per_job = started.elapsed() / u32::try_from(jobs.max(1)).unwrap_or(u32::MAX);
        println!(
            "{} {}: {jobs} jobs, {per_job:?} a job",
            C::NAME,
            variant.name()
        );
        drop(conn);
        dbs.drop("profile");
    }
    match backend {
        "sqlite" => {
            run::<SqliteConnection>(Databases::sqlite(out.to_owned(), false), variant, jobs)
        }
        "sqlite-wal" => {
            run::<SqliteConnection>(Databases::sqlite(out.to_owned(), true), variant, jobs)
        }
        "postgres" => run::<PgConnection>(Databases::postgres(pg_base), variant, jobs),
        "mariadb" => run::<MysqlConnection>(Databases::mysql(my_base), variant, jobs),
        other => panic!("no backend {other}"),
    }
}
