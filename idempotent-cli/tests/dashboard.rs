//! `idempotent-jobs serve` in a real browser: headless Chromium under chromedriver (Debian
//! packages `chromium`, `chromium-driver`; a machine without them fails these tests, saying so),
//! on SQLite, PostgreSQL and MariaDB, with data the runtime wrote.
//!
//! Each test logs in with the token, reads the overview and its hourly numbers, looks a key up by
//! its text and by its handler's inputs, retries a parked message, forgets a key, and is refused:
//! without the token, with a wrong CSRF token, and from a forged form on another origin. It checks
//! the database after each action, the audit lines in the server's log, and that no password
//! appears in any page or log line. Screenshots go to `target/dashboard-screenshots/`;
//! `IDEMPOTENT_UPDATE_SCREENSHOT=1` also writes the README's `docs/dashboard.png` (PostgreSQL).

mod common;
#[path = "common/webdriver.rs"]
mod webdriver;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::{MysqlConnection, PgConnection, SqliteConnection};
use idempotent_runtime::keys;
use idempotent_runtime::outbox::{self, Relay};
use idempotent_runtime::{Error, Job, JobKey, Outcome};

use common::*;
use webdriver::{Browser, http};

/// The access token of these tests.
const TOKEN: &str = "dashboard-test-token-0123456789";
/// In the database password of the PostgreSQL test: must appear in no page and no log line.
const MARK: &str = "Secret5";

static INVOICE: Job = Job::new("invoice", "invoice:<month>:<customer_id>");
static WELCOME: Job = Job::new("welcome", "welcome:<name>");

/// A running `idempotent-jobs serve`, and everything it wrote on stderr.
struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts the server on a free port and waits for it to say where it listens.
    fn start(url: &str, writes: bool) -> Self {
        Self::start_with(url, if writes { &["--allow-writes"] } else { &[] })
    }

    /// [`start`](Self::start) with `extra` arguments to `serve`.
    fn start_with(url: &str, extra: &[&str]) -> Self {
        let mut args = vec!["serve", "--bind", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let mut child = Command::new(BIN)
            .args(&args)
            .env("DATABASE_URL", url)
            .env("IDEMPOTENT_DASHBOARD_TOKEN", TOKEN)
            .current_dir(empty_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting idempotent-jobs serve");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.split('/').next().unwrap_or_default().to_owned());
                }
                let mut log = sink.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!(
                    "the server did not start: {}",
                    log.lock().map(|l| l.clone()).unwrap_or_default()
                )
            });
        Self { child, addr, log }
    }

    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Whether the server's log holds `text`, waiting up to 10 s for it: the server writes a
    /// line about a request around its answer, and the thread that reads its stderr may not have
    /// it yet when the answer arrives.
    fn logged(&self, text: &str) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !self.log().contains(text) {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Keys of three jobs (one escaped, one backdated five hours), a delivered and a parked message.
fn fill<C: Backend>(conn: &mut C) {
    idempotent_runtime::migrate(conn).expect("migrating");
    let _: Outcome<()> =
        idempotent_runtime::run(conn, &HOOK, &JobKey::new("hook:order-77"), |conn| {
            outbox::push(
                conn,
                "webhook",
                &serde_json::json!({ "order": 77, "url": "https://partner.example/hook" }),
            )?;
            Ok::<_, Error>(())
        })
        .expect("running the hook job");
    Relay::new()
        .max_attempts(1)
        .run_once(conn, |_message| Err::<(), _>("HTTP 503 from the partner"))
        .expect("a failing relay round");
    for order in 1..=3 {
        assert!(charge(conn, order).1);
    }
    Relay::new()
        .run_once(conn, |_message| Ok::<(), &str>(()))
        .expect("a relay round that delivers");
    for (month, customer) in [
        ("a:b", "c"),
        ("2026-10", "cust_481"),
        ("2026-11", "cust_481"),
    ] {
        let key = JobKey::builder()
            .text("invoice:")
            .value(month)
            .text(":")
            .value(customer)
            .build()
            .expect("a key");
        let _: Outcome<()> =
            idempotent_runtime::run(conn, &INVOICE, &key, |_| Ok::<_, Error>(())).expect("invoice");
    }
    for name in ["東京", "ada"] {
        let key = JobKey::builder()
            .text("welcome:")
            .value(name)
            .build()
            .expect("a key");
        let _: Outcome<()> =
            idempotent_runtime::run(conn, &WELCOME, &key, |_| Ok::<_, Error>(())).expect("welcome");
    }
}

/// Moves `charge:order-3` five hours back, in the backend's own SQL.
fn backdate(server: Server_, conn: &mut dyn SimpleConnection) {
    let digest = hex(&JobKey::new("charge:order-3").digest());
    let sql = match server {
        Server_::Sqlite => format!(
            "UPDATE done_jobs SET done_at = strftime('%Y-%m-%d %H:%M:%f', done_at, '-5 hours') WHERE hex(key_digest) = upper('{digest}')"
        ),
        Server_::Postgres => format!(
            "UPDATE done_jobs SET done_at = done_at - INTERVAL '5 hours' WHERE key_digest = decode('{digest}', 'hex')"
        ),
        Server_::Mysql => format!(
            "UPDATE done_jobs SET done_at = done_at - INTERVAL 5 HOUR WHERE key_digest = UNHEX('{digest}')"
        ),
    };
    conn.batch_execute(&sql).expect("backdating a key");
}

use common::Server as Server_;

/// Where screenshots go.
fn screenshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("dashboard-screenshots")
}

