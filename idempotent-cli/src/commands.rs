//! The commands, each on any of the runtime's sync connections.

use std::io::{BufRead, IsTerminal, Write};
use std::time::SystemTime;

use idempotent_runtime::keys::{self, JobCount, KeyQuery, KeyRecord};
use idempotent_runtime::outbox::{self, OutboxCounts, OutboxMessage};
use idempotent_runtime::{Error, JobKey, JobStore, Prune, SchemaProblem};
use serde::Serialize;

use crate::cli::{Command, KeyArg, KeysCommand, OutboxCommand, RetryTarget};
use crate::connect::Target;
use crate::failure::{Code, Failure};
use crate::keyform::key_from_template;
use crate::nearest;
use crate::page::After;
use crate::session::{Privileges, SessionLimits};
use crate::table::{Align, Table, printable, truncate};
use crate::time::{format_age, format_micros, format_seconds};

/// What every command needs besides its connection.
pub struct Context<'a> {
    /// The database, for messages.
    pub target: &'a Target,
    /// Print JSON instead of tables.
    pub json: bool,
}

/// Runs `command` on `conn`, printing its output; `Err` says what to print on stderr and how to
/// exit.
pub fn run<C: JobStore + SessionLimits + Privileges>(
    conn: &mut C,
    cx: &Context<'_>,
    command: &Command,
) -> Result<(), Failure> {
    newer_schema_guard(conn, cx, command)?;
    match command {
        Command::Keys(KeysCommand::Show { key }) => keys_show(conn, cx, key),
        Command::Keys(KeysCommand::List {
            job,
            since,
            before,
            after,
            limit,
        }) => keys_list(conn, cx, job.as_deref(), (*since, *before), *after, *limit),
        Command::Keys(KeysCommand::Forget { key, reason, yes }) => {
            keys_forget(conn, cx, key, reason.as_deref(), *yes)
        }
        Command::Jobs => jobs(conn, cx),
        Command::Outbox(OutboxCommand::Pending { limit }) => outbox_pending(conn, cx, *limit),
        Command::Outbox(OutboxCommand::Parked) => outbox_parked(conn, cx),
        Command::Outbox(OutboxCommand::Retry { target }) => outbox_retry(conn, cx, target),
        Command::Prune {
            dry_run,
            batch_size,
            pace,
        } => prune(conn, cx, *dry_run, *batch_size, *pace),
        Command::Verify => verify(conn, cx),
        Command::Migrate => migrate(conn, cx),
        // Needs no database: main prints it before connecting.
        Command::Completions { .. } => Ok(()),
        // Main runs the server instead.
        #[cfg(feature = "serve")]
        Command::Serve(_) => Ok(()),
    }
}

/// Whether `command` writes to the runtime's tables; `None` for those that check the schema
/// themselves (`verify`, `migrate`) or do not touch it.
fn writes(command: &Command) -> Option<bool> {
    match command {
        Command::Keys(KeysCommand::Forget { .. })
        | Command::Outbox(OutboxCommand::Retry { .. }) => Some(true),
        Command::Prune { dry_run, .. } => Some(!dry_run),
        Command::Keys(_) | Command::Jobs | Command::Outbox(_) => Some(false),
        Command::Verify | Command::Migrate | Command::Completions { .. } => None,
        #[cfg(feature = "serve")]
        Command::Serve(_) => None,
    }
}

/// Tables a newer release made (a schema version above this build's): a command that writes is
/// refused before it changes anything (exit 4), as the newer release may keep rules this CLI does
/// not know (a column its claims or its relay rely on, a state of a message); one that reads runs,
/// with a warning that what it shows may leave out what that release records. Reads stay
/// available because in an incident an old CLI's look is better than none; a write is not undone
/// by an upgrade. Found by `verify`; a schema whose version cannot be read is left to the command.
fn newer_schema_guard<C: JobStore>(
    conn: &mut C,
    cx: &Context<'_>,
    command: &Command,
) -> Result<(), Failure> {
    let Some(writes) = writes(command) else {
        return Ok(());
    };
    let Some((found, known)) = newer_schema(conn) else {
        return Ok(());
    };
    let made = format!(
        "the idempotent-jobs tables at {} were made by a newer release of idempotent-jobs (schema version {found}; this CLI knows versions up to {known})",
        cx.target.shown
    );
    if writes {
        return Err(Failure::new(
            Code::Schema,
            format!(
                "refusing to write: {made}, which may keep rules this CLI does not know; nothing was changed: upgrade idempotent-jobs-cli to that release or later"
            ),
        ));
    }
    eprintln!(
        "warning: {made}: what this CLI shows may leave out what that release records; upgrade idempotent-jobs-cli to that release or later"
    );
    Ok(())
}

/// The schema version a newer release recorded and the newest this build knows, when `verify`
/// finds the tables made by a newer release; `None` otherwise (ready, or any other problem, or a
/// version that cannot be read: those are left to the command).
pub fn newer_schema<C: JobStore>(conn: &mut C) -> Option<(i32, i32)> {
    let Err(Error::SchemaNotReady { problems }) = idempotent_runtime::verify(conn) else {
        return None;
    };
    problems.iter().find_map(|problem| match problem {
        SchemaProblem::Newer { found, known } => Some((*found, *known)),
        _ => None,
    })
}

// --- keys ------------------------------------------------------------------------------------

/// A key's record as JSON.
#[derive(Serialize)]
struct KeyJson<'a> {
    job: &'a str,
    key: &'a str,
    digest: String,
    done_at: String,
    expires_at: Option<String>,
    lapsed: bool,
    has_result: bool,
    unfinished: bool,
    has_fingerprint: bool,
    next_delivery_runs: bool,
}

impl<'a> From<&'a KeyRecord> for KeyJson<'a> {
    fn from(r: &'a KeyRecord) -> Self {
        Self {
            job: &r.job,
            key: &r.key,
            digest: r.digest_hex(),
            done_at: format_micros(r.done_at),
            expires_at: r.expires_at.map(format_micros),
            lapsed: r.lapsed,
            has_result: r.has_result,
            unfinished: r.unfinished,
            has_fingerprint: r.has_fingerprint,
            next_delivery_runs: r.next_delivery_runs(),
        }
    }
}

