//! MySQL and MariaDB: every statement, error, lock, migration and inspection query, for
//! `MysqlConnection` and diesel-async's `AsyncMysqlConnection`.
//!
//! * The claim is a plain `INSERT`: the duplicate-key error is the "already done" signal, and it
//!   rolls back only that statement. Not `INSERT IGNORE` (it turns other errors, such as
//!   truncation, into warnings: a false "already done"), and not `ON DUPLICATE KEY UPDATE` (with
//!   Diesel's `CLIENT_FOUND_ROWS` it reports 1 row either way). A conflicting row from a
//!   transaction in flight makes it wait for that transaction, as on PostgreSQL.
//! * The claimed row is then read with `FOR UPDATE`: under REPEATABLE READ a plain `SELECT` may
//!   read an older snapshot and miss the row whose duplicate was just hit.
//! * Deadlocks (1213; a third waiter on a key whose first holder rolled back gets one) and lock
//!   wait timeouts (1205) are retried from `BEGIN`: nothing has run yet. So is MariaDB's 1020
//!   ("Record has changed since last read"), a serialization failure under
//!   `innodb_snapshot_isolation` (on by default from MariaDB 11.6), which rolls the whole
//!   transaction back as a deadlock does.
//! * Times are `DATETIME(6)` UTC from `UTC_TIMESTAMP(6)`, whatever the session's `time_zone`.
//! * DDL commits by itself, so a migration cannot be one transaction. Each step creates one table
//!   in one statement and then records its version; a step interrupted between the two is found
//!   done by its table and only recorded, so `migrate` resumes. Steps run under a named lock
//!   (`GET_LOCK`) that a guard releases, or, when the future is dropped, whose connection it marks
//!   broken so that a pool closes it (closing releases the lock).
//!
//! # Adding a column to a busy `done_jobs` later
//!
//! `ALTER TABLE done_jobs ADD COLUMN c type NULL, ALGORITHM=INSTANT` (MySQL 8.0.12+, MariaDB
//! 10.3+) changes only metadata; the step sets `lock_wait_timeout` low and retries, so it never
//! queues for the metadata lock behind a long transaction while every claim queues behind it.
//! Where `INSTANT` is refused, `ALGORITHM=INPLACE, LOCK=NONE` keeps the table writable.

use diesel::mysql::Mysql;
use diesel::result::{DatabaseErrorKind, Error as DieselError, QueryResult};
use diesel::sql_types::{BigInt, Binary, Bool, Integer, Nullable, Text};

use crate::migrations::TableCount;
use crate::schema_problem::SchemaProblem;
use crate::sql::{Bind, IdList, Statement, bind};
use crate::store::{
    Claim, ClaimAttempt, Database, DoneRow, Fault, Lease, Nesting, StatementLimit, Store,
    Unfinished,
};

/// MySQL and MariaDB (features `mysql`, `async-mysql`).
#[derive(Debug, Clone, Copy)]
pub struct MysqlDb;

macro_rules! now {
    () => {
        "UTC_TIMESTAMP(6)"
    };
}

/// The clock in a condition that chooses rows by a time: `now!()`, which the planner searches an
/// index by (one value for the whole statement).
macro_rules! now_bound {
    () => {
        "UTC_TIMESTAMP(6)"
    };
}

/// The database's clock plus the microseconds bound at `?`; NULL when it is NULL.
macro_rules! now_plus {
    () => {
        "TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6))"
    };
}

macro_rules! message_columns {
    () => {
        concat!(
            "id, message_id, topic, payload, job_key, attempts, last_error, \
             TIMESTAMPDIFF(MICROSECOND, created_at, ",
            now!(),
            ") AS age_micros"
        )
    };
}

/// The name of the lock that serializes migrations: one per database, so applications sharing a
/// server do not wait for each other (MySQL's lock names are server-wide and at most 64
/// characters long; a database name is at most 64, so it is cut at 48).
macro_rules! migration_lock {
    () => {
        "CONCAT('idempotent_jobs:', LEFT(DATABASE(), 48))"
    };
}

/// A timestamp column (or aggregate of one) as microseconds since the Unix epoch; NULL stays NULL.
macro_rules! micros {
    ($column:expr) => {
        concat!(
            "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ",
            $column,
            ")"
        )
    };
}

/// An `UPDATE` of one outbox message by its id reads it through the primary key: by another index
/// (MariaDB chooses `outbox_delivered` once the statement says `delivered_at IS NULL`), the
/// statement's REPEATABLE READ locks the gap after the newest undelivered message, where the next
/// push goes, and a job pushing a message waits for the relay's commit.
macro_rules! by_primary_key {
    () => {
        " FORCE INDEX (PRIMARY)"
    };
}

/// A read of leased messages (`lease_owner`) goes through `outbox_leased` (schema version 5), which
/// holds them alone: never by the primary key or `outbox_pending` in their order, past every
/// undelivered message. The hint names the indexes it rules out, not the one it wants, so a relay
/// on a database not migrated yet still runs, as before the index: through `outbox_delivered`,
/// over the undelivered messages (not a scan of the table, delivered ones and all).
macro_rules! through_leased {
    () => {
        " IGNORE INDEX (PRIMARY, outbox_pending)"
    };
}

/// An explicit `LIMIT` as large as MySQL takes, at the end of every `SELECT` the runtime sends
/// there: a session's `sql_select_limit` applies to every `SELECT` without one (a table-less one
/// too), and would cut a statement's rows short (`= 0`: return none).
macro_rules! every_row {
    () => {
        " LIMIT 18446744073709551615"
    };
}

/// How many ids one of the lease's statements carries (`IN (?, ...)`); fewer are padded with NULL.
const ID_CHUNK: usize = 8;

/// The `IN` list of [`ID_CHUNK`] ids.
macro_rules! id_list {
    () => {
        "(?, ?, ?, ?, ?, ?, ?, ?)"
    };
}

/// After the candidate bound at `?, ?, ?` (its `available_at` as text, again, and its id) in the
/// order of `outbox_pending`. A `DATETIME` against text is compared as a `DATETIME`, whatever the
/// session's time zone.
macro_rules! after_candidate {
    () => {
        "(available_at > ? OR (available_at = ? AND id > ?))"
    };
}

