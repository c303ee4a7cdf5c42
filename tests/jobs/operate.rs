//! The look-up and release API of `idempotent_jobs::keys`, on every connection type: what a key's
//! record says, listing and counting, and forgetting by key or by digest so the job runs again.

use std::time::{Duration, SystemTime};

use idempotent_jobs::keys::KeyQuery;
use idempotent_jobs::{Error, JobKey};

use crate::backends::Backend;
use crate::handlers::{self, Mode};
use crate::harness::Db;

/// A done key's record names its job and key, says what is stored, and when; forgetting it lets
/// the next delivery run the job again, once.
pub fn a_key_is_found_explained_and_forgotten<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let before = SystemTime::now() - Duration::from_secs(60);
    B::charge(&mut conn, "order-1", 4200, Mode::Succeed).expect("the first run");
    B::charge_checked(&mut conn, "order-2", 10, "EUR").expect("a fingerprinted job");

    let key = handlers::charge::key("order-1");
    assert_eq!(key.as_str(), "charge:order-1");
    let record = B::keys_lookup(&mut conn, &key)
        .expect("a look-up")
        .expect("the key is done");
    assert_eq!(record.job, "charge");
    assert_eq!(record.key, "charge:order-1");
    assert_eq!(record.digest, key.digest());
    assert!(record.has_result, "a Receipt is stored");
    assert!(!record.has_fingerprint);
    assert_eq!(record.expires_at, None);
    assert!(!record.lapsed);
    let after = SystemTime::now() + Duration::from_secs(60);
    assert!(
        before < record.done_at && record.done_at < after,
        "done_at is when it ran: {:?}",
        record.done_at
    );
    let checked = B::keys_lookup(&mut conn, &JobKey::new("checked:order-2"))
        .expect("a look-up")
        .expect("done");
    assert!(checked.has_fingerprint);
    assert_eq!(checked.job, "charge_checked");
    assert_eq!(
        B::keys_lookup(&mut conn, &JobKey::new("charge:order-9")).expect("a look-up"),
        None
    );

    // Forget: the next delivery runs the job again, and only once.
    assert!(B::keys_forget(&mut conn, &key).expect("a forget"));
    assert_eq!(B::keys_lookup(&mut conn, &key).expect("a look-up"), None);
    assert!(
        !B::keys_forget(&mut conn, &key).expect("a second forget"),
        "nothing left to forget"
    );
    B::charge(&mut conn, "order-1", 4200, Mode::Succeed).expect("the run after the forget");
    B::charge(&mut conn, "order-1", 4200, Mode::Succeed).expect("a replay");
    assert_eq!(
        B::count_charges(&mut conn, "order-1"),
        2,
        "ran once more, not twice"
    );
    assert_eq!(B::count_done(&mut conn), 2);
}