/// `yes` or `no`.
fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// When the key lapses, or `never`.
fn expires_text(record: &KeyRecord) -> String {
    record
        .expires_at
        .map_or_else(|| "never".to_owned(), format_seconds)
}

/// Whether a result is stored, or the run never recorded one.
pub fn result_stored(record: &KeyRecord) -> &'static str {
    match (record.unfinished, record.has_result) {
        (true, _) => "no: unfinished (a run claimed the key and never recorded its result)",
        (false, true) => "yes",
        (false, false) => "no",
    }
}

/// What the key's next delivery does.
pub fn next_delivery(record: &KeyRecord) -> &'static str {
    match (record.unfinished, record.lapsed, record.has_result) {
        (true, _, _) => "runs the job: the run that holds the key never finished",
        (false, true, _) => "runs the job: the key lapsed",
        (false, false, true) => "replays the stored result; the job does not run",
        (false, false, false) => "replays (the job stores no result); the job does not run",
    }
}

/// A record as aligned `label  value` lines.
fn record_text(record: &KeyRecord) -> String {
    let lapsed = if record.lapsed {
        "yes (the next delivery runs the job again; `prune` deletes the row)"
    } else {
        "no"
    };
    let lines = [
        ("job", printable(&record.job)),
        ("key", printable(&record.key)),
        ("digest", record.digest_hex()),
        ("done at", format_seconds(record.done_at)),
        ("expires at", expires_text(record)),
        ("lapsed", lapsed.to_owned()),
        ("result stored", result_stored(record).to_owned()),
        (
            "fingerprint stored",
            yes_no(record.has_fingerprint).to_owned(),
        ),
        ("next delivery", next_delivery(record).to_owned()),
    ];
    lines
        .iter()
        .map(|(label, value)| format!("{label:<19} {value}\n"))
        .collect()
}

/// A key the arguments name.
struct Wanted {
    /// Its digest.
    digest: [u8; 32],
    /// How messages name it.
    named: String,
    /// The key's text, when it was given as text or built from a template.
    text: Option<String>,
    /// The other keys the text may name, tried in order when the text as given names none (see
    /// [`other_forms`]).
    others: Vec<JobKey>,
}

/// What [`Wanted::lookup`] found.
enum Found {
    /// No key the text may name.
    None,
    /// One.
    One(KeyRecord),
    /// Two keys the text names, each in one of its forms (`path:C:\\tmp` names the key of that
    /// text and, as `keys list` prints it, the key `path:C:\tmp`): which is meant, only the
    /// operator knows.
    Two(KeyRecord, KeyRecord),
}

impl Wanted {
    /// The record of the key: the text as given, else the first of the other keys it may name
    /// that is there (then `self` names that key from here on); two where the text names one
    /// key as given and another in another form.
    fn lookup<C: JobStore>(&mut self, conn: &mut C) -> Result<Found, Error> {
        let mut found: Option<KeyRecord> = None;
        let digests: Vec<[u8; 32]> = std::iter::once(self.digest)
            .chain(self.others.iter().map(JobKey::digest))
            .collect();
        for digest in digests {
            if found.as_ref().is_some_and(|first| first.digest == digest) {
                continue;
            }
            if let Some(record) = keys::lookup_digest(conn, &digest)? {
                match found {
                    Some(first) => return Ok(Found::Two(first, record)),
                    None => {
                        self.digest = digest;
                        found = Some(record);
                    }
                }
            }
        }
        Ok(found.map_or(Found::None, Found::One))
    }
}

/// The record of the key `key` names ([`Wanted::lookup`]), `None` where none is there; a text
/// that names two keys is refused ([`two_keys`]).
fn look_up<C: JobStore>(
    conn: &mut C,
    cx: &Context<'_>,
    key: &KeyArg,
    wanted: &mut Wanted,
) -> Result<Option<KeyRecord>, Failure> {
    match wanted
        .lookup(conn)
        .map_err(|e| db_failure(conn, cx.target, e))?
    {
        Found::One(record) => Ok(Some(record)),
        Found::None => Ok(None),
        Found::Two(first, second) => Err(two_keys(
            key.which.key.as_deref().unwrap_or_default(),
            &first,
            &second,
        )),
    }
}

/// The failure for a text that names two keys ([`Found::Two`]): nothing is shown or changed;
/// the operator names one by its digest.
fn two_keys(given: &str, first: &KeyRecord, second: &KeyRecord) -> Failure {
    Failure::new(
        Code::Usage,
        format!(
            "`{}` names two keys: `{}` (digest {}) and `{}` (digest {}), one as given, the other as `keys list` prints it; nothing was changed. Name one with --digest",
            printable(given),
            printable(&first.key),
            hex(&first.digest),
            printable(&second.key),
            hex(&second.digest)
        ),
    )
}

/// The key whose stored form `given` is, where that is another key: one given to `JobKey::new`
/// with a control character, stored and listed with it as `%XX`.
pub fn escaped_from(given: &str) -> Option<JobKey> {
    idempotent_keys::escape::unescape(given)
        .map(JobKey::new)
        .filter(|key| key.as_str() != given && key.readable() == given)
}

/// The keys `given` may name besides the key of that text, in the order they are tried: the key
/// whose stored form it is (`%XX`, [`escaped_from`]); then, where it is a key as `keys list`
/// prints it (`\\` for a backslash, `\u{200b}` for a character drawn as nothing), the key
/// printed so, and the key whose stored form that is. A key that holds a backslash is found as
/// given first.
pub fn other_forms(given: &str) -> Vec<JobKey> {
    let mut others: Vec<JobKey> = escaped_from(given).into_iter().collect();
    if let Some(stored) = crate::table::unprintable(given) {
        let escaped = escaped_from(&stored);
        others.push(JobKey::new(stored));
        others.extend(escaped);
    }
    others
}

