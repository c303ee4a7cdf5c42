//! A transactional outbox: messages recorded in a job's transaction and sent after it commits.
//!
//! A job that emails a customer or calls a payment provider cannot put that effect inside its
//! database transaction. The rule from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>
//! says what to do: record the outgoing message in the same transaction (so it exists exactly when
//! the job's work does), and send it afterwards.
//!
//! * [`push`] (or [`push_async`]) inside a job's body writes the message; a rerun of the job that
//!   replays writes nothing, and one that rolls back takes its messages with it.
//! * Each message has a [`message_id`](OutboxMessage::message_id) derived from the job key and its
//!   position in the job, stable across reruns: a receiver that remembers the ids it has acted on
//!   drops the duplicates an at-least-once relay can send after a crash.
//! * A [`Relay`] leases pending messages, hands each to your delivery function outside any
//!   transaction, and marks it delivered. Several relays can run at once: a leased message is not
//!   handed to another relay while its lease lasts (on PostgreSQL and MySQL the lease is taken
//!   with `FOR UPDATE SKIP LOCKED`; SQLite has one writer). A relay that dies before marking a
//!   message delivered leaves it to be sent again once the lease lapses.
//! * A failed delivery backs off exponentially; after [`Relay::max_attempts`] it is parked:
//!   visible through [`parked`], sent again after [`retry_parked`]. Delivered messages are removed
//!   by [`prune_delivered`].
//! * With an async feature on, `Relay::drain_async` / `run_once_async`, `parked_async`,
//!   `retry_parked_async` and `prune_delivered_async` do the same through diesel-async
//!   connections, with the same statements and leases: sync and async relays can share an outbox.
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
use std::time::Duration;

use chrono::NaiveDateTime;
use diesel::result::QueryResult;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest as _, Sha256};

use crate::context;
use crate::error::Error;
use crate::prune::{Prune, PruneReport};
use crate::run::retry_transient;
use crate::store::{JobStore, NewOutboxMessage};

/// A message as the relay hands it to a delivery function.
#[derive(Debug, Clone, PartialEq, Eq, diesel::Queryable)]
pub struct OutboxMessage {
    id: i64,
    message_id: String,
    topic: String,
    payload: String,
    job_key: Option<String>,
    attempts: i32,
}

impl OutboxMessage {
    /// The id receivers deduplicate by: stable across reruns of the job that pushed it.
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

    /// The key of the job that pushed it.
    pub fn job_key(&self) -> Option<&str> {
        self.job_key.as_deref()
    }

    /// Deliveries tried and failed before this one.
    pub fn attempts(&self) -> u32 {
        u32::try_from(self.attempts).unwrap_or(0)
    }
}

