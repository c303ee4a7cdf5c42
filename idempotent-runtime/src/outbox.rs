//! A transactional outbox: messages recorded in a job's transaction and sent after it commits.
//!
//! A job that emails a customer or calls a payment provider cannot put that effect inside its
//! database transaction. The rule from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>
//! says what to do: record the outgoing message in the same transaction (so it exists exactly when
//! the job's work does), and send it afterwards.
//!
//! * [`push`] (or [`push_async`]) inside a job's body, on the body's own connection, writes the
//!   message; a rerun of the job that replays writes nothing, and one that rolls back takes its
//!   messages with it. Pushing anywhere else is refused ([`Error::OutboxOutsideJob`],
//!   [`Error::OutboxOnAnotherConnection`]): a message committed on its own would outlive a job
//!   that rolled back.
//! * Each message has a [`message_id`](OutboxMessage::message_id) derived from the job key's
//!   digest, the run and the message's position in it: a redelivery of a committed run replays and
//!   pushes nothing, so a receiver that remembers the ids it has acted on drops only true
//!   duplicates, while a later run of the same key (its `keep` lapsed) sends new ids.
//! * A [`Relay`] leases pending messages, hands each to your delivery function outside any
//!   transaction, and marks it delivered. Several relays can run at once: a leased message is not
//!   handed to another relay while its lease lasts (on PostgreSQL and MySQL the lease is taken
//!   with `FOR UPDATE SKIP LOCKED`; SQLite has one writer). A relay that dies before marking a
//!   message delivered leaves it to be sent again once the lease lapses.
//! * Each delivery attempt is counted when the message is leased, so a delivery that panics, or
//!   kills the relay's process, counts too. After [`Relay::max_attempts`] a message is parked:
//!   visible through [`parked`], sent again after [`retry_parked`]. A message whose relay died
//!   during its delivery is sent again alone, never in a batch, so one poison message never holds
//!   the others back. Delivered messages are removed by [`prune_delivered`].
//! * Every time is the database's: leases, backoffs and the delay reported for each delivery.
//!
//! ```
//! use diesel::prelude::*;
//! use idempotent_runtime::outbox::{self, Relay};
//! use idempotent_runtime::{Job, JobKey, run};
//!
//! static WELCOME: Job = Job::new("welcome", "welcome:<user>");
//!
//! let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
//! idempotent_runtime::migrate(&mut conn)?;
//! for _delivery in 0..2 {
//!     run(&mut conn, &WELCOME, &JobKey::new("welcome:ada"), |conn| {
//!         outbox::push(conn, "email", &serde_json::json!({ "to": "ada" }))?;
//!         Ok::<_, idempotent_runtime::Error>(())
//!     })?;
//! }
//! let mut sent = Vec::new();
//! let report = Relay::new().drain(&mut conn, |message| {
//!     sent.push(message.message_id().to_owned());
//!     Ok::<_, std::io::Error>(())
//! })?;
//! assert_eq!((report.delivered, sent.len()), (1, 1), "the job ran twice, the email goes once");
//! # Ok::<(), idempotent_runtime::Error>(())
//! ```

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest as _, Sha256};

use crate::context;
use crate::drive::catch_panic;
use crate::error::Error;
use crate::prune::{Prune, PruneReport};
use crate::stats::Settled;
use crate::store::{Database, Failure, Lease, LeasedRow, NewMessage, Store};
use crate::transaction::{
    Outside, Own, outside_transactions, outside_transactions_judged, outside_transactions_told,
};

pub use crate::store::OutboxCounts;

/// A message as the relay hands it to a delivery function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    id: i64,
    message_id: String,
    topic: String,
    payload: String,
    job_key: Option<String>,
    attempts: i32,
    last_error: Option<String>,
    age: Duration,
}

impl OutboxMessage {
    fn from_row(row: LeasedRow) -> Self {
        Self {
            id: row.id,
            message_id: row.message_id,
            topic: row.topic,
            payload: row.payload,
            job_key: row.job_key,
            attempts: row.attempts,
            last_error: row.last_error,
            age: Duration::from_micros(u64::try_from(row.age_micros).unwrap_or(0)),
        }
    }

    /// The id receivers deduplicate by: unique to this message of this run of its job.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// What kind of message this is.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The payload as JSON text.
    pub fn payload_json(&self) -> &str {
        &self.payload
    }

    /// The payload, decoded.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.payload)
    }

    /// The key of the job that pushed it, as `done_jobs` shows it: redacted when the job redacts
    /// its keys.
    pub fn job_key(&self) -> Option<&str> {
        self.job_key.as_deref()
    }

    /// Delivery attempts so far, this one included (each counted when the message was leased).
    pub fn attempts(&self) -> u32 {
        u32::try_from(self.attempts).unwrap_or(0)
    }

    /// Why the last failed delivery failed (the error's text, control characters replaced, at
    /// most 2,000 characters), if one did.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// How long ago the message was pushed, by the database's clock, when it was leased.
    pub fn age(&self) -> Duration {
        self.age
    }
}

