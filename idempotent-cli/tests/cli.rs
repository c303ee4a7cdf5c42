//! Runs the `idempotent-jobs` binary against SQLite, PostgreSQL and MariaDB, with data the runtime
//! itself wrote, and checks both what it prints and what it changed.
//!
//! Each test works in a database of its own: a temporary file (SQLite), a fresh schema reached
//! through `search_path` (PostgreSQL) or a fresh database (MySQL), dropped at the end. Servers are
//! found at `IDEMPOTENT_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and
//! `IDEMPOTENT_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`); a server that cannot be
//! reached fails its tests with a message saying how to start it.

mod common;

use std::collections::BTreeMap;

use diesel::{MysqlConnection, PgConnection, SqliteConnection};
use idempotent_runtime::keys;
use idempotent_runtime::outbox;
use idempotent_runtime::{Error, JobKey, Outcome};
use serde_json::Value;

use common::*;

/// Every command on a database the runtime migrated and ran jobs on; and on one without tables.
fn operate<C: Backend>() {
    let db = TestDb::empty::<C>();

    // No tables yet: verify, and any command, say so with exit code 4.
    let run = db.cli(&["verify"]).exit(4);
    assert!(
        run.stderr.contains("has no idempotent-jobs tables")
            && run.stderr.contains("idempotent_jobs::migrate"),
        "{run:#?}"
    );
    let run = db.cli(&["--json", "verify"]).exit(4);
    assert_eq!(run.json()["ok"], false, "{run:#?}");
    for args in [
        &["keys", "list"][..],
        &["keys", "show", "charge:order-1"],
        &["keys", "forget", "charge:order-1", "--yes"],
        &["jobs"],
        &["outbox", "pending"],
        &["prune"],
    ] {
        let run = db.cli(args).exit(4);
        assert!(run.stdout.is_empty(), "{args:?}: {run:#?}");
        assert!(
            run.stderr.contains("run `idempotent-jobs migrate`"),
            "{args:?}: {run:#?}"
        );
    }

    // `migrate` creates the tables the messages above ask for; a second is a no-op.
    let run = db.cli(&["migrate"]).ok();
    assert!(
        run.stdout.starts_with("ok: the idempotent-jobs tables at")
            && run.stdout.contains("created and current"),
        "{run:#?}"
    );
    let run = db.cli(&["--json", "migrate"]).ok();
    assert_eq!(run.json()["ok"], true, "{run:#?}");
    let mut conn: C = db.connect();
    idempotent_runtime::verify(&mut conn).expect("the tables `migrate` created");
    let run = db.cli(&["verify"]).ok();
    assert!(run.stdout.starts_with("ok"), "{run:#?}");

    // A message that fails its one allowed delivery, and is parked.
    park_hook(&mut conn);
    let parked = outbox::parked(&mut conn).expect("parked messages");
    assert_eq!(parked.len(), 1, "the failed message is parked");
    let parked_id = parked[0].message_id().to_owned();

    assert!(charge(&mut conn, 1).1 && charge(&mut conn, 2).1);
    assert!(!charge(&mut conn, 1).1, "a second delivery replays");
    let _: Outcome<()> =
        idempotent_runtime::run(&mut conn, &DIGEST, &JobKey::new("digest:ada"), |_| {
            Ok::<_, Error>(())
        })
        .expect("running the digest job");
    let pending = outbox::unsent(&mut conn, 10).expect("pending messages");
    let receipt_ids: Vec<String> = pending.iter().map(|m| m.message_id().to_owned()).collect();
    assert_eq!(receipt_ids.len(), 2);

    // keys list
    let run = db.cli(&["--json", "keys", "list"]).ok();
    let listed = run.json();
    let mut by_key = BTreeMap::new();
    for record in listed["keys"].as_array().expect("keys") {
        by_key.insert(
            record["key"].as_str().expect("key").to_owned(),
            record.clone(),
        );
    }
    assert_eq!(
        by_key.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "charge:order-1",
            "charge:order-2",
            "digest:ada",
            "hook:order-77"
        ],
        "{run:#?}"
    );
    let one = &by_key["charge:order-1"];
    assert_eq!(one["job"], "charge");
    assert_eq!(one["digest"], hex(&JobKey::new("charge:order-1").digest()));
    assert_eq!(one["has_result"], true);
    assert_eq!(one["expires_at"], Value::Null);
    assert_eq!(one["lapsed"], false);
    assert!(
        one["done_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{one}"
    );
    assert_eq!(by_key["digest:ada"]["lapsed"], true);
    assert_eq!(listed["more"], false);

    let run = db.cli(&["keys", "list"]).ok();
    assert!(run.stdout.starts_with("JOB "), "{run:#?}");
    assert_eq!(
        run.stdout.lines().count(),
        5,
        "a header and 4 keys: {run:#?}"
    );
    let run = db.cli(&["keys", "list", "--job", "charge"]).ok();
    assert_eq!(run.stdout.lines().count(), 3, "{run:#?}");
    assert!(!run.stdout.contains("digest:ada"), "{run:#?}");
    let count = |args: &[&str]| {
        let mut all = vec!["--json", "keys", "list"];
        all.extend_from_slice(args);
        let run = db.cli(&all).ok();
        run.json()["keys"].as_array().expect("keys").len()
    };
    assert_eq!(count(&["--since", "1h"]), 4);
    assert_eq!(count(&["--before", "1h"]), 0);
    assert_eq!(count(&["--since", "2999-01-01T00:00:00Z"]), 0);
    assert_eq!(count(&["--before", "2999-01-01T00:00:00+02:00"]), 4);
    let run = db.cli(&["--json", "keys", "list", "--limit", "1"]).ok();
    assert_eq!(run.json()["keys"].as_array().map(Vec::len), Some(1));
    assert_eq!(run.json()["more"], true);
    // Page by page, as the table's last line says, and as `next` in JSON: each key once.
    let mut listed = Vec::new();
    let mut args = vec![
        "keys".to_owned(),
        "list".to_owned(),
        "--limit".to_owned(),
        "1".to_owned(),
    ];
    for _ in 0..10 {
        let shown: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = db.cli(&shown).ok();
        listed.extend(
            run.stdout
                .lines()
                .skip(1)
                .filter(|l| !l.starts_with('('))
                .map(str::to_owned),
        );
        let Some(next) = run.stdout.split("--after ").nth(1) else {
            break;
        };
        let next = next.trim().trim_end_matches(')').to_owned();
        args.truncate(4);
        args.extend(["--after".to_owned(), next]);
    }
    assert_eq!(listed.len(), 4, "each key on one page: {listed:#?}");
    let json = db
        .cli(&["--json", "keys", "list", "--limit", "3"])
        .ok()
        .json();
    let next = json["next"].as_str().expect("where the next page starts");
    let rest = db
        .cli(&["--json", "keys", "list", "--after", next])
        .ok()
        .json();
    assert_eq!(rest["keys"].as_array().map(Vec::len), Some(1), "{rest}");
    assert_eq!(rest["more"], false);
    assert!(rest.get("next").is_none(), "{rest}");
    db.cli(&["keys", "list", "--after", "yesterday"]).exit(2);
    let run = db.cli(&["keys", "list", "--before", "1h"]).ok();
    assert_eq!(run.stdout, "no keys match\n");
    db.cli(&["keys", "list", "--since", "yesterday"]).exit(2);

    // keys show
    let run = db.cli(&["keys", "show", "charge:order-1"]).ok();
    for expected in [
        "charge:order-1",
        &hex(&JobKey::new("charge:order-1").digest()),
        "never",
        "result stored       yes",
    ] {
        assert!(run.stdout.contains(expected), "{expected}: {run:#?}");
    }
    let digest = hex(&JobKey::new("digest:ada").digest());
    let run = db
        .cli(&["--json", "keys", "show", "--digest", &digest])
        .ok();
    assert_eq!(run.json()["job"], "digest");
    assert_eq!(run.json()["lapsed"], true);
    assert!(run.json()["expires_at"].is_string());
    let run = db.cli(&["keys", "show", "charge:order-404"]).exit(1);
    assert!(
        run.stdout.is_empty() && run.stderr.contains("no key `charge:order-404`"),
        "{run:#?}"
    );
    db.cli(&["keys", "show", "--digest", "not-hex"]).exit(2);
    db.cli(&["keys", "show"]).exit(2);

    // What the next delivery of each key does. A run that claimed the key and never recorded its
    // result (a crash after its body's COMMIT; `ClaimNotTakenBack`) leaves a row that must not read
    // as a finished one: the next delivery runs the job. Before, nothing told it from a finished
    // run of a job that stores nothing ("lapsed: no, result stored: no"), nor said so in JSON.
    let run = db.cli(&["keys", "show", "charge:order-1"]).ok();
    assert!(
        run.stdout.contains("next delivery       replays"),
        "{run:#?}"
    );
    let run = db
        .cli(&["--json", "keys", "show", "--digest", &digest])
        .ok();
    assert_eq!(run.json()["next_delivery_runs"], true, "lapsed: {run:#?}");
    diesel::connection::SimpleConnection::batch_execute(
        &mut conn,
        "UPDATE done_jobs SET result = '' WHERE job_key = 'charge:order-2'",
    )
    .expect("an unfinished run's row");
    let run = db.cli(&["keys", "show", "charge:order-2"]).ok();
    assert!(
        run.stdout.contains("unfinished") && run.stdout.contains("next delivery       runs"),
        "{run:#?}"
    );
    let run = db.cli(&["--json", "keys", "show", "charge:order-2"]).ok();
    assert_eq!(run.json()["unfinished"], true, "{run:#?}");
    assert_eq!(run.json()["next_delivery_runs"], true, "{run:#?}");
    let run = db.cli(&["keys", "list", "--job", "charge"]).ok();
    assert!(run.stdout.contains("unfinished"), "{run:#?}");
    // (That the next delivery then runs the job: truth::a_claim_committed_without_its_result_is_
    // finished_by_the_next_delivery, in the runtime's tests.)

    // jobs
    let run = db.cli(&["--json", "jobs"]).ok();
    let jobs: BTreeMap<String, (u64, u64)> = run.json()["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| {
            let n = |f: &str| j[f].as_u64().expect("a count");
            (
                j["job"].as_str().expect("job").to_owned(),
                (n("keys"), n("lapsed")),
            )
        })
        .collect();
    assert_eq!(
        jobs,
        BTreeMap::from([
            ("charge".to_owned(), (2, 0)),
            ("digest".to_owned(), (1, 1)),
            ("hook".to_owned(), (1, 0)),
        ])
    );
    let run = db.cli(&["jobs"]).ok();
    assert!(run.stdout.starts_with("JOB "), "{run:#?}");
    assert!(run.stdout.contains("charge"), "{run:#?}");

    // outbox
    let run = db.cli(&["outbox", "pending"]).ok();
    for expected in [
        receipt_ids[0].as_str(),
        &receipt_ids[1],
        "receipt",
        "charge:order-1",
        r#"{"order":1}"#,
        "outbox: 2 pending, 0 leased, 0 delivered, 1 parked",
    ] {
        assert!(run.stdout.contains(expected), "{expected}: {run:#?}");
    }
    assert!(!run.stdout.contains(&parked_id), "{run:#?}");
    let run = db
        .cli(&["--json", "outbox", "pending", "--limit", "1"])
        .ok();
    let pending = run.json();
    assert_eq!(
        pending["messages"][0]["message_id"],
        receipt_ids[0].as_str()
    );
    assert_eq!(
        pending["messages"][0]["payload"],
        serde_json::json!({ "order": 1 })
    );
    assert_eq!(pending["more"], true);
    assert_eq!(pending["counts"]["parked"], 1);
    let run = db.cli(&["outbox", "parked"]).ok();
    assert!(
        run.stdout.contains(&parked_id) && run.stdout.contains("HTTP 503 from the partner"),
        "{run:#?}"
    );
    let run = db
        .cli(&["outbox", "retry", "--message-id", "msg_404"])
        .exit(1);
    assert!(run.stderr.contains("no parked message"), "{run:#?}");
    db.cli(&["outbox", "retry"]).exit(2);
    let run = db
        .cli(&["outbox", "retry", "--message-id", &parked_id])
        .ok();
    assert!(run.stdout.starts_with("un-parked 1 message"), "{run:#?}");
    assert!(outbox::parked(&mut conn).expect("parked").is_empty());
    assert_eq!(outbox::unsent(&mut conn, 10).expect("unsent").len(), 3);
    let run = db.cli(&["--json", "outbox", "retry", "--all"]).ok();
    assert_eq!(run.json()["retried"], 0);
    let run = db.cli(&["outbox", "parked"]).ok();
    assert!(run.stdout.starts_with("no parked messages"), "{run:#?}");

    // prune
    assert_eq!(key_count(&mut conn), 4);
    let run = db.cli(&["prune", "--dry-run"]).ok();
    assert!(
        run.stdout
            .starts_with("dry run: 1 lapsed key would be deleted; nothing was deleted"),
        "{run:#?}"
    );
    let run = db.cli(&["--json", "prune", "--dry-run"]).ok();
    assert_eq!(run.json()["lapsed"], 1);
    assert_eq!(key_count(&mut conn), 4, "a dry run deletes nothing");
    let run = db.cli(&["--json", "prune", "--batch-size", "1"]).ok();
    assert_eq!(run.json()["removed"], 1, "{run:#?}");
    assert!(
        keys::lookup(&mut conn, &JobKey::new("digest:ada"))
            .expect("lookup")
            .is_none()
    );
    assert_eq!(key_count(&mut conn), 3);
    let run = db.cli(&["prune"]).ok();
    assert_eq!(run.stdout, "deleted 0 lapsed keys in 1 batch\n");

    // keys forget
    let key1 = JobKey::new("charge:order-1");
    let run = db.cli(&["keys", "forget", "charge:order-1"]).exit(2);
    assert!(
        run.stderr.contains("stdin is not a terminal") && run.stderr.contains("--yes"),
        "{run:#?}"
    );
    assert!(
        keys::lookup(&mut conn, &key1).expect("lookup").is_some(),
        "refused: still there"
    );
    let run = db
        .cli(&["keys", "forget", "charge:order-404", "--yes"])
        .exit(1);
    assert!(run.stderr.contains("nothing was changed"), "{run:#?}");
    assert_eq!(key_count(&mut conn), 3);

    let run = db
        .cli(&[
            "keys",
            "forget",
            "charge:order-1",
            "--yes",
            "--reason",
            "ticket 4711",
        ])
        .ok();
    assert!(
        run.stdout
            .starts_with("forgot key `charge:order-1` of job `charge`"),
        "{run:#?}"
    );
    assert!(
        run.stderr.contains("audit: forgot a key") && run.stderr.contains("ticket 4711"),
        "the runtime's record of the forget, with the reason: {run:#?}"
    );
    assert!(keys::lookup(&mut conn, &key1).expect("lookup").is_none());
    let (outcome, ran) = charge(&mut conn, 1);
    assert!(
        ran && matches!(outcome, Outcome::Ran(42)),
        "forgotten: the job runs again"
    );

    let digest2 = hex(&JobKey::new("charge:order-2").digest());
    let run = db
        .cli(&["--json", "keys", "forget", "--digest", &digest2, "--yes"])
        .ok();
    assert_eq!(run.json()["forgotten"], true);
    assert_eq!(run.json()["key"]["key"], "charge:order-2");
    assert!(
        run.json()["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("idempotent-jobs CLI"))
    );
    assert!(
        keys::lookup(&mut conn, &JobKey::new("charge:order-2"))
            .expect("lookup")
            .is_none()
    );

    // On a terminal, it asks; anything but yes changes nothing.
    let key3 = JobKey::new("hook:order-77");
    let run = db
        .cli_on_terminal("keys forget hook:order-77", "n\n")
        .exit(2);
    assert!(
        run.stdout
            .contains("Forget this key? The job's next delivery will run it again. [y/N]"),
        "{run:#?}"
    );
    assert!(
        keys::lookup(&mut conn, &key3).expect("lookup").is_some(),
        "declined: still there"
    );
    let run = db.cli_on_terminal("keys forget hook:order-77", "y\n").ok();
    assert!(
        run.stdout.contains("forgot key `hook:order-77`"),
        "{run:#?}"
    );
    assert!(keys::lookup(&mut conn, &key3).expect("lookup").is_none());
}

