//! `idempotent-jobs serve`: the operator's dashboard, over the same database URLs as the CLI.
//!
//! axum on a small tokio runtime; each request's database work runs on tokio's blocking pool
//! with a sync Diesel connection from a small pool of the CLI's own connections, through the
//! runtime's operator API (and, for the hourly charts only, one fixed statement per backend in
//! [`sql`]). Read-only unless started with `--allow-writes`; see [`auth`] for who gets in.

mod actions;
mod auth;
mod chart;
mod html;
mod pages;
mod sql;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use crate::cli::ServeArgs;
use crate::connect::{Conn, Target};
use crate::failure::{Code, Failure};
use crate::table::printable;

pub use auth::Auth;

/// The environment variable that holds the token.
pub const TOKEN_VAR: &str = "IDEMPOTENT_DASHBOARD_TOKEN";
/// Connections open at once: requests beyond these wait for one (see [`REQUEST_WAIT`]).
const POOL_SIZE: usize = 4;
/// How long a request waits for a connection and for its statements before the page says the
/// database is busy.
const REQUEST_WAIT: Duration = Duration::from_secs(10);
/// How long a statement of the dashboard waits for another transaction's lock.
const LOCK_WAIT_SECONDS: u64 = 5;
/// The largest form body read.
const MAX_FORM_BYTES: usize = 64 * 1024;

/// Runs `$body` with `$c` bound to the connection inside `$conn`, whatever its backend: the body
/// is compiled once per backend, so it may call generic functions.
macro_rules! on_conn {
    ($conn:expr, $c:ident => $body:expr) => {
        match $conn {
            #[cfg(feature = "postgres")]
            $crate::connect::Conn::Postgres($c) => $body,
            #[cfg(feature = "mysql")]
            $crate::connect::Conn::Mysql($c) => $body,
            #[cfg(feature = "sqlite")]
            $crate::connect::Conn::Sqlite($c) => $body,
        }
    };
}
pub(crate) use on_conn;

/// What every request shares.
pub struct App {
    /// The database.
    pub target: Target,
    /// The token and the sessions.
    pub gate: auth::Gate,
    /// Whether forgets and retries are allowed.
    pub writes: bool,
    /// The `Host` values accepted; empty: any.
    hosts: Vec<String>,
    /// Idle connections.
    pool: Mutex<Vec<Conn>>,
    /// One per connection that may be open: [`POOL_SIZE`].
    permits: Arc<tokio::sync::Semaphore>,
    /// What a write did, for the page it redirects to: shown once.
    pub notices: Notices,
}

/// How long a write's notice waits for its page.
const NOTICE_LIFETIME: std::time::Duration = std::time::Duration::from_secs(600);

/// The notices of writes, each under a random id the write's redirect carries, shown once by the
/// page it names. A notice is never read from the query itself: a link that says `notice=forgotten`
/// or `retried=4000` would make the dashboard say a forget or a retry happened that did not, and a
/// reload of the page a real one led to would say it again after another run claimed the key.
#[derive(Default)]
pub struct Notices(Mutex<std::collections::HashMap<String, (String, bool, std::time::Instant)>>);

impl Notices {
    /// Keeps `text` (an error's, if `error`) for the page; its id, for the redirect (`None` where
    /// no random id could be made: the page then shows no notice).
    pub fn put(&self, text: String, error: bool) -> Option<String> {
        let id = auth::random_hex().ok()?;
        let mut notices = self.0.lock().unwrap_or_else(|e| e.into_inner());
        notices.retain(|_, (_, _, at)| at.elapsed() < NOTICE_LIFETIME);
        notices.insert(id.clone(), (text, error, std::time::Instant::now()));
        Some(id)
    }

    /// The notice box of the id the query carries (`done`), once: empty for none, an unknown id
    /// or one shown already.
    pub fn take(&self, form: &actions::Form) -> String {
        let Some(id) = form.get("done") else {
            return String::new();
        };
        let mut notices = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match notices.remove(id) {
            Some((text, error, at)) if at.elapsed() < NOTICE_LIFETIME => html::notice(&text, error),
            _ => String::new(),
        }
    }

    /// `path` with the notice's id, where there is one.
    pub fn redirect(path: &str, id: Option<String>) -> String {
        match id {
            Some(id) => {
                let joint = if path.contains('?') { '&' } else { '?' };
                format!("{path}{joint}done={id}")
            }
            None => path.to_owned(),
        }
    }
}