sql! {
    MaxAllowedPacket = concat!("SELECT @@max_allowed_packet AS `limit`", every_row!());
    // A statement that uses a table clears the session's list of warnings; a `ROLLBACK` that
    // warns nothing leaves the list as it was (the body's last statement's errors and warnings).
    ClearWarnings = "SELECT 1 AS n FROM idempotent_schema LIMIT 0";
    // Right after a `ROLLBACK` that followed `ClearWarnings`: its only warning is 1196, "Some
    // non-transactional changed tables couldn't be rolled back".
    RollbackWarnings = concat!("SELECT CAST(@@warning_count AS SIGNED) AS n", every_row!());
    ClaimInsert = concat!(
        "INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, result, done_at) VALUES (?, ?, ?, ?, ?, ?, ",
        now!(),
        ")"
    );
    // Schema version 4: `BEGIN`, the job's savepoint and `ClaimInsert` in one procedure.
    CallBeginAndClaim = "CALL idempotent_begin_and_claim(?, ?, ?, ?, ?, ?)";
    ClaimRead = concat!(
        "SELECT job_name, result, fingerprint, \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', done_at) AS done_at_micros, \
         (expires_at IS NOT NULL AND expires_at <= ", now!(), ") AS lapsed \
         FROM done_jobs WHERE key_digest = ?", every_row!(), " FOR UPDATE"
    );
    // MySQL takes no `LIMIT` in an `IN` subquery, but does in `DELETE`.
    PruneLapsed = concat!(
        "DELETE FROM done_jobs WHERE expires_at <= ", now!(), " ORDER BY expires_at LIMIT ?"
    );
    // A lease finds its candidates with plain reads, which lock nothing, and then locks only
    // them, by primary key, checking each one's condition again on the row as it is now. A
    // locking read that scans (`FOR UPDATE SKIP LOCKED` over the outbox) keeps every row it read
    // locked until the lease commits, matched or not: at REPEATABLE READ always, and at READ
    // COMMITTED through a secondary index (MariaDB 10.11). Every other relay's `SKIP LOCKED`
    // then skipped them all and found nothing, and two relays could hide the whole outbox from
    // each other across two indexes. `FORCE INDEX (PRIMARY)`: the list of ids, never a scan
    // (which the optimizer prefers for a few ids in a small table, and which would wait for a
    // running job's pushed message, in `UPDATE`s too).
    ParkableCandidates = concat!(
        "SELECT id FROM outbox", through_leased!(), " WHERE ", abandoned!(), " AND attempts >= ? ORDER BY id", every_row!()
    );
    LockParkable = concat!(
        "SELECT id FROM outbox FORCE INDEX (PRIMARY) WHERE id IN ", id_list!(), " AND ",
        abandoned!(), " AND attempts >= ? ORDER BY id", every_row!(), " FOR UPDATE SKIP LOCKED"
    );
    ParkMany = concat!(
        "UPDATE outbox FORCE INDEX (PRIMARY) SET parked_at = ", now!(), ", lease_owner = NULL, \
         lease_until = NULL, last_error = ", abandoned_reason!(), " WHERE id IN ", id_list!()
    );
    // Candidates come in the order of `outbox_pending` (`available_at, id`: the order in which
    // messages became due), which a range of the index reads and stops at the limit, after the
    // last one read (`after_candidate`). With `ORDER BY id` the plan depended on the statistics:
    // measured with 1,000,000 messages backing off and 100 due, one plan walked every message
    // backing off (1.9 s a lease), another sorted the due ones; through the index, 0.2 ms.
    //
    // Each says which index it reads: the optimizer costs an ordered walk under `LIMIT` by guesses.
    // Measured with 1,000,000 messages due and none leased, it read the abandoned candidates by
    // walking `outbox_pending` in its order (every undelivered message, 1.8 s a round) instead of
    // the few entries of `outbox_leased`; and once `outbox_leased` was there, it read the pending
    // ones with a `ref` on `outbox_pending`'s two `NULL`s (every message backing off, 0.35 s)
    // instead of the range up to now.
    AbandonedCandidates = concat!(
        "SELECT id, CAST(available_at AS CHAR) AS available FROM outbox", through_leased!(), " WHERE ", abandoned!(),
        " AND ", after_candidate!(), " ORDER BY available_at, id LIMIT 8" // ID_CHUNK
    );
    // One abandoned message at a time (it may be the one that stopped the relay). One at its last
    // attempt is not taken (`attempts < ?`, the relay's `max_attempts`): its lease can lapse
    // between the park's clock and this one's, and the next lease parks it.
    LockAbandoned = concat!(
        "SELECT id FROM outbox FORCE INDEX (PRIMARY) WHERE id IN ", id_list!(), " AND ",
        abandoned!(), " AND attempts < ? ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
    );
    PendingCandidates = concat!(
        "SELECT id, CAST(available_at AS CHAR) AS available FROM outbox FORCE INDEX (outbox_pending) WHERE ", pending!(),
        " AND ", after_candidate!(), " ORDER BY available_at, id LIMIT ?"
    );
    LockPending = concat!(
        "SELECT id FROM outbox FORCE INDEX (PRIMARY) WHERE id IN ", id_list!(), " AND ",
        pending!(), " ORDER BY id", every_row!(), " FOR UPDATE SKIP LOCKED"
    );
    // The rows are this lease's, locked by the reads above.
    TakeMany = concat!(
        "UPDATE outbox FORCE INDEX (PRIMARY) SET lease_owner = ?, lease_until = ", now_plus!(),
        ", attempts = attempts + 1 WHERE id IN ", id_list!()
    );
    // Through `outbox_leased`: this lease's rows alone, not every undelivered one (by
    // `outbox_pending`) nor the delivered ones kept until `prune_delivered` (a scan).
    Leased = concat!(
        "SELECT ", message_columns!(), " FROM outbox", through_leased!(), " WHERE lease_owner = ? \
         AND delivered_at IS NULL AND parked_at IS NULL ORDER BY id", every_row!()
    );
    // Through the index on `(delivered_at, parked_at, ...)`: only parked entries are read and
    // locked. A scan of the table locked every row it read and waited for each one a running
    // job had pushed and not committed, holding the rest from every relay meanwhile. A parked
    // message is never delivered, so `delivered_at IS NULL` changes no answer.
    RetryParked = concat!(
        "UPDATE outbox FORCE INDEX (outbox_pending) SET parked_at = NULL, attempts = 0, \
         last_error = NULL, available_at = ",
        now!(),
        " WHERE delivered_at IS NULL AND parked_at IS NOT NULL AND (? IS NULL OR message_id = ?)"
    );
    PruneDelivered = concat!(
        "DELETE FROM outbox WHERE delivered_at <= TIMESTAMPADD(MICROSECOND, -?, ", now!(),
        ") ORDER BY delivered_at LIMIT ?"
    );
    Counts = concat!("SELECT \
         COUNT(CASE WHEN delivered_at IS NULL AND parked_at IS NULL AND lease_owner IS NULL THEN 1 END) AS pending, \
         COUNT(CASE WHEN delivered_at IS NULL AND parked_at IS NULL AND lease_owner IS NOT NULL THEN 1 END) AS leased, \
         COUNT(delivered_at) AS delivered, \
         COUNT(CASE WHEN delivered_at IS NULL THEN parked_at END) AS parked \
         FROM outbox", every_row!());
    TableExists = concat!("SELECT COUNT(*) AS n FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = ? AND table_type = 'BASE TABLE'", every_row!());
    UniqueIndexOn = concat!("SELECT COUNT(*) AS n FROM information_schema.statistics s \
         WHERE s.table_schema = DATABASE() AND s.table_name = ? AND s.non_unique = 0 \
         AND s.column_name = ? AND (SELECT COUNT(*) FROM information_schema.statistics t \
           WHERE t.table_schema = s.table_schema AND t.table_name = s.table_name \
           AND t.index_name = s.index_name) = 1", every_row!());
    // IGNORE: another migration (on another Galera node) may have recorded it first.
    RecordVersion = concat!(
        "INSERT IGNORE INTO idempotent_schema (version, description, applied_at) VALUES (?, ?, ", now!(), ")"
    );
    TakeMigrationLock = concat!("SELECT GET_LOCK(", migration_lock!(), ", ?) AS acquired", every_row!());
    IndexExists = concat!("SELECT COUNT(*) AS n FROM information_schema.statistics \
         WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ? AND seq_in_index = 1",
         every_row!());
    RoutineExists = concat!("SELECT COUNT(*) AS n FROM information_schema.routines \
         WHERE routine_schema = DATABASE() AND routine_name = ? AND routine_type = 'PROCEDURE'", every_row!());
    // MariaDB lists a system-versioned table as `SYSTEM VERSIONED` (its current rows are what a
    // `SELECT` reads).
    TableNames = concat!(
        "SELECT CAST(table_name AS CHAR) AS name FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_type IN ('BASE TABLE', 'SYSTEM VERSIONED') ORDER BY 1",
        every_row!()
    );
    TableColumns = concat!(
        "SELECT CAST(column_name AS CHAR) AS name, CAST(data_type AS CHAR) AS data_type \
         FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
        every_row!()
    );
    // What the session finds by each name: `information_schema` lists no temporary table
    // (MariaDB 10.11, MySQL 8), `SHOW CREATE TABLE` shows the one the name resolves to.
    ShowCreateIdempotentSchema = "SHOW CREATE TABLE idempotent_schema";
    ShowCreateDoneJobs = "SHOW CREATE TABLE done_jobs";
    ShowCreateOutbox = "SHOW CREATE TABLE outbox";
}

/// A row of `SHOW CREATE TABLE`.
#[derive(diesel::QueryableByName)]
struct CreateTable {
    #[diesel(sql_type = Text, column_name = "Create Table")]
    create: String,
}

/// Whether the table `SHOW CREATE TABLE` (`S`) shows is a temporary one of this session. A name
/// that resolves to no table (or to a view) is not; a lost connection is the error it is.
async fn temporary<S: crate::sql::SqlText, C: Store<Db = MysqlDb>>(
    conn: &mut C,
) -> QueryResult<bool>
where
    CreateTable: diesel::QueryableByName<Mysql>,
{
    match conn
        .load::<_, _, CreateTable>(Statement::<S, _>::new(()))
        .await
    {
        Ok(rows) => Ok(rows.first().is_some_and(|row| {
            row.create
                .trim_start()
                .to_ascii_uppercase()
                .starts_with("CREATE TEMPORARY TABLE")
        })),
        Err(error) if MysqlDb::connection_lost(&error) => Err(error),
        Err(_) => Ok(false),
    }
}

/// A read outside the runtime's transactions sees the latest commit only in autocommit mode: with
/// `autocommit = 0` the session sits in a transaction Diesel does not know of, whose REPEATABLE READ
/// snapshot may still hold a key forgotten since. Then the read finds nothing, and the claim
/// decides (its read of a taken key locks the row: committed data only).
/// Nor at READ UNCOMMITTED, where it may see a result another session wrote and then rolls back.
/// On a Galera node the read must also be causal: a node applies other nodes' commits a moment
/// after they return, so without `wsrep_sync_wait` (bit 1, reads) it may still hold a key forgotten
/// on another node. MariaDB runs the `/*M! ... */` part (its isolation variable is `tx_isolation`
/// before 11.1), and skips `/*!80000 ... */`, which MySQL 8 runs (`transaction_isolation`); MySQL
/// takes the `/*M! ... */` part, with its Galera variables, for a comment.
macro_rules! read_guard {
    () => {
        " AND @@autocommit = 1 \
         /*M! AND @@tx_isolation <> 'READ-UNCOMMITTED' AND (@@wsrep_on = 0 OR @@wsrep_sync_wait & 1 = 1) */ \
         /*!80000 AND @@transaction_isolation <> 'READ-UNCOMMITTED' */"
    };
}

shared_statements!();

use super::shared::later;

/// Sets the next transaction's isolation level to the session's own (no change), which the server
/// refuses (`ER_CANT_CHANGE_TX_CHARACTERISTICS`, 1568, SQLSTATE 25001) while the session holds a
/// transaction: one Diesel does not know of (a `BEGIN` sent as text, or `autocommit = 0` after
/// any statement that read or wrote a table), which a job's `START TRANSACTION` would commit.
/// MariaDB names the setting `tx_isolation`, MySQL 8 `transaction_isolation`: each reads only
/// its own comment (MariaDB ignores `/*!80000 ... */`).
macro_rules! nothing_open {
    () => {
        "SET /*M! @@tx_isolation = @@SESSION.tx_isolation */ \
         /*!80000 @@transaction_isolation = @@SESSION.transaction_isolation */"
    };
}

sql! {
    // A job's transaction, where the procedures do not open it: refused first if the session
    // holds one of its own. Sent by the blocking connection only (the async one sends it in its
    // text batch, `BEGIN_JOB`).
    #[cfg(feature = "mysql")]
    RefuseOpen = nothing_open!();
    // Before a read outside any transaction: refused (1568) when the session holds a transaction,
    // which the read would join, and (1231, no such level) when it has `autocommit = 0`, where the
    // read would open one and leave it open. Else it sets the next transaction's isolation level,
    // the read's, to the session's own: a `SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED` for
    // the next transaction only, which no variable shows, would otherwise let that read see rows
    // not committed (its guard, `read_guard!()`, reads the session's level).
    ReadOutsideFirst = "SET /*M! @@tx_isolation = IF(@@autocommit = 1, @@SESSION.tx_isolation, 'autocommit = 0') */ \
         /*!80000 @@transaction_isolation = IF(@@autocommit = 1, @@SESSION.transaction_isolation, 'autocommit = 0') */";
    // A transaction the session holds that Diesel does not know of. MariaDB says so
    // (`@@in_transaction`); MySQL does not, and there a session with `autocommit = 0` may hold
    // one at any time. The `/*M! ... */` parts are MariaDB's only (MySQL reads them as comments):
    // MariaDB reads `@@in_transaction = 1 OR (FALSE AND @@autocommit = 0)`, MySQL `@@autocommit = 0`.
    SessionInTransaction = concat!("SELECT CAST(/*M! @@in_transaction = 1 OR (FALSE AND */ @@autocommit = 0 /*M! ) */ AS SIGNED) AS n", every_row!());
    // The character set settings that are not utf8mb4 (nor binary, which converts nothing), as
    // `name = value`, joined; '' when none is.
    SessionCharset = concat!(
        "SELECT CAST(CONCAT_WS(', ', \
         IF(@@character_set_client IN ('utf8mb4', 'binary'), NULL, CONCAT('character_set_client = ', @@character_set_client)), \
         IF(@@character_set_connection IN ('utf8mb4', 'binary'), NULL, CONCAT('character_set_connection = ', @@character_set_connection)), \
         IF(COALESCE(@@character_set_results, 'binary') IN ('utf8mb4', 'binary'), NULL, CONCAT('character_set_results = ', @@character_set_results))) \
         AS CHAR) AS previous",
        every_row!()
    );
    // How far the session's clock (`NOW()`, which `SET timestamp` sets, as it does
    // `UTC_TIMESTAMP()`) is from the server's (`SYSDATE()`, which it does not), in microseconds.
    SessionClockOffset = concat!(
        "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, SYSDATE(6), NOW(6)) AS SIGNED) AS n",
        every_row!()
    );
    // Its bound value back: whether the connection's answers are in step (`answers_in_step`).
    Echo = concat!("SELECT CAST(? AS SIGNED) AS n", every_row!());
    LockWaitTimeout = concat!("SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS CHAR) AS previous", every_row!());
    // Prepared, like every other statement: one round trip, where a text batch takes three on the
    // sync connection.
    SetLockWaitTimeout = "SET SESSION innodb_lock_wait_timeout = ?";
    // The next transaction only (no SESSION or GLOBAL): a prune's batch.
    ReadCommittedNext = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";
    // The next transaction only: a relay's lease, or a reported read.
    RepeatableReadNext = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ";
}

