//! What a second run sees: input fingerprints, stored results, expiry and pruning, events, and
//! the test kit catching a handler that is not idempotent. Written once, run on every backend.

use std::time::Duration;

use idempotent_jobs::{JobKey, Prune};

use crate::backends::Backend;
use crate::capture;
use crate::handlers::{Mode, TestError};
use crate::harness::{Db, Server};

/// Same key, same inputs: a replay. Same key, different inputs: an error that names the job and
/// the key, and nothing changes.
pub fn fingerprints_guard_replays<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let first = B::charge_checked(&mut conn, "order-1", 4200, "EUR").unwrap();
    assert_eq!(
        B::charge_checked(&mut conn, "order-1", 4200, "EUR").unwrap(),
        first
    );

    let before = B::snapshot(&mut conn);
    for (amount, currency) in [(9900, "EUR"), (4200, "USD")] {
        let error = B::charge_checked(&mut conn, "order-1", amount, currency).unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(
                error,
                TestError::Idempotent(idempotent_jobs::Error::FingerprintMismatch { .. })
            ),
            "{message}"
        );
        assert!(
            message.contains("`charge_checked`"),
            "names the job: {message}"
        );
        assert!(
            message.contains("`checked:order-1`"),
            "names the key: {message}"
        );
        assert!(
            message.contains("amount, currency"),
            "names the inputs: {message}"
        );
    }
    let changes = B::snapshot(&mut conn).changes_since(&before);
    assert!(changes.is_empty(), "a mismatch changes nothing:\n{changes}");
    assert_eq!(B::count_charges(&mut conn, "order-1"), 1);
}

/// A deploy that changes a job's fingerprint (adds an input, renames one): a redelivery of a key
/// its first run stored under the old one is not compared, and replays. Before, every such key
/// failed with `FingerprintMismatch` for ever, and only `forget` (running the work again) got it
/// out. Other values of the same inputs are still refused; so is a row stored before the
/// fingerprint held its inputs' names (the digest alone), whose values differ.
pub fn a_changed_fingerprint_definition_replays<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let runs = |conn: &mut B::Conn| B::count_topic(conn, "deployed");
    // Other values of the same inputs: refused, whatever the row's form.
    let refused_other_values = |conn: &mut B::Conn| {
        let error = B::deployed(conn, "a", &[("amount", 9900)]).unwrap_err();
        assert!(
            matches!(
                error,
                TestError::Idempotent(idempotent_jobs::Error::FingerprintMismatch { .. })
            ),
            "{error}"
        );
    };
    assert_eq!(
        B::deployed(&mut conn, "a", &[("amount", 1200)]).unwrap(),
        1200
    );
    for inputs in [
        [("amount", 1200), ("currency", 978)].as_slice(),
        &[("amount_cents", 1200)],
    ] {
        assert_eq!(
            B::deployed(&mut conn, "a", inputs).unwrap_or_else(|e| panic!("{inputs:?}: {e}")),
            1200,
            "{inputs:?}: the first run's result"
        );
    }
    assert_eq!(runs(&mut conn), 1, "ran once");
    refused_other_values(&mut conn);
    // A row as written before the names were stored: the digest alone, compared as before.
    B::execute(
        &mut conn,
        "UPDATE done_jobs SET fingerprint = SUBSTR(fingerprint, 1, 32)",
    );
    assert_eq!(
        B::deployed(&mut conn, "a", &[("amount", 1200)]).unwrap(),
        1200
    );
    refused_other_values(&mut conn);
    assert_eq!(runs(&mut conn), 1, "still ran once");
}

