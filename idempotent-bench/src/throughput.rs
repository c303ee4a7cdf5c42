//! Jobs per second of every variant, the variants taking turns job by job in a shuffled order.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::db::BenchDb;
use crate::stats::{Xorshift, median};
use crate::variants::{VARIANTS, Variant};

#[derive(Debug, Serialize)]
pub struct Throughput {
    pub rounds: usize,
    pub jobs_per_round: u64,
    /// Median jobs per second, by variant.
    pub jobs_per_second: BTreeMap<&'static str, f64>,
    /// Every round's jobs per second, by variant.
    pub rounds_jobs_per_second: BTreeMap<&'static str, Vec<f64>>,
    /// Time per job, one variant over another: the median of the rounds' own ratios.
    pub ratios: BTreeMap<&'static str, f64>,
}

/// The ratios reported, as (name, the faster variant, the slower one): time per job of the second
/// over the first.
pub const RATIOS: [(&str, Variant, Variant); 11] = [
    ("macro/floor", Variant::Floor, Variant::Macro),
    (
        "macro_value/floor_value",
        Variant::FloorValue,
        Variant::MacroValue,
    ),
    (
        "macro_empty/floor_empty",
        Variant::FloorEmpty,
        Variant::MacroEmpty,
    ),
    ("macro/hand", Variant::Hand, Variant::Macro),
    (
        "nested_macro/nested_hand",
        Variant::NestedHand,
        Variant::NestedMacro,
    ),
    (
        "macro_value/hand_value",
        Variant::HandValue,
        Variant::MacroValue,
    ),
    ("hand/floor", Variant::Floor, Variant::Hand),
    ("floor/bare", Variant::Bare, Variant::Floor),
    ("two_phase/macro", Variant::Macro, Variant::TwoPhase),
    ("floor_checked/floor", Variant::Floor, Variant::FloorChecked),
    (
        "floor_procedures/floor",
        Variant::Floor,
        Variant::FloorProcedures,
    ),
];

/// One warm-up round, then `rounds` rounds of `jobs` jobs of every variant that applies, over
/// fresh keys. The variants take turns job by job, in a shuffled order, so that every one of them
/// meets the same disk and server weather (fsync times drift by tens of percent over seconds) and
/// follows every other one equally often (a commit slows the next one down a little).
pub fn measure<C: BenchDb>(conn: &mut C, rounds: usize, jobs: u64) -> Throughput {
    let variants: Vec<Variant> = VARIANTS
        .into_iter()
        .filter(|v| v.applies(C::KIND))
        .collect();
    let mut rates: BTreeMap<Variant, Vec<f64>> = BTreeMap::new();
    let mut next_job: i64 = 1;
    let mut rng = Xorshift::new(0x9E37_79B9_7F4A_7C15);
    for round in 0..=rounds {
        let spent = one_round(conn, &variants, jobs, next_job, &mut rng);
        next_job += jobs as i64 * variants.len() as i64;
        if round > 0 {
            for (variant, time) in spent {
                rates
                    .entry(variant)
                    .or_default()
                    .push(jobs as f64 / time.as_secs_f64());
            }
        }
    }
    let ratio = |faster: Variant, slower: Variant| {
        let (f, s) = (rates.get(&faster)?, rates.get(&slower)?);
        Some(median(f.iter().zip(s).map(|(f, s)| f / s).collect()))
    };
    let ratios = RATIOS
        .iter()
        .filter_map(|&(name, faster, slower)| Some((name, ratio(faster, slower)?)))
        .collect();
    Throughput {
        rounds,
        jobs_per_round: jobs,
        jobs_per_second: rates
            .iter()
            .map(|(v, r)| (v.name(), median(r.clone())))
            .collect(),
        rounds_jobs_per_second: rates.into_iter().map(|(v, r)| (v.name(), r)).collect(),
        ratios,
    }
}

fn one_round<C: BenchDb>(
    conn: &mut C,
    variants: &[Variant],
    jobs: u64,
    first_job: i64,
    rng: &mut Xorshift,
) -> BTreeMap<Variant, Duration> {
    let mut spent: BTreeMap<Variant, Duration> = BTreeMap::new();
    let mut order = variants.to_vec();
    for offset in 0..jobs as i64 {
        rng.shuffle(&mut order);
        for (turn, &variant) in order.iter().enumerate() {
            let job = first_job + offset * variants.len() as i64 + turn as i64;
            let started = Instant::now();
            variant
                .run(conn, job)
                .unwrap_or_else(|e| panic!("{}: {e}", variant.name()));
            *spent.entry(variant).or_default() += started.elapsed();
        }
    }
    spent
}