/// Which key the arguments name; a template that does not fit its values is bad usage.
fn resolve(key: &KeyArg) -> Result<Wanted, Failure> {
    let which = &key.which;
    // Clap drops `requires` when the required argument conflicts with one given: checked here.
    if which.template.is_none() && !key.values.is_empty() {
        return Err(Failure::new(
            Code::Usage,
            "--value goes with --template: it fills the template's next placeholder",
        ));
    }
    if let Some(digest) = &which.digest {
        return Ok(Wanted {
            digest: *digest,
            named: format!("with digest {}", hex(digest)),
            text: None,
            others: Vec::new(),
        });
    }
    let job_key = match (&which.key, &which.template) {
        (Some(text), _) => JobKey::new(text.as_str()),
        (None, Some(template)) => key_from_template(template, &key.values)
            .map_err(|why| Failure::new(Code::Usage, printable(&why)))?,
        (None, None) => {
            return Err(Failure::new(
                Code::Usage,
                "name a key: KEY, --digest HEX, or --template TEMPLATE with --value VALUE",
            ));
        }
    };
    let text = job_key.readable().into_owned();
    let others = which.key.as_deref().map(other_forms).unwrap_or_default();
    Ok(Wanted {
        digest: job_key.digest(),
        named: format!("`{}`", printable(&text)),
        text: Some(text),
        others,
    })
}

/// A digest in lowercase hexadecimal.
fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The failure for a key no run holds: the form looked for, how values are escaped, and the
/// nearest stored keys of the job it most likely belongs to.
fn not_found<C: JobStore>(conn: &mut C, wanted: &Wanted) -> Failure {
    let mut message = format!(
        "no key {} in done_jobs: no committed run holds it",
        wanted.named
    );
    let Some(text) = &wanted.text else {
        return Failure::new(Code::NotFound, message);
    };
    if text.starts_with("redacted:") {
        message.push_str(
            ". Keys shown as `redacted:...` are found by digest: `keys show --digest HEX`, with the digest from `keys list --json`",
        );
        return Failure::new(Code::NotFound, message);
    }
    message.push_str(&format!(
        "\n  looked for: {} (digest {})\n  values are escaped in keys: `%` as %25, a control character as %XX, and inside a value the character that separates it from the next value as %XX (`:` as %3A in invoice:<month>:<customer_id>). Give the key as stored, or build it from the handler's inputs: --template 'invoice:<month>:<customer_id>' --value 2026-10 --value cust_481",
        printable(text),
        hex(&wanted.digest)
    ));
    // A hint only: a failure to find one leaves the message as it is.
    if let Ok(Some(near)) = nearest::nearest(conn, text, 5) {
        message.push_str(&near_text(&near));
    }
    Failure::new(Code::NotFound, message)
}

/// The nearest keys, one per line.
fn near_text(near: &nearest::Nearest) -> String {
    let scope = if near.more {
        " (of its 1,000 newest)"
    } else {
        ""
    };
    let escaped = if near.keys.iter().any(|c| printable(&c.key) != c.key) {
        " (escaped as `keys list` prints them: `\\\\` is a backslash, `\\u{...}` a character that does not print; give one as shown)"
    } else {
        ""
    };
    let mut text = format!(
        "\n  nearest keys of job `{}`{scope}{escaped}:",
        printable(&near.job)
    );
    for candidate in &near.keys {
        text.push_str(&format!("\n    {}", printable(&candidate.key)));
        if let Some(decoded) = &candidate.decoded {
            let same = if candidate.distance == 0 {
                ": the key looked for, escaped"
            } else {
                ""
            };
            text.push_str(&format!("  (reads {} decoded{same})", printable(decoded)));
        }
    }
    text
}

/// `keys show`: one record.
fn keys_show<C: JobStore>(conn: &mut C, cx: &Context<'_>, key: &KeyArg) -> Result<(), Failure> {
    let mut wanted = resolve(key)?;
    let Some(record) = look_up(conn, cx, key, &mut wanted)? else {
        return Err(not_found(conn, &wanted));
    };
    if cx.json {
        emit_json(&KeyJson::from(&record));
    } else {
        emit(&record_text(&record));
    }
    Ok(())
}

/// `keys list`: a table of keys, newest first.
fn keys_list<C: JobStore>(
    conn: &mut C,
    cx: &Context<'_>,
    job: Option<&str>,
    (since, before): (Option<SystemTime>, Option<SystemTime>),
    after: Option<After>,
    limit: u32,
) -> Result<(), Failure> {
    // One more than asked, to tell whether there are more.
    let mut query = KeyQuery::default().limit(limit.saturating_add(1));
    if let Some(after) = after {
        query = after.apply(query);
    }
    if let Some(job) = job {
        query = query.job(job);
    }
    if let Some(since) = since {
        query = query.done_from(since);
    }
    if let Some(before) = before {
        query = query.done_before(before);
    }
    let mut records = keys::list(conn, &query).map_err(|e| db_failure(conn, cx.target, e))?;
    let more = records.len() > limit as usize;
    records.truncate(limit as usize);
    // Where the next page starts (`--after`), when there is one.
    let next = records
        .last()
        .filter(|_| more)
        .map(|last| After::of(last).to_string());
    // The bounds as times: a `--since 1h` read again for the next page would have moved on, and
    // skipped the keys that grew older than an hour in between.
    let since = since.map(crate::time::format_micros);
    let before = before.map(crate::time::format_micros);
    if cx.json {
        #[derive(Serialize)]
        struct List<'a> {
            keys: Vec<KeyJson<'a>>,
            more: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            next: Option<String>,
            /// The bounds this page used, as times, for the next page's `--since`/`--before`.
            #[serde(skip_serializing_if = "Option::is_none")]
            since: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            before: Option<String>,
        }
        emit_json(&List {
            keys: records.iter().map(KeyJson::from).collect(),
            more,
            next,
            since,
            before,
        });
        return Ok(());
    }
    if records.is_empty() {
        emit("no keys match\n");
        return Ok(());
    }
    let mut text = keys_table(&records);
    if let Some(next) = next {
        let bounds: String = [("--since", &since), ("--before", &before)]
            .iter()
            .filter_map(|(flag, time)| time.as_ref().map(|time| format!("{flag} {time} ")))
            .collect();
        text.push_str(&format!(
            "({limit} keys shown; more match: the next page is the same command with {bounds}--after {next})\n"
        ));
    }
    emit(&text);
    Ok(())
}

