//! Everything one run measured, and its text table.

use serde::Serialize;

use crate::compile::CompileTime;
use crate::growth::GrowthPoint;
use crate::prune::PruneUnderLoad;
use crate::relay::{Backlog, RelayPoint};
use crate::roundtrips::Count;
use crate::throughput::{RATIOS, Throughput};
use crate::variants::VARIANTS;
use crate::workers::Workers;

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub backends: Vec<BackendReport>,
    pub workers: Vec<Workers>,
    /// diesel-async's PostgreSQL connection: the attribute beside the hand-written job.
    pub async_postgres: Option<crate::async_pg::AsyncFigures>,
    pub compile_time: Option<CompileTime>,
    pub seconds: f64,
}

/// What the run ran on and beside.
#[derive(Debug, Default, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub memory: String,
    pub load_at_start: String,
    pub load_at_end: String,
    /// The busiest other processes when the run started.
    pub busiest_at_start: Vec<String>,
    pub options: String,
}

#[derive(Debug, Serialize)]
pub struct BackendReport {
    pub backend: &'static str,
    /// Durability, cache and server settings, as the server reported them.
    pub settings: String,
    pub throughput: Option<Throughput>,
    pub round_trips: Option<Vec<Count>>,
    pub growth: Option<Vec<GrowthPoint>>,
    pub relay: Option<Vec<RelayPoint>>,
    pub prune: Option<PruneUnderLoad>,
}

pub fn print(report: &Report) {
    print_machine(report);
    print_throughput(report);
    print_round_trips(report);
    print_growth(report);
    print_relay(report);
    print_prune(report);
    print_async(report);
    print_workers(report);
}

fn print_async(report: &Report) {
    let Some(figures) = &report.async_postgres else {
        return;
    };
    println!();
    println!(
        "async PostgreSQL (diesel-async, one connection, current-thread runtime; {} rounds of {} jobs of each, taking turns)",
        figures.rounds, figures.jobs_per_round
    );
    let rates: Vec<String> = figures
        .jobs_per_second
        .iter()
        .map(|(name, rate)| format!("{name} {rate:.0}"))
        .collect();
    println!("  jobs per second: {}", rates.join(", "));
    let trips: Vec<String> = figures
        .round_trips
        .iter()
        .map(|(name, n)| format!("{name} {n:.1}"))
        .collect();
    println!("  round trips per job: {}", trips.join(", "));
    println!(
        "  time per job: macro/hand {:.3}x, macro_value/hand_value {:.3}x (hand: conn.transaction, BEGIN and the claim one after the other)",
        figures.macro_over_hand, figures.macro_value_over_hand_value
    );
}

fn print_machine(report: &Report) {
    let m = &report.machine;
    println!();
    println!(
        "machine     {} cores, {} memory; load average {} at the start, {} at the end",
        m.cores, m.memory, m.load_at_start, m.load_at_end
    );
    println!(
        "busiest other processes at the start: {}",
        m.busiest_at_start.join("; ")
    );
    println!("options     {}", m.options);
    for backend in &report.backends {
        println!("{:<12}{}", backend.backend, backend.settings);
    }
}

fn print_throughput(report: &Report) {
    let measured: Vec<(&str, &Throughput)> = report
        .backends
        .iter()
        .filter_map(|b| Some((b.backend, b.throughput.as_ref()?)))
        .collect();
    let Some((_, first)) = measured.first() else {
        return;
    };
    println!();
    println!(
        "jobs per second (median of {} rounds of {} jobs of each variant, taking turns job by job, after a warm-up round)",
        first.rounds, first.jobs_per_round
    );
    print!("{:<12}", "backend");
    for variant in VARIANTS {
        print!("{:>14}", variant.name());
    }
    println!();
    for (name, t) in &measured {
        print!("{name:<12}");
        for variant in VARIANTS {
            match t.jobs_per_second.get(variant.name()) {
                Some(rate) => print!("{rate:>14.0}"),
                None => print!("{:>14}", "-"),
            }
        }
        println!();
    }
    for variant in VARIANTS {
        println!("  {:<14}{}", variant.name(), variant.legend());
    }
    println!();
    println!(
        "time per job, one variant over another (median of the rounds' own ratios; targets: macro*/floor* <= 1.05)"
    );
    print!("{:<12}", "backend");
    for (name, ..) in RATIOS {
        print!("{name:>25}");
    }
    println!();
    for (name, t) in &measured {
        print!("{name:<12}");
        for (ratio, ..) in RATIOS {
            match t.ratios.get(ratio) {
                Some(r) => print!("{:>24.3}x", r),
                None => print!("{:>25}", "-"),
            }
        }
        println!();
    }
}

