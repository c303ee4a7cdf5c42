//! No password, in any form a database URL or connection string can hold it, appears in anything
//! the CLI prints: stdout and stderr of every command and every error path, on URLs it cannot
//! parse, on servers it cannot reach, on SQLite, PostgreSQL and MariaDB databases it works with,
//! and in clap's own messages.
//!
//! Every password here contains [`MARK`]; a run passes when `MARK` appears nowhere in its output,
//! so a fragment of a password (a driver echoing the part after a `/`) fails it too.

mod common;

use diesel::connection::SimpleConnection;
use diesel::{MysqlConnection, PgConnection, SqliteConnection};
use idempotent_runtime::JobKey;

use common::*;

/// In every password of these tests.
const MARK: &str = "Secret5";
/// A password.
const PASSWORD: &str = "TopSecret5";

/// Fails when the run printed any part of a password.
#[track_caller]
fn assert_hidden(run: &Run, what: &str) {
    assert!(
        !run.stdout.contains(MARK) && !run.stderr.contains(MARK),
        "{what}: the password was printed: {run:#?}"
    );
}

/// Runs `args` with the URL given three ways: `DATABASE_URL`, `-D URL`, and
/// `--database-url=URL`. None may print the password; returns the runs.
fn run_every_way(url: &str, args: &[&str]) -> Vec<Run> {
    let joined = format!("--database-url={url}");
    let ways: [(Option<&str>, Vec<&str>); 3] = [
        (Some(url), vec![]),
        (None, vec!["-D", url]),
        (None, vec![joined.as_str()]),
    ];
    let mut runs = Vec::new();
    for (env, mut all) in ways {
        all.extend_from_slice(args);
        let mut cli = Cli::new();
        if let Some(url) = env {
            cli = cli.env("DATABASE_URL", url);
        }
        let run = cli.run(&all);
        assert_hidden(&run, &format!("DATABASE_URL={env:?} {all:?}"));
        runs.push(run);
    }
    runs
}

/// [`run_every_way`] for a command that changes nothing: each way exits with `code`; returns the
/// first run.
fn each_way_exits(url: &str, args: &[&str], code: i32) -> Run {
    let mut runs = run_every_way(url, args);
    for run in &runs {
        assert_eq!(run.code, code, "{url} {args:?}: {run:#?}");
    }
    runs.swap_remove(0)
}

/// Every command, and the usage errors of each, on `url`; none may print the password. The
/// forget that succeeds comes last (it prints the audit line).
fn every_command(url: &str) {
    let digest = hex(&JobKey::new("charge:order-1").digest());
    let commands: &[&[&str]] = &[
        &["verify"],
        &["--json", "verify"],
        &["keys", "list"],
        &["--json", "keys", "list", "--job", "charge", "--since", "1d"],
        &["keys", "list", "--since", "yesterday"],
        &["keys", "show", "charge:order-1"],
        &["--json", "keys", "show", "--digest", &digest],
        &["keys", "show", "charge:order-404"],
        &["--json", "keys", "show", "charge:order-404"],
        &["keys", "show", "--digest", "not-hex"],
        &["keys", "forget", "charge:order-1"],
        &["keys", "forget", "charge:order-404", "--yes"],
        &["keys", "bogus"],
        &["jobs"],
        &["--json", "jobs"],
        &["outbox", "pending"],
        &["--json", "outbox", "pending", "--limit", "1"],
        &["outbox", "parked"],
        &["--json", "outbox", "parked"],
        &["outbox", "retry", "--message-id", "msg_404"],
        &["outbox", "retry"],
        &["prune", "--dry-run"],
        &["--json", "prune", "--dry-run"],
        &["--help"],
        &["keys", "--help"],
        &["keys", "forget", "--help"],
        &["--version"],
        &[
            "keys",
            "forget",
            "charge:order-2",
            "--yes",
            "--reason",
            "ticket 4711",
        ],
        &["--json", "keys", "forget", "charge:order-1", "--yes"],
        &["--json", "outbox", "retry", "--all"],
        &["prune"],
    ];
    for args in commands {
        run_every_way(url, args);
    }
}