impl App {
    /// Runs `work`, which only reads, with a connection on the blocking pool: see
    /// [`db_write`](Self::db_write), whose wait it shares.
    pub async fn db<T, F>(self: &Arc<Self>, work: F) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: FnOnce(&mut Conn, &Target) -> Result<T, Failure> + Send + 'static,
    {
        self.db_write(move |conn, target, _| work(conn, target))
            .await
    }

    /// Runs `work` with one of the pool's connections on the blocking pool.
    ///
    /// At most [`POOL_SIZE`] requests hold a connection at once, and the page waits at most
    /// [`REQUEST_WAIT`] for one and for its statements: then it answers that the database is busy
    /// and nothing was changed (the work, still waiting in the database, keeps its connection until
    /// the session's timeouts end it). A write that `work` began ([`Progress::begin_write`]) before
    /// then is waited for to its end, so that the page can say what it did.
    pub async fn db_write<T, F>(self: &Arc<Self>, work: F) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: FnOnce(&mut Conn, &Target, &Progress) -> Result<T, Failure> + Send + 'static,
    {
        let deadline = tokio::time::Instant::now() + REQUEST_WAIT;
        let permits = Arc::clone(&self.permits);
        let Ok(Ok(permit)) = tokio::time::timeout_at(deadline, permits.acquire_owned()).await
        else {
            return Err(busy(&format!(
                "all {POOL_SIZE} of the dashboard's connections are in use (another transaction may hold a lock on its tables) and none came free within {} seconds",
                REQUEST_WAIT.as_secs()
            )));
        };
        let progress = Arc::new(Progress(AtomicU8::new(READING)));
        let (app, shared) = (Arc::clone(self), Arc::clone(&progress));
        let mut handle = tokio::task::spawn_blocking(move || {
            // The permit goes with the connection: a request the page stopped waiting for still
            // counts against the pool until its statements end.
            let _permit = permit;
            app.with_connection(|conn, target| work(conn, target, &shared))
        });
        let joined = match tokio::time::timeout_at(deadline, &mut handle).await {
            Ok(joined) => joined,
            Err(_) if progress.give_up() => {
                return Err(busy(&format!(
                    "the request's statements waited more than {} seconds (another transaction may hold a lock on the tables)",
                    REQUEST_WAIT.as_secs()
                )));
            }
            // A write has begun: what it did is told, however long it takes to end.
            Err(_) => handle.await,
        };
        joined.unwrap_or_else(|_| {
            Err(Failure::new(
                Code::Database,
                "the request's database work stopped unexpectedly",
            ))
        })
    }

    /// Runs `work` with an idle connection, or a new one with the dashboard's session limits;
    /// keeps it for the next request unless the work failed.
    fn with_connection<T>(
        &self,
        work: impl FnOnce(&mut Conn, &Target) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let idle = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => limit_waits(self.target.connect()?),
        };
        let result = work(&mut conn, &self.target);
        // A connection that failed a request is dropped: it may be broken.
        if result.is_ok() || result.as_ref().is_err_and(|f| f.code == Code::NotFound) {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < POOL_SIZE {
                pool.push(conn);
            }
        }
        result
    }

    /// Whether the request's `Host` is one this server answers to.
    fn host_allowed(&self, headers: &HeaderMap) -> bool {
        if self.hosts.is_empty() {
            return true;
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }
}

/// The work of a request is still reading.
const READING: u8 = 0;
/// The work of a request has begun to write.
const WRITING: u8 = 1;
/// The page stopped waiting for the work of a request.
const GAVE_UP: u8 = 2;

/// Where a request's database work is: reading, writing, or given up on by the page.
pub struct Progress(AtomicU8);