/// The id of the `position`-th message on `topic` of the run `run` of the job whose key has
/// `digest`.
fn message_id(digest: &[u8; 32], run: &[u8; 16], topic: &str, position: u32) -> String {
    let mut hasher = Sha256::new();
    for part in [
        &digest[..],
        &run[..],
        topic.as_bytes(),
        &position.to_be_bytes(),
    ] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut id = String::from("msg_");
    for byte in &digest[..16] {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

/// Records a message in the current job's transaction; the relay sends it after the job commits.
/// Returns its [`message_id`](OutboxMessage::message_id).
///
/// Call it from a job's body, with the body's connection. Outside a job there is no transaction to
/// join and no key to derive the id from ([`Error::OutboxOutsideJob`]); on another connection the
/// message would commit on its own, whatever becomes of the job
/// ([`Error::OutboxOnAnotherConnection`]). A message the database cannot hold whole is refused
/// before anything is sent ([`Error::OutboxMessageRefused`]): on MySQL a topic longer than 255
/// characters, or a job key, topic and payload larger together than `max_allowed_packet` less
/// 64 KiB.
pub fn push<C, T>(conn: &mut C, topic: &str, payload: &T) -> Result<String, Error>
where
    C: crate::connection::JobStore,
    T: Serialize + ?Sized,
{
    crate::drive::block_on(push_on(conn.idempotent_store(), topic, payload))
}

/// [`push`] through an async connection, from an async job's body.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn push_async<C, T>(conn: &mut C, topic: &str, payload: &T) -> Result<String, Error>
where
    C: crate::connection::AsyncJobStore,
    T: Serialize + ?Sized,
{
    push_on(conn.idempotent_store(), topic, payload).await
}

async fn push_on<S: Store, T: Serialize + ?Sized>(
    conn: &mut S,
    topic: &str,
    payload: &T,
) -> Result<String, Error> {
    let Some(job) = context::current() else {
        return Err(Error::OutboxOutsideJob {
            topic: topic.to_owned(),
        });
    };
    if std::ptr::from_mut::<S>(conn) as usize != job.connection {
        return Err(Error::OutboxOnAnotherConnection {
            topic: topic.to_owned(),
            job: job.job,
        });
    }
    let payload = crate::fingerprint::refuse_non_finite(payload)
        .and_then(|()| serde_json::to_string(payload))
        .map_err(|source| Error::OutboxPayload {
            topic: topic.to_owned(),
            source,
        })?;
    refuse_what_would_not_fit(conn, topic, &payload, &job.key_text).await?;
    let id = message_id(&job.digest, job.run(), topic, job.next_push());
    let pushed = S::Db::push(
        conn,
        &NewMessage {
            message_id: &id,
            topic,
            payload: &payload,
            job_key: &job.key_text,
        },
    )
    .await;
    match pushed {
        Ok(()) => Ok(id),
        // A failure that may have ended the job's whole transaction (a deadlock, SQLite's full
        // disk), and did, as the database answers: "the statement changed nothing; retrying is
        // safe" would have the body push again, outside any transaction.
        Err(source)
            if S::Db::rolled_back_whole(&source)
                && S::Db::transaction_still_open(conn).await == Some(false) =>
        {
            Err(Error::OutboxPushRolledBackJob {
                topic: topic.to_owned(),
                retryable: S::Db::passes(&source),
                source,
            })
        }
        Err(source) => Err(failed::<S::Db>(source)),
    }
}

/// Refuses, before anything is sent, a message the database would not hold whole: a topic longer
/// than its column (where a session's non-strict `sql_mode` would cut it short, and the relay
/// deliver it to another topic), or values larger than one statement takes (where the server
/// would close the connection under the job).
async fn refuse_what_would_not_fit<S: Store>(
    conn: &mut S,
    topic: &str,
    payload: &str,
    key_text: &str,
) -> Result<(), Error> {
    // On every database alike: PostgreSQL's text cannot hold NUL, and there a statement that
    // fails aborts the job's whole transaction.
    if topic.contains('\0') {
        return Err(Error::OutboxMessageRefused {
            topic: topic.replace('\0', "\\0"),
            why: "its topic holds a NUL character, which PostgreSQL's text cannot hold (refused on every database alike)".to_owned(),
        });
    }
    if let Some(max) = S::Db::MAX_TOPIC_CHARS {
        let chars = topic.chars().count();
        if chars > max {
            return Err(Error::OutboxMessageRefused {
                topic: topic.chars().take(max).collect(),
                why: format!(
                    "its topic is {chars} characters, over the {max} this database's outbox table holds"
                ),
            });
        }
    }
    let bytes = key_text.len() + topic.len() + payload.len();
    match S::Db::too_large_for_a_statement(conn, bytes)
        .await
        .map_err(failed::<S::Db>)?
    {
        None => Ok(()),
        Some(limit) => Err(Error::OutboxMessageRefused {
            topic: topic.to_owned(),
            why: format!(
                "its job key, topic and payload are {bytes} bytes, over the {} this server takes (max_allowed_packet {} less 64 KiB for the statement)",
                limit.largest, limit.packet
            ),
        }),
    }
}

/// Messages not yet delivered and not parked (waiting, being delivered, or backing off after a
/// failed attempt), oldest first, at most `limit`: what an operator looks at when messages seem
/// stuck.
pub fn unsent<C: crate::connection::JobStore>(
    conn: &mut C,
    limit: u32,
) -> Result<Vec<OutboxMessage>, Error> {
    crate::drive::block_on(unsent_on(conn.idempotent_store(), limit))
}

/// [`unsent`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn unsent_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    limit: u32,
) -> Result<Vec<OutboxMessage>, Error> {
    unsent_on(conn.idempotent_store(), limit).await
}

async fn unsent_on<S: Store>(conn: &mut S, limit: u32) -> Result<Vec<OutboxMessage>, Error> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let limit = i64::from(limit);
    let rows = outside_transactions_judged(
        conn,
        "outbox",
        Own::Committed,
        |_| false,
        async move |conn: &mut S| S::Db::unsent(conn, limit).await,
    )
    .await
    .map_err(outbox_error::<S::Db>("list unsent outbox messages"))?;
    Ok(rows.into_iter().map(OutboxMessage::from_row).collect())
}