/// Jobs with keys and outbox messages, one of them parked, so that every command has something
/// to print.
fn fill<C: Backend>(conn: &mut C) {
    idempotent_runtime::migrate(conn).expect("migrating");
    park_hook(conn);
    let _ = charge(conn, 1);
    let _ = charge(conn, 2);
}

/// `url` with `user:password@` as its user info (it has a user and no password).
fn with_password(url: &str, password: &str) -> String {
    let at = url.find('@').expect("a URL with a user");
    format!("{}:{password}{}", &url[..at], &url[at..])
}

#[test]
fn urls_that_cannot_be_used_print_no_password() {
    let unknown_schemes = [
        format!("postgress://u:{PASSWORD}@127.0.0.1:5432/test"),
        format!("postgre://u:{PASSWORD}@127.0.0.1/test"),
        format!("redis://:{PASSWORD}@127.0.0.1:6379/0"),
        format!("mssql://sa:{PASSWORD}@127.0.0.1/test?password={PASSWORD}"),
    ];
    for url in &unknown_schemes {
        let run = each_way_exits(url, &["keys", "list"], 3);
        for scheme in ["postgres://", "mysql://", "mariadb://", "sqlite://"] {
            assert!(
                run.stderr.contains(scheme),
                "names the schemes it knows: {run:#?}"
            );
        }
        assert!(!run.stderr.contains("SQLite database file"), "{run:#?}");
        each_way_exits(url, &["--json", "jobs"], 3);
    }
    // Nothing listens on port 1; these fail to connect, or to parse, each with exit code 3.
    let unusable = [
        format!("postgres://postgres:{PASSWORD}@127.0.0.1:1/test"),
        format!("postgres://postgres:Top/{MARK}@127.0.0.1:1/test"),
        format!("postgres://postgres:Top%zz{MARK}@127.0.0.1:1/test"),
        format!("postgres://postgres:Top?{MARK}@127.0.0.1:1/test"),
        format!("postgres://postgres:Top#{MARK}@127.0.0.1:1/test"),
        format!("postgres://postgres:Top@{MARK}@127.0.0.1:1/test"),
        format!("postgresql://postgres:{PASSWORD}@[::1/test"),
        format!("postgres://postgres:{PASSWORD}@127.0.0.1:port/test"),
        format!("postgres://127.0.0.1:1/test?user=postgres&password={PASSWORD}"),
        format!("postgres://127.0.0.1:1/test?user=postgres&PassWord=Top%2F{MARK}"),
        format!("postgres://postgres:{PASSWORD}@127.0.0.1:1/test?bogus_option=1"),
        format!("host=127.0.0.1 port=1 user=postgres password={PASSWORD} dbname=test"),
        format!("host=127.0.0.1 port=1 password = '{PASSWORD} with spaces'"),
        format!("host=127.0.0.1 port=1 password=Top {MARK}"),
        format!("host=127.0.0.1 port=1 password='{PASSWORD}"),
        format!("host=127.0.0.1 port=1 bogus={MARK} password={PASSWORD}"),
        format!("mysql://root:{PASSWORD}@127.0.0.1:1/test"),
        format!("mysql://root:Top/{MARK}@127.0.0.1:1/test"),
        format!("mysql://root:{PASSWORD}@127.0.0.1:1/test/extra"),
        format!("mysql://root:{PASSWORD}@127.0.0.1:1/test?ssl_mode=bogus"),
        format!("mariadb://root:{PASSWORD}@127.0.0.1:1/test"),
        format!("MariaDB://root:{PASSWORD}@127.0.0.1:1/test"),
        format!("sqlite://u:{PASSWORD}@localhost/no/such/dir/app.db"),
        format!("file:/no/such/dir/app.db?password={PASSWORD}"),
    ];
    for url in &unusable {
        let run = each_way_exits(url, &["keys", "list"], 3);
        assert!(run.stdout.is_empty(), "{run:#?}");
        each_way_exits(url, &["--json", "outbox", "parked"], 3);
    }
    // mariadb:// is MySQL's protocol, not a SQLite file name.
    let run = each_way_exits(&unusable[20], &["keys", "list"], 3);
    assert!(
        run.stderr.contains("mariadb://root:***@127.0.0.1:1/test")
            && !run.stderr.contains("SQLite"),
        "{run:#?}"
    );
}

