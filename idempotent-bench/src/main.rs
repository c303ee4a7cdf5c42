//! The wrapper costs one indexed insert, and nothing more: `#[idempotent_job]` side by side with
//! what a user would write instead, and with the floor no design can beat, on SQLite, PostgreSQL
//! and MariaDB, in one run.
//!
//! Run it with `cargo bench --bench jobs` from the repository root (the three servers must be up;
//! `scripts/test` starts them). It prints a table and writes `target/bench/jobs.json` (every figure
//! and ratio) and `target/bench/jobs.svg` (throughput by variant and backend).
//!
//! Variants, each the same job body (one row into `bench_effects`) unless said otherwise:
//!
//! * `bare`: the body in a transaction, no idempotency;
//! * `floor`: a transaction holding only the claim insert, the least any correct design can do;
//! * `hand`: the rule's hand-written pattern: claim insert, then the body, in one transaction;
//! * `macro`: the body under `#[idempotent_job]`;
//! * `macro_empty`: `#[idempotent_job]` with an empty body, against `floor`;
//! * `replay`: `macro` again on keys already claimed;
//! * `two_phase`: what other idempotency libraries do: record "in progress" and commit, do the
//!   work in its own transaction, then mark the record complete.
//!
//! Each round runs every variant over fresh keys, the variants taking turns job by job in a rotating
//! order; the figure is the median of the rounds after one warm-up round.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::prelude::*;
use idempotent_jobs::{JobStore, Prune, idempotent_job};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

const ROUNDS: usize = 9;
const JOBS_PER_ROUND: u64 = 500;

diesel::table! {
    bench_effects (id) {
        id -> BigInt,
        job -> BigInt,
    }
}

diesel::table! {
    two_phase_jobs (key_digest) {
        key_digest -> Binary,
        status -> Text,
    }
}

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// What the variants need from a backend.
trait BenchDb:
    JobStore
    + diesel::Connection<TransactionManager = AnsiTransactionManager>
    + SimpleConnection
    + Sized
{
    const NAME: &'static str;
    /// The user's own transaction, as they would open it for this backend.
    const BEGIN: &'static str;
    fn create_tables(&mut self) -> QueryResult<()>;
    fn insert_effect(&mut self, job: i64) -> QueryResult<()>;
    /// The hand-written claim: one indexed insert, `true` if it claimed.
    fn hand_claim(&mut self, digest: &[u8; 32], key: &str) -> QueryResult<bool>;
    fn two_phase_start(&mut self, digest: &[u8; 32]) -> QueryResult<bool>;
    fn two_phase_finish(&mut self, digest: &[u8; 32]) -> QueryResult<()>;
    /// `INSERT ... SELECT` of `rows` claims, lapsed or not, without a round trip per row.
    fn fill_sql(rows: u64, prefix: &str, lapsed: bool) -> String;
    /// Flushes what a bulk fill left dirty, so that the next measurement does not pay for it.
    fn settle(&mut self);
}

/// An insert that reports whether it inserted, the way a user would write it for the backend:
/// `ON CONFLICT DO NOTHING`, or (MySQL) a plain insert whose duplicate-key error means "there".
macro_rules! insert_unless_present {
    (on_conflict_do_nothing, $conn:expr, $table:expr, $values:expr) => {
        diesel::insert_into($table)
            .values($values)
            .on_conflict_do_nothing()
            .execute($conn)
            .map(|n| n == 1)
    };
    (duplicate_key_error, $conn:expr, $table:expr, $values:expr) => {
        match diesel::insert_into($table).values($values).execute($conn) {
            Ok(n) => Ok(n == 1),
            Err(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::UniqueViolation,
                _,
            )) => Ok(false),
            Err(e) => Err(e),
        }
    };
}