/// `keys list`'s table of `records`.
fn keys_table(records: &[KeyRecord]) -> String {
    let mut table = Table::new(&[
        ("JOB", Align::Left),
        ("KEY", Align::Left),
        ("DONE AT (UTC)", Align::Left),
        ("EXPIRES AT (UTC)", Align::Left),
        ("LAPSED", Align::Left),
        ("RESULT", Align::Left),
        ("FINGERPRINT", Align::Left),
    ]);
    for r in records {
        table.row([
            r.job.clone(),
            r.key.clone(),
            format_seconds(r.done_at),
            expires_text(r),
            yes_no(r.lapsed).to_owned(),
            match r.unfinished {
                true => "unfinished".to_owned(),
                false => yes_no(r.has_result).to_owned(),
            },
            yes_no(r.has_fingerprint).to_owned(),
        ]);
    }
    table.render()
}

/// `keys forget`: shows the record, asks unless `--yes`, then forgets it.
fn keys_forget<C: JobStore + Privileges>(
    conn: &mut C,
    cx: &Context<'_>,
    key: &KeyArg,
    reason: Option<&str>,
    yes: bool,
) -> Result<(), Failure> {
    let mut wanted = resolve(key)?;
    let found = look_up(conn, cx, key, &mut wanted)?;
    let (digest, named) = (wanted.digest, wanted.named.clone());
    let Some(record) = found else {
        let mut failure = not_found(conn, &wanted);
        failure.message = failure.message.replacen(
            ": no committed run holds it",
            ": no committed run holds it; nothing was changed",
            1,
        );
        return Err(failure);
    };
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(Failure::new(
                Code::Usage,
                format!(
                    "refusing to forget key {named} of job `{}` without confirmation: stdin is not a terminal, so there is no one to ask. Pass --yes to forget it; nothing was changed",
                    printable(&record.job)
                ),
            ));
        }
        // The record and the question go to stderr in JSON mode, keeping stdout one document.
        let shown = record_text(&record);
        if cx.json {
            eprint!("{shown}");
        } else {
            emit(&shown);
        }
        eprint!("Forget this key? The job's next delivery will run it again. [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let read = std::io::stdin().lock().read_line(&mut answer);
        let confirmed = matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes");
        if read.is_err() || !confirmed {
            return Err(Failure::new(
                Code::Usage,
                "not confirmed: the key was not forgotten; nothing was changed",
            ));
        }
    }
    let reason = reason.map_or_else(default_reason, str::to_owned);
    // Only the row shown (and confirmed): a run that renewed the lapsed key since is left.
    let forgotten = keys::forget_record(conn, &record, &reason)
        .map_err(|e| forget_failed(conn, cx.target, e, &named))?;
    if !forgotten {
        return Err(changed_meanwhile(conn, &digest, &named));
    }
    if cx.json {
        #[derive(Serialize)]
        struct Forgotten<'a> {
            forgotten: bool,
            reason: &'a str,
            key: KeyJson<'a>,
        }
        emit_json(&Forgotten {
            forgotten: true,
            reason: &reason,
            key: KeyJson::from(&record),
        });
    } else {
        emit(&format!(
            "forgot key `{}` of job `{}`: the job's next delivery runs it again\n",
            printable(&record.key),
            printable(&record.job)
        ));
    }
    Ok(())
}

/// A forget's failure, told as [`db_failure`] tells it; one whose `COMMIT` went unanswered with
/// [`a_forget_of_unknown_outcome`]'s advice.
fn forget_failed<C: JobStore + Privileges>(
    conn: &mut C,
    target: &Target,
    error: Error,
    named: &str,
) -> Failure {
    let unknown = matches!(error, Error::OutcomeUnknown { .. });
    let mut failure = delete_failure(conn, target, error, &format!("forgetting key {named}"));
    if unknown {
        failure.message = a_forget_of_unknown_outcome(&failure.message, named);
    }
    failure
}

/// The message of a forget whose `COMMIT` went unanswered. The library's "retrying is safe" holds
/// for its own retry with the same record (`keys::forget_record` deletes only the run it was
/// given); this command run again reads the key afresh and, where the first forget committed and
/// a new run claimed the key since, would forget that run, which no one was shown.
fn a_forget_of_unknown_outcome(message: &str, named: &str) -> String {
    message.replacen(
        "; retrying is safe",
        &format!(
            "; look at key {named} again (`keys show`) before forgetting it again: this command run again reads the key afresh, and where this forget committed and a run has claimed the key since, it would forget that run"
        ),
        1,
    )
}

/// `idempotent-jobs CLI`, with the operating system's user when the environment names one.
fn default_reason() -> String {
    ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()))
        .map_or_else(
            || "idempotent-jobs CLI".to_owned(),
            |user| format!("idempotent-jobs CLI (user {user})"),
        )
}

// --- jobs ------------------------------------------------------------------------------------

/// One job's counts as JSON.
#[derive(Serialize)]
struct JobJson<'a> {
    job: &'a str,
    keys: u64,
    lapsed: u64,
    oldest: String,
    newest: String,
}

impl<'a> From<&'a JobCount> for JobJson<'a> {
    fn from(c: &'a JobCount) -> Self {
        Self {
            job: &c.job,
            keys: c.keys,
            lapsed: c.lapsed,
            oldest: format_micros(c.oldest),
            newest: format_micros(c.newest),
        }
    }
}

/// `jobs`: one row per job.
fn jobs<C: JobStore>(conn: &mut C, cx: &Context<'_>) -> Result<(), Failure> {
    let counts = keys::job_counts(conn).map_err(|e| db_failure(conn, cx.target, e))?;
    if cx.json {
        #[derive(Serialize)]
        struct Jobs<'a> {
            jobs: Vec<JobJson<'a>>,
        }
        emit_json(&Jobs {
            jobs: counts.iter().map(JobJson::from).collect(),
        });
        return Ok(());
    }
    if counts.is_empty() {
        emit("no keys in done_jobs\n");
        return Ok(());
    }
    let mut table = Table::new(&[
        ("JOB", Align::Left),
        ("KEYS", Align::Right),
        ("LAPSED", Align::Right),
        ("OLDEST (UTC)", Align::Left),
        ("NEWEST (UTC)", Align::Left),
    ]);
    for c in &counts {
        table.row([
            c.job.clone(),
            c.keys.to_string(),
            c.lapsed.to_string(),
            format_seconds(c.oldest),
            format_seconds(c.newest),
        ]);
    }
    emit(&table.render());
    Ok(())
}

// --- outbox ----------------------------------------------------------------------------------

