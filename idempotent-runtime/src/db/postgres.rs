//! PostgreSQL: every statement, error, lock, migration and inspection query, for `PgConnection`
//! and diesel-async's `AsyncPgConnection`.
//!
//! * Transactions begin with a plain `BEGIN`, at the session's isolation level. At READ COMMITTED
//!   (the default) a racing worker waits for the winner's commit and then replays; at stricter
//!   levels its serialization failure is retried from `BEGIN`. (`BEGIN ISOLATION LEVEL READ
//!   COMMITTED` measured 10 µs slower per job.)
//! * Times are `timestamp` UTC from `clock_timestamp() AT TIME ZONE 'UTC'`: the server's clock at
//!   the moment of the statement (not `now()`, which is the transaction's start), independent of
//!   the session's `TimeZone`.
//! * The claim is `INSERT ... ON CONFLICT DO NOTHING`, the statement a hand-written claim is; only
//!   when it inserts nothing does a second statement read the row that holds the key (at READ
//!   COMMITTED its new snapshot sees the row a racing worker committed while the insert waited).
//!   One statement doing both, a data-modifying CTE, measured slower for every fresh job than the
//!   second statement costs the rarer replay through the claim; redeliveries read first anyway
//!   (`crate::redelivery`).
//! * Migrations run in one transaction (PostgreSQL's DDL is transactional) under an advisory lock
//!   that the commit releases: nothing can leave it held. The version check before it is in a
//!   transaction too, so every statement the jobs and migrations run is inside one: PgBouncer in
//!   transaction pooling mode keeps a client on one server connection only within a transaction.
//!
//! # Adding a column to a busy `done_jobs` later
//!
//! `ALTER TABLE done_jobs ADD COLUMN c type NULL` (no default, or a constant default on 11+) only
//! changes the catalog; it needs an `ACCESS EXCLUSIVE` lock for an instant, so a migration step
//! sets `lock_timeout` first and retries rather than queue behind long transactions and block
//! every claim behind it. Indexes are built with `CREATE INDEX CONCURRENTLY`, outside the
//! migration's transaction.

use diesel::pg::Pg;
use diesel::result::{DatabaseErrorKind, Error as DieselError, QueryResult};
use diesel::sql_types::{BigInt, Binary, Bool, Integer, Nullable, Text};

use crate::migrations::TableCount;
use crate::schema_problem::SchemaProblem;
use crate::sql::{Statement, bind};
use crate::store::{Claim, ClaimAttempt, Database, Fault, Lease, LeasedRow, Nesting, Store};

/// PostgreSQL (features `postgres`, `async-postgres`).
#[derive(Debug, Clone, Copy)]
pub struct PostgresDb;

macro_rules! now {
    () => {
        "(clock_timestamp() AT TIME ZONE 'UTC')"
    };
}

/// The claim token bound at `?`, in a claim of a job's own transaction: an error that names
/// [`OUTSIDE_JOB`](crate::error::OUTSIDE_JOB) when the claim does not run in a transaction that [`begin_job`] opened (its
/// transaction-local mark is not there), and one that names [`INSIDE_CALLERS`] when the
/// transaction has written already, that is, when the job's `BEGIN` was only a warning inside a
/// transaction of the caller's that Diesel does not know of (a `BEGIN` sent as text). The job's
/// savepoint, set before the claim, lets the runtime undo the second error and leave the
/// caller's transaction as it was.
///
/// The mark: a claim must never run outside the job's transaction, where it would commit on its
/// own and the body after it too. A connection's statements can reach the server outside the
/// transaction it opened when the transport between them loses track: PgBouncer 1.18 in
/// transaction mode, with another client sending a prepared statement's two exchanges outside a
/// transaction (diesel-async's own `establish`), sent one worker's `BEGIN` to one server
/// connection and its claim and its body's insert to two others, outside any transaction; the
/// release then failed, the claim was taken back as a body's `COMMIT`'s would be, and the job
/// ran twice (tests `pgbouncer_crossed_by_other_clients_tells_every_outcome_truly` in
/// tests/cluster.rs, and `*_job_whose_begin_never_took_effect_commits_nothing` in
/// tests/jobs/pipeline.rs, which blanks the `BEGIN` on its way). Sent with `BEGIN` in the same
/// flight (diesel-async), the claim is refused the same way when that `BEGIN` failed. Not folded
/// at planning: it reads the session's settings and the transaction's id.
///
/// Its cost, the `SET LOCAL` in `begin_job`'s batch and the reads here: sync `macro/floor`
/// 1.080 and 1.089 against 1.054 and 1.069 before, taking turns in one machine's runs (2-3%). The
/// alternative measured, no `SET LOCAL` and a `RETURNING` that refuses a row whose `xmin` is the
/// transaction's own (not a savepoint's), cost the same (1.078 and 1.068 against 1.055 and
/// 1.050); `BEGIN DEFERRABLE` as the mark cost nothing but aborts a caller's transaction that
/// has run a statement ("SET TRANSACTION [NOT] DEFERRABLE must be called before any query").
macro_rules! own_claim_token {
    () => {
        "CASE WHEN current_setting('idempotent.job', true) IS DISTINCT FROM 'on' THEN CAST('idempotent-jobs: the claim did not run in the job''s transaction (idempotent.job = ' || COALESCE(quote_literal(current_setting('idempotent.job', true)), 'unset') || ')' AS BIGINT) \
         WHEN txid_current_if_assigned() IS NULL THEN ? \
         ELSE CAST('idempotent-jobs: the session holds a transaction of its own, xid ' || CAST(txid_current_if_assigned() AS text) AS BIGINT) END"
    };
}

/// PostgreSQL's "deadlock detected" (SQLSTATE 40P01) in English and in each language of its
/// message catalogs (PostgreSQL 15's; a server answers in its `lc_messages`, which `initdb` takes
/// from the locale it was set up in). Test `server_messages_are_known_in_every_language` checks
/// these against the catalogs installed beside the server.
pub(crate) const DEADLOCK_DETECTED: &[&str] = &[
    "deadlock detected",
    "Verklemmung (Deadlock) entdeckt",
    "se ha detectado un deadlock",
    "interblocage (deadlock) détecté",
    "rilevato deadlock",
    "デッドロックを検出しました",
    "ნაპოვნია ურთიერთბლოკირება",
    "deadlock 발생했음",
    "обнаружена взаимоблокировка",
    "deadlock upptäckt",
    "виявлено взаємне блокування",
    "检测到死锁",
    "發現死結",
];
/// PostgreSQL's "canceling statement due to lock timeout" and "... statement timeout" (SQLSTATE
/// 55P03, 57014), as [`DEADLOCK_DETECTED`].
pub(crate) const WAIT_CANCELED: &[&str] = &[
    "canceling statement due to lock timeout",
    "canceling statement due to statement timeout",
    "storniere Anfrage wegen Zeitüberschreitung einer Sperre",
    "storniere Anfrage wegen Zeitüberschreitung der Anfrage",
    "cancelando la sentencia debido a que se agotó el tiempo de espera de candados (locks)",
    "cancelando la sentencia debido a que se agotó el tiempo de espera de sentencias",
    "annulation de la requête à cause du délai écoulé pour l'obtention des verrous",
    "annulation de la requête à cause du délai écoulé pour l'exécution de l'instruction",
    "annullamento dell'istruzione a causa di timeout di lock",
    "annullamento dell'istruzione a causa di timeout",
    "ロックのタイムアウトのためステートメントをキャンセルしています",
    "ステートメントのタイムアウトのためステートメントをキャンセルしています",
    "გამოსახულება გაუქმდება ბლოკის მოლოდინის ვადის ამოწურვის გამო",
    "잠금 대기 시간 초과로 작업을 취소합니다.",
    "명령실행시간 초과로 작업을 취소합니다.",
    "выполнение оператора отменено из-за тайм-аута блокировки",
    "выполнение оператора отменено из-за тайм-аута",
    "avbryter sats på grund av lås-timeout",
    "avbryter sats på grund av sats-timeout",
    "виконання оператора скасовано через тайм-аут блокування",
    "виконання оператора скасовано через тайм-аут",
    "由于锁超时，正在取消语句",
    "由于语句执行超时，正在取消语句",
    "由於鎖定逾時，正在取消敘述",
    "因為陳述式逾時，正在取消陳述式",
];