/// Wrong URLs: exit code 3, a message that names the database, and never its password.
fn cannot_connect<C: Backend>() {
    let password = "s3cret-Pw!";
    let wrong_urls: Vec<String> = match C::SERVER {
        Server::Sqlite => {
            let path = std::env::temp_dir().join(format!("{}-missing.db", unique_name()));
            let url = path.to_string_lossy().into_owned();
            let run = run_cli(&url, &["keys", "list"]).exit(3);
            assert!(run.stderr.contains("does not exist"), "{run:#?}");
            assert!(!path.exists(), "the CLI must not create a SQLite file");
            let run = run_cli(&format!("sqlite://{url}"), &["verify"]).exit(3);
            assert!(run.stderr.contains("does not exist"), "{run:#?}");
            let garbage = std::env::temp_dir().join(format!("{}-garbage.db", unique_name()));
            std::fs::write(&garbage, "not a database, whatever its name says").expect("writing");
            let run = run_cli(&garbage.to_string_lossy(), &["jobs"]).exit(3);
            let _ = std::fs::remove_file(&garbage);
            assert!(run.stderr.contains("cannot connect"), "{run:#?}");
            return;
        }
        Server::Postgres => vec![
            format!("postgres://postgres:{password}@127.0.0.1:1/test"),
            format!("postgresql://postgres:{password}@127.0.0.1:5432/no_such_database_here"),
        ],
        Server::Mysql => vec![
            format!("mysql://root:{password}@127.0.0.1:1/test"),
            format!("mysql://root:{password}@127.0.0.1:3306/no_such_database_here"),
        ],
    };
    // The server itself is up: otherwise this test would pass for the wrong reason.
    drop(C::open(&C::SERVER.base_url()));
    for url in wrong_urls {
        let run = run_cli(&url, &["keys", "list"]).exit(3);
        assert!(
            run.stderr
                .starts_with("error: cannot connect to the database at ")
                && run.stderr.contains(":***@127.0.0.1"),
            "{run:#?}"
        );
        assert!(
            !run.stderr.contains(password) && !run.stdout.contains(password),
            "{run:#?}"
        );
        let run = run_cli(&url, &["--help"]).ok();
        assert!(
            !run.stdout.contains(password),
            "--help must not show DATABASE_URL"
        );
    }
}