/// A message as JSON.
#[derive(Serialize)]
struct MessageJson<'a> {
    message_id: &'a str,
    topic: &'a str,
    job_key: Option<&'a str>,
    attempts: u32,
    age_seconds: f64,
    last_error: Option<&'a str>,
    /// The payload as JSON, or its text if it does not parse.
    payload: serde_json::Value,
}

impl<'a> From<&'a OutboxMessage> for MessageJson<'a> {
    fn from(m: &'a OutboxMessage) -> Self {
        Self {
            message_id: m.message_id(),
            topic: m.topic(),
            job_key: m.job_key(),
            attempts: m.attempts(),
            age_seconds: m.age().as_secs_f64(),
            last_error: m.last_error(),
            payload: serde_json::from_str(m.payload_json())
                .unwrap_or_else(|_| serde_json::Value::String(m.payload_json().to_owned())),
        }
    }
}

/// The outbox's counts as JSON.
#[derive(Serialize)]
struct CountsJson {
    pending: i64,
    leased: i64,
    delivered: i64,
    parked: i64,
}

impl From<&OutboxCounts> for CountsJson {
    fn from(c: &OutboxCounts) -> Self {
        Self {
            pending: c.pending,
            leased: c.leased,
            delivered: c.delivered,
            parked: c.parked,
        }
    }
}

/// The outbox's counts as one line.
fn counts_line(c: &OutboxCounts) -> String {
    format!(
        "outbox: {} pending, {} leased, {} delivered, {} parked\n",
        c.pending, c.leased, c.delivered, c.parked
    )
}

/// Outbox messages as a table.
fn messages_table(messages: &[OutboxMessage]) -> String {
    let mut table = Table::new(&[
        ("MESSAGE ID", Align::Left),
        ("TOPIC", Align::Left),
        ("JOB KEY", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("AGE", Align::Right),
        ("LAST ERROR", Align::Left),
        ("PAYLOAD", Align::Left),
    ]);
    for m in messages {
        table.row([
            m.message_id().to_owned(),
            m.topic().to_owned(),
            m.job_key().unwrap_or("-").to_owned(),
            m.attempts().to_string(),
            format_age(m.age()),
            truncate(m.last_error().unwrap_or("-"), 60),
            truncate(m.payload_json(), 60),
        ]);
    }
    table.render()
}

/// `outbox pending`: messages not yet delivered and not parked, oldest first.
fn outbox_pending<C: JobStore>(conn: &mut C, cx: &Context<'_>, limit: u32) -> Result<(), Failure> {
    let mut messages = outbox::unsent(conn, limit.saturating_add(1))
        .map_err(|e| db_failure(conn, cx.target, e))?;
    let more = messages.len() > limit as usize;
    messages.truncate(limit as usize);
    let counts = outbox::counts(conn).map_err(|e| db_failure(conn, cx.target, e))?;
    if cx.json {
        #[derive(Serialize)]
        struct Pending<'a> {
            messages: Vec<MessageJson<'a>>,
            more: bool,
            counts: CountsJson,
        }
        emit_json(&Pending {
            messages: messages.iter().map(MessageJson::from).collect(),
            more,
            counts: CountsJson::from(&counts),
        });
        return Ok(());
    }
    let mut text = if messages.is_empty() {
        "no messages waiting to be sent\n".to_owned()
    } else {
        messages_table(&messages)
    };
    if more {
        text.push_str(&format!(
            "(the oldest {limit} messages; more are waiting: raise --limit)\n"
        ));
    }
    text.push_str(&counts_line(&counts));
    emit(&text);
    Ok(())
}

/// `outbox parked`: parked messages with their last error.
fn outbox_parked<C: JobStore>(conn: &mut C, cx: &Context<'_>) -> Result<(), Failure> {
    let messages = outbox::parked(conn).map_err(|e| db_failure(conn, cx.target, e))?;
    let counts = outbox::counts(conn).map_err(|e| db_failure(conn, cx.target, e))?;
    if cx.json {
        #[derive(Serialize)]
        struct Parked<'a> {
            messages: Vec<MessageJson<'a>>,
            counts: CountsJson,
        }
        emit_json(&Parked {
            messages: messages.iter().map(MessageJson::from).collect(),
            counts: CountsJson::from(&counts),
        });
        return Ok(());
    }
    let mut text = if messages.is_empty() {
        "no parked messages\n".to_owned()
    } else {
        let mut text = messages_table(&messages);
        text.push_str("send again with: idempotent-jobs outbox retry --message-id ID (or --all)\n");
        text
    };
    text.push_str(&counts_line(&counts));
    emit(&text);
    Ok(())
}

/// `outbox retry`: un-parks one message or all of them.
fn outbox_retry<C: JobStore>(
    conn: &mut C,
    cx: &Context<'_>,
    target: &RetryTarget,
) -> Result<(), Failure> {
    let id = target.message_id.as_deref();
    let retried = outbox::retry_parked(conn, id).map_err(|e| db_failure(conn, cx.target, e))?;
    if let (Some(id), 0) = (id, retried) {
        return Err(Failure::new(
            Code::NotFound,
            format!(
                "no parked message with id `{}` (it does not exist, or it is not parked: `outbox parked` lists those that are); nothing was changed",
                printable(id)
            ),
        ));
    }
    if cx.json {
        #[derive(Serialize)]
        struct Retried {
            retried: usize,
        }
        emit_json(&Retried { retried });
    } else if retried == 0 {
        emit("no parked messages: nothing to retry\n");
    } else {
        let s = if retried == 1 { "" } else { "s" };
        emit(&format!(
            "un-parked {retried} message{s}: the relay sends {} again at its next round\n",
            if retried == 1 { "it" } else { "them" }
        ));
    }
    Ok(())
}

// --- prune and verify ------------------------------------------------------------------------

