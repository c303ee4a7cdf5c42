//! What an operator's call reports is what the database holds: the keys API, a prune and the
//! operator CLI (`idempotent-jobs`), checked against what another connection then sees, under
//! sessions set up as users set theirs up, races with running jobs, lost replies and a hostile
//! `.env`.
//!
//! The CLI tests run the binary of the workspace's `idempotent-jobs-cli` package from this test
//! binary's target directory (`cargo build -p idempotent-jobs-cli` builds it; `scripts/test` does).

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use idempotent_jobs::{Job, JobKey, Outcome, Prune, keys};

use crate::backends::Backend;
use crate::harness::{Db, unique_name};

/// A job whose keys lapse a second after their run committed.
static BRIEF: Job = Job::new("brief", "brief:<n>").keep_for(Duration::from_secs(1));

/// A job whose keys hold for ever.
static KEPT: Job = Job::new("kept", "kept:<n>");

/// Runs `job` on `key` (its body returns `value`): whether it ran.
fn deliver<C: idempotent_jobs::JobStore>(
    conn: &mut C,
    job: &'static Job,
    key: &str,
    value: u32,
) -> bool {
    let outcome: Outcome<u32> = idempotent_jobs::run(conn, job, &JobKey::new(key), |_conn| {
        Ok::<_, idempotent_jobs::Error>(value)
    })
    .unwrap_or_else(|e| panic!("delivering {key}: {e}"));
    outcome.is_ran()
}