/// PostgreSQL's "canceling statement due to user request" (SQLSTATE 57014, `pg_cancel_backend`),
/// as [`DEADLOCK_DETECTED`].
pub(crate) const USER_CANCELED: &[&str] = &[
    "canceling statement due to user request",
    "storniere Anfrage wegen Benutzeraufforderung",
    "cancelando la sentencia debido a una petición del usuario",
    "annulation de la requête à la demande de l'utilisateur",
    "annullamento dell'istruzione su richiesta dell'utente",
    "ユーザーからの要求により文をキャンセルしています",
    "사용자 요청에 의해 작업을 취소합니다.",
    "выполнение оператора отменено по запросу пользователя",
    "avbryter sats på användares begäran",
    "виконання оператора скасовано по запиту користувача",
    "由于用户请求，正在取消语句",
    "因為使用者要求，正在取消陳述式",
];

/// PostgreSQL's "current transaction is aborted, commands ignored until end of transaction block"
/// (SQLSTATE 25P02), as [`DEADLOCK_DETECTED`] (the French one up to its line break).
pub(crate) const IN_FAILED_TRANSACTION: &[&str] = &[
    "current transaction is aborted, commands ignored until end of transaction block",
    "aktuelle Transaktion wurde abgebrochen, Befehle werden bis zum Ende der Transaktion ignoriert",
    "transacción abortada, las órdenes serán ignoradas hasta el fin de bloque de transacción",
    "la transaction est annulée, les commandes sont ignorées jusqu'à la fin du bloc",
    "la transazione corrente è interrotta, i comandi saranno ignorati fino alla fine del blocco della transazione",
    "現在のトランザクションがアボートしました。トランザクションブロックが終わるまでコマンドは無視されます",
    "현재 트랜잭션은 중지되어 있습니다. 이 트랜잭션을 종료하기 전까지는 모든 명령이 무시될 것입니다",
    "текущая транзакция прервана, команды до конца блока транзакции игнорируются",
    "aktuella transaktionen har avbrutits, alla kommandon ignoreras tills slutet på transaktionen",
    "поточна транзакція перервана, команди до кінця блока транзакції пропускаються",
    "当前事务已中止，事务块结束之前的命令将被忽略",
    "目前交易已中止，忽略指令直到交易區塊結尾",
];

/// What the error [`own_claim_token`] raises says of a transaction that has written already.
const INSIDE_CALLERS: &str = "idempotent-jobs: the session holds a transaction of its own";

/// The server's clock as a bound an index can search by, in the conditions that choose rows by a
/// time (due, lapsed, old enough to prune). `clock_timestamp()` is volatile: a condition on it is
/// checked row by row and never bounds an index scan, so a lease with nothing due walked
/// `outbox_pending` past every message backing off (measured with 995,000: 0.3 s a round), and a
/// prune's last batch walked every key that expires later. Read once by a subquery (an
/// `InitPlan`), it is one value the index searches to.
macro_rules! now_bound {
    () => {
        "(SELECT clock_timestamp() AT TIME ZONE 'UTC')"
    };
}

/// The database's clock plus the microseconds bound at `?`; NULL when it is NULL.
macro_rules! now_plus {
    () => {
        "((clock_timestamp() AT TIME ZONE 'UTC') + ? * INTERVAL '1 microsecond')"
    };
}

macro_rules! message_columns {
    () => {
        concat!(
            "id, message_id, topic, payload, job_key, attempts, last_error, \
             CAST(EXTRACT(EPOCH FROM (",
            now!(),
            " - created_at)) * 1000000 AS BIGINT) AS age_micros"
        )
    };
}

/// A timestamp column (or aggregate of one) as microseconds since the Unix epoch; NULL stays NULL.
macro_rules! micros {
    ($column:expr) => {
        concat!(
            "CAST(EXTRACT(EPOCH FROM ",
            $column,
            ") * 1000000 AS BIGINT)"
        )
    };
}