/// What `max_allowed_packet` must hold beside the values a statement carries (a result, a key, an
/// outbox message's key, topic and payload): the statement's text and its other values (a few
/// hundred bytes, a job name of at most 1 KiB), with room to spare for the protocol's framing.
const STATEMENT_ROOM: u64 = 64 * 1024;

/// Statements whose `EXPLAIN` needs the privileges a worker needs, by privilege and table.
const PRIVILEGE_PROBES: &[(&str, &str, &str)] = &[
    (
        "SELECT",
        "idempotent_schema",
        "EXPLAIN SELECT version FROM idempotent_schema WHERE 1 = 0",
    ),
    (
        "SELECT",
        "done_jobs",
        "EXPLAIN SELECT job_name FROM done_jobs WHERE 1 = 0",
    ),
    (
        "INSERT",
        "done_jobs",
        "EXPLAIN INSERT INTO done_jobs (key_digest, job_key, job_name, done_at) SELECT key_digest, job_key, job_name, done_at FROM done_jobs WHERE 1 = 0",
    ),
    (
        "UPDATE",
        "done_jobs",
        "EXPLAIN UPDATE done_jobs SET result = result WHERE 1 = 0",
    ),
    (
        "SELECT",
        "outbox",
        "EXPLAIN SELECT id FROM outbox WHERE 1 = 0",
    ),
    (
        "INSERT",
        "outbox",
        "EXPLAIN INSERT INTO outbox (message_id, topic, payload, created_at, available_at) SELECT message_id, topic, payload, created_at, available_at FROM outbox WHERE 1 = 0",
    ),
    (
        "UPDATE",
        "outbox",
        "EXPLAIN UPDATE outbox SET attempts = attempts WHERE 1 = 0",
    ),
];

/// Releases the migration lock; also what a dropped guard runs on a sync connection.
const RELEASE_MIGRATION_LOCK: &str =
    concat!("SELECT RELEASE_LOCK(", migration_lock!(), ")", every_row!());

#[derive(diesel::QueryableByName)]
struct MaxPacket {
    #[diesel(sql_type = BigInt)]
    limit: i64,
}

/// Sends `S`, a `SET TRANSACTION ISOLATION LEVEL ...` for the next transaction only: prepared,
/// or as text where the server refuses to prepare it.
async fn next_transaction_at<S: crate::sql::SqlText, C: Store<Db = MysqlDb>>(
    conn: &mut C,
) -> QueryResult<()> {
    match conn.execute(Statement::<S, _>::new(())).await {
        Err(error) if refuses_prepared(&error) => conn.batch(S::SQL).await,
        result => result.map(drop),
    }
}

/// The ids of `chunk` (at most [`ID_CHUNK`]) as an `IN` list.
fn ids<R: HasId>(chunk: &[R]) -> IdList<ID_CHUNK> {
    IdList::new(chunk.iter().map(HasId::id))
}

/// Locks and returns one message whose relay died while it held it, below `max_attempts` (none if
/// every such message is locked by another relay's lease).
async fn abandoned_one<C: Store<Db = MysqlDb>>(
    conn: &mut C,
    max_attempts: i32,
) -> QueryResult<Vec<Id>> {
    let mut after = Candidate::first();
    loop {
        let candidates: Vec<Candidate> = conn
            .load(Statement::<AbandonedCandidates, _>::new(after.cursor()))
            .await?;
        let Some(last) = candidates.last() else {
            return Ok(Vec::new());
        };
        after = last.clone();
        let locked: Vec<Id> = conn
            .load(Statement::<LockAbandoned, _>::new((
                ids(&candidates),
                bind::<Integer, _>(max_attempts),
            )))
            .await?;
        if !locked.is_empty() {
            return Ok(locked);
        }
    }
}

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The binds of `after_candidate!()`: a candidate's `available_at` (twice) and id.
type Cursor<'a> = (Bind<Text, &'a str>, Bind<Text, &'a str>, Bind<BigInt, i64>);

/// A message the lease may take, and where it stands in the order of `outbox_pending`.
#[derive(diesel::QueryableByName, Clone)]
struct Candidate {
    #[diesel(sql_type = BigInt)]
    id: i64,
    /// `available_at`, as the server writes it.
    #[diesel(sql_type = Text)]
    available: String,
}

impl Candidate {
    /// Before every message: `DATETIME`'s range starts at year 1000.
    fn first() -> Self {
        Self {
            id: 0,
            available: "1000-01-01 00:00:00".to_owned(),
        }
    }

    /// The binds of `after_candidate!()`.
    fn cursor(&self) -> Cursor<'_> {
        (
            bind::<Text, _>(&self.available),
            bind::<Text, _>(&self.available),
            bind::<BigInt, _>(self.id),
        )
    }
}

/// What [`ids`] lists.
trait HasId {
    fn id(&self) -> i64;
}

impl HasId for Id {
    fn id(&self) -> i64 {
        self.id
    }
}

impl HasId for Candidate {
    fn id(&self) -> i64 {
        self.id
    }
}

#[derive(diesel::QueryableByName)]
struct Acquired {
    #[diesel(sql_type = Nullable<BigInt>)]
    acquired: Option<i64>,
}

#[derive(diesel::QueryableByName)]
struct Column {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    data_type: String,
}

/// How many of a failed statement's first conditions [`error_number_sql`] reads (and its last).
const CONDITIONS_READ: u32 = 4;

/// MariaDB's note after an error raised in a stored procedure (`ER_SP_STACK_TRACE`).
const PROCEDURE_NOTE: u64 = 4094;

/// Reads how many conditions the failed statement left, and the number of each of the first
/// [`CONDITIONS_READ`] and of the last, into session variables of the runtime's.
fn error_number_sql() -> String {
    let mut sql = String::from(
        "GET DIAGNOSTICS @idempotent_jobs_conditions = NUMBER; \
         GET DIAGNOSTICS CONDITION @idempotent_jobs_conditions @idempotent_jobs_errno_last = MYSQL_ERRNO",
    );
    for n in 1..=CONDITIONS_READ {
        sql.push_str(&format!(
            "; GET DIAGNOSTICS CONDITION {n} @idempotent_jobs_errno_{n} = MYSQL_ERRNO"
        ));
    }
    sql
}

/// What [`error_number_sql`] read, as a JSON array: `[conditions, last, first, second, ...]`.
fn read_error_number_sql() -> String {
    let mut columns = vec![
        "COALESCE(@idempotent_jobs_conditions, 0)".to_owned(),
        "@idempotent_jobs_errno_last".to_owned(),
    ];
    columns.extend((1..=CONDITIONS_READ).map(|n| format!("@idempotent_jobs_errno_{n}")));
    format!("SELECT JSON_ARRAY({}) AS `row`", columns.join(", "))
}

/// `ER_LOCK_DEADLOCK`: the server rolled the whole transaction back.
const DEADLOCK: u32 = 1213;
/// `ER_CHECKREAD`, "Record has changed since last read in table ...; try restarting
/// transaction": MariaDB's `innodb_snapshot_isolation` (on by default from MariaDB 11.6) found a
/// row the transaction locks changed by another transaction after its snapshot. Like a deadlock,
/// the server rolled the whole transaction back, and trying it again can succeed.
const RECORD_CHANGED: u32 = 1020;
/// `ER_LOCK_WAIT_TIMEOUT`: the statement rolled back, and the whole transaction with it where
/// `innodb_rollback_on_timeout` is on ([`ROLLS_BACK_ON_TIMEOUT`]).
const LOCK_WAIT_TIMEOUT: u32 = 1205;
/// Whether a lock wait timeout rolls back the whole transaction (`1`), as one text row.
const ROLLS_BACK_ON_TIMEOUT: &str =
    "SELECT CAST(CAST(@@innodb_rollback_on_timeout AS SIGNED) AS CHAR) AS `row`";

/// The number of the error that ended the session's last failed statement, where the server
/// still holds it.
///
/// The diagnostics area still holds the failed statement's conditions: statements sent as text
/// read them (a prepared one would start a new diagnostics area). The error ends the statement:
/// it is the last condition but for the notes MariaDB adds after an error in a procedure ("At
/// line 1 in ..."), and after any warning raised before it. Conditions past the number kept
/// (none at `max_error_count = 0`) are not read: their variables hold whatever they held before.
/// `None` where none is kept, or the read failed.
async fn last_error_number<C: Store<Db = MysqlDb>>(conn: &mut C) -> Option<u32> {
    let read = match conn.batch(&error_number_sql()).await {
        Ok(()) => conn.text_rows(&read_error_number_sql()).await,
        Err(asked) => Err(asked),
    };
    read.ok()
        .and_then(|rows| rows.into_iter().next())
        .and_then(|row| error_number_of(&row))
}

/// The error's number from what [`read_error_number_sql`] read: the last condition the
/// statement kept that is not a [`PROCEDURE_NOTE`].
fn error_number_of(row: &str) -> Option<u32> {
    let values: Vec<serde_json::Value> = serde_json::from_str(row).ok()?;
    let kept = usize::try_from(values.first()?.as_u64()?).ok()?;
    let number = |value: Option<&serde_json::Value>| value?.as_u64();
    let error = if kept == 0 {
        None
    } else if kept > CONDITIONS_READ as usize {
        // Only the first few and the last were read: the last, unless it is a note.
        number(values.get(1)).filter(|&n| n != PROCEDURE_NOTE)
    } else {
        (0..kept)
            .rev()
            .filter_map(|index| number(values.get(2 + index)))
            .find(|&n| n != PROCEDURE_NOTE)
    };
    error.and_then(|n| u32::try_from(n).ok())
}
/// What [`in_english`] appends, so that an error is read by its number once.
const NUMBERED: &str = "(MySQL error ";

