//! diesel-async's `AsyncPgConnection`: the attribute on an async handler beside the same job
//! written the idiomatic diesel-async way (`conn.transaction(async |c| ...)`, the claim, the body),
//! taking turns job by job on one connection, and the round trips of each counted by the proxy.
//! The runtime sends a job's `BEGIN` and its claim in one flight (pipelined); the hand-written job
//! sends them one after the other, as `transaction` does.

use std::time::{Duration, Instant};

use diesel::{ExpressionMethods as _, QueryDsl as _, QueryResult};
use diesel_async::{AsyncConnection as _, AsyncPgConnection, RunQueryDsl as _};
use idempotent_jobs::idempotent_job;
use serde::Serialize;

use crate::db::bench_effects;
use crate::roundtrips::{Proxy, via};
use crate::stats::{Xorshift, median};
use crate::variants::{BenchError, Receipt, hand_key, receipt};

#[derive(Debug, Serialize)]
pub struct AsyncFigures {
    pub rounds: usize,
    pub jobs_per_round: u64,
    /// Median jobs per second: `macro`, `hand`, `macro_value`, `hand_value`.
    pub jobs_per_second: Vec<(&'static str, f64)>,
    /// Time per job of the macro over the hand-written job (median of the rounds' ratios).
    pub macro_over_hand: f64,
    pub macro_value_over_hand_value: f64,
    /// Client flights per job, counted by the proxy over 50 jobs of each.
    pub round_trips: Vec<(&'static str, f64)>,
}

/// The attribute around the body (one row into `bench_effects`).
#[idempotent_job(key = "async:<job>")]
pub async fn async_macro(conn: &mut AsyncPgConnection, job: i64) -> Result<(), BenchError> {
    effect(conn, job).await?;
    Ok(())
}

/// The same, returning a stored receipt.
#[idempotent_job(key = "async-value:<job>")]
pub async fn async_macro_value(
    conn: &mut AsyncPgConnection,
    job: i64,
) -> Result<Receipt, BenchError> {
    effect(conn, job).await?;
    Ok(receipt(job))
}

async fn effect(conn: &mut AsyncPgConnection, job: i64) -> QueryResult<()> {
    diesel::insert_into(bench_effects::table)
        .values(bench_effects::job.eq(job))
        .execute(conn)
        .await
        .map(drop)
}

/// The pattern as a diesel-async user writes it: the claim, the body if claimed (and the result's
/// `UPDATE`), in `conn.transaction`.
async fn hand(conn: &mut AsyncPgConnection, job: i64, value: bool) -> QueryResult<()> {
    use idempotent_jobs::schema::done_jobs::dsl as dj;
    let (key, digest) = hand_key(
        if value {
            "async-hand-value"
        } else {
            "async-hand"
        },
        job,
    );
    conn.transaction(async |c| {
        let claimed = diesel::insert_into(dj::done_jobs)
            .values((
                dj::key_digest.eq(&digest[..]),
                dj::job_key.eq(&key),
                dj::job_name.eq("hand"),
                dj::done_at.eq(chrono::Utc::now().naive_utc()),
            ))
            .on_conflict_do_nothing()
            .execute(c)
            .await?;
        if claimed == 1 {
            effect(c, job).await?;
            if value {
                let json = serde_json::to_string(&receipt(job)).expect("a receipt");
                diesel::update(dj::done_jobs.filter(dj::key_digest.eq(&digest[..])))
                    .set(dj::result.eq(json))
                    .execute(c)
                    .await?;
            }
        }
        Ok(())
    })
    .await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Macro,
    Hand,
    MacroValue,
    HandValue,
}

const KINDS: [Kind; 4] = [Kind::Macro, Kind::Hand, Kind::MacroValue, Kind::HandValue];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Macro => "macro",
            Kind::Hand => "hand",
            Kind::MacroValue => "macro_value",
            Kind::HandValue => "hand_value",
        }
    }

    async fn run(self, conn: &mut AsyncPgConnection, job: i64) {
        let done = match self {
            Kind::Macro => async_macro(conn, job).await.map(drop),
            Kind::MacroValue => async_macro_value(conn, job).await.map(drop),
            Kind::Hand => hand(conn, job, false).await.map_err(BenchError::from),
            Kind::HandValue => hand(conn, job, true).await.map_err(BenchError::from),
        };
        done.unwrap_or_else(|e| panic!("async {}: {e}", self.name()));
    }
}

/// One warm-up round, then `rounds` rounds of `jobs` jobs of each kind, taking turns job by job in
/// a shuffled order, on a current-thread runtime (as one worker task would run them).
pub fn measure(url: &str, rounds: usize, jobs: u64) -> AsyncFigures {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut conn = runtime
        .block_on(AsyncPgConnection::establish(url))
        .expect("an async PostgreSQL connection");
    let mut rng = Xorshift::new(0x2545_F491_4F6C_DD1D);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); KINDS.len()];
    let mut next: i64 = 1;
    for round in 0..=rounds {
        let mut spent = [Duration::ZERO; KINDS.len()];
        let mut order = KINDS;
        for _ in 0..jobs {
            rng.shuffle(&mut order);
            for kind in order {
                let started = Instant::now();
                runtime.block_on(kind.run(&mut conn, next));
                spent[kind as usize] += started.elapsed();
                next += 1;
            }
        }
        if round > 0 {
            for (rate, time) in rates.iter_mut().zip(spent) {
                rate.push(jobs as f64 / time.as_secs_f64());
            }
        }
    }
    let ratio = |faster: Kind, slower: Kind| {
        let (f, s) = (&rates[faster as usize], &rates[slower as usize]);
        median(f.iter().zip(s).map(|(f, s)| f / s).collect())
    };
    AsyncFigures {
        rounds,
        jobs_per_round: jobs,
        jobs_per_second: KINDS
            .iter()
            .map(|&k| (k.name(), median(rates[k as usize].clone())))
            .collect(),
        macro_over_hand: ratio(Kind::Hand, Kind::Macro),
        macro_value_over_hand_value: ratio(Kind::HandValue, Kind::MacroValue),
        round_trips: round_trips(&runtime, url),
    }
}

/// Client flights per job of each kind, through the counting proxy.
fn round_trips(runtime: &tokio::runtime::Runtime, url: &str) -> Vec<(&'static str, f64)> {
    const CALLS: i64 = 50;
    let (_, upstream) = via(url, "", 5432);
    let proxy = Proxy::start(&upstream).expect("the counting proxy");
    let (proxied, _) = via(url, &proxy.addr, 5432);
    let mut conn = runtime
        .block_on(AsyncPgConnection::establish(&proxied))
        .expect("an async connection through the proxy");
    KINDS
        .iter()
        .map(|&kind| {
            // Statements prepared first, on this connection.
            runtime.block_on(kind.run(&mut conn, 1_000_000_000 + kind as i64));
            let before = proxy.flights();
            for n in 0..CALLS {
                runtime.block_on(kind.run(&mut conn, 2_000_000_000 + n * 10 + kind as i64));
            }
            (
                kind.name(),
                (proxy.flights() - before) as f64 / CALLS as f64,
            )
        })
        .collect()
}