sql! {
    // The same statement a hand-written claim is: a fresh key (the common case) costs one insert.
    // A data-modifying CTE that also reads the conflicting row in one statement costs every fresh
    // job more than the second statement costs a replay through the claim (redeliveries read
    // their key first, see `crate::redelivery`).
    ClaimInsert = concat!(
        "INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, result, done_at) \
         VALUES (?, ?, ?, ?, ?, ?, ", now!(), ") ON CONFLICT DO NOTHING"
    );
    // A claim in a job's own transaction (the first, sent in the same flight as its `BEGIN` on
    // diesel-async, and any after a redelivery's read or a bounded wait): `ClaimInsert`, refused
    // with an error when it does not run in the transaction `begin_job` opened or when that
    // transaction has written already (`own_claim_token`).
    OwnClaimInsert = concat!(
        "INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, result, done_at) \
         VALUES (?, ?, ?, ?, ", own_claim_token!(), ", ?, ", now!(), ") ON CONFLICT DO NOTHING"
    );
    // Rows a claim is renewing right now are skipped, not waited for.
    PruneLapsed = concat!(
        "DELETE FROM done_jobs WHERE key_digest IN \
         (SELECT key_digest FROM done_jobs WHERE expires_at <= ", now_bound!(),
        " ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED)"
    );
    ParkAbandoned = concat!(
        "UPDATE outbox SET parked_at = ", now!(), ", lease_owner = NULL, lease_until = NULL, \
         last_error = ", abandoned_reason!(), " WHERE id IN (SELECT id FROM outbox WHERE ", abandoned!(), " AND attempts >= ? \
         FOR UPDATE SKIP LOCKED)"
    );
    // In the order of `outbox_leased` (schema version 4: `lease_until, id` of the leased messages
    // alone), the lease that lapsed first, which the index reads and stops at the first one
    // unlocked: the messages not leased, however many are due or backing off, are never read.
    // Ordered by `available_at, id` (the order of `outbox_pending`), a round walked every due
    // message looking for a lapsed lease (measured with 1,000,000 due: 0.39 s a round). One at
    // its last attempt is not taken (`attempts < ?`, the relay's `max_attempts`): its lease can
    // lapse between `ParkAbandoned`'s clock and this one's, and the next lease parks it.
    TakeAbandoned = concat!(
        "UPDATE outbox SET lease_owner = ?, lease_until = ", now_plus!(), ", attempts = attempts + 1 \
         WHERE id = (SELECT id FROM outbox WHERE ", abandoned!(),
        " AND attempts < ? ORDER BY lease_until, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING ", message_columns!()
    );
    // In the order of `outbox_pending` (`available_at, id`: the order in which messages became
    // due, pushed or at the end of their backoff), which the index reads and stops at the limit.
    // With `ORDER BY id` the planner walked the primary key once statistics showed many messages
    // pending, past every delivered message kept until `prune_delivered` and every one backing
    // off: measured with 1,000,000 delivered and 1,000,000 due, 160 ms a lease; through the index,
    // 0.1 ms.
    TakePending = concat!(
        "UPDATE outbox SET lease_owner = ?, lease_until = ", now_plus!(), ", attempts = attempts + 1 \
         WHERE id IN (SELECT id FROM outbox WHERE ", pending!(),
        " ORDER BY available_at, id LIMIT ? FOR UPDATE SKIP LOCKED) RETURNING ", message_columns!()
    );
    RetryParked = concat!(
        "UPDATE outbox SET parked_at = NULL, attempts = 0, last_error = NULL, available_at = ",
        now!(),
        " WHERE parked_at IS NOT NULL AND (CAST(? AS TEXT) IS NULL OR message_id = ?)"
    );
    PruneDelivered = concat!(
        "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE delivered_at <= ",
        now_bound!(),
        " - ? * INTERVAL '1 microsecond' ORDER BY delivered_at LIMIT ? FOR UPDATE SKIP LOCKED)"
    );
    Counts = "SELECT \
         COUNT(*) FILTER (WHERE delivered_at IS NULL AND parked_at IS NULL AND lease_owner IS NULL) AS pending, \
         COUNT(*) FILTER (WHERE delivered_at IS NULL AND parked_at IS NULL AND lease_owner IS NOT NULL) AS leased, \
         COUNT(*) FILTER (WHERE delivered_at IS NOT NULL) AS delivered, \
         COUNT(*) FILTER (WHERE delivered_at IS NULL AND parked_at IS NOT NULL) AS parked \
         FROM outbox";
    // Resolved through the search_path, as the job statements resolve their tables. Read from the
    // catalog tables with the statement's snapshot, not with `to_regclass`, whose cached "no such
    // table" can outlive another migration's commit that this one waited for.
    TableExists = "SELECT COUNT(*) AS n FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relname = ? AND c.relkind IN ('r', 'p') AND n.nspname = ANY (current_schemas(false))";
    // On the table the connection finds by that name (`?` the table, `?` the index); a `CREATE
    // INDEX CONCURRENTLY` that failed half-way leaves an index that is not valid, which is not it.
    IndexExists = "SELECT COUNT(*) AS n FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = to_regclass(?) AND c.relname = ? AND i.indisvalid";
    TableColumns = "SELECT attname::text AS name FROM pg_attribute \
         WHERE attrelid = to_regclass(?) AND attnum > 0 AND NOT attisdropped";
    TablePrivileges = "SELECT has_table_privilege(c.oid, 'SELECT') AS select, \
         has_table_privilege(c.oid, 'INSERT') AS insert, has_table_privilege(c.oid, 'UPDATE') AS update, \
         has_schema_privilege(n.oid, 'USAGE') AS schema_usage, quote_ident(n.nspname) AS schema \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relname = ? AND c.relkind IN ('r', 'p') AND n.nspname = ANY (current_schemas(false)) \
         ORDER BY array_position(current_schemas(false), n.nspname) LIMIT 1";
    // Schemas of the search_path that hold a runtime table this role may not use: the tables are
    // there, out of its reach (`current_schemas` leaves such schemas out).
    UnusableSchemas = "SELECT DISTINCT quote_ident(n.nspname) AS name FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relname IN ('idempotent_schema', 'done_jobs', 'outbox') \
         AND NOT has_schema_privilege(n.oid, 'USAGE') \
         AND n.nspname = ANY (string_to_array(replace(replace(current_setting('search_path'), '\"', ''), ' ', ''), ','))";
    // Of the outbox the catalog reads above find (a temporary `outbox`, which `pg_temp` puts
    // first for the unqualified name, has no serial sequence: NULL); one without a serial
    // sequence has none to grant.
    OutboxSequence = "SELECT COALESCE(has_sequence_privilege(pg_get_serial_sequence(\
         quote_ident(n.nspname) || '.outbox', 'id'), 'USAGE'), TRUE) AS usage \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relname = 'outbox' AND c.relkind IN ('r', 'p') AND n.nspname = ANY (current_schemas(false)) \
         ORDER BY array_position(current_schemas(false), n.nspname) LIMIT 1";
    // The runtime's tables that this session's temporary table of the same name hides: the one
    // the unqualified name resolves to is in `pg_temp` (searched first unless the search_path
    // places it).
    ShadowingTemporaries = "SELECT c.relname::text AS name FROM pg_class c \
         WHERE c.relnamespace = pg_my_temp_schema() \
         AND c.relname IN ('idempotent_schema', 'done_jobs', 'outbox') \
         AND c.oid = to_regclass(quote_ident(c.relname))";
    UniqueIndexOn = "SELECT COUNT(*) AS n FROM pg_index i WHERE i.indrelid = to_regclass(?) \
         AND i.indisunique AND i.indnatts = 1 AND i.indkey[0] = \
         (SELECT attnum FROM pg_attribute WHERE attrelid = i.indrelid AND attname = ?)";
    SearchPath = "SELECT current_setting('search_path') AS name";
    RecordVersion = concat!(
        "INSERT INTO idempotent_schema (version, description, applied_at) VALUES (?, ?, ", now!(), ")"
    );
    // The advisory lock that serializes migrations; the transaction's end releases it. It is one
    // per schema the tables go into (advisory locks are database-wide), so applications sharing a
    // database in schemas of their own do not wait for each other.
    MigrationLock = "SELECT pg_advisory_xact_lock(hashtextextended('idempotent_jobs:' || ?, 0))";
    // Where the runtime's tables are, or go: beside an existing `done_jobs` (or version table),
    // else the first schema of the search_path that exists.
    TargetSchema = "SELECT quote_ident(name) AS name FROM (\
           SELECT n.nspname AS name, 0 AS rank, p.position FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN unnest(current_schemas(false)) WITH ORDINALITY AS p (name, position) ON p.name = n.nspname \
             WHERE c.relname = 'done_jobs' \
           UNION ALL \
           SELECT n.nspname, 1, p.position FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN unnest(current_schemas(false)) WITH ORDINALITY AS p (name, position) ON p.name = n.nspname \
             WHERE c.relname = 'idempotent_schema' \
           UNION ALL \
           SELECT current_schema(), 2, 0 WHERE current_schema() IS NOT NULL \
         ) AS found ORDER BY rank, position LIMIT 1";
    TableNames = "SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) AS name \
         FROM information_schema.tables \
         WHERE table_schema = ANY (current_schemas(false)) AND table_type = 'BASE TABLE' \
         ORDER BY 1";
}

/// Every statement outside a transaction block is its own transaction, with a fresh snapshot; a
/// hot standby's snapshot may lag the primary, so there the read finds nothing (and the claim,
/// which writes, decides: on a standby it is refused).
macro_rules! read_guard {
    () => {
        " AND NOT pg_is_in_recovery()"
    };
}