macro_rules! impl_bench_db {
    ($conn:ty, $name:literal, begin: $begin:literal, id: $id:literal, binary: $binary:literal, insert: $insert:ident, digest: $digest:literal, key: $key:literal, settle: $settle:literal) => {
        impl BenchDb for $conn {
            const NAME: &'static str = $name;
            const BEGIN: &'static str = $begin;

            fn create_tables(&mut self) -> QueryResult<()> {
                self.batch_execute(concat!(
                    "CREATE TABLE bench_effects (id ", $id, ", job BIGINT NOT NULL);",
                    "CREATE TABLE two_phase_jobs (key_digest ", $binary, " PRIMARY KEY NOT NULL, status VARCHAR(20) NOT NULL);"
                ))
            }

            fn insert_effect(&mut self, job: i64) -> QueryResult<()> {
                diesel::insert_into(bench_effects::table)
                    .values(bench_effects::job.eq(job))
                    .execute(self)
                    .map(drop)
            }

            fn hand_claim(&mut self, digest: &[u8; 32], key: &str) -> QueryResult<bool> {
                use idempotent_jobs::schema::done_jobs::dsl as dj;
                let values = (
                    dj::key_digest.eq(&digest[..]),
                    dj::job_key.eq(key),
                    dj::job_name.eq("hand"),
                    dj::done_at.eq(chrono::Utc::now().naive_utc()),
                );
                insert_unless_present!($insert, self, idempotent_jobs::schema::done_jobs::table, values)
            }

            fn two_phase_start(&mut self, digest: &[u8; 32]) -> QueryResult<bool> {
                let values = (two_phase_jobs::key_digest.eq(&digest[..]), two_phase_jobs::status.eq("in_progress"));
                insert_unless_present!($insert, self, two_phase_jobs::table, values)
            }

            fn two_phase_finish(&mut self, digest: &[u8; 32]) -> QueryResult<()> {
                diesel::update(two_phase_jobs::table.filter(two_phase_jobs::key_digest.eq(&digest[..])))
                    .set(two_phase_jobs::status.eq("complete"))
                    .execute(self)
                    .map(drop)
            }

            fn settle(&mut self) {
                // One statement at a time: PostgreSQL runs VACUUM only outside a transaction block.
                for statement in $settle.split(';') {
                    self.batch_execute(statement).expect("settling after a fill");
                }
            }

            fn fill_sql(rows: u64, prefix: &str, lapsed: bool) -> String {
                let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
                     UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
                let expires = if lapsed { "'2000-01-02 00:00:00'" } else { "NULL" };
                format!(
                    concat!(
                        "INSERT INTO done_jobs (key_digest, job_key, job_name, done_at, expires_at) ",
                        "SELECT ", $digest, ", ", $key, ", 'fill', '2000-01-01 00:00:00', {expires} FROM ",
                        "(SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * g.d AS n ",
                        "FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f, {digits} g) numbers ",
                        "WHERE n < {rows}"
                    ),
                    prefix = prefix,
                    expires = expires,
                    digits = digits,
                    rows = rows
                )
            }
        }
    };
}

impl_bench_db!(
    SqliteConnection, "SQLite", begin: "BEGIN IMMEDIATE", id: "INTEGER PRIMARY KEY AUTOINCREMENT",
    binary: "BLOB", insert: on_conflict_do_nothing,
    digest: "randomblob(32)", key: "'{prefix}:' || n",
    settle: "PRAGMA wal_checkpoint(TRUNCATE)"
);
impl_bench_db!(
    PgConnection, "PostgreSQL", begin: "BEGIN", id: "BIGSERIAL PRIMARY KEY",
    binary: "BYTEA", insert: on_conflict_do_nothing,
    digest: "sha256(convert_to('{prefix}:' || n, 'UTF8'))", key: "'{prefix}:' || n",
    settle: "VACUUM ANALYZE done_jobs; CHECKPOINT"
);
impl_bench_db!(
    MysqlConnection, "MariaDB", begin: "BEGIN", id: "BIGINT AUTO_INCREMENT PRIMARY KEY",
    binary: "BINARY(32)", insert: duplicate_key_error,
    digest: "UNHEX(SHA2(CONCAT('{prefix}:', n), 256))", key: "CONCAT('{prefix}:', n)",
    settle: "ANALYZE TABLE done_jobs"
);

// ---- the variants ------------------------------------------------------------------------------