/// `error`, whose number is `number`, with that number appended to the server's own message
/// (which may be in any language), and the English words of that error that the runtime's checks
/// read ([`MysqlDb::classify`], `release_failed`, `refuses_prepared`, ...).
fn in_english(error: DieselError, number: u32) -> DieselError {
    let words = match number {
        1205 => ": Lock wait timeout exceeded",
        1213 => ": Deadlock found",
        RECORD_CHANGED => ": Record has changed since last read",
        1969 => ": max_statement_time exceeded",
        3024 => ": maximum statement execution time exceeded",
        1927 => ": Connection was killed",
        1317 => ": Query execution was interrupted",
        1295 => ": prepared statement protocol",
        1665 => ": BINLOG_FORMAT = STATEMENT",
        1142 | 1370 => ": command denied",
        1449 => ": definer",
        1304 => ": already exists",
        1305 => ": does not exist",
        _ => "",
    };
    let message = super::message(&error).unwrap_or_default();
    DieselError::DatabaseError(
        DatabaseErrorKind::Unknown,
        Box::new(format!("{message} {NUMBERED}{number}{words})")),
    )
}

/// `COMMIT` whatever the session's `completion_type` (see `Database::COMMIT`).
const COMMIT: &str = "COMMIT AND NO CHAIN NO RELEASE";
/// `ROLLBACK` whatever the session's `completion_type`.
const ROLLBACK: &str = "ROLLBACK AND NO CHAIN NO RELEASE";