/// Nothing: `by_primary_key!()` is MySQL's (see `shared_statements!`).
macro_rules! by_primary_key {
    () => {
        ""
    };
}

/// Nothing: `every_row!()` is MySQL's (see `shared_statements!`).
macro_rules! every_row {
    () => {
        ""
    };
}

sql! {
    // A redelivery's read before its claim: the key's row only where the statement's snapshot is
    // its own. READ COMMITTED takes one per statement; a transaction of the caller's at
    // REPEATABLE READ or SERIALIZABLE, sent as text (Diesel does not count it), keeps the one its
    // first statement took, which may be older than a forget or a renewal committed since.
    // There the read finds nothing, and the claim decides.
    DoneReadFirst = concat!(
        done_read!(),
        " AND current_setting('transaction_isolation') = 'read committed'"
    );
}

shared_statements!();

use super::shared::later;

sql! {
    // Whether the transaction just begun is a caller's: a `BEGIN` inside a transaction of the
    // caller's is only a warning. One that has written has an id; [`BEGIN_OWN`] marks one that
    // it found begun before it, written or not (a job's `BEGIN` does not: a caller's transaction
    // that has only read takes a job in, docs/second-run.md).
    WrittenAlready = "SELECT CAST(CASE WHEN txid_current_if_assigned() IS NULL AND current_setting('idempotent.begun', true) IS DISTINCT FROM 'another' THEN 0 ELSE 1 END AS BIGINT) AS n";
    // `set_config(.., true)`: for this transaction only, whatever happens to it.
    BoundLockWait = "SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', ?, true) AS applied";
    RestoreLockWait = "SELECT set_config('lock_timeout', ?, true) AS previous";
    // A setting for this transaction only, read back by the next statement: there only when both
    // ran in one transaction (outside a transaction block, each statement is one of its own).
    MarkStillOpen = "SELECT set_config('idempotent.open', 'on', true) AS previous";
    // The first schema the search_path names that exists but that this role may not use:
    // `current_schemas` (and so `TargetSchema`) leaves it out, though the tables would go there.
    UnusableOnPath = "SELECT quote_ident(n.nspname) AS name, has_schema_privilege(n.oid, 'CREATE') AS may_create, \
         FALSE AS holds_tables FROM pg_namespace n \
         JOIN unnest(string_to_array(replace(replace(current_setting('search_path'), '\"', ''), ' ', ''), ',')) \
           WITH ORDINALITY AS p (name, position) ON p.name = n.nspname \
         WHERE NOT has_schema_privilege(n.oid, 'USAGE') ORDER BY p.position LIMIT 1";
    // Whether this role may create tables in the schema `?` (quoted, as `TargetSchema` gives it),
    // and whether it already holds one of the runtime's tables.
    CreateIn = "SELECT quote_ident(n.nspname) AS name, has_schema_privilege(n.oid, 'CREATE') AS may_create, \
         EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid \
           AND c.relname IN ('idempotent_schema', 'done_jobs', 'outbox')) AS holds_tables \
         FROM pg_namespace n WHERE quote_ident(n.nspname) = ?";
    ReadStillOpen = "SELECT COALESCE(current_setting('idempotent.open', true), '') AS previous";
    JobMarkSet = "SELECT COALESCE(current_setting('idempotent.job', true), '') AS previous";
}

#[derive(diesel::QueryableByName)]
struct Privileges {
    #[diesel(sql_type = Bool)]
    select: bool,
    #[diesel(sql_type = Bool)]
    insert: bool,
    #[diesel(sql_type = Bool)]
    update: bool,
    #[diesel(sql_type = Bool)]
    schema_usage: bool,
    #[diesel(sql_type = Text)]
    schema: String,
}

/// A schema where `migrate` puts the tables, and whether this role may do so.
#[derive(diesel::QueryableByName)]
struct SchemaGrants {
    /// Quoted.
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Bool)]
    may_create: bool,
    #[diesel(sql_type = Bool)]
    holds_tables: bool,
}

impl SchemaGrants {
    /// What the role that migrates lacks on the schema, `usage` held or not, where it creates
    /// tables (an empty schema); `None` when it lacks nothing `migrate` can tell beforehand.
    fn missing(&self, usage: bool) -> Option<SchemaProblem> {
        let (privilege, granted) = match (usage, self.may_create || self.holds_tables) {
            (true, true) => return None,
            (false, true) => ("USAGE", "USAGE"),
            (true, false) => ("CREATE", "CREATE"),
            (false, false) => ("USAGE and CREATE", "USAGE, CREATE"),
        };
        Some(SchemaProblem::MissingPrivilege {
            privilege,
            object: format!(
                "the schema {} of the connection's search_path, where the tables go",
                self.name
            ),
            grant: format!(
                "GRANT {granted} ON SCHEMA {} TO <the role that migrates>, as the schema's owner (workers need USAGE only); or migrate as the schema's owner",
                self.name
            ),
        })
    }
}

#[derive(diesel::QueryableByName)]
struct SequenceUsage {
    #[diesel(sql_type = Bool)]
    usage: bool,
}

async fn search_path<C: Store<Db = PostgresDb>>(conn: &mut C) -> QueryResult<String> {
    let rows: Vec<super::Name> = conn.load(Statement::<SearchPath, _>::new(())).await?;
    Ok(rows.into_iter().next().map(|r| r.name).unwrap_or_default())
}

