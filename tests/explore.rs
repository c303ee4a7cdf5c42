//! A seeded randomized fault explorer (issue 26): worker processes, sync and async, on SQLite,
//! PostgreSQL and MariaDB, consume a random stream of jobs drawn from a seed while a nemesis kills,
//! stops, disconnects, stalls and skews them, drops async futures, kills relays, prunes and forgets
//! keys. Every delivery's outcome goes into a history; after a fault-free final round a checker
//! compares the history with what the database committed. See docs/explore.md.
//!
//! `cargo test --all-features --test explore` runs for under 3 minutes with a fresh seed;
//! `IDEMPOTENT_EXPLORE_FOR=30m` runs longer, `IDEMPOTENT_EXPLORE_SEED=<n>` replays a seed,
//! `IDEMPOTENT_EXPLORE_SCHEDULE=<file>` a shrunk schedule.

#[path = "explore/controller.rs"]
mod controller;
#[path = "explore/driver.rs"]
mod driver;
#[path = "explore/model.rs"]
mod model;
#[path = "explore/worker.rs"]
mod worker;
// The servers of the cluster tests' own, shared with tests/cluster.rs, which uses the rest.
#[path = "support/mariadb.rs"]
#[allow(dead_code)]
mod mariadb;
#[path = "support/names.rs"]
mod names;
#[path = "support/postgres_cluster.rs"]
#[allow(dead_code)]
mod postgres_cluster;
#[path = "support/processes.rs"]
#[allow(dead_code)]
mod processes;

use std::io::Write as _;
use std::time::{Duration, Instant};

use model::{Db, Delivery, Effect, Forget, History, Observed, Res, check};

/// The worker process's entry point: the controller runs this binary again with
/// `IDEMPOTENT_EXPLORE_WORKER` set and `--exact worker`; without it, this returns at once.
#[test]
fn worker() {
    worker::main_if_worker();
}

/// The exploration: every database at once, for the budget; fails with the seed, the schedule and
/// a shrunk schedule when the checker finds a violation.
#[test]
fn explore() {
    let settings = driver::Settings::from_env();
    if let Ok(path) = std::env::var("IDEMPOTENT_EXPLORE_SCHEDULE") {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let schedule: model::Schedule = serde_json::from_str(&text).expect("a schedule");
        let report = controller::run_schedule(&schedule);
        say(&driver::describe(&report.figures, schedule.db));
        assert!(
            report.verdict.violations.is_empty(),
            "{}",
            driver::report_failure(&schedule, &report, Duration::ZERO)
        );
        return;
    }
    say(&format!(
        "explore: seed {} ({}), {:?} on {:?}; replay with IDEMPOTENT_EXPLORE_SEED={}",
        settings.seed,
        if settings.seed_given {
            "given"
        } else {
            "fresh, from the time"
        },
        settings.explore_for,
        settings.dbs,
        settings.seed
    ));
    let started = Instant::now();
    let threads: Vec<_> = settings
        .dbs
        .iter()
        .map(|&db| {
            let (seed, explore_for, steps, shrink_for) = (
                settings.seed,
                settings.explore_for,
                settings.steps,
                settings.shrink_for,
            );
            std::thread::spawn(move || -> Vec<String> {
                let mut failures = Vec::new();
                let mut epoch = 0u64;
                let mut total = controller::Figures::default();
                let deadline = Instant::now() + explore_for;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let limit = left.min(driver::EPOCH);
                    let (schedule, report) = driver::explore_epoch(db, seed + epoch, limit, steps);
                    let f = &report.figures;
                    if explore_for > driver::EPOCH {
                        say(&format!(
                            "  epoch {epoch} (seed {}): {}",
                            seed + epoch,
                            driver::describe(f, db)
                        ));
                    }
                    add(&mut total, f);
                    if !report.verdict.violations.is_empty() {
                        failures.push(driver::report_failure(&schedule, &report, shrink_for));
                    }
                    epoch += 1;
                    if steps.is_some() || Instant::now() + Duration::from_secs(20) >= deadline {
                        break;
                    }
                }
                say(&driver::describe(&total, db));
                failures
            })
        })
        .collect();
    let failures: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("an exploring thread"))
        .collect();
    eprintln!("explore: {:.0} s in all", started.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "the explorer found violations (seed {}):\n{}",
        settings.seed,
        failures.join("\n")
    );
}

/// Prints a line of figures past libtest's capture (so that a passing run shows what it covered),
/// and appends it to the file `IDEMPOTENT_FIGURES` names, which `scripts/test` prints at the end.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
    if let Ok(path) = std::env::var("IDEMPOTENT_FIGURES")
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(file, "{line}");
    }
}

fn add(total: &mut controller::Figures, f: &controller::Figures) {
    total.steps += f.steps;
    total.deliveries += f.deliveries;
    total.final_deliveries += f.final_deliveries;
    total.keys += f.keys;
    total.received += f.received;
    total.duplicates_received += f.duplicates_received;
    total.relay_rounds += f.relay_rounds;
    total.effects += f.effects;
    total.duration += f.duration;
    for (k, n) in &f.outcomes {
        *total.outcomes.entry(k.clone()).or_default() += n;
    }
    for (k, n) in &f.faults {
        *total.faults.entry(k.clone()).or_default() += n;
    }
    for (k, n) in &f.checks {
        *total.checks.entry(k).or_default() += n;
    }
}