impl Database for MysqlDb {
    shared_methods!();
    const BEGIN: &'static str = "START TRANSACTION";
    const COMMIT: &'static str = COMMIT;
    const ROLLBACK: &'static str = ROLLBACK;
    const TRANSACTION_MAY_END_UNDER_THE_SESSION: bool = true;
    fn release_and_commit_sql() -> &'static str {
        "RELEASE SAVEPOINT idempotent_job; COMMIT AND NO CHAIN NO RELEASE"
    }
    migration_steps!(
        "mysql",
        crate::store::Step {
            version: 4,
            table: "done_jobs",
            column: None,
            routines: &[
                "idempotent_begin_job",
                "idempotent_begin_and_claim",
                "idempotent_finish_job",
            ],
            indexes: &[],
            sql: include_str!("../../sql/mysql/004_job_procedures.sql"),
        },
        crate::store::Step {
            version: 5,
            table: "outbox",
            column: None,
            routines: &[],
            indexes: &["outbox_leased"],
            sql: include_str!("../../sql/mysql/005_outbox_leased.sql"),
        }
    );

    async fn routines_exist<C: Store<Db = Self>>(
        conn: &mut C,
        names: &[&str],
    ) -> QueryResult<bool> {
        let mut all = true;
        for name in names {
            let rows: Vec<TableCount> = conn
                .load(Statement::<RoutineExists, _>::new(
                    (bind::<Text, _>(*name),),
                ))
                .await?;
            all &= rows.first().is_some_and(|r| r.n > 0);
        }
        Ok(all)
    }

    const AFTER_FAILED_STEP: Option<&'static str> =
        Some("SET SESSION sql_mode = COALESCE(@idempotent_jobs_sql_mode, @@SESSION.sql_mode)");

    fn made_concurrently(error: &DieselError) -> bool {
        // ER_SP_ALREADY_EXISTS (1304): "PROCEDURE idempotent_begin_job already exists"; also
        // ER_SP_DOES_NOT_EXIST for a `DROP` without `IF EXISTS`, which the step does not send.
        super::message(error).is_some_and(|m| m.contains("already exists"))
    }

    fn release_failed(error: &DieselError) -> bool {
        // ER_SP_DOES_NOT_EXIST (1305): "SAVEPOINT idempotent_job does not exist", also outside
        // a transaction. Not "PROCEDURE ... does not exist", whose kind is the same. In the
        // session's language (`lc_messages`): "SAVEPOINT idempotent_job existiert nicht",
        // "SAVEPOINTidempotent_job不存在"; the words `SAVEPOINT` and the name are never translated.
        super::message(error)
            .is_some_and(|m| m.starts_with("SAVEPOINT") && m.contains("idempotent_job"))
    }

    /// A server that refuses the prepared savepoint (`ER_UNSUPPORTED_PS`) switches this process to
    /// text for its transactions; this job fails and rolls back, as when `BEGIN` was refused.
    async fn set_job_savepoint<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<()> {
        let set = conn
            .execute(Statement::<crate::store::SetJobSavepoint, _>::new(()))
            .await;
        if let Err(error) = &set
            && refuses_prepared(error)
        {
            use_text_for_transactions();
        }
        set.map(drop)
    }

    fn taken_with_nothing_open(error: &DieselError) -> bool {
        matches!(
            error,
            DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, info)
                if info.message() == TAKEN_AND_ROLLED_BACK
                    || info.message() == TAKEN_AND_ROLLED_BACK_AUTOCOMMIT_OFF
        )
    }

    fn read_after_taken(error: &DieselError) -> bool {
        super::message(error) != Some(TAKEN_AND_ROLLED_BACK_AUTOCOMMIT_OFF)
    }

    fn inside_callers_transaction(error: &DieselError) -> bool {
        super::message(error).is_some_and(|m| {
            m.contains(HOLDS_A_TRANSACTION) || m.contains(CANNOT_CHANGE_CHARACTERISTICS)
        })
    }

    async fn reads_outside_safely<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<bool> {
        match conn
            .execute(Statement::<ReadOutsideFirst, _>::new(()))
            .await
        {
            Ok(_) => Ok(true),
            // Refused: a transaction open, or `autocommit = 0` (the statement's own errors).
            Err(error @ DieselError::DatabaseError(..)) if !Self::connection_lost(&error) => {
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    fn privilege_denied(error: &DieselError) -> bool {
        // ER_TABLEACCESS_DENIED_ERROR, ER_PROCACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR,
        // ER_SPECIFIC_ACCESS_DENIED_ERROR: "... command denied ...", "Access denied ...".
        super::message(error)
            .is_some_and(|m| m.contains("command denied") || m.contains("Access denied"))
    }

    async fn bound_lock_wait<C: Store<Db = Self>>(
        conn: &mut C,
        limit: std::time::Duration,
    ) -> QueryResult<Option<String>> {
        let seconds = lock_wait_seconds(limit);
        let rows: Vec<crate::store::SettingRow> =
            conn.load(Statement::<LockWaitTimeout, _>::new(())).await?;
        set_lock_wait(conn, seconds).await?;
        Ok(rows.into_iter().next().map(|row| row.previous))
    }

    async fn restore_lock_wait<C: Store<Db = Self>>(
        conn: &mut C,
        previous: &str,
    ) -> QueryResult<()> {
        // A number read back from the server; anything else is not sent as SQL.
        let seconds: u64 = previous.trim().parse().unwrap_or(50);
        set_lock_wait(conn, seconds).await
    }

    type Backend = Mysql;
    const NAME: &'static str = "MySQL";
    const DDL_IN_TRANSACTION: bool = false;

    fn classify(error: &DieselError) -> Fault {
        match error {
            DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => {
                Fault::Deadlock
            }
            // diesel-async's MySQL driver reports these by message only.
            _ => match super::message(error) {
                Some(m) if m.contains("Deadlock found") => Fault::Deadlock,
                // MariaDB's snapshot isolation (1020): the transaction read a snapshot older than
                // a row it locks. Rolled back whole, as a deadlock is.
                Some(m) if m.contains("Record has changed since last read") => Fault::Serialization,
                Some(m) if m.contains("Lock wait timeout") => Fault::LockTimeout,
                // A session's statement time limit that ends a wait (MariaDB 1969, MySQL 8 3024).
                Some(m)
                    if m.contains("max_statement_time exceeded")
                        || m.contains("maximum statement execution time exceeded") =>
                {
                    Fault::LockTimeout
                }
                _ => Fault::Other,
            },
        }
    }

    fn connection_lost(error: &DieselError) -> bool {
        crate::lost::connection_lost(error, crate::lost::MYSQL)
    }

    /// `KILL QUERY` (1317, also at a `COMMIT` it interrupted, reported as 1180 with 1317's words
    /// in English): the statement rolled back (the transaction stays open, and the runtime rolls
    /// it back), at a `COMMIT` the transaction. A statement's time limit says so too
    /// (1969, "Query execution was interrupted (max_statement_time exceeded)"), which
    /// [`classify`](Self::classify) already passes.
    fn canceled_by_request(error: &DieselError) -> bool {
        super::message(error).is_some_and(|m| m.contains("Query execution was interrupted"))
    }

    /// InnoDB rolls the whole transaction back on a deadlock (1213, also a Galera node's
    /// brute-force abort), on MariaDB's "record has changed" (1020), and on a lock wait timeout
    /// (1205) where the server runs with `innodb_rollback_on_timeout` (a setting read only at
    /// its start, not asked here). Without that setting a lock wait timeout (or a statement's
    /// time limit) undoes only the statement and the transaction is still open: the runtime then
    /// finds it its own, and this answer is not asked for.
    fn rolled_back_whole(error: &DieselError) -> bool {
        matches!(
            Self::classify(error),
            Fault::Deadlock | Fault::Serialization | Fault::LockTimeout
        )
    }

    async fn in_known_terms<C: Store<Db = Self>>(conn: &mut C, error: DieselError) -> DieselError {
        let unknown = matches!(
            error,
            DieselError::DatabaseError(DatabaseErrorKind::Unknown, _)
        ) && Self::classify(&error) == Fault::Other
            && !Self::connection_lost(&error)
            && !Self::release_failed(&error)
            && !super::message(&error).is_some_and(|m| m.contains(NUMBERED));
        if !unknown {
            return error;
        }
        // The read failing (the connection failed after the server answered) leaves the error
        // as the server gave it.
        match last_error_number(conn).await {
            Some(number) => in_english(error, number),
            None => error,
        }
    }

    async fn fewest_locks_next<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<()> {
        next_transaction_at::<ReadCommittedNext, _>(conn).await
    }

    fn fewest_locks_refused(error: &DieselError) -> bool {
        // ER_BINLOG_STMT_MODE_AND_ROW_ENGINE (1665): "... BINLOG_FORMAT = STATEMENT and at least
        // one table uses a storage engine limited to row-based logging. InnoDB is limited to
        // row-logging when transaction isolation level is READ COMMITTED or READ UNCOMMITTED."
        super::message(error).is_some_and(|m| m.contains("BINLOG_FORMAT = STATEMENT"))
    }

    const KNOWS_SESSION_TRANSACTION: bool = true;

    // `done_jobs` is `ENGINE = InnoDB`: warning 1196 is about the body's other tables.
    const PARTIAL_ROLLBACK_MAY_KEEP_THE_CLAIM: bool = false;

    async fn answers_in_step<C: Store<Db = Self>>(conn: &mut C, nonce: i64) -> QueryResult<bool> {
        async fn echo<C: Store<Db = MysqlDb>>(conn: &mut C, nonce: i64) -> QueryResult<bool> {
            let echoed: Vec<TableCount> = conn
                .load(Statement::<Echo, _>::new((bind::<BigInt, _>(nonce),)))
                .await?;
            Ok(matches!(echoed.as_slice(), [row] if row.n == nonce))
        }
        match echo(conn, nonce).await {
            Err(error) if !Self::connection_lost(&error) => {
                match echo(conn, nonce.wrapping_add(1)).await {
                    Ok(true) => Err(error),
                    Err(lost) if Self::connection_lost(&lost) => Err(lost),
                    _ => Ok(false),
                }
            }
            answered => answered,
        }
    }

    async fn session_in_transaction<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<bool> {
        let rows: Vec<TableCount> = conn
            .load(Statement::<SessionInTransaction, _>::new(()))
            .await?;
        Ok(rows.first().is_some_and(|r| r.n > 0))
    }

    async fn body_stopped_at_a_failure<C: Store<Db = Self>>(conn: &mut C) -> bool {
        // Only an error that rolled the whole transaction back: a deadlock (1213), a row changed
        // since the transaction's snapshot (1020), or a lock wait timeout (1205) where
        // `innodb_rollback_on_timeout` makes it roll back more than the statement. Any other
        // failure (a duplicate key after the body caught a deadlock and wrote on, each statement
        // committed on its own) says nothing of what ran before it.
        match last_error_number(conn).await {
            Some(DEADLOCK | RECORD_CHANGED) => true,
            Some(LOCK_WAIT_TIMEOUT) => conn
                .text_rows(ROLLS_BACK_ON_TIMEOUT)
                .await
                .is_ok_and(|rows| rows.first().is_some_and(|row| row == "1")),
            _ => false,
        }
    }

    async fn transaction_still_open<C: Store<Db = Self>>(conn: &mut C) -> Option<bool> {
        // MariaDB's `@@in_transaction`; MySQL's `@@autocommit = 0` (then any statement opens one).
        Self::session_in_transaction(conn).await.ok()
    }

    async fn release_job<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<()> {
        // MySQL (unlike MariaDB) refuses savepoint statements in the prepared protocol.
        if savepoints_as_text() {
            return conn.batch(RELEASE_JOB).await;
        }
        match conn
            .execute(Statement::<crate::store::ReleaseJob, _>::new(()))
            .await
        {
            Err(error) if refuses_prepared(&error) => {
                use_text_for_transactions();
                conn.batch(RELEASE_JOB).await
            }
            released => released.map(drop),
        }
    }

    async fn before_rollback(conn: &mut impl Store<Db = Self>) -> QueryResult<()> {
        let _: Vec<TableCount> = conn.load(Statement::<ClearWarnings, _>::new(())).await?;
        Ok(())
    }

    async fn rollback_left(
        conn: &mut impl Store<Db = Self>,
        cleared: bool,
    ) -> QueryResult<Option<&'static str>> {
        if !cleared {
            return Ok(None);
        }
        let warnings: Vec<TableCount> =
            conn.load(Statement::<RollbackWarnings, _>::new(())).await?;
        Ok(warnings.first().is_some_and(|w| w.n > 0).then_some(
            "the body wrote to a table that is not transactional (MyISAM, Aria, MEMORY: the server's warning 1196), whose rows a rollback leaves",
        ))
    }

    // `outbox.topic` is `VARCHAR(255)`: a longer topic is refused, not cut short by a session's
    // non-strict `sql_mode` and delivered to another topic.
    const MAX_TOPIC_CHARS: Option<usize> = Some(255);

    async fn too_large_for_a_statement<C: Store<Db = Self>>(
        conn: &mut C,
        bytes: usize,
    ) -> QueryResult<Option<StatementLimit>> {
        // Every server accepts at least 1 MiB; only larger values cost the look-up.
        if bytes < 1 << 20 {
            return Ok(None);
        }
        let rows: Vec<MaxPacket> = conn.load(Statement::<MaxAllowedPacket, _>::new(())).await?;
        let packet = rows
            .first()
            .map_or(0, |r| u64::try_from(r.limit).unwrap_or(0));
        let largest = packet.saturating_sub(STATEMENT_ROOM);
        Ok((bytes as u64 > largest).then_some(StatementLimit { largest, packet }))
    }

    async fn claim<C: Store<Db = Self>>(
        conn: &mut C,
        claim: &Claim<'_>,
    ) -> QueryResult<ClaimAttempt> {
        let inserted = conn
            .execute(Statement::<ClaimInsert, _>::new(
                super::shared::claim_values(claim),
            ))
            .await;
        claimed(conn, claim, inserted).await
    }

    /// With the schema's procedures (sync `MysqlConnection`), one prepared `CALL` of
    /// `idempotent_begin_and_claim` opens the transaction with the job's savepoint and inserts the
    /// claim: one round trip for both. Elsewhere, one after the other.
    async fn begin_and_claim<C: Store<Db = Self>>(
        conn: &mut C,
        claim: &Claim<'_>,
    ) -> QueryResult<(Nesting, QueryResult<ClaimAttempt>)> {
        let first = Statement::<CallBeginAndClaim, _>::new(super::shared::claim_values(claim));
        let Some(begun) = conn.begin_job_pipelined(first).await else {
            let nesting = conn.begin_job(None).await?;
            return Ok((nesting, Self::claim(conn, claim).await));
        };
        let (nesting, inserted) = begun?;
        Ok((nesting, claimed(conn, claim, inserted).await))
    }

    async fn lease<C: Store<Db = Self>>(
        conn: &mut C,
        lease: &Lease<'_>,
    ) -> QueryResult<crate::store::Leased> {
        // Messages abandoned at their last attempt: parked.
        let mut parked = 0_u64;
        let parkable: Vec<Id> = conn
            .load(Statement::<ParkableCandidates, _>::new((
                bind::<Integer, _>(lease.max_attempts),
            )))
            .await?;
        for chunk in parkable.chunks(ID_CHUNK) {
            let locked: Vec<Id> = conn
                .load(Statement::<LockParkable, _>::new((
                    ids(chunk),
                    bind::<Integer, _>(lease.max_attempts),
                )))
                .await?;
            if !locked.is_empty() {
                parked += conn
                    .execute(Statement::<ParkMany, _>::new((ids(&locked),)))
                    .await? as u64;
            }
        }
        // One abandoned message, alone; else up to `limit` pending ones.
        let mut taken = abandoned_one(conn, lease.max_attempts).await?;
        if taken.is_empty() {
            let limit = usize::try_from(lease.limit).unwrap_or(0);
            let mut after = Candidate::first();
            // Candidates other relays have locked meanwhile are skipped: the next ones are read.
            while taken.len() < limit {
                let wanted = i64::try_from(limit - taken.len()).unwrap_or(i64::MAX);
                let (available, again, id) = after.cursor();
                let candidates: Vec<Candidate> = conn
                    .load(Statement::<PendingCandidates, _>::new((
                        available,
                        again,
                        id,
                        bind::<BigInt, _>(wanted),
                    )))
                    .await?;
                let Some(last) = candidates.last() else {
                    break;
                };
                after = last.clone();
                for chunk in candidates.chunks(ID_CHUNK) {
                    let locked: Vec<Id> = conn
                        .load(Statement::<LockPending, _>::new((ids(chunk),)))
                        .await?;
                    taken.extend(locked);
                }
            }
        }
        if taken.is_empty() {
            return Ok(crate::store::Leased {
                parked,
                rows: Vec::new(),
            });
        }
        for chunk in taken.chunks(ID_CHUNK) {
            conn.execute(Statement::<TakeMany, _>::new((
                bind::<Text, _>(lease.owner),
                bind::<Nullable<BigInt>, _>(Some(lease.lease_micros)),
                ids(chunk),
            )))
            .await?;
        }
        let rows = conn
            .load(Statement::<Leased, _>::new((bind::<Text, _>(lease.owner),)))
            .await?;
        Ok(crate::store::Leased { parked, rows })
    }

    async fn committed_reads_next<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<bool> {
        // For the next transaction only: nothing to put back.
        next_transaction_at::<RepeatableReadNext, _>(conn)
            .await
            .map(|()| false)
    }

    async fn schema_version<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<Option<i32>> {
        super::shared::recorded_version::<_, SchemaVersion>(conn).await
    }

    async fn migrate<C: Store<Db = Self>>(
        conn: &mut C,
        lock_timeout: std::time::Duration,
    ) -> Result<(), crate::error::Error> {
        under_session_lock(
            conn,
            RELEASE_MIGRATION_LOCK,
            async |conn: &mut C| take_migration_lock(conn, lock_timeout).await,
            async |conn: &mut C| {
                // On Galera, two nodes migrating at once can abort each other's writes to
                // `idempotent_schema` (certification: a deadlock error); every step is
                // idempotent, so the pass runs again.
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    match crate::migrations::pass(conn, None).await {
                        Err(crate::error::Error::Migration { source, .. })
                            if attempt < 5
                                && crate::migration_failure::database_error(source.as_ref()).is_some_and(|error| {
                                    matches!(Self::classify(error), Fault::Deadlock | Fault::Serialization)
                                }) =>
                        {
                            tracing::info!(%source, attempt, "a concurrent migration aborted this one's write; running the steps again");
                            C::pause(std::time::Duration::from_millis(50 * attempt)).await;
                        }
                        result => return result,
                    }
                }
            },
        )
        .await
    }

    async fn shadowed_by_temporary<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> QueryResult<Vec<&'static str>> {
        let mut found = Vec::new();
        if temporary::<ShowCreateIdempotentSchema, _>(conn).await? {
            found.push("idempotent_schema");
        }
        if temporary::<ShowCreateDoneJobs, _>(conn).await? {
            found.push("done_jobs");
        }
        if temporary::<ShowCreateOutbox, _>(conn).await? {
            found.push("outbox");
        }
        Ok(found)
    }

    async fn where_tables_are<C: Store<Db = Self>>(_conn: &mut C) -> QueryResult<String> {
        Ok("this connection's database (or this user holds no privilege on it)".to_owned())
    }

    async fn session_charset<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<Option<String>> {
        let rows: Vec<crate::store::SettingRow> =
            conn.load(Statement::<SessionCharset, _>::new(())).await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|row| row.previous)
            .filter(|found| !found.is_empty()))
    }

    async fn session_clock_offset<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<Option<i64>> {
        let rows: Vec<TableCount> = conn
            .load(Statement::<SessionClockOffset, _>::new(()))
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|row| row.n / 1_000_000)
            .filter(|seconds| *seconds != 0))
    }

    /// MySQL checks the privileges of a statement when it explains it, without running it.
    async fn missing_privileges<C: Store<Db = Self>>(
        conn: &mut C,
        present: &[&'static str],
    ) -> QueryResult<Vec<SchemaProblem>> {
        let mut missing = Vec::new();
        for (privilege, table, probe) in PRIVILEGE_PROBES {
            if !present.contains(table) {
                continue;
            }
            if let Err(error) = conn.batch(probe).await {
                if super::message(&error).is_some_and(|m| m.contains("command denied")) {
                    missing.push(SchemaProblem::MissingPrivilege {
                        privilege,
                        object: format!("`{table}`"),
                        grant: format!("GRANT {privilege} ON {table} TO <the worker's user>"),
                    });
                } else {
                    return Err(error);
                }
            }
        }
        Ok(missing)
    }

    async fn table_rows<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
    ) -> QueryResult<Vec<String>> {
        let columns: Vec<Column> = conn
            .load(Statement::<TableColumns, _>::new((bind::<Text, _>(table),)))
            .await?;
        let row = columns
            .iter()
            .map(|c| {
                let column = super::backticked(&c.name);
                // Bytes, not text: cast to text, every byte that is not UTF-8 reads as `?`, and
                // `BIT(8)` 128 and 130 look alike. `BIT` and the spatial types are bytes too.
                let bytes = [
                    "binary",
                    "blob",
                    "bit",
                    "geom",
                    "point",
                    "linestring",
                    "polygon",
                ]
                .iter()
                .any(|kind| c.data_type.to_ascii_lowercase().contains(kind));
                let shown = if bytes {
                    format!("IFNULL(CONCAT('0x', HEX({column})), 'NULL')")
                } else if c.data_type.eq_ignore_ascii_case("float") {
                    // `QUOTE` shows a FLOAT with 6 significant digits (12345.67 and 12345.68 are
                    // both '12345.7'); as a DOUBLE it is shown exactly. `+ 0e0` rather than
                    // `CAST(.. AS DOUBLE)`, which MySQL before 8.0.17 does not know.
                    format!("QUOTE({column} + 0e0)")
                } else {
                    format!("QUOTE({column})")
                };
                // A value longer than `LARGE_VALUE` bytes by its length and SHA-256: a result past
                // `max_allowed_packet` reads NULL (a large value's hex, or a row of several), and
                // every such value read alike.
                format!(
                    "IF(LENGTH({column}) > {LARGE_VALUE}, \
                     CAST(CONCAT('sha256:', SHA2({column}, 256), ':', LENGTH({column})) AS CHAR), \
                     CAST({shown} AS CHAR))"
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        conn.text_rows(&format!(
            "SELECT CAST(CONCAT_WS(', ', {row}) AS CHAR) AS `row` FROM {}{}",
            super::backticked(table),
            every_row!()
        ))
        .await
    }
}

/// The bytes past which the test kit's snapshot reads a value by its length and digest
/// (`table_rows`).
const LARGE_VALUE: u32 = 4096;

/// Takes the migration lock, waiting for another migration up to `timeout`.
async fn take_migration_lock<C: Store<Db = MysqlDb>>(
    conn: &mut C,
    timeout: std::time::Duration,
) -> Result<(), crate::error::Error> {
    // GET_LOCK counts whole seconds.
    let seconds = i32::try_from(timeout.as_secs().max(1)).unwrap_or(i32::MAX);
    let rows: Vec<Acquired> = conn
        .load(Statement::<TakeMigrationLock, _>::new((
            bind::<Integer, _>(seconds),
        )))
        .await
        .map_err(crate::migrations::failed("idempotent_schema"))?;
    match rows.first().and_then(|r| r.acquired) {
        Some(1) => Ok(()),
        Some(_) => Err(crate::error::Error::Migration {
            table: "idempotent_schema",
            source: Box::new(crate::migrations::LockWait(format!(
                "another migration held the lock `idempotent_jobs:<database>` for more than {seconds} s; nothing was changed. Retry once it has finished (a stuck session holding it shows in SHOW PROCESSLIST)"
            ))),
        }),
        None => Err(crate::error::Error::Migration {
            table: "idempotent_schema",
            source: "GET_LOCK('idempotent_jobs:<database>') failed (it returned NULL: is a database selected?); nothing was changed".into(),
        }),
    }
}

/// Runs `steps` between `take` (a session lock) and `release`; a guard releases the lock however
/// `steps` end, or, dropped without the chance to (a dropped future), has the connection cleaned
/// up by [`Store::abandon`]. A failed release is reported beside the steps' own result, never
/// instead of it.
async fn under_session_lock<S: Store>(
    conn: &mut S,
    release: &'static str,
    take: impl AsyncFnOnce(&mut S) -> Result<(), crate::error::Error>,
    steps: impl AsyncFnOnce(&mut S) -> Result<(), crate::error::Error>,
) -> Result<(), crate::error::Error> {
    // Armed before the lock is asked for: a future dropped while `GET_LOCK` is on its way may
    // still take the lock on the server, so the connection must be given up as if it held it.
    let mut lock = SessionLock {
        conn,
        release,
        held: true,
    };
    if let Err(error) = take(&mut *lock.conn).await {
        // The lock was not taken (a timeout or an error before the answer arrived and was read).
        lock.held = false;
        return Err(error);
    }
    let result = steps(&mut *lock.conn).await;
    let released = lock.conn.batch(release).await;
    lock.held = false;
    match (result, released) {
        (result, Ok(())) => result,
        (Ok(()), Err(error)) => Err(crate::error::Error::Migration {
            table: "idempotent_schema",
            source: format!(
                "the migration succeeded, but releasing its lock failed ({error}); close this connection, which releases the lock"
            )
            .into(),
        }),
        (Err(error), Err(release_error)) => {
            tracing::error!(%release_error, "releasing the migration lock failed after the migration failed");
            lock.conn.abandon(Unfinished::SessionLock(release));
            Err(error)
        }
    }
}

/// Sets the session's `innodb_lock_wait_timeout`, in whole seconds.
async fn set_lock_wait<C: Store<Db = MysqlDb>>(conn: &mut C, seconds: u64) -> QueryResult<()> {
    let seconds = i64::try_from(seconds).unwrap_or(i64::MAX);
    conn.execute(Statement::<SetLockWaitTimeout, _>::new((
        bind::<BigInt, _>(seconds),
    )))
    .await
    .map(drop)
}

/// What a claim's `INSERT` (or the `CALL` that ran it) came to: inserted, or, on the key's
/// duplicate, the row that holds it, read with `FOR UPDATE` (under REPEATABLE READ a plain read
/// may miss the row whose duplicate was just hit).
async fn claimed<C: Store<Db = MysqlDb>>(
    conn: &mut C,
    claim: &Claim<'_>,
    inserted: QueryResult<usize>,
) -> QueryResult<ClaimAttempt> {
    match inserted {
        Ok(_) => return Ok(ClaimAttempt::Inserted),
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {}
        Err(error) => return Err(error),
    }
    let rows: Vec<DoneRow> = conn
        .load(Statement::<ClaimRead, _>::new((bind::<Binary, _>(
            &claim.digest[..],
        ),)))
        .await?;
    Ok(super::shared::found(rows.into_iter().next()))
}

struct SessionLock<'a, S: Store> {
    conn: &'a mut S,
    release: &'static str,
    held: bool,
}

impl<S: Store> Drop for SessionLock<'_, S> {
    fn drop(&mut self) {
        if self.held {
            self.conn.abandon(Unfinished::SessionLock(self.release));
        }
    }
}