impl Database for PostgresDb {
    async fn done_row_before_claim<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
    ) -> QueryResult<Option<crate::store::DoneRow>> {
        super::shared::done_row_by::<DoneReadFirst, _>(conn, digest).await
    }

    const A_FAILED_STATEMENT_ABORTS: bool = true;
    fn release_and_commit_sql() -> &'static str {
        &JOB_TEXTS.release_and_commit
    }

    shared_methods!();
    migration_steps!(
        "postgres",
        crate::store::Step {
            version: 4,
            table: "outbox",
            column: None,
            routines: &[],
            indexes: &["outbox_leased"],
            sql: include_str!("../../sql/postgres/004_outbox_leased.sql"),
        }
    );

    async fn bound_lock_wait<C: Store<Db = Self>>(
        conn: &mut C,
        limit: std::time::Duration,
    ) -> QueryResult<Option<String>> {
        // 0 would mean "no timeout": the shortest bound is 1 ms.
        let millis = limit.as_millis().clamp(1, i32::MAX as u128);
        let rows: Vec<crate::store::SettingRow> = conn
            .load(Statement::<BoundLockWait, _>::new((bind::<Text, _>(
                format!("{millis}ms"),
            ),)))
            .await?;
        Ok(rows.into_iter().next().map(|row| row.previous))
    }

    async fn restore_lock_wait<C: Store<Db = Self>>(
        conn: &mut C,
        previous: &str,
    ) -> QueryResult<()> {
        let _: Vec<crate::store::SettingRow> = conn
            .load(Statement::<RestoreLockWait, _>::new((bind::<Text, _>(
                previous,
            ),)))
            .await?;
        Ok(())
    }

    fn claim_outside_job(error: &DieselError) -> bool {
        super::message(error).is_some_and(|m| m.contains(crate::error::OUTSIDE_JOB))
    }

    fn inside_callers_transaction(error: &DieselError) -> bool {
        super::message(error).is_some_and(|m| m.contains(INSIDE_CALLERS))
    }

    fn check_and_release(digest: &[u8; 32], token: i64, mark: &str) -> Option<String> {
        use std::fmt::Write as _;
        let hex = digest
            .iter()
            .fold(String::with_capacity(64), |mut hex, byte| {
                let _ = write!(hex, "{byte:02x}");
                hex
            });
        // `decode` of a constant is folded into the key the primary key's index searches for; the
        // failing arm reads a setting, so that the planner cannot fold the cast (and fail) before
        // the condition is known.
        Some(format!(
            "SELECT CAST(CASE WHEN EXISTS (SELECT 1 FROM done_jobs WHERE key_digest = decode('{hex}', 'hex') \
             AND claim_token = {token}) THEN '1' ELSE '{gone} ' || current_setting('server_version_num') END AS INTEGER); \
             RELEASE SAVEPOINT {mark}",
            gone = crate::store::CLAIM_GONE
        ))
    }

    fn refused_as_aborted(error: &DieselError) -> bool {
        super::message(error)
            .is_some_and(|m| IN_FAILED_TRANSACTION.iter().any(|known| m.contains(known)))
    }

    async fn transaction_still_open<C: Store<Db = Self>>(conn: &mut C) -> Option<bool> {
        let marked: QueryResult<Vec<crate::store::SettingRow>> =
            conn.load(Statement::<MarkStillOpen, _>::new(())).await;
        match marked {
            Ok(_) => {}
            Err(error) if Self::connection_lost(&error) => return None,
            // An aborted transaction refuses every statement. A prepared statement can also fail
            // on its own (behind a pooler that runs it on another server connection, or at a
            // `statement_timeout`): only a plain `SELECT 1` sent as text that fails too says the
            // transaction is aborted; one that runs says nothing (no answer).
            Err(_) => {
                return match conn.batch("SELECT 1").await {
                    Ok(()) => None,
                    Err(error) if Self::connection_lost(&error) => None,
                    Err(_) => Some(true),
                };
            }
        }
        let read: Vec<crate::store::SettingRow> = conn
            .load(Statement::<ReadStillOpen, _>::new(()))
            .await
            .ok()?;
        Some(read.first().is_some_and(|row| row.previous == "on"))
    }

    /// The job's own transaction has its transaction-local mark (`idempotent.job`, set by
    /// [`JobTexts::begin_job`]); one the body began after ending it has none. An aborted one
    /// answers nothing until it is rolled back to the job's savepoint, which only the job's own
    /// has (the runtime rolls the transaction back next in any case): where that fails, the
    /// transaction is taken for one the body began (or the body released the job's savepoint),
    /// and what the body ran may be committed.
    async fn open_transaction_holds_the_rest<C: Store<Db = Self>>(conn: &mut C) -> Option<bool> {
        let mark = async |conn: &mut C| {
            let rows: Vec<crate::store::SettingRow> =
                conn.load(Statement::<JobMarkSet, _>::new(())).await?;
            Ok::<_, DieselError>(rows.first().is_some_and(|row| row.previous == "on"))
        };
        match mark(conn).await {
            Ok(marked) => Some(marked),
            Err(error) if Self::connection_lost(&error) => None,
            Err(_) => match conn.batch("ROLLBACK TO SAVEPOINT idempotent_job").await {
                Ok(()) => mark(conn).await.ok(),
                Err(error) if Self::connection_lost(&error) => None,
                Err(_) => Some(false),
            },
        }
    }

    const LEAVE_CALLERS_TRANSACTION: &'static str = "ROLLBACK TO SAVEPOINT idempotent_job; \
         RELEASE SAVEPOINT idempotent_job; SET LOCAL idempotent.job = ''";

    async fn begun_inside_another<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<bool> {
        let rows: Vec<TableCount> = conn.load(Statement::<WrittenAlready, _>::new(())).await?;
        Ok(rows.first().is_some_and(|r| r.n > 0))
    }

    type Backend = Pg;
    const NAME: &'static str = "PostgreSQL";

    async fn table_exists_alone<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
    ) -> QueryResult<bool> {
        use crate::transaction::{Transaction, itself};
        let (mut transaction, _) = Transaction::begin(conn, itself::<C>).await?;
        match Self::table_exists(transaction.store(), table).await {
            Ok(exists) => transaction.commit().await.map(|()| exists),
            Err(error) => {
                transaction.rollback().await;
                Err(error)
            }
        }
    }

    async fn commit_failed_instead<C: Store<Db = Self>>(conn: &mut C, error: &DieselError) -> bool {
        // The release's own failures name the savepoint or the statement, in every language:
        // `savepoint "idempotent_job" does not exist` (the body released or rolled back past it),
        // "RELEASE SAVEPOINT can only be used in transaction blocks" (the body ended the
        // transaction). The third, "current transaction is aborted" (the body went past a failed
        // statement), is translated: a statement tells it from a failed `COMMIT`, which ended the
        // transaction, where the aborted one is still open and refuses it.
        let DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) = error else {
            return false;
        };
        if ["idempotent_job", "RELEASE SAVEPOINT"]
            .iter()
            .any(|named| info.message().contains(named))
        {
            return false;
        }
        conn.batch("SELECT 1").await.is_ok()
    }

    fn classify(error: &DieselError) -> Fault {
        match error {
            DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => {
                Fault::Serialization
            }
            // Neither Diesel nor diesel-async passes on the SQLSTATE of these: their messages,
            // in the language of the server's `lc_messages`, tell them.
            _ => match super::message(error) {
                Some(m) if DEADLOCK_DETECTED.iter().any(|known| m.contains(known)) => {
                    Fault::Deadlock
                }
                // A session's `statement_timeout` that ends a wait (the claim's for another run of
                // its key) passes as `lock_timeout` does.
                Some(m) if WAIT_CANCELED.iter().any(|known| m.contains(known)) => {
                    Fault::LockTimeout
                }
                _ => Fault::Other,
            },
        }
    }

    fn connection_lost(error: &DieselError) -> bool {
        crate::lost::connection_lost(error, crate::lost::POSTGRES)
    }

    /// `client_encoding` other than UTF8 (Diesel sets UTF8 when it connects; a pool's hook or
    /// the code before the jobs may set another): text converts through it, and a row holding a
    /// character it cannot show is refused as it is read, a relay's lease with it, every time, so
    /// that its batch is neither delivered nor parked.
    async fn session_charset<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<Option<String>> {
        let encoding = conn
            .text_rows("SELECT current_setting('client_encoding') AS row")
            .await?;
        Ok(encoding
            .first()
            .filter(|value| !value.eq_ignore_ascii_case("UTF8"))
            .map(|value| format!("client_encoding = {value}")))
    }

    fn canceled_by_request(error: &DieselError) -> bool {
        super::message(error).is_some_and(|m| USER_CANCELED.iter().any(|known| m.contains(known)))
    }

    async fn claim<C: Store<Db = Self>>(
        conn: &mut C,
        claim: &Claim<'_>,
    ) -> QueryResult<ClaimAttempt> {
        if claim.own {
            super::shared::insert_or_read::<OwnClaimInsert, _, _>(
                conn,
                claim,
                super::shared::claim_values(claim),
            )
            .await
        } else {
            super::shared::insert_or_read::<ClaimInsert, _, _>(
                conn,
                claim,
                super::shared::claim_values(claim),
            )
            .await
        }
    }

    async fn begin_and_claim<C: Store<Db = Self>>(
        conn: &mut C,
        claim: &Claim<'_>,
    ) -> QueryResult<(Nesting, QueryResult<ClaimAttempt>)> {
        let first = Statement::<OwnClaimInsert, _>::new(super::shared::claim_values(claim));
        let Some(begun) = conn.begin_job_pipelined(first).await else {
            // One after the other (the claim sent once `BEGIN` has answered), checked in a
            // transaction of the job's own; inside a caller's transaction Diesel knows of: the
            // plain claim, no mark.
            let nesting = conn.begin_job(None).await?;
            let own = Claim {
                own: nesting != Nesting::Savepoint,
                ..*claim
            };
            return Ok((nesting, Self::claim(conn, &own).await));
        };
        let (nesting, inserted) = begun?;
        let attempt = match inserted {
            Ok(1) => Ok(ClaimAttempt::Inserted),
            Ok(_) => Self::done_row(conn, claim.digest)
                .await
                .map(super::shared::found),
            Err(error) => Err(error),
        };
        Ok((nesting, attempt))
    }

    async fn lease<C: Store<Db = Self>>(
        conn: &mut C,
        lease: &Lease<'_>,
    ) -> QueryResult<crate::store::Leased> {
        let parked = super::shared::park_abandoned::<ParkAbandoned, _>(conn, lease).await?;
        let abandoned: Vec<LeasedRow> = conn
            .load(Statement::<TakeAbandoned, _>::new((
                bind::<Text, _>(lease.owner),
                bind::<Nullable<BigInt>, _>(Some(lease.lease_micros)),
                bind::<Integer, _>(lease.max_attempts),
            )))
            .await?;
        if !abandoned.is_empty() {
            return Ok(crate::store::Leased {
                parked,
                rows: abandoned,
            });
        }
        let mut leased: Vec<LeasedRow> = conn
            .load(Statement::<TakePending, _>::new((
                bind::<Text, _>(lease.owner),
                bind::<Nullable<BigInt>, _>(Some(lease.lease_micros)),
                bind::<BigInt, _>(lease.limit),
            )))
            .await?;
        leased.sort_by_key(|m| m.id);
        Ok(crate::store::Leased {
            parked,
            rows: leased,
        })
    }

    async fn schema_version<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<Option<i32>> {
        // In a transaction of its own (a savepoint inside the migration's): diesel-async prepares
        // and executes a statement in two round trips, and PgBouncer in transaction pooling mode
        // may hand those to two different server connections when no transaction pins one
        // ("prepared statement \"s3\" does not exist"). This is the one read that runs before
        // any transaction, when every worker migrates at start.
        crate::transaction::in_transaction(conn, async |conn| {
            super::shared::recorded_version::<_, SchemaVersion>(conn).await
        })
        .await
    }

    async fn migrate<C: Store<Db = Self>>(
        conn: &mut C,
        lock_timeout: std::time::Duration,
    ) -> Result<(), crate::error::Error> {
        use crate::migrations::failed;
        // PostgreSQL's `lock_timeout` takes at most `i32::MAX` milliseconds (24.8 days).
        let wait_ms = lock_timeout.as_millis().clamp(1, i32::MAX as u128);
        crate::migrations::in_transaction(conn, lock_timeout, async move |conn: &mut C| {
            conn.batch(&format!("SET LOCAL lock_timeout = '{wait_ms}ms'"))
                .await
                .map_err(failed("idempotent_schema"))?;
            // Where the tables are, or go: the schema the job statements will find them in.
            let targets: Vec<super::Name> = conn
                .load(Statement::<TargetSchema, _>::new(()))
                .await
                .map_err(failed("done_jobs"))?;
            let refuse = |problem: SchemaProblem| crate::error::Error::Migration {
                table: "done_jobs",
                source: Box::new(problem),
            };
            let Some(schema) = targets.into_iter().next() else {
                // A schema the search_path names that is there, out of this role's reach: the
                // grant is named (nothing was changed, and a retry meets the same).
                let unusable: Vec<SchemaGrants> = conn
                    .load(Statement::<UnusableOnPath, _>::new(()))
                    .await
                    .map_err(failed("done_jobs"))?;
                if let Some(problem) = unusable.first().and_then(|s| s.missing(false)) {
                    return Err(refuse(problem));
                }
                return Err(crate::error::Error::Migration {
                    table: "done_jobs",
                    source: "no schema on the connection's search_path exists to create the tables in; create one, or set the search_path (`options=-csearch_path%3Djobs` in the URL)".into(),
                });
            };
            // An empty schema this role may use but not create in: the grant is named before
            // the DDL is refused with "permission denied for schema".
            let grants: Vec<SchemaGrants> = conn
                .load(Statement::<CreateIn, _>::new((bind::<Text, _>(schema.name.clone()),)))
                .await
                .map_err(failed("done_jobs"))?;
            if let Some(problem) = grants.first().and_then(|s| s.missing(true)) {
                return Err(refuse(problem));
            }
            if let Err(error) = conn
                .execute(Statement::<MigrationLock, _>::new((bind::<Text, _>(schema.name.clone()),)))
                .await
            {
                if Self::classify(&error) == Fault::LockTimeout {
                    return Err(crate::error::Error::Migration {
                        table: "idempotent_schema",
                        source: Box::new(crate::migrations::LockWait(format!(
                            "another migration held the migration lock for more than {lock_timeout:?}; nothing was changed. Retry once it has finished"
                        ))),
                    });
                }
                return Err(failed("idempotent_schema")(error));
            }
            // Unqualified DDL creates its tables in the schema found above, and only there: never
            // a second copy in another schema of the search_path.
            let narrow = format!("SET LOCAL search_path TO {}", schema.name);
            crate::migrations::pass(conn, Some(&narrow)).await
        })
        .await
    }

    async fn shadowed_by_temporary<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> QueryResult<Vec<&'static str>> {
        let found: Vec<super::Name> = conn
            .load(Statement::<ShadowingTemporaries, _>::new(()))
            .await?;
        Ok(crate::migrations::runtime_tables(
            found.iter().map(|n| n.name.as_str()),
        ))
    }

    fn privilege_denied(error: &DieselError) -> bool {
        // "permission denied for schema jobs", "must be owner of table outbox".
        super::message(error)
            .is_some_and(|m| m.contains("permission denied") || m.contains("must be owner"))
    }

    async fn where_tables_are<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<String> {
        Ok(format!(
            "the schemas of the connection's search_path that this role may use ({})",
            search_path(conn).await?
        ))
    }

    async fn missing_privileges<C: Store<Db = Self>>(
        conn: &mut C,
        present: &[&'static str],
    ) -> QueryResult<Vec<SchemaProblem>> {
        let unusable: Vec<super::Name> =
            conn.load(Statement::<UnusableSchemas, _>::new(())).await?;
        let mut missing: Vec<SchemaProblem> = unusable
            .into_iter()
            .map(|schema| SchemaProblem::MissingPrivilege {
                privilege: "USAGE",
                object: format!("the schema {} that holds the runtime's tables", schema.name),
                grant: format!(
                    "GRANT USAGE ON SCHEMA {} TO <the worker's role>",
                    schema.name
                ),
            })
            .collect();
        for table in present {
            let privileges: Vec<Privileges> = conn
                .load(Statement::<TablePrivileges, _>::new((bind::<Text, _>(
                    *table,
                ),)))
                .await?;
            let Some(privileges) = privileges.into_iter().next() else {
                continue;
            };
            if !privileges.schema_usage {
                missing.push(SchemaProblem::MissingPrivilege {
                    privilege: "USAGE",
                    object: format!("the schema of `{table}` ({})", privileges.schema),
                    grant: format!(
                        "GRANT USAGE ON SCHEMA {} TO <the worker's role>",
                        privileges.schema
                    ),
                });
            }
            let needed: &[(&str, bool)] = if *table == "idempotent_schema" {
                &[("SELECT", privileges.select)]
            } else {
                &[
                    ("SELECT", privileges.select),
                    ("INSERT", privileges.insert),
                    ("UPDATE", privileges.update),
                ]
            };
            for (privilege, held) in needed {
                if !held {
                    missing.push(SchemaProblem::MissingPrivilege {
                        privilege,
                        object: format!("`{table}`"),
                        grant: format!("GRANT {privilege} ON {table} TO <the worker's role>"),
                    });
                }
            }
        }
        if present.contains(&"outbox") {
            let sequence: Vec<SequenceUsage> =
                conn.load(Statement::<OutboxSequence, _>::new(())).await?;
            if sequence.first().is_some_and(|s| !s.usage) {
                missing.push(SchemaProblem::MissingPrivilege {
                    privilege: "USAGE",
                    object: "the outbox's id sequence".to_owned(),
                    grant: "GRANT USAGE ON SEQUENCE outbox_id_seq TO <the worker's role>"
                        .to_owned(),
                });
            }
        }
        Ok(missing)
    }

    async fn table_rows<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
    ) -> QueryResult<Vec<String>> {
        // A `float8` as text follows the session's `extra_float_digits`: at a setting of the
        // user's below 1, 0.1 and 0.11 read alike. The rows are read at 3 (every digit). Inside
        // a transaction Diesel knows of, set `LOCAL` under a savepoint rolled back after the
        // read, which puts back the setting as it was, `LOCAL` or not; outside one, set for the
        // session and set back to what it read (a `BEGIN` of the read's own would end a
        // transaction the session holds that Diesel does not know of).
        let (open, close) = if conn.transaction_depth()? > 0 {
            (
                "SAVEPOINT idempotent_snapshot; SET LOCAL extra_float_digits = 3".to_owned(),
                "ROLLBACK TO SAVEPOINT idempotent_snapshot; RELEASE SAVEPOINT idempotent_snapshot"
                    .to_owned(),
            )
        } else {
            let previous = conn
                .text_rows("SELECT current_setting('extra_float_digits') AS row")
                .await?;
            // A number the server read back; anything else is not sent as SQL.
            let previous: i32 = previous
                .first()
                .and_then(|setting| setting.trim().parse().ok())
                .unwrap_or(1);
            (
                "SET extra_float_digits = 3".to_owned(),
                format!("SET extra_float_digits = {previous}"),
            )
        };
        conn.batch(&open).await?;
        // `table` comes from `table_names`, already quoted per part. `ROW(t.*)`, the row's
        // columns: a bare `t` names a column called `t` where the table has one (and only that
        // column was compared).
        let rows = conn
            .text_rows(&format!(
                "SELECT CAST(ROW(t.*) AS text) AS row FROM {table} t"
            ))
            .await;
        // The read's own error first; else the end's.
        let closed = conn.batch(&close).await;
        let rows = rows?;
        closed?;
        Ok(rows)
    }
}

