//! Deterministic schedules for the explorer (tests/explore.rs): each runs a short, fixed schedule
//! through the same workers, nemesis and checker, so that the interleavings the random exploration
//! reaches only sometimes are checked in every run. A violation the explorer finds becomes a test
//! here, with its shrunk schedule. See docs/explore.md.
//!
//! So far the explorer has found no violation of the library's guarantees; the schedules below pin
//! the faults that matter most (a claim stopped past its keep while a duplicate waits, a commit
//! whose reply is lost, a kill between the commit and the acknowledgement, a connection terminated
//! inside the transaction).

#[path = "explore/controller.rs"]
#[allow(dead_code)]
mod controller;
#[path = "explore/driver.rs"]
#[allow(dead_code)]
mod driver;
#[path = "explore/model.rs"]
#[allow(dead_code)]
mod model;
#[path = "explore/worker.rs"]
#[allow(dead_code)]
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

use model::{Db, Fail, Hold, HoldPoint, JobSpec, Mode, Nemesis, Res, Schedule, Step};

/// The worker process's entry point (the controller runs this binary again as its workers).
#[test]
fn worker() {
    worker::main_if_worker();
}

fn job(id: &str, key: &str, keep: u8, hold: Option<(HoldPoint, Nemesis)>) -> JobSpec {
    JobSpec {
        id: id.into(),
        key: format!("explore:{keep}:{key}"),
        job: keep,
        redelivered: false,
        fp: Some(1),
        null_result: false,
        outbox: Some(0),
        fail: Fail::No,
        slow_ms: 0,
        hold: hold.map(|(at, then)| Hold { at, then }),
        cancel_ms: None,
        in_progress_ms: None,
        nested: false,
    }
}

fn deliver(w: usize, job: JobSpec) -> Step {
    Step::Deliver { w, job }
}

fn sleep(ms: u64) -> Step {
    Step::Sleep { ms }
}

fn relay(w: usize) -> Step {
    Step::Relay {
        w,
        hold_at: None,
        then: Nemesis::Go,
        cancel_ms: None,
    }
}

/// Runs `steps` on `db` with a sync worker 0 and an async worker 1, asserts the checker found
/// nothing, and returns the history's outcome of each delivery by id.
fn run(db: Db, steps: Vec<Step>) -> std::collections::BTreeMap<String, Res> {
    let schedule = Schedule {
        db,
        seed: 0,
        modes: vec![Mode::Sync, Mode::Async],
        steps,
    };
    let report = controller::run_schedule(&schedule);
    assert!(
        report.verdict.violations.is_empty(),
        "{}",
        driver::report_failure(&schedule, &report, std::time::Duration::ZERO)
    );
    report
        .history
        .deliveries
        .into_iter()
        .map(|d| (d.id, d.res))
        .collect()
}

/// A run stopped (SIGSTOP) inside its transaction for longer than its 1 s keep; duplicates arrive
/// on the other worker meanwhile and wait. The stopped run commits once continued; the duplicates
/// replay it instead of finding its claim lapsed.
fn stopped_past_keep(db: Db) {
    let outcomes = run(
        db,
        vec![
            deliver(
                0,
                job(
                    "d1",
                    "stopped",
                    1,
                    Some((HoldPoint::Body, Nemesis::StopFor { ms: 1_800 })),
                ),
            ),
            deliver(1, job("d2", "stopped", 1, None)),
            sleep(200),
            deliver(
                1,
                job(
                    "d3",
                    "async-stopped",
                    1,
                    Some((HoldPoint::Body, Nemesis::StopFor { ms: 1_800 })),
                ),
            ),
            deliver(0, job("d4", "async-stopped", 1, None)),
            relay(0),
        ],
    );
    assert_eq!(outcomes["d1"], Res::Ran(Some("res:d1".into())));
    assert_eq!(outcomes["d2"], Res::Replayed(Some("res:d1".into())));
    assert_eq!(outcomes["d3"], Res::Ran(Some("res:d3".into())));
    assert_eq!(outcomes["d4"], Res::Replayed(Some("res:d3".into())));
}

