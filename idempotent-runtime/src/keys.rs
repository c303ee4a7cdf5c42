//! Finding, explaining and releasing keys: "why did my job not run?" and "let this one run again".
//!
//! [`lookup`] reads a key's row: which job holds it, when it was done, when it lapses, whether a
//! result and a fingerprint are stored. [`forget`] deletes it, so that the next delivery runs the
//! job again; each forget is recorded as a `tracing` event (target `idempotent_jobs::keys`, with the
//! job, the key and who asked) and, with the `metrics` feature, counted in
//! `idempotent_jobs_keys_forgotten_total`. Both also work by digest ([`lookup_digest`],
//! [`forget_digest`]), for keys stored redacted. [`list`] and [`job_counts`] are for operators:
//! they scan `done_jobs`, bounded by a limit.
//!
//! Build a handler's key from its inputs with its companion, `handler::key(..)`, never by hand.
//!
//! ```
//! use diesel::prelude::*;
//! use idempotent_runtime::{JobKey, keys};
//!
//! let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
//! idempotent_runtime::migrate(&mut conn)?;
//! let key = JobKey::new("invoice:2026-10:cust_481");
//! assert!(keys::lookup(&mut conn, &key)?.is_none());
//! assert!(!keys::forget(&mut conn, &key, "support ticket 4711")?);
//! # Ok::<(), idempotent_runtime::Error>(())
//! ```
//!
//! Forgetting is safe at any time: it deletes only the committed row it found (by the claiming
//! run's token), so a run holding the key uncommitted at that moment, or renewing a lapsed row,
//! keeps its claim, and a forget never lets two runs of one key commit at once. What it cannot
//! undo is the job's effect: forget a key only when the job should really run again.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::Error;
use crate::key::JobKey;
use crate::store::{Database, JobCountRow, KeyFilter, KeyRow, Store};
use crate::transaction::{Outside, Own, outside_transactions_judged};

/// What `done_jobs` holds for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyRecord {
    /// The job that holds the key.
    pub job: String,
    /// The key as stored: readable, or `redacted:<digest prefix>` for a job with `redact_key`.
    pub key: String,
    /// The key's SHA-256 digest, the table's key.
    pub digest: [u8; 32],
    /// When the run that holds it recorded its result (the database's clock), about when it
    /// committed; for a job that returns `()` with no `keep`, when it claimed the key (on SQLite
    /// and MySQL a `()` job inside a caller's transaction records at its end).
    pub done_at: SystemTime,
    /// When the claim lapses and the job may run again; `None`: never.
    pub expires_at: Option<SystemTime>,
    /// Whether `expires_at` has passed, by the database's clock: the next delivery runs the job.
    pub lapsed: bool,
    /// Whether a result is stored, which a replay returns (`()` stores none).
    pub has_result: bool,
    /// Whether the run that committed the key never recorded its result: a statement of its body
    /// ended the job's transaction early and the worker died before it could take its claim back
    /// (or the take-back failed: [`Error::ClaimNotTakenBack`]).
    /// The next delivery takes the key over and runs the job to completion. Only a job that
    /// records a result has such a row: a claim of a job returning `()` is its whole record, and
    /// one left behind reads as done, so it is forgotten by hand.
    pub unfinished: bool,
    /// Whether an input fingerprint is stored, which a replay's inputs must match.
    pub has_fingerprint: bool,
    /// Which run's row this is: [`forget_record`] forgets this row only.
    claim_token: Option<i64>,
}

impl KeyRecord {
    /// Whether the key's next delivery runs the job (the key [`lapsed`](Self::lapsed), or its
    /// run is [`unfinished`](Self::unfinished)) rather than replaying this run.
    pub fn next_delivery_runs(&self) -> bool {
        self.lapsed || self.unfinished
    }

    /// The digest in lowercase hexadecimal, as `forget_digest` and the CLI take it.
    pub fn digest_hex(&self) -> String {
        hex(&self.digest)
    }

