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
}