/// The id of the `position`-th message a run of the job with `key` pushes on `topic`.
fn message_id(key: &str, topic: &str, position: u32) -> String {
    let mut hasher = Sha256::new();
    for part in [key.as_bytes(), topic.as_bytes(), &position.to_be_bytes()] {
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

/// What [`push`] writes, owned.
struct NewMessage {
    message_id: String,
    topic: String,
    payload: String,
    job_key: String,
    now: NaiveDateTime,
}

impl NewMessage {
    fn new<T: Serialize + ?Sized>(topic: &str, payload: &T) -> Result<Self, Error> {
        let Some(job) = context::current() else {
            return Err(Error::OutboxOutsideJob {
                topic: topic.to_owned(),
            });
        };
        let payload = serde_json::to_string(payload).map_err(|source| Error::OutboxPayload {
            topic: topic.to_owned(),
            source,
        })?;
        let key = job.key.readable().into_owned();
        Ok(Self {
            message_id: message_id(&key, topic, job.next_push()),
            topic: topic.to_owned(),
            payload,
            job_key: key,
            now: chrono::Utc::now().naive_utc(),
        })
    }

    fn row(&self) -> NewOutboxMessage<'_> {
        NewOutboxMessage {
            message_id: &self.message_id,
            topic: &self.topic,
            payload: &self.payload,
            job_key: &self.job_key,
            now: self.now,
        }
    }
}

/// Records a message in the current job's transaction; the relay sends it after the job commits.
/// Returns its [`message_id`](OutboxMessage::message_id).
///
/// Call it from a job's body, with the job's connection. Outside a job there is no transaction to
/// join and no key to derive the id from, so it is [`Error::OutboxOutsideJob`].
pub fn push<C, T>(conn: &mut C, topic: &str, payload: &T) -> Result<String, Error>
where
    C: JobStore,
    T: Serialize + ?Sized,
{
    let message = NewMessage::new(topic, payload)?;
    conn.insert_outbox(&message.row()).map_err(Error::Outbox)?;
    Ok(message.message_id)
}

/// [`push`] through an async connection, from an async job's body.
#[cfg(feature = "async")]
pub async fn push_async<C, T>(conn: &mut C, topic: &str, payload: &T) -> Result<String, Error>
where
    C: crate::AsyncJobStore,
    T: Serialize + ?Sized,
{
    let message = NewMessage::new(topic, payload)?;
    conn.insert_outbox(&message.row())
        .await
        .map_err(Error::Outbox)?;
    Ok(message.message_id)
}

/// The relay's statements, per backend.
pub trait OutboxStore: JobStore {
    /// Leases up to `limit` pending messages to `owner` until `until`, in one short transaction.
    fn lease(
        &mut self,
        owner: &str,
        now: NaiveDateTime,
        until: NaiveDateTime,
        limit: i64,
    ) -> QueryResult<Vec<OutboxMessage>>;
    /// Marks a message delivered, if `owner` still holds its lease; `Ok(false)` if it lost it.
    fn mark_delivered(&mut self, id: i64, owner: &str, now: NaiveDateTime) -> QueryResult<bool>;
    /// Records a failed delivery: back off until `retry_at`, or park when `retry_at` is `None`.
    fn mark_failed(
        &mut self,
        id: i64,
        owner: &str,
        attempts: i32,
        error: &str,
        now: NaiveDateTime,
        retry_at: Option<NaiveDateTime>,
    ) -> QueryResult<()>;
    /// Parked messages, oldest first.
    fn parked(&mut self) -> QueryResult<Vec<OutboxMessage>>;
    /// Un-parks messages (all, or the one with `message_id`): they are sent again.
    fn retry_parked(&mut self, message_id: Option<&str>, now: NaiveDateTime) -> QueryResult<usize>;
    /// Deletes up to `limit` messages delivered before `before`.
    fn prune_delivered(&mut self, before: NaiveDateTime, limit: i64) -> QueryResult<usize>;
}

/// The relay's statements, written once for sync (`[]`) and async (`[.await]`) connections.
macro_rules! outbox_statements {
    (lease, $conn:expr, $owner:expr, $now:expr, $until:expr, $limit:expr, $lock:ident, [$($aw:tt)*]) => {{
        use crate::schema::outbox::dsl as o;
        let pending = o::outbox
            .filter(o::delivered_at.is_null())
            .filter(o::parked_at.is_null())
            .filter(o::available_at.le($now))
            .filter(o::lease_until.is_null().or(o::lease_until.le($now)))
            .order(o::id)
            .limit($limit)
            .select((o::id, o::message_id, o::topic, o::payload, o::job_key, o::attempts));
        let messages: Vec<OutboxMessage> = outbox_statements!(@lock $lock, pending).load($conn)$($aw)*?;
        let ids: Vec<i64> = messages.iter().map(|m| m.id).collect();
        if !ids.is_empty() {
            diesel::update(o::outbox.filter(o::id.eq_any(&ids)))
                .set((o::lease_owner.eq($owner), o::lease_until.eq($until)))
                .execute($conn)$($aw)*?;
        }
        Ok(messages)
    }};
    (@lock skip_locked, $query:expr) => { $query.for_update().skip_locked() };
    // SQLite: the lease runs in `BEGIN IMMEDIATE`, so one relay leases at a time.
    (@lock plain, $query:expr) => { $query };
    (mark_delivered, $conn:expr, $id:expr, $owner:expr, $now:expr, [$($aw:tt)*]) => {{
        use crate::schema::outbox::dsl as o;
        let updated = diesel::update(o::outbox.filter(o::id.eq($id)).filter(o::lease_owner.eq($owner)))
            .set((o::delivered_at.eq($now), o::lease_until.eq(None::<NaiveDateTime>)))
            .execute($conn)$($aw)*?;
        Ok(updated == 1)
    }};
    (mark_failed, $conn:expr, $id:expr, $owner:expr, $attempts:expr, $error:expr, $now:expr, $retry_at:expr, [$($aw:tt)*]) => {{
        use crate::schema::outbox::dsl as o;
        let target = o::outbox.filter(o::id.eq($id)).filter(o::lease_owner.eq($owner));
        let released = (
            o::attempts.eq($attempts),
            o::last_error.eq($error),
            o::lease_owner.eq(None::<&str>),
            o::lease_until.eq(None::<NaiveDateTime>),
        );
        match $retry_at {
            Some(at) => diesel::update(target).set((released, o::available_at.eq(at))).execute($conn)$($aw)*?,
            None => diesel::update(target).set((released, o::parked_at.eq($now))).execute($conn)$($aw)*?,
        };
        Ok(())
    }};
    (parked, $conn:expr, [$($aw:tt)*]) => {{
        use crate::schema::outbox::dsl as o;
        o::outbox
            .filter(o::parked_at.is_not_null())
            .order(o::id)
            .select((o::id, o::message_id, o::topic, o::payload, o::job_key, o::attempts))
            .load($conn)$($aw)*
    }};
    (retry_parked, $conn:expr, $message_id:expr, $now:expr, [$($aw:tt)*]) => {{
        use crate::schema::outbox::dsl as o;
        let reset = (
            o::parked_at.eq(None::<NaiveDateTime>),
            o::attempts.eq(0),
            o::available_at.eq($now),
        );
        let parked = o::outbox.filter(o::parked_at.is_not_null());
        match $message_id {
            Some(id) => diesel::update(parked.filter(o::message_id.eq(id))).set(reset).execute($conn)$($aw)*,
            None => diesel::update(parked).set(reset).execute($conn)$($aw)*,
        }
    }};
    (prune_delivered, $conn:expr, $sql:expr, $before:expr, $limit:expr, [$($aw:tt)*]) => {
        diesel::sql_query($sql)
            .bind::<diesel::sql_types::Timestamp, _>($before)
            .bind::<diesel::sql_types::BigInt, _>($limit)
            .execute($conn)$($aw)*
    };
}

macro_rules! impl_outbox_store {
    ($conn:ty, lock: $lock:ident, prune: $prune:expr) => {
        impl OutboxStore for $conn {
            fn lease(
                &mut self,
                owner: &str,
                now: NaiveDateTime,
                until: NaiveDateTime,
                limit: i64,
            ) -> QueryResult<Vec<OutboxMessage>> {
                use diesel::prelude::*;
                let nesting = self.begin_job()?;
                let leased =
                    (|| outbox_statements!(lease, self, owner, now, until, limit, $lock, []))();
                finish(self, nesting, leased)
            }

            fn mark_delivered(
                &mut self,
                id: i64,
                owner: &str,
                now: NaiveDateTime,
            ) -> QueryResult<bool> {
                use diesel::prelude::*;
                outbox_statements!(mark_delivered, self, id, owner, now, [])
            }

            fn mark_failed(
                &mut self,
                id: i64,
                owner: &str,
                attempts: i32,
                error: &str,
                now: NaiveDateTime,
                retry_at: Option<NaiveDateTime>,
            ) -> QueryResult<()> {
                use diesel::prelude::*;
                outbox_statements!(
                    mark_failed,
                    self,
                    id,
                    owner,
                    attempts,
                    error,
                    now,
                    retry_at,
                    []
                )
            }

            fn parked(&mut self) -> QueryResult<Vec<OutboxMessage>> {
                use diesel::prelude::*;
                outbox_statements!(parked, self, [])
            }

            fn retry_parked(
                &mut self,
                message_id: Option<&str>,
                now: NaiveDateTime,
            ) -> QueryResult<usize> {
                use diesel::prelude::*;
                outbox_statements!(retry_parked, self, message_id, now, [])
            }

            fn prune_delivered(&mut self, before: NaiveDateTime, limit: i64) -> QueryResult<usize> {
                use diesel::prelude::*;
                outbox_statements!(prune_delivered, self, $prune, before, limit, [])
            }
        }
    };
}

#[cfg(feature = "async")]
pub use asynchronous::{AsyncOutboxStore, parked_async, prune_delivered_async, retry_parked_async};

#[cfg(feature = "async")]
mod asynchronous {
    use std::future::Future;

    use super::*;
    use crate::AsyncJobStore;
    use crate::asynchronous::retry_transient_async;

    /// [`OutboxStore`] for async connections.
    pub trait AsyncOutboxStore: AsyncJobStore {
        /// Leases up to `limit` pending messages to `owner` until `until`, in one short transaction.
        fn lease(
            &mut self,
            owner: &str,
            now: NaiveDateTime,
            until: NaiveDateTime,
            limit: i64,
        ) -> impl Future<Output = QueryResult<Vec<OutboxMessage>>> + Send;
        /// Marks a message delivered, if `owner` still holds its lease.
        fn mark_delivered(
            &mut self,
            id: i64,
            owner: &str,
            now: NaiveDateTime,
        ) -> impl Future<Output = QueryResult<bool>> + Send;
        /// Records a failed delivery: back off until `retry_at`, or park when it is `None`.
        fn mark_failed(
            &mut self,
            id: i64,
            owner: &str,
            attempts: i32,
            error: &str,
            now: NaiveDateTime,
            retry_at: Option<NaiveDateTime>,
        ) -> impl Future<Output = QueryResult<()>> + Send;
        /// Parked messages, oldest first.
        fn parked(&mut self) -> impl Future<Output = QueryResult<Vec<OutboxMessage>>> + Send;
        /// Un-parks messages (all, or the one with `message_id`).
        fn retry_parked(
            &mut self,
            message_id: Option<&str>,
            now: NaiveDateTime,
        ) -> impl Future<Output = QueryResult<usize>> + Send;
        /// Deletes up to `limit` messages delivered before `before`.
        fn prune_delivered(
            &mut self,
            before: NaiveDateTime,
            limit: i64,
        ) -> impl Future<Output = QueryResult<usize>> + Send;
    }

    #[cfg(any(feature = "async-postgres", feature = "async-mysql"))]
    macro_rules! impl_async_outbox_store {
        ($conn:ty, lock: $lock:ident, prune: $prune:expr) => {
            impl AsyncOutboxStore for $conn {
                async fn lease(
                    &mut self,
                    owner: &str,
                    now: NaiveDateTime,
                    until: NaiveDateTime,
                    limit: i64,
                ) -> QueryResult<Vec<OutboxMessage>> {
                    use diesel::prelude::*;
                    use diesel_async::RunQueryDsl;
                    crate::asynchronous::in_guarded_transaction(self, async |conn| {
                        outbox_statements!(lease, conn, owner, now, until, limit, $lock, [.await])
                    })
                    .await
                }

                async fn mark_delivered(&mut self, id: i64, owner: &str, now: NaiveDateTime) -> QueryResult<bool> {
                    use diesel::prelude::*;
                    use diesel_async::RunQueryDsl;
                    outbox_statements!(mark_delivered, self, id, owner, now, [.await])
                }

                async fn mark_failed(
                    &mut self,
                    id: i64,
                    owner: &str,
                    attempts: i32,
                    error: &str,
                    now: NaiveDateTime,
                    retry_at: Option<NaiveDateTime>,
                ) -> QueryResult<()> {
                    use diesel::prelude::*;
                    use diesel_async::RunQueryDsl;
                    outbox_statements!(mark_failed, self, id, owner, attempts, error, now, retry_at, [.await])
                }

                async fn parked(&mut self) -> QueryResult<Vec<OutboxMessage>> {
                    use diesel::prelude::*;
                    use diesel_async::RunQueryDsl;
                    outbox_statements!(parked, self, [.await])
                }

                async fn retry_parked(&mut self, message_id: Option<&str>, now: NaiveDateTime) -> QueryResult<usize> {
                    use diesel::prelude::*;
                    use diesel_async::RunQueryDsl;
                    outbox_statements!(retry_parked, self, message_id, now, [.await])
                }

                async fn prune_delivered(&mut self, before: NaiveDateTime, limit: i64) -> QueryResult<usize> {
                    use diesel_async::RunQueryDsl;
                    outbox_statements!(prune_delivered, self, $prune, before, limit, [.await])
                }
            }
        };
    }

    #[cfg(feature = "async-postgres")]
    impl_async_outbox_store!(diesel_async::AsyncPgConnection, lock: skip_locked, prune: prune_sql::POSTGRES);
    #[cfg(feature = "async-mysql")]
    impl_async_outbox_store!(diesel_async::AsyncMysqlConnection, lock: skip_locked, prune: prune_sql::MYSQL);

    /// SQLite through diesel-async: the sync statements on the wrapper's blocking thread.
    #[cfg(feature = "async-sqlite")]
    impl AsyncOutboxStore
        for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<
            diesel::sqlite::SqliteConnection,
        >
    {
        async fn lease(
            &mut self,
            owner: &str,
            now: NaiveDateTime,
            until: NaiveDateTime,
            limit: i64,
        ) -> QueryResult<Vec<OutboxMessage>> {
            let owner = owner.to_owned();
            self.spawn_blocking(move |conn| OutboxStore::lease(conn, &owner, now, until, limit))
                .await
        }

        async fn mark_delivered(
            &mut self,
            id: i64,
            owner: &str,
            now: NaiveDateTime,
        ) -> QueryResult<bool> {
            let owner = owner.to_owned();
            self.spawn_blocking(move |conn| OutboxStore::mark_delivered(conn, id, &owner, now))
                .await
        }

        async fn mark_failed(
            &mut self,
            id: i64,
            owner: &str,
            attempts: i32,
            error: &str,
            now: NaiveDateTime,
            retry_at: Option<NaiveDateTime>,
        ) -> QueryResult<()> {
            let (owner, error) = (owner.to_owned(), error.to_owned());
            self.spawn_blocking(move |conn| {
                OutboxStore::mark_failed(conn, id, &owner, attempts, &error, now, retry_at)
            })
            .await
        }

        async fn parked(&mut self) -> QueryResult<Vec<OutboxMessage>> {
            self.spawn_blocking(OutboxStore::parked).await
        }

        async fn retry_parked(
            &mut self,
            message_id: Option<&str>,
            now: NaiveDateTime,
        ) -> QueryResult<usize> {
            let message_id = message_id.map(str::to_owned);
            self.spawn_blocking(move |conn| {
                OutboxStore::retry_parked(conn, message_id.as_deref(), now)
            })
            .await
        }

        async fn prune_delivered(
            &mut self,
            before: NaiveDateTime,
            limit: i64,
        ) -> QueryResult<usize> {
            self.spawn_blocking(move |conn| OutboxStore::prune_delivered(conn, before, limit))
                .await
        }
    }

    /// [`parked`](super::parked) through an async connection.
    pub async fn parked_async<C: AsyncOutboxStore>(
        conn: &mut C,
    ) -> Result<Vec<OutboxMessage>, Error> {
        retry_transient_async::<C, _>(async || conn.parked().await)
            .await
            .map_err(Error::Outbox)
    }

    /// [`retry_parked`](super::retry_parked) through an async connection.
    pub async fn retry_parked_async<C: AsyncOutboxStore>(
        conn: &mut C,
        message_id: Option<&str>,
    ) -> Result<usize, Error> {
        let now = chrono::Utc::now().naive_utc();
        retry_transient_async::<C, _>(async || conn.retry_parked(message_id, now).await)
            .await
            .map_err(Error::Outbox)
    }

    /// [`prune_delivered`](super::prune_delivered) through an async connection.
    pub async fn prune_delivered_async<C: AsyncOutboxStore>(
        conn: &mut C,
        older_than: Duration,
        options: &Prune,
    ) -> Result<PruneReport, Error> {
        let before = chrono::Utc::now().naive_utc()
            - chrono::TimeDelta::from_std(older_than).unwrap_or(chrono::TimeDelta::MAX);
        crate::prune::in_batches_async(options, async |limit| {
            retry_transient_async::<C, _>(async || conn.prune_delivered(before, limit).await)
                .await
                .map_err(Error::Outbox)
        })
        .await
    }
}

/// Commits or rolls back the lease's transaction.
fn finish<C: JobStore, T>(
    conn: &mut C,
    _nesting: crate::store::Nesting,
    result: QueryResult<T>,
) -> QueryResult<T> {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    match result {
        Ok(value) => {
            AnsiTransactionManager::commit_transaction(conn)?;
            Ok(value)
        }
        Err(error) => {
            let _ = AnsiTransactionManager::rollback_transaction(conn);
            Err(error)
        }
    }
}

/// One batch of deleting delivered messages, per backend.
#[allow(dead_code)] // used by the backends that are compiled in
mod prune_sql {
    pub const SQLITE: &str = "DELETE FROM outbox WHERE id IN \
        (SELECT id FROM outbox WHERE delivered_at <= ? ORDER BY delivered_at LIMIT ?)";
    pub const POSTGRES: &str = "DELETE FROM outbox WHERE id IN \
        (SELECT id FROM outbox WHERE delivered_at <= $1 ORDER BY delivered_at LIMIT $2 FOR UPDATE SKIP LOCKED)";
    pub const MYSQL: &str =
        "DELETE FROM outbox WHERE delivered_at <= ? ORDER BY delivered_at LIMIT ?";
}

#[cfg(feature = "sqlite")]
impl_outbox_store!(diesel::sqlite::SqliteConnection, lock: plain, prune: prune_sql::SQLITE);
#[cfg(feature = "postgres")]
impl_outbox_store!(diesel::pg::PgConnection, lock: skip_locked, prune: prune_sql::POSTGRES);
#[cfg(feature = "mysql")]
impl_outbox_store!(diesel::mysql::MysqlConnection, lock: skip_locked, prune: prune_sql::MYSQL);

/// Messages parked after too many failed deliveries, oldest first.
pub fn parked<C: OutboxStore>(conn: &mut C) -> Result<Vec<OutboxMessage>, Error> {
    retry_transient::<C, _>(|| conn.parked()).map_err(Error::Outbox)
}

/// Sends parked messages again: all of them, or the one with `message_id`. Returns how many.
pub fn retry_parked<C: OutboxStore>(
    conn: &mut C,
    message_id: Option<&str>,
) -> Result<usize, Error> {
    let now = chrono::Utc::now().naive_utc();
    retry_transient::<C, _>(|| conn.retry_parked(message_id, now)).map_err(Error::Outbox)
}

/// Deletes messages delivered more than `older_than` ago, in batches as `options` says (as
/// [`prune`](crate::prune::prune) does for lapsed claims).
pub fn prune_delivered<C: OutboxStore>(
    conn: &mut C,
    older_than: Duration,
    options: &Prune,
) -> Result<PruneReport, Error> {
    let before = chrono::Utc::now().naive_utc()
        - chrono::TimeDelta::from_std(older_than).unwrap_or(chrono::TimeDelta::MAX);
    crate::prune::in_batches(options, |limit| {
        retry_transient::<C, _>(|| conn.prune_delivered(before, limit)).map_err(Error::Outbox)
    })
}

/// Sends outbox messages; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Relay {
    owner: String,
    batch_size: u32,
    lease: Duration,
    max_attempts: u32,
    backoff: Duration,
    max_backoff: Duration,
}

