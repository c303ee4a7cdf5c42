//! Pruning while workers claim: `done_jobs` holds live claims and a block of lapsed ones; two
//! workers claim fresh keys before, during and after a prune of the lapsed block, and the figures
//! are their throughput and p99 during the prune against before and after. Each way of pruning
//! gets a fresh lapsed block: the library's prune at its default (batches of 1,000 paced 9x) and
//! unpaced, and the alternatives measured against it as SQL here (MariaDB: deletes by primary key
//! at REPEATABLE READ; PostgreSQL: dropping a partition of a time-partitioned `done_jobs`).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use idempotent_jobs::Prune;
use serde::Serialize;

use crate::db::{BenchDb, Kind};
use crate::stats::percentile;
use crate::variants::macro_job;

/// How one trial prunes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    /// `idempotent_jobs::prune` with this batch size and [`Prune::pace`] (0: no pause between
    /// batches; the library's default is 9). On MariaDB the library's prune runs its batches at
    /// READ COMMITTED, on SQLite in `BEGIN IMMEDIATE`.
    Library { batch: u32, pace: u32 },
    /// [`BenchDb::other_prune_batch`] until none are left: on MariaDB (at REPEATABLE READ) by
    /// primary key, on SQLite in `BEGIN IMMEDIATE`.
    Other { batch: u32, pace: Option<u32> },
    /// PostgreSQL: `done_jobs` partitioned by `expires_at`; the prune detaches and drops the lapsed
    /// period's partition, then creates the next period's.
    DropPartition,
}

impl Strategy {
    pub fn label<C: BenchDb>(self) -> String {
        let pace = |p: Option<u32>| p.map_or(String::new(), |k| format!(", paced {k}x"));
        match self {
            Strategy::Library { batch, pace: p } => {
                let is_default = Prune::default().batch_size(batch).pace(p) == Prune::default();
                format!(
                    "library prune, batch {batch}, pace {p}{}",
                    if is_default { " (the default)" } else { "" }
                )
            }
            Strategy::Other { batch, pace: p } => {
                format!("{}, batch {batch}{}", C::OTHER_PRUNE, pace(p))
            }
            Strategy::DropPartition => {
                "partitioned by expires_at: detach + drop, create next".to_owned()
            }
        }
    }

    /// The strategies tried on a backend; `IDEMPOTENT_BENCH_PRUNE=1000:9,250:9` tries the
    /// library's prune at those batch sizes and paces instead.
    pub fn for_kind(kind: Kind) -> Vec<Strategy> {
        let library = |batch, pace| Strategy::Library { batch, pace };
        if let Ok(chosen) = std::env::var("IDEMPOTENT_BENCH_PRUNE") {
            return chosen
                .split(',')
                .filter_map(|pair| {
                    let (batch, pace) = pair.trim().split_once(':')?;
                    Some(library(batch.parse().ok()?, pace.parse().ok()?))
                })
                .collect();
        }
        match kind {
            Kind::Sqlite => vec![library(1_000, 0), library(10_000, 0), library(1_000, 9)],
            Kind::Postgres => vec![
                library(1_000, 0),
                library(10_000, 0),
                library(1_000, 3),
                library(1_000, 9),
                Strategy::DropPartition,
            ],
            Kind::Mysql => vec![
                library(1_000, 0),
                library(10_000, 0),
                library(1_000, 3),
                library(1_000, 9),
                Strategy::Other {
                    batch: 1_000,
                    pace: None,
                },
            ],
        }
    }
}

#[derive(Debug, Serialize)]
pub struct PruneTrial {
    pub strategy: String,
    pub removed: u64,
    pub prune_seconds: f64,
    /// Claims per second of all workers, before and after the prune together.
    pub baseline_jobs_per_second: f64,
    pub baseline_p99_us: f64,
    /// The same during the prune (a window of at least one second).
    pub during_jobs_per_second: f64,
    pub during_p99_us: f64,
    /// during over baseline; target ≥ 0.9.
    pub throughput_ratio: f64,
    /// during over baseline; target ≤ 2.
    pub p99_ratio: f64,
    pub meets_targets: bool,
}

#[derive(Debug, Serialize)]
pub struct PruneUnderLoad {
    pub backend: &'static str,
    pub live_rows: u64,
    pub lapsed_rows: u64,
    pub workers: usize,
    pub baseline_seconds: f64,
    pub size: String,
    pub trials: Vec<PruneTrial>,
}

