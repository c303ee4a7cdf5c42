//! The pages: overview, keys, look-up, outbox, and the pages that say no.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use idempotent_runtime::JobStore;
use idempotent_runtime::keys::{self, JobCount, KeyQuery, KeyRecord};
use idempotent_runtime::outbox::{self, OutboxCounts, OutboxMessage};

use super::actions::Form;
use super::chart::{Series, chart};
use super::html::{Frame, Section, csrf_field, esc, notice, page, table, url_value};
use super::sql::{Failed, HOURS, HourRow, Hourly};
use super::{App, Auth, busy, db_failure, on_conn};
use crate::connect::Target;
use crate::failure::{Code, Failure};
use crate::keyform::{key_from_template, placeholders};
use crate::nearest::{self, Nearest};
use crate::table::printable;
use crate::time::{format_age, format_seconds, parse_time_arg};

/// The page around a view.
pub fn frame<'a>(
    app: &'a App,
    auth: Option<&'a Auth>,
    title: &'a str,
    section: Section,
) -> Frame<'a> {
    Frame {
        title,
        section,
        database: &app.target.shown,
        writes: app.writes,
        csrf: auth.and_then(Auth::csrf),
        refresh: None,
    }
}

/// A whole page, as a response.
pub fn respond(status: StatusCode, frame: &Frame<'_>, body: &str) -> Response {
    (status, Html(page(frame, body))).into_response()
}

/// A refusal: a small page of its own (no database, no session needed).
pub fn refused(status: StatusCode, why: &str) -> Response {
    let frame = Frame {
        title: "Refused",
        section: Section::Login,
        database: "",
        writes: false,
        csrf: None,
        refresh: None,
    };
    let body = format!(
        "{}<p><a href=\"/\">Back to the dashboard</a></p>",
        notice(why, true)
    );
    respond(status, &frame, &body)
}

/// A failed database request, with the CLI's message (secrets hidden).
pub fn failed(app: &App, auth: &Auth, failure: &Failure) -> Response {
    let status = match failure.code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::Usage => StatusCode::BAD_REQUEST,
        Code::Connect | Code::Schema => StatusCode::SERVICE_UNAVAILABLE,
        Code::Database => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Changed => StatusCode::CONFLICT,
    };
    let text = app.target.scrub(&failure.message);
    super::audit(&format!("error: {text}"));
    let body = notice(&text, true);
    respond(
        status,
        &frame(app, Some(auth), "Error", Section::Overview),
        &body,
    )
}

/// Pages that do not exist.
pub async fn not_found() -> Response {
    refused(StatusCode::NOT_FOUND, "No such page.")
}

// --- overview ----------------------------------------------------------------------------------

/// What the overview shows.
struct Overview {
    jobs: Vec<JobCount>,
    keys_hourly: Vec<HourRow>,
    counts: OutboxCounts,
    delivered_hourly: Vec<HourRow>,
}

/// Reads the overview's data.
fn load_overview<C: JobStore + Hourly>(conn: &mut C, target: &Target) -> Result<Overview, Failure> {
    let jobs = keys::job_counts(conn).map_err(|e| db_failure(conn, target, e))?;
    let counts = outbox::counts(conn).map_err(|e| db_failure(conn, target, e))?;
    let keys_hourly = match conn.keys_per_hour() {
        Ok(rows) => rows,
        Err(e) => return Err(chart_failure(conn, target, &e)),
    };
    let delivered_hourly = match conn.delivered_per_hour() {
        Ok(rows) => rows,
        Err(e) => return Err(chart_failure(conn, target, &e)),
    };
    Ok(Overview {
        jobs,
        keys_hourly,
        counts,
        delivered_hourly,
    })
}

/// The failure of a chart's statement: a lost connection (the connection answers nothing more)
/// and a busy database are 503s, as the runtime's own reads are; anything else is the database's
/// error. Busy is what the error is (SQLSTATE, error number), read as the runtime reads its own
/// errors: not its English words, which a server whose `lc_messages` is another language does not
/// use.
fn chart_failure<C: Hourly>(conn: &mut C, target: &Target, failed: &Failed) -> Failure {
    let text = printable(&target.scrub(failed.error.to_string().trim_end()));
    if !conn.alive() {
        return Failure::new(
            Code::Connect,
            format!(
                "lost the connection to the database at {}: {text}",
                target.shown
            ),
        );
    }
    if failed.busy {
        return busy(&format!("a chart's statement waited too long ({text})"));
    }
    Failure::new(
        Code::Database,
        format!("{text} (database: {})", target.shown),
    )
}