impl Default for Relay {
    fn default() -> Self {
        Self::new()
    }
}

/// What a relay run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Messages leased and handed to the delivery function.
    pub leased: u64,
    /// Messages delivered and marked so.
    pub delivered: u64,
    /// Deliveries that failed and will be tried again.
    pub failed: u64,
    /// Messages parked after their last failed attempt.
    pub parked: u64,
    /// Deliveries whose lease had lapsed and been taken by another relay before they were marked:
    /// the message may reach its receiver twice, which its id lets the receiver drop.
    pub lease_lost: u64,
}

/// What a relay records after one delivery.
enum After {
    Delivered {
        at: NaiveDateTime,
    },
    Failed {
        attempts: i32,
        error: String,
        at: NaiveDateTime,
        /// `None`: park the message.
        retry_at: Option<NaiveDateTime>,
    },
}

impl RelayReport {
    fn leased(batch: &[OutboxMessage]) -> Self {
        Self {
            leased: batch.len() as u64,
            ..Self::default()
        }
    }

    /// Counts one delivery; `held` is whether the relay still held the message's lease.
    fn count(&mut self, message: &OutboxMessage, after: &After, held: bool) {
        let message_id = message.message_id();
        match after {
            After::Delivered { .. } if held => self.delivered += 1,
            After::Delivered { .. } => {
                self.lease_lost += 1;
                tracing::warn!(
                    message_id,
                    "delivered after the lease lapsed; another relay may send it again"
                );
            }
            After::Failed {
                attempts,
                error,
                retry_at: None,
                ..
            } => {
                self.parked += 1;
                tracing::warn!(message_id, attempts, %error, "outbox message parked");
            }
            After::Failed {
                attempts, error, ..
            } => {
                self.failed += 1;
                tracing::info!(message_id, attempts, %error, "outbox delivery failed; will retry");
            }
        }
    }