/// Messages parked after too many failed attempts, oldest first.
pub fn parked<C: crate::connection::JobStore>(conn: &mut C) -> Result<Vec<OutboxMessage>, Error> {
    crate::drive::block_on(parked_on(conn.idempotent_store()))
}

/// [`parked`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn parked_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
) -> Result<Vec<OutboxMessage>, Error> {
    parked_on(conn.idempotent_store()).await
}

async fn parked_on<S: Store>(conn: &mut S) -> Result<Vec<OutboxMessage>, Error> {
    let rows = outside_transactions_judged(
        conn,
        "outbox",
        Own::Committed,
        |_| false,
        async |conn: &mut S| S::Db::parked(conn).await,
    )
    .await
    .map_err(outbox_error::<S::Db>("list parked outbox messages"))?;
    Ok(rows.into_iter().map(OutboxMessage::from_row).collect())
}

/// Sends parked messages again: all of them, or the one with `message_id`. Returns how many.
pub fn retry_parked<C: crate::connection::JobStore>(
    conn: &mut C,
    message_id: Option<&str>,
) -> Result<usize, Error> {
    crate::drive::block_on(retry_parked_on(conn.idempotent_store(), message_id))
}

/// [`retry_parked`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn retry_parked_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    message_id: Option<&str>,
) -> Result<usize, Error> {
    retry_parked_on(conn.idempotent_store(), message_id).await
}

async fn retry_parked_on<S: Store>(conn: &mut S, message_id: Option<&str>) -> Result<usize, Error> {
    let message_id = message_id.map(str::to_owned);
    // Sending none again, whose `COMMIT` reply is lost, sent none again.
    outside_transactions_judged(
        conn,
        "outbox",
        Own::Look,
        |retried| *retried > 0,
        async move |conn: &mut S| S::Db::retry_parked(conn, message_id.as_deref()).await,
    )
    .await
    .map_err(outbox_error::<S::Db>("retry parked outbox messages"))
}

/// Deletes messages delivered more than `older_than` ago, in batches as `options` says (as
/// [`prune`](crate::prune::prune()) does for lapsed claims).
pub fn prune_delivered<C: crate::connection::JobStore>(
    conn: &mut C,
    older_than: Duration,
    options: &Prune,
) -> Result<PruneReport, Error> {
    crate::drive::block_on(prune_delivered_on(
        conn.idempotent_store(),
        older_than,
        options,
    ))
}

/// [`prune_delivered`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn prune_delivered_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    older_than: Duration,
    options: &Prune,
) -> Result<PruneReport, Error> {
    prune_delivered_on(conn.idempotent_store(), older_than, options).await
}

async fn prune_delivered_on<S: Store>(
    conn: &mut S,
    older_than: Duration,
    options: &Prune,
) -> Result<PruneReport, Error> {
    let older_than = crate::time::micros(older_than, "prune_delivered's `older_than`")?;
    let batches = crate::prune::Batches {
        what: "delivered outbox messages",
        table: "outbox",
    };
    batches
        .run(
            conn,
            options,
            async move |conn: &mut S, limit| S::Db::prune_delivered(conn, older_than, limit).await,
            "prune delivered outbox messages",
        )
        .await
}