#[test]
fn clap_messages_print_no_password() {
    let url = format!("postgres://postgres:{PASSWORD}@127.0.0.1:1/test");
    for args in [
        vec![url.as_str(), "keys", "list"],
        vec!["keys", "list", url.as_str()],
        vec!["keys", "show", "a", url.as_str()],
        vec!["--database-url", url.as_str(), "bogus"],
        vec!["-D", url.as_str(), "keys", "show"],
        vec!["-D", url.as_str(), "completions", "tcsh"],
        vec![
            "--database-url",
            url.as_str(),
            "keys",
            "list",
            "--limit",
            "x",
        ],
        vec!["--database-url", url.as_str(), "--bogus"],
        vec!["--bogus", url.as_str()],
        vec!["--database-url"],
        vec![
            "keys",
            "list",
            "--job",
            url.as_str(),
            "--limit",
            url.as_str(),
        ],
        vec!["keys", "show", "--digest", url.as_str()],
    ] {
        let run = Cli::new().run(&args).exit(2);
        assert_hidden(&run, &format!("{args:?}"));
        assert!(run.stderr.starts_with("error:"), "{args:?}: {run:#?}");
    }
    let run = Cli::new().env("DATABASE_URL", &url).run(&["--help"]).ok();
    assert_hidden(&run, "--help");
    // Help's own words stay as written (they read "key=***" once typed values were hidden).
    assert!(run.stdout.contains("key=value strings"), "{}", run.stdout);
    // A parameter no driver knows (a misspelt `pasword`), in a URL's query and in a key=value
    // string, quoted back by clap: before, printed whole (only secret-looking names were hidden).
    let misspelt_url =
        format!("postgres://postgres@127.0.0.1:1/test?sslmode=disable&pasword={PASSWORD}");
    let misspelt_conninfo = format!("host=127.0.0.1 port=1 pasword={PASSWORD}");
    let flag = format!("--database-urll={misspelt_url}");
    for args in [
        vec!["keys", "list", misspelt_url.as_str()],
        vec!["--bogus", misspelt_conninfo.as_str()],
        vec![flag.as_str(), "keys", "list"],
        vec!["keys", "show", "--digest", misspelt_conninfo.as_str()],
    ] {
        let run = Cli::new().run(&args).exit(2);
        assert_hidden(&run, &format!("{args:?}"));
        assert!(
            run.stderr.contains("sslmode=disable") || !args.contains(&misspelt_url.as_str()),
            "a parameter a driver knows is shown: {run:#?}"
        );
    }
}

/// A password with a space, in a URL or a key=value string clap quotes back: before, the URL's
/// was printed whole (a URL ran to the first space) and the string's from the space on
/// (`password=*** r1tPW`).
#[test]
fn clap_messages_print_no_password_with_a_space() {
    let url = "postgres://u:Top Secret5@127.0.0.1/db";
    let conninfo = "host=127.0.0.1 password=Top Secret5";
    for args in [
        vec!["jobs", url],
        vec!["jobs", conninfo],
        vec!["keys", "list", "--limit", conninfo],
    ] {
        let run = Cli::new().run(&args).exit(2);
        assert_hidden(&run, &format!("{args:?}"));
        assert!(
            run.stderr.contains("127.0.0.1"),
            "the host is shown: {run:#?}"
        );
    }
}