/// The texts that open and end a job's own transaction, naming its second savepoint (the mark):
/// set right after the job's own in [`begin_job`], so that a body that rolls back to the job's
/// savepoint by name (`ROLLBACK TO SAVEPOINT idempotent_job`) takes it with the claim, which comes
/// after both here, and the release of it before `COMMIT` fails then (its name holds
/// `idempotent_job`, so the failure reads as the release's). Without it such a job committed what
/// its body wrote after the rollback without its claim, said it ran, and ran again at the next
/// delivery. A savepoint, not a setting checked by a query: both are statements in batches that
/// were there already, and a savepoint's is the cheapest.
///
/// The mark's name, `idempotent_job_mark_` and 16 hex digits, is drawn once per process: a body
/// that rolled back to the mark itself kept it (a rollback keeps the savepoint it names) and took
/// the claim, and a job returning `()` said it ran with nothing committed. A body cannot name a
/// savepoint whose name it cannot know.
struct JobTexts {
    /// `BEGIN`, the transaction-local mark its claims check ([`own_claim_token`]), the job's
    /// savepoint and the mark after it, one round trip. A simple query stops at its first error,
    /// so the setting is made only if `BEGIN` opened the transaction, and it goes with the
    /// transaction.
    begin_job: String,
    /// The mark released (inside the job's savepoint, it fails for all the job's savepoint's
    /// release failed for, and for a rollback to the job's savepoint) and the transaction
    /// committed in one text batch: a simple query stops at its first error, so the `COMMIT` runs
    /// only when the release succeeded.
    release_and_commit: String,
}

