//! Adversarial tests of the job's savepoint set after the claim on SQLite (247e1db): a job's own
//! transaction opens `Nesting::Unmarked` (`BEGIN IMMEDIATE`, no savepoint), the claim goes in, and
//! only then `SAVEPOINT idempotent_job`. Each test tries to make a call report something the
//! database does not hold, run a body twice, leave a transaction or the write lock behind, or leave
//! a key that no later delivery can finish; each checks the rows in `done_jobs` and in its own
//! effects table (`sac_effects`) from another connection, the call's result, and a redelivery.
//!
//! SQLite only: no server is needed (the database is a file in the temporary directory).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use diesel::SqliteConnection;
use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::prelude::*;
use idempotent_jobs::keys::KeyRecord;
use idempotent_jobs::{Error, Job, JobCall, JobKey, Outcome, WhileInProgress, idempotent_job};

use crate::backends::{Backend, Sqlite};
use crate::handlers::TestError;
use crate::harness::{self, Db};

/// The statement the guide says a body must not send, and says what happens when it does: on
/// SQLite the claim comes before the savepoint, so the claim stays.
const UNDO: &str = "ROLLBACK TO SAVEPOINT idempotent_job";
/// Releasing the job's savepoint: caught at the commit, nothing committed.
const RELEASE: &str = "RELEASE SAVEPOINT idempotent_job";

/// A job that returns `()` (its claim is its whole record).
static UNIT: Job = Job::new("sac_unit", "sac-unit:<id>");
/// A job that stores a result, recorded after the body.
static VALUE: Job = Job::new("sac_value", "sac-value:<id>");
/// A `()` job whose key lapses one second after its run.
static KEPT: Job = Job::new("sac_kept", "sac-kept:<id>").keep_for(Duration::from_secs(1));
/// A job whose body runs another job (`UNIT`) on the same connection.
static OUTER: Job = Job::new("sac_outer", "sac-outer:<id>");
/// The job two connections race on.
static RACE: Job = Job::new("sac_race", "sac-race:<id>");

/// The attribute's bounded `BEGIN` (`in_progress`), a `()` job.
#[idempotent_job(key = "sac-wait:<id>", in_progress = "wait at most 2s")]
fn sac_wait(conn: &mut SqliteConnection, id: &str, statements: &str) -> Result<(), TestError> {
    work(conn, id, statements, End::Ok).map(drop)
}

/// The attribute's bounded `BEGIN` (`in_progress`), a job that stores its result.
#[idempotent_job(key = "sac-wait-value:<id>", in_progress = "wait at most 2s")]
fn sac_wait_value(
    conn: &mut SqliteConnection,
    id: &str,
    statements: &str,
) -> Result<String, TestError> {
    work(conn, id, statements, End::Ok)
}

/// How a body ends after its statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Ok,
    Err,
    Panic,
}

/// Which kind of job a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unit,
    Value,
    Kept,
}

impl Kind {
    fn job(self) -> &'static Job {
        match self {
            Kind::Unit => &UNIT,
            Kind::Value => &VALUE,
            Kind::Kept => &KEPT,
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Kind::Unit => "sac-unit:",
            Kind::Value => "sac-value:",
            Kind::Kept => "sac-kept:",
        }
    }
}

fn key(prefix: &str, id: &str) -> JobKey {
    JobKey::builder()
        .text(prefix)
        .value(id)
        .build()
        .expect("one value")
}

/// What one delivery returned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Called {
    /// The body ran; the value it returned (`None` for `()`).
    Ran(Option<String>),
    Replayed(Option<String>),
    /// `Error::TransactionRolledBackInBody`: nothing of the run committed.
    RolledBackInBody,
    /// `Error::TransactionEndedInBody`: the claim taken back.
    EndedInBody,
    /// `Error::InProgress`: another run holds the key.
    InProgress,
    /// The body's own error (`Declined`).
    Declined,
    /// The body panicked (caught here, after the runtime rolled back).
    Panicked,
    /// Any other error, as text.
    Failed(String),
}

impl Called {
    fn from_result<T>(
        result: Result<Outcome<T>, TestError>,
        value: impl Fn(T) -> Option<String>,
    ) -> Self {
        match result {
            Ok(Outcome::Ran(v)) => Called::Ran(value(v)),
            Ok(Outcome::Replayed(v)) => Called::Replayed(value(v)),
            Err(error) => Called::from_error(error),
        }
    }

    fn from_error(error: TestError) -> Self {
        match error {
            TestError::Idempotent(Error::TransactionRolledBackInBody { .. }) => {
                Called::RolledBackInBody
            }
            TestError::Idempotent(Error::TransactionEndedInBody { .. }) => Called::EndedInBody,
            TestError::Idempotent(Error::InProgress { .. }) => Called::InProgress,
            TestError::Declined => Called::Declined,
            other => Called::Failed(other.to_string()),
        }
    }

    /// Whether the call says that a run's claim is committed.
    fn says_committed(&self) -> bool {
        matches!(self, Called::Ran(_) | Called::Replayed(_))
    }

    fn value(&self) -> Option<&String> {
        match self {
            Called::Ran(v) | Called::Replayed(v) => v.as_ref(),
            _ => None,
        }
    }
}

/// Writes the effect `tag` for `id`.
fn effect(conn: &mut SqliteConnection, id: &str, tag: &str) -> QueryResult<()> {
    diesel::sql_query("INSERT INTO sac_effects (id, tag) VALUES (?, ?)")
        .bind::<diesel::sql_types::Text, _>(id)
        .bind::<diesel::sql_types::Text, _>(tag)
        .execute(conn)
        .map(drop)
}

/// The body: writes `before`, runs `statements` (`;;`-separated; each that succeeds writes
/// `stmt-ok`, a failure is swallowed as a careless body would), writes `after`, then ends as `end`
/// says. Returns a value no other run returns.
fn work(
    conn: &mut SqliteConnection,
    id: &str,
    statements: &str,
    end: End,
) -> Result<String, TestError> {
    effect(conn, id, "before")?;
    for statement in statements.split(";;").filter(|s| !s.is_empty()) {
        if conn.batch_execute(statement).is_ok() {
            effect(conn, id, "stmt-ok")?;
        }
    }
    effect(conn, id, "after")?;
    match end {
        End::Ok => Ok(harness::unique_name("v")),
        End::Err => Err(TestError::Declined),
        End::Panic => panic!("the body panics on purpose"),
    }
}