static INVOICE: idempotent_runtime::Job =
    idempotent_runtime::Job::new("invoice", "invoice:<month>:<customer_id>");
static WELCOME: idempotent_runtime::Job = idempotent_runtime::Job::new("welcome", "welcome:<name>");

/// A key of `invoice:<month>:<customer_id>`, escaped as the handler's companion escapes it.
fn invoice_key(month: &str, customer: &str) -> JobKey {
    JobKey::builder()
        .text("invoice:")
        .value(month)
        .text(":")
        .value(customer)
        .build()
        .expect("a valid template")
}

/// A key typed from a handler's values by hand, not found: the message shows the form looked
/// for, how values are escaped, and the stored keys of the same job nearest to it; the same key
/// built from the template and values is found.
fn escaped_keys<C: Backend>() {
    let db = TestDb::empty::<C>();
    let mut conn: C = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    for (month, customer) in [
        ("a:b", "c"),
        ("a", "b:c"),
        ("2026-10", "cust_481"),
        ("2026-11", "x"),
    ] {
        let _: Outcome<()> =
            idempotent_runtime::run(&mut conn, &INVOICE, &invoice_key(month, customer), |_| {
                Ok::<_, Error>(())
            })
            .expect("running the invoice job");
    }
    assert!(charge(&mut conn, 1).1);
    assert_eq!(invoice_key("a:b", "c").as_str(), "invoice:a%3Ab:c");

    let run = db.cli(&["keys", "show", "invoice:a:b:c"]).exit(1);
    let hint = &run.stderr;
    for expected in [
        "no key `invoice:a:b:c` in done_jobs",
        "looked for: invoice:a:b:c (digest ",
        "%3A",
        "--template",
        "nearest keys of job `invoice`:",
        "    invoice:a%3Ab:c  (reads invoice:a:b:c decoded: the key looked for, escaped)",
        "    invoice:a:b%3Ac  (reads invoice:a:b:c decoded: the key looked for, escaped)",
    ] {
        assert!(hint.contains(expected), "{expected}: {run:#?}");
    }
    assert!(
        !hint.contains("charge:"),
        "only the keys of the same job: {run:#?}"
    );
    assert!(run.stdout.is_empty(), "{run:#?}");
    let run = db
        .cli(&["keys", "forget", "invoice:2026-10:cust_482", "--yes"])
        .exit(1);
    assert!(
        run.stderr.contains("nothing was changed")
            && run.stderr.contains("    invoice:2026-10:cust_481"),
        "{run:#?}"
    );

    // Built from the template and the values, as the handler builds it: found.
    let template = "invoice:<month>:<customer_id>";
    let run = db
        .cli(&[
            "--json",
            "keys",
            "show",
            "--template",
            template,
            "--value",
            "a:b",
            "--value",
            "c",
        ])
        .ok();
    assert_eq!(run.json()["key"], "invoice:a%3Ab:c", "{run:#?}");
    let run = db
        .cli(&["keys", "show", "--template", template, "--value", "a"])
        .exit(2);
    assert!(run.stderr.contains("<month>, <customer_id>"), "{run:#?}");
    db.cli(&["keys", "show", "x", "--value", "a"]).exit(2);
    let run = db
        .cli(&[
            "keys",
            "forget",
            "--template",
            template,
            "--value",
            "a",
            "--value",
            "b:c",
            "--yes",
        ])
        .ok();
    assert!(
        run.stdout.contains("forgot key `invoice:a:b%3Ac`"),
        "{run:#?}"
    );

    // Wide characters: the columns after KEY start at one terminal column on every line.
    for name in ["東京", "🎉🎉", "plain"] {
        let _: Outcome<()> = idempotent_runtime::run(
            &mut conn,
            &WELCOME,
            &JobKey::builder()
                .text("welcome:")
                .value(name)
                .build()
                .expect("a key"),
            |_| Ok::<_, Error>(()),
        )
        .expect("running the welcome job");
    }
    let run = db.cli(&["keys", "list", "--job", "welcome"]).ok();
    let starts: Vec<usize> = run
        .stdout
        .lines()
        .map(|line| {
            let at = line
                .find("20")
                .unwrap_or_else(|| line.find("DONE").unwrap_or(0));
            unicode_width::UnicodeWidthStr::width(&line[..at])
        })
        .collect();
    assert_eq!(starts.len(), 4, "{run:#?}");
    assert!(
        starts.iter().all(|s| *s == starts[0]),
        "{starts:?}: {}",
        run.stdout
    );

    // A key given to `JobKey::new` with a control character is stored (and listed) with it
    // escaped: the text `keys list` prints finds it, as the README promises. Before, `keys show`
    // and `keys forget` with that text said no run holds it (exit 1), the hint naming the very
    // key looked for.
    let _: Outcome<()> =
        idempotent_runtime::run(&mut conn, &WELCOME, &JobKey::new("welcome:a\tb"), |_| {
            Ok::<_, Error>(())
        })
        .expect("running the welcome job");
    let run = db.cli(&["keys", "list", "--job", "welcome"]).ok();
    assert!(run.stdout.contains("welcome:a%09b"), "{run:#?}");
    let run = db.cli(&["keys", "show", "welcome:a%09b"]).ok();
    assert!(run.stdout.contains("welcome:a%09b"), "{run:#?}");
    let run = db.cli(&["keys", "forget", "welcome:a%09b", "--yes"]).ok();
    assert!(run.stdout.contains("forgot key"), "{run:#?}");
    assert!(
        keys::lookup(&mut conn, &JobKey::new("welcome:a\tb"))
            .expect("a look-up")
            .is_none(),
        "forgotten"
    );
}