/// How a transaction of the runtime's own begins as text: `START TRANSACTION`, which every
/// `sql_mode` reads as itself (MariaDB's `ORACLE` reads `BEGIN` as the start of a PL/SQL block,
/// error 1064).
const BEGIN: &str = <MysqlDb as crate::store::Database>::BEGIN;

/// How a job's own transaction begins: with the job's savepoint, which every statement that ends
/// or replaces the transaction (an implicit commit, `START TRANSACTION`, ...) removes; see
/// `Store::begin_job`.
/// Refused first, with nothing begun, on a session that holds a transaction of its own
/// (`nothing_open!()`).
const BEGIN_JOB: &str = concat!(
    nothing_open!(),
    "; START TRANSACTION; SAVEPOINT idempotent_job"
);
/// The message of the duplicate-key error `idempotent_begin_and_claim` raises after rolling back
/// (see `004_job_procedures.sql`); a procedure made before it did, which left the transaction
/// open, raised the server's own.
const TAKEN_AND_ROLLED_BACK: &str =
    "idempotent-jobs: the key is taken; the claim's transaction was rolled back";
/// [`TAKEN_AND_ROLLED_BACK`] on a session with `autocommit = 0`, where a read outside any
/// transaction would open one (and find nothing: `read_guard!()`).
const TAKEN_AND_ROLLED_BACK_AUTOCOMMIT_OFF: &str =
    "idempotent-jobs: the key is taken; the claim's transaction was rolled back; autocommit = 0";
/// The message the job procedures raise instead of the server's own (1568) on a session that
/// holds a transaction of its own: nothing was begun.
const HOLDS_A_TRANSACTION: &str =
    "idempotent-jobs: the session holds a transaction of its own; nothing was done in it";
/// The server's own message for 1568, as [`BEGIN_JOB`] and [`RefuseOpen`] meet it.
const CANNOT_CHANGE_CHARACTERISTICS: &str = "Transaction characteristics can't be changed";
const RELEASE_JOB: &str = "RELEASE SAVEPOINT idempotent_job";

#[cfg(feature = "mysql")]
/// When this process tries the job procedures again after a `CALL` found them missing (or not
/// callable): milliseconds since [`epoch`]; 0 while they are called. Process-wide, as the
/// statement cache's knowledge of the server is: a process whose procedures are missing pays one
/// failed `CALL` a minute, and takes them up within a minute of a `migrate` that makes them.
static PROCEDURES_RETRY_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(feature = "mysql")]
/// How long a process runs jobs without the procedures once a `CALL` found them missing.
const WITHOUT_PROCEDURES_FOR: std::time::Duration = std::time::Duration::from_secs(60);

#[cfg(feature = "mysql")]
fn epoch() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

