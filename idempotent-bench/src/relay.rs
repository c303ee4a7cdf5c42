//! What a relay round costs as delivered messages pile up in the outbox (they stay until
//! `prune_delivered`): at each size, an idle round (nothing to send: what a polling relay does most
//! of the time) and a round that leases and delivers a batch of 100, p50 and p99.

use std::time::Duration;

use idempotent_jobs::outbox::Relay;
use serde::Serialize;

use crate::db::BenchDb;
use crate::stats::{Spread, time_us};

/// Messages a full round leases and delivers.
const BATCH: u32 = 100;

#[derive(Debug, Serialize)]
pub struct RelayPoint {
    /// Delivered messages kept in the outbox while measuring.
    pub delivered_kept: u64,
    /// A round with nothing to send.
    pub idle: Spread,
    /// A round that leases and delivers [`BATCH`] messages.
    pub full: Spread,
    /// `full` per message delivered, p50.
    pub per_message_us: f64,
}

/// Measures at each of `sizes` (ascending), adding delivered messages up to each in turn; `rounds`
/// idle and `rounds` full rounds at each.
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
        let round = |conn: &mut C| {
            let mut delivered = 0;
            let took = time_us(|| {
                delivered = relay
                    .run_once(conn, |_| Ok::<_, String>(()))
                    .expect("a relay round")
                    .delivered;
            });
            (took, delivered)
        };
        // Warm the connection's statements.
        round(conn);
        let idle: Vec<f64> = (0..rounds)
            .map(|_| {
                let (took, delivered) = round(conn);
                assert_eq!(delivered, 0, "an idle round delivered messages");
                took
            })
            .collect();
        let full: Vec<f64> = (0..rounds)
            .map(|_| {
                let to = pending_next + u64::from(BATCH);
                conn.batch_execute(&C::outbox_fill_sql(pending_next, to, false))
                    .expect("pending messages");
                pending_next = to;
                let (took, delivered) = round(conn);
                assert_eq!(delivered, u64::from(BATCH), "a full round");
                took
            })
            .collect();
        let full = Spread::of(&full);
        points.push(RelayPoint {
            delivered_kept: size,
            idle: Spread::of(&idle),
            full,
            per_message_us: full.p50_us / f64::from(BATCH),
        });
    }
    points
}