// ---- the checker catches what it is there to catch ------------------------------------------------

fn delivery(id: &str, key: &str, job: u8, final_round: bool, res: Res) -> Delivery {
    Delivery {
        id: id.into(),
        key: key.into(),
        job,
        worker: 0,
        final_round,
        null_result: false,
        res,
        start_us: 0,
        end_us: 0,
    }
}

fn effect(key: &str, run: &str, at_us: i64) -> Effect {
    Effect {
        key: key.into(),
        run_id: run.into(),
        result: Some(format!("res:{run}")),
        at_us,
        msg_id: None,
    }
}

fn ran(id: &str) -> Res {
    Res::Ran(Some(format!("res:{id}")))
}

/// A clean history: one key run, replayed, and completed in the final round.
fn clean() -> (History, Observed) {
    let history = History {
        deliveries: vec![
            delivery("d1", "k", 0, false, ran("d1")),
            delivery("d2", "k", 0, false, Res::Replayed(Some("res:d1".into()))),
            delivery("f1", "k", 0, true, Res::Replayed(Some("res:d1".into()))),
        ],
        ..History::default()
    };
    let observed = Observed {
        effects: vec![effect("k", "d1", 1_000_000)],
        ..Observed::default()
    };
    (history, observed)
}

fn kinds(history: &History, observed: &Observed) -> Vec<&'static str> {
    check(history, observed)
        .violations
        .iter()
        .map(|v| v.kind)
        .collect()
}

#[test]
fn the_checker_passes_a_clean_history() {
    let (history, observed) = clean();
    assert_eq!(kinds(&history, &observed), Vec::<&str>::new());
}

#[test]
fn the_checker_reports_a_double_effect_in_one_window() {
    let (mut history, mut observed) = clean();
    history
        .deliveries
        .push(delivery("d3", "k", 0, false, Res::Unknown("killed".into())));
    observed.effects.push(effect("k", "d3", 9_000_000));
    assert_eq!(kinds(&history, &observed), vec!["one-effect-per-window"]);
    // A forget that found the row between the two opens a new window.
    history.forgets.push(Forget {
        key: "k".into(),
        start_us: 5_000_000,
        end_us: 5_001_000,
        found: true,
        error: None,
    });
    assert_eq!(kinds(&history, &observed), Vec::<&str>::new());
    // A keep of 1 s that lapsed between them does too, one that did not does not.
    let (mut history, mut observed) = clean();
    for d in &mut history.deliveries {
        d.job = 1;
    }
    history
        .deliveries
        .push(delivery("d3", "k", 1, false, Res::Unknown("killed".into())));
    observed.effects.push(effect("k", "d3", 2_100_000));
    assert_eq!(kinds(&history, &observed), Vec::<&str>::new());
    observed.effects[1].at_us = 1_500_000;
    assert_eq!(kinds(&history, &observed), vec!["one-effect-per-window"]);
}

#[test]
fn the_checker_reports_a_ran_without_its_effect() {
    let (mut history, observed) = clean();
    history
        .deliveries
        .push(delivery("d3", "k", 0, false, ran("d3")));
    assert_eq!(kinds(&history, &observed), vec!["ran-is-committed"]);
}

#[test]
fn the_checker_reports_a_stuck_key() {
    let (mut history, observed) = clean();
    history.deliveries.pop();
    history.deliveries.push(delivery(
        "f1",
        "k",
        0,
        true,
        Res::Error {
            variant: "InProgress".into(),
            text: "another run is in progress".into(),
            retryable: true,
            nothing_committed: true,
        },
    ));
    assert_eq!(kinds(&history, &observed), vec!["no-key-stuck"]);
    history.deliveries.pop();
    assert_eq!(
        kinds(&history, &observed),
        vec!["no-key-stuck"],
        "never delivered in the final round"
    );
}

#[test]
fn the_checker_reports_an_error_that_hid_a_commit() {
    let (mut history, mut observed) = clean();
    for d in &mut history.deliveries {
        d.job = 1;
    }
    history.deliveries.push(delivery(
        "d3",
        "k",
        1,
        false,
        Res::Error {
            variant: "Database".into(),
            text: "nothing of the job was committed".into(),
            retryable: true,
            nothing_committed: true,
        },
    ));
    observed.effects.push(effect("k", "d3", 9_000_000));
    assert_eq!(
        kinds(&history, &observed),
        vec!["nothing-committed-means-nothing"]
    );
    // The same with an unknown outcome is no violation.
    history.deliveries.last_mut().expect("d3").res = Res::Error {
        variant: "CommitOutcomeUnknown".into(),
        text: "may or may not".into(),
        retryable: true,
        nothing_committed: false,
    };
    assert_eq!(kinds(&history, &observed), Vec::<&str>::new());
}