/// A page served on another origin, with a form that posts a forget to the dashboard: what a
/// malicious site would do with the operator's logged-in browser.
fn attacker(dashboard: &str, digest: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding the attacker's port");
    let addr = listener.local_addr().expect("an address");
    let page = format!(
        "<!doctype html><html><body><form method=\"post\" action=\"{dashboard}/forget\">\
<input name=\"digest\" value=\"{digest}\"><input name=\"reason\" value=\"forged\">\
<input name=\"confirm\" value=\"yes\"><input name=\"csrf\" value=\"guessed\">\
<button id=\"go\" type=\"submit\">Win a prize</button></form></body></html>"
    );
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4).flatten() {
            let mut stream = stream;
            let mut reader = BufReader::new(stream.try_clone().expect("a stream"));
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    format!("http://{addr}/")
}

/// The whole tour, on one backend.
fn tour<C: Backend>(name: &str, url: &str, conn: &mut C) {
    let started = Instant::now();
    let server = Server::start(url, true);
    let base = server.base();
    let browser = Browser::start(1280, 1000);
    let mut sources = Vec::new();

    // Without the token: the login form.
    browser.goto(&format!("{base}/lookup?key=charge%3Aorder-1"));
    assert!(
        browser.url().ends_with("/login"),
        "refused without a token: {}",
        browser.url()
    );
    browser.fill("#token", "not-the-token-at-all");
    browser.click("#login");
    assert!(
        browser.page_text().contains("Wrong token."),
        "{}",
        browser.page_text()
    );
    browser.fill("#token", TOKEN);
    browser.click("#login");

    // The overview: keys per job, the hourly numbers from the backend's own query, the outbox.
    assert!(browser.url().ends_with('/'), "{}", browser.url());
    let text = browser.page_text();
    for expected in [
        "Keys per job",
        "charge",
        "invoice",
        "welcome",
        "Last 24 hours",
        "Last 7 days",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
    assert_eq!(browser.text("#outbox-parked"), "1");
    assert_eq!(browser.text("#outbox-delivered"), "3");
    let source = browser.source();
    assert!(
        source.contains("<td>charge</td><td>5</td>"),
        "charge:order-3 five hours ago: {source}"
    );
    assert!(
        source.contains("<td>charge</td><td>0</td><td class=\"num\">2</td>"),
        "{source}"
    );
    assert!(source.contains("<svg class=\"chart\""), "{source}");
    sources.push(source);
    let dir = screenshot_dir();
    browser.screenshot(&dir.join(format!("{name}-overview.png")));
    if name == "postgres" && std::env::var_os("IDEMPOTENT_UPDATE_SCREENSHOT").is_some() {
        browser
            .screenshot(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard.png"));
    }

    // Look a key up: typed by hand it is not found, and the nearest keys show its stored form.
    browser.goto(&format!("{base}/lookup"));
    browser.fill("#key", "invoice:a:b:c");
    browser.click("#lookup-key");
    assert!(
        browser.page_text().contains("No key `invoice:a:b:c`"),
        "{}",
        browser.page_text()
    );
    assert!(
        browser.text("#nearest").contains("invoice:a%3Ab:c"),
        "{}",
        browser.text("#nearest")
    );
    // By the handler's inputs: the template asks for its values, and the key is found.
    browser.fill("#template", "invoice:<month>:<customer_id>");
    browser.click("#lookup-template");
    browser.fill("#value-1", "a:b");
    browser.fill("#value-2", "c");
    browser.click("#lookup-template");
    assert_eq!(browser.text("#record-key"), "invoice:a%3Ab:c");
    assert!(
        browser.page_text().contains("result stored"),
        "{}",
        browser.page_text()
    );
    sources.push(browser.source());

    // The keys list, filtered by job; wide characters as they are.
    browser.goto(&format!("{base}/keys?job=welcome"));
    let text = browser.page_text();
    assert!(
        text.contains("welcome:東京") && !text.contains("charge:order-1"),
        "{text}"
    );

    // Retry the parked message.
    browser.goto(&format!("{base}/outbox"));
    assert!(
        browser.page_text().contains("HTTP 503 from the partner"),
        "{}",
        browser.page_text()
    );
    assert!(
        browser.page_text().contains("partner.example"),
        "the payload preview"
    );
    browser.screenshot(&dir.join(format!("{name}-outbox.png")));
    browser.click("button[aria-label^=\"Retry msg_\"]");
    assert!(
        browser.page_text().contains("Un-parked 1 message"),
        "{}",
        browser.page_text()
    );
    assert!(browser.has("#no-parked"));
    assert!(
        outbox::parked(conn).expect("parked").is_empty(),
        "retried in the database"
    );
    assert!(
        outbox::unsent(conn, 10)
            .expect("unsent")
            .iter()
            .any(|m| m.topic() == "webhook"),
        "the webhook waits to be sent again"
    );

    // A forget whose key another run renewed after the page showed it: that run's row is left,
    // and the page says so (it used to read the key again at the POST and forget the new run,
    // whose job then ran a third time).
    browser.goto(&format!("{base}/lookup?key=charge%3Aorder-1"));
    browser.fill("#reason", "ticket 4710: shown before a renewal");
    browser.click("#confirm");
    assert!(keys::forget(conn, &JobKey::new("charge:order-1"), "the test").expect("a forget"));
    let (outcome, ran) = charge(conn, 1);
    assert!(
        ran && matches!(outcome, Outcome::Ran(42)),
        "another run renews the key"
    );
    browser.click("#forget");
    assert!(
        browser.page_text().contains("renewed by another run"),
        "{}",
        browser.page_text()
    );
    let (outcome, ran) = charge(conn, 1);
    assert!(
        !ran && matches!(outcome, Outcome::Replayed(42)),
        "the run that renewed the key is still its record: {outcome:?}"
    );

    // Forget a key, with the token (the session) and a reason.
    browser.goto(&format!("{base}/lookup?key=charge%3Aorder-1"));
    browser.fill("#reason", "ticket 4711: invoice voided");
    browser.click("#confirm");
    browser.screenshot(&dir.join(format!("{name}-forget.png")));
    browser.click("#forget");
    assert!(
        browser.page_text().contains("Forgot the key"),
        "{}",
        browser.page_text()
    );
    assert!(
        keys::lookup(conn, &JobKey::new("charge:order-1"))
            .expect("lookup")
            .is_none(),
        "forgotten in the database"
    );
    let (outcome, ran) = charge(conn, 1);
    assert!(
        ran && matches!(outcome, Outcome::Ran(42)),
        "the job runs again"
    );

    refusals(&server, &browser, conn);

    // On a phone: nothing wider than the screen but the tables, which scroll by themselves.
    browser.resize(390, 844);
    browser.goto(&format!("{base}/"));
    browser.screenshot(&dir.join(format!("{name}-phone.png")));
    let fits = browser.script("return document.body.scrollWidth <= window.innerWidth + 1;");
    assert_eq!(fits, true, "the overview fits a phone's width");

    let mut log = server.log();
    for expected in [
        "audit: dashboard: login from 127.0.0.1",
        "audit: dashboard: refused a login from 127.0.0.1",
        "audit: dashboard: un-parked 1 message(s)",
        "audit: forgot a key",
        "ticket 4711: invoice voided (idempotent-jobs dashboard, session ",
        "audit: dashboard: forgot key \"charge:order-1\"",
        "audit: dashboard: refused POST /forget",
    ] {
        if !log.contains(expected) && server.logged(expected) {
            log = server.log();
        }
        assert!(log.contains(expected), "{expected}: {log}");
    }
    for text in sources.iter().chain([&log]) {
        assert!(
            !text.contains(MARK) && !text.contains(TOKEN),
            "a secret was shown: {text}"
        );
    }
    eprintln!(
        "dashboard tour on {name}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Forgets refused: without a token, with a wrong CSRF token, and from another origin; the key
/// stays in every case.
fn refusals<C: Backend>(server: &Server, browser: &Browser, conn: &mut C) {
    let key = JobKey::new("charge:order-2");
    let digest = hex(&key.digest());
    let form = format!("digest={digest}&reason=r&confirm=yes");
    let still_there = |conn: &mut C, what: &str| {
        assert!(
            keys::lookup(conn, &key).expect("lookup").is_some(),
            "{what}: the key was forgotten"
        );
    };
    let origin = server.base();

    let response = http(
        "POST",
        &server.addr,
        "/forget",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        &form,
    );
    assert_eq!(response.status, 401, "no token: {response:?}");
    still_there(conn, "no token");
    let response = http(
        "POST",
        &server.addr,
        "/forget",
        &[("Authorization", "Bearer wrong-token-wrong-token")],
        &form,
    );
    assert_eq!(response.status, 401, "a wrong bearer token: {response:?}");
    still_there(conn, "a wrong bearer token");

    let session = browser
        .cookie("idempotent_session")
        .expect("the session cookie");
    let cookie = format!("idempotent_session={session}");
    let same_origin = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Cookie", cookie.as_str()),
        ("Origin", origin.as_str()),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    let response = http(
        "POST",
        &server.addr,
        "/forget",
        &same_origin,
        &format!("{form}&csrf=0123"),
    );
    assert_eq!(response.status, 403, "a wrong CSRF token: {response:?}");
    assert!(response.body.contains("CSRF"), "{response:?}");
    still_there(conn, "a wrong CSRF token");
    let response = http("POST", &server.addr, "/forget", &same_origin, &form);
    assert_eq!(response.status, 403, "no CSRF token: {response:?}");
    still_there(conn, "no CSRF token");

    // A forged form on another origin, submitted in the logged-in browser: the cookie goes along
    // (cookies ignore ports), Origin and Sec-Fetch-Site give it away.
    browser.goto(&attacker(&origin, &digest));
    browser.click("#go");
    assert!(
        browser.page_text().contains("Refused"),
        "{}",
        browser.page_text()
    );
    still_there(conn, "a forged cross-origin form");

    // Without the session, the browser is sent to the login form again.
    browser.delete_cookies();
    browser.goto(&format!("{origin}/outbox"));
    assert!(browser.url().ends_with("/login"), "{}", browser.url());
    browser.fill("#token", TOKEN);
    browser.click("#login");
}

/// A read-only server shows no forms that change anything and refuses those actions with the token.
fn read_only(url: &str) {
    let server = Server::start(url, false);
    let bearer = format!("Bearer {TOKEN}");
    let response = http(
        "GET",
        &server.addr,
        "/lookup?key=charge%3Aorder-2",
        &[("Authorization", bearer.as_str())],
        "",
    );
    assert_eq!(response.status, 200, "{response:?}");
    assert!(
        response.body.contains("Read-only") && !response.body.contains("action=\"/forget\""),
        "{}",
        response.body
    );
    let headers = [
        ("Authorization", bearer.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    let digest = hex(&JobKey::new("charge:order-2").digest());
    let response = http(
        "POST",
        &server.addr,
        "/forget",
        &headers,
        &format!("digest={digest}&reason=r&confirm=yes"),
    );
    assert_eq!(response.status, 403, "{response:?}");
    let response = http("POST", &server.addr, "/outbox/retry", &headers, "all=yes");
    assert_eq!(response.status, 403, "{response:?}");
    assert!(server.logged("refused a forget"), "{}", server.log());
    // Pages may run no script and be framed by no one; the session cookie is for this site only.
    let csp = response
        .header("content-security-policy")
        .unwrap_or_default();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let origin = server.base();
    let login = [
        ("Origin", origin.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    let response = http(
        "POST",
        &server.addr,
        "/login",
        &login,
        &format!("token={TOKEN}"),
    );
    assert_eq!(response.status, 303, "{response:?}");
    let cookie = response.header("set-cookie").unwrap_or_default();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    // A request for another Host (DNS rebinding) is not answered.
    let response = http(
        "GET",
        &server.addr,
        "/",
        &[
            ("Host", "attacker.example:80"),
            ("Authorization", bearer.as_str()),
        ],
        "",
    );
    assert_eq!(response.status, 421, "{response:?}");
}

#[test]
fn sqlite_dashboard() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    fill(&mut conn);
    backdate(Server_::Sqlite, &mut conn);
    tour("sqlite", &db.url, &mut conn);
    read_only(&db.url);
}

#[test]
fn postgres_dashboard() {
    let db = TestDb::empty::<PgConnection>();
    let mut conn: PgConnection = db.connect();
    fill(&mut conn);
    backdate(Server_::Postgres, &mut conn);
    // The server trusts local connections: the password is there to be hidden, not checked.
    let at = db.url.find('@').expect("a URL with a user");
    let url = format!("{}:Top{MARK}{}", &db.url[..at], &db.url[at..]);
    tour("postgres", &url, &mut conn);
}

#[test]
fn mysql_dashboard() {
    let db = TestDb::empty::<MysqlConnection>();
    let mut conn: MysqlConnection = db.connect();
    fill(&mut conn);
    backdate(Server_::Mysql, &mut conn);
    tour(
        "mysql",
        &db.url.replacen("mysql://", "mariadb://", 1),
        &mut conn,
    );
}

#[test]
fn serve_refuses_to_start_without_a_token() {
    let run = Cli::new()
        .env(
            "DATABASE_URL",
            &format!("postgres://u:Top{MARK}@127.0.0.1:1/test"),
        )
        .env("IDEMPOTENT_DASHBOARD_TOKEN", "")
        .run(&["serve"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        run.stderr.contains("IDEMPOTENT_DASHBOARD_TOKEN"),
        "{run:#?}"
    );
    assert!(!run.stderr.contains(MARK), "{run:#?}");
}

/// Keys done in one millisecond (SQLite's `done_at` has no finer grain; a busy worker commits
/// several jobs in one) are paged through by "Older keys →" each once. Before, the link asked for
/// keys done strictly before the last one shown, and every other key of that millisecond that did
/// not fit on the page was on no page.
#[test]
fn paging_through_keys_done_in_one_millisecond_shows_each_once() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    let names: Vec<String> = (1..=5).map(|n| format!("same-ms-{n}")).collect();
    for name in &names {
        let key = JobKey::builder()
            .text("welcome:")
            .value(name)
            .build()
            .expect("a key");
        let _: Outcome<()> =
            idempotent_runtime::run(&mut conn, &WELCOME, &key, |_| Ok::<_, Error>(()))
                .expect("welcome");
    }
    conn.batch_execute("UPDATE done_jobs SET done_at = '2026-12-01 10:00:00.123'")
        .expect("one millisecond for all");
    let server = Server::start(&db.url, false);
    let bearer = format!("Bearer {TOKEN}");
    let mut page = "/keys?limit=2".to_owned();
    let mut seen: Vec<String> = Vec::new();
    for _ in 0..10 {
        let response = http(
            "GET",
            &server.addr,
            &page,
            &[("Authorization", bearer.as_str())],
            "",
        );
        assert_eq!(response.status, 200, "{response:?}");
        for name in &names {
            if response.body.contains(&format!(">welcome:{name}<")) {
                seen.push(name.clone());
            }
        }
        let Some(next) = response
            .body
            .split("<a rel=\"next\" href=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            break;
        };
        page = next.replace("&amp;", "&");
    }
    seen.sort();
    assert_eq!(seen, names, "each key on exactly one page");
}

/// A filter of `/keys` that cannot be read (a time that is not one) lists no key: the page said
/// so and listed every key anyway, as if they matched the filter. Now 400, the notice, no key.
#[test]
fn a_filter_that_cannot_be_read_lists_no_keys() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    let _: Outcome<()> =
        idempotent_runtime::run(&mut conn, &WELCOME, &JobKey::new("welcome:listed"), |_| {
            Ok::<_, Error>(())
        })
        .expect("welcome");
    let server = Server::start(&db.url, false);
    let bearer = format!("Bearer {TOKEN}");
    let get = |page: &str| {
        http(
            "GET",
            &server.addr,
            page,
            &[("Authorization", bearer.as_str())],
            "",
        )
    };
    let listed = get("/keys?since=2026-01-01");
    assert_eq!(listed.status, 200, "{listed:?}");
    assert!(listed.body.contains(">welcome:listed<"), "{}", listed.body);
    for page in [
        "/keys?since=not-a-time",
        "/keys?before=yesterday%3F",
        "/keys?since=2026-01-01&after=garbage",
    ] {
        let response = get(page);
        assert_eq!(response.status, 400, "{page}: {response:?}");
        assert!(
            !response.body.contains(">welcome:listed<"),
            "{page}: a key listed under a filter that was not applied: {}",
            response.body
        );
        assert!(
            response.body.contains("No keys are listed"),
            "{page}: {}",
            response.body
        );
    }
}

/// A key given to `JobKey::new` with a control character is listed escaped (`%09`); the look-up
/// by that text (the page's own link to it, a nearest key's link) finds it. Before: "not found",
/// with the key itself as the nearest.
#[test]
fn a_key_listed_escaped_is_found_by_its_listed_text() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    let _: Outcome<()> =
        idempotent_runtime::run(&mut conn, &WELCOME, &JobKey::new("welcome:a\tb"), |_| {
            Ok::<_, Error>(())
        })
        .expect("welcome");
    let server = Server::start(&db.url, false);
    let bearer = format!("Bearer {TOKEN}");
    let response = http(
        "GET",
        &server.addr,
        "/lookup?key=welcome%3Aa%2509b",
        &[("Authorization", bearer.as_str())],
        "",
    );
    assert_eq!(response.status, 200, "{response:?}");
    let digest = hex(&JobKey::new("welcome:a\tb").digest());
    assert!(
        response.body.contains(&digest) && !response.body.contains("no committed run holds it"),
        "{}",
        response.body
    );
}

/// A key as the CLI's `keys list` prints it (a backslash as `\\`) is found by the look-up too, as
/// by `keys show`. Before: "not found".
#[test]
fn a_key_as_keys_list_prints_it_is_found() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    let _: Outcome<()> =
        idempotent_runtime::run(&mut conn, &WELCOME, &JobKey::new("welcome:C:\\tmp"), |_| {
            Ok::<_, Error>(())
        })
        .expect("welcome");
    let server = Server::start(&db.url, false);
    // `welcome:C:\\tmp`, as `keys list` prints it.
    let response = get(&server, "/lookup?key=welcome%3AC%3A%5C%5Ctmp");
    assert_eq!(response.status, 200, "{response:?}");
    let digest = hex(&JobKey::new("welcome:C:\\tmp").digest());
    assert!(
        response.body.contains(&digest) && !response.body.contains("no committed run holds it"),
        "{}",
        response.body
    );
}

/// `GET` `page` with the bearer token.
fn get(server: &Server, page: &str) -> webdriver::HttpResponse {
    let bearer = format!("Bearer {TOKEN}");
    http(
        "GET",
        &server.addr,
        page,
        &[("Authorization", bearer.as_str())],
        "",
    )
}

/// The connections PostgreSQL has open for `application_name`.
fn connections_named(admin: &mut PgConnection, name: &str) -> i64 {
    use diesel::RunQueryDsl;
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
        "(SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}')"
    )))
    .get_result(admin)
    .expect("counting connections")
}

/// With `done_jobs` locked by another session, ten concurrent requests hold at most four server
/// connections (the pool of four) and each answers 503 within the dashboard's wait, saying the
/// database is busy and nothing was changed. Before: a connection per request, each waiting for
/// the lock as long as it was held.
#[test]
fn a_locked_table_holds_four_connections_at_most_and_each_request_answers_503_in_time() {
    let db = TestDb::empty::<PgConnection>();
    let mut conn: PgConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    let name = unique_name();
    let server = Server::start(&format!("{}&application_name={name}", db.url), false);
    let server = Arc::new(server);
    conn.batch_execute("BEGIN; LOCK TABLE done_jobs IN ACCESS EXCLUSIVE MODE")
        .expect("locking done_jobs");
    let started = Instant::now();
    let requests: Vec<_> = (0..10)
        .map(|_| {
            let server = Arc::clone(&server);
            std::thread::spawn(move || (get(&server, "/"), started.elapsed()))
        })
        .collect();
    let mut admin = PgConnection::open(&Server_::Postgres.base_url());
    let mut most = 0;
    while !requests.iter().all(|r| r.is_finished()) && started.elapsed() < Duration::from_secs(25) {
        most = most.max(connections_named(&mut admin, &name));
        std::thread::sleep(Duration::from_millis(100));
    }
    conn.batch_execute("ROLLBACK").expect("unlocking");
    let answers: Vec<_> = requests
        .into_iter()
        .map(|r| r.join().expect("a request"))
        .collect();
    assert!(
        most <= 4,
        "the dashboard held {most} connections at once (a pool of four)"
    );
    for (response, took) in &answers {
        assert!(*took < Duration::from_secs(14), "answered after {took:?}");
        assert_eq!(response.status, 503, "{response:?}");
        assert!(
            response.body.contains("The database is busy")
                && response
                    .body
                    .contains("Nothing was changed; reload to retry"),
            "{}",
            response.body
        );
    }
}

/// Unicode direction controls in a key, a topic, a payload and a delivery error are shown as the
/// CLI shows them (`\u{202e}`), never raw: `invoice:\u{202E}184_tsuc` read as
/// `invoice:cust_481`.
#[test]
fn direction_controls_in_what_the_database_holds_are_shown_escaped() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    let key = JobKey::new("invoice:\u{202E}184_tsuc");
    let _: Outcome<()> = idempotent_runtime::run(&mut conn, &INVOICE, &key, |conn| {
        outbox::push(
            conn,
            "mail\u{2066}er",
            &serde_json::json!({ "to": "\u{202B}x" }),
        )?;
        Ok::<_, Error>(())
    })
    .expect("invoice");
    Relay::new()
        .max_attempts(1)
        .run_once(&mut conn, |_message| Err::<(), _>("refused \u{2067}y"))
        .expect("a failing relay round");
    let server = Server::start(&db.url, false);
    let lookup = format!("/lookup?digest={}", hex(&key.digest()));
    for page in ["/", "/keys", "/outbox", lookup.as_str()] {
        let response = get(&server, page);
        assert_eq!(response.status, 200, "{page}: {response:?}");
        let raw: Vec<char> = response
            .body
            .chars()
            .filter(|c| matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
            .collect();
        assert!(
            raw.is_empty(),
            "{page} shows {raw:?} raw: {}",
            response.body
        );
    }
    assert!(
        get(&server, "/keys")
            .body
            .contains("invoice:\\u{202e}184_tsuc")
    );
    let outbox = get(&server, "/outbox").body;
    for shown in ["mail\\u{2066}er", "\\u{202b}x", "refused \\u{2067}y"] {
        assert!(outbox.contains(shown), "{shown} in {outbox}");
    }
}

/// A connection lost under the overview's chart statements is the 503 of every other lost
/// connection (it was a 500), and the driver's message shows without its trailing newline (it
/// ended in a literal `\n`).
#[test]
fn a_connection_lost_under_the_charts_is_503_without_a_trailing_newline() {
    let db = TestDb::empty::<PgConnection>();
    let mut conn: PgConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    let _: Outcome<()> =
        idempotent_runtime::run(&mut conn, &WELCOME, &JobKey::new("welcome:ada"), |_| {
            Ok::<_, Error>(())
        })
        .expect("welcome");
    let schema = db.url.rsplit("search_path%3D").next().expect("a schema");
    // The chart statements call floor(): this one, first on the server's search path, ends the
    // session that calls it.
    for argument in ["numeric", "double precision"] {
        conn.batch_execute(&format!(
            "CREATE FUNCTION {schema}.floor(x {argument}) RETURNS {argument} LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5); RETURN x; END $$"
        ))
        .expect("a floor() that ends the session");
    }
    let server = Server::start(&format!("{}%2Cpg_catalog", db.url), false);
    let response = get(&server, "/");
    assert_eq!(response.status, 503, "{response:?}");
    assert!(
        response
            .body
            .contains("lost the connection to the database"),
        "{}",
        response.body
    );
    assert!(
        !response.body.contains("\\n</div>") && !response.body.contains("\\u{a}</div>"),
        "a trailing newline shown: {}",
        response.body
    );
}

/// `POST` `form` to `page` with the bearer token, and how long the answer took.
fn post(server: &Server, page: &str, form: &str) -> (webdriver::HttpResponse, Duration) {
    let bearer = format!("Bearer {TOKEN}");
    let started = Instant::now();
    let response = http(
        "POST",
        &server.addr,
        page,
        &[
            ("Authorization", bearer.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        form,
    );
    (response, started.elapsed())
}

/// A forget whose look-up waits past the page's wait is answered 503, nothing changed, and is
/// not done once the lock goes; a retry whose write has begun is waited for, and the page says
/// what it did.
#[test]
fn writes_that_wait_for_a_lock_say_what_they_did() {
    let db = TestDb::empty::<PgConnection>();
    let mut conn: PgConnection = db.connect();
    fill(&mut conn);
    let key = JobKey::new("hook:order-77");
    let record = keys::lookup_digest(&mut conn, &key.digest())
        .expect("a look-up")
        .expect("the hook's key");
    let server = Server::start(&db.url, true);
    let mut locker: PgConnection = db.connect();

    locker
        .batch_execute("BEGIN; LOCK TABLE done_jobs IN ACCESS EXCLUSIVE MODE")
        .expect("locking done_jobs");
    let form = format!(
        "digest={}&revision={}&reason=test&confirm=yes",
        hex(&key.digest()),
        record.revision()
    );
    let (response, took) = post(&server, "/forget", &form);
    assert!(took < Duration::from_secs(13), "answered after {took:?}");
    assert_eq!(response.status, 503, "{response:?}");
    assert!(
        response.body.contains("Nothing was changed"),
        "{response:?}"
    );
    std::thread::sleep(Duration::from_secs(1));
    locker.batch_execute("ROLLBACK").expect("unlocking");
    // The look-up the page stopped waiting for ends now; its forget must not follow.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        keys::lookup_digest(&mut conn, &key.digest())
            .expect("a look-up")
            .is_some(),
        "the forget the page said was not done was done"
    );
    assert!(!server.log().contains("forgot key"), "{}", server.log());

    locker
        .batch_execute("BEGIN; LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .expect("locking the outbox");
    let unlock = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(12));
        locker.batch_execute("ROLLBACK").expect("unlocking");
    });
    let (response, took) = post(&server, "/outbox/retry", "all=yes");
    unlock.join().expect("the unlocking thread");
    assert!(took > Duration::from_secs(11), "answered after {took:?}");
    assert_eq!(response.status, 303, "{response:?}");
    let location = response.header("location").unwrap_or_default().to_owned();
    assert!(location.starts_with("/outbox?done="), "{response:?}");
    assert!(server.logged("un-parked 1 message"), "{}", server.log());
    // The page says what the retry did, once: a reload says nothing more.
    assert!(
        get(&server, &location)
            .body
            .contains("Un-parked 1 message:"),
        "the notice"
    );
    assert!(
        !get(&server, &location).body.contains("Un-parked"),
        "the notice again"
    );
}