fn print_round_trips(report: &Report) {
    let counted: Vec<(&str, &Vec<Count>)> = report
        .backends
        .iter()
        .filter_map(|b| Some((b.backend, b.round_trips.as_ref()?)))
        .collect();
    let Some((_, first)) = counted.first() else {
        return;
    };
    println!();
    println!(
        "round trips per job, counted by a loopback proxy (client flights); statements per job in parentheses, counted by Diesel's instrumentation"
    );
    print!("{:<12}", "backend");
    for count in first.iter() {
        print!("{:>19}", count.job);
    }
    println!();
    for (name, counts) in &counted {
        print!("{name:<12}");
        for count in counts.iter() {
            if count.statements == 0.0 {
                // Not run on this backend.
                print!("{:>19}", "-");
                continue;
            }
            let trips = count
                .round_trips
                .map_or("-".to_owned(), |r| format!("{r:.1}"));
            print!("{:>19}", format!("{trips} ({:.1})", count.statements));
        }
        println!();
    }
    for (name, counts) in &counted {
        for count in counts
            .iter()
            .filter(|c| c.job.starts_with("macro") || c.job.starts_with("replay"))
        {
            println!("{name:<12}{:<18}{}", count.job, count.sent.join(" | "));
        }
    }
}

fn print_growth(report: &Report) {
    let grown: Vec<(&str, &Vec<GrowthPoint>)> = report
        .backends
        .iter()
        .filter_map(|b| Some((b.backend, b.growth.as_ref()?)))
        .collect();
    if grown.is_empty() {
        return;
    }
    println!();
    println!(
        "cost growth: p50 / p99 µs, cold random keys, kinds taking turns call by call (rows 0: replays of keys claimed just before)"
    );
    println!(
        "{:<12}{:>10}{:>16}{:>16}{:>18}{:>18}{:>16}{:>11}{:>11}  size",
        "backend",
        "rows",
        "fresh claim",
        "via claim",
        "read first",
        "indexed read",
        "1-stmt claim",
        "claim/read",
        "first/read"
    );
    for (name, points) in grown {
        for p in points {
            let pair = |s: crate::stats::Spread| format!("{:.0} / {:.0}", s.p50_us, s.p99_us);
            println!(
                "{name:<12}{:>10}{:>16}{:>16}{:>18}{:>18}{:>16}{:>10.2}x{:>10.2}x  {}",
                p.rows,
                pair(p.fresh),
                pair(p.claim_path),
                pair(p.read_first),
                pair(p.read),
                p.one_statement.map_or("-".to_owned(), pair),
                p.claim_path_over_read,
                p.read_first_over_read,
                p.size
            );
        }
    }
}

fn print_relay(report: &Report) {
    let measured: Vec<(&str, &Vec<RelayPoint>)> = report
        .backends
        .iter()
        .filter_map(|b| Some((b.backend, b.relay.as_ref()?)))
        .collect();
    if measured.is_empty() {
        return;
    }
    println!();
    println!(
        "relay rounds beside delivered messages kept (until prune_delivered) and undelivered ones: p50 / p99 µs; a full round leases and delivers 100"
    );
    println!(
        "{:<12}{:>16}{:>22}{:>18}{:>18}{:>14}",
        "backend", "delivered kept", "undelivered", "idle round", "full round", "per message"
    );
    for (name, points) in measured {
        for p in points {
            let pair = |s: crate::stats::Spread| format!("{:.0} / {:.0}", s.p50_us, s.p99_us);
            let backlog = match p.backlog {
                Backlog::None => "-".to_owned(),
                Backlog::Due(n) => format!("{n} due"),
                Backlog::BackingOff(n) => format!("{n} backing off"),
            };
            println!(
                "{name:<12}{:>16}{:>22}{:>18}{:>18}{:>14.1}",
                p.delivered_kept,
                backlog,
                p.idle.map_or_else(|| "-".to_owned(), pair),
                pair(p.full),
                p.per_message_us
            );
        }
    }
}

fn print_prune(report: &Report) {
    for (name, prune) in report
        .backends
        .iter()
        .filter_map(|b| Some((b.backend, b.prune.as_ref()?)))
    {
        println!();
        println!(
            "{name}: prune {} lapsed of {} rows ({}) while {} workers claim; baseline = {:.0} s before and after together",
            prune.lapsed_rows,
            prune.live_rows + prune.lapsed_rows,
            prune.size,
            prune.workers,
            prune.baseline_seconds
        );
        println!(
            "  {:<58}{:>9}{:>10}{:>10}{:>10}{:>10}{:>10}{:>8}{:>8}  meets",
            "strategy",
            "removed",
            "prune s",
            "base j/s",
            "during",
            "base p99",
            "during",
            "ratio",
            "p99 x"
        );
        for t in &prune.trials {
            println!(
                "  {:<58}{:>9}{:>10.1}{:>10.0}{:>10.0}{:>10.0}{:>10.0}{:>8.2}{:>8.2}  {}",
                t.strategy,
                t.removed,
                t.prune_seconds,
                t.baseline_jobs_per_second,
                t.during_jobs_per_second,
                t.baseline_p99_us,
                t.during_p99_us,
                t.throughput_ratio,
                t.p99_ratio,
                if t.meets_targets { "yes" } else { "no" }
            );
        }
    }
    println!("(targets while pruning: throughput >= 0.9 of the baseline, p99 <= 2x; p99 in µs)");
}

fn print_workers(report: &Report) {
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
    if let Some(c) = &report.compile_time {
        println!(
            "compile time of {} handlers: {:.2} s with the attribute, {:.2} s without ({:.2}x)",
            c.handlers, c.with_attribute_seconds, c.without_attribute_seconds, c.ratio
        );
    }
}
