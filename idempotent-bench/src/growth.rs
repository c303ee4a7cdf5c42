//! What a claim and a replay cost as `done_jobs` grows: at each size, fresh claims, replays
//! through the claim (told it is a first delivery: a transaction, the claim, the read), replays
//! read first (told it is a redelivery) and one indexed read of the same kind of key, p50 and p99,
//! the kinds taking turns call by call on cold keys picked at random.

use serde::Serialize;

use crate::db::BenchDb;
use crate::stats::{Spread, Xorshift, time_us};
use crate::variants::{hand_key, macro_job};

#[derive(Debug, Serialize)]
pub struct GrowthPoint {
    /// Rows filled before measuring (0: the replays replay keys claimed just before).
    pub rows: u64,
    /// `done_jobs` with its indexes, as the server reported it.
    pub size: String,
    pub samples: usize,
    pub fresh: Spread,
    pub claim_path: Spread,
    pub read_first: Spread,
    pub read: Spread,
    /// PostgreSQL: `BEGIN`, claim-or-read in one statement, `COMMIT` (what the claim path could
    /// send), on the same kind of key.
    pub one_statement: Option<Spread>,
    /// Replay through the claim over one indexed read, p50; target ≤ 2.
    pub claim_path_over_read: f64,
    /// Replay read first over one indexed read, p50.
    pub read_first_over_read: f64,
}

/// Measures at each of `sizes` (ascending), filling `done_jobs` with `macro_job`'s keys
/// `bench:<n>` up to each size in turn.
pub fn measure<C: BenchDb>(conn: &mut C, sizes: &[u64], samples: usize) -> Vec<GrowthPoint> {
    let mut filled = 0;
    let mut fresh_next: i64 = 5_000_000_000;
    let mut points = Vec::new();
    for &rows in sizes {
        let started = std::time::Instant::now();
        conn.fill(filled, rows, "bench", "macro_job", false);
        filled = filled.max(rows);
        eprintln!("  {} rows in {:.0?}", rows, started.elapsed());
        points.push(at_size(conn, rows, samples, &mut fresh_next));
    }
    points
}

fn at_size<C: BenchDb>(
    conn: &mut C,
    rows: u64,
    samples: usize,
    fresh_next: &mut i64,
) -> GrowthPoint {
    // Warm the connection's statements; on an empty table, these are the keys replayed.
    let warm: Vec<i64> = (0..samples.max(50) as i64)
        .map(|i| *fresh_next + i)
        .collect();
    for &job in &warm {
        macro_job(conn, job).expect("a warm-up claim");
    }
    *fresh_next += warm.len() as i64;
    let mut rng = Xorshift::new(0xD1B5_4A32_D192_ED03 ^ rows);
    let mut used = std::collections::HashSet::new();
    let mut old_key = |rng: &mut Xorshift| loop {
        let n = match rows {
            0 => warm[(rng.next() % warm.len() as u64) as usize],
            _ => i64::try_from(rng.next() % rows).unwrap_or(0),
        };
        if used.insert(n) || rows == 0 {
            return n;
        }
    };
    let mut kinds: [Vec<f64>; 5] = Default::default();
    let mut order = [0usize, 1, 2, 3, 4];
    for _ in 0..samples {
        rng.shuffle(&mut order);
        for kind in order {
            let key = old_key(&mut rng);
            let micros = match kind {
                0 => {
                    *fresh_next += 1;
                    let job = *fresh_next;
                    time_us(|| macro_job(conn, job).expect("a claim"))
                }
                1 => time_us(|| replay(conn, key, false)),
                2 => time_us(|| replay(conn, key, true)),
                3 => time_us(|| read(conn, key)),
                _ => {
                    let (text, digest) = hand_key("bench", key);
                    let started = std::time::Instant::now();
                    match conn.one_statement_replay(&text, &digest) {
                        Some(done) => done.expect("a one-statement replay"),
                        None => continue,
                    }
                    started.elapsed().as_secs_f64() * 1e6
                }
            };
            kinds[kind].push(micros);
        }
    }
    let one_statement = (!kinds[4].is_empty()).then(|| Spread::of(&kinds[4]));
    let [fresh, claim_path, read_first, read, _] = kinds.map(|k| Spread::of(&k));
    GrowthPoint {
        rows,
        size: conn.size(),
        samples,
        fresh,
        claim_path,
        read_first,
        read,
        one_statement,
        claim_path_over_read: claim_path.p50_us / read.p50_us,
        read_first_over_read: read_first.p50_us / read.p50_us,
    }
}

fn replay<C: BenchDb>(conn: &mut C, job: i64, redelivered: bool) {
    idempotent_jobs::redelivered(redelivered, || macro_job(conn, job)).expect("a replay");
}

/// One indexed read of the key's row: the floor of a replay.
fn read<C: BenchDb>(conn: &mut C, job: i64) {
    let (_, digest) = hand_key("bench", job);
    let row = conn.read_done(&digest).expect("a read");
    assert!(row.is_some(), "bench:{job} is claimed");
}