/// What a write did is told by the page its redirect leads to, from the dashboard's own record of
/// it: never from the query. Before, `/lookup?..&notice=forgotten` said "Forgot the key" and
/// `/outbox?notice=retried&retried=4000` "Un-parked 4000 messages", on a read-only dashboard where
/// neither could happen; a link could say so, as could a reload after another run had claimed the
/// key again.
#[test]
fn a_link_cannot_make_the_dashboard_say_a_write_happened() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    fill(&mut conn);
    let key = JobKey::new("hook:order-77");
    let server = Server::start(&db.url, false);
    let lookup = get(
        &server,
        &format!(
            "/lookup?digest={}&notice=forgotten&done=0",
            hex(&key.digest())
        ),
    );
    assert_eq!(lookup.status, 200, "{lookup:?}");
    assert!(!lookup.body.contains("Forgot the key"), "{}", lookup.body);
    let outbox = get(&server, "/outbox?notice=retried&retried=4000&done=1");
    assert_eq!(outbox.status, 200, "{outbox:?}");
    assert!(!outbox.body.contains("Un-parked"), "{}", outbox.body);
    assert!(
        keys::lookup_digest(&mut conn, &key.digest())
            .expect("a look-up")
            .is_some(),
        "the key is still there"
    );
}

/// Tables a newer release made (a schema version above this build's): the dashboard's forget
/// and retries are refused as the CLI's writing commands are, saying so and that nothing was
/// changed, and change nothing; its pages still read.
fn writes_on_a_newer_schema<C: Backend>() {
    let db = TestDb::empty::<C>();
    let mut conn: C = db.connect();
    fill(&mut conn);
    let key = JobKey::new("hook:order-77");
    let record = keys::lookup_digest(&mut conn, &key.digest())
        .expect("a look-up")
        .expect("the hook's key");
    let parked = outbox::parked(&mut conn).expect("the parked messages");
    assert_eq!(parked.len(), 1, "the hook's message is parked");
    let keys_before = key_count(&mut conn);
    conn.batch_execute(
        "INSERT INTO idempotent_schema (version, description, applied_at) \
         VALUES (99, 'a future release', CURRENT_TIMESTAMP)",
    )
    .expect("recording a future version");
    let server = Server::start(&db.url, true);

    let forget = format!(
        "digest={}&revision={}&reason=test&confirm=yes",
        hex(&key.digest()),
        record.revision()
    );
    let one = format!("message_id={}", parked[0].message_id());
    for (page, form) in [
        ("/forget", forget.as_str()),
        ("/outbox/retry", one.as_str()),
        ("/outbox/retry", "all=yes"),
    ] {
        let (response, _) = post(&server, page, form);
        assert_eq!(response.status, 503, "{page} {form}: {response:?}");
        assert!(
            response.body.contains("made by a newer release")
                && response.body.contains("version 99")
                && response.body.contains("Nothing was changed")
                && response.body.contains("Upgrade idempotent-jobs-cli"),
            "{page} {form}: {}",
            response.body
        );
    }
    assert_eq!(key_count(&mut conn), keys_before, "a key was forgotten");
    assert_eq!(
        outbox::parked(&mut conn)
            .expect("the parked messages")
            .len(),
        1,
        "a message was un-parked"
    );
    assert!(
        !server.log().contains("forgot key") && !server.log().contains("un-parked"),
        "{}",
        server.log()
    );
    assert_eq!(get(&server, "/outbox").status, 200, "the pages still read");
}