/// This process's [`JobTexts`].
static JOB_TEXTS: std::sync::LazyLock<JobTexts> = std::sync::LazyLock::new(|| {
    use std::hash::{BuildHasher as _, Hasher as _};
    // `RandomState`'s keys are drawn from the operating system's randomness.
    let drawn = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let mark = format!("idempotent_job_mark_{drawn:016x}");
    JobTexts {
        begin_job: format!(
            "BEGIN; SET LOCAL idempotent.job = 'on'; SAVEPOINT idempotent_job; SAVEPOINT {mark}"
        ),
        release_and_commit: format!("RELEASE SAVEPOINT {mark}; COMMIT"),
    }
});

/// A job's own transaction opened: [`JobTexts::begin_job`].
fn begin_job() -> &'static str {
    &JOB_TEXTS.begin_job
}

/// A transaction of the runtime's own that is not a job (looking up and forgetting keys, a prune's
/// batch, a relay's round): `BEGIN`, and in the same simple query a mark for this transaction
/// only, `another` where the transaction began before this message (the caller's `BEGIN` sent as
/// text, which made this one only a warning): the first statement of a transaction is the one
/// whose `statement_timestamp()` (this message's arrival) is its `transaction_timestamp()`.
/// [`WrittenAlready`] reads it, so that the runtime never runs, and commits, inside a caller's
/// transaction that has only read.
const BEGIN_OWN: &str = "BEGIN; SELECT set_config('idempotent.begun', \
     CASE WHEN transaction_timestamp() = statement_timestamp() THEN 'own' ELSE 'another' END, true)";

#[cfg(feature = "postgres")]
sync_store!(diesel::PgConnection, PostgresDb, begin: BEGIN_OWN, job: begin_job(), one_batch: true);

#[cfg(feature = "async-postgres")]
async_store!(diesel_async::AsyncPgConnection, PostgresDb, begin: BEGIN_OWN, job: begin_job(), read_first_in_transaction: true, pipelined: pipeline_begin_job);