/// The job under the attribute.
#[idempotent_job(key = "bench:<job>")]
fn macro_job<C: BenchDb>(conn: &mut C, job: i64) -> Result<(), BenchError> {
    conn.insert_effect(job)?;
    Ok(())
}

/// The attribute around nothing, against `floor`.
#[idempotent_job(key = "empty:<job>")]
fn macro_empty<C: BenchDb>(conn: &mut C, job: i64) -> Result<(), BenchError> {
    let _ = (conn, job);
    Ok(())
}

/// The user's own transaction around `f`.
fn transaction<C: BenchDb>(
    conn: &mut C,
    f: impl FnOnce(&mut C) -> QueryResult<()>,
) -> QueryResult<()> {
    AnsiTransactionManager::begin_transaction_sql(conn, C::BEGIN)?;
    match f(conn) {
        Ok(()) => AnsiTransactionManager::commit_transaction(conn),
        Err(error) => {
            AnsiTransactionManager::rollback_transaction(conn)?;
            Err(error)
        }
    }
}

/// The key and its digest, as a user writing the pattern by hand would build them.
fn hand_key(prefix: &str, job: i64) -> (String, [u8; 32]) {
    let key = format!("{prefix}:{job}");
    let digest = Sha256::digest(key.as_bytes()).into();
    (key, digest)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
enum Variant {
    Bare,
    Floor,
    Hand,
    Macro,
    MacroEmpty,
    Replay,
    TwoPhase,
}

const VARIANTS: [Variant; 7] = [
    Variant::Bare,
    Variant::Floor,
    Variant::Hand,
    Variant::Macro,
    Variant::MacroEmpty,
    Variant::Replay,
    Variant::TwoPhase,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Floor => "floor",
            Variant::Hand => "hand",
            Variant::Macro => "macro",
            Variant::MacroEmpty => "macro_empty",
            Variant::Replay => "replay",
            Variant::TwoPhase => "two_phase",
        }
    }

    /// One job of this variant; `job` is fresh for every call except in `replay`.
    fn run<C: BenchDb>(self, conn: &mut C, job: i64) -> Result<(), BenchError> {
        match self {
            Variant::Bare => transaction(conn, |c| c.insert_effect(job))?,
            Variant::Floor => {
                let (key, digest) = hand_key("floor", job);
                transaction(conn, |c| c.hand_claim(&digest, &key).map(drop))?;
            }
            Variant::Hand => {
                let (key, digest) = hand_key("hand", job);
                transaction(conn, |c| {
                    if c.hand_claim(&digest, &key)? {
                        c.insert_effect(job)?;
                    }
                    Ok(())
                })?;
            }
            Variant::Macro | Variant::Replay => macro_job(conn, job)?,
            Variant::MacroEmpty => macro_empty(conn, job)?,
            Variant::TwoPhase => {
                let (_, digest) = hand_key("two-phase", job);
                let mut started = false;
                transaction(conn, |c| {
                    started = c.two_phase_start(&digest)?;
                    Ok(())
                })?;
                if started {
                    transaction(conn, |c| c.insert_effect(job))?;
                    transaction(conn, |c| c.two_phase_finish(&digest))?;
                }
            }
        }
        Ok(())
    }
}

// ---- measuring -----------------------------------------------------------------------------------

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

#[derive(Debug, Serialize)]
struct BackendReport {
    backend: &'static str,
    rounds: usize,
    jobs_per_round: u64,
    /// Median jobs per second, by variant.
    jobs_per_second: BTreeMap<&'static str, f64>,
    /// Every round's jobs per second, by variant.
    rounds_jobs_per_second: BTreeMap<&'static str, Vec<f64>>,
    ratios: Ratios,
    latency: Option<Latency>,
    prune: Option<PruneFigures>,
}

#[derive(Debug, Serialize)]
struct Ratios {
    /// Time per job, macro over hand: 1.00 means no cost; target ≤ 1.03.
    macro_over_hand: f64,
    /// Time per job, macro with an empty body over floor; target ≤ 1.05.
    macro_empty_over_floor: f64,
    /// Throughput, replay over macro; target > 1.
    replay_over_macro: f64,
    /// Time per job, two-phase over macro; target > 1.
    two_phase_over_macro: f64,
    /// Time per job, hand over bare: what idempotency itself costs.
    hand_over_bare: f64,
}