impl Progress {
    /// Marks the work's write as begun: `false` when the page has already answered that nothing
    /// was changed, and the write must not begin.
    pub fn begin_write(&self) -> bool {
        self.0
            .compare_exchange(READING, WRITING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Marks the work as given up on: `false` when its write has begun.
    fn give_up(&self) -> bool {
        self.0
            .compare_exchange(READING, GAVE_UP, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// The failure of a request that found the database busy, before it changed anything (a 503).
pub fn busy(why: &str) -> Failure {
    Failure::new(
        Code::Connect,
        format!("The database is busy or locked: {why}. Nothing was changed; reload to retry."),
    )
}

/// The failure for a runtime error in the dashboard: a database that stayed busy or locked
/// through the runtime's retries is a 503 that says so; anything else is as the CLI says it.
pub fn db_failure<C: idempotent_runtime::JobStore>(
    conn: &mut C,
    target: &Target,
    error: idempotent_runtime::Error,
) -> Failure {
    let unknown = matches!(
        error,
        idempotent_runtime::Error::OutcomeUnknown { .. }
            | idempotent_runtime::Error::CommitOutcomeUnknown { .. }
    );
    if error.is_retryable() && !error.is_connection_lost() && !unknown {
        // The runtime's own text says what was and was not changed.
        let text = printable(&target.scrub(&crate::commands::with_causes(&error)));
        return Failure::new(
            Code::Connect,
            format!("The database is busy or locked: {text}. Reload to retry."),
        );
    }
    crate::commands::db_failure(conn, target, error)
}

/// `conn` with the dashboard's session limits: a statement waits at most [`LOCK_WAIT_SECONDS`]
/// for a lock and runs at most [`REQUEST_WAIT`]. Best effort: a server that refuses a setting
/// keeps its own (the page's wait still holds).
fn limit_waits(mut conn: Conn) -> Conn {
    use diesel::connection::SimpleConnection;
    let (lock, statement) = (LOCK_WAIT_SECONDS, REQUEST_WAIT.as_secs());
    match &mut conn {
        #[cfg(feature = "postgres")]
        Conn::Postgres(c) => {
            let _ = c.batch_execute(&format!(
                "SET lock_timeout = '{lock}s'; SET statement_timeout = '{statement}s'"
            ));
        }
        #[cfg(feature = "mysql")]
        Conn::Mysql(c) => {
            let _ = c.batch_execute(&format!(
                "SET SESSION lock_wait_timeout = {lock}, innodb_lock_wait_timeout = {lock}"
            ));
            // MariaDB's limit in seconds, else MySQL's (reads only) in milliseconds.
            if c.batch_execute(&format!("SET SESSION max_statement_time = {statement}"))
                .is_err()
            {
                let _ = c.batch_execute(&format!(
                    "SET SESSION max_execution_time = {}",
                    statement * 1000
                ));
            }
        }
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(c) => {
            let _ = c.batch_execute(&format!("PRAGMA busy_timeout = {}", lock * 1000));
        }
    }
    conn
}

/// Writes one line to the audit log (stderr), control characters escaped. A line that quotes a
/// database error quotes it with its secrets hidden already (`Target::scrub`); keys, jobs and
/// reasons are written as they are (a scrubber would take a key `reset-link:password=x` for a
/// secret, and log a key that is not there).
pub fn audit(line: &str) {
    eprintln!("audit: dashboard: {}", printable(line));
}

/// Serves the dashboard until interrupted.
pub fn serve(target: Target, args: &ServeArgs) -> Result<(), Failure> {
    let token = read_token(args)?;
    // Fail at once, with the CLI's exit code, when the database cannot be reached.
    let first = target.connect()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::new(Code::Usage, format!("cannot start the server: {e}")))?;
    runtime.block_on(listen(target, first, token, args))
}

/// Binds, says where, and serves.
async fn listen(
    target: Target,
    first: Conn,
    token: String,
    args: &ServeArgs,
) -> Result<(), Failure> {
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .map_err(|e| Failure::new(Code::Usage, format!("cannot listen on {}: {e}", args.bind)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::new(Code::Usage, format!("cannot listen on {}: {e}", args.bind)))?;
    let mut hosts = args.allowed_hosts.clone();
    if addr.ip().is_loopback() {
        let port = addr.port();
        hosts.extend([addr.to_string(), format!("localhost:{port}")]);
    } else if !hosts.is_empty() {
        hosts.push(addr.to_string());
    }
    let app = Arc::new(App {
        gate: auth::Gate::new(&token),
        writes: args.allow_writes,
        hosts,
        pool: Mutex::new(vec![limit_waits(first)]),
        permits: Arc::new(tokio::sync::Semaphore::new(POOL_SIZE)),
        target,
        notices: Notices::default(),
    });
    let mode = if app.writes {
        "writes allowed"
    } else {
        "read-only"
    };
    eprintln!(
        "idempotent-jobs dashboard: listening on http://{addr}/ ({mode}); database {}",
        app.target.shown
    );
    if !addr.ip().is_loopback() {
        eprintln!(
            "warning: the dashboard listens on {addr}, beyond this machine, over plain HTTP: put it behind a TLS proxy"
        );
    }
    axum::serve(
        listener,
        router(app).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| Failure::new(Code::Usage, format!("the server stopped: {e}")))
}

/// The token from `--token-file` or the environment; never printed.
fn read_token(args: &ServeArgs) -> Result<String, Failure> {
    let token = match &args.token_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| {
                Failure::new(
                    Code::Usage,
                    format!("cannot read the token file {}: {e}", path.display()),
                )
            })?
            .trim()
            .to_owned(),
        None => std::env::var(TOKEN_VAR)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    };
    if token.chars().count() < 16 {
        return Err(Failure::new(
            Code::Usage,
            format!(
                "serve needs an access token of at least 16 characters: set {TOKEN_VAR} (in the environment or .env), or pass --token-file FILE. For example: export {TOKEN_VAR}=$(openssl rand -hex 32)"
            ),
        ));
    }
    Ok(token)
}

/// The routes, behind the guard.
fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/keys", get(pages::keys))
        .route("/lookup", get(pages::lookup))
        .route("/outbox", get(pages::outbox))
        .route("/login", get(actions::login_form).post(actions::login))
        .route("/logout", post(actions::logout))
        .route("/forget", post(actions::forget))
        .route("/outbox/retry", post(actions::retry))
        .route("/static/app.css", get(stylesheet))
        .fallback(pages::not_found)
        .layer(middleware::from_fn_with_state(Arc::clone(&app), guard))
        .with_state(app)
}

/// The style sheet.
async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        html::CSS,
    )
        .into_response()
}