/// [`Store::begin_job_pipelined`] on diesel-async's PostgreSQL connection: [`begin_job`]
/// and `first` sent together, one round trip; `None` inside a caller's transaction.
///
/// The transaction is counted open before anything is sent: a future dropped in flight leaves
/// the job's guard to mark the connection broken. When `BEGIN` fails, whatever is open is rolled
/// back here (a `ROLLBACK` with none open only warns) and nothing is.
#[cfg(feature = "async-postgres")]
async fn pipeline_begin_job<S, B>(
    conn: &mut diesel_async::AsyncPgConnection,
    first: Statement<S, B>,
) -> Option<QueryResult<(Nesting, QueryResult<usize>)>>
where
    S: crate::sql::SqlText,
    B: crate::sql::Binds<Pg> + Send,
{
    use diesel::connection::TransactionDepthChange;
    use diesel_async::SimpleAsyncConnection as _;
    match super::depth_async(conn) {
        Ok(0) => {}
        Ok(_) => return None,
        Err(error) => return Some(Err(error)),
    }
    if let Err(error) = <diesel_async::AnsiTransactionManager as diesel_async::TransactionManager<
        _,
    >>::transaction_manager_status_mut(conn)
    .transaction_state()
    .and_then(|state| state.change_transaction_depth(TransactionDepthChange::IncreaseDepth))
    {
        return Some(Err(error));
    }
    let shared: &diesel_async::AsyncPgConnection = conn;
    let (begun, ran) = super::both(
        async { (&mut &*shared).batch_execute(begin_job()).await },
        diesel_async::RunQueryDsl::execute(first, &mut &*shared),
    )
    .await;
    Some(match begun {
        Ok(()) => Ok((Nesting::Outermost, ran)),
        Err(error) => {
            let rolled_back = conn.batch_execute("ROLLBACK").await;
            super::forget_async(conn, rolled_back.is_err());
            Err(error)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{DEADLOCK_DETECTED, IN_FAILED_TRANSACTION, USER_CANCELED, WAIT_CANCELED};

    /// The claim's refusal outside the job's transaction says what the runtime looks for
    /// (`crate::error::OUTSIDE_JOB`, its quote doubled in SQL), and checks the mark `begin_job`
    /// sets.
    #[test]
    fn the_own_claim_refuses_in_the_words_the_runtime_reads() {
        use crate::sql::SqlText as _;
        let sql = super::OwnClaimInsert::SQL;
        assert!(sql.contains(&crate::error::OUTSIDE_JOB.replace('\'', "''")));
        assert!(sql.contains("current_setting('idempotent.job', true)"));
        assert!(super::begin_job().contains("SET LOCAL idempotent.job = 'on'"));
    }

    /// A statement canceled at an operator's request (`pg_cancel_backend`, at a job's `COMMIT`
    /// running a slow deferred trigger, say) rolled back what it was part of, and a later try can
    /// succeed: its error says retrying helps, in any language, and the runtime does not retry
    /// it on its own. Before, it said retrying does not help, and the redelivery then ran.
    #[test]
    fn a_statement_canceled_at_a_request_is_retryable_not_retried() {
        use crate::store::{Database as _, Fault};
        for message in [
            "canceling statement due to user request",
            "FEHLER:  storniere Anfrage wegen Benutzeraufforderung",
        ] {
            let error = diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::Unknown,
                Box::new(message.to_owned()),
            );
            assert!(super::PostgresDb::passes(&error), "{message}");
            assert_eq!(
                super::PostgresDb::classify(&error),
                Fault::Other,
                "{message}"
            );
        }
    }

    /// The translations of `msgid` in a GNU message catalog (`.mo`): its header, then two tables
    /// of (length, offset) pairs, the originals' and the translations', in the file's byte order.
    fn translation(catalog: &[u8], msgid: &str) -> Option<String> {
        let word = |at: usize, little: bool| -> usize {
            let bytes: [u8; 4] = catalog[at..at + 4].try_into().expect("4 bytes");
            let n = if little {
                u32::from_le_bytes(bytes)
            } else {
                u32::from_be_bytes(bytes)
            };
            n as usize
        };
        let little = catalog[..4] == [0xde, 0x12, 0x04, 0x95];
        let (count, originals, translations) =
            (word(8, little), word(12, little), word(16, little));
        let text = |table: usize, index: usize| {
            let (length, offset) = (
                word(table + 8 * index, little),
                word(table + 8 * index + 4, little),
            );
            &catalog[offset..offset + length]
        };
        (0..count)
            .find(|&index| text(originals, index) == msgid.as_bytes())
            .map(|index| String::from_utf8_lossy(text(translations, index)).into_owned())
    }

    /// Every language PostgreSQL's installed message catalogs translate the messages
    /// `classify` reads into is known to it: a server set up in that language (its
    /// `lc_messages`) says "Verklemmung (Deadlock) entdeckt", and a deadlock read as another
    /// failure would not be retried, and would say that retrying cannot help.
    #[test]
    fn server_messages_are_known_in_every_language() {
        let catalogs: Vec<_> = std::fs::read_dir("/usr/share/locale")
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path().join("LC_MESSAGES/postgres-15.mo"))
            .filter(|path| path.exists())
            .collect();
        assert!(
            catalogs.len() >= 10,
            "PostgreSQL 15's message catalogs are not under /usr/share/locale/*/LC_MESSAGES/postgres-15.mo: install the package postgresql-15 (scripts/test does)"
        );
        for path in catalogs {
            let catalog = std::fs::read(&path).expect("the catalog reads");
            for (msgid, known) in [
                ("deadlock detected", DEADLOCK_DETECTED),
                ("canceling statement due to lock timeout", WAIT_CANCELED),
                (
                    "canceling statement due to statement timeout",
                    WAIT_CANCELED,
                ),
                (
                    "current transaction is aborted, commands ignored until end of transaction block",
                    IN_FAILED_TRANSACTION,
                ),
                ("canceling statement due to user request", USER_CANCELED),
            ] {
                assert!(known.contains(&msgid), "{msgid} itself");
                if let Some(translated) = translation(&catalog, msgid) {
                    assert!(
                        known.iter().any(|k| translated.contains(k)),
                        "{}: {msgid:?} reads {translated:?}, which classify does not know",
                        path.display()
                    );
                }
            }
            // The server's ways of saying it ends the connection.
            for msgid in [
                "terminating connection because of crash of another server process",
                "terminating connection because of unexpected SIGQUIT signal",
                "terminating connection because protocol synchronization was lost",
                "terminating connection due to administrator command",
                "terminating connection due to conflict with recovery",
                "terminating connection due to idle-in-transaction timeout",
                "terminating connection due to idle-session timeout",
                "terminating connection due to immediate shutdown command",
                "terminating connection due to unexpected postmaster exit",
            ] {
                let translated = translation(&catalog, msgid).unwrap_or_else(|| msgid.to_owned());
                let lowered = translated.to_ascii_lowercase();
                assert!(
                    crate::lost::POSTGRES
                        .iter()
                        .any(|known| lowered.contains(&known.to_ascii_lowercase())),
                    "{}: {msgid:?} reads {translated:?}, which is not known as a lost connection",
                    path.display()
                );
            }
        }
    }
}
