//! What the CLI says, and what it leaves in the tables, when the schema is not one it can work
//! with: made by a newer release, in a schema the role may not use, on a session that cannot
//! write, and what `migrate` reports about what it made.

mod common;

use diesel::{MysqlConnection, PgConnection, SqliteConnection};
use idempotent_runtime::outbox::{self, Relay};
use idempotent_runtime::{Error, JobKey, Outcome};

use common::*;

/// A lapsed key (what `prune` deletes), a held key (what `keys forget` deletes) and a parked
/// message (what `outbox retry` un-parks).
fn fill<C: Backend>(conn: &mut C) {
    let _ = charge(conn, 1);
    let _: Outcome<u32> =
        idempotent_runtime::run(conn, &DIGEST, &JobKey::new("digest:ada"), |_conn| {
            Ok::<_, Error>(1)
        })
        .expect("running the digest job");
    let _: Outcome<()> =
        idempotent_runtime::run(conn, &HOOK, &JobKey::new("hook:order-77"), |conn| {
            outbox::push(conn, "webhook", &serde_json::json!({ "order": 77 }))?;
            Ok::<_, Error>(())
        })
        .expect("running the hook job");
    Relay::new()
        .batch_size(10)
        .max_attempts(1)
        .run_once(conn, |_message| Err::<(), _>("receiver down"))
        .expect("a relay round");
}

/// The number of keys and parked messages the tables hold.
fn holdings<C: Backend>(conn: &mut C) -> (usize, i64) {
    let parked = outbox::counts(conn).expect("the outbox's counts").parked;
    (key_count(conn), parked)
}

/// A schema a newer release made (a version above this build's): `migrate` says a retry cannot
/// succeed, `verify`'s headline says to upgrade, the writing commands refuse and change nothing,
/// the reading ones warn.
fn newer_schema<C: Backend>() {
    let db = TestDb::empty::<C>();
    db.cli(&["migrate"]).ok();
    let mut conn: C = db.connect();
    fill(&mut conn);
    let before = holdings(&mut conn);
    assert_eq!(
        before,
        (3, 2),
        "two keys and a lapsed one; both messages parked"
    );
    conn.batch_execute(
        "INSERT INTO idempotent_schema (version, description, applied_at) \
         VALUES (99, 'a future release', CURRENT_TIMESTAMP)",
    )
    .expect("recording a future version");

    let run = db.cli(&["migrate"]).exit(4);
    assert!(
        !run.stderr.contains("resumes")
            && run.stderr.contains("nothing was changed")
            && run
                .stderr
                .contains("calling migrate again fails the same way")
            && run.stderr.contains("version 99"),
        "{run:#?}"
    );
    let run = db.cli(&["verify"]).exit(4);
    let headline = run.stderr.lines().next().unwrap_or_default();
    assert!(
        headline.contains("made by a newer release")
            && headline.contains("upgrade")
            && !headline.contains("run `idempotent-jobs migrate`")
            && !headline.contains("grant"),
        "{run:#?}"
    );
    for args in [
        &["prune"][..],
        &["outbox", "retry", "--all"],
        &["keys", "forget", "charge:order-1", "--yes"],
    ] {
        let run = db.cli(args).exit(4);
        assert!(
            run.stdout.is_empty()
                && run.stderr.contains("made by a newer release")
                && run.stderr.contains("nothing was changed")
                && run.stderr.contains("upgrade idempotent-jobs-cli"),
            "{args:?}: {run:#?}"
        );
        assert_eq!(holdings(&mut conn), before, "{args:?} changed the tables");
    }
    for args in [&["jobs"][..], &["keys", "list"], &["prune", "--dry-run"]] {
        let run = db.cli(args).ok();
        assert!(
            run.stderr.starts_with("warning: ") && run.stderr.contains("made by a newer release"),
            "{args:?}: {run:#?}"
        );
    }
    assert_eq!(holdings(&mut conn), before);
}

#[test]
fn sqlite_newer_schema() {
    newer_schema::<SqliteConnection>();
}

#[test]
fn postgres_newer_schema() {
    newer_schema::<PgConnection>();
}

#[test]
fn mysql_newer_schema() {
    newer_schema::<MysqlConnection>();
}