#[test]
fn sqlite_escaped_keys() {
    escaped_keys::<SqliteConnection>();
}

#[test]
fn postgres_escaped_keys() {
    escaped_keys::<PgConnection>();
}

#[test]
fn mysql_escaped_keys() {
    escaped_keys::<MysqlConnection>();
}

/// The job of [`keys_as_printed`]'s keys.
static LONG: idempotent_runtime::Job = idempotent_runtime::Job::new("long", "long:<x>");

/// A key is found by the text `keys list` prints for it, escapes and all (`\\` for a backslash,
/// `\u{200b}` for a character drawn as nothing), as the README promises; one that holds a
/// backslash is found as given too. Before, `keys show` and `keys forget` with the printed text
/// said no run holds the key (exit 1), and the hint showed escaped keys without saying so.
fn keys_as_printed<C: Backend>() {
    let db = TestDb::empty::<C>();
    let mut conn: C = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    let stored = [
        "long:C:\\tmp\\x0",
        "long:zw\u{200b}sp0",
        "long:two\\\\slashes",
    ];
    for key in stored {
        let _: Outcome<()> =
            idempotent_runtime::run(&mut conn, &LONG, &JobKey::new(key), |_| Ok::<_, Error>(()))
                .expect("running the long job");
    }
    let run = db.cli(&["keys", "list", "--job", "long"]).ok();
    let printed: Vec<&str> = run
        .stdout
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect();
    for expected in [
        "long:C:\\\\tmp\\\\x0",
        "long:zw\\u{200b}sp0",
        "long:two\\\\\\\\slashes",
    ] {
        assert!(printed.contains(&expected), "{expected}: {run:#?}");
    }
    for text in &printed {
        let run = db.cli(&["keys", "show", text]).ok();
        assert!(
            run.stdout.contains(&format!("{:<19} {text}\n", "key")),
            "{run:#?}"
        );
    }
    // As stored, too: a backslash is a backslash.
    for key in ["long:C:\\tmp\\x0", "long:two\\\\slashes"] {
        db.cli(&["keys", "show", key]).ok();
    }
    // The hint says its keys are printed escaped, as `keys list` prints them.
    let run = db.cli(&["keys", "show", "long:zw\\u{200b}sp1"]).exit(1);
    assert!(
        run.stderr.contains("long:zw\\u{200b}sp0")
            && run.stderr.contains("escaped as `keys list` prints them"),
        "{run:#?}"
    );
    let run = db
        .cli(&["keys", "forget", "long:zw\\u{200b}sp0", "--yes"])
        .ok();
    assert!(run.stdout.contains("forgot key"), "{run:#?}");
    assert!(
        keys::lookup(&mut conn, &JobKey::new("long:zw\u{200b}sp0"))
            .expect("a look-up")
            .is_none(),
        "forgotten"
    );
    // A text that names one key as given and another as `keys list` prints it: which one is
    // meant, only the operator knows. Before, `forget --yes` forgot the first silently.
    for key in ["long:C:\\tmp", "long:C:\\\\tmp"] {
        let _: Outcome<()> =
            idempotent_runtime::run(&mut conn, &LONG, &JobKey::new(key), |_| Ok::<_, Error>(()))
                .expect("running the long job");
    }
    for args in [
        &["keys", "show", "long:C:\\\\tmp"][..],
        &["keys", "forget", "long:C:\\\\tmp", "--yes"][..],
    ] {
        let run = db.cli(args).exit(2);
        assert!(
            run.stderr.contains("names two keys") && run.stderr.contains("--digest"),
            "{run:#?}"
        );
    }
    for key in ["long:C:\\tmp", "long:C:\\\\tmp"] {
        assert!(
            keys::lookup(&mut conn, &JobKey::new(key))
                .expect("a look-up")
                .is_some(),
            "{key}: nothing forgotten"
        );
    }
}