/// `/`: keys per job, keys done per hour, the outbox; refreshes every 30 seconds.
pub async fn overview(State(app): State<Arc<App>>, Extension(auth): Extension<Auth>) -> Response {
    let data = match app
        .db(|conn, target| on_conn!(conn, c => load_overview(c, target)))
        .await
    {
        Ok(data) => data,
        Err(failure) => return failed(&app, &auth, &failure),
    };
    let mut body = String::from("<p class=\"hint\">Refreshes every 30 seconds.</p><h2>Jobs</h2>");
    let rows: Vec<Vec<String>> = data
        .jobs
        .iter()
        .map(|j| {
            vec![
                format!(
                    "<a href=\"/keys?job={}\">{}</a>",
                    url_value(&j.job),
                    esc(&j.job)
                ),
                j.keys.to_string(),
                j.lapsed.to_string(),
                format_seconds(j.oldest),
                format_seconds(j.newest),
            ]
        })
        .collect();
    if rows.is_empty() {
        body.push_str("<p>No keys in done_jobs yet.</p>");
    } else {
        body.push_str(&table(
            "Keys per job",
            &["Job", "Keys", "Lapsed", "Oldest (UTC)", "Newest (UTC)"],
            &rows,
        ));
    }
    body.push_str("<h2>Keys done per hour</h2>");
    body.push_str(&chart(
        "Last 24 hours",
        "keys done",
        &Series::new(&data.keys_hourly, 24),
    ));
    body.push_str(&chart(
        "Last 7 days",
        "keys done",
        &Series::new(&data.keys_hourly, HOURS as usize),
    ));
    body.push_str(&outbox_summary(&data.counts));
    body.push_str(&chart(
        "Delivered per hour, last 24 hours",
        "delivered",
        &Series::new(&data.delivered_hourly, 24),
    ));
    body.push_str(&chart(
        "Delivered per hour, last 7 days",
        "delivered",
        &Series::new(&data.delivered_hourly, HOURS as usize),
    ));
    let mut frame = frame(&app, Some(&auth), "Overview", Section::Overview);
    frame.refresh = Some(30);
    respond(StatusCode::OK, &frame, &body)
}

/// The outbox's counts as four figures.
fn outbox_summary(c: &OutboxCounts) -> String {
    let mut out = String::from("<h2>Outbox</h2><div class=\"grid\">");
    for (label, n, href) in [
        ("pending", c.pending, "/outbox"),
        ("leased", c.leased, "/outbox"),
        ("parked", c.parked, "/outbox#parked"),
        ("delivered", c.delivered, "/outbox"),
    ] {
        let _ = write!(
            out,
            "<a class=\"stat\" href=\"{href}\"><b id=\"outbox-{label}\">{n}</b>{label}</a>"
        );
    }
    out.push_str("</div>");
    out
}

// --- keys ----------------------------------------------------------------------------------------

/// The filters of `/keys`.
struct KeyFilters {
    job: String,
    since: String,
    before: String,
    /// Where the page starts: after this key (the previous page's last).
    after: String,
    limit: u32,
}

impl KeyFilters {
    /// The filters of a `/keys` query string, trimmed; the limit 50 unless given, within 1..=500.
    fn parse(query: &[u8]) -> Self {
        let form = Form::parse(query);
        let field = |name: &str| form.get(name).unwrap_or_default().trim().to_owned();
        KeyFilters {
            job: field("job"),
            since: field("since"),
            before: field("before"),
            after: field("after"),
            limit: form
                .get("limit")
                .and_then(|l| l.parse().ok())
                .unwrap_or(50u32)
                .clamp(1, 500),
        }
    }