/// How many messages are pending, leased, delivered and parked, in one query; with the `metrics`
/// feature also set as the gauges `idempotent_jobs_outbox_messages{state}`.
pub fn counts<C: crate::connection::JobStore>(conn: &mut C) -> Result<OutboxCounts, Error> {
    crate::drive::block_on(counts_on(conn.idempotent_store()))
}

/// [`counts`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn counts_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
) -> Result<OutboxCounts, Error> {
    counts_on(conn.idempotent_store()).await
}

async fn counts_on<S: Store>(conn: &mut S) -> Result<OutboxCounts, Error> {
    let counts = outside_transactions_judged(
        conn,
        "outbox",
        Own::Committed,
        |_| false,
        async |conn: &mut S| S::Db::outbox_counts(conn).await,
    )
    .await
    .map_err(outbox_error::<S::Db>("count outbox messages"))?;
    crate::stats::outbox_counts(&counts);
    Ok(counts)
}

/// Sends outbox messages; see the [module docs](self).
#[derive(Debug)]
pub struct Relay {
    owner: String,
    batch_size: u32,
    lease: Duration,
    max_attempts: u32,
    backoff: Duration,
    max_backoff: Duration,
    /// Messages that a round of this relay leased and never handed to the delivery, left by a
    /// round whose future was dropped: the next round gives them back first.
    untried: std::sync::Mutex<Vec<Untried>>,
}

/// The messages a dropped round leased (under `owner`, its lease's token) and never handed over.
#[derive(Debug, Clone)]
struct Untried {
    owner: String,
    ids: Vec<i64>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let left = self
            .untried
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count: usize = left.iter().map(|untried| untried.ids.len()).sum();
        if count > 0 {
            tracing::warn!(
                relay = %self.owner,
                untried = count,
                "an outbox relay was dropped before giving back the messages that a cancelled round of it leased and never handed over: they stay leased, their attempt counted, until their lease lapses"
            );
        }
    }
}

/// Where a round stopped, as [`Error::RelayStopped`] tells it.
struct Stop {
    message_id: Option<String>,
    delivered: bool,
    last_attempt: bool,
}

/// What a round leased and has not handed over yet: given back to the relay if the round's future
/// is dropped, for its next round to release.
struct RoundGuard<'r> {
    relay: &'r Relay,
    owner: &'r str,
    untried: Vec<i64>,
}

impl RoundGuard<'_> {
    /// What is left, the guard disarmed (the round ends, or releases them itself).
    fn take(&mut self) -> Vec<i64> {
        std::mem::take(&mut self.untried)
    }
}

impl Drop for RoundGuard<'_> {
    fn drop(&mut self) {
        if self.untried.is_empty() {
            return;
        }
        tracing::warn!(
            relay = %self.relay.owner,
            untried = self.untried.len(),
            "an outbox round was dropped before it handed every leased message over: the relay's next round gives those back, their attempt uncounted"
        );
        self.relay
            .untried
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Untried {
                owner: self.owner.to_owned(),
                ids: self.take(),
            });
    }
}

impl Default for Relay {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for Relay {
    /// A copy with the same settings and an owner identity of its own, so that copies running at
    /// once never take each other's leases for their own.
    fn clone(&self) -> Self {
        Self {
            owner: owner_name(),
            batch_size: self.batch_size,
            lease: self.lease,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            max_backoff: self.max_backoff,
            untried: std::sync::Mutex::default(),
        }
    }
}

pub use crate::relay_report::RelayReport;

impl RelayReport {
    fn count(&mut self, settled: Settled) {
        *match settled {
            Settled::Delivered => &mut self.delivered,
            Settled::LeaseLost => &mut self.lease_lost,
            Settled::Failed => &mut self.failed,
            Settled::Parked => &mut self.parked,
        } += 1;
    }
}

/// A name no other relay, in this process or another, uses.
fn owner_name() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "relay-{}-{}-{nanos:x}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// The error text stored in `last_error`: control characters (PostgreSQL text cannot hold NUL)
/// replaced, and at most this many characters.
const ERROR_TEXT_LIMIT: usize = 2_000;

fn error_text(error: &str) -> String {
    let mut text: String = error
        .chars()
        .take(ERROR_TEXT_LIMIT)
        .map(|c| {
            if c.is_control() && c != '\n' {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect();
    if error.chars().nth(ERROR_TEXT_LIMIT).is_some() {
        text.push('…');
    }
    text
}

/// How a delivery ended.
enum Delivery {
    Delivered,
    Failed(String),
}

/// Runs one delivery, a panic in it turned into a failure of that message alone.
async fn attempt<E: fmt::Display>(
    deliver: &mut impl AsyncFnMut(&OutboxMessage) -> Result<(), E>,
    message: &OutboxMessage,
) -> Delivery {
    match catch_panic(deliver(message)).await {
        Ok(Ok(())) => Delivery::Delivered,
        Ok(Err(error)) => Delivery::Failed(error_text(&shown(error))),
        Err(panic) => Delivery::Failed(error_text(&format!(
            "the delivery panicked: {}",
            panic_message(&*panic)
        ))),
    }
}

/// A delivery's error as text, and the error dropped: both are the delivery's own code, and a
/// panic in either is that delivery's failure, not the round's.
fn shown<E: fmt::Display>(error: E) -> String {
    let shown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let text = error.to_string();
        drop(error);
        text
    }));
    shown.unwrap_or_else(|panic| {
        format!(
            "the delivery failed, and showing or dropping its error panicked: {}",
            panic_message(&*panic)
        )
    })
}

impl Relay {
    /// A relay named after this process, leasing 100 messages at a time for 60 s, parking a
    /// message after 10 attempts, backing off from 1 s to 10 min.
    pub fn new() -> Self {
        Self {
            owner: owner_name(),
            batch_size: 100,
            lease: Duration::from_secs(60),
            max_attempts: 10,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(600),
            untried: std::sync::Mutex::default(),
        }
    }