const WORKERS: usize = 2;
const IDLE: u8 = 0;
const BEFORE: u8 = 1;
const DURING: u8 = 2;
const AFTER: u8 = 3;
const STOP: u8 = 4;

/// Latencies (µs) by phase, shared by the workers.
type Samples = Arc<Mutex<[Vec<f64>; 4]>>;

/// Every strategy for the backend, each on a fresh block of `lapsed` rows beside `live` ones.
pub fn measure<C: BenchDb>(
    connect: &(dyn Fn() -> C + Sync),
    live: u64,
    lapsed: u64,
    baseline: Duration,
) -> PruneUnderLoad {
    let mut admin = connect();
    admin.fill(0, live, "live", "fill", false);
    let size = admin.size();
    let phase = Arc::new(AtomicU8::new(IDLE));
    let samples: Samples = Arc::default();
    let mut trials = Vec::new();
    std::thread::scope(|scope| {
        for worker in 0..WORKERS {
            let (phase, samples) = (phase.clone(), samples.clone());
            scope.spawn(move || claim_loop(connect(), worker, &phase, &samples));
        }
        for (n, strategy) in Strategy::for_kind(C::KIND).into_iter().enumerate() {
            if strategy == Strategy::DropPartition {
                continue; // a table of its own: see `partition_trial`
            }
            admin.fill(0, lapsed, &format!("lapsed{n}"), "fill", true);
            eprintln!("  {}...", strategy.label::<C>());
            let mut pruner = connect();
            let trial = run_trial::<C>(&phase, &samples, baseline, strategy, || {
                prune_with(&mut pruner, strategy)
            });
            eprintln!("    {trial:?}");
            trials.push(trial);
        }
        phase.store(STOP, Ordering::SeqCst);
    });
    PruneUnderLoad {
        backend: C::NAME,
        live_rows: live,
        lapsed_rows: lapsed,
        workers: WORKERS,
        baseline_seconds: baseline.as_secs_f64() * 2.0,
        size,
        trials,
    }
}