    /// The query these filters ask for (one key more than the page, to tell whether there are
    /// more), and what could not be read of them. A time given as a duration ago is read once,
    /// here, and kept as the time it meant (for the next page's link).
    fn query(&mut self) -> (KeyQuery, Vec<String>) {
        let mut query = KeyQuery::default().limit(self.limit + 1);
        let mut problems = Vec::new();
        if !self.job.is_empty() {
            query = query.job(self.job.as_str());
        }
        for (text, since) in [(&mut self.since, true), (&mut self.before, false)] {
            if text.is_empty() {
                continue;
            }
            match parse_time_arg(text) {
                Ok(time) => {
                    query = match since {
                        true => query.done_from(time),
                        false => query.done_before(time),
                    };
                    *text = crate::time::format_micros(time);
                }
                Err(why) => problems.push(why),
            }
        }
        if !self.after.is_empty() {
            match crate::page::After::parse(&self.after) {
                Ok(after) => query = after.apply(query),
                Err(why) => problems.push(why),
            }
        }
        (query, problems)
    }

    /// The link to the page after `last`, with the same filters (times as [`Self::query`] read
    /// them: a `since=1h` read again on the next page would have moved on, and skipped keys).
    fn next_page(&self, last: &KeyRecord) -> String {
        format!(
            "<p><a rel=\"next\" href=\"/keys?job={}&amp;since={}&amp;before={}&amp;after={}&amp;limit={}\">Older keys →</a></p>",
            url_value(&self.job),
            url_value(&self.since),
            url_value(&self.before),
            url_value(&crate::page::After::of(last).to_string()),
            self.limit
        )
    }
}

/// `/keys`: keys newest first, with filters and an "older" link.
pub async fn keys(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    RawQuery(query): RawQuery,
) -> Response {
    let mut filters = KeyFilters::parse(query.unwrap_or_default().as_bytes());
    let typed = (filters.since.clone(), filters.before.clone());
    let (query, problems) = filters.query();
    // A filter that could not be read lists nothing: the keys of the filters that could would
    // read as the answer to the whole form.
    let list = problems.is_empty();
    let loaded = app
        .db(move |conn, target| {
            on_conn!(conn, c => {
                let jobs = keys::job_counts(c).map_err(|e| db_failure(c, target, e))?;
                let records = match list {
                    true => keys::list(c, &query).map_err(|e| db_failure(c, target, e))?,
                    false => Vec::new(),
                };
                Ok::<_, Failure>((jobs, records))
            })
        })
        .await;
    let (jobs, mut records) = match loaded {
        Ok(loaded) => loaded,
        Err(failure) => return failed(&app, &auth, &failure),
    };
    let more = records.len() > filters.limit as usize;
    records.truncate(filters.limit as usize);
    // The form keeps what was typed (`1h`); the next page's link, the time it meant.
    let typed = KeyFilters {
        job: filters.job.clone(),
        since: typed.0,
        before: typed.1,
        after: filters.after.clone(),
        limit: filters.limit,
    };
    let mut body = key_filters_form(&typed, &jobs);
    for problem in &problems {
        body.push_str(&notice(problem, true));
    }
    let frame = frame(&app, Some(&auth), "Keys", Section::Keys);
    if !list {
        body.push_str(&notice(
            "No keys are listed: correct the filter above and look again.",
            true,
        ));
        return respond(StatusCode::BAD_REQUEST, &frame, &body);
    }
    body.push_str(&keys_table(&records));
    if more && let Some(last) = records.last() {
        body.push_str(&filters.next_page(last));
    }
    respond(StatusCode::OK, &frame, &body)
}