#[derive(Debug, Serialize)]
struct Latency {
    rows_small: u64,
    rows_large: u64,
    /// Median claim latency (an empty job), microseconds.
    median_us_small: f64,
    median_us_large: f64,
    /// Target ≤ 1.2.
    large_over_small: f64,
}

#[derive(Debug, Serialize)]
struct PruneFigures {
    rows: u64,
    batch_size: u32,
    batches: u32,
    seconds: f64,
    rows_per_second: f64,
}

#[derive(Debug, Serialize)]
struct Concurrency {
    backend: &'static str,
    jobs_per_worker: u64,
    /// Median total jobs per second, by worker count.
    jobs_per_second: BTreeMap<usize, f64>,
}

#[derive(Debug, Serialize)]
struct CompileTime {
    handlers: usize,
    /// Median seconds to rebuild the crate, by variant.
    with_attribute_seconds: f64,
    without_attribute_seconds: f64,
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    backends: Vec<BackendReport>,
    concurrency: Option<Concurrency>,
    compile_time: Option<CompileTime>,
}

/// Where a backend's benchmark connects: its main database, and the two of the latency test.
struct Urls<'a, C> {
    main: &'a dyn Fn() -> C,
    latency: Option<(Connect<'a, C>, Connect<'a, C>)>,
}

/// Opens a connection to one of the benchmark's databases.
type Connect<'a, C> = &'a dyn Fn() -> C;

fn bench_backend<C: BenchDb>(urls: Urls<'_, C>) -> BackendReport {
    let connect = urls.main;
    let mut conn = connect();
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    conn.create_tables().expect("bench tables");
    let mut rounds: BTreeMap<Variant, Vec<f64>> = BTreeMap::new();
    let mut next_job: i64 = 1;
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    for round in 0..=ROUNDS {
        // `replay` replays jobs claimed here, untimed.
        let replay_from = next_job;
        for offset in 0..JOBS_PER_ROUND as i64 {
            macro_job(&mut conn, replay_from + offset).expect("claiming the replay keys");
        }
        next_job += JOBS_PER_ROUND as i64;
        // The variants take turns job by job, in a shuffled order, so that every one of them meets
        // the same disk and server weather (fsync times drift by tens of percent over seconds) and
        // follows every other one equally often (a commit slows the next one down a little).
        let mut spent: BTreeMap<Variant, Duration> = BTreeMap::new();
        let mut order = VARIANTS;
        for offset in 0..JOBS_PER_ROUND as i64 {
            shuffle(&mut order, &mut seed);
            for (turn, variant) in order.into_iter().enumerate() {
                let job = if variant == Variant::Replay {
                    replay_from + offset
                } else {
                    next_job + offset * VARIANTS.len() as i64 + turn as i64
                };
                let started = Instant::now();
                variant
                    .run(&mut conn, job)
                    .unwrap_or_else(|e| panic!("{}: {e}", variant.name()));
                *spent.entry(variant).or_default() += started.elapsed();
            }
        }
        next_job += JOBS_PER_ROUND as i64 * VARIANTS.len() as i64;
        if round > 0 {
            for (variant, time) in spent {
                rounds
                    .entry(variant)
                    .or_default()
                    .push(JOBS_PER_ROUND as f64 / time.as_secs_f64());
            }
        }
    }
    let jobs_per_second: BTreeMap<&'static str, f64> = rounds
        .iter()
        .map(|(v, r)| (v.name(), median(r.clone())))
        .collect();
    // Each ratio is the median of the rounds' own ratios: the two variants of a pair ran in the
    // same round, interleaved, so their comparison cancels what drifts between rounds.
    let ratio = |faster: Variant, slower: Variant| {
        median(
            rounds[&faster]
                .iter()
                .zip(&rounds[&slower])
                .map(|(f, s)| f / s)
                .collect(),
        )
    };
    let ratios = Ratios {
        macro_over_hand: ratio(Variant::Hand, Variant::Macro),
        macro_empty_over_floor: ratio(Variant::Floor, Variant::MacroEmpty),
        replay_over_macro: ratio(Variant::Replay, Variant::Macro),
        two_phase_over_macro: ratio(Variant::Macro, Variant::TwoPhase),
        hand_over_bare: ratio(Variant::Bare, Variant::Hand),
    };
    let (latency, prune) = match urls.latency {
        Some((small, large)) => (
            Some(latency(&mut small(), &mut large())),
            Some(prune_throughput(&mut conn)),
        ),
        None => (None, None),
    };
    BackendReport {
        backend: C::NAME,
        rounds: ROUNDS,
        jobs_per_round: JOBS_PER_ROUND,
        jobs_per_second,
        rounds_jobs_per_second: rounds.into_iter().map(|(v, r)| (v.name(), r)).collect(),
        ratios,
        latency,
        prune,
    }
}