/// Listing filters by job and time, newest first, and counts per job; a redacted key is found and
/// forgotten by its digest; a lapsed key says so.
pub fn keys_are_listed_counted_and_forgotten_by_digest<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let start = SystemTime::now() - Duration::from_secs(60);
    B::charge(&mut conn, "order-1", 1, Mode::Succeed).expect("a charge");
    B::charge(&mut conn, "order-2", 2, Mode::Succeed).expect("a charge");
    B::greet(&mut conn, "ada@example.com").expect("a greeting");
    B::remind(&mut conn, 7).expect("a reminder");

    let all = B::keys_list(&mut conn, &KeyQuery::default()).expect("a list");
    assert_eq!(all.len(), 4, "{all:?}");
    if B::SERVER == crate::harness::Server::Sqlite {
        // SQLite stores milliseconds: no float noise below them.
        for record in &all {
            let micros = record
                .done_at
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .subsec_micros();
            assert_eq!(micros % 1_000, 0, "{record:?}");
        }
    }
    assert!(
        all.windows(2).all(|w| w[0].done_at >= w[1].done_at),
        "newest first: {all:?}"
    );
    let charges = B::keys_list(&mut conn, &KeyQuery::default().job("charge")).expect("a list");
    let mut keys: Vec<&str> = charges.iter().map(|r| r.key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["charge:order-1", "charge:order-2"]);
    assert_eq!(
        B::keys_list(&mut conn, &KeyQuery::default().limit(1))
            .expect("a list")
            .len(),
        1
    );
    assert!(
        B::keys_list(&mut conn, &KeyQuery::default().done_before(start))
            .expect("a list")
            .is_empty()
    );
    assert_eq!(
        B::keys_list(&mut conn, &KeyQuery::default().done_from(start))
            .expect("a list")
            .len(),
        4
    );
    assert!(
        B::keys_list(&mut conn, &KeyQuery::default().job("no-such-job"))
            .expect("a list")
            .is_empty()
    );

    let counts = B::keys_job_counts(&mut conn).expect("counts");
    let summary: Vec<(&str, u64)> = counts.iter().map(|c| (c.job.as_str(), c.keys)).collect();
    assert_eq!(summary, [("charge", 2), ("greet", 1), ("remind", 1)]);
    assert!(counts.iter().all(|c| c.oldest <= c.newest));

    // The greeting's key is stored redacted: found by listing, forgotten by digest.
    let greeting = B::keys_list(&mut conn, &KeyQuery::default().job("greet"))
        .expect("a list")
        .pop()
        .expect("the greeting");
    assert!(greeting.key.starts_with("redacted:"), "{greeting:?}");
    assert!(!greeting.key.contains("ada"), "{greeting:?}");
    assert_eq!(
        B::keys_lookup_digest(&mut conn, &greeting.digest).expect("a look-up"),
        Some(greeting.clone())
    );
    assert_eq!(
        idempotent_jobs::keys::parse_digest(&greeting.digest_hex()),
        Some(greeting.digest)
    );
    assert!(B::keys_forget_digest(&mut conn, &greeting.digest).expect("a forget"));
    B::greet(&mut conn, "ada@example.com").expect("greeted again");
    assert_eq!(B::count_topic(&mut conn, "greeting"), 2);

    // `remind` keeps its key for 1 s after its commit.
    let reminder = B::keys_list(&mut conn, &KeyQuery::default().job("remind"))
        .expect("a list")
        .pop()
        .expect("the reminder");
    let expires = reminder.expires_at.expect("a key with keep lapses");
    assert!(expires > reminder.done_at, "{reminder:?}");
    assert!(!reminder.lapsed);
    std::thread::sleep(Duration::from_millis(1_300));
    let reminder = B::keys_lookup_digest(&mut conn, &reminder.digest)
        .expect("a look-up")
        .expect("kept until pruned");
    assert!(reminder.lapsed, "{reminder:?}");
    let remind = B::keys_job_counts(&mut conn)
        .expect("counts")
        .into_iter()
        .find(|c| c.job == "remind")
        .expect("remind's count");
    assert_eq!((remind.keys, remind.lapsed), (1, 1));
}

/// On a database without the runtime's tables, a look-up fails clearly and changes nothing.
pub fn keys_without_tables_fail_clearly<B: Backend>() {
    let db = Db::<B>::empty();
    let mut conn = db.connect();
    let error =
        B::keys_lookup(&mut conn, &JobKey::new("charge:order-1")).expect_err("no done_jobs table");
    assert!(matches!(error, Error::NotMigrated { .. }), "{error}");
    assert!(error.to_string().contains("nothing was changed"), "{error}");
}