    /// Which run's row this is, as opaque text: the same for every read of that run's row, and
    /// different once another run renewed the key. A page or a prompt that shows a record and
    /// acts on it later carries this along, and compares it with the record read again before
    /// [`forget_record`], so that it never acts on a run it did not show.
    pub fn revision(&self) -> String {
        match self.claim_token {
            Some(token) => format!("{:016x}", token.cast_unsigned()),
            None => String::from("-"),
        }
    }

    fn from_row(row: KeyRow) -> Self {
        let mut digest = [0u8; 32];
        let len = row.key_digest.len().min(32);
        digest[..len].copy_from_slice(&row.key_digest[..len]);
        Self {
            job: row.job_name,
            key: row.job_key,
            digest,
            done_at: from_micros(row.done_at_micros),
            expires_at: row.expires_at_micros.map(from_micros),
            lapsed: row.lapsed,
            has_result: row.has_result,
            unfinished: row.unfinished,
            has_fingerprint: row.has_fingerprint,
            claim_token: row.claim_token,
        }
    }
}

/// Which keys [`list`] returns: all by default, newest first, at most 100.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyQuery {
    job: Option<String>,
    done_from: Option<SystemTime>,
    done_before: Option<SystemTime>,
    after: Option<(SystemTime, [u8; 32])>,
    limit: u32,
}

impl Default for KeyQuery {
    fn default() -> Self {
        Self {
            job: None,
            done_from: None,
            done_before: None,
            after: None,
            limit: 100,
        }
    }
}

impl KeyQuery {
    /// Only the keys of the job with this name.
    pub fn job(mut self, name: impl Into<String>) -> Self {
        self.job = Some(name.into());
        self
    }

    /// Only keys done at or after `time`.
    pub fn done_from(mut self, time: SystemTime) -> Self {
        self.done_from = Some(time);
        self
    }

    /// Only keys done before `time`.
    pub fn done_before(mut self, time: SystemTime) -> Self {
        self.done_before = Some(time);
        self
    }

    /// Only the keys that come after the key done at `done_at` with `digest` in [`list`]'s order
    /// (newest first; keys done at the same instant by digest): the next page after a page whose
    /// last record is `last` is `.after(last.done_at, last.digest)`. Keys done at the same instant
    /// (a busy worker commits several in one millisecond, SQLite's grain) are neither skipped nor
    /// repeated, which [`done_before`](Self::done_before) with the last one's time would do.
    pub fn after(mut self, done_at: SystemTime, digest: [u8; 32]) -> Self {
        self.after = Some((done_at, digest));
        self
    }

    /// At most this many keys (at least 1).
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit.max(1);
        self
    }
}

/// How many keys one job holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobCount {
    /// The job's name.
    pub job: String,
    /// Its keys in `done_jobs`.
    pub keys: u64,
    /// Of those, how many have lapsed (a prune would delete them).
    pub lapsed: u64,
    /// When its oldest key was done.
    pub oldest: SystemTime,
    /// When its newest key was done.
    pub newest: SystemTime,
}

impl JobCount {
    fn from_row(row: JobCountRow) -> Self {
        Self {
            job: row.job_name,
            keys: u64::try_from(row.key_count).unwrap_or(0),
            lapsed: u64::try_from(row.lapsed_count).unwrap_or(0),
            oldest: from_micros(row.oldest_micros),
            newest: from_micros(row.newest_micros),
        }
    }
}

/// The record of `key`, or `None` when no committed run holds it (a run in progress, its claim
/// not yet committed, is not seen).
pub fn lookup<C: crate::connection::JobStore>(
    conn: &mut C,
    key: &JobKey,
) -> Result<Option<KeyRecord>, Error> {
    lookup_digest(conn, &key.digest())
}

/// [`lookup`] by the key's digest.
pub fn lookup_digest<C: crate::connection::JobStore>(
    conn: &mut C,
    digest: &[u8; 32],
) -> Result<Option<KeyRecord>, Error> {
    crate::drive::block_on(lookup_on(conn.idempotent_store(), digest))
}