/// The filter form of `/keys`.
fn key_filters_form(filters: &KeyFilters, jobs: &[JobCount]) -> String {
    let mut options = String::from("<option value=\"\">all jobs</option>");
    for job in jobs {
        let selected = if job.job == filters.job {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            options,
            "<option value=\"{v}\"{selected}>{v} ({n})</option>",
            v = esc(&job.job),
            n = job.keys
        );
    }
    format!(
        "<form class=\"card\" method=\"get\" action=\"/keys\">\
<label for=\"job\">Job</label><select id=\"job\" name=\"job\">{options}</select>\
<label for=\"since\">Done at or after</label><input type=\"text\" id=\"since\" name=\"since\" value=\"{since}\" aria-describedby=\"time-hint\">\
<label for=\"before\">Done before</label><input type=\"text\" id=\"before\" name=\"before\" value=\"{before}\" aria-describedby=\"time-hint\">\
<p class=\"hint\" id=\"time-hint\">RFC 3339 (2026-11-30T10:00:00Z) or a duration ago (2h, 7d).</p>\
<label for=\"limit\">Keys per page</label><input type=\"text\" inputmode=\"numeric\" id=\"limit\" name=\"limit\" value=\"{limit}\">\
<button type=\"submit\">List keys</button></form>",
        since = esc(&filters.since),
        before = esc(&filters.before),
        limit = filters.limit
    )
}

/// Keys as a table, each linking to its record.
fn keys_table(records: &[KeyRecord]) -> String {
    if records.is_empty() {
        return "<p>No keys match.</p>".to_owned();
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                esc(&r.job),
                format!(
                    "<a class=\"mono\" href=\"/lookup?digest={}\">{}</a>",
                    r.digest_hex(),
                    esc(&r.key)
                ),
                format_seconds(r.done_at),
                r.expires_at
                    .map_or_else(|| "never".to_owned(), format_seconds),
                yes_no(r.lapsed).to_owned(),
                match r.next_delivery_runs() {
                    true => "runs the job".to_owned(),
                    false => "replays".to_owned(),
                },
            ]
        })
        .collect();
    table(
        "Keys, newest first",
        &[
            "Job",
            "Key",
            "Done at (UTC)",
            "Expires at (UTC)",
            "Lapsed",
            "Next delivery",
        ],
        &rows,
    )
}

/// `yes` or `no`.
fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

// --- look-up ----------------------------------------------------------------------------------

/// What `/lookup` was asked.
enum Asked {
    /// Nothing yet, or a template whose values are still to be filled in.
    Form,
    /// A key, by digest, with its text when given as text.
    Key {
        digest: [u8; 32],
        text: Option<String>,
        /// The digests of the other keys the text may name, tried in order (see
        /// [`crate::commands::other_forms`]: the key whose stored, escaped form the text is, the
        /// key `keys list` prints so).
        others: Vec<[u8; 32]>,
    },
    /// A request that cannot be read.
    Bad(String),
}

/// Reads `/lookup`'s query.
fn asked(form: &Form) -> Asked {
    if let Some(hex) = form.get("digest").map(str::trim).filter(|d| !d.is_empty()) {
        return match keys::parse_digest(hex) {
            Some(digest) => Asked::Key {
                digest,
                text: None,
                others: Vec::new(),
            },
            None => Asked::Bad("A digest is 64 hexadecimal digits.".to_owned()),
        };
    }
    if let Some(key) = form.get("key").filter(|k| !k.is_empty()) {
        let others = crate::commands::other_forms(key)
            .iter()
            .map(idempotent_runtime::JobKey::digest)
            .collect();
        let key = idempotent_runtime::JobKey::new(key);
        return Asked::Key {
            digest: key.digest(),
            text: Some(key.readable().into_owned()),
            others,
        };
    }
    let Some(template) = form.get("template").filter(|t| !t.trim().is_empty()) else {
        return Asked::Form;
    };
    let values: Vec<String> = form.all("value").map(str::to_owned).collect();
    match placeholders(template) {
        Err(why) => Asked::Bad(format!("The template does not parse: {why}")),
        Ok(names) if names.len() != values.len() => Asked::Form,
        Ok(_) => match key_from_template(template, &values) {
            Ok(key) => Asked::Key {
                digest: key.digest(),
                text: Some(key.readable().into_owned()),
                others: Vec::new(),
            },
            Err(why) => Asked::Bad(why),
        },
    }
}

/// What a look-up found.
enum Found {
    Record(KeyRecord),
    Missing(Option<Nearest>),
}