/// Fisher-Yates with a xorshift generator: the same shuffles every run.
fn shuffle(items: &mut [Variant], seed: &mut u64) {
    for i in (1..items.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let j = usize::try_from(*seed % (i as u64 + 1)).unwrap_or(0);
        items.swap(i, j);
    }
}

/// Median latency of an empty job's claim with 1,000 rows in `done_jobs`, and with 1,000,000: two
/// databases, claims alternating between them sample by sample, so that both meet the same fsync
/// weather.
fn latency<C: BenchDb>(small: &mut C, large: &mut C) -> Latency {
    const SMALL: u64 = 1_000;
    const LARGE: u64 = 1_000_000;
    const SAMPLES: i64 = 1_000;
    for (conn, rows, prefix) in [(&mut *small, SMALL, "small"), (&mut *large, LARGE, "large")] {
        idempotent_jobs::migrate(conn).expect("migrations");
        conn.batch_execute(&C::fill_sql(rows, prefix, false))
            .expect("claims already there");
        // The same starting point for both: nothing left dirty by the fill.
        conn.settle();
        for job in 0..50 {
            macro_empty(conn, job).expect("warm-up");
        }
    }
    let (mut small_us, mut large_us) = (Vec::new(), Vec::new());
    for job in 1_000..1_000 + SAMPLES {
        let time = |conn: &mut C| {
            let started = Instant::now();
            macro_empty(conn, job).expect("a claim");
            started.elapsed().as_secs_f64() * 1e6
        };
        if job % 2 == 0 {
            small_us.push(time(small));
            large_us.push(time(large));
        } else {
            large_us.push(time(large));
            small_us.push(time(small));
        }
    }
    let (small_us, large_us) = (median(small_us), median(large_us));
    Latency {
        rows_small: SMALL,
        rows_large: LARGE,
        median_us_small: small_us,
        median_us_large: large_us,
        large_over_small: large_us / small_us,
    }
}

/// Prunes 200,000 lapsed claims in batches of 10,000.
fn prune_throughput<C: BenchDb>(conn: &mut C) -> PruneFigures {
    const ROWS: u64 = 200_000;
    const BATCH: u32 = 10_000;
    conn.batch_execute("DELETE FROM done_jobs")
        .expect("emptying done_jobs");
    conn.batch_execute(&C::fill_sql(ROWS, "lapsed", true))
        .expect("lapsed claims");
    let started = Instant::now();
    let report = idempotent_jobs::prune(conn, &Prune::default().batch_size(BATCH)).expect("prune");
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(report.removed, ROWS);
    PruneFigures {
        rows: ROWS,
        batch_size: BATCH,
        batches: report.batches,
        seconds,
        rows_per_second: ROWS as f64 / seconds,
    }
}

/// `macro` with 1, 2, 4 and 8 workers, each on its own connection, on fresh keys.
fn concurrency(url: &str) -> Concurrency {
    const JOBS_PER_WORKER: u64 = 300;
    let mut figures = BTreeMap::new();
    let mut base: i64 = 100_000_000;
    for workers in [1usize, 2, 4, 8] {
        let mut rounds = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            std::thread::scope(|scope| {
                for worker in 0..workers {
                    let first = base + (worker as i64) * JOBS_PER_WORKER as i64;
                    scope.spawn(move || {
                        let mut conn = PgConnection::establish(url).expect("PostgreSQL");
                        for job in first..first + JOBS_PER_WORKER as i64 {
                            macro_job(&mut conn, job).expect("a job");
                        }
                    });
                }
            });
            rounds
                .push((workers as u64 * JOBS_PER_WORKER) as f64 / started.elapsed().as_secs_f64());
            base += 10_000_000;
        }
        figures.insert(workers, median(rounds));
    }
    Concurrency {
        backend: "PostgreSQL",
        jobs_per_worker: JOBS_PER_WORKER,
        jobs_per_second: figures,
    }
}

