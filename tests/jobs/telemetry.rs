//! What an operator sees is what the guide's table says: every metric the runtime records is one of
//! `stats::METRICS` (one prefix, the unit last), every one of those is in the guide's table, and
//! the per-job and per-message events carry the fields the table names, at the level it names.

use idempotent_jobs::outbox::Relay;
use idempotent_jobs::stats::{METRICS, MetricKind};

use crate::backends::{Backend as _, Sqlite};
use crate::handlers::Mode;
use crate::harness::Db;

const GUIDE: &str = include_str!("../../docs/operating.md");

#[test]
fn every_metric_and_event_is_named_and_in_the_guide() {
    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let ((), events) = crate::capture::events(|| {
        metrics::with_local_recorder(&recorder, || {
            // Ran, replayed, failed; a message delivered and one parked; counts; a forget.
            Sqlite::charge(&mut conn, "order-1", 1, Mode::Succeed).expect("ran");
            Sqlite::charge(&mut conn, "order-1", 1, Mode::Succeed).expect("replayed");
            Sqlite::charge(&mut conn, "order-2", 1, Mode::Fail).expect_err("failed");
            crate::effects::send_receipt(&mut conn, "order-3").expect("a receipt");
            crate::effects::send_receipt(&mut conn, "order-4").expect("a receipt");
            let mut first = true;
            Relay::new()
                .max_attempts(1)
                .drain(&mut conn, |_| {
                    let result = if first { Ok(()) } else { Err("refused") };
                    first = false;
                    result
                })
                .expect("a relay");
            idempotent_jobs::outbox::counts(&mut conn).expect("counts");
            idempotent_jobs::keys::forget(
                &mut conn,
                &crate::handlers::charge_key("order-1"),
                "the test",
            )
            .expect("a forget");
            idempotent_jobs::prune(&mut conn, &idempotent_jobs::Prune::default()).expect("a prune");
        });
    });
    let recorded: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, ..)| key.key().name().to_owned())
        .collect();
    for name in &recorded {
        let metric = METRICS.iter().find(|m| m.name == name);
        assert!(
            metric.is_some(),
            "{name} is recorded but not in stats::METRICS"
        );
    }
    for metric in METRICS {
        assert!(
            metric.name.starts_with("idempotent_jobs_"),
            "{}",
            metric.name
        );
        let unit_last = match metric.kind {
            MetricKind::Counter => metric.name.ends_with("_total"),
            MetricKind::Histogram => metric.name.ends_with("_seconds"),
            MetricKind::Gauge => metric.name.ends_with(&format!("_{}", metric.unit)),
        };
        assert!(unit_last, "{} does not end with its unit", metric.name);
        assert!(
            GUIDE.contains(&format!("`{}`", metric.name)),
            "{} is missing from the guide's table (docs/operating.md)",
            metric.name
        );
        let needs_a_fault = metric.name == "idempotent_jobs_claim_retries_total";
        assert!(
            needs_a_fault || recorded.iter().any(|r| r == metric.name),
            "{} was not recorded by a run that should record it",
            metric.name
        );
    }
    let with_outcome = |outcome: &str| {
        events
            .iter()
            .find(|e| {
                e.get("outcome").is_some_and(|o| o == outcome) && e.contains_key("duration_us")
            })
            .unwrap_or_else(|| panic!("no event with outcome {outcome}: {events:?}"))
    };
    for outcome in ["ran", "replayed", "failed"] {
        let event = with_outcome(outcome);
        assert_eq!(
            event.get("job").map(String::as_str),
            Some("charge"),
            "{event:?}"
        );
        assert!(event.contains_key("key"), "the span's key: {event:?}");
        let message = &event["message"];
        assert!(
            GUIDE.contains(&format!("`{message}`")),
            "`{message}` is not in the guide"
        );
    }
    let delivery = events
        .iter()
        .find(|e| e.get("message").is_some_and(|m| m == "outbox delivery"))
        .expect("a delivery event");
    for field in ["message_id", "topic", "outcome", "attempt", "delay_ms"] {
        assert!(delivery.contains_key(field), "{field}: {delivery:?}");
    }
    assert!(GUIDE.contains("`idempotent.job`"));
    events_as_the_table_says(&events);
    job_events_go_to_info_by_choice(&mut conn);
}

