//! What the runtime's statements write and read: the values they bind and the rows they load.

use diesel::QueryableByName;
use diesel::result::Error as DieselError;

/// What a claim writes: the key's digest and readable form, the job, the fingerprint.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub digest: &'a [u8; 32],
    /// This run's mark on the row it claims (`claim_token`), so that it takes back its own claim
    /// only.
    pub token: i64,
    pub key: &'a str,
    pub job: &'a str,
    pub fingerprint: Option<&'a [u8]>,
    /// What the claimed row's `result` holds until the run records its own: [`UNFINISHED`] for a
    /// job that stores a result (so a row committed without one, by a body that ended the
    /// transaction early, reads as a run that did not finish); `None` for a job whose result is
    /// zero-sized (`()`), which has nothing to store and whose claim is the whole record.
    pub result: Option<&'a str>,
    /// Whether the claim goes in a transaction the job opened itself (not a savepoint in a
    /// caller's): PostgreSQL then checks, in the claim, that it runs in that transaction.
    pub own: bool,
}

/// `done_jobs.result` of a row whose run claimed the key and has not recorded its result: never
/// valid JSON, so never replayed. A committed row that still holds it was committed early (a
/// statement of the body ended the job's transaction, and the worker died before it could take
/// its claim back); the next delivery takes the key over and runs the job.
pub const UNFINISHED: &str = "";

/// A `done_jobs` row as a claim reads it back.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct DoneRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub job_name: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub result: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Binary>)]
    pub fingerprint: Option<Vec<u8>>,
    /// When the claiming run committed (or, with no result and no `keep`, claimed), in
    /// microseconds since the Unix epoch, UTC.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub done_at_micros: i64,
    /// Whether `expires_at` has passed, by the database's clock.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub lapsed: bool,
}

impl DoneRow {
    /// Whether the run that committed this row never recorded its result ([`UNFINISHED`]).
    pub fn unfinished(&self) -> bool {
        self.result.as_deref() == Some(UNFINISHED)
    }
}

/// The most bytes of values (a result, a key, an outbox message) a database takes in one
/// statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatementLimit {
    /// The most bytes of values, beside the statement around them.
    pub largest: u64,
    /// The server's own limit on one statement it comes from (MySQL's `max_allowed_packet`).
    pub packet: u64,
}

/// How finishing a job's transaction failed; see [`crate::transaction::finish_job`].
#[derive(Debug)]
pub enum Finish {
    /// The transaction was no longer the job's own: a statement of the body ended it, replaced it
    /// with another, or (PostgreSQL) a failed statement aborted it. Nothing was committed by the
    /// runtime; whether the body committed the claim is for the caller to find out.
    NotOwn(DieselError),
    /// The connection failed before the `COMMIT` was sent: nothing was committed.
    BeforeCommit(DieselError),
    /// The `COMMIT` failed (rolled back), or its connection did (outcome unknown).
    Commit(DieselError),
}

/// What one attempt at claiming found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAttempt {
    /// The key was free and is now claimed by this transaction.
    Inserted,
    /// The key is claimed; the row says by whom, with what result, and whether it has lapsed.
    Found(DoneRow),
    /// The key's row vanished (pruned) or is not yet visible to this statement: try again.
    Missing,
}

/// An outbox message as `outbox::push` writes it.
#[derive(Debug, Clone, Copy)]
pub struct NewMessage<'a> {
    pub message_id: &'a str,
    pub topic: &'a str,
    pub payload: &'a str,
    /// The pushing job's key as `done_jobs` shows it: readable, or redacted.
    pub job_key: &'a str,
}

/// One lease round.
#[derive(Debug, Clone, Copy)]
pub struct Lease<'a> {
    /// This round's own owner token.
    pub owner: &'a str,
    pub lease_micros: i64,
    pub limit: i64,
    /// Attempts after which a message is parked.
    pub max_attempts: i32,
}