#[test]
fn sqlite_keys_as_printed() {
    keys_as_printed::<SqliteConnection>();
}

#[test]
fn postgres_keys_as_printed() {
    keys_as_printed::<PgConnection>();
}

#[test]
fn mysql_keys_as_printed() {
    keys_as_printed::<MysqlConnection>();
}

/// A prune stopped by SIGTERM or SIGINT stops after the batch under way, says how many keys it
/// deleted and committed, and exits 5, as a prune that fails after committed batches does; the
/// count is the rows it removed. Before, the signal ended it at once: nothing printed, exit 143,
/// and 105 rows deleted that no one was told of.
#[cfg(unix)]
#[test]
fn a_stopped_prune_says_what_it_committed() {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    use std::process::{Command, Stdio};

    const LAPSED: usize = 2_000;
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    // The counts below are read while the prune writes: wait for its write lock, not fail.
    conn.batch_execute("PRAGMA busy_timeout = 10000")
        .expect("a busy timeout");
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    conn.transaction(|conn| {
        for user in 0..LAPSED {
            let _: Outcome<()> = idempotent_runtime::run(
                conn,
                &DIGEST,
                &JobKey::new(format!("digest:{user}")),
                |_| Ok::<_, Error>(()),
            )
            .expect("running the digest job");
        }
        Ok::<_, diesel::result::Error>(())
    })
    .expect("lapsed keys");
    let mut left = key_count_all(&mut conn);
    assert_eq!(left, LAPSED);
    for signal in ["TERM", "INT"] {
        let child = Command::new(BIN)
            .args(["prune", "--batch-size", "5", "--pace", "30"])
            .env("DATABASE_URL", &db.url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running the idempotent-jobs binary");
        // Once a batch has committed, the prune is under way (and catching signals).
        let started = std::time::Instant::now();
        while key_count_all(&mut conn) == left && started.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(sent.success(), "kill -{signal}");
        let output = child.wait_with_output().expect("waiting for the prune");
        let run = Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        let removed = left - key_count_all(&mut conn);
        left -= removed;
        assert!(
            removed > 0 && left > 0,
            "{signal}: {removed} removed: {run:#?}"
        );
        assert_eq!(run.code, 5, "{signal}: {run:#?}");
        assert!(
            run.stderr.starts_with(&format!(
                "error: prune stopped by SIG{signal} after the batch under way: deleted {removed} lapsed keys in "
            )) && run.stderr.contains("committed"),
            "{signal}: {removed} removed: {run:#?}"
        );
    }
}

/// How many keys `done_jobs` holds, lapsed or not.
fn key_count_all(conn: &mut SqliteConnection) -> usize {
    keys::job_counts(conn)
        .expect("counting keys")
        .iter()
        .map(|count| count.keys as usize)
        .sum()
}

#[test]
fn completions_need_no_database() {
    for (shell, expected) in [
        ("bash", "complete -F _idempotent__jobs"),
        ("zsh", "#compdef idempotent-jobs"),
        ("fish", "complete -c idempotent-jobs"),
    ] {
        let run = Cli::new().run(&["completions", shell]).ok();
        assert!(
            run.stdout.contains(expected) && run.stdout.contains("forget"),
            "{shell}: {run:#?}"
        );
    }
    Cli::new().run(&["completions", "tcsh"]).exit(2);
}

#[test]
fn the_url_comes_from_d_then_the_environment_then_dotenv() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    assert!(charge(&mut conn, 1).1);
    let missing = std::env::temp_dir().join(format!("{}-missing.db", unique_name()));
    let missing = missing.to_string_lossy().into_owned();

    // .env in a parent of the working directory.
    let dir = fresh_dir();
    let below = dir.join("service").join("src");
    std::fs::create_dir_all(&below).expect("creating directories");
    std::fs::write(
        dir.join(".env"),
        format!("# settings\nRUST_LOG=info\nDATABASE_URL=\"{}\"\n", db.url),
    )
    .expect("writing .env");
    let run = Cli::new().dir(&below).run(&["keys", "list"]).ok();
    assert!(
        run.stdout.contains("charge:order-1"),
        "read from .env: {run:#?}"
    );
    // The environment wins over .env, and -D over both.
    let run = Cli::new()
        .dir(&below)
        .env("DATABASE_URL", &missing)
        .run(&["keys", "list"])
        .exit(3);
    assert!(run.stderr.contains("does not exist"), "{run:#?}");
    let run = Cli::new()
        .dir(&below)
        .env("DATABASE_URL", &missing)
        .run(&["-D", &db.url, "keys", "list"])
        .ok();
    assert!(run.stdout.contains("charge:order-1"), "{run:#?}");
    // A .env that does not parse is ignored whole, with a warning naming the file.
    std::fs::write(
        dir.join(".env"),
        format!("DATABASE_URL={}\nNOT A PAIR\n", db.url),
    )
    .expect("writing .env");
    let run = Cli::new().dir(&below).run(&["keys", "list"]).exit(2);
    assert!(
        run.stderr.contains("warning: ignored ")
            && run.stderr.contains(".env")
            && run.stderr.contains("entry 2"),
        "{run:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sqlite_operate() {
    operate::<SqliteConnection>();
}

#[test]
fn postgres_operate() {
    operate::<PgConnection>();
}

#[test]
fn mysql_operate() {
    operate::<MysqlConnection>();
}

#[test]
fn sqlite_cannot_connect() {
    cannot_connect::<SqliteConnection>();
}

#[test]
fn postgres_cannot_connect() {
    cannot_connect::<PgConnection>();
}

#[test]
fn mysql_cannot_connect() {
    cannot_connect::<MysqlConnection>();
}

#[test]
fn help_documents_the_exit_codes_and_a_missing_url_is_bad_usage() {
    let run = Cli::new().run(&["--help"]).ok();
    let help = &run.stdout;
    for line in [
        "0  success",
        "1  not found",
        "2  bad usage",
        "3  cannot connect",
        "4  the database lacks the runtime's tables",
        "5  any other database error",
        "6  the key changed since it was read",
    ] {
        assert!(help.contains(line), "{line}: {help}");
    }
    let run = Cli::new().run(&["keys", "list"]).exit(2);
    assert!(run.stderr.contains("DATABASE_URL"), "{run:#?}");
}

/// The rows of the README's exit-code table: code and meaning.
fn readme_exit_codes() -> BTreeMap<i32, String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("reading idempotent-cli/README.md");
    let section = readme
        .split("\n## Exit codes\n")
        .nth(1)
        .expect("a section `## Exit codes` in the README");
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| {
            let mut cells = line.strip_prefix('|')?.split('|');
            let code = cells.next()?.trim().parse().ok()?;
            Some((code, cells.next()?.trim().to_owned()))
        })
        .collect()
}