    fn add(&mut self, other: &RelayReport) {
        self.leased += other.leased;
        self.delivered += other.delivered;
        self.failed += other.failed;
        self.parked += other.parked;
        self.lease_lost += other.lease_lost;
    }
}

impl Relay {
    /// A relay named after this process, leasing 100 messages at a time for 60 s, parking a
    /// message after 10 failed attempts, backing off from 1 s to 10 min.
    pub fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Self {
            owner: format!(
                "relay-{}-{}-{nanos:x}",
                std::process::id(),
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
            batch_size: 100,
            lease: Duration::from_secs(60),
            max_attempts: 10,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(600),
        }
    }

    /// Messages leased per batch.
    pub fn batch_size(mut self, messages: u32) -> Self {
        self.batch_size = messages.max(1);
        self
    }

    /// How long a relay holds a leased message; a batch must be delivered within it, or another
    /// relay may send its messages again.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Failed attempts after which a message is parked.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The first retry's delay (doubling with every attempt) and the longest delay.
    pub fn backoff(mut self, first: Duration, longest: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = longest.max(first);
        self
    }

    /// This relay's name in the `lease_owner` column.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Leases one batch and delivers it: each message goes to `deliver`, outside any transaction;
    /// `Ok` marks it delivered, `Err` backs it off or parks it.
    pub fn run_once<C, E, F>(&self, conn: &mut C, mut deliver: F) -> Result<RelayReport, Error>
    where
        C: OutboxStore,
        E: fmt::Display,
        F: FnMut(&OutboxMessage) -> Result<(), E>,
    {
        let (now, until) = self.lease_window();
        let limit = i64::from(self.batch_size);
        let batch = retry_transient::<C, _>(|| conn.lease(&self.owner, now, until, limit))
            .map_err(Error::Outbox)?;
        let mut report = RelayReport::leased(&batch);
        for message in &batch {
            let after = self.after_delivery(message, deliver(message));
            let held = match &after {
                After::Delivered { at } => {
                    retry_transient::<C, _>(|| conn.mark_delivered(message.id, &self.owner, *at))
                }
                After::Failed {
                    attempts,
                    error,
                    at,
                    retry_at,
                } => retry_transient::<C, _>(|| {
                    conn.mark_failed(message.id, &self.owner, *attempts, error, *at, *retry_at)
                })
                .map(|()| true),
            }
            .map_err(Error::Outbox)?;
            report.count(message, &after, held);
        }
        Ok(report)
    }