    /// Messages leased per batch.
    pub fn batch_size(mut self, messages: u32) -> Self {
        self.batch_size = messages.max(1);
        self
    }

    /// How long a relay holds a leased message; a batch must be delivered within it, or another
    /// relay may send its messages again. At most 100 years (a run with more is an
    /// [`Error::InvalidDuration`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Attempts after which a message is parked (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The first retry's delay (doubling with every attempt) and the longest delay. A first
    /// delay over 100 years makes every round an [`Error::InvalidDuration`] before it leases
    /// anything; a longest delay over 100 years (`Duration::MAX`: no cap) is 100 years.
    pub fn backoff(mut self, first: Duration, longest: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = longest.max(first);
        self
    }

    /// This relay's name; each lease it takes is owned by this name and a token of its own.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Leases one batch and delivers it: each message goes to `deliver`, outside any transaction;
    /// `Ok` marks it delivered, `Err` (or a panic, caught) backs it off or parks it.
    ///
    /// Refused inside a transaction of the caller's ([`Error::RelayInsideTransaction`]): the lease
    /// would hold its row locks until that transaction ends.
    pub fn run_once<C, E, F>(&self, conn: &mut C, mut deliver: F) -> Result<RelayReport, Error>
    where
        C: crate::connection::JobStore,
        E: fmt::Display,
        F: FnMut(&OutboxMessage) -> Result<(), E>,
    {
        crate::drive::block_on(
            self.round(conn.idempotent_store(), &mut async |m: &OutboxMessage| {
                deliver(m)
            }),
        )
    }

    /// Runs batches until none is left that can be sent now.
    pub fn drain<C, E, F>(&self, conn: &mut C, mut deliver: F) -> Result<RelayReport, Error>
    where
        C: crate::connection::JobStore,
        E: fmt::Display,
        F: FnMut(&OutboxMessage) -> Result<(), E>,
    {
        crate::drive::block_on(
            self.drain_on(conn.idempotent_store(), &mut async |m: &OutboxMessage| {
                deliver(m)
            }),
        )
    }

    /// [`run_once`](Self::run_once) through an async connection, with an async delivery function.
    #[cfg(feature = "async")]
    #[cfg_attr(docsrs, doc(cfg(feature = "async")))]
    pub async fn run_once_async<C, E, F>(
        &self,
        conn: &mut C,
        mut deliver: F,
    ) -> Result<RelayReport, Error>
    where
        C: crate::connection::AsyncJobStore,
        E: fmt::Display,
        F: AsyncFnMut(&OutboxMessage) -> Result<(), E>,
    {
        self.round(conn.idempotent_store(), &mut deliver).await
    }

    /// [`drain`](Self::drain) through an async connection, with an async delivery function.
    #[cfg(feature = "async")]
    #[cfg_attr(docsrs, doc(cfg(feature = "async")))]
    pub async fn drain_async<C, E, F>(
        &self,
        conn: &mut C,
        mut deliver: F,
    ) -> Result<RelayReport, Error>
    where
        C: crate::connection::AsyncJobStore,
        E: fmt::Display,
        F: AsyncFnMut(&OutboxMessage) -> Result<(), E>,
    {
        self.drain_on(conn.idempotent_store(), &mut deliver).await
    }