/// `keys forget KEY` on a terminal, renewing the key (a run of its lapsed key) while the CLI asks,
/// then answering yes.
fn forget_renewed_while_asked(db: &TestDb, key: &str) -> Run {
    use std::io::{Read, Write};
    let mut child = std::process::Command::new("script")
        .args(["-qec", &format!("{BIN} keys forget {key}"), "/dev/null"])
        .env("DATABASE_URL", &db.url)
        .current_dir(empty_dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running `script` (util-linux) to give the CLI a terminal");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut shown = Vec::new();
    let mut chunk = [0_u8; 4096];
    while !String::from_utf8_lossy(&shown).contains("[y/N]") {
        let n = stdout.read(&mut chunk).expect("reading the CLI's terminal");
        assert!(
            n > 0,
            "the CLI ended without asking: {}",
            String::from_utf8_lossy(&shown)
        );
        shown.extend_from_slice(&chunk[..n]);
    }
    let mut conn: SqliteConnection = db.connect();
    let _: Outcome<u32> = idempotent_runtime::run(&mut conn, &DIGEST, &JobKey::new(key), |_conn| {
        Ok::<_, Error>(2)
    })
    .expect("renewing the lapsed key");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"y\n").expect("answering yes");
    drop(stdin);
    stdout.read_to_end(&mut shown).expect("reading the rest");
    let status = child.wait().expect("waiting for `script`");
    Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&shown).into_owned(),
        stderr: String::new(),
    }
}