/// A failed delivery to record.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    pub id: i64,
    pub owner: &'a str,
    pub error: &'a str,
    /// `None`: park the message.
    pub retry_after_micros: Option<i64>,
}

/// What one lease took: the messages it leased, and how many it parked first (their relay died,
/// or its lease lapsed, during their last allowed attempt).
#[derive(Debug, Default)]
pub struct Leased {
    /// Messages parked before the lease, at their last allowed attempt.
    pub parked: u64,
    /// The messages leased, by id.
    pub rows: Vec<LeasedRow>,
}

/// An outbox row as the relay reads it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct LeasedRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub id: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub message_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub topic: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub payload: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub job_key: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub attempts: i32,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub last_error: Option<String>,
    /// Microseconds from the push to now, by the database's clock.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub age_micros: i64,
}

/// How many outbox messages are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, QueryableByName)]
pub struct OutboxCounts {
    /// Waiting to be sent (including those backing off after a failure).
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub pending: i64,
    /// Leased by a relay: held by a round delivering them now, or by one that stopped (a crash, a
    /// cancelled round whose relay was dropped) and whose lease has lapsed or will, after which
    /// another round takes them over (sends them again, or parks those whose last allowed
    /// attempt it was).
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub leased: i64,
    /// Delivered and not yet pruned.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub delivered: i64,
    /// Parked after too many failed attempts.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub parked: i64,
}

/// A `done_jobs` row as [`crate::keys`] shows it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct KeyRow {
    #[diesel(sql_type = diesel::sql_types::Binary)]
    pub key_digest: Vec<u8>,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub job_key: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub job_name: String,
    /// Which run wrote the row; NULL for rows of schema versions before 3.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub claim_token: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub has_result: bool,
    /// The run that committed the row never recorded its result ([`UNFINISHED`]).
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub unfinished: bool,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub has_fingerprint: bool,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub done_at_micros: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub expires_at_micros: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub lapsed: bool,
}

/// Which rows [`Database::list_keys`] returns.
#[derive(Debug, Clone, Copy)]
pub struct KeyFilter<'a> {
    pub job: Option<&'a str>,
    pub done_from_micros: Option<i64>,
    pub done_before_micros: Option<i64>,
    /// Only rows after this one (`done_at` in microseconds, digest) in the list's order.
    pub after_micros: Option<i64>,
    pub after_digest: Option<&'a [u8; 32]>,
    pub limit: i64,
}

/// One job's keys, as [`Database::job_counts`] counts them.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct JobCountRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub job_name: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub key_count: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub lapsed_count: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub oldest_micros: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub newest_micros: i64,
}

/// A setting's value as text.
#[cfg(any(
    feature = "postgres",
    feature = "async-postgres",
    feature = "mysql",
    feature = "async-mysql"
))]
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct SettingRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub previous: String,
}

/// One step of the schema: creates `table`, adds `column` to it, or creates `routines`.
#[derive(Debug)]
pub struct Step {
    /// The version the step records.
    pub version: i32,
    /// The table it creates, adds `column` to, or whose jobs its `routines` serve.
    pub table: &'static str,
    /// The column it adds, if that is all it does.
    pub column: Option<&'static str>,
    /// The stored procedures it creates, if that is all it does (MySQL).
    pub routines: &'static [&'static str],
    /// The indexes it creates on `table`, if that is all it does.
    pub indexes: &'static [&'static str],
    /// Its DDL.
    pub sql: &'static str,
}

impl Step {
    /// What `idempotent_schema.description` says of it: the table, `table.column`, or the
    /// routines' names.
    pub(crate) fn description(&self) -> String {
        match self.column {
            _ if !self.routines.is_empty() => self.routines.join(", "),
            _ if !self.indexes.is_empty() => self.indexes.join(", "),
            Some(column) => format!("{}.{column}", self.table),
            None => self.table.to_owned(),
        }
    }
}