#[test]
fn sqlite_writes_on_a_newer_schema_are_refused() {
    writes_on_a_newer_schema::<SqliteConnection>();
}

#[test]
fn postgres_writes_on_a_newer_schema_are_refused() {
    writes_on_a_newer_schema::<PgConnection>();
}

#[test]
fn mysql_writes_on_a_newer_schema_are_refused() {
    writes_on_a_newer_schema::<MysqlConnection>();
}

/// A chart statement that waits past the dashboard's lock wait on a server whose messages are in
/// German (`lc_messages`, as a superuser may set it) is the 503 of a busy database, as it is in
/// English: known by what the error is (SQLSTATE 55P03), not by its English words. Before: a 500,
/// "any other database error".
#[test]
fn a_chart_statement_that_waits_for_a_lock_is_busy_in_german() {
    let db = TestDb::empty::<PgConnection>();
    let mut conn: PgConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    let _: Outcome<()> =
        idempotent_runtime::run(&mut conn, &WELCOME, &JobKey::new("welcome:ada"), |_| {
            Ok::<_, Error>(())
        })
        .expect("welcome");
    let schema = db.url.rsplit("search_path%3D").next().expect("a schema");
    // The chart statements call floor(): this one, first on the server's search path, waits for
    // a lock on `blocker` before it answers.
    conn.batch_execute(&format!("CREATE TABLE {schema}.blocker (x int)"))
        .expect("a table to lock");
    for argument in ["numeric", "double precision"] {
        conn.batch_execute(&format!(
            "CREATE FUNCTION {schema}.floor(x {argument}) RETURNS {argument} LANGUAGE plpgsql AS \
             $$ BEGIN LOCK TABLE {schema}.blocker IN ACCESS SHARE MODE; RETURN pg_catalog.floor(x); END $$"
        ))
        .expect("a floor() that waits for a lock");
    }
    let server = Server::start(
        &format!("{}%2Cpg_catalog%20-clc_messages%3Dde_DE.UTF-8", db.url),
        false,
    );
    let mut locker: PgConnection = db.connect();
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {schema}.blocker IN ACCESS EXCLUSIVE MODE"
        ))
        .expect("locking the blocker");
    let response = get(&server, "/");
    locker.batch_execute("ROLLBACK").expect("unlocking");
    assert_eq!(response.status, 503, "{response:?}");
    assert!(
        response.body.contains("The database is busy")
            && response.body.contains("Nothing was changed")
            && response.body.contains("Sperre"),
        "{}",
        response.body
    );
}