/// `prune`: deletes lapsed keys, or with `--dry-run` counts them. SIGINT and SIGTERM stop it
/// after the batch under way: it says what it deleted, all committed, and exits 5 (as a prune
/// that fails after committed batches does).
fn prune<C: JobStore + Privileges>(
    conn: &mut C,
    cx: &Context<'_>,
    dry_run: bool,
    batch_size: u32,
    pace: u32,
) -> Result<(), Failure> {
    if dry_run {
        return prune_dry_run(conn, cx);
    }
    let stop = Stop::catch();
    let options = Prune::default()
        .batch_size(batch_size)
        .pace(pace)
        .stop_when(std::sync::Arc::clone(&stop.caught));
    let report = idempotent_runtime::prune(conn, &options)
        .map_err(|e| delete_failure(conn, cx.target, e, "pruning lapsed keys"))?;
    let stopped_by = report.stopped.then(|| stop.signal().unwrap_or("a signal"));
    let s = if report.removed == 1 { "" } else { "s" };
    let b = if report.batches == 1 { "" } else { "es" };
    if cx.json {
        #[derive(Serialize)]
        struct Pruned {
            dry_run: bool,
            removed: u64,
            batches: u32,
            /// The signal that stopped the prune, when one did.
            #[serde(skip_serializing_if = "Option::is_none")]
            stopped_by: Option<&'static str>,
        }
        emit_json(&Pruned {
            dry_run: false,
            removed: report.removed,
            batches: report.batches,
            stopped_by,
        });
    } else if stopped_by.is_none() {
        emit(&format!(
            "deleted {} lapsed key{s} in {} batch{b}\n",
            report.removed, report.batches
        ));
    }
    match stopped_by {
        None => Ok(()),
        Some(signal) => Err(Failure::new(
            Code::Database,
            format!(
                "prune stopped by {signal} after the batch under way: deleted {} lapsed key{s} in {} batch{b}, all committed; the lapsed keys left stay, and the next prune continues where this one stopped",
                report.removed, report.batches
            ),
        )),
    }
}

/// `prune --dry-run`: counts the lapsed keys, by job, and deletes nothing.
fn prune_dry_run<C: JobStore>(conn: &mut C, cx: &Context<'_>) -> Result<(), Failure> {
    let counts = keys::job_counts(conn).map_err(|e| db_failure(conn, cx.target, e))?;
    let lapsed: u64 = counts.iter().map(|c| c.lapsed).sum();
    let by_job: Vec<&JobCount> = counts.iter().filter(|c| c.lapsed > 0).collect();
    if cx.json {
        #[derive(Serialize)]
        struct DryRun<'a> {
            dry_run: bool,
            lapsed: u64,
            jobs: Vec<JobLapsed<'a>>,
        }
        #[derive(Serialize)]
        struct JobLapsed<'a> {
            job: &'a str,
            lapsed: u64,
        }
        emit_json(&DryRun {
            dry_run: true,
            lapsed,
            jobs: by_job
                .iter()
                .map(|c| JobLapsed {
                    job: &c.job,
                    lapsed: c.lapsed,
                })
                .collect(),
        });
        return Ok(());
    }
    let s = if lapsed == 1 { "" } else { "s" };
    let mut text =
        format!("dry run: {lapsed} lapsed key{s} would be deleted; nothing was deleted\n");
    if !by_job.is_empty() {
        let mut table = Table::new(&[("JOB", Align::Left), ("LAPSED", Align::Right)]);
        for c in by_job {
            table.row([c.job.clone(), c.lapsed.to_string()]);
        }
        text.push_str(&table.render());
    }
    emit(&text);
    Ok(())
}

/// The signals that stop a prune after the batch under way, and their names.
const STOP_SIGNALS: [(i32, &str); 2] = [
    (signal_hook::consts::SIGINT, "SIGINT"),
    (signal_hook::consts::SIGTERM, "SIGTERM"),
];

/// SIGINT and SIGTERM, caught: the first says to stop after the batch under way; a second ends
/// the process at once (exit 130 or 143, as the signal would have), for a batch stuck on a lock.
struct Stop {
    /// Which signal arrived first: its index in [`STOP_SIGNALS`], plus one; 0 for none yet.
    which: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Set by the first signal: the runtime's prune stops at it (`Prune::stop_when`).
    caught: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Stop {
    /// Catches the signals from now on. Where the system refuses, says so, and the prune goes on
    /// uncaught (a signal ends it, as before, without saying what it committed).
    fn catch() -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        let which = Arc::new(AtomicUsize::new(0));
        let caught = Arc::new(AtomicBool::new(false));
        for (index, (signal, name)) in STOP_SIGNALS.iter().enumerate() {
            // The shutdown first: it ends the process only once the flag is set, by the first.
            let registered = signal_hook::flag::register_conditional_shutdown(
                *signal,
                128 + *signal,
                Arc::clone(&caught),
            )
            .and_then(|_| signal_hook::flag::register(*signal, Arc::clone(&caught)))
            // Only the first signal's name is kept: a second ends the process before this.
            .and_then(|_| {
                signal_hook::flag::register_usize(*signal, Arc::clone(&which), index + 1)
            });
            if let Err(error) = registered {
                eprintln!(
                    "warning: cannot catch {name} ({error}): it would end the prune without saying what it deleted"
                );
            }
        }
        Self { which, caught }
    }

    /// The signal that arrived, if one did.
    fn signal(&self) -> Option<&'static str> {
        let which = self.which.load(std::sync::atomic::Ordering::SeqCst);
        STOP_SIGNALS
            .get(which.checked_sub(1)?)
            .map(|(_, name)| *name)
    }
}

/// `verify`: the runtime's read-only schema check; first, a warning of a session statement time
/// limit under a second (jobs' statements that take longer are cancelled), whatever it finds.
fn verify<C: JobStore + SessionLimits>(conn: &mut C, cx: &Context<'_>) -> Result<(), Failure> {
    #[derive(Serialize)]
    struct Verified {
        ok: bool,
        problems: Vec<String>,
    }
    if let Some(warning) = conn.statement_limit().and_then(|limit| limit.warning()) {
        eprintln!("{warning}");
    }
    match idempotent_runtime::verify(conn) {
        Ok(()) => {
            if cx.json {
                emit_json(&Verified {
                    ok: true,
                    problems: Vec::new(),
                });
            } else {
                emit(&format!(
                    "ok: the idempotent-jobs tables at {} are ready\n",
                    cx.target.shown
                ));
            }
            Ok(())
        }
        Err(Error::SchemaNotReady { problems }) => {
            if cx.json {
                emit_json(&Verified {
                    ok: false,
                    problems: problems
                        .iter()
                        .map(|p| printable(&cx.target.scrub(&p.to_string())))
                        .collect(),
                });
            }
            Err(schema_failure(cx.target, &problems))
        }
        Err(error) => Err(db_failure(conn, cx.target, error)),
    }
}