/// Deletes the record of `key`, so that the next delivery runs the job again; `reason` goes into
/// the event that records it. Returns whether there was one.
pub fn forget<C: crate::connection::JobStore>(
    conn: &mut C,
    key: &JobKey,
    reason: &str,
) -> Result<bool, Error> {
    forget_digest(conn, &key.digest(), reason)
}

/// [`forget`] by the key's digest.
pub fn forget_digest<C: crate::connection::JobStore>(
    conn: &mut C,
    digest: &[u8; 32],
    reason: &str,
) -> Result<bool, Error> {
    crate::drive::block_on(forget_on(conn.idempotent_store(), digest, reason, None))
}

/// Forgets the key of `record` only if its row is still the run `record` shows: a record shown
/// to an operator and confirmed is never replaced, between the look and the forget, by a run that
/// renewed the lapsed key and committed meanwhile (that run's row is left; `false`). `false` too
/// when the key is gone. Look the key up again to tell the two apart.
pub fn forget_record<C: crate::connection::JobStore>(
    conn: &mut C,
    record: &KeyRecord,
    reason: &str,
) -> Result<bool, Error> {
    crate::drive::block_on(forget_on(
        conn.idempotent_store(),
        &record.digest,
        reason,
        Some(record.claim_token),
    ))
}

/// The keys `query` selects, newest first.
pub fn list<C: crate::connection::JobStore>(
    conn: &mut C,
    query: &KeyQuery,
) -> Result<Vec<KeyRecord>, Error> {
    crate::drive::block_on(list_on(conn.idempotent_store(), query))
}

/// How many keys each job holds, by job name.
pub fn job_counts<C: crate::connection::JobStore>(conn: &mut C) -> Result<Vec<JobCount>, Error> {
    crate::drive::block_on(job_counts_on(conn.idempotent_store()))
}

/// [`lookup`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn lookup_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    key: &JobKey,
) -> Result<Option<KeyRecord>, Error> {
    lookup_on(conn.idempotent_store(), &key.digest()).await
}

/// [`lookup_digest`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn lookup_digest_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    digest: &[u8; 32],
) -> Result<Option<KeyRecord>, Error> {
    lookup_on(conn.idempotent_store(), digest).await
}

/// [`forget`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn forget_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    key: &JobKey,
    reason: &str,
) -> Result<bool, Error> {
    forget_on(conn.idempotent_store(), &key.digest(), reason, None).await
}

/// [`forget_digest`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn forget_digest_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    digest: &[u8; 32],
    reason: &str,
) -> Result<bool, Error> {
    forget_on(conn.idempotent_store(), digest, reason, None).await
}

/// [`forget_record`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn forget_record_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    record: &KeyRecord,
    reason: &str,
) -> Result<bool, Error> {
    forget_on(
        conn.idempotent_store(),
        &record.digest,
        reason,
        Some(record.claim_token),
    )
    .await
}

/// [`list`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn list_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    query: &KeyQuery,
) -> Result<Vec<KeyRecord>, Error> {
    list_on(conn.idempotent_store(), query).await
}

/// [`job_counts`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn job_counts_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
) -> Result<Vec<JobCount>, Error> {
    job_counts_on(conn.idempotent_store()).await
}