/// Each forget is recorded: a warning event with the job, the key, its digest and the reason; and
/// the keys API refuses to run inside a transaction, where it would see a job's own claim.
#[cfg(feature = "sqlite")]
#[test]
fn forgetting_is_recorded_and_refused_inside_a_transaction() {
    use diesel::Connection as _;

    let db = Db::<crate::backends::Sqlite>::fresh();
    let mut conn = db.connect();
    crate::backends::Sqlite::charge(&mut conn, "order-1", 1, Mode::Succeed).expect("a charge");
    let key = handlers::charge::key("order-1");
    let (forgot, events) = crate::capture::events(|| {
        idempotent_jobs::keys::forget(&mut conn, &key, "support ticket 4711")
    });
    assert!(forgot.expect("a forget"));
    let recorded: Vec<_> = events
        .iter()
        .filter(|e| {
            e.get("message")
                .is_some_and(|m| m.starts_with("forgot a key"))
        })
        .collect();
    assert_eq!(recorded.len(), 1, "{events:?}");
    let event = recorded[0];
    assert_eq!(event["job"], "charge");
    assert_eq!(event["key"], "charge:order-1");
    assert_eq!(event["reason"], "support ticket 4711");
    assert_eq!(event["digest"], hex(&key.digest()));
    assert_eq!(event["level"], "WARN");

    crate::backends::Sqlite::charge(&mut conn, "order-1", 1, Mode::Succeed).expect("ran again");
    let inside = conn.transaction(|conn| {
        Ok::<_, diesel::result::Error>(idempotent_jobs::keys::forget(conn, &key, "inside"))
    });
    let error = inside.expect("the transaction").expect_err("refused");
    assert!(matches!(error, Error::InsideTransaction { .. }), "{error}");
    assert!(
        idempotent_jobs::keys::lookup(&mut conn, &key)
            .expect("a look-up")
            .is_some(),
        "nothing was forgotten"
    );
}

#[cfg(feature = "sqlite")]
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An operator forgets a key while its first run is still in progress (claimed, not committed):
/// nothing committed is there to forget, so nothing is, and the run's commit stands. (Deleting by the digest alone waited for the run's lock on MySQL/MariaDB and then
/// deleted the row it had just committed: the job ran twice.)
pub fn forgetting_a_key_in_progress_forgets_nothing<B: Backend>() {
    let db = Db::<B>::fresh();
    let id = crate::harness::unique_name("forget-busy");
    let claimed = crate::signals::expect(&id);
    let key = JobKey::new(format!("held:{id}"));
    std::thread::scope(|scope| {
        let holder = scope.spawn(|| {
            let mut conn = db.connect();
            B::held(&mut conn, &id, 1_500)
        });
        claimed.wait("the first run claiming its key");
        let mut operator = db.connect();
        let forgot = B::keys_forget(&mut operator, &key).expect("a forget");
        assert!(
            !forgot,
            "nothing committed to forget while the run is in progress"
        );
        holder.join().expect("the holder").expect("the first run");
    });
    let mut conn = db.connect();
    assert!(
        B::keys_lookup(&mut conn, &key)
            .expect("a look-up")
            .is_some(),
        "the first run's commit stands"
    );
    assert_eq!(B::count_topic(&mut conn, "held"), 1, "the body ran once");
}

/// Paging through keys with [`KeyQuery::after`] lists each key once, keys done at one instant
/// included (set here; a busy worker commits several in one millisecond, SQLite's grain), on
/// every connection type: the digest orders what the time does not.
pub fn paging_lists_keys_done_at_one_instant_each_once<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for order in 1..=5 {
        B::charge(&mut conn, &format!("order-{order}"), order, Mode::Succeed).expect("a charge");
    }
    B::execute(
        &mut conn,
        "UPDATE done_jobs SET done_at = '2026-12-01 10:00:00.123'",
    );
    B::remind(&mut conn, 7).expect("a reminder, done later");
    let mut seen: Vec<String> = Vec::new();
    let mut query = KeyQuery::default().limit(2);
    for _ in 0..10 {
        let page = B::keys_list(&mut conn, &query).expect("a page");
        let Some(last) = page.last() else { break };
        query = KeyQuery::default()
            .limit(2)
            .after(last.done_at, last.digest);
        seen.extend(page.iter().map(|r| r.key.clone()));
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "a key on two pages: {seen:?}");
    assert_eq!(seen.len(), 6, "every key on a page: {seen:?}");
    assert_eq!(seen[0], "remind:7", "newest first: {seen:?}");
}