/// `migrate`: creates or upgrades the runtime's tables, then checks them as `verify` does, as this
/// connection sees them: "ok" means this connection's role could run jobs on them (the role that
/// migrates is often not the workers': `verify` with the workers' URL checks theirs).
fn migrate<C: JobStore>(conn: &mut C, cx: &Context<'_>) -> Result<(), Failure> {
    #[derive(Serialize)]
    struct Migrated {
        ok: bool,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        problems: Vec<String>,
        /// An in-memory SQLite database: gone when the command exits.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        in_memory: bool,
    }
    idempotent_runtime::migrate(conn).map_err(|error| db_failure(conn, cx.target, error))?;
    match idempotent_runtime::verify(conn) {
        Ok(()) => {}
        Err(Error::SchemaNotReady { problems }) => {
            if cx.json {
                emit_json(&Migrated {
                    ok: false,
                    problems: problems
                        .iter()
                        .map(|p| printable(&cx.target.scrub(&p.to_string())))
                        .collect(),
                    in_memory: false,
                });
            }
            let schema = schema_failure(cx.target, &problems);
            return Err(Failure::new(
                schema.code,
                format!(
                    "migrate found the tables at {} current, or made them so (what it did is committed), but verify finds them not ready for this connection: {}",
                    cx.target.shown, schema.message
                ),
            ));
        }
        // The migration is committed: the check after it failing changes none of that (its
        // own error says "nothing was changed" of itself, not of the command).
        Err(error) => {
            let cause = match &error {
                Error::Verify(source) => with_causes(source),
                other => with_causes(other),
            };
            let text = printable(&cx.target.scrub(&cause));
            return Err(Failure::new(
                Code::Database,
                format!(
                    "migrate found the tables at {} current, or made them so (what it did is committed), but checking them afterwards as verify does failed: {text}",
                    cx.target.shown
                ),
            ));
        }
    }
    if cx.json {
        emit_json(&Migrated {
            ok: true,
            problems: Vec::new(),
            in_memory: cx.target.in_memory(),
        });
    } else if cx.target.in_memory() {
        emit(&format!(
            "the idempotent-jobs tables at {} were created, in an in-memory SQLite database that is gone when this command exits: nothing is kept; give a file path to keep them\n",
            cx.target.shown
        ));
    } else {
        emit(&format!(
            "ok: the idempotent-jobs tables at {} are created and current\n",
            cx.target.shown
        ));
    }
    Ok(())
}

// --- errors and output -----------------------------------------------------------------------

/// The failure for a runtime error: a lost connection (3), tables that are missing or not ready
/// (4, found by running `verify`, unless the operation had changed something), or any other
/// database error (5). The operation's own error always comes first.
pub fn db_failure<C: JobStore>(conn: &mut C, target: &Target, error: Error) -> Failure {
    let text = printable(&target.scrub(&with_causes(&error)));
    if error.is_connection_lost() {
        // 3 is for nothing changed; an operation that had changed something keeps 5.
        let code = match changed_something(&error) || steps_committed(target, &error) {
            true => Code::Database,
            false => Code::Connect,
        };
        return Failure::new(
            code,
            format!(
                "lost the connection to the database at {}: {text}",
                target.shown
            ),
        );
    }
    let failed = format!("{text} (database: {})", target.shown);
    if let Err(Error::SchemaNotReady { problems }) = idempotent_runtime::verify(conn) {
        // What verify found may be why the operation failed, or beside it (a table this
        // operation does not use, a grant it does not need): the error's own account of what
        // was and was not changed comes first, and where it changed something, its exit code.
        // A session that cannot write is not a problem of the tables: the write it refused is a
        // database error (5), as it was before verify could tell.
        let schema = schema_failure(target, &problems);
        let message = format!("{failed}\nand verify finds: {}", schema.message);
        let of_the_tables = problems.iter().any(|p| {
            !matches!(
                p,
                SchemaProblem::ReadOnly { .. }
                    | SchemaProblem::SessionCharset { .. }
                    | SchemaProblem::SessionClock { .. }
                    | SchemaProblem::VolatileJournal { .. }
            )
        });
        return match changed_something(&error) || steps_committed(target, &error) || !of_the_tables
        {
            true => Failure::new(Code::Database, message),
            false => Failure::new(schema.code, message),
        };
    }
    Failure::new(Code::Database, failed)
}

/// The failure of `what`, an operation that deletes from `done_jobs`: where the database refused
/// this session's role the `DELETE` and nothing was changed, the tables cannot be used as they
/// are until someone grants it (4, naming the grant; running the command again meets the same
/// refusal); otherwise as [`db_failure`] tells it.
fn delete_failure<C: JobStore + Privileges>(
    conn: &mut C,
    target: &Target,
    error: Error,
    what: &str,
) -> Failure {
    if error.is_connection_lost() || changed_something(&error) {
        return db_failure(conn, target, error);
    }
    let Some(grant) = conn.delete_refused("done_jobs", &with_causes(&error)) else {
        return db_failure(conn, target, error);
    };
    // The database's own words, without the runtime's account of a failure that passes.
    let mut cause: &dyn std::error::Error = &error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    let refusal = printable(&target.scrub(cause.to_string().trim_end()));
    Failure::new(
        Code::Schema,
        format!(
            "{what} was refused: this connection's role may not delete from done_jobs ({refusal}); nothing was changed. As the schema's owner, grant it: {grant}; or run this as a role that has it (workers need no DELETE: only the role that prunes and forgets keys does). Until then, running this again meets the same refusal (database: {})",
            target.shown
        ),
    )
}

/// Whether a failed migration may have committed steps before the one that failed: on MySQL,
/// whose DDL commits by itself, each step stays done (SQLite and PostgreSQL roll back the whole
/// migration), unless it refused before it changed anything (a schema problem).
fn steps_committed(target: &Target, error: &Error) -> bool {
    matches!(target.kind, crate::connect::Kind::Mysql)
        && matches!(error, Error::Migration { source, .. }
            if !source.is::<idempotent_runtime::SchemaProblem>())
}

