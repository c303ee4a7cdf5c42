//! The wrapper costs one indexed insert, and nothing more: `#[idempotent_job]` side by side with
//! what a user would write instead, with the floor no design can beat, and with the databases' own
//! benchmark tools sending the same statements, on SQLite, PostgreSQL and MariaDB, in one run.
//!
//! Run it with `cargo bench --bench jobs` from the repository root (the three servers must be up;
//! `scripts/test` starts them; `pgbench` and `mariadb-slap` must be on the `PATH`). It prints a
//! table and writes `target/bench/jobs.json` (every figure and ratio) and `target/bench/jobs.svg`
//! (throughput by variant and backend).
//!
//! Variants, each the same job body (one row into `bench_effects`) unless said otherwise:
//!
//! * `bare`: the body in a transaction, no idempotency;
//! * `floor`: a transaction holding only the claim insert, the least any correct design can do;
//! * `hand`: the rule's hand-written pattern: claim insert, then the body, in one transaction;
//! * `macro`: the body under `#[idempotent_job]`;
//! * `macro_empty`: `#[idempotent_job]` with an empty body, against `floor`;
//! * `hand_value` / `macro_value`: the body returning a receipt that is stored with the claim (by
//!   hand: an `UPDATE` of the claimed row with its JSON), so that a rerun returns it;
//! * `two_phase`: what other idempotency libraries do: record "in progress" and commit, do the
//!   work in its own transaction, then mark the record complete.
//!
//! Each round runs every variant over fresh keys, the variants taking turns job by job in a shuffled
//! order; the figure is the median of the rounds after one warm-up round.
//!
//! Replays are measured on a `done_jobs` of 1,000,000 rows against one indexed read of the digest
//! through the same client, for keys claimed long ago (cold) and just now (fresh). Workers: `macro`
//! with 1, 2, 4 and 8 connections against `pgbench` and `mariadb-slap` running the statements the
//! library sends for the same job.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::prelude::*;
use idempotent_jobs::{JobStore, Prune, idempotent_job};
use serde::{Deserialize, Serialize};
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

diesel::define_sql_function! {
    /// SHA-256, registered on SQLite connections that fill `done_jobs` (PostgreSQL and MariaDB
    /// have their own), so that filled keys have the digests the runtime computes.
    fn bench_sha256(text: diesel::sql_types::Text) -> diesel::sql_types::Binary;
}

/// What the value-returning variants return and store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    invoice: i64,
    total_cents: i64,
    currency: String,
}

fn receipt(job: i64) -> Receipt {
    Receipt {
        invoice: job,
        total_cents: job * 100 + 99,
        currency: "EUR".to_owned(),
    }
}