/// The "Older keys" link of `/keys?since=1h` carries the time `1h` meant: followed a few seconds
/// later, its page still lists the key done 59m57s before the first page. Before, the link carried
/// `since=1h`, read again against the later clock, and that key was on no page.
#[test]
fn older_keys_of_a_relative_since_skip_no_key() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    idempotent_runtime::migrate(&mut conn).expect("migrating");
    keys_done_almost_an_hour_ago(&mut conn, &WELCOME);
    let server = Server::start(&db.url, false);
    let bearer = format!("Bearer {TOKEN}");
    let first = http(
        "GET",
        &server.addr,
        "/keys?since=1h&limit=1",
        &[("Authorization", bearer.as_str())],
        "",
    );
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.body.contains(">welcome:newer<"), "{first:?}");
    assert!(
        first.body.contains("value=\"1h\""),
        "the form keeps what was typed: {first:?}"
    );
    let next = first
        .body
        .split("<a rel=\"next\" href=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a link to older keys")
        .replace("&amp;", "&");
    std::thread::sleep(std::time::Duration::from_secs(5));
    let second = http(
        "GET",
        &server.addr,
        &next,
        &[("Authorization", bearer.as_str())],
        "",
    );
    assert_eq!(second.status, 200, "{second:?}");
    assert!(
        second.body.contains(">welcome:older<"),
        "the key done 59m57s before the first page is on the next ({next}): {second:?}"
    );
}