/// One delivery of `kind`'s job for `id`, through the plain function API.
fn deliver(
    conn: &mut SqliteConnection,
    kind: Kind,
    id: &str,
    statements: &str,
    end: End,
    policy: WhileInProgress,
    redelivered: bool,
) -> Called {
    let key = key(kind.prefix(), id);
    let call = JobCall::new(kind.job(), &key)
        .while_in_progress(policy)
        .redelivered(redelivered);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match kind {
        Kind::Unit | Kind::Kept => Called::from_result(
            call.run(conn, |c| work(c, id, statements, end).map(drop)),
            |()| None,
        ),
        Kind::Value => Called::from_result(call.run(conn, |c| work(c, id, statements, end)), Some),
    }));
    caught.unwrap_or(Called::Panicked)
}

/// A clean delivery (no statements, `Ok`), waiting for another run as long as it takes.
fn clean(conn: &mut SqliteConnection, kind: Kind, id: &str) -> Called {
    deliver(conn, kind, id, "", End::Ok, WhileInProgress::Wait, false)
}

fn fresh_db() -> Db<Sqlite> {
    let db = Db::<Sqlite>::fresh();
    db.connect()
        .batch_execute("CREATE TABLE sac_effects (id TEXT NOT NULL, tag TEXT NOT NULL)")
        .expect("the effects table");
    db
}

fn count(conn: &mut SqliteConnection, id: &str, tag: &str) -> i64 {
    Sqlite::query_i64(
        conn,
        &format!("SELECT COUNT(*) AS n FROM sac_effects WHERE id = '{id}' AND tag = '{tag}'"),
    )
}

/// The key's committed row, read from another connection.
fn claim(db: &Db<Sqlite>, prefix: &str, id: &str) -> Option<KeyRecord> {
    idempotent_jobs::keys::lookup(&mut db.connect(), &key(prefix, id)).expect("a look-up")
}

#[derive(QueryableByName)]
struct StoredResult {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    r: Option<String>,
}

/// The key's stored result as JSON text (committed).
fn stored_result(db: &Db<Sqlite>, prefix: &str, id: &str) -> Option<String> {
    let digits: String = key(prefix, id)
        .digest()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    diesel::sql_query(format!(
        "SELECT CAST(result AS TEXT) AS r FROM done_jobs WHERE key_digest = X'{digits}'"
    ))
    .get_results::<StoredResult>(&mut db.connect())
    .expect("the row")
    .pop()
    .and_then(|row| row.r)
}

/// Whether the key's committed row is a finished claim (a result recorded where one is stored).
fn finished(db: &Db<Sqlite>, kind: Kind, id: &str) -> bool {
    claim(db, kind.prefix(), id)
        .is_some_and(|c| !c.unfinished && (kind != Kind::Value || c.has_result))
}

/// Panics unless `conn` is out of every transaction, by Diesel's count and by SQLite's (a `BEGIN`
/// fails inside one).
fn assert_nothing_open(conn: &mut SqliteConnection, what: &str) {
    let depth = <AnsiTransactionManager as TransactionManager<SqliteConnection>>::transaction_manager_status_mut(conn)
        .transaction_depth();
    assert!(
        matches!(depth, Ok(None)),
        "{what}: Diesel still counts a transaction open on the connection: {depth:?}"
    );
    conn.batch_execute("BEGIN DEFERRED; ROLLBACK")
        .unwrap_or_else(|e| panic!("{what}: the session still holds a transaction: {e}"));
}