#[cfg(feature = "mysql")]
fn millis_since_epoch() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(feature = "mysql")]
/// Whether jobs open and close their transactions with the procedures now.
fn procedures_callable() -> bool {
    let retry_at = PROCEDURES_RETRY_AT.load(std::sync::atomic::Ordering::Relaxed);
    retry_at == 0 || millis_since_epoch() >= retry_at
}

#[cfg(feature = "mysql")]
/// A `CALL` of a job procedure succeeded.
fn procedures_called() {
    PROCEDURES_RETRY_AT.store(0, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(feature = "mysql")]
/// A `CALL` of a job procedure failed with `error`: when the procedure is missing or may not be
/// called, this process goes on without them for a while (correct, four round trips more per
/// job: 7 where they take 3) and says so. Whether it did.
///
/// Only a refusal that names one of the procedures (missing, 1305; `EXECUTE` denied, 1370; in
/// any language, whose messages keep the routine's name): then nothing ran. Any other failure
/// came from inside the procedure, whose transaction is open: an `INSERT` on `done_jobs` denied
/// (1142, "command denied" too), or a definer gone (1449: the procedures run as their invoker,
/// so that is a trigger's or a view's on a table they use).
fn without_procedures(error: &DieselError) -> bool {
    let missing = super::message(error).is_some_and(|m| {
        [
            "idempotent_begin_job",
            "idempotent_begin_and_claim",
            "idempotent_finish_job",
        ]
        .iter()
        .any(|routine| m.contains(routine))
    });
    if missing {
        let retry_at = millis_since_epoch()
            .saturating_add(WITHOUT_PROCEDURES_FOR.as_millis() as u64)
            .max(1);
        if PROCEDURES_RETRY_AT.swap(retry_at, std::sync::atomic::Ordering::Relaxed) == 0 {
            tracing::warn!(%error, "the stored procedures of the runtime's schema version 4 are missing or may not be called: jobs run without them, with four more round trips each (7 where they take 3), and try them again in a minute; run migrate (as a role that may create routines) and grant EXECUTE on them to the workers' role");
        }
    }
    missing
}

/// Set once a server refused a prepared `BEGIN` or savepoint statement (MySQL, up to 9, refuses
/// them with `ER_UNSUPPORTED_PS`; MariaDB prepares them): from then on this process sends them as
/// text.
static TEXT_TRANSACTIONS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn savepoints_as_text() -> bool {
    TEXT_TRANSACTIONS.load(std::sync::atomic::Ordering::Relaxed)
}

fn use_text_for_transactions() {
    TEXT_TRANSACTIONS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the server refused to prepare a statement (`ER_UNSUPPORTED_PS`, 1295), which Diesel
/// reports by its message only.
fn refuses_prepared(error: &DieselError) -> bool {
    super::message(error).is_some_and(|m| m.contains("prepared statement protocol"))
}

#[cfg(feature = "mysql")]
sync_store!(diesel::MysqlConnection, MysqlDb, begin: BEGIN, job: BEGIN_JOB, transactions: prepared::begin, prepared::begin_job, prepared::commit, prepared::rollback, one_batch: savepoints_as_text() || procedures_callable(), finish: prepared::release_and_commit, pipelined: prepared::begin_job_claiming, failed_read: forget_prepared_statements);

/// Empties the connection's prepared statement cache, closing each statement; the next run of
/// each prepares it afresh (see `Store::after_failed_read`). libmariadb leaves a statement whose
/// result failed after its header (the header is the column count; MariaDB sends rows, or with
/// cached metadata nothing more, before an error found while reading them) waiting for that
/// result: its next `mysql_stmt_execute` reads for a result that never comes and blocks with no
/// timeout, while closing it sends nothing it waits for. Diesel's cache keeps the statement for
/// its next run. The cache is left on (Diesel's default): a connection whose application turned
/// it off gets it back, which changes nothing but speed.
#[cfg(feature = "mysql")]
fn forget_prepared_statements(conn: &mut diesel::MysqlConnection) {
    use diesel::connection::{CacheSize, Connection as _};
    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
    conn.set_prepared_statement_cache_size(CacheSize::Unbounded);
}

/// `BEGIN`, `COMMIT` and `ROLLBACK` on the sync `MysqlConnection` as cached prepared statements:
/// one round trip each. Diesel sends them as a text batch, which for MySQL is three (multi-statement
/// mode switched on, the statement, switched off again).
///
/// MariaDB prepares all three. MySQL (up to 9) prepares `COMMIT` and `ROLLBACK` but refuses
/// `BEGIN` (`ER_UNSUPPORTED_PS`, 1295): the first refusal switches this process back to Diesel's
/// way, with the savepoint MySQL needs to notice an implicit commit (see `transaction_ended_early`).
/// A savepoint inside the caller's transaction always goes Diesel's way.
#[cfg(feature = "mysql")]
pub(crate) mod prepared {
    use diesel::MysqlConnection;
    use diesel::connection::{
        AnsiTransactionManager, TransactionDepthChange, TransactionManager,
        TransactionManagerStatus,
    };
    use diesel::result::{Error as DieselError, QueryResult};

    use crate::sql::Statement;
    use crate::store::Nesting;

    sql! {
        Begin = "START TRANSACTION";
        Commit = "COMMIT AND NO CHAIN NO RELEASE";
        Rollback = "ROLLBACK AND NO CHAIN NO RELEASE";
        CallBeginJob = "CALL idempotent_begin_job()";
        CallFinishJob = "CALL idempotent_finish_job()";
    }

    /// Ends the top-level transaction with `S` (`AND NO CHAIN NO RELEASE`: see
    /// `Database::COMMIT`), prepared, or as the text `text` where the server refuses savepoints
    /// in prepared statements (Diesel's own `COMMIT` would chain or end the session as the
    /// session's `completion_type` says).
    fn end_top_level<S: crate::sql::SqlText>(
        conn: &mut MysqlConnection,
        text: &str,
    ) -> QueryResult<()> {
        if super::savepoints_as_text() {
            return diesel::connection::SimpleConnection::batch_execute(conn, text);
        }
        diesel::RunQueryDsl::execute(Statement::<S, _>::new(()), conn).map(drop)
    }

    /// Whether the next transaction is a top-level one sent as prepared statements.
    fn prepared_top_level_next(conn: &mut MysqlConnection) -> QueryResult<bool> {
        Ok(!super::savepoints_as_text() && crate::db::depth_sync(conn)? == 0)
    }

    /// Opens a job's own transaction by running `first`, a `CALL` of the schema's procedure that
    /// begins it and inserts the claim (`Store::begin_job_pipelined`); `None`, with nothing open,
    /// where the procedures are not called or a transaction is open already. A `CALL` that found
    /// the key taken has rolled back: its error, with nothing open
    /// (`Database::taken_with_nothing_open`); so has one that refused a transaction of the
    /// session's own (`Database::inside_callers_transaction`), which it did not begin. Any other failing `CALL` but a lost connection has
    /// begun the transaction (`START TRANSACTION` fails no other way) and failed at the claim,
    /// whose error is returned with the open transaction.
    pub(crate) fn begin_job_claiming<S, B>(
        conn: &mut MysqlConnection,
        first: Statement<S, B>,
    ) -> Option<QueryResult<(Nesting, QueryResult<usize>)>>
    where
        S: crate::sql::SqlText,
        B: crate::sql::Binds<diesel::mysql::Mysql> + Send,
    {
        if !super::procedures_callable() {
            return None;
        }
        match prepared_top_level_next(conn) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(error) => return Some(Err(error)),
        }
        let ran = match diesel::RunQueryDsl::execute(first, conn) {
            Err(error) if <super::MysqlDb as crate::store::Database>::connection_lost(&error) => {
                return Some(Err(error));
            }
            Err(error) if super::without_procedures(&error) => return None,
            Err(error)
                if <super::MysqlDb as crate::store::Database>::taken_with_nothing_open(&error)
                    || <super::MysqlDb as crate::store::Database>::inside_callers_transaction(
                        &error,
                    ) =>
            {
                super::procedures_called();
                return Some(Err(error));
            }
            ran => ran,
        };
        if ran.is_ok() {
            super::procedures_called();
        }
        Some(
            change_depth(conn, TransactionDepthChange::IncreaseDepth)
                .map(|()| (Nesting::Outermost, ran)),
        )
    }

    /// Releases the job's savepoint and commits in one round trip (`Store::release_and_commit`):
    /// a prepared `CALL` of `idempotent_finish_job`, which stops before its `COMMIT` when the
    /// release fails; as text where the server refuses savepoints in prepared statements. A
    /// procedure gone since the job began: the release and the commit one after the other.
    pub(crate) fn release_and_commit(conn: &mut MysqlConnection) -> QueryResult<()> {
        if super::savepoints_as_text() {
            return diesel::connection::SimpleConnection::batch_execute(
                conn,
                <super::MysqlDb as crate::store::Database>::release_and_commit_sql(),
            );
        }
        match diesel::RunQueryDsl::execute(Statement::<CallFinishJob, _>::new(()), conn) {
            Err(error) if super::without_procedures(&error) => {
                diesel::RunQueryDsl::execute(
                    Statement::<crate::store::ReleaseJob, _>::new(()),
                    conn,
                )?;
                diesel::RunQueryDsl::execute(Statement::<Commit, _>::new(()), conn).map(drop)
            }
            finished => finished.map(drop),
        }
    }

    fn change_depth(conn: &mut MysqlConnection, change: TransactionDepthChange) -> QueryResult<()> {
        match <AnsiTransactionManager as TransactionManager<MysqlConnection>>::transaction_manager_status_mut(conn) {
            TransactionManagerStatus::Valid(valid) => match valid.change_transaction_depth(change) {
                // The connection may have noticed the end of the transaction itself.
                Ok(()) | Err(DieselError::NotInTransaction) => Ok(()),
                Err(error) => Err(error),
            },
            TransactionManagerStatus::InError => Err(DieselError::BrokenTransactionManager),
        }
    }

    fn set_in_error(conn: &mut MysqlConnection) {
        <AnsiTransactionManager as TransactionManager<MysqlConnection>>::transaction_manager_status_mut(conn)
            .set_in_error();
    }

    /// Opens a transaction, or a savepoint inside the caller's.
    pub(crate) fn begin(conn: &mut MysqlConnection, text: &str) -> QueryResult<Nesting> {
        if super::savepoints_as_text() || crate::db::depth_sync(conn)? > 0 {
            return crate::db::begin_sync::<super::MysqlDb, _>(conn, text);
        }
        match diesel::RunQueryDsl::execute(Statement::<Begin, _>::new(()), conn) {
            Ok(_) => {
                change_depth(conn, TransactionDepthChange::IncreaseDepth)?;
                Ok(Nesting::Outermost)
            }
            Err(error) if super::refuses_prepared(&error) => {
                super::use_text_for_transactions();
                crate::db::begin_sync::<super::MysqlDb, _>(conn, text)
            }
            Err(error) => Err(error),
        }
    }

    /// Opens a job's own transaction (`text` as a fallback: `BEGIN` and the job's savepoint), or a
    /// savepoint inside the caller's: a prepared `BEGIN`, one round trip where a text batch takes
    /// three (multi-statement mode on, the batch, off), and the job's savepoint, prepared too,
    /// after the claim ([`Nesting::Unmarked`]).
    ///
    /// With the schema's stored procedures (version 4), one prepared `CALL` of
    /// `idempotent_begin_job` opens the transaction with the savepoint: one round trip.
    pub(crate) fn begin_job(conn: &mut MysqlConnection, text: &str) -> QueryResult<Nesting> {
        if super::procedures_callable() && prepared_top_level_next(conn)? {
            match diesel::RunQueryDsl::execute(Statement::<CallBeginJob, _>::new(()), conn) {
                Ok(_) => {
                    super::procedures_called();
                    change_depth(conn, TransactionDepthChange::IncreaseDepth)?;
                    return Ok(Nesting::Outermost);
                }
                // Missing: the `BEGIN` below opens the transaction (ending, empty, any the
                // procedure had begun before it failed).
                Err(error) if super::without_procedures(&error) => {}
                Err(error) => return Err(error),
            }
        }
        if prepared_top_level_next(conn)? {
            // `START TRANSACTION` would commit a transaction the session holds of its own.
            refuse_open(conn)?;
        }
        let nesting = begin(conn, text)?;
        if nesting == Nesting::Savepoint || super::savepoints_as_text() {
            // A savepoint of Diesel's, or the text batch that set the job's savepoint too.
            return Ok(nesting);
        }
        // The job's savepoint is a prepared statement of its own here: it goes after the claim
        // (`Database::set_job_savepoint`), where a body that rolls back to it cannot take the
        // claim with it.
        Ok(Nesting::Unmarked)
    }

    /// Refuses a session that holds a transaction of its own (`RefuseOpen`), as text where the
    /// server refuses to prepare the statement.
    fn refuse_open(conn: &mut MysqlConnection) -> QueryResult<()> {
        match diesel::RunQueryDsl::execute(Statement::<super::RefuseOpen, _>::new(()), conn) {
            Err(error) if super::refuses_prepared(&error) => {
                diesel::connection::SimpleConnection::batch_execute(
                    conn,
                    <super::RefuseOpen as crate::sql::SqlText>::SQL,
                )
            }
            refused => refused.map(drop),
        }
    }

    /// Commits the innermost transaction. As Diesel does, a failed top-level `COMMIT` is rolled
    /// back, and a connection that cannot roll back is marked broken.
    pub(crate) fn commit(conn: &mut MysqlConnection) -> QueryResult<()> {
        if crate::db::depth_sync(conn)? != 1 {
            return <AnsiTransactionManager as TransactionManager<MysqlConnection>>::commit_transaction(conn);
        }
        match end_top_level::<Commit>(conn, super::COMMIT) {
            Ok(()) => change_depth(conn, TransactionDepthChange::DecreaseDepth),
            Err(commit_error) => match rollback(conn) {
                Ok(()) => Err(commit_error),
                Err(rollback_error) => {
                    set_in_error(conn);
                    Err(DieselError::RollbackErrorOnCommit {
                        rollback_error: Box::new(rollback_error),
                        commit_error: Box::new(commit_error),
                    })
                }
            },
        }
    }

    /// Rolls the innermost transaction back; a connection that cannot is marked broken, so that
    /// nothing later commits into what is left of the transaction.
    pub(crate) fn rollback(conn: &mut MysqlConnection) -> QueryResult<()> {
        if crate::db::depth_sync(conn)? != 1 {
            return <AnsiTransactionManager as TransactionManager<MysqlConnection>>::rollback_transaction(conn);
        }
        match end_top_level::<Rollback>(conn, super::ROLLBACK) {
            Ok(()) => change_depth(conn, TransactionDepthChange::DecreaseDepth),
            Err(error) => {
                set_in_error(conn);
                Err(error)
            }
        }
    }
}

#[cfg(feature = "async-mysql")]
async_store!(diesel_async::AsyncMysqlConnection, MysqlDb, begin: BEGIN, job: BEGIN_JOB, cancel_safe: false);

#[cfg(all(test, feature = "mysql"))]
mod tests {
    use crate::retry::{Retry, key_kept_changing};

    /// A statement an operator stopped with `KILL QUERY` (the job's record, or its `COMMIT`
    /// waiting for a backup lock): the statement rolled back, the transaction with it at a
    /// `COMMIT`, and the runtime rolls back the rest. Its error says retrying helps, in the
    /// server's words or numbered in another language, and the runtime does not retry it on its
    /// own. Before, it said retrying does not help, and the redelivery then ran.
    #[test]
    fn a_statement_killed_at_a_request_is_retryable_not_retried() {
        use crate::store::{Database as _, Fault};
        let error = |message: &str| {
            diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::Unknown,
                Box::new(message.to_owned()),
            )
        };
        for killed in [
            error("Query execution was interrupted"),
            super::in_english(error("Abfrage wurde unterbrochen"), 1317),
        ] {
            assert!(super::MysqlDb::passes(&killed), "{killed}");
            assert_eq!(super::MysqlDb::classify(&killed), Fault::Other, "{killed}");
        }
    }

    /// A claim whose key kept changing under it is counted as that, not as the deadlock MySQL's
    /// classification makes of a serialization failure ("614 deadlocks" before, for a claim that
    /// never met one).
    #[test]
    fn a_key_that_kept_changing_is_not_counted_as_a_deadlock() {
        let mut retry = Retry::new();
        assert!(
            retry
                .failed::<super::MysqlDb>(&key_kept_changing())
                .is_some()
        );
        assert!(retry.exhausted::<super::MysqlDb>(&key_kept_changing()));
        assert_eq!(
            retry.explain(),
            "1 times the key's row changed under the claim (pruned or renewed by other workers; where none runs, a trigger on `done_jobs` that drops or changes the claim's row)"
        );
    }

    /// MariaDB 10.11's own words (`lc_messages` German and English), as Diesel passes them on:
    /// a job procedure missing (1305) or not callable (1370) is known in either language, by the
    /// routine's name; an `INSERT` on `done_jobs` denied (1142, from inside the procedure, whose
    /// transaction is open) is not. Before, the German 1305 and 1370 were not known (every job
    /// failed at its claim while the procedures were missing), and the 1142 was taken for the
    /// procedure's own refusal (its transaction left open; tests/mysql_procedures.rs
    /// `a_role_that_may_not_claim_leaves_no_transaction_open`).
    #[test]
    fn only_a_refusal_of_a_job_procedure_means_none_ran() {
        use diesel::result::{DatabaseErrorKind, Error};
        let error = |text: &str| {
            Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(text.to_owned()))
        };
        for refused in [
            "PROCEDURE jobs.idempotent_begin_and_claim existiert nicht (MySQL error 1305: does not exist)",
            "PROCEDURE jobs.idempotent_begin_and_claim does not exist",
            "Befehl execute nicht zulässig für Benutzer 'w'@'%' in Routine 'jobs.idempotent_begin_job'",
            "execute command denied to user 'w'@'%' for routine 'jobs.idempotent_finish_job'",
        ] {
            assert!(super::without_procedures(&error(refused)), "{refused}");
        }
        for inside in [
            "INSERT command denied to user 'w'@'127.0.0.1' for table `jobs`.`done_jobs`",
            "INSERT Befehl nicht erlaubt für Benutzer 'w'@'127.0.0.1' auf Tabelle `jobs`.`done_jobs`",
            "Deadlock found when trying to get lock; try restarting transaction",
            "The user specified as a definer ('gone'@'%') does not exist",
        ] {
            assert!(!super::without_procedures(&error(inside)), "{inside}");
        }
    }
}