/// `--allowed-host NAME:PORT` (a reverse proxy's name): requests for that Host are answered, as
/// are those for the address the server listens on; any other Host is refused with 421, as the
/// CLI's README says.
#[test]
fn allowed_hosts_are_answered_and_no_other() {
    let db = TestDb::empty::<SqliteConnection>();
    let mut conn: SqliteConnection = db.connect();
    fill(&mut conn);
    let server = Server::start_with(&db.url, &["--allowed-host", "jobs.example.org:443"]);
    let bearer = format!("Bearer {TOKEN}");
    let status = |host: &str| {
        http(
            "GET",
            &server.addr,
            "/",
            &[("Host", host), ("Authorization", bearer.as_str())],
            "",
        )
        .status
    };
    assert_eq!(status("jobs.example.org:443"), 200, "the allowed host");
    assert_eq!(status(&server.addr), 200, "the address it listens on");
    assert_eq!(
        status("jobs.example.org:80"),
        421,
        "the allowed name on another port"
    );
    assert_eq!(status("attacker.example:443"), 421, "another name");
}

/// `serve` without a token advises a command that makes one, as written: the advice is the
/// CLI's own words, not a secret to hide.
#[test]
fn serve_without_a_token_advises_a_command_that_runs() {
    let run = Cli::new()
        .env(
            "DATABASE_URL",
            &format!("postgres://u:Top{MARK}@127.0.0.1:1/test"),
        )
        .env("IDEMPOTENT_DASHBOARD_TOKEN", "short")
        .run(&["serve"]);
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        run.stderr
            .contains("export IDEMPOTENT_DASHBOARD_TOKEN=$(openssl rand -hex 32)"),
        "{run:#?}"
    );
    assert!(!run.stderr.contains(MARK), "{run:#?}");
}