/// A key whose `keep` lapsed may run again: once per lapse, not once per call.
pub fn lapsed_keys_run_again<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::remind(&mut conn, 7).unwrap();
    B::remind(&mut conn, 7).unwrap();
    assert_eq!(
        B::count_messages(&mut conn),
        1,
        "replayed while the key holds"
    );
    std::thread::sleep(Duration::from_millis(1_300));
    B::remind(&mut conn, 7).unwrap();
    B::remind(&mut conn, 7).unwrap();
    assert_eq!(
        B::count_messages(&mut conn),
        2,
        "ran once more after the key lapsed"
    );
    assert_eq!(
        B::count_done(&mut conn),
        1,
        "the lapsed claim was renewed, not duplicated"
    );
}

/// 100,000 lapsed claims go in bounded batches, and nothing else does.
pub fn prune_removes_lapsed_claims_in_batches<B: Backend>() {
    const LAPSED: u64 = 100_000;
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(
        &mut conn,
        &bulk_claims(B::SERVER, "lapsed", "2000-01-02 00:00:00"),
    );
    B::execute(
        &mut conn,
        &bulk_claims(B::SERVER, "live", "2999-01-01 00:00:00").replace("100000", "10"),
    );
    B::charge(&mut conn, "kept-for-ever", 4200, Mode::Succeed).unwrap();
    assert_eq!(B::count_done(&mut conn), 100_000 + 10 + 1);

    let report = B::prune(&mut conn, &Prune::default().batch_size(10_000).pace(0));
    assert_eq!(report.removed, LAPSED);
    assert_eq!(
        report.batches, 11,
        "ten full batches and one that found nothing left"
    );
    assert_eq!(
        B::count_done(&mut conn),
        11,
        "live and for-ever claims stay"
    );
    assert!(
        B::charge_outcome(&mut conn, "kept-for-ever")
            .unwrap()
            .is_replayed()
    );

    let report = B::prune(&mut conn, &Prune::default().batch_size(10_000).pace(0));
    assert_eq!((report.removed, report.batches), (0, 1));
}

/// `INSERT ... SELECT` of `claims` claims (the literal `100000` sets the count) that lapse at
/// `expires_at`, without a round trip per row.
pub(crate) fn bulk_claims(server: Server, prefix: &str, expires_at: &str) -> String {
    let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
         UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let numbers = format!(
        "(SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d AS n \
         FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f) numbers"
    );
    let (digest, key, time) = match server {
        Server::Sqlite => (
            "randomblob(32)".to_owned(),
            format!("'{prefix}:' || n"),
            format!("'{expires_at}'"),
        ),
        Server::Postgres => (
            format!("sha256(convert_to('{prefix}:' || n, 'UTF8'))"),
            format!("'{prefix}:' || n"),
            format!("TIMESTAMP '{expires_at}'"),
        ),
        Server::Mysql => (
            format!("UNHEX(SHA2(CONCAT('{prefix}:', n), 256))"),
            format!("CONCAT('{prefix}:', n)"),
            format!("'{expires_at}'"),
        ),
    };
    format!(
        "INSERT INTO done_jobs (key_digest, job_key, job_name, done_at, expires_at) \
         SELECT {digest}, {key}, 'bulk', '2000-01-01 00:00:00', {time} FROM {numbers} WHERE n < 100000"
    )
}

