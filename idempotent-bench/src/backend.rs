//! One backend's measurements, step by step, each in a database of its own.

use std::time::Duration;

use crate::databases::Databases;
use crate::db::BenchDb;
use crate::report::BackendReport;
use crate::roundtrips::{Proxy, via};
use crate::{growth, prune, relay, roundtrips, throughput};

/// What to measure, and at which sizes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub throughput: bool,
    pub round_trips: bool,
    pub rounds: usize,
    pub jobs_per_round: u64,
    /// Row counts `done_jobs` is measured at (empty: not measured).
    pub growth_sizes: Vec<u64>,
    pub growth_samples: usize,
    /// Delivered messages kept in the outbox that a relay round is measured beside (empty: not
    /// measured), and the rounds at each.
    pub relay_sizes: Vec<u64>,
    pub relay_rounds: usize,
    /// Live and lapsed rows of the prune-while-claiming test (None: not measured).
    pub prune: Option<(u64, u64)>,
    pub prune_baseline: Duration,
    /// The server's default port, for the round-trip proxy (None: in process).
    pub default_port: Option<u16>,
}

pub fn run<C: BenchDb>(name: &'static str, dbs: &mut Databases, plan: &Plan) -> BackendReport {
    eprintln!("{name}...");
    let main_url = dbs.create("main");
    let mut conn = prepared::<C>(&main_url);
    let settings = conn.settings();
    let throughput = plan.throughput.then(|| {
        eprintln!("  throughput...");
        match (latency(), plan.default_port) {
            (Some(delay), Some(port)) => {
                let (_, upstream) = via(&main_url, "", port);
                let proxy = Proxy::start_delayed(&upstream, delay).expect("the delaying proxy");
                let (proxied, _) = via(&main_url, &proxy.addr, port);
                let mut conn = C::establish(&proxied).expect("a connection through the proxy");
                throughput::measure(&mut conn, plan.rounds, plan.jobs_per_round)
            }
            _ => throughput::measure(&mut conn, plan.rounds, plan.jobs_per_round),
        }
    });
    let round_trips = plan.round_trips.then(|| {
        eprintln!("  round trips...");
        count_round_trips::<C>(&main_url, plan.default_port)
    });
    drop(conn);
    dbs.drop("main");
    let growth = (!plan.growth_sizes.is_empty()).then(|| {
        eprintln!("  growth...");
        let mut conn = prepared::<C>(&dbs.create("growth"));
        let points = growth::measure(&mut conn, &plan.growth_sizes, plan.growth_samples);
        drop(conn);
        dbs.drop("growth");
        points
    });
    let relay = (!plan.relay_sizes.is_empty()).then(|| {
        eprintln!("  relay...");
        let mut conn = prepared::<C>(&dbs.create("relay"));
        let points = relay::measure(&mut conn, &plan.relay_sizes, plan.relay_rounds);
        drop(conn);
        dbs.drop("relay");
        points
    });
    let prune = plan.prune.map(|(live, lapsed)| {
        eprintln!("  prune while claiming...");
        let url = dbs.create("prune");
        drop(prepared::<C>(&url));
        let connect = move || C::establish(&url).expect("a connection");
        let figures = prune::measure(&connect, live, lapsed, plan.prune_baseline);
        dbs.drop("prune");
        figures
    });
    BackendReport {
        backend: name,
        settings,
        throughput,
        round_trips,
        growth,
        relay,
        prune,
    }
}

/// A connection to `url` with the library's tables and the benchmark's.
pub fn prepared<C: BenchDb>(url: &str) -> C {
    let mut conn = C::establish(url).unwrap_or_else(|e| panic!("{}: {e}", C::NAME));
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    conn.create_tables().expect("bench tables");
    conn.create_procedures().expect("bench procedures");
    conn
}

fn count_round_trips<C: BenchDb>(url: &str, default_port: Option<u16>) -> Vec<roundtrips::Count> {
    const CALLS: i64 = 50;
    match default_port {
        None => roundtrips::count(&mut C::establish(url).expect("a connection"), None, CALLS),
        Some(port) => {
            let (_, upstream) = via(url, "", port);
            let proxy = Proxy::start(&upstream).expect("the counting proxy");
            let (proxied, _) = via(url, &proxy.addr, port);
            let mut conn = C::establish(&proxied).expect("a connection through the proxy");
            roundtrips::count(&mut conn, Some(&proxy), CALLS)
        }
    }
}

/// `IDEMPOTENT_BENCH_LATENCY_US`: the throughput section on a server goes through a loopback
/// proxy that holds each of the client's flights that long, as a network would once per round
/// trip (the proxy's own hop included, every variant alike).
pub fn latency() -> Option<Duration> {
    std::env::var("IDEMPOTENT_BENCH_LATENCY_US")
        .ok()
        .and_then(|us| us.parse().ok())
        .map(Duration::from_micros)
}