/// The README's table of exit codes is what the binary does: each code it lists is the code of a
/// command run here, the row says what that command met, and no command run here exits with a
/// code the table lacks. `--help` lists the same codes.
#[test]
fn the_readme_exit_code_table_is_what_commands_exit_with() {
    use diesel::connection::SimpleConnection;

    let table = readme_exit_codes();
    let db = TestDb::empty::<SqliteConnection>();
    let ro = format!("file:{}?mode=ro", db.url);
    let missing = std::env::temp_dir().join(format!("{}-missing.db", unique_name()));
    let missing = missing.to_string_lossy().into_owned();
    // (code, words of its row, the run): the row must contain the words.
    let mut seen: Vec<(i32, &str, Run)> = Vec::new();

    seen.push((4, "missing", db.cli(&["keys", "list"])));
    db.cli(&["migrate"]).ok();
    let mut conn: SqliteConnection = db.connect();
    let _ = charge(&mut conn, 1);
    let _: Outcome<u32> =
        idempotent_runtime::run(&mut conn, &DIGEST, &JobKey::new("digest:ada"), |_conn| {
            Ok::<_, Error>(1)
        })
        .expect("a lapsed key");
    park_hook(&mut conn);
    let parked = outbox::counts(&mut conn).expect("counts").parked;
    seen.push((0, "success", db.cli(&["verify"])));
    seen.push((
        1,
        "does not exist",
        db.cli(&["keys", "show", "charge:order-404"]),
    ));
    seen.push((
        1,
        "outbox message",
        db.cli(&["outbox", "retry", "--message-id", "no-such-id"]),
    ));
    seen.push((
        2,
        "bad usage",
        db.cli(&["keys", "list", "--since", "yesterday"]),
    ));
    seen.push((2, "no database given", Cli::new().run(&["jobs"])));
    seen.push((
        2,
        "confirmation",
        db.cli(&["keys", "forget", "charge:order-1"]),
    ));
    #[cfg(feature = "serve")]
    seen.push((
        2,
        "`serve` without a token",
        Cli::new()
            .env("DATABASE_URL", &db.url)
            .env("IDEMPOTENT_DASHBOARD_TOKEN", "short")
            .run(&["serve"]),
    ));
    seen.push((3, "SQLite file missing", run_cli(&missing, &["jobs"])));
    seen.push((3, "unknown scheme", run_cli("mongodb://db/x", &["jobs"])));
    seen.push((4, "read-only", run_cli(&ro, &["verify"])));
    seen.push((5, "read-only", run_cli(&ro, &["prune"])));
    assert_eq!(key_count(&mut conn), 3, "the refused prune deleted nothing");
    seen.push((6, "renewed", forget_renewed_while_asked(&db, "digest:ada")));
    assert!(
        keys::lookup(&mut conn, &JobKey::new("digest:ada"))
            .expect("lookup")
            .is_some(),
        "the renewed key is left"
    );

    conn.batch_execute(
        "INSERT INTO idempotent_schema (version, description, applied_at) \
         VALUES (99, 'a future release', CURRENT_TIMESTAMP)",
    )
    .expect("recording a future version");
    seen.push((4, "newer release", db.cli(&["prune"])));
    seen.push((4, "newer release", db.cli(&["outbox", "retry", "--all"])));
    seen.push((
        4,
        "newer release",
        db.cli(&["keys", "forget", "charge:order-1", "--yes"]),
    ));
    assert_eq!(
        key_count(&mut conn),
        3,
        "the refused writes changed nothing"
    );
    assert_eq!(outbox::counts(&mut conn).expect("counts").parked, parked);
    seen.push((0, "warning", db.cli(&["jobs"])));

    // Every mismatch at once: the table is fixed in one go.
    let mut wrong = Vec::new();
    for (code, words, run) in &seen {
        match table.get(code) {
            _ if run.code != *code => wrong.push(format!(
                "expected exit code {code} ({words}), got {}: {run:#?}",
                run.code
            )),
            None => wrong.push(format!("the table has no row for exit code {code}")),
            Some(row) if !row.contains(words) => {
                wrong.push(format!("the row of {code} does not say {words:?}: {row}"));
            }
            Some(_) => {}
        }
    }
    for code in table.keys() {
        if !seen.iter().any(|(c, _, _)| c == code) {
            wrong.push(format!(
                "the table lists exit code {code}, which no command here exits with"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the README's exit codes:\n{}",
        wrong.join("\n")
    );
    let help = Cli::new().run(&["--help"]).ok().stdout;
    let listed: Vec<i32> = help
        .split("Exit codes:")
        .nth(1)
        .expect("--help lists the exit codes")
        .lines()
        .filter_map(|line| {
            line.strip_prefix("  ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(
        listed,
        table.keys().copied().collect::<Vec<_>>(),
        "--help and the README list the same codes"
    );
}

/// Pages of `keys list --since 1h` never skip a key: the hint for the next page gives the time
/// `1h` meant, not `1h` again. Before, the next page read `1h` against the clock of its own run, a
/// few seconds later, and a key that had grown older than an hour in between (done 59m57s before
/// the first page) was on no page, though it matched the first page's query. The same in JSON
/// (`since`).
#[test]
fn pages_of_a_relative_since_skip_no_key() {
    let db = TestDb::empty::<SqliteConnection>();
    db.cli(&["migrate"]).ok();
    let mut conn: SqliteConnection = db.connect();
    keys_done_almost_an_hour_ago(&mut conn, &WELCOME);
    let first = db
        .cli(&["keys", "list", "--since", "1h", "--limit", "1"])
        .ok();
    assert!(first.stdout.contains("welcome:newer"), "{first:#?}");
    let hint = first
        .stdout
        .split("the same command with ")
        .nth(1)
        .expect("a hint for the next page")
        .trim()
        .trim_end_matches(')')
        .to_owned();
    let json = db
        .cli(&["--json", "keys", "list", "--since", "1h", "--limit", "1"])
        .ok()
        .json();
    // The since this page used, as a time (before: absent, and a user passed `1h` again).
    let since = json["since"].as_str().unwrap_or("1h").to_owned();
    let next = json["next"]
        .as_str()
        .expect("where the next page starts")
        .to_owned();
    std::thread::sleep(std::time::Duration::from_secs(5));
    // The same command, each option the hint names set to the hint's value.
    let mut args: Vec<String> = ["keys", "list", "--since", "1h", "--limit", "1"]
        .map(str::to_owned)
        .to_vec();
    let words: Vec<&str> = hint.split(' ').collect();
    for pair in words.chunks(2) {
        let [flag, value] = pair else {
            panic!("the hint names options and their values: {hint}")
        };
        match args.iter().position(|arg| arg == flag) {
            Some(at) => args[at + 1] = (*value).to_owned(),
            None => args.extend([(*flag).to_owned(), (*value).to_owned()]),
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let second = db.cli(&args).ok();
    assert!(
        second.stdout.contains("welcome:older"),
        "the key done 59m57s before the first page is on the next: {second:#?} (hint: {hint})"
    );
    let second = db
        .cli(&[
            "--json", "keys", "list", "--limit", "1", "--since", &since, "--after", &next,
        ])
        .ok()
        .json();
    assert_eq!(
        second["keys"][0]["key"], "welcome:older",
        "{second} (since {since})"
    );
}

static RESET_LINK: idempotent_runtime::Job =
    idempotent_runtime::Job::new("reset", "reset-link:<query>");
static WEBHOOK: idempotent_runtime::Job = idempotent_runtime::Job::new("webhook", "hook:<url>");

/// A key not found is answered with the stored keys nearest to it exactly as stored (as `keys
/// list` prints them), also where they read like a secret (`password=...`, a URL's user info):
/// the secret scrubber is for the database URL's password, not for what the tables hold. Given as
/// printed, each is found.
#[test]
fn a_key_not_found_names_the_nearest_keys_as_stored_even_when_they_look_secret() {
    let db = TestDb::empty::<SqliteConnection>();
    db.cli(&["migrate"]).ok();
    let mut conn: SqliteConnection = db.connect();
    let stored = [
        (
            &RESET_LINK,
            "reset-link:password=hunter2",
            "reset-link:password=hunter3",
        ),
        (
            &WEBHOOK,
            "hook:https://bob:tiger5@example.com/x",
            "hook:https://bob:tiger5@example.com/y",
        ),
    ];
    for (job, key, _) in stored {
        let _: Outcome<()> =
            idempotent_runtime::run(&mut conn, job, &JobKey::new(key), |_| Ok::<_, Error>(()))
                .expect("running the job");
    }
    let listed = db.cli(&["keys", "list"]).ok();
    for (_, key, mistyped) in stored {
        assert!(listed.stdout.contains(key), "{listed:#?}");
        for args in [
            &["keys", "show", mistyped][..],
            &["keys", "forget", mistyped, "--yes"],
        ] {
            let run = db.cli(args).exit(1);
            assert!(
                run.stderr
                    .starts_with(&format!("error: no key `{mistyped}` in done_jobs")),
                "{args:?}: the key looked for, as given: {run:#?}"
            );
            assert!(
                run.stderr.contains(&format!("\n    {key}")),
                "{args:?}: the nearest key as stored: {run:#?}"
            );
            assert!(!run.stderr.contains("***"), "{args:?}: {run:#?}");
        }
        // Each nearest key, given as the message printed it, is the key.
        let run = db.cli(&["keys", "show", key]).ok();
        assert!(run.stdout.contains(key), "{run:#?}");
    }
}

/// `--json migrate` whose check after the migration finds the tables not ready for this session
/// prints its document (`ok: false` and each problem) on stdout, as `verify --json` does, and
/// exits 4; the README's Output section says so.
#[test]
fn a_json_migrate_that_finds_problems_prints_them_as_the_readme_says() {
    let db = TestDb::empty::<PgConnection>();
    db.cli(&["migrate"]).ok();
    // The URL's options end it: the session's transactions are read-only.
    let read_only = format!("{}%20-cdefault_transaction_read_only%3Don", db.url);
    let run = run_cli(&read_only, &["--json", "migrate"]).exit(4);
    let document = run.json();
    assert_eq!(document["ok"], false, "{run:#?}");
    assert!(
        document["problems"]
            .as_array()
            .is_some_and(|problems| !problems.is_empty()),
        "{run:#?}"
    );
    assert!(run.stderr.starts_with("error: migrate found"), "{run:#?}");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("reading idempotent-cli/README.md");
    let output = readme
        .split("\n### Output\n")
        .nth(1)
        .and_then(|section| section.split("\n## ").next())
        .expect("a section `### Output` in the README");
    let sentence = output
        .split("when a command fails, stdout is empty")
        .nth(1)
        .and_then(|rest| rest.split(". ").next())
        .expect("the README's sentence on stdout when a command fails")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        sentence.contains("`verify --json`") && sentence.contains("`migrate --json`"),
        "the README names both commands whose failure prints a document: {sentence}"
    );
}

/// A role of a test's own with the workers' grants of docs/operating.md (no `DELETE`), dropped
/// at the end.
struct Worker {
    url: String,
    /// What drops the role or user, as the server's administrator.
    admin_url: String,
    server: Server,
    drop_sql: String,
    /// How a `GRANT` names it.
    grantee: String,
    /// How a `GRANT` names `done_jobs`.
    table: String,
}

impl Worker {
    fn create(db: &TestDb) -> Self {
        use diesel::connection::SimpleConnection;
        let name = format!("{}_w", unique_name());
        let password = "W5ecretPw";
        let base = db.server.base_url();
        let at = db.url.find('@').expect("a URL with a user");
        let after_scheme = db.url.find("://").expect("a URL") + 3;
        let url = format!(
            "{}{name}:{password}{}",
            &db.url[..after_scheme],
            &db.url[at..]
        );
        match db.server {
            Server::Postgres => {
                let schema = db
                    .url
                    .split("search_path%3D")
                    .nth(1)
                    .expect("the test's schema")
                    .to_owned();
                let mut admin = PgConnection::open(&base);
                admin
                    .batch_execute(&format!(
                        "CREATE ROLE {name} LOGIN PASSWORD '{password}';
                         GRANT USAGE ON SCHEMA {schema} TO {name};
                         GRANT SELECT ON {schema}.idempotent_schema TO {name};
                         GRANT SELECT, INSERT, UPDATE ON {schema}.done_jobs TO {name};
                         GRANT SELECT, INSERT, UPDATE ON {schema}.outbox TO {name};
                         GRANT USAGE ON SEQUENCE {schema}.outbox_id_seq TO {name};"
                    ))
                    .expect("creating the worker's role");
                Worker {
                    url,
                    admin_url: base,
                    server: db.server,
                    drop_sql: format!("DROP OWNED BY {name}; DROP ROLE {name}"),
                    grantee: name,
                    table: format!("{schema}.done_jobs"),
                }
            }
            Server::Mysql => {
                let database = db.url.rsplit('/').next().expect("the test's database");
                let mut admin = MysqlConnection::open(&base);
                let user = format!("'{name}'@'%'");
                let mut sql = format!(
                    "CREATE USER {user} IDENTIFIED BY '{password}';
                     GRANT SELECT ON {database}.idempotent_schema TO {user};
                     GRANT SELECT, INSERT, UPDATE ON {database}.done_jobs TO {user};
                     GRANT SELECT, INSERT, UPDATE ON {database}.outbox TO {user};"
                );
                for procedure in [
                    "idempotent_begin_job",
                    "idempotent_begin_and_claim",
                    "idempotent_finish_job",
                ] {
                    sql.push_str(&format!(
                        "GRANT EXECUTE ON PROCEDURE {database}.{procedure} TO {user};"
                    ));
                }
                admin
                    .batch_execute(&sql)
                    .expect("creating the worker's user");
                Worker {
                    url,
                    admin_url: base,
                    server: db.server,
                    drop_sql: format!("DROP USER {user}"),
                    grantee: user,
                    table: format!("`{database}`.`done_jobs`"),
                }
            }
            Server::Sqlite => unreachable!("SQLite has no roles"),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        use diesel::connection::SimpleConnection;
        match self.server {
            Server::Postgres => {
                if let Ok(mut admin) =
                    <PgConnection as diesel::Connection>::establish(&self.admin_url)
                {
                    let _ = admin.batch_execute(&self.drop_sql);
                }
            }
            Server::Mysql => {
                if let Ok(mut admin) =
                    <MysqlConnection as diesel::Connection>::establish(&self.admin_url)
                {
                    let _ = admin.batch_execute(&self.drop_sql);
                }
            }
            Server::Sqlite => {}
        }
    }
}

/// `prune` and `keys forget` with the workers' grants (no `DELETE` on `done_jobs`) exit 4, as the
/// exit-code table says of a role that may not use the tables, naming the grant to give; they do
/// not say that the next prune continues (it would meet the same refusal), and change nothing.
fn without_delete_the_grant_is_named<C: Backend>() {
    let db = TestDb::empty::<C>();
    db.cli(&["migrate"]).ok();
    let mut conn: C = db.connect();
    let _: Outcome<()> =
        idempotent_runtime::run(&mut conn, &DIGEST, &JobKey::new("digest:ada"), |_| {
            Ok::<_, Error>(())
        })
        .expect("running the digest job");
    assert!(charge(&mut conn, 1).1);
    let worker = Worker::create(&db);
    run_cli(&worker.url, &["verify"]).ok();
    let grant = format!("GRANT DELETE ON {} TO {}", worker.table, worker.grantee);
    for args in [
        &["prune"][..],
        &["--json", "prune"],
        &["keys", "forget", "charge:order-1", "--yes"],
    ] {
        let run = run_cli(&worker.url, args).exit(4);
        assert!(run.stdout.is_empty(), "{args:?}: {run:#?}");
        assert!(
            run.stderr.contains(&grant),
            "{args:?}: names `{grant}`: {run:#?}"
        );
        assert!(
            !run.stderr.contains("continues where this one stopped"),
            "{args:?}: a retry meets the same refusal: {run:#?}"
        );
        assert!(
            run.stderr.contains("nothing was changed")
                || run.stderr.contains("nothing was deleted"),
            "{args:?}: {run:#?}"
        );
        assert!(!run.stderr.contains("W5ecretPw"), "{args:?}: {run:#?}");
    }
    assert_eq!(key_count(&mut conn), 2, "nothing was deleted");
}

#[test]
fn postgres_prune_and_forget_without_delete_name_the_grant() {
    without_delete_the_grant_is_named::<PgConnection>();
}

#[test]
fn mysql_prune_and_forget_without_delete_name_the_grant() {
    without_delete_the_grant_is_named::<MysqlConnection>();
}