/// Every refused request writes one audit line, with the true reason: a wrong bearer token (on a
/// GET, sent to the login form, and on a POST), no token at all, a `Host` the server does not
/// answer to. The wrong token's value is in no line.
#[test]
fn every_refused_request_is_audited_with_its_reason() {
    let db = TestDb::empty::<SqliteConnection>();
    db.cli(&["migrate"]).ok();
    let server = Server::start(&db.url, true);
    let wrong = "Bearer wrong-token-wrong-token-42";
    let right = format!("Bearer {TOKEN}");
    let form = [
        ("Authorization", wrong),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];
    /// A request (method, page, headers), the status that refuses it, and its audit line's start.
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], u16, &'a str);
    let cases: [Case<'_>; 5] = [
        (
            "GET",
            "/keys",
            &[("Authorization", wrong)],
            303,
            "refused GET /keys from 127.0.0.1:",
        ),
        (
            "POST",
            "/outbox/retry",
            &form,
            401,
            "refused POST /outbox/retry from 127.0.0.1:",
        ),
        (
            "GET",
            "/outbox",
            &[],
            303,
            "refused GET /outbox from 127.0.0.1:",
        ),
        (
            "GET",
            "/lookup",
            &[("Host", "evil.example"), ("Authorization", right.as_str())],
            421,
            "refused GET /lookup from 127.0.0.1:",
        ),
        (
            "POST",
            "/forget",
            &[],
            401,
            "refused POST /forget from 127.0.0.1:",
        ),
    ];
    let reasons = [
        "a wrong bearer token",
        "a wrong bearer token",
        "no token",
        "Host `evil.example`",
        "no token",
    ];
    for ((method, page, headers, status, line), reason) in cases.iter().zip(reasons) {
        let body = if *method == "POST" { "all=yes" } else { "" };
        let response = http(method, &server.addr, page, headers, body);
        assert_eq!(response.status, *status, "{method} {page}: {response:#?}");
        assert!(
            server.logged(line),
            "{method} {page}: an audit line `{line}...`: {}",
            server.log()
        );
        let log = server.log();
        let audited: Vec<&str> = log.lines().filter(|l| l.contains(line)).collect();
        assert_eq!(audited.len(), 1, "{method} {page}: one line: {audited:#?}");
        assert!(
            audited[0].starts_with("audit: dashboard: ") && audited[0].contains(reason),
            "{method} {page}: the reason `{reason}`: {audited:#?}"
        );
    }
    assert!(
        !server.log().contains("wrong-token-wrong-token-42"),
        "{}",
        server.log()
    );
}