    async fn drain_on<S: Store, E: fmt::Display>(
        &self,
        conn: &mut S,
        deliver: &mut impl AsyncFnMut(&OutboxMessage) -> Result<(), E>,
    ) -> Result<RelayReport, Error> {
        let mut total = RelayReport::default();
        loop {
            let report = match self.round(conn, deliver).await {
                Ok(report) => report,
                Err(error) => return Err(stopped_after(total, error)),
            };
            total.add(&report);
            if report.leased == 0 {
                return Ok(total);
            }
        }
    }

    /// One lease and its deliveries.
    async fn round<S: Store, E: fmt::Display>(
        &self,
        conn: &mut S,
        deliver: &mut impl AsyncFnMut(&OutboxMessage) -> Result<(), E>,
    ) -> Result<RelayReport, Error> {
        let lease_micros = crate::time::micros(self.lease, "the relay's lease")?;
        // Checked before anything is leased: after a delivery, the failure could not be recorded.
        crate::time::micros(self.backoff, "the relay's first backoff")?;
        self.give_back_left(conn).await?;
        // A token per lease: a message whose lease lapsed and was taken by another round (of
        // another relay, or of this one) is never marked by the round that lost it.
        let owner = format!("{}:{}", self.owner, crate::key::token());
        let leased = self.take_lease(conn, &owner, lease_micros).await?;
        let mut report = RelayReport {
            leased: leased.rows.len() as u64,
            parked: leased.parked,
            ..RelayReport::default()
        };
        let mut guard = RoundGuard {
            relay: self,
            owner: &owner,
            untried: leased.rows.iter().rev().map(|row| row.id).collect(),
        };
        for row in leased.rows {
            // Handed over from here on: a drop during its delivery leaves it leased (it may
            // have been delivered).
            guard.untried.pop();
            let message = OutboxMessage::from_row(row);
            let started = Instant::now();
            let delivery = attempt(deliver, &message).await;
            let delay = message.age + started.elapsed();
            let delivered = matches!(delivery, Delivery::Delivered);
            let (settled, lost) = match self.settle(conn, &owner, &message, delivery).await {
                Ok(settled) => settled,
                Err(error) => {
                    let at = Stop {
                        message_id: Some(message.message_id().to_owned()),
                        delivered,
                        last_attempt: message.attempts() >= self.max_attempts,
                    };
                    return Err(self
                        .stop(conn, &mut guard, &message, report, at, error)
                        .await);
                }
            };
            report.count(settled);
            crate::stats::delivery(
                message.message_id(),
                message.topic(),
                message.attempts(),
                settled,
                delay,
            );
            if let Some(lost) = lost
                && !guard.untried.is_empty()
            {
                // The record changed nothing and says so, but the connection failed at its
                // `COMMIT`: no more deliveries whose outcome could not be recorded.
                let at = Stop {
                    message_id: None,
                    delivered: false,
                    last_attempt: false,
                };
                let error = failed::<S::Db>(lost);
                return Err(self
                    .stop(conn, &mut guard, &message, report, at, error)
                    .await);
            }
        }
        Ok(report)
    }

    /// A round's lease, owned by `owner` (parking first the messages whose last allowed attempt
    /// lapsed).
    async fn take_lease<S: Store>(
        &self,
        conn: &mut S,
        owner: &str,
        lease_micros: i64,
    ) -> Result<crate::store::Leased, Error> {
        let (limit, max_attempts) = (
            i64::from(self.batch_size),
            i32::try_from(self.max_attempts).unwrap_or(i32::MAX),
        );
        // The closures of the runtime's transactions own what they use (an async closure that
        // borrows makes a future rustc cannot prove `Send` for: tests/jobs/spawnable.rs).
        let leased_by = owner.to_owned();
        // A lease that took and parked nothing wrote nothing: a lost `COMMIT` reply leaves its
        // answer standing.
        let leased = outside_transactions_judged(
            conn,
            "outbox",
            Own::Committed,
            |leased: &crate::store::Leased| !leased.rows.is_empty() || leased.parked > 0,
            async move |conn: &mut S| {
                let lease = Lease {
                    owner: &leased_by,
                    lease_micros,
                    limit,
                    max_attempts,
                };
                S::Db::lease(conn, &lease).await
            },
        )
        .await
        .map_err(relay_error::<S::Db>)?;
        if leased.parked > 0 {
            tracing::warn!(
                parked = leased.parked,
                max_attempts = self.max_attempts,
                "outbox messages parked: their relay stopped, or their lease lapsed, during their last allowed attempt (they may have been delivered)"
            );
        }
        Ok(leased)
    }

    /// A round that stops at `message` (`error`, told as `at` says): gives back what it had not
    /// handed over, and says what it did.
    async fn stop<S: Store>(
        &self,
        conn: &mut S,
        guard: &mut RoundGuard<'_>,
        message: &OutboxMessage,
        report: RelayReport,
        at: Stop,
        error: Error,
    ) -> Error {
        self.give_back_stopped(conn, guard, message, report.delivered, &error)
            .await;
        Error::RelayStopped {
            report,
            message_id: at.message_id,
            delivered: at.delivered,
            last_attempt: at.last_attempt,
            source: Box::new(error),
        }
    }