#[test]
fn the_checker_reports_a_wrong_replay() {
    let (mut history, observed) = clean();
    history.deliveries[1].res = Res::Replayed(Some("res:d9".into()));
    assert_eq!(
        kinds(&history, &observed),
        vec!["replay-returns-a-committed-result"]
    );
}

#[test]
fn the_checker_reports_a_replay_of_an_earlier_window() {
    // Keep 1 s: d1 at 1 s, d3 ran in a later window at 3 s and reported it at 3.2 s; d4, sent at
    // 4 s (before d3's window lapsed), replayed d1's result from a row d3 had replaced.
    let (mut history, mut observed) = clean();
    for d in &mut history.deliveries {
        d.job = 1;
    }
    let mut d3 = delivery("d3", "k", 1, false, ran("d3"));
    (d3.start_us, d3.end_us) = (2_900_000, 3_200_000);
    let mut d4 = delivery("d4", "k", 1, false, Res::Replayed(Some("res:d1".into())));
    (d4.start_us, d4.end_us) = (4_000_000, 4_100_000);
    history.deliveries.extend([d3, d4]);
    observed.effects.push(effect("k", "d3", 3_000_000));
    assert_eq!(
        kinds(&history, &observed),
        vec!["replay-returns-the-latest-window"]
    );
    // Sent before d3 reported, d4 may have read the row before d3's claim replaced it.
    history.deliveries[4].start_us = 3_100_000;
    assert_eq!(kinds(&history, &observed), Vec::<&str>::new());
    // Replaying d3 itself is right.
    history.deliveries[4].start_us = 4_000_000;
    history.deliveries[4].res = Res::Replayed(Some("res:d3".into()));
    assert_eq!(kinds(&history, &observed), Vec::<&str>::new());
}

#[test]
fn the_checker_reports_outbox_losses_duplicates_and_early_parking() {
    let (mut history, mut observed) = clean();
    observed.effects[0].msg_id = Some("m1".into());
    observed.outbox_ids = vec!["m1".into()];
    // Committed, never delivered.
    assert_eq!(
        kinds(&history, &observed),
        vec!["committed-message-delivered"]
    );
    // Delivered twice: allowed (at least once, exactly once by id).
    history.received = vec!["m1".into(), "m1".into()];
    assert_eq!(kinds(&history, &observed), Vec::<&str>::new());
    // A message of a run that never committed, delivered.
    history.received.push("m2".into());
    observed.outbox_ids.push("m2".into());
    assert_eq!(
        kinds(&history, &observed),
        vec![
            "delivered-message-was-committed",
            "outbox-row-was-committed-with-its-job"
        ]
    );
    history.received.pop();
    observed.outbox_ids.pop();
    // Parked before its attempts were spent.
    observed.parked = vec![("m1".into(), 1)];
    assert_eq!(
        kinds(&history, &observed),
        vec!["parked-only-when-attempts-spent"]
    );
}

/// End to end: workers that do their work without the library (no claim, no transaction) make
/// double effects, which the explorer reports; the shrinker then cuts the schedule down.
#[test]
fn the_explorer_catches_workers_without_the_library() {
    let schedule = model::Generator::schedule(7, Db::Sqlite, 40);
    let report = controller::run_schedule_with(&schedule, true);
    let found = model::signature(&report.verdict.violations);
    assert!(
        found.contains("one-effect-per-window"),
        "the sabotaged run was not caught: {:?}",
        report.verdict.violations
    );
    let (small, violations) = driver::shrink_with(
        &schedule,
        &report.verdict.violations,
        Duration::from_secs(25),
        true,
    );
    assert!(!violations.is_empty());
    assert!(
        small.steps.len() < schedule.steps.len(),
        "the shrinker removed nothing from {} steps",
        schedule.steps.len()
    );
    eprintln!(
        "sabotage caught, shrunk from {} to {} steps:\n{}",
        schedule.steps.len(),
        small.steps.len(),
        driver::schedule_text(&small)
    );
}

#[test]
fn a_seed_gives_the_same_schedule() {
    for db in [Db::Sqlite, Db::Postgres, Db::Mariadb] {
        let a = model::Generator::schedule(42, db, 500);
        let b = model::Generator::schedule(42, db, 500);
        assert_eq!(a, b);
        assert_ne!(a, model::Generator::schedule(43, db, 500));
        let text = driver::schedule_text(&a);
        let back: model::Schedule = serde_json::from_str(&text).expect("a schedule reads back");
        assert_eq!(back, a);
    }
}

#[test]
fn durations_parse() {
    assert_eq!(
        driver::parse_duration("30m"),
        Some(Duration::from_secs(1800))
    );
    assert_eq!(
        driver::parse_duration("20min"),
        Some(Duration::from_secs(1200))
    );
    assert_eq!(driver::parse_duration("90s"), Some(Duration::from_secs(90)));
    assert_eq!(
        driver::parse_duration("1h30m"),
        Some(Duration::from_secs(5400))
    );
    assert_eq!(driver::parse_duration("45"), Some(Duration::from_secs(45)));
    assert_eq!(driver::parse_duration("soon"), None);
}