/// An event row of the guide's table: its message, level column, and fields column.
fn event_rows() -> Vec<(String, String, String)> {
    GUIDE
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // "", kind, name, level, fields, when, ""
            if cells.len() < 6 || cells[1] != "event" {
                return None;
            }
            let name = cells[2].split('`').nth(1)?.to_owned();
            Some((name, cells[3].to_owned(), cells[4].to_owned()))
        })
        .collect()
}

/// Each recorded event the guide's table names is at the level the table gives (the default one
/// where it says "(INFO by choice)") and carries the fields it names, and its target where it names
/// one.
fn events_as_the_table_says(events: &[crate::capture::Fields]) {
    let rows = event_rows();
    assert!(rows.len() >= 10, "the guide's event rows: {rows:?}");
    let mut checked = std::collections::BTreeSet::new();
    for event in events {
        let Some(message) = event.get("message") else {
            continue;
        };
        let Some((name, level, fields)) = rows.iter().find(|(name, ..)| name == message) else {
            continue;
        };
        let wanted = level.split_whitespace().next().expect("a level");
        assert_eq!(
            event["level"], wanted,
            "`{name}` is at {} where the guide says {level}: {event:?}",
            event["level"]
        );
        if let Some(target) = level.split("target `").nth(1) {
            let target = target.split('`').next().expect("a target");
            assert_eq!(event["target"], target, "`{name}`'s target: {event:?}");
        }
        // The fields the guide names in backticks, not the values (`outcome` = `ran` names one;
        // `outcome` (`delivered`, ...) too).
        let mut depth = 0;
        let fields: String = fields
            .chars()
            .filter(|c| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => return depth == 0,
                }
                false
            })
            .collect();
        for field in fields
            .split([',', ';'])
            .filter_map(|part| part.trim().strip_prefix('`'))
            .filter_map(|part| part.split('`').next())
            .filter(|field| !field.contains(' ') && !field.is_empty())
        {
            let refusal = name.starts_with("job panicked");
            if refusal && field != "outcome" && field != "duration_us" {
                // The refusals' row lists outcome values, not fields.
                continue;
            }
            assert!(
                event.contains_key(field),
                "`{name}` lacks `{field}`, which the guide names: {event:?}"
            );
        }
        checked.insert(name.clone());
    }
    for name in [
        "job ran and committed",
        "job already done; replayed its stored result",
        "job returned an error; rolled back",
        "outbox delivery",
        "outbox message parked",
        "forgot a key: the job's next delivery runs it again",
        "pruned",
    ] {
        assert!(
            checked.contains(name),
            "no `{name}` event was recorded and checked: {checked:?}"
        );
    }
}

/// `stats::job_events_at_info(true)` puts the per-job events at INFO, and `false` back at DEBUG,
/// as the guide says. A global switch: run after the table's check, in the same test, so that no
/// other test of this binary (none asserts these events' levels) sees it on while it checks.
fn job_events_go_to_info_by_choice(conn: &mut <Sqlite as crate::backends::Backend>::Conn) {
    let level_of = |conn: &mut _, order: &str| {
        let ((), events) = crate::capture::events(|| {
            Sqlite::charge(conn, order, 1, Mode::Succeed).expect("ran");
        });
        events
            .iter()
            .find(|e| e.get("outcome").is_some_and(|o| o == "ran"))
            .map(|e| e["level"].clone())
            .expect("the run's event")
    };
    idempotent_jobs::stats::job_events_at_info(true);
    let chosen = level_of(&mut *conn, "order-info");
    idempotent_jobs::stats::job_events_at_info(false);
    let default = level_of(&mut *conn, "order-debug");
    assert_eq!((chosen.as_str(), default.as_str()), ("INFO", "DEBUG"));
}