    /// The messages left untried, in the relay's keeping until a release of them commits.
    fn left(&self) -> std::sync::MutexGuard<'_, Vec<Untried>> {
        self.untried
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Gives back what rounds of this relay leased and never handed over (a round whose future
    /// was dropped, or whose own give-back failed), their attempt uncounted, before a new lease.
    /// Each stays in the relay's keeping until its release commits, so that a future dropped
    /// during the release loses nothing; a release that fails stops this round before it leases
    /// anything. (Two rounds of one relay may release the same messages: the second finds them
    /// no longer leased by their old token, and changes nothing.)
    async fn give_back_left<S: Store>(&self, conn: &mut S) -> Result<(), Error> {
        loop {
            let Some(untried) = self.left().first().cloned() else {
                return Ok(());
            };
            let count = untried.ids.len();
            release_untried(conn, &untried.owner, untried.ids).await?;
            self.left().retain(|left| left.owner != untried.owner);
            tracing::info!(
                relay = %self.owner,
                untried = count,
                "gave back the outbox messages a round had leased and never handed over"
            );
        }
    }

    /// After a round stopped at `message` (`error`): gives back what it had not handed over,
    /// kept by the relay until the release commits (its next round tries again if it fails, or
    /// if this future is dropped first).
    async fn give_back_stopped<S: Store>(
        &self,
        conn: &mut S,
        guard: &mut RoundGuard<'_>,
        message: &OutboxMessage,
        delivered: u64,
        error: &Error,
    ) {
        let mut untried = guard.take();
        untried.reverse();
        if untried.is_empty() {
            return;
        }
        let owner = guard.owner.to_owned();
        self.left().push(Untried {
            owner: owner.clone(),
            ids: untried.clone(),
        });
        if give_back_untried(conn, &owner, message, untried, delivered, error).await {
            self.left().retain(|left| left.owner != owner);
        }
    }

    /// Records what became of one leased message's delivery, if this round still holds its
    /// lease: delivered, or failed (to be tried again after a backoff, or parked when its
    /// attempts are spent).
    async fn settle<S: Store>(
        &self,
        conn: &mut S,
        owner: &str,
        message: &OutboxMessage,
        delivery: Delivery,
    ) -> Result<(Settled, Option<diesel::result::Error>), Error> {
        let error = match delivery {
            Delivery::Delivered => {
                let (id, owner) = (message.id, owner.to_owned());
                // A mark that found the lease gone changed nothing (`held` false): its answer
                // stands when the `COMMIT`'s reply is lost (and the round stops there).
                let (held, lost) = outside_transactions_told(
                    conn,
                    "outbox",
                    Own::Look,
                    |held| *held,
                    async move |conn: &mut S| S::Db::mark_delivered(conn, id, &owner).await,
                )
                .await
                .map_err(relay_error::<S::Db>)?;
                let settled = if held {
                    Settled::Delivered
                } else {
                    Settled::LeaseLost
                };
                return Ok((settled, lost));
            }
            Delivery::Failed(error) => error,
        };
        let park = message.attempts() >= self.max_attempts;
        let retry_after_micros = match park {
            true => None,
            false => Some(crate::time::micros(
                self.delay(message.attempts()),
                "the relay's backoff",
            )?),
        };
        let (id, marked_by, reason) = (message.id, owner.to_owned(), error.clone());
        let (held, lost) = outside_transactions_told(
            conn,
            "outbox",
            Own::Look,
            |held| *held,
            async move |conn: &mut S| {
                let failure = Failure {
                    id,
                    owner: &marked_by,
                    error: &reason,
                    retry_after_micros,
                };
                S::Db::mark_failed(conn, &failure).await
            },
        )
        .await
        .map_err(relay_error::<S::Db>)?;
        let (message_id, attempts) = (message.message_id(), message.attempts());
        if !held {
            // The lease lapsed during the delivery, and another round took the message (and may
            // have delivered it): this failure is not its to record.
            tracing::info!(message_id, attempts, %error, "outbox delivery failed after its lease lapsed; the message is no longer this round's (another relay took it over, or gave it up), nothing was recorded");
            return Ok((Settled::LeaseLost, lost));
        }
        if park {
            tracing::warn!(message_id, attempts, %error, "outbox message parked");
            Ok((Settled::Parked, lost))
        } else {
            tracing::info!(message_id, attempts, %error, "outbox delivery failed; will retry");
            Ok((Settled::Failed, lost))
        }
    }

    /// The backoff after `attempts` failed attempts: doubling from the first delay, capped (at
    /// most the longest duration the database adds to its clock, 100 years).
    fn delay(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(20);
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
            .min(crate::time::MAX)
    }
}

/// After the record of `message`'s delivery failed (`error`) and its round stopped: gives the
/// messages the round had not handed over back, their attempt uncounted, so that none is parked
/// for an attempt that never happened once the lease lapses; says whether it did (when not, the
/// relay's next round tries again).
async fn give_back_untried<S: Store>(
    conn: &mut S,
    owner: &str,
    message: &OutboxMessage,
    untried: Vec<i64>,
    delivered: u64,
    error: &Error,
) -> bool {
    let (count, released) = (untried.len(), release_untried(conn, owner, untried).await);
    let done = released.is_ok();
    match released {
        Ok(()) => tracing::warn!(
            %error,
            message_id = message.message_id(),
            delivered,
            untried = count,
            "recording an outbox delivery failed: the round stops, and the messages it had not tried are released"
        ),
        Err(release) => tracing::warn!(
            %error,
            message_id = message.message_id(),
            delivered,
            untried = count,
            release = ?release,
            "recording an outbox delivery failed: the round stops; releasing the messages it had not tried failed too: the relay's next round tries again (until then, or if the relay is dropped first, until the lease lapses, they stay leased, their attempt counted)"
        ),
    }
    done
}

async fn release_untried<S: Store>(
    conn: &mut S,
    owner: &str,
    untried: Vec<i64>,
) -> Result<(), Error> {
    if untried.is_empty() {
        return Ok(());
    }
    let owner = owner.to_owned();
    outside_transactions(conn, "outbox", async move |conn: &mut S| {
        for &id in &untried {
            S::Db::release_untried(conn, &owner, id).await?;
        }
        Ok(())
    })
    .await
    .map_err(relay_error::<S::Db>)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// The error of an outbox operation that runs in a transaction of its own, for `what`.
fn outbox_error<D: Database>(what: &'static str) -> impl Fn(Outside) -> Error + Copy {
    move |outside| match outside {
        Outside::InsideTransaction => Error::InsideTransaction { what },
        Outside::NotMigrated(table, _) => Error::NotMigrated { table },
        Outside::Failed(source) => failed::<D>(source),
        Outside::CommitUnknown(source) => Error::OutcomeUnknown {
            action: what,
            source,
        },
    }
}

/// A round's error, with what the rounds before it (`before`) did: a run that had handed no
/// message over returns the error itself.
fn stopped_after(before: RelayReport, error: Error) -> Error {
    match error {
        Error::RelayStopped {
            mut report,
            message_id,
            delivered,
            last_attempt,
            source,
        } => {
            report.add(&before);
            Error::RelayStopped {
                report,
                message_id,
                delivered,
                last_attempt,
                source,
            }
        }
        error if before.leased == 0 => error,
        error => Error::RelayStopped {
            report: before,
            message_id: None,
            delivered: false,
            last_attempt: false,
            source: Box::new(error),
        },
    }
}

/// The error of a relay's statement.
fn relay_error<D: Database>(outside: Outside) -> Error {
    match outside {
        Outside::InsideTransaction => Error::RelayInsideTransaction,
        Outside::NotMigrated(table, _) => Error::NotMigrated { table },
        Outside::Failed(source) => failed::<D>(source),
        Outside::CommitUnknown(source) => Error::OutcomeUnknown {
            action: "relaying the outbox",
            source,
        },
    }
}

fn failed<D: Database>(source: diesel::result::Error) -> Error {
    Error::Outbox {
        retryable: D::passes(&source),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::{error_text, message_id};

    #[test]
    fn message_ids_are_distinct_per_run_topic_and_position() {
        let (key, run) = ([7u8; 32], [1u8; 16]);
        assert_eq!(
            message_id(&key, &run, "email", 0),
            message_id(&key, &run, "email", 0)
        );
        assert_ne!(
            message_id(&key, &run, "email", 0),
            message_id(&key, &run, "email", 1)
        );
        assert_ne!(
            message_id(&key, &run, "email", 0),
            message_id(&key, &run, "sms", 0)
        );
        assert_ne!(
            message_id(&key, &run, "email", 0),
            message_id(&key, &[2; 16], "email", 0)
        );
        assert_ne!(
            message_id(&key, &run, "email", 0),
            message_id(&[8; 32], &run, "email", 0)
        );
        assert_eq!(message_id(&key, &run, "email", 0).len(), 4 + 32);
    }

    #[test]
    fn error_texts_are_storable_and_bounded() {
        assert_eq!(error_text("a\0b\nc"), "a\u{fffd}b\nc");
        let long = "x".repeat(10_000);
        assert_eq!(error_text(&long).chars().count(), 2_001);
    }
}
