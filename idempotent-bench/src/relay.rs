//! What a relay round costs as delivered messages pile up in the outbox (they stay until
//! `prune_delivered`): at each size, an idle round (nothing to send: what a polling relay does most
//! of the time) and a round that leases and delivers a batch of 100, p50 and p99. Then, beside the
//! largest size, a backlog of as many undelivered messages: first all due (a relay catching up
//! after its receiver was down), then all backing off (failed deliveries not due yet) while new
//! messages arrive.

use std::time::Duration;

use idempotent_jobs::outbox::Relay;
use serde::Serialize;

use crate::db::BenchDb;
use crate::stats::{Spread, time_us};

/// Messages a full round leases and delivers.
const BATCH: u32 = 100;

/// The undelivered messages beside the delivered ones while measuring.
#[derive(Debug, Clone, Copy, Serialize)]
pub enum Backlog {
    /// Only the batch a full round delivers.
    None,
    /// This many messages due now; a full round delivers the oldest 100.
    Due(u64),
    /// This many messages whose next attempt is not due yet, beside the batch a full round
    /// delivers.
    BackingOff(u64),
}

#[derive(Debug, Serialize)]
pub struct RelayPoint {
    /// Delivered messages kept in the outbox while measuring.
    pub delivered_kept: u64,
    /// Undelivered messages beside them.
    pub backlog: Backlog,
    /// A round with nothing to send (none with a due backlog: every round has).
    pub idle: Option<Spread>,
    /// A round that leases and delivers [`BATCH`] messages.
    pub full: Spread,
    /// `full` per message delivered, p50.
    pub per_message_us: f64,
}

/// A relay round on `conn`: how long it took, and how many messages it delivered.
fn round<C: BenchDb>(relay: &Relay, conn: &mut C) -> (f64, u64) {
    let mut delivered = 0;
    let took = time_us(|| {
        delivered = relay
            .run_once(conn, |_| Ok::<_, String>(()))
            .expect("a relay round")
            .delivered;
    });
    (took, delivered)
}

/// `rounds` idle rounds.
fn idle_rounds<C: BenchDb>(relay: &Relay, conn: &mut C, rounds: usize) -> Spread {
    let idle: Vec<f64> = (0..rounds)
        .map(|_| {
            let (took, delivered) = round(relay, conn);
            assert_eq!(delivered, 0, "an idle round delivered messages");
            took
        })
        .collect();
    Spread::of(&idle)
}

/// `rounds` full rounds, each delivering [`BATCH`] messages, pushed before it when `fill` (the
/// next ids from `pending_next`), or already due when not.
fn full_rounds<C: BenchDb>(
    relay: &Relay,
    conn: &mut C,
    rounds: usize,
    fill: bool,
    pending_next: &mut u64,
) -> Spread {
    let full: Vec<f64> = (0..rounds)
        .map(|_| {
            if fill {
                let to = *pending_next + u64::from(BATCH);
                conn.batch_execute(&C::outbox_fill_sql(*pending_next, to, false))
                    .expect("pending messages");
                *pending_next = to;
            }
            let (took, delivered) = round(relay, conn);
            assert_eq!(delivered, u64::from(BATCH), "a full round");
            took
        })
        .collect();
    Spread::of(&full)
}

fn point(delivered_kept: u64, backlog: Backlog, idle: Option<Spread>, full: Spread) -> RelayPoint {
    RelayPoint {
        delivered_kept,
        backlog,
        idle,
        full,
        per_message_us: full.p50_us / f64::from(BATCH),
    }
}

/// Measures at each of `sizes` (ascending), adding delivered messages up to each in turn; `rounds`
/// idle and `rounds` full rounds at each. Then, beside the largest size (when it is not 0), a
/// backlog of as many undelivered messages, due and then backing off.
pub fn measure<C: BenchDb>(conn: &mut C, sizes: &[u64], rounds: usize) -> Vec<RelayPoint> {
    let relay = Relay::new()
        .batch_size(BATCH)
        .lease(Duration::from_secs(600));
    let mut kept = 0;
    let mut pending_next = 0;
    let mut points = Vec::new();
    for &size in sizes {
        if size > kept {
            let started = std::time::Instant::now();
            conn.batch_execute(&C::outbox_fill_sql(kept, size, true))
                .expect("filling the outbox with delivered messages");
            conn.settle_outbox();
            kept = size;
            eprintln!("  {size} delivered messages in {:.0?}", started.elapsed());
        }
        // Warm the connection's statements.
        round(&relay, conn);
        let idle = idle_rounds(&relay, conn, rounds);
        let full = full_rounds(&relay, conn, rounds, true, &mut pending_next);
        points.push(point(size, Backlog::None, Some(idle), full));
    }
    if kept == 0 {
        return points;
    }
    let started = std::time::Instant::now();
    let to = pending_next + kept;
    conn.batch_execute(&C::outbox_fill_sql(pending_next, to, false))
        .expect("filling the outbox with a backlog");
    pending_next = to;
    conn.settle_outbox();
    eprintln!(
        "  a backlog of {kept} due messages in {:.0?}",
        started.elapsed()
    );
    let full = full_rounds(&relay, conn, rounds, false, &mut pending_next);
    points.push(point(kept, Backlog::Due(kept), None, full));

    let started = std::time::Instant::now();
    conn.batch_execute(C::OUTBOX_BACK_OFF)
        .expect("backing the backlog off");
    conn.settle_outbox();
    let backing_off = kept - rounds as u64 * u64::from(BATCH);
    eprintln!("  the backlog backing off in {:.0?}", started.elapsed());
    let idle = idle_rounds(&relay, conn, rounds);
    let full = full_rounds(&relay, conn, rounds, true, &mut pending_next);
    points.push(point(
        kept,
        Backlog::BackingOff(backing_off),
        Some(idle),
        full,
    ));
    points
}