/// The CLI with `args`, against `url`, in a working directory of its own (no `.env` of the
/// project's), with no inherited `DATABASE_URL`.
fn cli(url: &str, args: &[&str]) -> Output {
    let dir = std::env::temp_dir().join(unique_name("operator_truth_cwd"));
    std::fs::create_dir_all(&dir).expect("a working directory");
    let output = crate::operator_cli::run(url, args, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    output
}

/// The CLI with `args` against `url`, running, its output piped.
fn spawn_cli(url: &str, args: &[&str]) -> std::process::Child {
    Command::new(crate::operator_cli::cli_binary())
        .args(args)
        .env("DATABASE_URL", url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the CLI")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether `haystack` holds `number` as a number of its own (not as digits of a longer one).
#[cfg(feature = "sqlite")]
fn holds_number(haystack: &str, number: u64) -> bool {
    haystack
        .split(|c: char| !c.is_ascii_digit())
        .any(|word| word == number.to_string())
}

// --- secrets ---------------------------------------------------------------------------------

/// A `.env` whose `DATABASE_URL` line holds a NUL byte (a file saved by a broken editor, or
/// written by a script that pasted a C string): the CLI must not print the password in it. It
/// used to panic in `std::env::set_var` (through `dotenvy::from_path`), whose message quotes the
/// value whole, password included, on stderr, with exit code 101. Now the `.env` is ignored with
/// a warning that names the entry, not its text.
#[test]
fn a_nul_byte_in_dot_env_never_prints_the_password() {
    const PASSWORD: &str = "Hunter2Secret";
    let dir = std::env::temp_dir().join(unique_name("operator_truth_env"));
    std::fs::create_dir_all(&dir).expect("a directory");
    std::fs::write(
        dir.join(".env"),
        format!("DATABASE_URL=postgres://ops:{PASSWORD}@127.0.0.1:5432/test\0\n"),
    )
    .expect("a .env");
    let output = Command::new(crate::operator_cli::cli_binary())
        .arg("jobs")
        .env_remove("DATABASE_URL")
        .env("RUST_BACKTRACE", "0")
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .expect("running the CLI");
    let _ = std::fs::remove_dir_all(&dir);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(
        !stdout.contains(PASSWORD) && !stderr.contains(PASSWORD),
        "the password was printed (exit {:?}):\nstdout: {stdout}\nstderr: {stderr}",
        output.status.code()
    );
    assert_ne!(
        output.status.code(),
        Some(101),
        "the CLI panicked instead of ignoring the .env with a warning: {stderr}"
    );
    assert!(
        stderr.contains("warning: ignored") && stderr.contains("entry 1"),
        "{stderr}"
    );
}

// --- a lost reply to a COMMIT ----------------------------------------------------------------

/// A connection to `db` through a proxy armed to cut the connection right after the next
/// `COMMIT` reaches the server.
#[cfg(feature = "postgres")]
fn cutting_the_next_commit(
    db: &Db<crate::backends::Postgres>,
) -> (
    crate::proxy::CommitCutter,
    <crate::backends::Postgres as Backend>::Conn,
) {
    let proxy = crate::proxy::CommitCutter::start(db.locator());
    let conn = crate::backends::Postgres::connect(&proxy.url(db.locator()));
    proxy.arm();
    (proxy, conn)
}

/// `n` claims of the job `old` that lapsed long ago.
fn lapsed_claims(server: crate::harness::Server, n: usize) -> String {
    crate::second_run::bulk_claims(server, "old", "2000-01-02 00:00:00")
        .replace("100000", &n.to_string())
}

/// A forget whose `COMMIT` reached the server, which committed, but whose reply never came back
/// (the connection cut right after it): the row is gone for every other connection. The error
/// must not say "nothing was changed" (it does, and "retrying is safe and can succeed": the retry
/// then answers that no run holds the key, exit code 1 in the CLI). A job's call says "may or may
/// not have been committed" in the same case (`Error::CommitOutcomeUnknown`).
#[cfg(feature = "postgres")]
#[test]
fn a_forget_whose_commit_reply_is_lost_never_says_nothing_was_changed() {
    use crate::backends::Postgres;

    let db = Db::<Postgres>::fresh();
    let mut direct = db.connect();
    assert!(deliver(&mut direct, &KEPT, "kept:1", 1));
    let (proxy, mut conn) = cutting_the_next_commit(&db);
    let (forgot, events) =
        crate::capture::events(|| keys::forget(&mut conn, &JobKey::new("kept:1"), "ticket 4711"));
    assert_eq!(proxy.cuts(), 1, "the proxy cut the forget's COMMIT");
    // The audit trail (the CLI prints these events) has the forget, and its reason, whatever the
    // call returned: the row is gone.
    assert!(
        events.iter().any(|event| {
            event.get("reason").map(String::as_str) == Some("ticket 4711")
                && event.get("level").is_some_and(|level| level == "WARN")
                // Which job and key, as the audit line of a forget that committed says.
                && event.get("key").map(String::as_str) == Some("kept:1")
                && event.get("job").map(String::as_str) == Some("kept")
        }),
        "no audit event for a forget the server committed: {events:?}"
    );
    let gone = keys::lookup(&mut direct, &JobKey::new("kept:1"))
        .expect("a look-up")
        .is_none();
    assert!(gone, "the server committed the forget");
    match forgot {
        Ok(true) => {}
        Ok(false) => panic!("the forget said there was nothing to forget; it deleted the row"),
        Err(error) => {
            let said = crate::harness::with_causes(&error);
            assert!(
                !said.contains("nothing was changed"),
                "the row is gone, but the error says: {said}"
            );
            assert!(
                said.contains("may"),
                "the error should say the forget may have been committed: {said}"
            );
        }
    }
}

/// A look-up, and a forget that finds nothing to forget, whose `COMMIT` reply is lost: neither
/// changed anything, so neither can have an unknown outcome. The look-up has its answer; the
/// forget answers that there was nothing to forget, and the audit trail has no "may have
/// forgotten". Both said `OutcomeUnknown` ("may or may not have been committed"; the CLI's exit 5),
/// and the forget logged a WARN that it may have forgotten a key.
#[cfg(feature = "postgres")]
#[test]
fn a_read_whose_commit_reply_is_lost_keeps_its_answer() {
    use crate::backends::Postgres;

    let db = Db::<Postgres>::fresh();
    let mut direct = db.connect();
    assert!(deliver(&mut direct, &KEPT, "kept:1", 1));
    let (proxy, mut conn) = cutting_the_next_commit(&db);
    let found = keys::lookup(&mut conn, &JobKey::new("kept:1"));
    assert_eq!(proxy.cuts(), 1, "the proxy cut the look-up's COMMIT");
    let record = found
        .expect("the look-up's answer")
        .expect("the key's record");
    assert_eq!(record.job, "kept");

    let (proxy, mut conn) = cutting_the_next_commit(&db);
    let (forgot, events) =
        crate::capture::events(|| keys::forget(&mut conn, &JobKey::new("never:1"), "ticket 4712"));
    assert_eq!(proxy.cuts(), 1, "the proxy cut the forget's COMMIT");
    assert!(
        matches!(forgot, Ok(false)),
        "nothing to forget, nothing forgotten: {forgot:?}"
    );
    assert!(
        !events.iter().any(|event| event
            .get("message")
            .is_some_and(|m| m.contains("may have forgotten"))),
        "{events:?}"
    );
    assert!(
        keys::lookup(&mut direct, &JobKey::new("kept:1"))
            .expect("a look-up")
            .is_some(),
        "the other key is untouched"
    );
}

/// A relay's transaction that changed nothing has its answer when its `COMMIT`'s reply is lost,
/// as a look-up does: a round that found nothing to lease reports that, and a mark whose message
/// another relay took over (its lease lapsed during the delivery) reports the lease lost. Both
/// said `OutcomeUnknown` ("may or may not be committed"; for the mark, `RelayStopped`: "its record
/// may or may not be committed ... it is sent again"), though nothing could have been written.
#[cfg(feature = "postgres")]
#[test]
fn a_relay_transaction_that_changed_nothing_keeps_its_answer_when_its_commit_reply_is_lost() {
    use idempotent_jobs::outbox::{self, Relay};

    use crate::backends::Postgres;

    let db = Db::<Postgres>::fresh();
    let mut direct = db.connect();
    let (proxy, mut conn) = cutting_the_next_commit(&db);
    let idle = Relay::new().run_once(&mut conn, |_| Ok::<_, String>(()));
    assert_eq!(proxy.cuts(), 1, "the proxy cut the lease's COMMIT");
    let idle = idle.expect("a round that leased nothing knows it");
    assert_eq!(idle.leased, 0);

    crate::effects::send_receipt(&mut direct, "order-1").expect("a receipt");
    let proxy = crate::proxy::CommitCutter::start(db.locator());
    let mut conn = Postgres::connect(&proxy.url(db.locator()));
    let relay = Relay::new().lease(Duration::from_millis(300));
    let copy = Relay::new();
    let round = relay.run_once(&mut conn, |_| {
        std::thread::sleep(Duration::from_millis(600));
        // The lease lapsed: the copy takes the message over and delivers it.
        let taken = copy
            .run_once(&mut direct, |_| Ok::<_, String>(()))
            .expect("the copy's round");
        assert_eq!(taken.delivered, 1, "the copy took the lapsed lease over");
        proxy.arm();
        Ok::<_, String>(())
    });
    assert_eq!(proxy.cuts(), 1, "the proxy cut the mark's COMMIT");
    let round = round.unwrap_or_else(|error| {
        panic!(
            "the mark changed nothing (the message is the copy's), yet: {}",
            crate::harness::with_causes(&error)
        )
    });
    assert_eq!(
        (round.leased, round.delivered, round.lease_lost),
        (1, 0, 1),
        "{round:?}"
    );
    let counts = outbox::counts(&mut direct).expect("counts");
    assert_eq!((counts.delivered, counts.leased), (1, 0), "{counts:?}");

    // Two messages in the batch: after the first's record, whose `COMMIT` the connection did not
    // survive, the round stops. It used to go on and hand the second to the delivery on a dead
    // connection, which then could not record it (`RelayStopped`: "message ... was delivered, and
    // recording so failed"): a second delivery later for nothing.
    for order in ["order-2", "order-3"] {
        crate::effects::send_receipt(&mut direct, order).expect("a receipt");
    }
    let proxy = crate::proxy::CommitCutter::start(db.locator());
    let mut conn = Postgres::connect(&proxy.url(db.locator()));
    let relay = Relay::new().batch_size(2).lease(Duration::from_millis(300));
    let mut handed = Vec::new();
    let round = relay.run_once(&mut conn, |message| {
        handed.push(message.message_id().to_owned());
        if handed.len() == 1 {
            std::thread::sleep(Duration::from_millis(600));
            // The copy takes one lapsed lease a round: the first message, the oldest.
            let taken = copy
                .run_once(&mut direct, |_| Ok::<_, String>(()))
                .expect("the copy's round");
            assert_eq!(taken.delivered, 1, "the copy took the lapsed lease over");
            proxy.arm();
        }
        Ok::<_, String>(())
    });
    assert_eq!(proxy.cuts(), 1, "the proxy cut the first mark's COMMIT");
    assert_eq!(
        handed.len(),
        1,
        "nothing handed over after the connection failed: {handed:?}"
    );
    let error = round.expect_err("the round stops: its connection failed");
    assert!(error.is_connection_lost(), "{error:?}");
    let idempotent_jobs::Error::RelayStopped {
        report,
        message_id,
        delivered,
        ..
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(
        (
            report.leased,
            report.delivered,
            report.lease_lost,
            message_id,
            delivered
        ),
        (2, 0, 1, &None, &false),
        "{error}"
    );
    let said = error.to_string();
    assert!(said.contains("its connection failed"), "{said}");
    // The relay gives the untried message back on a new connection, and delivers it at once.
    drop(conn);
    let mut conn = db.connect();
    let mut sent = Vec::new();
    let next = relay
        .run_once(&mut conn, |message| {
            sent.push(message.message_id().to_owned());
            Ok::<_, String>(())
        })
        .expect("the next round");
    assert_eq!((next.delivered, sent.len()), (1, 1), "{next:?}");
    assert_ne!(sent[0], handed[0]);
    let counts = outbox::counts(&mut direct).expect("counts");
    assert_eq!((counts.delivered, counts.leased), (3, 0), "{counts:?}");
}

/// The same for a prune: its only batch's `COMMIT` reached the server, which deleted the five
/// lapsed keys, and the reply was lost. The error says the prune failed and that "the batches
/// before it stay deleted" (there were none), so the operator reads that the failed batch deleted
/// nothing; it should say that the last batch may have been committed.
#[cfg(feature = "postgres")]
#[test]
fn a_prune_whose_commit_reply_is_lost_says_its_last_batch_may_be_deleted() {
    use crate::backends::Postgres;

    let db = Db::<Postgres>::fresh();
    let mut direct = db.connect();
    Postgres::execute(
        &mut direct,
        &lapsed_claims(crate::harness::Server::Postgres, 5),
    );
    let (proxy, mut conn) = cutting_the_next_commit(&db);
    let pruned = idempotent_jobs::prune(&mut conn, &Prune::default().pace(0));
    assert_eq!(proxy.cuts(), 1, "the proxy cut the batch's COMMIT");
    assert_eq!(
        Postgres::count_done(&mut direct),
        0,
        "the server committed the batch"
    );
    match pruned {
        Ok(report) => assert_eq!(report.removed, 5),
        Err(error) => {
            let said = crate::harness::with_causes(&error);
            assert!(
                said.contains("may"),
                "the five keys are gone, but the error says: {said}"
            );
        }
    }
}

// --- a prune that fails part-way -------------------------------------------------------------

/// Thirty lapsed keys and a trigger that refuses any delete once 21 are gone (a stand-in for a
/// statement timeout, a lock wait or a lost connection on the fourth batch).
#[cfg(feature = "sqlite")]
fn thirty_lapsed_and_a_refusal_after_21() -> Db<crate::backends::Sqlite> {
    use crate::backends::Sqlite;

    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    Sqlite::execute(
        &mut conn,
        &lapsed_claims(crate::harness::Server::Sqlite, 30),
    );
    Sqlite::execute(
        &mut conn,
        "CREATE TRIGGER refuse_after_21 BEFORE DELETE ON done_jobs \
         WHEN (SELECT COUNT(*) FROM done_jobs) <= 9 \
         BEGIN SELECT RAISE(ABORT, 'the operator''s trigger refused this delete'); END",
    );
    db
}

/// A prune whose fourth batch fails has deleted three batches (21 keys), committed: the library's
/// `Error::Prune` says "the batches before it stay deleted" but not how many, and carries no count
/// a caller could read; the CLI prints nothing on stdout and an error without the number on
/// stderr (exit 5). An operator (or a script) cannot tell 21 deleted keys from none.
#[cfg(feature = "sqlite")]
#[test]
fn a_prune_that_fails_part_way_says_how_many_it_deleted() {
    use crate::backends::Sqlite;

    let db = thirty_lapsed_and_a_refusal_after_21();
    let dry = cli(db.locator(), &["prune", "--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry.stderr));
    assert!(
        text(&dry.stdout).contains("30 lapsed keys would be deleted"),
        "{}",
        text(&dry.stdout)
    );

    let output = cli(db.locator(), &["prune", "--batch-size", "7", "--pace", "0"]);
    let mut conn = db.connect();
    let left = Sqlite::count_done(&mut conn);
    assert_eq!(left, 9, "three batches of 7 were deleted and committed");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    // The database's path may hold digits of its own.
    let said = format!("{stdout}\n{stderr}").replace(db.locator(), "<db>");
    assert!(
        holds_number(&said, 21),
        "the CLI deleted 21 keys (exit {:?}) and said:\nstdout: {stdout}\nstderr: {stderr}",
        output.status.code()
    );

    // The library: the same, on a database of its own.
    let db = thirty_lapsed_and_a_refusal_after_21();
    let mut conn = db.connect();
    let error = idempotent_jobs::prune(&mut conn, &Prune::default().batch_size(7).pace(0))
        .expect_err("the fourth batch fails");
    assert_eq!(Sqlite::count_done(&mut conn), 9);
    let said = crate::harness::with_causes(&error).replace(db.locator(), "<db>");
    assert!(
        holds_number(&said, 21),
        "prune deleted 21 keys and returned: {said}"
    );
}

/// The same prune, on a database whose schema `verify` finds wanting for a reason of its own (the
/// outbox table dropped: a worker that never pushes runs without it; on MySQL, schema version 3
/// without the procedures, or an operator's role with fewer grants). The CLI ran `verify` after
/// the failure and printed only its findings ("run migrate"), exit 4: the prune's own error, with
/// the 21 keys it deleted, was gone. The error comes first now, with its count and its exit code
/// (5, a database error); what `verify` found follows it.
#[cfg(feature = "sqlite")]
#[test]
fn a_prune_that_fails_part_way_beside_a_schema_problem_still_says_how_many_it_deleted() {
    use crate::backends::Sqlite;

    let db = thirty_lapsed_and_a_refusal_after_21();
    Sqlite::execute(&mut db.connect(), "DROP TABLE outbox");
    let output = cli(db.locator(), &["prune", "--batch-size", "7", "--pace", "0"]);
    assert_eq!(Sqlite::count_done(&mut db.connect()), 9, "21 keys deleted");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    let said = format!("{stdout}\n{stderr}").replace(db.locator(), "<db>");
    assert!(
        holds_number(&said, 21) && said.contains("refused this delete") && said.contains("outbox"),
        "the CLI deleted 21 keys, failed on a trigger, and verify finds no outbox; it said \
         (exit {:?}):\nstdout: {stdout}\nstderr: {stderr}",
        output.status.code()
    );
    assert_eq!(
        output.status.code(),
        Some(5),
        "a database error that deleted keys is not a schema failure: {stderr}"
    );
}

// --- a forget confirmed at the prompt --------------------------------------------------------

/// `keys forget` shows the key's record and asks; the operator reads it (a lapsed run of an hour
/// ago, say) and answers `y`. Meanwhile the key's lapsed row was renewed: the job ran again and
/// committed a new run. The CLI then forgets by digest whatever row is there now, the new run's,
/// which the operator never saw, and prints that it forgot the record it showed; the job's next
/// delivery runs it a third time. The docs promise that a forget never undoes a run renewing a
/// lapsed row; here the renewing run's commit is undone. It should forget only the row it showed
/// (by its claim token), and say that the key changed meanwhile.
#[cfg(feature = "sqlite")]
#[test]
fn a_forget_confirmed_at_the_prompt_never_deletes_a_run_committed_since() {
    use std::io::{BufRead as _, BufReader, Write as _};

    use crate::backends::Sqlite;

    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    assert!(deliver(&mut conn, &BRIEF, "brief:1", 1), "the first run");
    std::thread::sleep(Duration::from_millis(1_500));
    let shown = keys::lookup(&mut conn, &JobKey::new("brief:1"))
        .expect("a look-up")
        .expect("the first run's row");
    assert!(shown.lapsed, "the first run's key has lapsed");

    let command = format!(
        "{} keys forget brief:1 --reason race",
        crate::operator_cli::cli_binary().display()
    );
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("DATABASE_URL", db.locator())
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux `script` (a terminal for the prompt)");
    let stdout = child.stdout.take().expect("its output");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buffer = Vec::new();
        // The prompt ends without a newline: read up to its `]`.
        while reader.read_until(b']', &mut buffer).is_ok_and(|n| n > 0) {
            let _ = lines.send(String::from_utf8_lossy(&buffer).into_owned());
        }
    });
    let mut printed = String::new();
    while !printed.contains("[y/N]") {
        match received.recv_timeout(Duration::from_secs(60)) {
            Ok(all) => printed = all,
            Err(_) => {
                let _ = child.kill();
                panic!("the CLI never asked; it printed: {printed}");
            }
        }
    }
    assert!(printed.contains("lapsed"), "the record shown: {printed}");

    // While the operator reads: the next delivery renews the lapsed key and commits a new run.
    assert!(
        deliver(&mut conn, &BRIEF, "brief:1", 2),
        "the redelivery runs the lapsed key again"
    );
    let renewed = keys::lookup(&mut conn, &JobKey::new("brief:1"))
        .expect("a look-up")
        .expect("the renewed row");
    assert_ne!(renewed.done_at, shown.done_at, "a new run's row");

    let mut stdin = child.stdin.take().expect("its input");
    stdin.write_all(b"y\n").expect("answering");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("its status") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the CLI did not end after the answer"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let mut later = String::new();
    while let Ok(all) = received.recv_timeout(Duration::from_millis(500)) {
        later = all;
    }
    let after = keys::lookup(&mut conn, &JobKey::new("brief:1")).expect("a look-up");
    assert!(
        after.is_some(),
        "the run committed after the record was shown was forgotten (the CLI, {status}, said: {})",
        later.trim()
    );
    assert!(
        status.code() == Some(6) && later.contains("renewed by another run"),
        "the CLI ({status}) said: {}",
        later.trim()
    );
}

// --- sessions the user set up ----------------------------------------------------------------

/// A PostgreSQL role or session whose transactions are read-only by default
/// (`default_transaction_read_only = on`, set here through the URL's `options`, as `PGOPTIONS` or
/// `ALTER ROLE ... SET` would): `keys forget --yes` and `prune` fail with exit code 5, say why,
/// do not promise that a retry can succeed, and change nothing; `prune --dry-run` and `keys show`
/// work; the library's forget says the same.
#[cfg(feature = "postgres")]
#[test]
fn a_read_only_postgres_session_changes_nothing_and_says_so() {
    use crate::backends::Postgres;

    let db = Db::<Postgres>::fresh();
    let mut conn = db.connect();
    assert!(deliver(&mut conn, &KEPT, "kept:1", 1));
    assert!(deliver(&mut conn, &BRIEF, "brief:1", 1));
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        db.locator()
            .ends_with(&format!("options=-csearch_path%3D{}", schema_of(&db))),
        "the test database's URL ends with its options: {}",
        db.locator()
    );
    let read_only = format!("{}%20-cdefault_transaction_read_only%3Don", db.locator());

    let dry = cli(&read_only, &["prune", "--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry.stderr));
    assert!(
        text(&dry.stdout).contains("1 lapsed key would be deleted"),
        "{}",
        text(&dry.stdout)
    );
    let show = cli(&read_only, &["keys", "show", "kept:1"]);
    assert_eq!(show.status.code(), Some(0), "{}", text(&show.stderr));

    for args in [
        &["keys", "forget", "kept:1", "--yes"][..],
        &["prune", "--pace", "0"][..],
    ] {
        let output = cli(&read_only, args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(5), "{args:?}: {stderr}");
        assert!(text(&output.stdout).is_empty(), "{args:?}: stdout is empty");
        assert!(stderr.contains("read-only"), "{args:?}: {stderr}");
        assert!(!stderr.contains("can succeed"), "{args:?}: {stderr}");
    }
    assert_eq!(Postgres::count_done(&mut conn), 2, "nothing was deleted");

    Postgres::execute(&mut conn, "SET default_transaction_read_only = on");
    let error = keys::forget(&mut conn, &JobKey::new("kept:1"), "ticket")
        .expect_err("a read-only session cannot forget");
    assert!(!error.is_retryable(), "{error}");
    let error = idempotent_jobs::prune(&mut conn, &Prune::default().pace(0))
        .expect_err("a read-only session cannot prune");
    assert!(!error.is_retryable(), "{error}");
    let mut other = db.connect();
    assert_eq!(Postgres::count_done(&mut other), 2, "nothing was deleted");
}

#[cfg(feature = "postgres")]
fn schema_of(db: &Db<crate::backends::Postgres>) -> String {
    db.locator()
        .rsplit_once("%3D")
        .map(|(_, schema)| schema.to_owned())
        .expect("a search_path in the URL")
}

/// A MariaDB session with `sql_select_limit = 1` (set by the application for its own queries, or
/// server-wide by a DBA, when the CLI's sessions get it too): the runtime runs its statements on
/// the caller's session, and those without a `LIMIT` of their own return one row. `verify` then
/// reports every column of the three tables but one missing and says to run `migrate` (on tables
/// that are current); `job_counts` returns one job of two, so a dry run's count disagrees with
/// what a prune deletes.
#[cfg(feature = "mysql")]
#[test]
fn a_mysql_session_select_limit_never_cuts_a_report_short() {
    use crate::backends::Mysql;

    let db = Db::<Mysql>::fresh();
    let mut conn = db.connect();
    assert!(deliver(&mut conn, &BRIEF, "brief:1", 1));
    assert!(deliver(&mut conn, &KEPT, "kept:1", 1));
    std::thread::sleep(Duration::from_millis(1_500));
    Mysql::execute(&mut conn, "SET SESSION sql_select_limit = 1");
    idempotent_jobs::migrate(&mut conn).expect("migrate on current tables is a no-op");
    if let Err(error) = idempotent_jobs::verify(&mut conn) {
        panic!("verify on a session with sql_select_limit = 1: {error}");
    }
    let counts = keys::job_counts(&mut conn).expect("counts");
    let jobs: Vec<&str> = counts.iter().map(|c| c.job.as_str()).collect();
    assert_eq!(jobs, ["brief", "kept"], "every job's count");
    let listed = keys::list(&mut conn, &keys::KeyQuery::default()).expect("a list");
    assert_eq!(listed.len(), 2, "every key");
    // The relay leases several messages and reads them back in one statement: with the session's
    // limit it read one, and the others stayed leased, undelivered, until their lease ran out.
    Mysql::execute(&mut conn, "SET SESSION sql_select_limit = DEFAULT");
    for order in ["order-1", "order-2", "order-3"] {
        crate::effects::send_receipt(&mut conn, order).expect("a receipt queued");
    }
    Mysql::execute(&mut conn, "SET SESSION sql_select_limit = 1");
    let delivered = Mysql::drain_outbox(&mut conn);
    assert_eq!(
        delivered.len(),
        3,
        "every message in one drain: {delivered:?}"
    );
    let parked = idempotent_jobs::outbox::parked(&mut conn).expect("the parked messages");
    assert!(parked.is_empty(), "{parked:?}");
}

/// A MariaDB session with `sql_select_limit = 0`: every `SELECT` without a `LIMIT` of its own
/// returns no row, a table-less one too. Each kind of call still reports what the database holds:
/// a run, its replay through the claim, a flagged redelivery's replay, a job storing a result
/// (the packet limit is read with a `SELECT`), the keys API and the schema's version. Before:
/// `migrate` failed (its lock's `SELECT GET_LOCK` returned no row), `verify` said all three
/// tables were missing, the replay and the flagged replay gave up after 600 attempts in 30 s
/// ("deadlocks": the claim's `SELECT ... FOR UPDATE` found no row, every time, so no delivery
/// could finish the key), `keys::lookup` said there was no record and `keys::forget` `false`.
#[cfg(feature = "mysql")]
#[test]
fn a_mysql_session_select_limit_of_zero_never_hides_a_row() {
    use crate::backends::Mysql;
    use crate::handlers::Mode;

    let db = Db::<Mysql>::fresh();
    let mut conn = db.connect();
    let mut other = db.connect();
    Mysql::execute(&mut conn, "SET SESSION sql_select_limit = 0");
    idempotent_jobs::migrate(&mut conn).expect("migrate on current tables is a no-op");
    if let Err(error) = idempotent_jobs::verify(&mut conn) {
        panic!("verify on a session with sql_select_limit = 0: {error}");
    }
    let ran = Mysql::charge(&mut conn, "order-1", 5, Mode::Succeed).expect("a run");
    let replayed = Mysql::charge(&mut conn, "order-1", 5, Mode::Succeed).expect("a replay");
    assert_eq!(replayed, ran, "the replay returns the run's result");
    let flagged =
        Mysql::charge_redelivered(&mut conn, "order-1", 5, true).expect("a flagged replay");
    assert_eq!(flagged, ran, "the flagged replay returns the run's result");
    assert_eq!(Mysql::count_charges(&mut other, "order-1"), 1, "one charge");
    let key = crate::handlers::charge_key("order-1");
    let record = keys::lookup(&mut conn, &key).expect("a lookup");
    assert!(record.is_some(), "the key's record is there");
    let counts = keys::job_counts(&mut conn).expect("counts");
    assert_eq!(counts.len(), 1, "the job's count: {counts:?}");
    assert!(keys::forget(&mut conn, &key, "the test").expect("a forget"));
    assert!(keys::lookup(&mut other, &key).expect("a lookup").is_none());
}

// --- a prune stopped by a signal -------------------------------------------------------------

/// The CLI stopped by SIGTERM or SIGKILL in the middle of a paced prune: every batch is one
/// transaction, so what is gone is a whole number of batches (never half of one), and the rows it
/// had not reached are there for the next prune, which deletes exactly those and says so.
#[cfg(feature = "sqlite")]
#[test]
fn a_prune_stopped_by_a_signal_leaves_whole_batches_and_the_next_prune_counts_the_rest() {
    use crate::backends::Sqlite;

    // SIGTERM, and SIGKILL, which nothing catches. (Not SIGINT: a process started in the
    // background of a non-interactive shell, as CI may run the suite, inherits SIGINT ignored,
    // and the prune then rightly runs to its end.)
    for signal in ["TERM", "KILL"] {
        let db = Db::<Sqlite>::fresh();
        let mut conn = db.connect();
        Sqlite::execute(
            &mut conn,
            &lapsed_claims(crate::harness::Server::Sqlite, 20000),
        );
        // Counting beside the prune waits for its batch instead of failing.
        Sqlite::execute(&mut conn, "PRAGMA busy_timeout = 5000");
        let child = spawn_cli(
            db.locator(),
            &["prune", "--batch-size", "250", "--pace", "30"],
        );
        // Until it has deleted something, and not everything.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = Sqlite::count_done(&mut conn);
            if left < 20_000 {
                assert!(left > 0, "the prune finished before it could be stopped");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the prune deleted nothing"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let sent = Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success(), "sending SIG{signal}");
        let output = child.wait_with_output().expect("the CLI's end");
        assert!(!output.status.success(), "{signal}: {:?}", output.status);
        let left = Sqlite::count_done(&mut conn);
        let removed = 20_000 - left;
        assert_eq!(
            removed % 250,
            0,
            "{signal}: {removed} rows deleted: a batch was cut in half"
        );
        assert!(
            !text(&output.stdout).contains("deleted"),
            "{signal}: it claimed a count it never finished: {}",
            text(&output.stdout)
        );
        let again = cli(
            db.locator(),
            &["prune", "--pace", "0", "--batch-size", "5000"],
        );
        assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
        let said = text(&again.stdout);
        assert!(
            said.contains(&format!("deleted {left} lapsed keys")),
            "{signal}: {left} were left: {said}"
        );
        assert_eq!(Sqlite::count_done(&mut conn), 0);
    }
}

// --- a forget beside a run renewing the key --------------------------------------------------

/// A run of `BRIEF` on `key` (a lapsed one: it renews the row), on a thread of its own: its body
/// says when it holds the claim, then waits for the word to finish.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn renewing<C>(
    mut conn: C,
    key: &'static str,
) -> (
    std::thread::JoinHandle<bool>,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
)
where
    C: idempotent_jobs::JobStore + Send + 'static,
{
    let (claimed, holds) = std::sync::mpsc::channel();
    let (finish, finishing) = std::sync::mpsc::channel::<()>();
    let run = std::thread::spawn(move || {
        let outcome: Outcome<u32> =
            idempotent_jobs::run(&mut conn, &BRIEF, &JobKey::new(key), |_conn| {
                let _ = claimed.send(());
                let _ = finishing.recv_timeout(Duration::from_secs(60));
                Ok::<_, idempotent_jobs::Error>(2)
            })
            .expect("the renewing run");
        outcome.is_ran()
    });
    (run, holds, finish)
}

/// `keys forget --yes` while a run is renewing the key's lapsed row (its claim taken, not yet
/// committed): the forget waits for the run's row lock, and once the run commits it finds the row
/// it read replaced and deletes nothing, as promised; the renewed run's row stays. The CLI then
/// said "key `brief:1` was deleted by someone else meanwhile; nothing was changed" and exited 1
/// (not found): the key was not deleted, it is there, renewed. It says so now, and exits 6 (the
/// key changed since it was read).
#[cfg(feature = "postgres")]
#[test]
fn a_forget_that_meets_a_renewal_never_says_the_key_was_deleted() {
    forget_meeting_a_renewal(false);
}

/// The same for a row written before schema v3 (no claim token): its forget deleted by digest
/// alone, so once the renewal committed, the `DELETE` that had waited for it deleted the renewed
/// run's row, and the CLI said it forgot the record it showed (done long ago, lapsed).
#[cfg(feature = "postgres")]
#[test]
fn a_forget_of_a_row_from_before_claim_tokens_never_deletes_its_renewal() {
    forget_meeting_a_renewal(true);
}

#[cfg(feature = "postgres")]
fn forget_meeting_a_renewal(legacy: bool) {
    use crate::backends::Postgres;

    let db = Db::<Postgres>::fresh();
    let mut conn = db.connect();
    assert!(deliver(&mut conn, &BRIEF, "brief:1", 1));
    if legacy {
        Postgres::execute(&mut conn, "UPDATE done_jobs SET claim_token = NULL");
    }
    std::thread::sleep(Duration::from_millis(1_500));
    let (run, holds, finish) = renewing(db.connect(), "brief:1");
    holds
        .recv_timeout(Duration::from_secs(60))
        .expect("the renewal holds its claim");
    let name = unique_name("optruth");
    let url = format!("{}&application_name={name}", db.locator());
    let child = spawn_cli(
        &url,
        &["keys", "forget", "brief:1", "--yes", "--reason", "race"],
    );
    wait_for::<Postgres>(
        &mut conn,
        &format!(
            "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE application_name = '{name}' \
             AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM done_jobs%'"
        ),
        "the CLI's forget waiting for the renewing run",
    );
    finish.send(()).expect("finishing the run");
    assert!(run.join().expect("the run's thread"), "the renewal ran");
    let output = child.wait_with_output().expect("the CLI's end");
    let stderr = text(&output.stderr);
    assert!(
        keys::lookup(&mut conn, &JobKey::new("brief:1"))
            .expect("a look-up")
            .is_some(),
        "the renewed run's row stays"
    );
    assert!(
        !stderr.contains("deleted by someone else") && stderr.contains("renewed by another run"),
        "the key is there (renewed), but the CLI (exit {:?}) said: {stderr}",
        output.status.code()
    );
    // Not 1 ("the key does not exist"): it exists. 6: it changed since it was read.
    assert_eq!(
        output.status.code(),
        Some(6),
        "the key is there (renewed); the CLI said: {stderr}"
    );
}

/// A SQLite file opened read-only (`file:...?mode=ro`, what an operator uses to look without
/// touching): `keys forget --yes` and `prune` fail with exit code 5, say that nothing was changed
/// (the forget) and that the database is read-only, promise no success from a retry, and the rows
/// are all there for another connection.
#[cfg(feature = "sqlite")]
#[test]
fn a_read_only_sqlite_file_changes_nothing_and_says_so() {
    use crate::backends::Sqlite;

    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    assert!(deliver(&mut conn, &KEPT, "kept:1", 1));
    assert!(deliver(&mut conn, &BRIEF, "brief:1", 1));
    std::thread::sleep(Duration::from_millis(1_500));
    let read_only = format!("file:{}?mode=ro", db.locator());
    let forget = cli(&read_only, &["keys", "forget", "kept:1", "--yes"]);
    let stderr = text(&forget.stderr);
    assert_eq!(forget.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("nothing was changed"), "{stderr}");
    let prune = cli(&read_only, &["prune", "--pace", "0"]);
    let prune_stderr = text(&prune.stderr);
    assert_eq!(prune.status.code(), Some(5), "{prune_stderr}");
    for said in [&stderr, &prune_stderr] {
        assert!(said.contains("readonly"), "{said}");
        assert!(!said.contains("can succeed"), "{said}");
    }
    assert!(text(&forget.stdout).is_empty() && text(&prune.stdout).is_empty());
    assert_eq!(Sqlite::count_done(&mut conn), 2, "nothing was deleted");
}

// --- a connection lost under the CLI ----------------------------------------------------------

/// Waits until `sql` (a count) is not 0 on `conn`, for at most a minute.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn wait_for<B: Backend>(conn: &mut B::Conn, sql: &str, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while B::query_i64(conn, sql) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never happened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A paced prune whose connection is terminated in a pause after its first batch committed (an
/// idle timeout, a failover, an operator's `pg_terminate_backend`): two keys are deleted. Before,
/// the CLI said "lost the connection" and exited 3 ("cannot connect"), which the docs keep for
/// nothing changed; it exits 5, a failed operation that changed something, with the count.
#[cfg(feature = "postgres")]
#[test]
fn a_prune_that_loses_its_connection_after_a_batch_exits_5_with_the_count() {
    use crate::backends::Postgres;

    let db = Db::<Postgres>::fresh();
    let mut conn = db.connect();
    Postgres::execute(
        &mut conn,
        &lapsed_claims(crate::harness::Server::Postgres, 5),
    );
    let name = unique_name("optruth");
    let url = format!("{}&application_name={name}", db.locator());
    let child = spawn_cli(&url, &["prune", "--batch-size", "2", "--pace", "2000"]);
    wait_for::<Postgres>(
        &mut conn,
        "SELECT CASE WHEN COUNT(*) = 3 THEN 1::bigint ELSE 0::bigint END AS n FROM done_jobs",
        "the first batch",
    );
    Postgres::execute(
        &mut conn,
        &format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}'"
        ),
    );
    let output = child.wait_with_output().expect("the CLI's end");
    let stderr = text(&output.stderr);
    assert_eq!(
        Postgres::count_done(&mut conn),
        3,
        "one batch of two deleted"
    );
    assert_eq!(
        output.status.code(),
        Some(5),
        "a prune that deleted two keys: {stderr}"
    );
    assert!(
        holds_number(&stderr, 2) && stderr.contains("stay deleted"),
        "the count of what was deleted: {stderr}"
    );
}

/// A forget waiting for a row lock whose connection is killed (`KILL`, by a DBA or a failover):
/// nothing was changed, and the CLI says it lost the connection and exits 3, on MySQL as on
/// PostgreSQL. Before, MySQL's lost connection (a message, not Diesel's `ClosedConnection`) was
/// "any other database error", exit 5, after a `verify` on the dead connection.
#[cfg(feature = "mysql")]
#[test]
fn a_forget_whose_mysql_connection_is_killed_exits_3_and_changes_nothing() {
    use crate::backends::Mysql;

    let db = Db::<Mysql>::fresh();
    let mut conn = db.connect();
    assert!(deliver(&mut conn, &KEPT, "kept:1", 1));
    let mut holder = db.connect();
    Mysql::execute(&mut holder, "BEGIN");
    Mysql::execute(&mut holder, "SELECT * FROM done_jobs FOR UPDATE");
    let child = spawn_cli(
        db.locator(),
        &["keys", "forget", "kept:1", "--yes", "--reason", "kill"],
    );
    let waiting = "SELECT COUNT(*) AS n FROM information_schema.processlist \
                   WHERE info LIKE 'DELETE FROM done_jobs%' AND id <> CONNECTION_ID()";
    wait_for::<Mysql>(&mut conn, waiting, "the CLI's forget waiting for the lock");
    let id = Mysql::query_i64(
        &mut conn,
        "SELECT id AS n FROM information_schema.processlist \
         WHERE info LIKE 'DELETE FROM done_jobs%' AND id <> CONNECTION_ID() LIMIT 1",
    );
    Mysql::execute(&mut conn, &format!("KILL CONNECTION {id}"));
    let output = child.wait_with_output().expect("the CLI's end");
    Mysql::execute(&mut holder, "ROLLBACK");
    let stderr = text(&output.stderr);
    assert!(
        keys::lookup(&mut conn, &JobKey::new("kept:1"))
            .expect("a look-up")
            .is_some(),
        "nothing was changed"
    );
    assert_eq!(
        output.status.code(),
        Some(3),
        "a lost connection that changed nothing: {stderr}"
    );
    assert!(
        stderr.contains("lost the connection") && stderr.contains("nothing was changed"),
        "{stderr}"
    );
}

/// A `migrate` whose `COMMIT` reached PostgreSQL, which committed the tables, but whose reply was
/// lost: the call must not say the migration failed and that its steps "were rolled back with
/// the rest"; it says the outcome is unknown (and a second `migrate` finds the tables current).
#[cfg(feature = "postgres")]
#[test]
fn a_migration_whose_commit_reply_is_lost_says_it_may_be_committed() {
    use crate::backends::Postgres;

    let db = Db::<Postgres>::empty();
    let proxy = crate::proxy::CommitCutter::start(db.locator());
    let mut conn = Postgres::connect(&proxy.url(db.locator()));
    proxy.arm_after("CREATE TABLE");
    let migrated = idempotent_jobs::migrate(&mut conn);
    assert_eq!(proxy.cuts(), 1, "the proxy cut the migration's COMMIT");
    let mut direct = db.connect();
    idempotent_jobs::verify(&mut direct).expect("the server committed the tables");
    match migrated {
        Ok(()) => {}
        Err(error) => {
            let said = crate::harness::with_causes(&error);
            assert!(
                matches!(error, idempotent_jobs::Error::OutcomeUnknown { .. })
                    && said.contains("may or may not have been committed"),
                "the tables are there, but the error says: {said}"
            );
        }
    }
    idempotent_jobs::migrate(&mut direct).expect("a second migrate");
}

/// The CLI's `migrate` whose check afterwards (as `verify` does) loses the connection: the
/// migration is committed, and the command must not say "nothing was changed" nor exit 3 ("the
/// connection was lost before the command changed anything"). It did both: the check's own error
/// ("verifying the runtime's tables failed; nothing was changed") stood for the whole command.
#[cfg(feature = "postgres")]
#[test]
fn a_migrate_whose_check_afterwards_fails_says_the_migration_is_committed() {
    use crate::backends::Postgres;

    let db = Db::<Postgres>::empty();
    let proxy = crate::proxy::CommitCutter::start(db.locator());
    // A statement only the check sends (the table grants it reads once the tables are there).
    proxy.arm_on("has_table_privilege(c.oid, 'SELECT')");
    let out = cli(&proxy.url(db.locator()), &["migrate"]);
    assert_eq!(proxy.cuts(), 1, "the proxy cut the check's connection");
    let mut direct = db.connect();
    idempotent_jobs::verify(&mut direct).expect("the migration is committed");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(!stderr.contains("nothing was changed"), "{stderr}");
    assert!(stderr.contains("what it did is committed"), "{stderr}");
}

/// MySQL's DDL commits by itself: a `migrate` whose connection is lost at a later step has
/// committed the steps before it. The CLI exited 3, which says the connection was lost before
/// the command changed anything; now 5 (a failed operation that changed something), with the
/// library's own "calling migrate again resumes where this stopped".
#[cfg(feature = "mysql")]
#[test]
fn a_mysql_migrate_lost_at_a_later_step_does_not_exit_3() {
    use crate::backends::Mysql;

    let db = Db::<Mysql>::empty();
    let proxy = crate::proxy::CommitCutter::start(db.locator());
    // The last step's DDL: the server runs it, its answer never comes back.
    proxy.arm_on("CREATE INDEX outbox_leased");
    let out = cli(&proxy.url(db.locator()), &["migrate"]);
    assert_eq!(
        proxy.cuts(),
        1,
        "the proxy cut the connection at the last step"
    );
    let stderr = text(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(3),
        "the earlier steps are committed: {stderr}"
    );
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("resumes"), "{stderr}");
    let mut direct = db.connect();
    assert!(
        Mysql::try_execute(&mut direct, "SELECT 1 FROM done_jobs LIMIT 1").is_ok(),
        "the first steps are committed"
    );
    idempotent_jobs::migrate(&mut direct).expect("a second migrate resumes");
    idempotent_jobs::verify(&mut direct).expect("current");
}

/// SQLite: `keys::forget` while a run renews the key's lapsed row. The forget's transaction read
/// the lapsed row, then could not take the write lock the run holds (SQLite answers busy at once
/// to a reader that would wait for a writer), and started over: the attempt after the run's
/// commit read the renewed row and deleted it, and the next delivery ran the job again. Before:
/// `Ok(true)` and no row. A forget acts on the row it read first; a row that changed since is
/// another run's and stays (as on PostgreSQL and MySQL, whose delete waits and finds it replaced).
#[cfg(feature = "sqlite")]
#[test]
fn a_forget_beside_a_renewal_on_sqlite_keeps_the_renewed_claim() {
    use crate::backends::Sqlite;

    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    assert!(deliver(&mut conn, &BRIEF, "brief:1", 1));
    std::thread::sleep(Duration::from_millis(1_500));
    let (run, holds, finish) = renewing(db.connect(), "brief:1");
    holds
        .recv_timeout(Duration::from_secs(60))
        .expect("the renewal holds its claim");
    let forget = std::thread::scope(|scope| {
        let forgetting = scope.spawn(|| keys::forget(&mut conn, &JobKey::new("brief:1"), "race"));
        std::thread::sleep(Duration::from_millis(500));
        finish.send(()).expect("finishing the run");
        forgetting.join().expect("the forget's thread")
    });
    assert!(run.join().expect("the run's thread"), "the renewal ran");
    assert!(
        keys::lookup(&mut conn, &JobKey::new("brief:1"))
            .expect("a look-up")
            .is_some(),
        "the renewed run's row stays; the forget said {forget:?}"
    );
    assert!(matches!(forget, Ok(false)), "{forget:?}");
}

// --- a claim's renewal that meets a prune, a forget or another renewal -------------------------

/// A redelivery of a lapsed key whose renewal waits for a row lock that a prune, a forget or
/// another run's renewal holds, and finds the row gone or renewed once the lock is let go: the
/// claim goes round again and runs the job (the row is gone) or replays the committed run (the
/// row was renewed). On PostgreSQL the renewal's wait gave the job's transaction an id, and the
/// claim's second turn refused it as "a transaction of its own" of the session's: the call ended
/// `Error::Database` at the claim, not retryable, and the worker dead-lettered a delivery that
/// nothing had run.
#[cfg(feature = "postgres")]
#[test]
fn a_renewal_that_waited_for_a_prune_runs_the_job() {
    renewal_meeting("DELETE FROM done_jobs", Ok(7));
}

/// The same with the holder renewing the key itself (another run's renewal, committed first):
/// the redelivery replays it.
#[cfg(feature = "postgres")]
#[test]
fn a_renewal_that_waited_for_another_renewal_replays_it() {
    renewal_meeting(
        "UPDATE done_jobs SET expires_at = now() + interval '1 hour'",
        Err(1),
    );
}

/// `BRIEF`'s `brief:1` run once, lapsed, locked by a holder; a redelivery (whose body returns 7)
/// waits in its renewal until the holder runs `change` and commits. `expected`: `Ok(value)` ran,
/// `Err(value)` replayed.
#[cfg(feature = "postgres")]
fn renewal_meeting(change: &str, expected: Result<u32, u32>) {
    use crate::backends::Postgres;

    let db = Db::<Postgres>::fresh();
    let mut conn = db.connect();
    assert!(deliver(&mut conn, &BRIEF, "brief:1", 1));
    std::thread::sleep(Duration::from_millis(1_500));
    let mut holder = db.connect();
    Postgres::execute(&mut holder, "BEGIN");
    Postgres::execute(&mut holder, "SELECT 1 FROM done_jobs FOR UPDATE");
    let mut worker = db.connect();
    let redelivery = std::thread::spawn(move || {
        idempotent_jobs::run(&mut worker, &BRIEF, &JobKey::new("brief:1"), |_conn| {
            Ok::<_, idempotent_jobs::Error>(7u32)
        })
    });
    wait_for::<Postgres>(
        &mut conn,
        "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND query LIKE 'UPDATE done_jobs%'",
        "the redelivery's renewal waiting for the holder's row lock",
    );
    Postgres::execute(&mut holder, change);
    Postgres::execute(&mut holder, "COMMIT");
    let outcome = redelivery
        .join()
        .expect("the redelivery's thread")
        .unwrap_or_else(|error| panic!("the redelivery failed: {error}"));
    let got = match outcome {
        Outcome::Ran(value) => Ok(value),
        Outcome::Replayed(value) => Err(value),
    };
    assert_eq!(
        got, expected,
        "Ok: ran; Err: replayed (a pruned key runs, a renewed one replays its run)"
    );
    assert_eq!(Postgres::count_done(&mut conn), 1, "one row holds the key");
}