/// Rebuild time of a crate of 100 handlers with the attribute, and of the same without it.
fn compile_time(workspace: &Path, out: &Path) -> Option<CompileTime> {
    const HANDLERS: usize = 100;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let target = out.join("compile-target");
    let mut seconds = BTreeMap::new();
    for with in [true, false] {
        let dir = out.join(if with {
            "compile-with"
        } else {
            "compile-without"
        });
        std::fs::create_dir_all(dir.join("src")).ok()?;
        std::fs::write(
            dir.join("Cargo.toml"),
            format!(
                "[package]\nname = \"handlers-{}\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\n[dependencies]\nidempotent-jobs = {{ path = {:?} }}\ndiesel = {{ version = \"2.3\", default-features = false, features = [\"sqlite\"] }}\n\n[workspace]\n",
                if with { "with" } else { "without" },
                workspace.display().to_string()
            ),
        )
        .ok()?;
        let mut source = String::from("use diesel::SqliteConnection;\n\n");
        for i in 0..HANDLERS {
            if with {
                let _ = writeln!(
                    source,
                    "#[idempotent_jobs::idempotent_job(key = \"job{i}:<id>\")]"
                );
            }
            let _ = writeln!(
                source,
                "pub fn job_{i}(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {{\n    let _ = conn;\n    Ok(id + {i})\n}}\n"
            );
        }
        let lib = dir.join("src").join("lib.rs");
        let build = |source: &str| -> Option<f64> {
            std::fs::write(&lib, source).ok()?;
            let started = Instant::now();
            let status = std::process::Command::new(&cargo)
                .args(["build", "--offline", "--quiet"])
                .current_dir(&dir)
                .env("CARGO_TARGET_DIR", &target)
                .status()
                .ok()?;
            status.success().then(|| started.elapsed().as_secs_f64())
        };
        build(&source)?; // dependencies, once
        let mut rebuilds = Vec::new();
        for n in 0..3 {
            rebuilds.push(build(&format!("{source}\n// rebuild {n}\n"))?);
        }
        seconds.insert(with, median(rebuilds));
    }
    Some(CompileTime {
        handlers: HANDLERS,
        with_attribute_seconds: seconds[&true],
        without_attribute_seconds: seconds[&false],
        ratio: seconds[&true] / seconds[&false],
    })
}

// ---- output ----------------------------------------------------------------------------------------