/// Refuses what must not reach a handler; adds the security headers to every response.
async fn guard(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = match admit(&app, peer, request).await {
        Ok(request) => next.run(request).await,
        Err(refused) => refused,
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The answer to a request whose `Host` this server does not answer to, audited with the Host it
/// named.
fn refuse_host(headers: &HeaderMap, method: &Method, path: &str, peer: SocketAddr) -> Response {
    let host = match headers.get(header::HOST) {
        Some(host) => format!(
            "Host `{}`",
            crate::table::truncate(&String::from_utf8_lossy(host.as_bytes()), 100)
        ),
        None => "no Host header".to_owned(),
    };
    audit(&format!(
        "refused {method} {path} from {peer}: {host}, not one this server answers to"
    ));
    (
        StatusCode::MISDIRECTED_REQUEST,
        "this server does not answer to that Host (start it with --allowed-host NAME:PORT)",
    )
        .into_response()
}

/// The request, with its [`Auth`] and peer attached, or the response that refuses it. Each
/// refusal writes one audit line with its reason.
async fn admit(app: &Arc<App>, peer: SocketAddr, request: Request) -> Result<Request, Response> {
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let method = parts.method.clone();
    if !app.host_allowed(&parts.headers) {
        return Err(refuse_host(&parts.headers, &method, &path, peer));
    }
    let public = path == "/login" || path.starts_with("/static/");
    let post = method == Method::POST;
    if post && let Some(why) = auth::cross_origin(&parts.headers) {
        audit(&format!("refused POST {path} from {peer}: {why}"));
        return Err(pages::refused(
            StatusCode::FORBIDDEN,
            &format!("Refused: {why}. Nothing was changed."),
        ));
    }
    let auth = match app.gate.admit(&parts.headers) {
        Ok(auth) => auth,
        // The login form and the style sheet need no token.
        Err(_) if public => {
            parts.extensions.insert(peer);
            return Ok(Request::from_parts(parts, body));
        }
        Err(denied) => {
            let reason = denied.reason();
            if post {
                audit(&format!("refused POST {path} from {peer}: {reason}"));
                return Err(pages::refused(
                    StatusCode::UNAUTHORIZED,
                    "Refused: log in with the access token first. Nothing was changed.",
                ));
            }
            audit(&format!(
                "refused {method} {path} from {peer}: {reason}; sent to the login form"
            ));
            return Err(Redirect::to("/login").into_response());
        }
    };
    let body = if post {
        let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM_BYTES).await else {
            audit(&format!(
                "refused POST {path} from {peer} ({}): the form is larger than {} KiB",
                auth.who(),
                MAX_FORM_BYTES / 1024
            ));
            return Err(pages::refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                "The form is too large.",
            ));
        };
        if let Some(csrf) = auth.csrf() {
            let form = actions::Form::parse(&bytes);
            let sent = form.get("csrf").unwrap_or_default();
            if !auth::constant_time_eq(sent.as_bytes(), csrf.as_bytes()) {
                audit(&format!(
                    "refused POST {path} from {peer} ({}): the form's CSRF token is missing or wrong",
                    auth.who()
                ));
                return Err(pages::refused(
                    StatusCode::FORBIDDEN,
                    "Refused: the form's CSRF token is missing or wrong (reload the page and try again). Nothing was changed.",
                ));
            }
        }
        axum::body::Body::from(bytes)
    } else {
        body
    };
    parts.extensions.insert(auth);
    parts.extensions.insert(peer);
    Ok(Request::from_parts(parts, body))
}