/// A URL with a mistyped separator after its scheme (`postgres:/`, `postgres//`, `postgres:`) is
/// no URL: it is read as a SQLite path, whose error quoted it whole, password and all
/// (`the SQLite database file postgres:/postgres:TopSecret5@127.0.0.1/test does not exist`).
#[test]
fn mistyped_url_separators_print_no_password() {
    for url in [
        format!("postgres:/postgres:{PASSWORD}@127.0.0.1/test"),
        format!("postgres//postgres:{PASSWORD}@127.0.0.1/test"),
        format!("postgres:postgres:{PASSWORD}@127.0.0.1/test"),
        format!("postgres:/postgres:Top:{MARK}@127.0.0.1/test"),
        format!("postgres:/postgres:Top@{MARK}@127.0.0.1/test"),
        format!("postgres:{PASSWORD}@127.0.0.1/test"),
        format!("mysql:/root:Top {MARK}@127.0.0.1/test"),
    ] {
        let run = each_way_exits(&url, &["verify"], 3);
        assert!(run.stderr.contains("127.0.0.1/test"), "{run:#?}");
        each_way_exits(&url, &["--json", "jobs"], 3);
    }
}

/// A key=value string with an unclosed quote: the message named the keyword before it, which a
/// password typed with a space and a quote holds (`password=abc TopSecret5='x`).
#[test]
fn an_unclosed_quote_quotes_nothing_of_the_connection_string() {
    for conninfo in [
        format!("host=127.0.0.1 user=postgres password=abc {PASSWORD}='x"),
        format!("host=127.0.0.1 port=1 password=abc {PASSWORD} = 'x y"),
    ] {
        let run = each_way_exits(&conninfo, &["verify"], 3);
        assert!(run.stderr.contains("single quote"), "{run:#?}");
    }
}

/// A secret holding two spaces or a tab: connection errors collapsed whitespace before hiding
/// the secret, which no longer matched it (`pwd=*** Secret5`).
#[test]
fn a_secret_with_runs_of_whitespace_is_hidden() {
    for path in [
        format!("/no/such/dir/pwd=Top  {MARK}"),
        format!("/no/such/dir/pwd=Top\t{MARK}"),
    ] {
        let run = each_way_exits(&path, &["jobs"], 3);
        assert!(run.stderr.contains("/no/such/dir/pwd=***"), "{run:#?}");
    }
}

#[test]
fn serve_prints_no_password() {
    // The server's errors before it serves: no token, a database it cannot reach, an address it
    // cannot listen on (192.0.2.1 is documentation's: on no interface here).
    let down = format!("postgres://postgres:{PASSWORD}@127.0.0.1:1/test");
    let up = with_password(&Server::Postgres.base_url(), PASSWORD);
    for (url, token, args, code) in [
        (&down, "", &["serve"][..], 2),
        (&down, "a-token-of-twenty-characters", &["serve"][..], 3),
        (
            &up,
            "a-token-of-twenty-characters",
            &["serve", "--bind", "192.0.2.1:8080"][..],
            2,
        ),
        (
            &up,
            "a-token-of-twenty-characters",
            &["serve", "--token-file", "/no/such/token"][..],
            2,
        ),
    ] {
        let run = Cli::new()
            .env("DATABASE_URL", url)
            .env("IDEMPOTENT_DASHBOARD_TOKEN", token)
            .run(args);
        assert_hidden(&run, &format!("{args:?}"));
        assert!(
            !run.stderr.contains("a-token-of-twenty"),
            "the token was printed: {run:#?}"
        );
        assert_eq!(run.code, code, "{args:?}: {run:#?}");
    }
}