fn print_table(report: &Report) {
    println!();
    println!(
        "jobs per second (median of {ROUNDS} rounds of {JOBS_PER_ROUND} jobs, after a warm-up round)"
    );
    print!("{:<12}", "backend");
    for variant in VARIANTS {
        print!("{:>13}", variant.name());
    }
    println!();
    for backend in &report.backends {
        print!("{:<12}", backend.backend);
        for variant in VARIANTS {
            print!("{:>13.0}", backend.jobs_per_second[variant.name()]);
        }
        println!();
    }
    println!();
    println!(
        "{:<12}{:>16}{:>20}{:>18}{:>20}{:>16}",
        "backend",
        "macro/hand",
        "macro_empty/floor",
        "replay/macro",
        "two_phase/macro",
        "hand/bare"
    );
    for backend in &report.backends {
        let r = &backend.ratios;
        println!(
            "{:<12}{:>15.3}x{:>19.3}x{:>17.2}x{:>19.2}x{:>15.2}x",
            backend.backend,
            r.macro_over_hand,
            r.macro_empty_over_floor,
            r.replay_over_macro,
            r.two_phase_over_macro,
            r.hand_over_bare
        );
    }
    println!(
        "(macro/hand, macro_empty/floor, two_phase/macro and hand/bare: time per job; replay/macro: throughput)"
    );
    println!();
    for backend in &report.backends {
        if let Some(l) = &backend.latency {
            println!(
                "{:<12}claim latency: {:.0} µs at {} rows, {:.0} µs at {} rows ({:.2}x)",
                backend.backend,
                l.median_us_small,
                l.rows_small,
                l.median_us_large,
                l.rows_large,
                l.large_over_small
            );
        }
        if let Some(p) = &backend.prune {
            println!(
                "{:<12}prune: {} lapsed rows in {} batches of {} in {:.2} s ({:.0} rows/s)",
                backend.backend, p.rows, p.batches, p.batch_size, p.seconds, p.rows_per_second
            );
        }
    }
    if let Some(c) = &report.concurrency {
        let line: Vec<String> = c
            .jobs_per_second
            .iter()
            .map(|(w, j)| format!("{w} workers: {j:.0}"))
            .collect();
        println!(
            "{:<12}macro, jobs per second by workers: {}",
            c.backend,
            line.join(", ")
        );
    }
    if let Some(c) = &report.compile_time {
        println!(
            "compile time of {} handlers: {:.2} s with the attribute, {:.2} s without ({:.2}x)",
            c.handlers, c.with_attribute_seconds, c.without_attribute_seconds, c.ratio
        );
    }
}