/// `limit` as InnoDB's lock wait: whole seconds, rounded up, at least 1 (its smallest wait) and at
/// most 1,073,741,824 (its largest, 34 years: `Duration::MAX` waits that long, where the sum
/// overflowed, to 0 and so 1 s in a release build, a panic in a debug one). The session keeps it
/// until restored.
fn lock_wait_seconds(limit: std::time::Duration) -> u64 {
    limit
        .as_secs()
        .saturating_add(u64::from(limit.subsec_nanos() > 0))
        .clamp(1, 1_073_741_824)
}

#[cfg(test)]
mod lock_wait_tests {
    use std::time::Duration;

    #[test]
    fn lock_waits_round_up_and_never_overflow() {
        for (limit, seconds) in [
            (Duration::ZERO, 1),
            (Duration::from_millis(1), 1),
            (Duration::from_millis(1_001), 2),
            (Duration::from_secs(50), 50),
            (Duration::from_secs(u64::MAX), 1_073_741_824),
            (Duration::MAX, 1_073_741_824),
        ] {
            assert_eq!(super::lock_wait_seconds(limit), seconds, "{limit:?}");
        }
    }
}

#[cfg(test)]
mod lease_tests {
    use crate::sql::SqlText;

    #[test]
    fn each_id_list_holds_one_chunk() {
        assert_eq!(id_list!().matches('?').count(), super::ID_CHUNK);
        assert!(
            super::AbandonedCandidates::SQL.ends_with(&format!("LIMIT {}", super::ID_CHUNK)),
            "the abandoned candidates fill one id list"
        );
    }
}

#[cfg(test)]
mod error_number_tests {
    use super::error_number_of;

    #[test]
    fn the_error_is_the_last_condition_kept_but_for_procedure_notes() {
        // [kept, last, first, second, third, fourth]
        let cases = [
            ("[1, 1205, 1205, null, null, null]", Some(1205)),
            // An error in a procedure, and MariaDB's notes of where.
            ("[3, 4094, 1205, 4094, 4094, null]", Some(1205)),
            // A warning raised before the error.
            ("[2, 1062, 1264, 1062, null, null]", Some(1062)),
            // Nothing kept (`max_error_count = 0`): the variables hold an earlier error's numbers.
            ("[0, 1205, 1205, 1205, null, null]", None),
            // More conditions than read: the last, unless it is a note.
            ("[9, 1213, 1264, 1264, 1264, 1264]", Some(1213)),
            ("[9, 4094, 1264, 1264, 1264, 1264]", None),
            ("not json", None),
        ];
        for (row, expected) in cases {
            assert_eq!(error_number_of(row), expected, "{row}");
        }
    }
}