/// One text column.
#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = diesel::sql_types::Text)]
    s: String,
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
    /// The hand-written result: the claimed row's `result`, updated.
    fn hand_record(&mut self, digest: &[u8; 32], json: &str) -> QueryResult<()>;
    /// One indexed read of a key's row through this client, outside any transaction: the floor of
    /// a replay.
    fn read_done(&mut self, digest: &[u8; 32]) -> QueryResult<Option<(String, Option<String>)>>;
    /// `INSERT ... SELECT` of `rows` claims of `job` with keys `<prefix>:<n>` and the runtime's
    /// digests, lapsed or not, without a round trip per row.
    fn fill_sql(rows: u64, prefix: &str, job: &str, lapsed: bool) -> String;
    /// Makes what [`fill_sql`](Self::fill_sql) needs available on this connection.
    fn before_fill(&mut self) -> QueryResult<()>;
    /// Flushes what a bulk fill left dirty, so that the next measurement does not pay for it.
    fn settle(&mut self);
    /// The durability settings the figures were measured with, as the server reports them.
    fn settings(&mut self) -> String;
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
    ($conn:ty, $name:literal, begin: $begin:literal, id: $id:literal, binary: $binary:literal, insert: $insert:ident, digest: $digest:literal, key: $key:literal, settle: $settle:literal, settings: $settings:literal, before_fill: $before_fill:expr) => {
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

            fn hand_record(&mut self, digest: &[u8; 32], json: &str) -> QueryResult<()> {
                use idempotent_jobs::schema::done_jobs::dsl as dj;
                diesel::update(dj::done_jobs.filter(dj::key_digest.eq(&digest[..])))
                    .set(dj::result.eq(json))
                    .execute(self)
                    .map(drop)
            }

            fn read_done(&mut self, digest: &[u8; 32]) -> QueryResult<Option<(String, Option<String>)>> {
                use idempotent_jobs::schema::done_jobs::dsl as dj;
                dj::done_jobs
                    .filter(dj::key_digest.eq(&digest[..]))
                    .select((dj::job_name, dj::result))
                    .get_result(self)
                    .optional()
            }

            fn before_fill(&mut self) -> QueryResult<()> {
                let before_fill: fn(&mut Self) -> QueryResult<()> = $before_fill;
                before_fill(self)
            }

            fn settings(&mut self) -> String {
                diesel::sql_query($settings)
                    .get_result::<Setting>(self)
                    .map_or_else(|e| format!("unknown ({e})"), |row| row.s)
            }

            fn settle(&mut self) {
                // One statement at a time: PostgreSQL runs VACUUM only outside a transaction block.
                for statement in $settle.split(';') {
                    self.batch_execute(statement).expect("settling after a fill");
                }
            }

            fn fill_sql(rows: u64, prefix: &str, job: &str, lapsed: bool) -> String {
                let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
                     UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
                let expires = if lapsed { "'2000-01-02 00:00:00'" } else { "NULL" };
                format!(
                    concat!(
                        "INSERT INTO done_jobs (key_digest, job_key, job_name, done_at, expires_at) ",
                        "SELECT ", $digest, ", ", $key, ", '{job}', '2000-01-01 00:00:00', {expires} FROM ",
                        "(SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * g.d AS n ",
                        "FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f, {digits} g) numbers ",
                        "WHERE n < {rows}"
                    ),
                    prefix = prefix,
                    job = job,
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
    digest: "bench_sha256('{prefix}:' || n)", key: "'{prefix}:' || n",
    settle: "PRAGMA wal_checkpoint(TRUNCATE)",
    settings: "SELECT 'journal_mode=' || (SELECT journal_mode FROM pragma_journal_mode) || ', synchronous=' || \
               (SELECT CASE synchronous WHEN 0 THEN 'OFF' WHEN 1 THEN 'NORMAL' WHEN 2 THEN 'FULL' ELSE 'EXTRA' END FROM pragma_synchronous) || \
               ', SQLite ' || sqlite_version() AS s",
    before_fill: |conn| bench_sha256_utils::register_impl(conn, |text: String| Sha256::digest(text.as_bytes()).to_vec())
);
impl_bench_db!(
    PgConnection, "PostgreSQL", begin: "BEGIN", id: "BIGSERIAL PRIMARY KEY",
    binary: "BYTEA", insert: on_conflict_do_nothing,
    digest: "sha256(convert_to('{prefix}:' || n, 'UTF8'))", key: "'{prefix}:' || n",
    settle: "VACUUM ANALYZE done_jobs; CHECKPOINT",
    settings: "SELECT 'synchronous_commit=' || current_setting('synchronous_commit') || ', fsync=' || current_setting('fsync') || \
               ', full_page_writes=' || current_setting('full_page_writes') || ', shared_buffers=' || current_setting('shared_buffers') || \
               ', PostgreSQL ' || current_setting('server_version') AS s",
    before_fill: |_| Ok(())
);
impl_bench_db!(
    MysqlConnection, "MariaDB", begin: "BEGIN", id: "BIGINT AUTO_INCREMENT PRIMARY KEY",
    binary: "BINARY(32)", insert: duplicate_key_error,
    digest: "UNHEX(SHA2(CONCAT('{prefix}:', n), 256))", key: "CONCAT('{prefix}:', n)",
    settle: "ANALYZE TABLE done_jobs",
    settings: "SELECT CAST(CONCAT('innodb_flush_log_at_trx_commit=', @@innodb_flush_log_at_trx_commit, ', sync_binlog=', @@sync_binlog, \
               ', log_bin=', @@log_bin, ', innodb_buffer_pool_size=', @@innodb_buffer_pool_size DIV 1048576, 'M, ', @@version) AS CHAR) AS s",
    before_fill: |_| Ok(())
);

// ---- the variants ------------------------------------------------------------------------------

/// The job under the attribute.
#[idempotent_job(key = "bench:<job>")]
fn macro_job<C: BenchDb>(conn: &mut C, job: i64) -> Result<(), BenchError> {
    conn.insert_effect(job)?;
    Ok(())
}

/// The job returning a value, stored for replays.
#[idempotent_job(key = "value:<job>")]
fn macro_value<C: BenchDb>(conn: &mut C, job: i64) -> Result<Receipt, BenchError> {
    conn.insert_effect(job)?;
    Ok(receipt(job))
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
    HandValue,
    MacroValue,
    TwoPhase,
}

const VARIANTS: [Variant; 8] = [
    Variant::Bare,
    Variant::Floor,
    Variant::Hand,
    Variant::Macro,
    Variant::MacroEmpty,
    Variant::HandValue,
    Variant::MacroValue,
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
            Variant::HandValue => "hand_value",
            Variant::MacroValue => "macro_value",
            Variant::TwoPhase => "two_phase",
        }
    }

    /// One job of this variant; `job` is fresh for every call.
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
            Variant::Macro => macro_job(conn, job)?,
            Variant::MacroEmpty => macro_empty(conn, job)?,
            Variant::HandValue => {
                let (key, digest) = hand_key("hand-value", job);
                transaction(conn, |c| {
                    if c.hand_claim(&digest, &key)? {
                        c.insert_effect(job)?;
                        let json = serde_json::to_string(&receipt(job)).expect("a receipt");
                        c.hand_record(&digest, &json)?;
                    }
                    Ok(())
                })?;
            }
            Variant::MacroValue => {
                let stored = macro_value(conn, job)?;
                assert_eq!(stored.invoice, job);
            }
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
    /// Durability settings, as the server reported them.
    settings: String,
    rounds: usize,
    jobs_per_round: u64,
    /// Median jobs per second, by variant.
    jobs_per_second: BTreeMap<&'static str, f64>,
    /// Every round's jobs per second, by variant.
    rounds_jobs_per_second: BTreeMap<&'static str, Vec<f64>>,
    ratios: Ratios,
    latency: Latency,
    replays: Replays,
    prune: Option<PruneFigures>,
}

