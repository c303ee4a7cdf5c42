//! What changes something: logging in and out, forgetting a key, retrying parked messages. Each
//! is written to the audit log; forgets and retries need `--allow-writes`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use idempotent_runtime::keys::{self, KeyRecord};
use idempotent_runtime::outbox;

use super::auth::{COOKIE, cookie};
use super::html::{Frame, Section, esc, notice};
use super::pages::{csrf_of, failed, refused, respond};
use super::{App, Auth, audit, busy, db_failure, on_conn};
use crate::connect::Target;
use crate::failure::{Code, Failure};

/// A form (or query string): its fields in order, repeated names kept.
pub struct Form(Vec<(String, String)>);

impl Form {
    /// Reads `application/x-www-form-urlencoded` bytes.
    pub fn parse(bytes: &[u8]) -> Self {
        Self(
            form_urlencoded::parse(bytes)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of a field.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a field, in order.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

// --- logging in and out ----------------------------------------------------------------------

/// The login page.
fn login_page(app: &App, status: StatusCode, error: Option<&str>) -> Response {
    let frame = Frame {
        title: "Log in",
        section: Section::Login,
        database: &app.target.shown,
        writes: app.writes,
        csrf: None,
        refresh: None,
    };
    let body = format!(
        "{}<form class=\"card\" method=\"post\" action=\"/login\">\
<label for=\"token\">Access token</label>\
<input type=\"password\" id=\"token\" name=\"token\" autocomplete=\"off\" required aria-describedby=\"token-hint\">\
<p class=\"hint\" id=\"token-hint\">The token the dashboard was started with (IDEMPOTENT_DASHBOARD_TOKEN or --token-file). Ask whoever runs it.</p>\
<button type=\"submit\" id=\"login\">Log in</button></form>",
        error.map(|e| notice(e, true)).unwrap_or_default()
    );
    respond(status, &frame, &body)
}

/// `GET /login`.
pub async fn login_form(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if app.gate.authenticate(&headers).is_some() {
        return Redirect::to("/").into_response();
    }
    login_page(&app, StatusCode::OK, None)
}

/// `POST /login`: the token opens a session (a cookie); a wrong one waits a second.
pub async fn login(
    State(app): State<Arc<App>>,
    Extension(peer): Extension<SocketAddr>,
    body: Bytes,
) -> Response {
    let form = Form::parse(&body);
    if !app.gate.is_token(form.get("token").unwrap_or_default()) {
        audit(&format!("refused a login from {peer}: wrong token"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        return login_page(&app, StatusCode::UNAUTHORIZED, Some("Wrong token."));
    }
    let id = match app.gate.open_session() {
        Ok(id) => id,
        Err(_) => {
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "No randomness for a session.",
            );
        }
    };
    audit(&format!("login from {peer} (session {})", &id[..8]));
    let cookie = format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// `POST /logout`.
pub async fn logout(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    Extension(peer): Extension<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Some(id) = cookie(&headers, COOKIE) {
        app.gate.close_session(id);
    }
    audit(&format!("logout from {peer} ({})", auth.who()));
    let cookie = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response()
}

// --- forget --------------------------------------------------------------------------------------

/// The forget form under a record, or why there is none.
pub fn forget_form(app: &App, auth: &Auth, record: &KeyRecord) -> String {
    if !app.writes {
        return "<p class=\"hint\">Read-only: start the dashboard with --allow-writes to forget keys.</p>".to_owned();
    }
    format!(
        "<form class=\"card\" method=\"post\" action=\"/forget\"><h2>Forget this key</h2>\
<p>Deletes the key's row, so that the job's next delivery runs it again. It cannot undo what the job did.</p>\
{csrf}<input type=\"hidden\" name=\"digest\" value=\"{digest}\">\
<input type=\"hidden\" name=\"revision\" value=\"{revision}\">\
<label for=\"reason\">Reason (required; goes into the audit log)</label>\
<textarea id=\"reason\" name=\"reason\" rows=\"2\" required maxlength=\"500\"></textarea>\
<label class=\"check\"><input type=\"checkbox\" id=\"confirm\" name=\"confirm\" value=\"yes\" required> The job's next delivery of <code>{key}</code> runs it again.</label>\
<button type=\"submit\" class=\"danger\" id=\"forget\">Forget the key</button></form>",
        csrf = csrf_of(auth),
        digest = record.digest_hex(),
        revision = esc(&record.revision()),
        key = esc(&record.key),
    )
}

/// `POST /forget`: forgets one key by digest, with a required reason, if its row is still the run
/// the form showed (its revision): a run that renewed the key since is left, and said so.
pub async fn forget(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    Extension(peer): Extension<SocketAddr>,
    body: Bytes,
) -> Response {
    if !app.writes {
        audit(&format!(
            "refused a forget from {peer} ({}): read-only",
            auth.who()
        ));
        return refused(
            StatusCode::FORBIDDEN,
            "Refused: the dashboard is read-only (start it with --allow-writes). Nothing was changed.",
        );
    }
    let form = Form::parse(&body);
    let reason = form.get("reason").unwrap_or_default().trim().to_owned();
    let digest = form.get("digest").and_then(keys::parse_digest);
    let revision = form.get("revision").map(str::to_owned);
    let (Some(digest), Some(revision), false, Some("yes")) =
        (digest, revision, reason.is_empty(), form.get("confirm"))
    else {
        return refused(
            StatusCode::BAD_REQUEST,
            "A forget needs the key's digest and revision, a reason, and the confirmation. Nothing was changed.",
        );
    };
    let recorded = format!(
        "{reason} (idempotent-jobs dashboard, {} from {peer})",
        auth.who()
    );
    let done = app
        .db_write(move |conn, target, progress| {
            on_conn!(conn, c => {
                refuse_newer_schema(c, target)?;
                let record = keys::lookup_digest(c, &digest).map_err(|e| db_failure(c, target, e))?;
                let Some(record) = record else {
                    return Err(Failure::new(Code::NotFound, "No such key: it was forgotten or pruned meanwhile. Nothing was changed."));
                };
                if record.revision() != revision {
                    // Another run renewed the key after the page showed it.
                    return Ok((record, false, recorded, Ok(true)));
                }
                if !progress.begin_write() {
                    return Err(too_late());
                }
                let forgotten = keys::forget_record(c, &record, &recorded).map_err(|e| db_failure(c, target, e))?;
                // Why nothing was forgotten: renewed, or gone; unknown when the look-up fails.
                let there = match forgotten {
                    true => Ok(false),
                    false => keys::lookup_digest(c, &digest).map(|r| r.is_some()),
                };
                Ok((record, forgotten, recorded, there))
            })
        })
        .await;
    forget_answer(&app, &auth, done)
}

/// What a forget did: the record read, whether it was forgotten, the reason recorded, and, when it
/// was not, whether the key is still there (renewed) or not (deleted), or the error of the look-up
/// that would tell.
type Forgetting = (
    KeyRecord,
    bool,
    String,
    Result<bool, idempotent_runtime::Error>,
);

/// What the dashboard answers to a forget.
fn forget_answer(app: &App, auth: &Auth, done: Result<Forgetting, Failure>) -> Response {
    match done {
        Ok((record, true, recorded, _)) => {
            audit(&format!(
                "forgot key {:?} of job {:?} (digest {}): reason {recorded:?}",
                record.key,
                record.job,
                record.digest_hex()
            ));
            let done = app.notices.put(
                "Forgot the key: the job's next delivery runs it again. The forget was written to the audit log.".to_owned(),
                false,
            );
            let page = format!("/lookup?digest={}", record.digest_hex());
            Redirect::to(&super::Notices::redirect(&page, done)).into_response()
        }
        Ok((_, false, _, Ok(true))) => refused(
            StatusCode::CONFLICT,
            "The key was renewed by another run meanwhile: its record is not the one read. Nothing was changed; look at it again.",
        ),
        Ok((_, false, _, Ok(false))) => refused(
            StatusCode::CONFLICT,
            "The key was deleted by someone else meanwhile. Nothing was changed.",
        ),
        Ok((_, false, _, Err(_))) => refused(
            StatusCode::CONFLICT,
            "The key changed since it was read (deleted, or renewed by another run). Nothing was changed; look at it again.",
        ),
        Err(failure) => failed(app, auth, &failure),
    }
}

/// Refuses a write, before it begins, on tables a newer release made (a schema version above this
/// build's), as the CLI's writing commands do: that release may keep rules this dashboard does not
/// know. A 503 whose page says that nothing was changed and that an upgrade, not a reload, helps.
fn refuse_newer_schema<C: idempotent_runtime::JobStore>(
    conn: &mut C,
    target: &Target,
) -> Result<(), Failure> {
    let Some((found, known)) = crate::commands::newer_schema(conn) else {
        return Ok(());
    };
    Err(Failure::new(
        Code::Schema,
        format!(
            "Refused: the idempotent-jobs tables at {} were made by a newer release of idempotent-jobs (schema version {found}; this dashboard knows versions up to {known}), which may keep rules this dashboard does not know. Nothing was changed. Upgrade idempotent-jobs-cli to that release or later and restart the dashboard: reloading does not help until then.",
            target.shown
        ),
    ))
}

/// The failure of a write whose page has already answered that the database was busy: it is not
/// begun, as that page said.
fn too_late() -> Failure {
    busy("the page stopped waiting before the write began")
}

// --- retry ---------------------------------------------------------------------------------------

/// The retry button of one parked message.
pub fn retry_form(app: &App, auth: &Auth, message_id: &str) -> String {
    if !app.writes {
        return "read-only".to_owned();
    }
    format!(
        "<form method=\"post\" action=\"/outbox/retry\" class=\"inline\">{}<input type=\"hidden\" name=\"message_id\" value=\"{id}\">\
<button type=\"submit\" class=\"secondary\" aria-label=\"Retry {id}\">Retry</button></form>",
        csrf_of(auth),
        id = esc(message_id)
    )
}

/// The button that retries every parked message.
pub fn retry_all_form(app: &App, auth: &Auth, parked: usize) -> String {
    if !app.writes {
        return "<p class=\"hint\">Read-only: start the dashboard with --allow-writes to retry messages.</p>".to_owned();
    }
    format!(
        "<form method=\"post\" action=\"/outbox/retry\">{}<input type=\"hidden\" name=\"all\" value=\"yes\">\
<button type=\"submit\" id=\"retry-all\">Retry all parked messages ({parked})</button></form>",
        csrf_of(auth)
    )
}

/// `POST /outbox/retry`: un-parks one message (`message_id`) or all (`all=yes`).
pub async fn retry(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    Extension(peer): Extension<SocketAddr>,
    body: Bytes,
) -> Response {
    if !app.writes {
        audit(&format!(
            "refused a retry from {peer} ({}): read-only",
            auth.who()
        ));
        return refused(
            StatusCode::FORBIDDEN,
            "Refused: the dashboard is read-only (start it with --allow-writes). Nothing was changed.",
        );
    }
    let form = Form::parse(&body);
    let id = form.get("message_id").map(str::to_owned);
    if id.is_none() && form.get("all") != Some("yes") {
        return refused(
            StatusCode::BAD_REQUEST,
            "A retry needs a message id, or all.",
        );
    }
    let which = id.clone();
    let done = app
        .db_write(move |conn, target, progress| {
            on_conn!(conn, c => {
                refuse_newer_schema(c, target)?;
                if !progress.begin_write() {
                    return Err(too_late());
                }
                outbox::retry_parked(c, which.as_deref()).map_err(|e| db_failure(c, target, e))
            })
        })
        .await;
    match done {
        Ok(0) if id.is_some() => {
            let done = app.notices.put(
                "No parked message with that id: it was retried or delivered meanwhile.".to_owned(),
                true,
            );
            Redirect::to(&super::Notices::redirect("/outbox", done)).into_response()
        }
        Ok(n) => {
            let mut line = format!("un-parked {n} message(s) ");
            let _ = match &id {
                Some(id) => write!(line, "({id:?})"),
                None => write!(line, "(all)"),
            };
            audit(&format!("{line} from {peer} ({})", auth.who()));
            let s = if n == 1 { "" } else { "s" };
            let done = app.notices.put(
                format!("Un-parked {n} message{s}: the relay sends them again at its next round."),
                false,
            );
            Redirect::to(&super::Notices::redirect("/outbox", done)).into_response()
        }
        Err(failure) => failed(&app, &auth, &failure),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_keep_repeated_fields() {
        let form = Form::parse(b"template=invoice%3A%3Cm%3E&value=a%3Ab&value=c+d&x=");
        assert_eq!(form.get("template"), Some("invoice:<m>"));
        assert_eq!(form.all("value").collect::<Vec<_>>(), ["a:b", "c d"]);
        assert_eq!(form.get("x"), Some(""));
        assert_eq!(form.get("y"), None);
    }
}