    /// Runs batches until none is left that can be sent now.
    pub fn drain<C, E, F>(&self, conn: &mut C, mut deliver: F) -> Result<RelayReport, Error>
    where
        C: OutboxStore,
        E: fmt::Display,
        F: FnMut(&OutboxMessage) -> Result<(), E>,
    {
        let mut total = RelayReport::default();
        loop {
            let report = self.run_once(conn, &mut deliver)?;
            total.add(&report);
            if report.leased == 0 {
                return Ok(total);
            }
        }
    }

    /// [`run_once`](Self::run_once) through an async connection, with an async delivery function.
    #[cfg(feature = "async")]
    pub async fn run_once_async<C, E, F>(
        &self,
        conn: &mut C,
        mut deliver: F,
    ) -> Result<RelayReport, Error>
    where
        C: AsyncOutboxStore,
        E: fmt::Display,
        F: AsyncFnMut(&OutboxMessage) -> Result<(), E>,
    {
        let (now, until) = self.lease_window();
        let limit = i64::from(self.batch_size);
        let batch = crate::asynchronous::retry_transient_async::<C, _>(async || {
            conn.lease(&self.owner, now, until, limit).await
        })
        .await
        .map_err(Error::Outbox)?;
        let mut report = RelayReport::leased(&batch);
        for message in &batch {
            let after = self.after_delivery(message, deliver(message).await);
            let held = match &after {
                After::Delivered { at } => {
                    crate::asynchronous::retry_transient_async::<C, _>(async || {
                        conn.mark_delivered(message.id, &self.owner, *at).await
                    })
                    .await
                }
                After::Failed {
                    attempts,
                    error,
                    at,
                    retry_at,
                } => crate::asynchronous::retry_transient_async::<C, _>(async || {
                    conn.mark_failed(message.id, &self.owner, *attempts, error, *at, *retry_at)
                        .await
                })
                .await
                .map(|()| true),
            }
            .map_err(Error::Outbox)?;
            report.count(message, &after, held);
        }
        Ok(report)
    }