/// Parses a digest written as 64 hexadecimal digits (what [`KeyRecord::digest_hex`] prints).
pub fn parse_digest(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

async fn lookup_on<S: Store>(conn: &mut S, digest: &[u8; 32]) -> Result<Option<KeyRecord>, Error> {
    let digest = *digest;
    let row = keys_operation(
        conn,
        ("look up a key", "looking up a key"),
        |_| false,
        async move |conn: &mut S| S::Db::lookup_key(conn, &digest).await,
    )
    .await?;
    Ok(row.map(KeyRecord::from_row))
}

/// `shown`: the claim token of the row the caller saw; another row of the key is left.
async fn forget_on<S: Store>(
    conn: &mut S,
    digest: &[u8; 32],
    reason: &str,
    shown: Option<Option<i64>>,
) -> Result<bool, Error> {
    // Read first: which run's row this is. Only that row is deleted: a run that holds the key
    // uncommitted right now (not visible yet), or renews a lapsed row, is never undone by a
    // delete that waited for its lock (MySQL's DELETE reads the latest committed row). Both in one
    // transaction, committed before this returns.
    let digest = *digest;
    // The row the forget read, for the audit trail of a forget whose commit's outcome is unknown
    // (the operation's own result is lost with the commit).
    let read = std::sync::Arc::new(std::sync::Mutex::new(None::<(String, String)>));
    let read_by_forget = std::sync::Arc::clone(&read);
    // The row the first attempt read (its claim token; `None` inside: no row): an attempt after a
    // failure that passes (SQLite's busy, a deadlock) deletes only that row. A row that changed
    // since is another run's (one that renewed the lapsed key, or claimed it anew, while this
    // forget waited), and stays.
    let first_read = std::sync::Arc::new(std::sync::Mutex::new(None::<Option<Option<i64>>>));
    let (record, deleted) = keys_operation(
        conn,
        ("forget a key", "forgetting a key"),
        |(_, deleted): &(Option<KeyRow>, bool)| *deleted,
        async move |conn: &mut S| {
            let digest = &digest;
            let record = S::Db::lookup_key(conn, digest).await?;
            if let (Some(row), Ok(mut read)) = (&record, read_by_forget.lock()) {
                *read = Some((row.job_name.clone(), row.job_key.clone()));
            }
            let now = record.as_ref().map(|row| row.claim_token);
            let first = match first_read.lock() {
                Ok(mut first) => *first.get_or_insert(now),
                Err(_) => now,
            };
            let deleted = match &record {
                None => false,
                Some(_) if first != now => false,
                Some(row) if shown.is_some_and(|token| token != row.claim_token) => false,
                Some(row) => match row.claim_token {
                    Some(token) => S::Db::take_back(conn, digest, token).await?,
                    // A row of a schema before claim tokens: by its digest.
                    None => S::Db::forget(conn, digest).await?,
                },
            };
            Ok((record, deleted))
        },
    )
    .await
    .inspect_err(|error| {
        if let Error::OutcomeUnknown { .. } = error {
            // The forget may be committed: the audit trail has it, with its reason.
            let (job, key) = read
                .lock()
                .ok()
                .and_then(|read| read.clone())
                .unwrap_or_default();
            tracing::warn!(
                target: "idempotent_jobs::keys",
                job,
                key,
                digest = %hex(&digest),
                reason,
                %error,
                "may have forgotten a key: the connection failed while the forget was committing; look the key up"
            );
        }
    })?;
    audit_forget(record.as_ref(), deleted, &digest, reason);
    Ok(deleted)
}

/// The audit trail of a forget that committed: what it deleted, or why it deleted nothing.
fn audit_forget(record: Option<&KeyRow>, deleted: bool, digest: &[u8; 32], reason: &str) {
    let (job, key) = record.map_or(("", ""), |r| (r.job_name.as_str(), r.job_key.as_str()));
    if deleted {
        tracing::warn!(
            target: "idempotent_jobs::keys",
            job,
            key,
            digest = %hex(digest),
            reason,
            "forgot a key: the job's next delivery runs it again"
        );
        #[cfg(feature = "metrics")]
        {
            crate::telemetry::described();
            metrics::counter!(crate::telemetry::KEYS_FORGOTTEN.name, "job" => job.to_owned())
                .increment(1);
        }
    } else if record.is_some() {
        tracing::info!(
            target: "idempotent_jobs::keys",
            job,
            key,
            digest = %hex(digest),
            reason,
            "asked to forget a key whose row another run replaced meanwhile; nothing was forgotten"
        );
    } else {
        tracing::info!(
            target: "idempotent_jobs::keys",
            digest = %hex(digest),
            reason,
            "asked to forget a key no committed run holds; nothing was forgotten"
        );
    }
}

async fn list_on<S: Store>(conn: &mut S, query: &KeyQuery) -> Result<Vec<KeyRecord>, Error> {
    let job = query.job.clone();
    let (done_from_micros, done_before_micros) = (
        query.done_from.map(to_micros),
        query.done_before.map(to_micros),
    );
    let limit = i64::from(query.limit);
    let (after_micros, after_digest) = match query.after {
        Some((done_at, digest)) => (Some(to_micros(done_at)), Some(digest)),
        None => (None, None),
    };
    let rows = keys_operation(
        conn,
        ("list keys", "listing keys"),
        |_| false,
        async move |conn: &mut S| {
            let filter = KeyFilter {
                job: job.as_deref(),
                done_from_micros,
                done_before_micros,
                after_micros,
                after_digest: after_digest.as_ref(),
                limit,
            };
            S::Db::list_keys(conn, &filter).await
        },
    )
    .await?;
    Ok(rows.into_iter().map(KeyRecord::from_row).collect())
}

async fn job_counts_on<S: Store>(conn: &mut S) -> Result<Vec<JobCount>, Error> {
    let rows = keys_operation(
        conn,
        ("count keys", "counting keys per job"),
        |_| false,
        async |conn: &mut S| S::Db::job_counts(conn).await,
    )
    .await?;
    Ok(rows.into_iter().map(JobCount::from_row).collect())
}

/// Runs a keys operation in a transaction of its own; `names` are what it is (for a refusal inside
/// a transaction) and what it was doing (for a failure).
///
/// `wrote` tells from the answer whether the statements changed anything (a look-up never does):
/// when they did not, a lost `COMMIT` reply loses nothing.
async fn keys_operation<S: Store, T>(
    conn: &mut S,
    (what, action): (&'static str, &'static str),
    wrote: impl Fn(&T) -> bool,
    statements: impl AsyncFnMut(&mut S) -> diesel::QueryResult<T>,
) -> Result<T, Error> {
    outside_transactions_judged(conn, "done_jobs", Own::Committed, wrote, statements)
        .await
        .map_err(keys_error::<S>(what, action))
}

/// An error of the keys API for `what` (refused inside a transaction) or `action` (a failure of
/// the database), saying whether the failure passes.
fn keys_error<S: Store>(
    what: &'static str,
    action: &'static str,
) -> impl Fn(Outside) -> Error + Copy {
    move |outside| match outside {
        Outside::InsideTransaction => Error::InsideTransaction { what },
        Outside::NotMigrated(table, _) => Error::NotMigrated { table },
        Outside::Failed(source) => Error::Keys {
            action,
            retryable: S::Db::passes(&source),
            source,
        },
        Outside::CommitUnknown(source) => Error::OutcomeUnknown { action, source },
    }
}

fn from_micros(micros: i64) -> SystemTime {
    let magnitude = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

fn to_micros(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_micros()).map_or(i64::MIN, |m| -m),
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_through_hex() {
        let digest = JobKey::new("invoice:1").digest();
        assert_eq!(parse_digest(&hex(&digest)), Some(digest));
        assert_eq!(parse_digest("zz"), None);
        assert_eq!(parse_digest(&"é".repeat(32)), None);
        assert_eq!(parse_digest(&"g".repeat(64)), None);
    }

    /// A busy database passes; a missing table does not.
    #[cfg(feature = "sqlite")]
    #[test]
    fn keys_errors_say_whether_a_retry_helps() {
        use diesel::result::{DatabaseErrorKind, Error as DieselError};
        let error = |message: &str| {
            keys_error::<diesel::SqliteConnection>("forget a key", "forgetting a key")(
                Outside::Failed(DieselError::DatabaseError(
                    DatabaseErrorKind::Unknown,
                    Box::new(message.to_owned()),
                )),
            )
        };
        assert!(error("database is locked").is_retryable());
        assert!(!error("no such table: done_jobs").is_retryable());
    }

    #[test]
    fn times_round_trip_through_micros() {
        for micros in [0, 1, -1, 1_764_547_200_123_456, -86_400_000_000] {
            assert_eq!(to_micros(from_micros(micros)), micros);
        }
    }
}