/// Each call ends in one event with the job, the key, the outcome and the duration.
pub fn events_say_what_happened<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let ((), events) = capture::events(|| {
        B::charge(&mut conn, "order-1", 4200, Mode::Succeed).unwrap();
        B::charge(&mut conn, "order-1", 4200, Mode::Succeed).unwrap();
        B::charge(&mut conn, "order-2", 4200, Mode::Fail).unwrap_err();
        B::charge_checked(&mut conn, "order-3", 1, "EUR").unwrap();
        B::charge_checked(&mut conn, "order-3", 2, "EUR").unwrap_err();
        B::refund(&mut conn, "order-1").unwrap_err();
    });
    let outcomes: Vec<(&str, &str, &str)> = capture::outcomes(&events)
        .iter()
        .map(|e| (e["job"].as_str(), e["key"].as_str(), e["outcome"].as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("charge", "charge:order-1", "ran"),
            ("charge", "charge:order-1", "replayed"),
            ("charge", "charge:order-2", "failed"),
            ("charge_checked", "checked:order-3", "ran"),
            ("charge_checked", "checked:order-3", "fingerprint_mismatch"),
            ("refund", "charge:order-1", "key_conflict"),
        ]
    );
    // A replay says when the first run was done (the database's clock, RFC 3339 UTC); nothing else
    // carries that field.
    let replays: Vec<_> = capture::outcomes(&events)
        .into_iter()
        .filter(|e| e.contains_key("first_done_at"))
        .collect();
    assert_eq!(replays.len(), 1, "{events:?}");
    assert_eq!(replays[0]["outcome"], "replayed");
    let first_done_at = &replays[0]["first_done_at"];
    let record = B::keys_lookup(&mut conn, &JobKey::new("charge:order-1"))
        .expect("a look-up")
        .expect("done");
    let since_epoch = record
        .done_at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    assert!(
        first_done_at.ends_with('Z') && first_done_at.len() == "2026-11-30T10:00:00.123456Z".len(),
        "{first_done_at}"
    );
    assert!(
        first_done_at.ends_with(&format!(".{:06}Z", since_epoch.subsec_micros())),
        "the first run's done_at ({since_epoch:?} since the epoch): {first_done_at}"
    );
    for event in capture::outcomes(&events) {
        let micros: u64 = event["duration_us"]
            .parse()
            .expect("a duration in microseconds");
        assert!(micros > 0 && micros < 60_000_000, "{event:?}");
    }
}

/// A job with `redact_key` never shows its key's values: not in events, errors or `done_jobs`.
pub fn redacted_keys_stay_out_of_logs<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let ((), events) = capture::events(|| {
        B::greet(&mut conn, "ada@example.com").unwrap();
        B::greet(&mut conn, "ada@example.com").unwrap();
    });
    let everything = format!("{events:?} {:?}", B::done_rows(&mut conn));
    assert!(!everything.contains("ada@example.com"), "{everything}");
    let outcomes = capture::outcomes(&events);
    assert_eq!(outcomes.len(), 2);
    assert!(
        outcomes[0]["key"].starts_with("redacted:"),
        "{:?}",
        outcomes[0]
    );
    assert_eq!(
        outcomes[1]["outcome"], "replayed",
        "redacted keys still replay"
    );
    assert_eq!(B::count_messages(&mut conn), 1);
}

/// The test kit's crash variant passes a sound handler, leaving one effect.
pub fn test_kit_crash_variant_passes_a_sound_handler<B: Backend>() {
    let db = Db::<B>::fresh();
    let receipt = B::assert_charge_survives_crash(db.locator(), "order-1");
    let mut conn = db.connect();
    assert_eq!(B::count_charges(&mut conn, "order-1"), 1);
    assert_eq!(
        B::charge(&mut conn, "order-1", 4200, Mode::Succeed).unwrap(),
        receipt
    );
}

/// The test kit fails a handler that writes outside its claim, and says which rows the rerun
/// changed.
pub fn test_kit_catches_a_handler_that_is_not_idempotent<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let message = B::test_kit_on_sloppy_handler(&mut conn, "order-1");
    assert!(message.contains("is not idempotent"), "{message}");
    assert!(
        message.contains("test_outbox"),
        "names the table: {message}"
    );
    assert!(message.contains("audit"), "shows the row: {message}");
    assert!(
        !message.contains("done_jobs"),
        "the claim itself did not change: {message}"
    );
}