/// Throughput by variant, one panel per backend (each with its own scale: SQLite's replays would
/// flatten the servers' bars on a shared one), as SVG.
fn chart(report: &Report) -> String {
    const PANEL_WIDTH: f64 = 330.0;
    const HEIGHT: f64 = 380.0;
    const TOP: f64 = 60.0;
    const BOTTOM: f64 = 90.0;
    const LEFT: f64 = 56.0;
    let colors = [
        "#9e9e9e", "#bab0ac", "#f58518", "#4c78a8", "#72b7b2", "#54a24b", "#e45756",
    ];
    let width = PANEL_WIDTH * report.backends.len() as f64 + 40.0;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">Jobs per second by variant (median of {ROUNDS} rounds of {JOBS_PER_ROUND} jobs)</text>\n",
        width / 2.0
    );
    for (b, backend) in report.backends.iter().enumerate() {
        let x0 = PANEL_WIDTH * b as f64;
        let max = backend
            .jobs_per_second
            .values()
            .copied()
            .fold(1.0, f64::max)
            * 1.15;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
            x0 + PANEL_WIDTH / 2.0,
            TOP - 14.0,
            backend.backend
        );
        for tick in 0..=4 {
            let value = max * f64::from(tick) / 4.0;
            let y = TOP + plot_height - plot_height * f64::from(tick) / 4.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e0e0e0\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{value:.0}</text>",
                x0 + LEFT,
                x0 + PANEL_WIDTH - 10.0,
                x0 + LEFT - 4.0,
                y + 4.0
            );
        }
        let slot = (PANEL_WIDTH - LEFT - 10.0) / VARIANTS.len() as f64;
        for (v, variant) in VARIANTS.iter().enumerate() {
            let value = backend.jobs_per_second[variant.name()];
            let height = plot_height * value / max;
            let x = x0 + LEFT + slot * v as f64 + slot * 0.15;
            let y = TOP + plot_height - height;
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{height:.1}\" fill=\"{}\"><title>{} {}: {value:.0} jobs/s</title></rect>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"9\">{value:.0}</text>\n\
                 <text transform=\"translate({:.1},{:.1}) rotate(45)\" font-size=\"11\">{}</text>",
                slot * 0.7,
                colors[v % colors.len()],
                backend.backend,
                variant.name(),
                x + slot * 0.35,
                y - 3.0,
                x + slot * 0.2,
                TOP + plot_height + 12.0,
                variant.name()
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn main() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), PathBuf::from)
        .join("bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    let started = Instant::now();

    let quick = std::env::args().any(|a| a == "--quick");
    // Three databases per backend: the variants', and the small and large ones of the latency test.
    let names = ["main", "small", "large"]
        .map(|part| format!("idempotent_bench_{}_{part}", std::process::id()));

    let sqlite_urls = names.clone().map(|name| {
        let path = out.join(format!("{name}.db"));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let url = path.to_string_lossy().into_owned();
        SqliteConnection::establish(&url)
            .expect("SQLite")
            .batch_execute("PRAGMA journal_mode = WAL")
            .expect("WAL");
        url
    });

    let pg_base = std::env::var("IDEMPOTENT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let mut pg_admin = PgConnection::establish(&pg_base)
        .unwrap_or_else(|e| panic!("PostgreSQL at {pg_base}: {e}; start it (scripts/test does) or set IDEMPOTENT_POSTGRES_URL"));
    let separator = if pg_base.contains('?') { '&' } else { '?' };
    let pg_urls = names.clone().map(|name| {
        pg_admin
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .expect("a schema");
        format!("{pg_base}{separator}options=-csearch_path%3D{name}")
    });

    let my_base = std::env::var("IDEMPOTENT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let mut my_admin = MysqlConnection::establish(&my_base).unwrap_or_else(|e| {
        panic!(
            "MariaDB at {my_base}: {e}; start it (scripts/test does) or set IDEMPOTENT_MYSQL_URL"
        )
    });
    let my_server = my_base
        .rsplit_once('/')
        .map_or(my_base.as_str(), |(s, _)| s)
        .to_owned();
    let my_urls = names.clone().map(|name| {
        my_admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("a database");
        format!("{my_server}/{name}")
    });

    fn urls<'a, C>(connect: &'a [Box<dyn Fn() -> C + 'a>; 3], quick: bool) -> Urls<'a, C> {
        Urls {
            main: &*connect[0],
            latency: (!quick).then(|| {
                (
                    &*connect[1] as &dyn Fn() -> C,
                    &*connect[2] as &dyn Fn() -> C,
                )
            }),
        }
    }
    let sqlite: [Box<dyn Fn() -> SqliteConnection>; 3] = sqlite_urls.clone().map(|url| {
        Box::new(move || SqliteConnection::establish(&url).expect("SQLite")) as Box<dyn Fn() -> _>
    });
    let postgres: [Box<dyn Fn() -> PgConnection>; 3] = pg_urls.clone().map(|url| {
        Box::new(move || PgConnection::establish(&url).expect("PostgreSQL")) as Box<dyn Fn() -> _>
    });
    let mariadb: [Box<dyn Fn() -> MysqlConnection>; 3] = my_urls.map(|url| {
        Box::new(move || MysqlConnection::establish(&url).expect("MariaDB")) as Box<dyn Fn() -> _>
    });

    eprintln!("SQLite...");
    let sqlite = bench_backend(urls(&sqlite, quick));
    eprintln!("PostgreSQL...");
    let postgres_report = bench_backend(urls(&postgres, quick));
    eprintln!("MariaDB...");
    let mariadb = bench_backend(urls(&mariadb, quick));
    eprintln!("concurrency...");
    let concurrency = concurrency(&pg_urls[0]);
    eprintln!("compile time...");
    let compile_time = if quick {
        None
    } else {
        compile_time(&workspace, &out)
    };

    for name in &names {
        let _ = pg_admin.batch_execute(&format!("DROP SCHEMA {name} CASCADE"));
        let _ = my_admin.batch_execute(&format!("DROP DATABASE {name}"));
    }
    for url in &sqlite_urls {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{url}{suffix}"));
        }
    }
    drop(postgres);

    let report = Report {
        backends: vec![sqlite, postgres_report, mariadb],
        concurrency: Some(concurrency),
        compile_time,
    };
    print_table(&report);
    let json = serde_json::to_string_pretty(&report).expect("JSON");
    std::fs::write(out.join("jobs.json"), json).expect("target/bench/jobs.json");
    std::fs::write(out.join("jobs.svg"), chart(&report)).expect("target/bench/jobs.svg");
    println!();
    println!(
        "wrote {} and {} in {:.0?}",
        out.join("jobs.json").display(),
        out.join("jobs.svg").display(),
        Duration::from_secs(started.elapsed().as_secs())
    );
}