/// Whether another connection gets SQLite's write lock at once (within `within`).
fn write_lock_free(db: &Db<Sqlite>, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    let mut other = db.connect();
    loop {
        match other.batch_execute("PRAGMA busy_timeout = 0; BEGIN IMMEDIATE; ROLLBACK") {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e.to_string()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Checks what `called` said against what the database holds for `kind`'s key `id`: a call that
/// says it ran or replayed has a finished claim committed (with its value, for a job that stores
/// one); one that says nothing committed has no claim and none of its body's effects committed.
fn truthful(db: &Db<Sqlite>, kind: Kind, id: &str, called: &Called) -> Result<(), String> {
    let mut c = db.connect();
    let (before, after) = (count(&mut c, id, "before"), count(&mut c, id, "after"));
    let claimed = claim(db, kind.prefix(), id);
    let done = finished(db, kind, id);
    if called.says_committed() {
        if !done {
            return Err(format!(
                "{called:?}, but the key's committed row is {claimed:?} (effects before {before}, after {after})"
            ));
        }
        if let Some(value) = called.value() {
            let stored = stored_result(db, kind.prefix(), id);
            let expected = serde_json::to_string(value).expect("JSON");
            if stored.as_deref() != Some(&expected) {
                return Err(format!("{called:?}, but the stored result is {stored:?}"));
            }
        }
        return Ok(());
    }
    if matches!(
        called,
        Called::RolledBackInBody | Called::Declined | Called::Panicked | Called::InProgress
    ) && (claimed.is_some() || before + after != 0)
    {
        return Err(format!(
            "{called:?} (nothing of the run committed), but the database holds the claim {claimed:?} and effects before {before}, after {after}"
        ));
    }
    Ok(())
}

/// A clean delivery after the case must finish the key (ran or replayed), and a third must replay
/// the same value without running the body; `Err` says how it went wrong.
fn finishes(db: &Db<Sqlite>, kind: Kind, id: &str) -> Result<(), String> {
    let mut conn = db.connect();
    let second = clean(&mut conn, kind, id);
    if !second.says_committed() {
        return Err(format!(
            "a later delivery could not finish the key: {second:?}"
        ));
    }
    let afters = count(&mut conn, id, "after");
    let third = clean(&mut conn, kind, id);
    let expected = Called::Replayed(second.value().cloned());
    if third != expected {
        return Err(format!(
            "after {second:?}, the next delivery returned {third:?}"
        ));
    }
    if count(&mut conn, id, "after") != afters {
        return Err("a replay ran the body".to_owned());
    }
    truthful(db, kind, id, &second)
}

const POLICIES: [WhileInProgress; 3] = [
    WhileInProgress::Wait,
    WhileInProgress::Fail,
    WhileInProgress::WaitAtMost(Duration::from_secs(2)),
];

/// A body that rolls back to `idempotent_job` by name and then writes, in each kind of job and
/// under each in-progress policy (unbounded `BEGIN` with the claim, `BEGIN` bounded to zero, and
/// bounded to 2 s): the claim came before the savepoint, so the call says it ran, the claim is
/// committed and finished (with the value returned, for a job that stores one), the work before
/// the rollback is gone and the work after it committed; nothing is left open, the write lock is
/// free, and a redelivery replays without running the body.
#[test]
fn a_body_that_rolls_back_to_the_jobs_savepoint_keeps_its_claim_under_every_policy() {
    let db = fresh_db();
    let mut wrong = Vec::new();
    for kind in [Kind::Unit, Kind::Value, Kind::Kept] {
        for policy in POLICIES {
            let id = harness::unique_name("undo");
            let mut conn = db.connect();
            let called = deliver(&mut conn, kind, &id, UNDO, End::Ok, policy, false);
            let case = format!("{kind:?} job, {policy:?}");
            assert_nothing_open(&mut conn, &case);
            let next_id = harness::unique_name("next");
            let next = clean(&mut conn, Kind::Value, &next_id);
            if next.says_committed() && !finished(&db, Kind::Value, &next_id) {
                wrong.push(format!(
                    "{case}: the connection's next job said {next:?}, but its claim is not committed"
                ));
            }
            if let Err(e) = write_lock_free(&db, Duration::ZERO) {
                wrong.push(format!("{case}: the write lock is still held: {e}"));
            }
            if !matches!(called, Called::Ran(_)) {
                wrong.push(format!("{case}: returned {called:?}, not Ran"));
            }
            if let Err(why) = truthful(&db, kind, &id, &called) {
                wrong.push(format!("{case}: {why}"));
            }
            let mut c = db.connect();
            let effects = (
                count(&mut c, &id, "before"),
                count(&mut c, &id, "stmt-ok"),
                count(&mut c, &id, "after"),
            );
            if effects != (0, 1, 1) {
                wrong.push(format!(
                    "{case}: effects (before, stmt-ok, after) = {effects:?}, not (0, 1, 1): the rollback to the job's savepoint did not undo exactly the body's work before it"
                ));
            }
            let replay = deliver(&mut conn, kind, &id, "", End::Ok, policy, false);
            if replay != Called::Replayed(called.value().cloned()) {
                wrong.push(format!(
                    "{case}: the redelivery returned {replay:?} after {called:?}"
                ));
            }
            if count(&mut c, &id, "after") != 1 {
                wrong.push(format!("{case}: the redelivery ran the body again"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The attribute's `in_progress = "wait at most 2s"` (the bounded `BEGIN`, then the savepoint
/// after the claim), with a body that rolls back to the job's savepoint by name: `()` and valued
/// jobs both report `Ran` with their claim committed, and replay on the next call.
#[test]
fn the_attributes_bounded_begin_sets_the_savepoint_after_the_claim() {
    let db = fresh_db();
    let mut conn = db.connect();
    let id = harness::unique_name("attr");
    let ran = sac_wait::outcome(&mut conn, &id, UNDO).expect("the () job runs");
    assert!(ran.is_ran(), "{ran:?}");
    assert!(
        claim(&db, "sac-wait:", &id).is_some_and(|c| !c.unfinished),
        "the () job said it ran: its claim must be committed"
    );
    assert!(
        sac_wait::outcome(&mut conn, &id, "")
            .expect("replays")
            .is_replayed(),
        "the redelivery replays"
    );
    let value = sac_wait_value::outcome(&mut conn, &id, UNDO).expect("the valued job runs");
    assert!(value.is_ran(), "{value:?}");
    let stored = stored_result(&db, "sac-wait-value:", &id);
    assert_eq!(
        stored,
        Some(serde_json::to_string(value.value()).expect("JSON")),
        "the valued job's result is committed"
    );
    let replay = sac_wait_value::outcome(&mut conn, &id, "").expect("replays");
    assert_eq!(replay, Outcome::Replayed(value.into_inner()));
    let mut c = db.connect();
    assert_eq!(
        count(&mut c, &id, "before"),
        0,
        "the rollback undid `before`"
    );
    assert_eq!(count(&mut c, &id, "after"), 2, "one body run per job");
    assert_nothing_open(&mut conn, "after the attribute's jobs");
}

/// A body that releases the job's savepoint (`RELEASE SAVEPOINT idempotent_job`), rolls back to it
/// and then fails, or rolls back to it and panics: in each kind of job and under each policy the
/// call says nothing was committed, and nothing was (no claim, no effect); nothing is left open;
/// and the next delivery runs the job to completion.
#[test]
fn bodies_that_release_or_undo_the_savepoint_and_fail_commit_nothing() {
    let db = fresh_db();
    let mut wrong = Vec::new();
    let cases: [(&str, End); 4] = [
        (RELEASE, End::Ok),
        (UNDO, End::Err),
        (UNDO, End::Panic),
        (RELEASE, End::Panic),
    ];
    for kind in [Kind::Unit, Kind::Value, Kind::Kept] {
        for policy in POLICIES {
            for (statements, end) in cases {
                let id = harness::unique_name("fail");
                let case = format!("{kind:?} job, {policy:?}, `{statements}` then {end:?}");
                let mut conn = db.connect();
                let called = deliver(&mut conn, kind, &id, statements, end, policy, false);
                assert_nothing_open(&mut conn, &case);
                if called.says_committed() {
                    wrong.push(format!("{case}: returned {called:?}"));
                }
                if let Err(why) = truthful(&db, kind, &id, &called) {
                    wrong.push(format!("{case}: {why}"));
                }
                if claim(&db, kind.prefix(), &id).is_some() {
                    wrong.push(format!("{case}: a claim is committed after {called:?}"));
                }
                if let Err(why) = finishes(&db, kind, &id) {
                    wrong.push(format!("{case}: {why}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A redelivery of a finished key through the claim (not flagged: `BEGIN`, the claim finds the
/// row, the rollback; no savepoint), under each policy, and a flagged one (the read first): each
/// replays the first run's value without running the body, changes nothing in `done_jobs`, and
/// leaves no transaction open and the write lock free at once.
#[test]
fn a_replay_through_the_claim_ends_what_it_opened() {
    let db = fresh_db();
    for kind in [Kind::Unit, Kind::Value] {
        let id = harness::unique_name("replay");
        let mut conn = db.connect();
        let first = clean(&mut conn, kind, &id);
        assert!(matches!(first, Called::Ran(_)), "{first:?}");
        let row = claim(&db, kind.prefix(), &id).expect("committed");
        for (policy, flagged) in POLICIES
            .iter()
            .map(|p| (*p, false))
            .chain([(WhileInProgress::Wait, true)])
        {
            let case = format!("{kind:?} job, {policy:?}, flagged {flagged}");
            let replay = deliver(&mut conn, kind, &id, "", End::Ok, policy, flagged);
            assert_eq!(replay, Called::Replayed(first.value().cloned()), "{case}");
            assert_nothing_open(&mut conn, &case);
            write_lock_free(&db, Duration::ZERO)
                .unwrap_or_else(|e| panic!("{case}: the replay left the write lock held: {e}"));
            let now = claim(&db, kind.prefix(), &id).expect("still committed");
            assert_eq!(
                (now.done_at, now.expires_at, now.unfinished, now.has_result),
                (row.done_at, row.expires_at, row.unfinished, row.has_result),
                "{case}: a replay changed the key's row"
            );
        }
        assert_eq!(count(&mut conn, &id, "after"), 1, "one body run");
    }
}

/// A key whose claim lapsed (`keep` of 1 s): the next delivery renews it before the savepoint, and
/// its body rolls back to the savepoint by name; the renewal stays: the call says it ran, the row
/// is live and finished again, the second run's work after the rollback is committed, and a third
/// delivery replays. Under each policy.
#[test]
fn a_lapsed_claim_renewed_before_the_savepoint_survives_a_rollback_to_it() {
    let db = fresh_db();
    for policy in POLICIES {
        let id = harness::unique_name("lapsed");
        let mut conn = db.connect();
        assert_eq!(clean(&mut conn, Kind::Kept, &id), Called::Ran(None));
        std::thread::sleep(Duration::from_millis(1300));
        assert!(
            claim(&db, "sac-kept:", &id).is_some_and(|c| c.lapsed),
            "the claim lapsed"
        );
        let second = deliver(&mut conn, Kind::Kept, &id, UNDO, End::Ok, policy, false);
        assert_eq!(second, Called::Ran(None), "{policy:?}: the lapsed key runs");
        assert_nothing_open(&mut conn, "after the renewal");
        let row = claim(&db, "sac-kept:", &id);
        assert!(
            row.as_ref().is_some_and(|c| !c.lapsed && !c.unfinished),
            "{policy:?}: the call said it ran, but the row is {row:?}"
        );
        assert_eq!(count(&mut conn, &id, "after"), 2, "{policy:?}: two runs");
        assert_eq!(
            count(&mut conn, &id, "before"),
            1,
            "{policy:?}: only the second run's `before` was rolled back"
        );
        assert_eq!(
            deliver(&mut conn, Kind::Kept, &id, "", End::Ok, policy, false),
            Called::Replayed(None),
            "{policy:?}: the renewed key replays"
        );
    }
}

/// A job called inside the caller's `conn.transaction(..)` is a savepoint of Diesel's, never
/// `Unmarked`: its body finds no savepoint named `idempotent_job` (a rollback to it fails, so
/// nothing of the body is undone), its claim commits with the caller's commit and is gone with the
/// caller's rollback; after a rollback, the next delivery runs the job. For each policy.
#[test]
fn a_job_inside_the_callers_transaction_gets_diesels_savepoint_not_its_own() {
    let db = fresh_db();
    for policy in POLICIES {
        for commit in [true, false] {
            let case = format!("{policy:?}, caller commits: {commit}");
            let id = harness::unique_name("nested");
            let mut conn = db.connect();
            let called = conn
                .transaction::<_, TestError, _>(|c| {
                    let called = deliver(c, Kind::Value, &id, UNDO, End::Ok, policy, false);
                    match commit {
                        true => Ok(called),
                        false => Err(TestError::Service(format!("{called:?}"))),
                    }
                })
                .map_err(|e| e.to_string());
            assert_nothing_open(&mut conn, &case);
            let mut c = db.connect();
            let effects = (
                count(&mut c, &id, "before"),
                count(&mut c, &id, "stmt-ok"),
                count(&mut c, &id, "after"),
            );
            if commit {
                let called = called.expect("the caller commits");
                assert!(matches!(called, Called::Ran(Some(_))), "{case}: {called:?}");
                assert_eq!(
                    effects,
                    (1, 0, 1),
                    "{case}: inside the caller's transaction there is no savepoint `idempotent_job` to roll back to (before, stmt-ok, after)"
                );
                truthful(&db, Kind::Value, &id, &called).unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(
                    clean(&mut conn, Kind::Value, &id),
                    Called::Replayed(called.value().cloned()),
                    "{case}"
                );
            } else {
                assert!(called.is_err(), "{case}");
                assert_eq!(effects, (0, 0, 0), "{case}: the caller rolled back");
                assert!(claim(&db, "sac-value:", &id).is_none(), "{case}");
                finishes(&db, Kind::Value, &id).unwrap_or_else(|e| panic!("{case}: {e}"));
            }
        }
    }
}

/// A job whose body runs another job on the same connection (nested as a savepoint of Diesel's),
/// whose body in turn rolls back to `idempotent_job` by name (the outer job's savepoint: it takes
/// the inner claim and Diesel's savepoint with it) and returns `Ok`. The outer body propagates the
/// inner call's error. Whatever each call says must hold: a call that says it ran has its claim
/// committed; one that says nothing committed has none. Nothing is left open, and clean
/// deliveries finish both keys.
#[test]
fn a_job_nested_in_another_jobs_body_that_undoes_the_outer_savepoint_is_reported_truly() {
    let db = fresh_db();
    for (inner_kind, policy) in [Kind::Unit, Kind::Value]
        .into_iter()
        .flat_map(|k| POLICIES.map(|p| (k, p)))
    {
        let case = format!("inner {inner_kind:?}, {policy:?}");
        let id = harness::unique_name("outer");
        let inner_id = format!("{id}-inner");
        let mut conn = db.connect();
        let inner_said = std::cell::RefCell::new(None);
        let outer = JobCall::new(&OUTER, &key("sac-outer:", &id))
            .while_in_progress(policy)
            .run(&mut conn, |c| {
                effect(c, &id, "outer")?;
                let inner = deliver(c, inner_kind, &inner_id, UNDO, End::Ok, policy, false);
                *inner_said.borrow_mut() = Some(inner.clone());
                match inner {
                    Called::Ran(_) | Called::Replayed(_) => Ok(7u32),
                    other => Err(TestError::Service(format!("inner: {other:?}"))),
                }
            });
        let outer = Called::from_result(outer, |v| Some(v.to_string()));
        let inner = inner_said.into_inner().expect("the outer body ran");
        assert_nothing_open(&mut conn, &case);
        write_lock_free(&db, Duration::ZERO).unwrap_or_else(|e| panic!("{case}: lock held: {e}"));
        let outer_claim = claim(&db, "sac-outer:", &id);
        let inner_claim = claim(&db, inner_kind.prefix(), &inner_id);
        if outer.says_committed() {
            assert!(
                outer_claim.is_some(),
                "{case}: outer said {outer:?}, no claim"
            );
            assert!(
                inner_claim.is_some(),
                "{case}: the inner job said {inner:?} and the outer {outer:?}, but the inner claim is not committed"
            );
        } else {
            assert!(
                outer_claim.is_none() && inner_claim.is_none(),
                "{case}: outer said {outer:?} (inner {inner:?}), but claims are committed: outer {outer_claim:?}, inner {inner_claim:?}"
            );
        }
        let again = JobCall::new(&OUTER, &key("sac-outer:", &id)).run(&mut conn, |c| {
            let inner = clean(c, inner_kind, &inner_id);
            match inner.says_committed() {
                true => Ok(7u32),
                false => Err(TestError::Service(format!("inner: {inner:?}"))),
            }
        });
        assert!(
            again.is_ok(),
            "{case}: a clean delivery of the outer job: {again:?}"
        );
        finishes(&db, inner_kind, &inner_id).unwrap_or_else(|e| panic!("{case}: {e}"));
    }
}

/// The body's own nested `conn.transaction(..)` (a Diesel savepoint inside the job's), inside which
/// the body rolls back to `idempotent_job` by name, which cancels Diesel's savepoint; the closure
/// returns `Ok` (so Diesel's release of its savepoint fails) or `Err` (its rollback fails), and the
/// body propagates that error or swallows it and returns `Ok`. Whatever the call says must hold,
/// the connection must be out of every transaction afterwards, the write lock free, and another
/// connection must be able to finish the key. The connection's next job (another key) must not
/// say it ran unless its claim is committed.
#[test]
fn a_nested_transaction_in_the_body_that_undoes_the_jobs_savepoint_leaves_nothing_open() {
    let db = fresh_db();
    let mut wrong = Vec::new();
    for kind in [Kind::Unit, Kind::Value] {
        for (closure_ok, propagate) in [(true, true), (true, false), (false, true), (false, false)]
        {
            let case =
                format!("{kind:?} job, closure Ok: {closure_ok}, body propagates: {propagate}");
            let id = harness::unique_name("nestedtx");
            let mut conn = db.connect();
            let key = key(kind.prefix(), &id);
            let body = |c: &mut SqliteConnection| -> Result<String, TestError> {
                effect(c, &id, "before")?;
                let nested = c.transaction::<_, TestError, _>(|c| {
                    effect(c, &id, "inner-before")?;
                    if c.batch_execute(UNDO).is_ok() {
                        effect(c, &id, "stmt-ok")?;
                    }
                    effect(c, &id, "inner-after")?;
                    match closure_ok {
                        true => Ok(()),
                        false => Err(TestError::Declined),
                    }
                });
                if propagate {
                    nested?;
                }
                effect(c, &id, "after")?;
                Ok(harness::unique_name("v"))
            };
            let called = match kind {
                Kind::Value => {
                    Called::from_result(JobCall::new(&VALUE, &key).run(&mut conn, body), Some)
                }
                _ => Called::from_result(
                    JobCall::new(&UNIT, &key).run(&mut conn, |c| body(c).map(drop)),
                    |()| None,
                ),
            };
            let depth = <AnsiTransactionManager as TransactionManager<SqliteConnection>>::transaction_manager_status_mut(&mut conn)
                .transaction_depth();
            let session_open = conn.batch_execute("BEGIN DEFERRED; ROLLBACK").is_err();
            if !matches!(depth, Ok(None)) || session_open {
                wrong.push(format!(
                    "{case}: returned {called:?} and left a transaction open (Diesel depth {depth:?}, SQLite session in a transaction: {session_open})"
                ));
            }
            let next_id = harness::unique_name("next");
            let next = clean(&mut conn, Kind::Value, &next_id);
            if next.says_committed() && !finished(&db, Kind::Value, &next_id) {
                wrong.push(format!(
                    "{case}: the connection's next job said {next:?}, but its claim is not committed"
                ));
            }
            if let Err(e) = write_lock_free(&db, Duration::ZERO) {
                wrong.push(format!(
                    "{case}: returned {called:?}; the write lock is still held: {e}"
                ));
                // The key cannot be finished while this connection holds the lock: let it go.
                drop(conn);
            }
            if let Err(why) = truthful(&db, kind, &id, &called) {
                wrong.push(format!("{case}: {why}"));
            }
            if let Err(why) = finishes(&db, kind, &id) {
                wrong.push(format!("{case}: {why}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Two connections on one key, in rollback-journal and in WAL mode: the first holds the key (its
/// body in progress); a delivery with `in_progress` fail and one bounded to 200 ms give up with
/// `InProgress`, writing nothing; one bounded to 5 s waits for the first's commit and replays its
/// value without running the body. One body run, one finished claim, nothing held afterwards.
#[test]
fn racing_connections_with_in_progress_policies_replay_or_give_up_cleanly() {
    for journal in ["DELETE", "WAL"] {
        let db = fresh_db();
        db.connect()
            .batch_execute(&format!("PRAGMA journal_mode = {journal}"))
            .expect("the journal mode");
        let id = harness::unique_name("race");
        let runs = Arc::new(AtomicUsize::new(0));
        let (holding, held) = mpsc::channel();
        let first = {
            let (mut conn, id, runs) = (db.connect(), id.clone(), Arc::clone(&runs));
            std::thread::spawn(move || {
                JobCall::new(&RACE, &key("sac-race:", &id))
                    .run(&mut conn, |c| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        effect(c, &id, "after")?;
                        holding.send(()).expect("the test waits");
                        std::thread::sleep(Duration::from_millis(800));
                        Ok::<_, TestError>(harness::unique_name("race"))
                    })
                    .map_err(|e| e.to_string())
            })
        };
        held.recv().expect("the first run holds the key");
        let run_again = |conn: &mut SqliteConnection, policy| {
            let id = id.clone();
            let runs = Arc::clone(&runs);
            Called::from_result(
                JobCall::new(&RACE, &key("sac-race:", &id))
                    .while_in_progress(policy)
                    .run(conn, move |c| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        effect(c, &id, "after")?;
                        Ok::<_, TestError>(harness::unique_name("race"))
                    }),
                Some,
            )
        };
        let mut other = db.connect();
        let failed = run_again(&mut other, WhileInProgress::Fail);
        assert_eq!(failed, Called::InProgress, "{journal}: fail at once");
        assert_nothing_open(&mut other, "after InProgress");
        let bounded = run_again(
            &mut other,
            WhileInProgress::WaitAtMost(Duration::from_millis(200)),
        );
        assert_eq!(
            bounded,
            Called::InProgress,
            "{journal}: 200 ms is too short"
        );
        assert_nothing_open(&mut other, "after a bounded InProgress");
        let waited = run_again(
            &mut other,
            WhileInProgress::WaitAtMost(Duration::from_secs(5)),
        );
        let first = first
            .join()
            .expect("the first run's thread")
            .expect("the first run");
        assert!(first.is_ran(), "{journal}: {first:?}");
        assert_eq!(
            waited,
            Called::Replayed(Some(first.into_inner())),
            "{journal}: the bounded wait replays the first run's value"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{journal}: one body run");
        assert_eq!(count(&mut other, &id, "after"), 1, "{journal}");
        assert_nothing_open(&mut other, "after the replay");
        write_lock_free(&db, Duration::ZERO).expect("nothing holds the write lock");
    }
}

/// Four connections start the same key at once, with mixed policies (unbounded and bounded to
/// 10 s), in rollback-journal and WAL mode, over several keys: exactly one body runs per key, every
/// caller gets that run's value, and the claim is committed and finished.
#[test]
fn concurrent_first_deliveries_run_one_body_per_key() {
    for journal in ["DELETE", "WAL"] {
        let db = fresh_db();
        db.connect()
            .batch_execute(&format!("PRAGMA journal_mode = {journal}"))
            .expect("the journal mode");
        for round in 0..4 {
            let id = harness::unique_name("crowd");
            let barrier = Arc::new(Barrier::new(4));
            let runs = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..4)
                .map(|i| {
                    let (mut conn, id, barrier, runs) = (
                        db.connect(),
                        id.clone(),
                        Arc::clone(&barrier),
                        Arc::clone(&runs),
                    );
                    std::thread::spawn(move || {
                        let policy = match (i + round) % 2 {
                            0 => WhileInProgress::Wait,
                            _ => WhileInProgress::WaitAtMost(Duration::from_secs(10)),
                        };
                        barrier.wait();
                        Called::from_result(
                            JobCall::new(&RACE, &key("sac-race:", &id))
                                .while_in_progress(policy)
                                .run(&mut conn, |c| {
                                    runs.fetch_add(1, Ordering::SeqCst);
                                    effect(c, &id, "after")?;
                                    std::thread::sleep(Duration::from_millis(30));
                                    Ok::<_, TestError>(harness::unique_name("crowd"))
                                }),
                            Some,
                        )
                    })
                })
                .collect();
            let results: Vec<Called> = threads
                .into_iter()
                .map(|t| t.join().expect("a caller's thread"))
                .collect();
            let ran: Vec<&Called> = results
                .iter()
                .filter(|c| matches!(c, Called::Ran(_)))
                .collect();
            assert_eq!(ran.len(), 1, "{journal}: one run: {results:?}");
            let value = ran[0].value().cloned();
            assert!(
                results
                    .iter()
                    .all(|c| *c == Called::Ran(value.clone())
                        || *c == Called::Replayed(value.clone())),
                "{journal}: every caller gets the run's value: {results:?}"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{journal}: {results:?}");
            assert_eq!(count(&mut db.connect(), &id, "after"), 1, "{journal}");
            let stored = stored_result(&db, "sac-race:", &id);
            assert_eq!(
                stored,
                value.map(|v| serde_json::to_string(&v).expect("JSON")),
                "{journal}"
            );
        }
    }
}

/// A session with `PRAGMA query_only = 1`: a flagged redelivery of a finished key replays from one
/// read; unflagged deliveries of that key (through the claim, which must write) and a first
/// delivery of a new key, under each policy, may fail but must not claim what they did not commit,
/// must leave the session out of every transaction and the write lock free, and must change no
/// row; a writable connection then finishes the new key.
#[test]
fn a_query_only_session_leaves_nothing_open_and_claims_nothing() {
    let db = fresh_db();
    let id = harness::unique_name("ro");
    let first = clean(&mut db.connect(), Kind::Value, &id);
    assert!(matches!(first, Called::Ran(Some(_))), "{first:?}");
    let row = claim(&db, "sac-value:", &id).expect("committed");
    let mut ro = db.connect();
    ro.batch_execute("PRAGMA query_only = 1")
        .expect("read-only");
    let flagged = deliver(
        &mut ro,
        Kind::Value,
        &id,
        "",
        End::Ok,
        WhileInProgress::Wait,
        true,
    );
    assert_eq!(
        flagged,
        Called::Replayed(first.value().cloned()),
        "the read first"
    );
    for policy in POLICIES {
        let case = format!("{policy:?}");
        let replay = deliver(&mut ro, Kind::Value, &id, "", End::Ok, policy, false);
        assert!(
            replay == Called::Replayed(first.value().cloned())
                || matches!(replay, Called::Failed(_)),
            "{case}: {replay:?}"
        );
        assert_nothing_open(&mut ro, &case);
        write_lock_free(&db, Duration::ZERO).unwrap_or_else(|e| panic!("{case}: {e}"));
        let now = claim(&db, "sac-value:", &id).expect("still committed");
        assert_eq!(
            (now.done_at, now.unfinished),
            (row.done_at, row.unfinished),
            "{case}"
        );

        for kind in [Kind::Unit, Kind::Value] {
            let new = harness::unique_name("ro-new");
            let called = deliver(&mut ro, kind, &new, UNDO, End::Ok, policy, false);
            assert!(
                !called.says_committed(),
                "{case}: a read-only session said {called:?}"
            );
            assert_nothing_open(&mut ro, &case);
            write_lock_free(&db, Duration::ZERO).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert!(claim(&db, kind.prefix(), &new).is_none(), "{case}");
            assert_eq!(count(&mut db.connect(), &new, "after"), 0, "{case}");
            finishes(&db, kind, &new).unwrap_or_else(|e| panic!("{case}: {e}"));
        }
    }
    assert_eq!(count(&mut db.connect(), &id, "after"), 1, "one body run");
}

#[cfg(feature = "async-sqlite")]
mod asynchronous {
    //! diesel-async's `SyncConnectionWrapper<SqliteConnection>`: its statements run on a blocking
    //! thread, and a future dropped at an `.await` marks the connection broken.

    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use diesel::SqliteConnection;
    use diesel_async::AsyncConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use idempotent_jobs::idempotent_job;

    use super::{Called, End, UNDO, count, fresh_db, write_lock_free};
    use crate::backends::Sqlite;
    use crate::handlers::TestError;
    use crate::harness::{self, Db};

    type Wrapper = SyncConnectionWrapper<SqliteConnection>;

    async fn effect(conn: &mut Wrapper, id: &str, tag: &str) -> diesel::QueryResult<()> {
        diesel_async::RunQueryDsl::execute(
            diesel::sql_query("INSERT INTO sac_effects (id, tag) VALUES (?, ?)")
                .bind::<diesel::sql_types::Text, _>(id)
                .bind::<diesel::sql_types::Text, _>(tag),
            conn,
        )
        .await
        .map(drop)
    }

    async fn work(
        conn: &mut Wrapper,
        id: &str,
        statements: &str,
        end: End,
    ) -> Result<String, TestError> {
        effect(conn, id, "before").await?;
        for statement in statements.split(";;").filter(|s| !s.is_empty()) {
            if diesel_async::SimpleAsyncConnection::batch_execute(conn, statement)
                .await
                .is_ok()
            {
                effect(conn, id, "stmt-ok").await?;
            }
        }
        tokio::task::yield_now().await;
        effect(conn, id, "after").await?;
        match end {
            End::Ok => Ok(harness::unique_name("av")),
            End::Err => Err(TestError::Declined),
            End::Panic => panic!("the body panics on purpose"),
        }
    }

    /// The unbounded path: `BEGIN` and the first claim together, the savepoint after.
    #[idempotent_job(key = "sac-async:<id>")]
    async fn sac_async(
        conn: &mut Wrapper,
        id: &str,
        statements: &str,
        end: End,
    ) -> Result<String, TestError> {
        work(conn, id, statements, end).await
    }

    /// The bounded path: `begin_job` with the bound, the claim, the savepoint after.
    #[idempotent_job(key = "sac-async-wait:<id>", in_progress = "wait at most 2s")]
    async fn sac_async_wait(
        conn: &mut Wrapper,
        id: &str,
        statements: &str,
        end: End,
    ) -> Result<(), TestError> {
        work(conn, id, statements, end).await.map(drop)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    }

    fn connect(rt: &tokio::runtime::Runtime, db: &Db<Sqlite>) -> Wrapper {
        rt.block_on(Wrapper::establish(db.locator()))
            .expect("a connection")
    }

    /// Which of the two async jobs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Which {
        Together,
        Bounded,
    }

    impl Which {
        fn prefix(self) -> &'static str {
            match self {
                Which::Together => "sac-async:",
                Which::Bounded => "sac-async-wait:",
            }
        }

        async fn call(self, conn: &mut Wrapper, id: &str, statements: &str, end: End) -> Called {
            match self {
                Which::Together => {
                    Called::from_result(sac_async::outcome(conn, id, statements, end).await, Some)
                }
                Which::Bounded => Called::from_result(
                    sac_async_wait::outcome(conn, id, statements, end).await,
                    |()| None,
                ),
            }
        }
    }

    /// Polls the inner future, and gives up (dropping it) once it has returned `Pending` `n`
    /// times: the job's future dropped at its `n`-th `.await` that waits.
    struct DropAfter<F> {
        inner: Pin<Box<F>>,
        pendings_left: usize,
    }

    impl<F: Future> Future for DropAfter<F> {
        type Output = Option<F::Output>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.inner.as_mut().poll(cx) {
                Poll::Ready(output) => Poll::Ready(Some(output)),
                Poll::Pending if self.pendings_left == 0 => Poll::Ready(None),
                Poll::Pending => {
                    self.pendings_left -= 1;
                    Poll::Pending
                }
            }
        }
    }

    /// A body that rolls back to the job's savepoint by name, on diesel-async's SQLite, in both
    /// async jobs (unbounded, and the attribute's `in_progress` bound): the call says it ran, the
    /// claim is committed and finished, the work after the rollback is committed and the work
    /// before it is not; the redelivery replays.
    #[test]
    fn an_async_body_that_rolls_back_to_the_jobs_savepoint_keeps_its_claim() {
        let db = fresh_db();
        let rt = runtime();
        for which in [Which::Together, Which::Bounded] {
            let id = harness::unique_name("aundo");
            let mut conn = connect(&rt, &db);
            let called = rt.block_on(which.call(&mut conn, &id, UNDO, End::Ok));
            assert!(matches!(called, Called::Ran(_)), "{which:?}: {called:?}");
            let row = super::claim(&db, which.prefix(), &id);
            assert!(
                row.as_ref().is_some_and(|c| !c.unfinished),
                "{which:?}: said {called:?}, the row is {row:?}"
            );
            let mut c = db.connect();
            assert_eq!(
                (count(&mut c, &id, "before"), count(&mut c, &id, "after")),
                (0, 1),
                "{which:?}"
            );
            let replay = rt.block_on(which.call(&mut conn, &id, "", End::Ok));
            assert_eq!(
                replay,
                Called::Replayed(called.value().cloned()),
                "{which:?}"
            );
            write_lock_free(&db, Duration::ZERO).expect("nothing held");
        }
    }

    /// An async job's future dropped at each of its waiting `.await`s in turn (BEGIN, the claim,
    /// the savepoint after it, the body's statements, the release and the commit), for both async
    /// jobs, with a body that rolls back to the savepoint by name: the connection is marked broken,
    /// and a job called again on it must not say it ran or replayed unless its claim is committed;
    /// once the connection is dropped, the database holds the claim only with the run's work, the
    /// write lock is free within 2 s, and a redelivery on a new connection finishes the key.
    #[test]
    fn an_async_job_dropped_at_each_await_leaves_a_key_the_next_delivery_finishes() {
        let db = fresh_db();
        let rt = runtime();
        let mut wrong = Vec::new();
        for which in [Which::Together, Which::Bounded] {
            for n in 0..40 {
                let id = harness::unique_name("cancel");
                let case = format!("{which:?}, dropped after {n} pendings");
                let mut conn = connect(&rt, &db);
                let finished = rt.block_on(DropAfter {
                    inner: Box::pin(which.call(&mut conn, &id, UNDO, End::Ok)),
                    pendings_left: n,
                });
                if let Some(called) = finished {
                    // Ran to the end before the n-th pending: the last case.
                    assert!(matches!(called, Called::Ran(_)), "{case}: {called:?}");
                    break;
                }
                // Used again after its job was dropped.
                let reused = rt.block_on(which.call(&mut conn, &id, "", End::Ok));
                if reused.says_committed() {
                    let committed =
                        super::claim(&db, which.prefix(), &id).is_some_and(|c| !c.unfinished);
                    if !committed {
                        wrong.push(format!(
                            "{case}: the broken connection's next call said {reused:?}, but no finished claim is committed"
                        ));
                    }
                }
                drop(conn);
                if let Err(e) = write_lock_free(&db, Duration::from_secs(2)) {
                    wrong.push(format!(
                        "{case}: the write lock is held after the connection was dropped: {e}"
                    ));
                    continue;
                }
                let mut c = db.connect();
                let claimed = super::claim(&db, which.prefix(), &id);
                let effects = count(&mut c, &id, "after");
                if claimed.is_some() != (effects > 0) {
                    wrong.push(format!(
                        "{case}: claim {claimed:?} but {effects} effects committed (reused call: {reused:?})"
                    ));
                }
                let mut again = connect(&rt, &db);
                let next = rt.block_on(which.call(&mut again, &id, "", End::Ok));
                if !next.says_committed() {
                    wrong.push(format!(
                        "{case}: the redelivery could not finish the key: {next:?}"
                    ));
                }
                let third = rt.block_on(which.call(&mut again, &id, "", End::Ok));
                if !matches!(third, Called::Replayed(_)) {
                    wrong.push(format!(
                        "{case}: the delivery after {next:?} returned {third:?}"
                    ));
                }
                if count(&mut c, &id, "after") > 1 {
                    wrong.push(format!("{case}: the body's work committed twice"));
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}

/// Writes 200 rows of 4,000 characters: more than a page cache of 2 pages holds, so SQLite spills
/// the transaction's pages to the file before it ends.
const SPILL: &str = "INSERT INTO sac_effects (id, tag) SELECT 'pad', printf('%.4000c', 'x') FROM \
     (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200) SELECT i FROM n)";

/// A connection with `journal_mode = OFF` has no rollback (SQLite: "the ROLLBACK command no longer
/// works; it behaves in an undefined way"): a job whose body failed or panicked there cannot be
/// undone. The call says so (`Error::CannotRollBack`: what the body wrote may be in the
/// database), and the claim is taken back, so the next delivery runs the job. Before: the body's
/// own error came back (which says nothing was committed) while the claim stayed committed, and
/// every later delivery of the key replayed a job that never finished (a unit job's replay is
/// `()`; a value job's said it was unfinished for ever). The same bodies with a journal roll
/// back whole, the claim with them.
#[test]
fn a_connection_that_cannot_roll_back_says_so_and_frees_the_key() {
    let mut wrong = Vec::new();
    for journal in ["OFF", "DELETE", "MEMORY"] {
        for kind in [Kind::Unit, Kind::Value, Kind::Kept] {
            for end in [End::Err, End::Panic] {
                let db = fresh_db();
                let mut conn = db.connect();
                conn.batch_execute(&format!(
                    "PRAGMA journal_mode = {journal}; PRAGMA cache_size = 2"
                ))
                .expect("the settings");
                let id = harness::unique_name("nojournal");
                let case = format!("journal {journal}, {kind:?}, {end:?}");
                let called = deliver(
                    &mut conn,
                    kind,
                    &id,
                    SPILL,
                    end,
                    WhileInProgress::Wait,
                    false,
                );
                let expected = match (journal, end) {
                    ("OFF", End::Err) => "CannotRollBack",
                    (_, End::Err) => "Declined",
                    (_, End::Panic | End::Ok) => "Panicked",
                };
                let reported = match &called {
                    Called::Failed(message) if message.contains("journal_mode = OFF") => {
                        "CannotRollBack"
                    }
                    Called::Declined => "Declined",
                    Called::Panicked => "Panicked",
                    _ => "something else",
                };
                if reported != expected {
                    wrong.push(format!("{case}: {called:?}, expected {expected}"));
                }
                if let Some(record) = claim(&db, kind.prefix(), &id) {
                    wrong.push(format!("{case}: the claim stayed: {record:?}"));
                }
                if journal != "OFF" && count(&mut conn, "pad", &"x".repeat(4000)) != 0 {
                    wrong.push(format!("{case}: the body's rows stayed"));
                }
                let again = clean(&mut conn, kind, &id);
                if !matches!(again, Called::Ran(_)) || !finished(&db, kind, &id) {
                    wrong.push(format!("{case}: the next delivery: {again:?}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