/// Claims fresh keys while the phase is not idle, recording each claim's latency under the phase
/// it started in.
fn claim_loop<C: BenchDb>(mut conn: C, worker: usize, phase: &AtomicU8, samples: &Samples) {
    let mut job = 20_000_000_000 + worker as i64 * 1_000_000_000;
    let mut local: [Vec<f64>; 4] = Default::default();
    loop {
        let now = phase.load(Ordering::SeqCst);
        match now {
            STOP => return,
            IDLE => {
                let mut shared = samples.lock().expect("samples");
                for (all, mine) in shared.iter_mut().zip(&mut local) {
                    all.append(mine);
                }
                drop(shared);
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => {
                job += 1;
                let started = Instant::now();
                macro_job(&mut conn, job).expect("a claim while pruning");
                local[usize::from(now)].push(started.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
}

/// Before, during (`prune`), after; then the figures.
fn run_trial<C: BenchDb>(
    phase: &AtomicU8,
    samples: &Samples,
    baseline: Duration,
    strategy: Strategy,
    prune: impl FnOnce() -> u64,
) -> PruneTrial {
    *samples.lock().expect("samples") = Default::default();
    phase.store(BEFORE, Ordering::SeqCst);
    std::thread::sleep(baseline);
    phase.store(DURING, Ordering::SeqCst);
    let started = Instant::now();
    let removed = prune();
    let prune_seconds = started.elapsed().as_secs_f64();
    let window = Duration::from_secs(1).saturating_sub(started.elapsed());
    std::thread::sleep(window);
    let during_seconds = started.elapsed().as_secs_f64();
    phase.store(AFTER, Ordering::SeqCst);
    std::thread::sleep(baseline);
    phase.store(IDLE, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(200)); // every worker hands its samples in
    let all = samples.lock().expect("samples");
    let base: Vec<f64> = all[BEFORE as usize]
        .iter()
        .chain(&all[AFTER as usize])
        .copied()
        .collect();
    let during = all[DURING as usize].clone();
    let base_rate = base.len() as f64 / (baseline.as_secs_f64() * 2.0);
    let during_rate = during.len() as f64 / during_seconds;
    let (base_p99, during_p99) = (percentile(base, 99.0), percentile(during, 99.0));
    let (throughput_ratio, p99_ratio) = (during_rate / base_rate, during_p99 / base_p99);
    PruneTrial {
        strategy: strategy.label::<C>(),
        removed,
        prune_seconds,
        baseline_jobs_per_second: base_rate,
        baseline_p99_us: base_p99,
        during_jobs_per_second: during_rate,
        during_p99_us: during_p99,
        throughput_ratio,
        p99_ratio,
        meets_targets: throughput_ratio >= 0.9 && p99_ratio <= 2.0,
    }
}

/// Prunes every lapsed row the strategy's way; the rows removed.
fn prune_with<C: BenchDb>(conn: &mut C, strategy: Strategy) -> u64 {
    match strategy {
        Strategy::Library { batch, pace } => {
            let options = Prune::default().batch_size(batch).pace(pace);
            idempotent_jobs::prune(conn, &options)
                .expect("prune")
                .removed
        }
        Strategy::Other { batch, pace } => paced(batch, pace.unwrap_or(0), || {
            conn.other_prune_batch(batch).expect("a prune batch")
        }),
        Strategy::DropPartition => unreachable!("partition_trial"),
    }
}

/// Runs `batch` until it removes fewer than `size` rows, pausing `k` times each batch's duration.
fn paced(size: u32, k: u32, mut batch: impl FnMut() -> u64) -> u64 {
    let mut removed = 0;
    loop {
        let started = Instant::now();
        let n = batch();
        removed += n;
        if n < u64::from(size) {
            return removed;
        }
        std::thread::sleep(started.elapsed() * k);
    }
}

/// PostgreSQL: `done_jobs` replaced by one partitioned by `expires_at` (a default partition for
/// live claims, one for the lapsed period), unique on `(key_digest, expires_at)`, as partitioning
/// requires: NOT the library's guarantee (see the notes). The prune drops the lapsed partition and
/// creates the next period's, which scans the default partition.
pub fn partition_trial(
    connect: &(dyn Fn() -> PgConnection + Sync),
    live: u64,
    lapsed: u64,
    baseline: Duration,
) -> PruneTrial {
    let mut admin = connect();
    admin
        .batch_execute(
            "CREATE TABLE done_jobs_p (LIKE done_jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (expires_at); \
             DROP TABLE done_jobs; ALTER TABLE done_jobs_p RENAME TO done_jobs; \
             CREATE TABLE done_jobs_live PARTITION OF done_jobs DEFAULT; \
             CREATE TABLE done_jobs_2000_01 PARTITION OF done_jobs FOR VALUES FROM ('2000-01-01') TO ('2000-02-01')",
        )
        .expect("a partitioned done_jobs");
    let fill = |admin: &mut PgConnection, from, to, prefix: &str, lapsed| {
        admin.before_fill().expect("fill settings");
        admin
            .batch_execute(&PgConnection::fill_sql(
                from, to, prefix, "fill", lapsed, false,
            ))
            .expect("filling");
    };
    fill(&mut admin, 0, live, "live", false);
    fill(&mut admin, 0, lapsed, "lapsed", true);
    admin
        .batch_execute("CREATE UNIQUE INDEX done_jobs_key ON done_jobs (key_digest, expires_at)")
        .expect("the unique index");
    admin.settle();
    let phase = Arc::new(AtomicU8::new(IDLE));
    let samples: Samples = Arc::default();
    std::thread::scope(|scope| {
        for worker in 0..WORKERS {
            let (phase, samples) = (phase.clone(), samples.clone());
            scope.spawn(move || claim_loop(connect(), worker, &phase, &samples));
        }
        let mut pruner = connect();
        let trial = run_trial::<PgConnection>(
            &phase,
            &samples,
            baseline,
            Strategy::DropPartition,
            || {
                pruner
                .batch_execute(
                    "ALTER TABLE done_jobs DETACH PARTITION done_jobs_2000_01; DROP TABLE done_jobs_2000_01; \
                     CREATE TABLE done_jobs_2000_02 PARTITION OF done_jobs FOR VALUES FROM ('2000-02-01') TO ('2000-03-01')",
                )
                .expect("dropping the lapsed partition");
                lapsed
            },
        );
        phase.store(STOP, Ordering::SeqCst);
        eprintln!("    {trial:?}");
        trial
    })
}