/// Whether a failed operation says it changed the database (a prune whose earlier batches
/// committed; a commit whose outcome is unknown).
fn changed_something(error: &Error) -> bool {
    match error {
        Error::Prune {
            removed,
            outcome_unknown,
            ..
        } => *removed > 0 || *outcome_unknown,
        Error::OutcomeUnknown { .. } => true,
        _ => false,
    }
}

/// An error and its causes, each once: the runtime's messages say what happened to the job, and
/// the database's own error is their source.
///
/// Each text loses its trailing whitespace: a driver's message that ends in a newline would
/// otherwise show as a literal `\n` once made printable.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string().trim_end().to_owned();
    let mut cause = error.source();
    while let Some(source) = cause {
        let line = source.to_string().trim_end().to_owned();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        cause = source.source();
    }
    text
}

/// Why a forget of a record found the key changed since it was read: gone (1, it does not exist),
/// or renewed by another run, whose row is left (6, it changed since it was read; also when the
/// look-up that would tell fails).
pub fn changed_meanwhile<C: JobStore>(conn: &mut C, digest: &[u8; 32], named: &str) -> Failure {
    match keys::lookup_digest(conn, digest) {
        Ok(Some(_)) => Failure::new(
            Code::Changed,
            format!(
                "key {named} was renewed by another run since it was read, and that run's record is not the one shown; nothing was changed: look at it again (`keys show`) before forgetting it"
            ),
        ),
        Ok(None) => Failure::new(
            Code::NotFound,
            format!("key {named} was deleted by someone else meanwhile; nothing was changed"),
        ),
        Err(_) => Failure::new(
            Code::Changed,
            format!(
                "key {named} changed since it was read (deleted, or renewed by another run); nothing was changed: look at it again (`keys show`)"
            ),
        ),
    }
}

/// The failure for tables that `verify` found missing, out of date or not usable: one line that
/// says what to do, then each problem.
pub fn schema_failure(target: &Target, problems: &[SchemaProblem]) -> Failure {
    let mut missing: Vec<&str> = Vec::new();
    for table in problems.iter().filter_map(SchemaProblem::missing_table) {
        if !missing.contains(&table) {
            missing.push(table);
        }
    }
    let all_missing = ["done_jobs", "outbox", "idempotent_schema"]
        .iter()
        .all(|t| missing.contains(t));
    if all_missing && problems.iter().all(|p| p.missing_table().is_some()) {
        // Every other problem follows from that: one line says it all.
        return Failure::new(
            Code::Schema,
            format!(
                "the database at {} has no idempotent-jobs tables (done_jobs, outbox, idempotent_schema): run `idempotent-jobs migrate` (or idempotent_jobs::migrate) as the schema's owner",
                target.shown
            ),
        );
    }
    let mut message = headline(target, problems, &missing);
    for problem in problems {
        message.push_str("\n  - ");
        message.push_str(&printable(&target.scrub(&problem.to_string())));
    }
    Failure::new(Code::Schema, message)
}

/// What [`schema_failure`] says first: what to do, agreeing with the problems listed under it.
fn headline(target: &Target, problems: &[SchemaProblem], missing: &[&str]) -> String {
    let shown = &target.shown;
    if let Some((found, known)) = problems.iter().find_map(|problem| match problem {
        SchemaProblem::Newer { found, known } => Some((found, known)),
        _ => None,
    }) {
        return format!(
            "the idempotent-jobs tables at {shown} were made by a newer release of idempotent-jobs (schema version {found}; this build knows versions up to {known}): upgrade this CLI, and every worker that uses them, to that release or later (migrate cannot take a schema back)"
        );
    }
    if !missing.is_empty() {
        return format!(
            "the database at {shown} lacks idempotent-jobs tables ({}): run `idempotent-jobs migrate` (or idempotent_jobs::migrate) as the schema's owner",
            missing.join(", ")
        );
    }
    if problems
        .iter()
        .all(|p| matches!(p, SchemaProblem::ReadOnly { .. }))
    {
        return format!(
            "the idempotent-jobs tables at {shown} are there, but this connection cannot write to them: every job's claim would fail"
        );
    }
    if problems
        .iter()
        .all(|p| matches!(p, SchemaProblem::MissingPrivilege { .. }))
    {
        return format!(
            "the idempotent-jobs tables at {shown} are there, but this connection's role may not use them: as the schema's owner, grant what is missing"
        );
    }
    format!(
        "the idempotent-jobs tables at {shown} are incomplete or not usable by this connection: run `idempotent-jobs migrate` (or idempotent_jobs::migrate) as the schema's owner, or grant what is missing"
    )
}

/// Writes `text` to stdout. A closed stdout (`| head`) is not an error worth a panic.
fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Writes `value` to stdout as one pretty JSON document.
fn emit_json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(mut text) => {
            text.push('\n');
            emit(&text);
        }
        Err(error) => eprintln!("error: could not write JSON: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error text that ends in a newline, caused by one that does too (libpq's messages do).
    #[derive(Debug)]
    struct Ends(&'static str, Option<Box<Ends>>);

    impl std::fmt::Display for Ends {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Ends {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    /// A forget whose `COMMIT` went unanswered does not tell the operator that running it again
    /// is safe: run again, it would forget a run that claimed the key since.
    #[test]
    fn a_forget_of_unknown_outcome_does_not_call_a_rerun_safe() {
        let error = Error::OutcomeUnknown {
            action: "forgetting a key",
            source: diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::ClosedConnection,
                Box::new(String::from("server closed the connection")),
            ),
        };
        let message = format!(
            "lost the connection to the database at db: {}",
            with_causes(&error)
        );
        assert!(message.contains("; retrying is safe"), "{message}");
        let told = a_forget_of_unknown_outcome(&message, "`charge:1`");
        assert!(!told.contains("safe"), "{told}");
        assert!(
            told.contains("may or may not have been committed")
                && told.contains("look at key `charge:1` again (`keys show`)"),
            "{told}"
        );
    }

    #[test]
    fn error_texts_lose_their_trailing_whitespace() {
        let error = Ends(
            "forgetting a key failed\n",
            Some(Box::new(Ends("server closed the connection\n\t", None))),
        );
        let text = printable(&with_causes(&error));
        assert_eq!(
            text,
            "forgetting a key failed: server closed the connection"
        );
    }
}