/// `/lookup`: the three ways to name a key, and the record (or the nearest keys).
pub async fn lookup(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    RawQuery(query): RawQuery,
) -> Response {
    let form = Form::parse(query.unwrap_or_default().as_bytes());
    let mut body = app.notices.take(&form);
    body.push_str(&lookup_forms(&form));
    match asked(&form) {
        Asked::Form => {}
        Asked::Bad(why) => body.push_str(&notice(&why, true)),
        Asked::Key {
            digest,
            text,
            others,
        } => {
            let wanted = text.clone();
            let digests: Vec<[u8; 32]> = std::iter::once(digest).chain(others).collect();
            let found = app
                .db(move |conn, target| {
                    on_conn!(conn, c => find(c, target, &digests, wanted.as_deref()))
                })
                .await;
            match found {
                Ok(Found::Record(record)) => {
                    body.push_str(&record_html(&record));
                    body.push_str(&super::actions::forget_form(&app, &auth, &record));
                }
                Ok(Found::Missing(near)) => {
                    body.push_str(&missing_html(&digest, text.as_deref(), near.as_ref()))
                }
                Err(failure) => return failed(&app, &auth, &failure),
            }
        }
    }
    respond(
        StatusCode::OK,
        &frame(&app, Some(&auth), "Look a key up", Section::Lookup),
        &body,
    )
}

/// Looks a key up (by the first of `digests` that is there: the text as given, then the other
/// keys it may name), and the nearest keys when it is missing.
fn find<C: JobStore>(
    conn: &mut C,
    target: &Target,
    digests: &[[u8; 32]],
    text: Option<&str>,
) -> Result<Found, Failure> {
    for digest in digests {
        if let Some(record) =
            keys::lookup_digest(conn, digest).map_err(|e| db_failure(conn, target, e))?
        {
            return Ok(Found::Record(record));
        }
    }
    let near = match text {
        Some(text) => nearest::nearest(conn, text, 5).map_err(|e| db_failure(conn, target, e))?,
        None => None,
    };
    Ok(Found::Missing(near))
}

/// The three look-up forms, filled in with what was asked.
fn lookup_forms(form: &Form) -> String {
    let key = form.get("key").unwrap_or_default();
    let digest = form.get("digest").unwrap_or_default();
    let template = form.get("template").unwrap_or_default();
    let mut values = String::new();
    if let Ok(names) = placeholders(template) {
        let given: Vec<&str> = form.all("value").collect();
        for (i, name) in names.iter().enumerate() {
            let _ = write!(
                values,
                "<label for=\"value-{n}\">Value of {name}</label><input type=\"text\" id=\"value-{n}\" name=\"value\" value=\"{v}\">",
                n = i + 1,
                name = esc(name),
                v = esc(given.get(i).copied().unwrap_or_default())
            );
        }
    }
    let button = if values.is_empty() {
        "Next: its values"
    } else {
        "Look up"
    };
    format!(
        "<form class=\"card\" method=\"get\" action=\"/lookup\"><h2>By key</h2>\
<label for=\"key\">Key, as stored</label><input type=\"search\" id=\"key\" name=\"key\" value=\"{key}\" aria-describedby=\"key-hint\">\
<p class=\"hint\" id=\"key-hint\">As the keys list shows it, e.g. invoice:2026-10:cust_481. Values are escaped: a : inside a value is stored as %3A.</p>\
<button type=\"submit\" id=\"lookup-key\">Look up</button></form>\
<form class=\"card\" method=\"get\" action=\"/lookup\"><h2>By the handler's inputs</h2>\
<label for=\"template\">Key template</label><input type=\"text\" id=\"template\" name=\"template\" value=\"{template}\" aria-describedby=\"template-hint\">\
<p class=\"hint\" id=\"template-hint\">As in #[idempotent_job(key = \"invoice:&lt;month&gt;:&lt;customer_id&gt;\")]; the values are escaped as the handler's companion escapes them.</p>\
{values}<button type=\"submit\" id=\"lookup-template\">{button}</button></form>\
<form class=\"card\" method=\"get\" action=\"/lookup\"><h2>By digest</h2>\
<label for=\"digest\">SHA-256 digest (for keys stored as redacted:…)</label><input type=\"text\" id=\"digest\" name=\"digest\" value=\"{digest}\">\
<button type=\"submit\" id=\"lookup-digest\">Look up</button></form>",
        key = esc(key),
        template = esc(template),
        digest = esc(digest),
    )
}