/// The test kit fails a handler that writes on a connection of its own before its work. Its
/// replays skip the body, so running it twice with a commit in between shows nothing; a first
/// delivery that failed before its commit wrote the audit row, though, and the redelivery writes
/// it again. The kit runs the job once in a transaction it rolls back, and finds the row there,
/// in both variants, before committing any run. (Before the kit did, both variants passed, with
/// one charge committed per order.) SQLite has one writer: the other connection cannot write
/// while the job's transaction is open, and the kit fails the handler with that error.
pub fn test_kit_catches_a_write_on_another_connection<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let messages = B::test_kit_on_audit_elsewhere(&mut conn, db.locator());
    for message in &messages {
        if B::SERVER == Server::Sqlite {
            assert!(message.contains("locked"), "{message}");
            continue;
        }
        assert!(message.contains("is not idempotent"), "{message}");
        assert!(message.contains("rolled back"), "says which run: {message}");
        assert!(
            message.contains("test_outbox"),
            "names the table: {message}"
        );
        assert!(message.contains("audit"), "shows the row: {message}");
        assert!(
            !message.contains("charges"),
            "the job's own work was rolled back: {message}"
        );
    }
    let audit_rows = if B::SERVER == Server::Sqlite { 0 } else { 2 };
    assert_eq!(
        B::count_topic(&mut conn, "audit"),
        audit_rows,
        "the kit stopped after the rolled-back run, in each variant: {messages:?}"
    );
    for order in ["order-1", "order-2"] {
        assert_eq!(B::count_charges(&mut conn, order), 0, "{messages:?}");
    }
    assert_eq!(B::count_done(&mut conn), 0, "{messages:?}");
}

/// The test kit's snapshot sees a change of 0.01 to a single-precision float: MariaDB's
/// `QUOTE(col)` shows a `FLOAT` with 6 significant digits, `'12345.7'` before and after.
pub fn snapshots_see_small_changes_to_floats<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    // Single precision on MySQL and PostgreSQL; SQLite's REAL is a double.
    let float = match B::SERVER {
        Server::Mysql => "FLOAT",
        Server::Postgres | Server::Sqlite => "REAL",
    };
    B::execute(
        &mut conn,
        &format!("CREATE TABLE wallet (user_id INTEGER PRIMARY KEY, balance {float} NOT NULL)"),
    );
    B::execute(&mut conn, "INSERT INTO wallet VALUES (1, 12345.67)");
    let before = B::snapshot(&mut conn);
    B::execute(
        &mut conn,
        "UPDATE wallet SET balance = balance + 0.01 WHERE user_id = 1",
    );
    let changes = B::snapshot(&mut conn).changes_since(&before);
    let changed: Vec<(&str, usize, usize)> = changes
        .tables()
        .map(|(name, change)| (name, change.removed.len(), change.added.len()))
        .collect();
    assert_eq!(changed.len(), 1, "only the wallet changed:\n{changes}");
    assert!(changed[0].0.ends_with("wallet"), "{changes}");
    assert_eq!(
        (changed[0].1, changed[0].2),
        (1, 1),
        "one row removed, one added:\n{changes}"
    );
}

/// Tables whose names begin like SQLite's own are in the snapshot: only SQLite's own tables,
/// whose names begin with exactly `sqlite_`, are left out (`NOT LIKE 'sqlite_%'` also left out
/// `SqliteAudit` and `sqlite1audit`: `LIKE` ignores case, and `_` matches any character).
pub fn snapshots_cover_tables_named_like_sqlites_own<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let tables = ["SqliteAudit", "sqlite1audit"];
    for table in tables {
        B::execute(&mut conn, &format!("CREATE TABLE {table} (n INTEGER)"));
    }
    let before = B::snapshot(&mut conn);
    for table in tables {
        B::execute(&mut conn, &format!("INSERT INTO {table} VALUES (1)"));
    }
    let changes = B::snapshot(&mut conn).changes_since(&before);
    let mut added: Vec<(String, usize)> = changes
        .tables()
        .map(|(name, change)| (name.to_lowercase(), change.added.len()))
        .collect();
    added.sort();
    assert_eq!(added.len(), 2, "both tables changed:\n{changes}");
    for ((name, rows), table) in added.iter().zip(["sqlite1audit", "sqliteaudit"]) {
        assert!(name.ends_with(table), "{changes}");
        assert_eq!(*rows, 1, "{changes}");
    }
}