    /// [`drain`](Self::drain) through an async connection, with an async delivery function.
    #[cfg(feature = "async")]
    pub async fn drain_async<C, E, F>(
        &self,
        conn: &mut C,
        mut deliver: F,
    ) -> Result<RelayReport, Error>
    where
        C: AsyncOutboxStore,
        E: fmt::Display,
        F: AsyncFnMut(&OutboxMessage) -> Result<(), E>,
    {
        let mut total = RelayReport::default();
        loop {
            let report = self.run_once_async(conn, &mut deliver).await?;
            total.add(&report);
            if report.leased == 0 {
                return Ok(total);
            }
        }
    }

    /// Now, and the end of a lease taken now.
    fn lease_window(&self) -> (NaiveDateTime, NaiveDateTime) {
        let now = chrono::Utc::now().naive_utc();
        let until = now + chrono::TimeDelta::from_std(self.lease).unwrap_or(chrono::TimeDelta::MAX);
        (now, until)
    }

    /// What to record after delivering `message`: delivered, or failed and when to try again
    /// (`None`: park it).
    fn after_delivery<E: fmt::Display>(
        &self,
        message: &OutboxMessage,
        delivered: Result<(), E>,
    ) -> After {
        let at = chrono::Utc::now().naive_utc();
        match delivered {
            Ok(()) => After::Delivered { at },
            Err(error) => {
                let attempts = message.attempts + 1;
                let park = u32::try_from(attempts).unwrap_or(u32::MAX) >= self.max_attempts;
                After::Failed {
                    attempts,
                    error: error.to_string(),
                    at,
                    retry_at: (!park).then(|| at + self.delay(attempts)),
                }
            }
        }
    }

    fn delay(&self, attempts: i32) -> chrono::TimeDelta {
        let doublings = u32::try_from(attempts.saturating_sub(1))
            .unwrap_or(0)
            .min(20);
        let delay = self
            .backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff);
        chrono::TimeDelta::from_std(delay).unwrap_or(chrono::TimeDelta::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::message_id;

    #[test]
    fn message_ids_are_stable_and_distinct() {
        assert_eq!(message_id("k", "email", 0), message_id("k", "email", 0));
        assert_ne!(message_id("k", "email", 0), message_id("k", "email", 1));
        assert_ne!(message_id("k", "email", 0), message_id("k", "sms", 0));
        assert_ne!(
            message_id("ka", "b", 0),
            message_id("k", "ab", 0),
            "parts are length-prefixed"
        );
        assert_eq!(message_id("k", "email", 0).len(), 4 + 32);
    }
}