#[test]
fn dotenv_files_print_no_password() {
    let dir = fresh_dir();
    // A .env naming a URL the CLI cannot use: read, and not printed.
    std::fs::write(
        dir.join(".env"),
        format!("# the app's settings\nDATABASE_URL=postgress://u:{PASSWORD}@127.0.0.1/test\n"),
    )
    .expect("writing .env");
    let run = Cli::new().dir(&dir).run(&["keys", "list"]).exit(3);
    assert_hidden(&run, ".env with an unknown scheme");
    assert!(
        run.stderr.contains("postgress://u:***@"),
        "read from .env: {run:#?}"
    );
    // A .env that does not parse: its lines are not quoted back.
    std::fs::write(
        dir.join(".env"),
        format!("DATABASE_URL='postgres://u:{PASSWORD}@127.0.0.1/test\nOTHER=x y z\n"),
    )
    .expect("writing .env");
    let run = Cli::new().dir(&dir).run(&["keys", "list"]);
    assert_ne!(run.code, 0, "{run:#?}");
    assert_hidden(&run, "a .env that does not parse");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn postgres_prints_no_password() {
    let db = TestDb::empty::<PgConnection>();
    let url = with_password(&db.url, PASSWORD);
    // No tables yet: every command fails with 4 and names the database.
    let run = each_way_exits(&url, &["keys", "list"], 4);
    assert!(run.stderr.contains("postgres:***@"), "{run:#?}");
    every_command(&url);

    let mut conn: PgConnection = db.connect();
    fill(&mut conn);
    every_command(&url);
    fill(&mut conn);
    // The password as a query parameter, and in a libpq key=value string.
    let (base, query) = db.url.split_once('?').expect("the test URL has a query");
    every_command(&format!("{base}?password=Top%2F{MARK}&{query}"));
    fill(&mut conn);
    let schema = query
        .rsplit("%3D")
        .next()
        .expect("the test URL sets search_path");
    let conninfo = format!(
        "host=127.0.0.1 user=postgres dbname=test password='Top\\'{MARK}' options='-csearch_path={schema}'"
    );
    let run = each_way_exits(&conninfo, &["keys", "show", "charge:order-1"], 0);
    assert!(run.stdout.contains("charge:order-1"), "{run:#?}");
    every_command(&conninfo);

    // A database error (5): a forget in a read-only session.
    fill(&mut conn);
    let read_only = format!("{url}%20-cdefault_transaction_read_only%3Don");
    let run = each_way_exits(
        &read_only,
        &["keys", "forget", "charge:order-1", "--yes"],
        5,
    );
    assert!(run.stderr.contains("read-only"), "{run:#?}");
}

#[test]
fn mysql_prints_no_password() {
    let db = TestDb::empty::<MysqlConnection>();
    let name = db
        .url
        .rsplit('/')
        .next()
        .expect("a database name")
        .to_owned();
    let user = format!("u{}", &name[name.len() - 12..]);
    let mut admin: MysqlConnection = MysqlConnection::open(&Server::Mysql.base_url());
    admin
        .batch_execute(&format!(
            "CREATE USER '{user}'@'%' IDENTIFIED BY '{PASSWORD}'; GRANT ALL ON {name}.* TO '{user}'@'%'"
        ))
        .expect("creating a user with a password");
    let drop_user = Guard(|| {
        let _ = admin.batch_execute(&format!("DROP USER IF EXISTS '{user}'@'%'"));
    });
    let server = db
        .url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('@').nth(1));
    let host_and_db = server.unwrap_or("127.0.0.1:3306/test").to_owned();
    let url = format!("mysql://{user}:{PASSWORD}@{host_and_db}");
    let run = each_way_exits(&url, &["keys", "list"], 4);
    assert!(run.stderr.contains(&format!("{user}:***@")), "{run:#?}");
    every_command(&url);

    let mut conn: MysqlConnection = db.connect();
    fill(&mut conn);
    every_command(&url);
    fill(&mut conn);
    let mariadb = format!("mariadb://{user}:{PASSWORD}@{host_and_db}");
    let run = each_way_exits(&mariadb, &["keys", "show", "charge:order-1"], 0);
    assert!(run.stdout.contains("charge:order-1"), "{run:#?}");
    every_command(&mariadb);
    // A wrong password: access denied, exit 3.
    let wrong = format!("mysql://{user}:Wrong{MARK}@{host_and_db}");
    each_way_exits(&wrong, &["jobs"], 3);
    drop(drop_user);
}

#[test]
fn sqlite_prints_no_password() {
    let db = TestDb::empty::<SqliteConnection>();
    let url = format!("file:{}?password={PASSWORD}", db.url);
    every_command(&url);
    let mut conn: SqliteConnection = db.connect();
    fill(&mut conn);
    let run = each_way_exits(&url, &["keys", "show", "charge:order-1"], 0);
    assert!(run.stdout.contains("charge:order-1"), "{run:#?}");
    every_command(&url);
}

/// Runs a closure when dropped, also while a failed test unwinds.
struct Guard<F: FnMut()>(F);

impl<F: FnMut()> Drop for Guard<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}