/// Everything `keys show` prints.
fn record_html(r: &KeyRecord) -> String {
    let lapsed = if r.lapsed {
        "yes (the next delivery runs the job again; prune deletes the row)"
    } else {
        "no"
    };
    let mut out = String::from("<h2 id=\"record\">Record</h2><div class=\"scroll\"><table><tbody>");
    for (label, value) in [
        ("job", esc(&r.job)),
        (
            "key",
            format!("<code id=\"record-key\">{}</code>", esc(&r.key)),
        ),
        ("digest", format!("<code>{}</code>", r.digest_hex())),
        ("done at (UTC)", format_seconds(r.done_at)),
        (
            "expires at (UTC)",
            r.expires_at
                .map_or_else(|| "never".to_owned(), format_seconds),
        ),
        ("lapsed", lapsed.to_owned()),
        (
            "result stored",
            crate::commands::result_stored(r).to_owned(),
        ),
        ("fingerprint stored", yes_no(r.has_fingerprint).to_owned()),
        (
            "next delivery",
            crate::commands::next_delivery(r).to_owned(),
        ),
    ] {
        let _ = write!(
            out,
            "<tr><th scope=\"row\">{label}</th><td>{value}</td></tr>"
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

/// A key that is not there: the form looked for, and the nearest keys of its job.
fn missing_html(digest: &[u8; 32], text: Option<&str>, near: Option<&Nearest>) -> String {
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let named = text.map_or_else(|| format!("with digest {hex}"), |t| format!("`{t}`"));
    let mut out = notice(
        &format!(
            "No key {named} in done_jobs: no committed run holds it (never done, forgotten, or pruned: the next delivery runs the job, unless a run in progress commits it first)."
        ),
        true,
    );
    if let Some(text) = text {
        let _ = write!(
            out,
            "<p>Looked for <code id=\"looked-for\">{}</code> (digest <code>{hex}</code>). Values are escaped in keys: <code>%</code> as <code>%25</code>, a control character as <code>%XX</code>, and inside a value the character that separates it from the next value as <code>%XX</code> (<code>:</code> as <code>%3A</code>).</p>",
            esc(text)
        );
    }
    if let Some(near) = near {
        let _ = write!(
            out,
            "<h2>Nearest keys of job {}</h2><ul id=\"nearest\">",
            esc(&near.job)
        );
        for c in &near.keys {
            let decoded = c
                .decoded
                .as_deref()
                .map(|d| format!(" — reads <code>{}</code> decoded", esc(d)))
                .unwrap_or_default();
            let _ = write!(
                out,
                "<li><a class=\"mono\" href=\"/lookup?key={}\">{}</a>{decoded}</li>",
                url_value(&c.key),
                esc(&c.key)
            );
        }
        out.push_str("</ul>");
    }
    out
}

// --- outbox ------------------------------------------------------------------------------------

/// `/outbox`: parked messages (retry one or all), and the oldest pending ones.
pub async fn outbox(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    RawQuery(query): RawQuery,
) -> Response {
    let form = Form::parse(query.unwrap_or_default().as_bytes());
    let loaded = app
        .db(|conn, target| {
            on_conn!(conn, c => {
                let parked = outbox::parked(c).map_err(|e| db_failure(c, target, e))?;
                let pending = outbox::unsent(c, 20).map_err(|e| db_failure(c, target, e))?;
                let counts = outbox::counts(c).map_err(|e| db_failure(c, target, e))?;
                Ok::<_, Failure>((parked, pending, counts))
            })
        })
        .await;
    let (parked, pending, counts) = match loaded {
        Ok(loaded) => loaded,
        Err(failure) => return failed(&app, &auth, &failure),
    };
    let mut body = app.notices.take(&form);
    body.push_str(&outbox_summary(&counts).replacen("<h2>Outbox</h2>", "<h2>Counts</h2>", 1));
    body.push_str("<h2 id=\"parked\">Parked messages</h2>");
    if parked.is_empty() {
        body.push_str("<p id=\"no-parked\">No parked messages.</p>");
    } else {
        body.push_str(&super::actions::retry_all_form(&app, &auth, parked.len()));
        body.push_str(&messages_table(
            "Parked after too many failed deliveries",
            &parked,
            Some((&app, &auth)),
        ));
    }
    body.push_str("<h2>Waiting to be sent (oldest 20)</h2>");
    if pending.is_empty() {
        body.push_str("<p>No messages waiting.</p>");
    } else {
        body.push_str(&messages_table("Pending messages", &pending, None));
    }
    respond(
        StatusCode::OK,
        &frame(&app, Some(&auth), "Outbox", Section::Outbox),
        &body,
    )
}

/// Messages as a table; with a retry button per row for parked ones.
fn messages_table(
    caption: &str,
    messages: &[OutboxMessage],
    retry: Option<(&App, &Auth)>,
) -> String {
    let rows: Vec<Vec<String>> = messages
        .iter()
        .map(|m| {
            let mut row = vec![
                format!("<code>{}</code>", esc(m.message_id())),
                esc(m.topic()),
                m.job_key()
                    .map_or_else(|| "-".to_owned(), |k| format!("<code>{}</code>", esc(k))),
                m.attempts().to_string(),
                format_age(m.age()),
                esc(m.last_error().unwrap_or("-")),
                format!(
                    "<pre>{}</pre>",
                    esc(&crate::table::truncate(m.payload_json(), 200))
                ),
            ];
            if let Some((app, auth)) = retry {
                row.push(super::actions::retry_form(app, auth, m.message_id()));
            }
            row
        })
        .collect();
    let mut headers = vec![
        "Message id",
        "Topic",
        "Job key",
        "Attempts",
        "Age",
        "Last error",
        "Payload",
    ];
    if retry.is_some() {
        headers.push("Action");
    }
    table(caption, &headers, &rows)
}

/// The CSRF field for a page's forms, empty for bearer requests.
pub fn csrf_of(auth: &Auth) -> String {
    auth.csrf().map(csrf_field).unwrap_or_default()
}

#[cfg(all(test, feature = "mysql"))]
mod tests {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, MysqlConnection};

    use super::super::sql::Hourly;
    use super::chart_failure;
    use crate::connect::Target;
    use crate::failure::Code;

    /// A chart statement that waits past the session's lock wait (another session's `LOCK TABLES
    /// ... WRITE`) on a MariaDB session whose messages are in German (`lc_messages = 'de_DE'`) is
    /// the dashboard's "busy" (a 503), as it is in English: known by the error's number (1205),
    /// not by its English words. Before: "any other database error" (a 500).
    #[test]
    fn a_chart_statement_that_waits_for_a_lock_is_busy_in_german_on_mariadb() {
        let base = std::env::var("IDEMPOTENT_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
        let mut admin = MysqlConnection::establish(&base).unwrap_or_else(|e| {
            panic!("MariaDB at {base}: {e}; scripts/test starts it (or set IDEMPOTENT_MYSQL_URL)")
        });
        let name = format!("chart_busy_{}", std::process::id());
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"
            ))
            .expect("a database of the test's own");
        let (server, _) = base.rsplit_once('/').expect("a URL with a database");
        let url = format!("{server}/{name}");
        let mut conn = MysqlConnection::establish(&url).expect("a connection");
        idempotent_runtime::migrate(&mut conn).expect("the runtime's tables");
        let mut locker = MysqlConnection::establish(&url).expect("a second connection");
        locker
            .batch_execute("LOCK TABLES done_jobs WRITE")
            .expect("locking done_jobs");
        conn.batch_execute("SET SESSION lc_messages = 'de_DE', lock_wait_timeout = 1")
            .expect("German messages, a short wait");
        let target = Target::parse(&url).expect("the URL");
        let failure = match conn.keys_per_hour() {
            Ok(rows) => panic!("the chart read through the lock: {rows:?}"),
            Err(error) => chart_failure(&mut conn, &target, &error),
        };
        let _ = locker.batch_execute("UNLOCK TABLES");
        drop((conn, locker));
        let _ = admin.batch_execute(&format!("DROP DATABASE {name}"));
        assert!(
            failure.code == Code::Connect && failure.message.contains("The database is busy"),
            "{failure:?}"
        );
    }
}