/// SIGKILL between the commit and the acknowledgement, and inside the transaction; the
/// redeliveries replay the first and run the second.
fn killed(db: Db) {
    let outcomes = run(
        db,
        vec![
            deliver(
                0,
                job(
                    "d1",
                    "acked",
                    0,
                    Some((HoldPoint::AfterCommit, Nemesis::Kill)),
                ),
            ),
            deliver(1, job("d2", "acked", 0, None)),
            deliver(
                1,
                job("d3", "in-tx", 0, Some((HoldPoint::Body, Nemesis::Kill))),
            ),
            deliver(0, job("d4", "in-tx", 0, None)),
            relay(1),
        ],
    );
    assert!(
        matches!(outcomes["d1"], Res::Unknown(_)),
        "{:?}",
        outcomes["d1"]
    );
    assert_eq!(outcomes["d2"], Res::Replayed(Some("res:d1".into())));
    assert!(
        matches!(outcomes["d3"], Res::Unknown(_)),
        "{:?}",
        outcomes["d3"]
    );
    assert_eq!(outcomes["d4"], Res::Ran(Some("res:d4".into())));
}

/// Connections cut, terminated, and answered by nobody at each statement after the body's work:
/// whatever each call reports, the checker holds it to it (an error that says nothing was
/// committed must have committed nothing), and every key completes in the final round.
fn lost_connections(db: Db) {
    let mut steps = Vec::new();
    for (n, nemesis) in [
        Nemesis::Terminate,
        Nemesis::Cut,
        Nemesis::LoseReplies { after: 0 },
        Nemesis::LoseReplies { after: 1 },
        Nemesis::LoseReplies { after: 2 },
        Nemesis::LoseReplies { after: 3 },
        Nemesis::LoseReplies { after: 4 },
        Nemesis::Stall { ms: 800 },
    ]
    .into_iter()
    .enumerate()
    {
        for w in 0..2 {
            let id = format!("d{n}{w}");
            let key = format!("lost-{n}-{w}");
            steps.push(deliver(
                w,
                job(&id, &key, 2, Some((HoldPoint::Body, nemesis))),
            ));
            steps.push(deliver(1 - w, job(&format!("{id}b"), &key, 2, None)));
        }
    }
    steps.push(sleep(500));
    steps.push(relay(0));
    for (id, res) in run(db, steps) {
        eprintln!("{} {id}: {}", db.name(), res.label());
    }
}

/// The server crashes (SIGKILL to every process of it) and restarts on its data while one run is
/// stopped inside its transaction and another between its commit and its acknowledgement: the
/// first must not report success; the second's commit survives the crash, and its redeliveries
/// replay it. The checker holds every outcome to what the restarted
/// server holds.
#[test]
fn postgres_server_crashes() {
    server_crashes(Db::Postgres);
}

#[test]
fn mariadb_server_crashes() {
    server_crashes(Db::Mariadb);
}

fn server_crashes(db: Db) {
    let stopped = |at| Some((at, Nemesis::StopFor { ms: 3_000 }));
    let outcomes = run(
        db,
        vec![
            deliver(0, job("d1", "crash-in-tx", 0, stopped(HoldPoint::Body))),
            deliver(
                1,
                job("d2", "crash-acked", 0, stopped(HoldPoint::AfterCommit)),
            ),
            Step::RestartServer,
            deliver(0, job("d3", "crash-in-tx", 0, None)),
            deliver(1, job("d4", "crash-acked", 0, None)),
            relay(0),
        ],
    );
    assert!(
        !outcomes["d1"].completed(),
        "the run whose transaction the crash ended reported {:?}",
        outcomes["d1"]
    );
    assert_eq!(outcomes["d2"], Res::Ran(Some("res:d2".into())));
    // The next call on a connection the crash closed fails before it claims anything, saying so;
    // the worker then connects again. The final round, which the checker holds to the database,
    // runs d1's key and replays d2's.
    for (id, done) in [
        ("d3", Res::Ran(Some("res:d3".into()))),
        ("d4", Res::Replayed(Some("res:d2".into()))),
    ] {
        let outcome = &outcomes[id];
        assert!(
            *outcome == done
                || matches!(
                    outcome,
                    Res::Error {
                        retryable: true,
                        nothing_committed: true,
                        ..
                    }
                ),
            "{id}: {outcome:?}"
        );
    }
}

#[test]
fn sqlite_stopped_past_keep() {
    stopped_past_keep(Db::Sqlite);
}

#[test]
fn postgres_stopped_past_keep() {
    stopped_past_keep(Db::Postgres);
}

#[test]
fn mariadb_stopped_past_keep() {
    stopped_past_keep(Db::Mariadb);
}

#[test]
fn sqlite_killed() {
    killed(Db::Sqlite);
}

#[test]
fn postgres_killed() {
    killed(Db::Postgres);
}

#[test]
fn mariadb_killed() {
    killed(Db::Mariadb);
}

#[test]
fn postgres_lost_connections() {
    lost_connections(Db::Postgres);
}

#[test]
fn mariadb_lost_connections() {
    lost_connections(Db::Mariadb);
}