#[derive(Debug, Serialize)]
struct Ratios {
    /// Time per job, macro over hand: 1.00 means no cost; target ≤ 1.03.
    macro_over_hand: f64,
    /// Time per job, macro_value over hand_value: storing the result; target ≤ 1.03.
    macro_value_over_hand_value: f64,
    /// Time per job, macro with an empty body over floor; target ≤ 1.05.
    macro_empty_over_floor: f64,
    /// Time per job, two-phase over macro; target > 1.
    two_phase_over_macro: f64,
    /// Time per job, hand over bare: what idempotency itself costs.
    hand_over_bare: f64,
    /// Time per job, hand_value over hand: what storing a result costs by hand.
    hand_value_over_hand: f64,
}

/// Replays on a `done_jobs` of `rows` rows, each kind's median latency in microseconds, the kinds
/// taking turns call by call.
#[derive(Debug, Serialize)]
struct Replays {
    rows: u64,
    samples: usize,
    /// One indexed read of a key claimed long ago, through the same client: the floor.
    read_cold_us: f64,
    /// `macro` replaying a key claimed long ago, told it is a redelivery.
    replay_cold_us: f64,
    /// The same, told it is a first delivery: the claim path (a transaction, the claim, the read).
    claim_path_cold_us: f64,
    /// The same, told nothing, in a run of replays (the job's recent calls mostly replayed).
    storm_cold_us: f64,
    /// One indexed read of a key claimed during this run.
    read_fresh_us: f64,
    /// `macro` replaying a key claimed during this run, told it is a redelivery.
    replay_fresh_us: f64,
    /// replay_cold over read_cold; target ≤ 1.5.
    replay_over_read_cold: f64,
    /// replay_fresh over read_fresh; target ≤ 1.5.
    replay_over_read_fresh: f64,
    /// storm_cold over read_cold.
    storm_over_read_cold: f64,
    /// claim_path_cold over read_cold: a replay without the read first.
    claim_path_over_read_cold: f64,
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
struct Workers {
    backend: &'static str,
    /// The database's own benchmark tool the library is measured against.
    tool: &'static str,
    jobs_per_worker: u64,
    rounds: usize,
    points: Vec<WorkerPoint>,
}

#[derive(Debug, Serialize)]
struct WorkerPoint {
    workers: usize,
    /// Median jobs per second of `macro`, all workers together.
    library_jobs_per_second: f64,
    /// Median jobs per second of the tool, as many clients.
    native_jobs_per_second: f64,
    /// Time per job, library over the tool; target ≤ 1.05 (PostgreSQL), ≤ 1.10 (MariaDB).
    library_over_native: f64,
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
    workers: Vec<Workers>,
    compile_time: Option<CompileTime>,
}

/// Where a backend's benchmark connects: its main database, and the two of the latency test (the
/// large one also serves the replays).
struct Urls<'a, C> {
    name: &'static str,
    main: Connect<'a, C>,
    small: Connect<'a, C>,
    large: Connect<'a, C>,
    quick: bool,
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
        // The variants take turns job by job, in a shuffled order, so that every one of them meets
        // the same disk and server weather (fsync times drift by tens of percent over seconds) and
        // follows every other one equally often (a commit slows the next one down a little).
        let mut spent: BTreeMap<Variant, Duration> = BTreeMap::new();
        let mut order = VARIANTS;
        for offset in 0..JOBS_PER_ROUND as i64 {
            shuffle(&mut order, &mut seed);
            for (turn, variant) in order.into_iter().enumerate() {
                let job = next_job + offset * VARIANTS.len() as i64 + turn as i64;
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
        macro_value_over_hand_value: ratio(Variant::HandValue, Variant::MacroValue),
        macro_empty_over_floor: ratio(Variant::Floor, Variant::MacroEmpty),
        two_phase_over_macro: ratio(Variant::Macro, Variant::TwoPhase),
        hand_over_bare: ratio(Variant::Bare, Variant::Hand),
        hand_value_over_hand: ratio(Variant::Hand, Variant::HandValue),
    };
    let settings = conn.settings();
    let (mut small, mut large) = ((urls.small)(), (urls.large)());
    let rows = if urls.quick { 100_000 } else { 1_000_000 };
    let latency = latency(&mut small, &mut large, rows);
    let replays = replays(&mut large, rows, if urls.quick { 300 } else { 1_000 });
    let prune = (!urls.quick).then(|| prune_throughput(&mut conn));
    BackendReport {
        backend: urls.name,
        settings,
        rounds: ROUNDS,
        jobs_per_round: JOBS_PER_ROUND,
        jobs_per_second,
        rounds_jobs_per_second: rounds.into_iter().map(|(v, r)| (v.name(), r)).collect(),
        ratios,
        latency,
        replays,
        prune,
    }
}

/// Fisher-Yates with a xorshift generator: the same shuffles every run.
fn shuffle<T>(items: &mut [T], seed: &mut u64) {
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
fn latency<C: BenchDb>(small: &mut C, large: &mut C, large_rows: u64) -> Latency {
    const SMALL: u64 = 1_000;
    const SAMPLES: i64 = 1_000;
    // The large database's rows are `macro_job`'s, keys `bench:<n>`: the replays' cold keys.
    for (conn, rows, prefix, job) in [
        (&mut *small, SMALL, "small", "fill"),
        (&mut *large, large_rows, "bench", "macro_job"),
    ] {
        idempotent_jobs::migrate(conn).expect("migrations");
        conn.create_tables().expect("bench tables");
        conn.before_fill().expect("the fill's functions");
        conn.batch_execute(&C::fill_sql(rows, prefix, job, false))
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
        rows_large: large_rows,
        median_us_small: small_us,
        median_us_large: large_us,
        large_over_small: large_us / small_us,
    }
}

/// Replays against one indexed read of the same key, on a database whose `done_jobs` holds `rows`
/// claims of `macro_job` made long ago (cold keys, each used once, picked at random) and keys
/// claimed just before (fresh). The kinds take turns call by call.
fn replays<C: BenchDb>(conn: &mut C, rows: u64, samples: usize) -> Replays {
    const FRESH: i64 = 5_000_000_000;
    for job in FRESH..FRESH + samples as i64 {
        macro_job(conn, job).expect("claiming the fresh keys");
    }
    let mut seed: u64 = 0xD1B5_4A32_D192_ED03;
    let mut used = std::collections::HashSet::new();
    let mut cold = || loop {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let n = i64::try_from(seed % rows).unwrap_or(0);
        if used.insert(n) {
            return n;
        }
    };
    let read = |conn: &mut C, job: i64| {
        let (_, digest) = hand_key("bench", job);
        let row = conn.read_done(&digest).expect("a read");
        assert!(row.is_some(), "bench:{job} is claimed");
    };
    let replay = |conn: &mut C, job: i64, redelivered: Option<bool>| {
        let outcome = match redelivered {
            Some(flag) => idempotent_jobs::redelivered(flag, || macro_job(conn, job)),
            None => macro_job(conn, job),
        };
        outcome.expect("a replay");
    };
    let time = |f: &mut dyn FnMut()| {
        let started = Instant::now();
        f();
        started.elapsed().as_secs_f64() * 1e6
    };
    let mut kinds: [Vec<f64>; 6] = Default::default();
    let mut order = [0usize, 1, 2, 3, 4, 5];
    let mut shuffle_seed: u64 = 0x2545_F491_4F6C_DD1D;
    for sample in 0..samples {
        shuffle(&mut order, &mut shuffle_seed);
        for kind in order {
            let fresh = FRESH + sample as i64;
            let micros = match kind {
                0 => time(&mut || read(conn, cold())),
                1 => time(&mut || replay(conn, cold(), Some(true))),
                2 => time(&mut || replay(conn, cold(), Some(false))),
                3 => time(&mut || replay(conn, cold(), None)),
                4 => time(&mut || read(conn, fresh)),
                _ => time(&mut || replay(conn, fresh, Some(true))),
            };
            kinds[kind].push(micros);
        }
    }
    let [
        read_cold,
        replay_cold,
        claim_path,
        storm,
        read_fresh,
        replay_fresh,
    ] = kinds.map(median);
    Replays {
        rows,
        samples,
        read_cold_us: read_cold,
        replay_cold_us: replay_cold,
        claim_path_cold_us: claim_path,
        storm_cold_us: storm,
        read_fresh_us: read_fresh,
        replay_fresh_us: replay_fresh,
        replay_over_read_cold: replay_cold / read_cold,
        replay_over_read_fresh: replay_fresh / read_fresh,
        storm_over_read_cold: storm / read_cold,
        claim_path_over_read_cold: claim_path / read_cold,
    }
}

/// Prunes 200,000 lapsed claims in batches of 10,000.
fn prune_throughput<C: BenchDb>(conn: &mut C) -> PruneFigures {
    const ROWS: u64 = 200_000;
    const BATCH: u32 = 10_000;
    conn.batch_execute("DELETE FROM done_jobs")
        .expect("emptying done_jobs");
    conn.before_fill().expect("the fill's functions");
    conn.batch_execute(&C::fill_sql(ROWS, "lapsed", "fill", true))
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

/// `macro` with 1, 2, 4 and 8 workers, each on its own connection, on fresh keys, against the
/// database's own benchmark tool sending the statements the library sends for the same job, with as
/// many clients. Rounds alternate the two; the ratio is the median of the rounds' own ratios.
fn workers<C: BenchDb>(
    url: &str,
    native: &dyn Fn(usize, u64) -> f64,
    tool: &'static str,
    quick: bool,
) -> Workers {
    const JOBS_PER_WORKER: u64 = 300;
    let rounds = if quick { 1 } else { 9 };
    let mut points = Vec::new();
    let mut first: i64 = 100_000_000;
    for workers in [1usize, 2, 4, 8] {
        let (mut library, mut tool_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut pair = [0.0; 2];
            for side in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
                pair[side] = if side == 0 {
                    let rate = library_rate::<C>(url, workers, JOBS_PER_WORKER, first);
                    first += 10_000_000;
                    rate
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

/// What `macro_job` sends on PostgreSQL for a fresh key, as a pgbench script: `BEGIN`, the claim
/// (the runtime's statement), the body's insert, `COMMIT`.
const PGBENCH_SCRIPT: &str = "\\set n random(1, 9000000000000000)
BEGIN;
INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, done_at) VALUES (sha256(convert_to('native:' || CAST(:n AS text), 'UTF8')), 'native:' || CAST(:n AS text), 'native', NULL, :n, (clock_timestamp() AT TIME ZONE 'UTC')) ON CONFLICT DO NOTHING;
INSERT INTO bench_effects (job) VALUES (:n);
COMMIT;
";

/// Jobs per second of `pgbench` (prepared statements, `clients` connections, `jobs` each).
fn pgbench(url: &str, script: &Path, clients: usize, jobs: u64) -> f64 {
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

/// What `macro_job` sends on MariaDB: `BEGIN`, the claim, the body's insert, the check for an
/// implicit commit, `COMMIT`.
const SLAP_QUERY: &str = "BEGIN;\
INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, done_at) VALUES (UNHEX(SHA2(UUID(), 256)), UUID(), 'native', NULL, UUID_SHORT() DIV 2, UTC_TIMESTAMP(6));\
INSERT INTO bench_effects (job) VALUES (1);\
SELECT @@in_transaction AS open;\
COMMIT";

/// A MySQL URL's parts, for command-line tools.
struct MysqlServer {
    host: String,
    port: String,
    user: String,
    password: Option<String>,
}

impl MysqlServer {
    fn parse(url: &str) -> Self {
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
fn mariadb_slap(server: &MysqlServer, database: &str, clients: usize, jobs: u64) -> f64 {
    let mut command = std::process::Command::new("mariadb-slap");
    command
        .arg(format!("--host={}", server.host))
        .arg(format!("--port={}", server.port))
        .arg(format!("--user={}", server.user))
        .arg(format!("--create-schema={database}"))
        .args(["--no-drop", "--iterations=1", "--delimiter=;"])
        .arg(format!("--concurrency={clients}"))
        // The limit is on all clients together: `jobs` jobs of five statements each, per client.
        .arg(format!("--number-of-queries={}", clients as u64 * jobs * 5))
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
    for backend in &report.backends {
        println!("{:<12}{}", backend.backend, backend.settings);
    }
    println!();
    println!(
        "jobs per second (median of {ROUNDS} rounds of {JOBS_PER_ROUND} jobs, after a warm-up round)"
    );
    print!("{:<12}", "backend");
    for variant in VARIANTS {
        print!("{:>12}", variant.name());
    }
    println!();
    for backend in &report.backends {
        print!("{:<12}", backend.backend);
        for variant in VARIANTS {
            print!("{:>12.0}", backend.jobs_per_second[variant.name()]);
        }
        println!();
    }
    println!();
    println!(
        "{:<12}{:>12}{:>24}{:>19}{:>17}{:>11}{:>18}",
        "backend",
        "macro/hand",
        "macro_value/hand_value",
        "macro_empty/floor",
        "two_phase/macro",
        "hand/bare",
        "hand_value/hand"
    );
    for backend in &report.backends {
        let r = &backend.ratios;
        println!(
            "{:<12}{:>11.3}x{:>23.3}x{:>18.3}x{:>16.2}x{:>10.2}x{:>17.2}x",
            backend.backend,
            r.macro_over_hand,
            r.macro_value_over_hand_value,
            r.macro_empty_over_floor,
            r.two_phase_over_macro,
            r.hand_over_bare,
            r.hand_value_over_hand
        );
    }
    println!("(time per job)");
    println!();
    println!(
        "replays on {} rows, median µs of {} calls each, against one indexed read of the key through the same client",
        report.backends.first().map_or(0, |b| b.replays.rows),
        report.backends.first().map_or(0, |b| b.replays.samples)
    );
    println!(
        "{:<12}{:>10}{:>12}{:>8}{:>12}{:>12}{:>8}{:>16}{:>8}{:>10}{:>12}{:>8}",
        "backend",
        "read cold",
        "replay cold",
        "ratio",
        "storm cold",
        "",
        "ratio",
        "claim path cold",
        "ratio",
        "read new",
        "replay new",
        "ratio"
    );
    for backend in &report.backends {
        let r = &backend.replays;
        println!(
            "{:<12}{:>10.0}{:>12.0}{:>7.2}x{:>12.0}{:>12}{:>7.2}x{:>16.0}{:>7.2}x{:>10.0}{:>12.0}{:>7.2}x",
            backend.backend,
            r.read_cold_us,
            r.replay_cold_us,
            r.replay_over_read_cold,
            r.storm_cold_us,
            "",
            r.storm_over_read_cold,
            r.claim_path_cold_us,
            r.claim_path_over_read_cold,
            r.read_fresh_us,
            r.replay_fresh_us,
            r.replay_over_read_fresh
        );
    }
    println!(
        "(replay: told it is a redelivery; storm: told nothing, in a run of replays; claim path: told it is a first delivery, i.e. a transaction and the claim)"
    );
    println!();
    for w in &report.workers {
        let line: Vec<String> = w
            .points
            .iter()
            .map(|p| {
                format!(
                    "{} workers: {:.0} vs {:.0} ({:.3}x)",
                    p.workers,
                    p.library_jobs_per_second,
                    p.native_jobs_per_second,
                    p.library_over_native
                )
            })
            .collect();
        println!(
            "{:<12}macro against {}, jobs per second: {}",
            w.backend,
            w.tool,
            line.join(", ")
        );
    }
    println!();
    for backend in &report.backends {
        let l = &backend.latency;
        println!(
            "{:<12}claim latency: {:.0} µs at {} rows, {:.0} µs at {} rows ({:.2}x)",
            backend.backend,
            l.median_us_small,
            l.rows_small,
            l.median_us_large,
            l.rows_large,
            l.large_over_small
        );
        if let Some(p) = &backend.prune {
            println!(
                "{:<12}prune: {} lapsed rows in {} batches of {} in {:.2} s ({:.0} rows/s)",
                backend.backend, p.rows, p.batches, p.batch_size, p.seconds, p.rows_per_second
            );
        }
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
    const PANEL_WIDTH: f64 = 300.0;
    const HEIGHT: f64 = 380.0;
    const TOP: f64 = 60.0;
    const BOTTOM: f64 = 90.0;
    const LEFT: f64 = 56.0;
    let colors = [
        "#9e9e9e", "#bab0ac", "#f58518", "#4c78a8", "#72b7b2", "#eeca3b", "#54a24b", "#e45756",
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

    // SQLite as the README has users run it (SQLite's defaults: a rollback journal, synchronous =
    // FULL), and with the WAL setting the README recommends for throughput.
    let sqlite_urls = |wal: bool| {
        names.clone().map(|name| {
            let path = out.join(format!("{name}{}.db", if wal { "_wal" } else { "" }));
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            let url = path.to_string_lossy().into_owned();
            if wal {
                SqliteConnection::establish(&url)
                    .expect("SQLite")
                    .batch_execute("PRAGMA journal_mode = WAL")
                    .expect("WAL");
            }
            url
        })
    };
    let (sqlite_default_urls, sqlite_wal_urls) = (sqlite_urls(false), sqlite_urls(true));

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

    fn urls<'a, C>(
        name: &'static str,
        connect: &'a [Box<dyn Fn() -> C + 'a>; 3],
        quick: bool,
    ) -> Urls<'a, C> {
        Urls {
            name,
            main: &*connect[0],
            small: &*connect[1],
            large: &*connect[2],
            quick,
        }
    }
    let sqlite = |urls: [String; 3]| -> [Box<dyn Fn() -> SqliteConnection>; 3] {
        urls.map(|url| {
            Box::new(move || SqliteConnection::establish(&url).expect("SQLite"))
                as Box<dyn Fn() -> _>
        })
    };
    let (sqlite_default, sqlite_wal) = (
        sqlite(sqlite_default_urls.clone()),
        sqlite(sqlite_wal_urls.clone()),
    );
    let postgres: [Box<dyn Fn() -> PgConnection>; 3] = pg_urls.clone().map(|url| {
        Box::new(move || PgConnection::establish(&url).expect("PostgreSQL")) as Box<dyn Fn() -> _>
    });
    let mariadb: [Box<dyn Fn() -> MysqlConnection>; 3] = my_urls.clone().map(|url| {
        Box::new(move || MysqlConnection::establish(&url).expect("MariaDB")) as Box<dyn Fn() -> _>
    });

    eprintln!("SQLite (rollback journal, SQLite's default)...");
    let sqlite_default = bench_backend(urls("SQLite", &sqlite_default, quick));
    eprintln!("SQLite (WAL)...");
    let sqlite_wal = bench_backend(urls("SQLite WAL", &sqlite_wal, quick));
    eprintln!("PostgreSQL...");
    let postgres_report = bench_backend(urls("PostgreSQL", &postgres, quick));
    eprintln!("MariaDB...");
    let mariadb_report = bench_backend(urls("MariaDB", &mariadb, quick));

    eprintln!("workers against pgbench and mariadb-slap...");
    let script = out.join("pgbench-job.sql");
    std::fs::write(&script, PGBENCH_SCRIPT).expect("the pgbench script");
    let pg_native = |clients: usize, jobs: u64| pgbench(&pg_urls[0], &script, clients, jobs);
    let pg_workers = workers::<PgConnection>(&pg_urls[0], &pg_native, "pgbench", quick);
    let my_server_parts = MysqlServer::parse(&my_base);
    let my_native =
        |clients: usize, jobs: u64| mariadb_slap(&my_server_parts, &names[0], clients, jobs);
    let my_workers = workers::<MysqlConnection>(&my_urls[0], &my_native, "mariadb-slap", quick);

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
    drop((sqlite_default_urls.clone(), postgres, mariadb));
    for url in sqlite_default_urls.iter().chain(&sqlite_wal_urls) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let _ = std::fs::remove_file(format!("{url}{suffix}"));
        }
    }

    let report = Report {
        backends: vec![sqlite_default, sqlite_wal, postgres_report, mariadb_report],
        workers: vec![pg_workers, my_workers],
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
