//! Beyond one database server: a three-node MariaDB Galera cluster, a PostgreSQL primary with a
//! standby that is promoted when the primary dies (synchronous and asynchronous replication), and
//! PgBouncer in transaction pooling mode; and a MariaDB server with statement-based binary
//! logging. Each setup runs on servers this test starts for itself
//! on loopback (its own ports and data directories, never the machine's servers on 5432/3306),
//! and stops and removes them however the test ends.
//!
//! Workers are threads with connections of their own, sync and async side by side, fed by an
//! in-process at-least-once queue (`support/cluster_workers.rs`). Faults are injected at points
//! the test chooses (after a given number of acknowledgements, or while a job is paused inside
//! its transaction), and every wait is bounded.
//!
//! Needs `galera-4`, `mariadb-server`, `postgresql-15` and `pgbouncer` (Debian packages;
//! `scripts/test` installs them).

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;

#[path = "support/cluster_workers.rs"]
mod cluster_workers;
#[path = "support/figures.rs"]
mod figures;
#[path = "support/galera.rs"]
mod galera;
#[path = "support/mariadb.rs"]
mod mariadb;
#[path = "support/names.rs"]
mod names;
#[path = "support/operator_cli.rs"]
mod operator_cli;
#[path = "support/postgres_cluster.rs"]
mod postgres_cluster;
#[path = "support/processes.rs"]
mod processes;
#[path = "support/stall_proxy.rs"]
mod stall_proxy;

use cluster_workers::{
    Broker, ConnOptions, EFFECTS_MYSQL, EFFECTS_POSTGRES, Event, Failure, Kind, WorkerSpec,
};
use galera::Galera;
use postgres_cluster::{PgBouncer, Postgres, Replication};

/// One setup at a time: each starts several servers, and the machine has two cores.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `count` jobs named `prefix-i`, the first `raced` of them delivered twice, back to back.
fn jobs(prefix: &str, count: usize, raced: usize) -> Vec<(String, usize)> {
    (0..count)
        .map(|i| (format!("{prefix}-{i}"), if i < raced { 2 } else { 1 }))
        .collect()
}

/// Every job's effect exists exactly once, and `done_jobs` holds one claim per job.
fn assert_exactly_once(what: &str, counts: &cluster_workers::Counts, jobs: &[(String, usize)]) {
    let expected: BTreeSet<&String> = jobs.iter().map(|(job, _)| job).collect();
    let missing: Vec<&&String> = expected
        .iter()
        .filter(|job| !counts.effects.contains_key(**job))
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: jobs with no effect: {missing:?}"
    );
    let doubled: Vec<(&String, &i64)> = counts.effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "{what}: jobs whose effect exists more than once: {doubled:?}"
    );
    assert_eq!(
        counts.effects.len(),
        jobs.len(),
        "{what}: effects of unknown jobs"
    );
    assert_eq!(
        counts.claims,
        jobs.len() as i64,
        "{what}: one claim per job"
    );
}

// ---- PgBouncer -----------------------------------------------------------------------------------

/// Connections through PgBouncer in transaction pooling mode with Diesel's default statement
/// cache: what breaks. Two sync workers (whose cached statements are named `__diesel_stmt_<n>`
/// per connection, so two connections name different statements alike) and two async workers
/// (named `s<n>` per process) share two server connections.
fn pgbouncer_with_statement_cache(bouncer: &PgBouncer, runs: usize) -> Vec<String> {
    let broker = Broker::new();
    let specs = [
        Kind::SyncPostgres,
        Kind::SyncPostgres,
        Kind::AsyncPostgres,
        Kind::AsyncPostgres,
    ]
    .into_iter()
    .map(|kind| WorkerSpec {
        kind,
        urls: vec![bouncer.url()],
        options: ConnOptions::default(),
    })
    .collect();
    let jobs = jobs("cached", runs, 0);
    broker.publish(&jobs);
    let workers = cluster_workers::spawn(&broker, specs, &cluster_workers::no_hook());
    // Failed deliveries go back to the queue; a bounded look at what the workers met is enough.
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && broker.acked() < runs {
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster_workers::stop(&broker, workers);
    let tally = broker.tally();
    let mut errors: Vec<String> = tally
        .migrate_failures
        .iter()
        .cloned()
        .chain(tally.unexpected.iter().cloned())
        .collect();
    errors.sort();
    errors.dedup();
    errors
}

/// Terminates the server connection of a job held inside its transaction (idle in it for a
/// second or more, where a running job's connection is idle in its transaction only between two
/// statements): PgBouncer then closes the client's connection. Waits up to a minute for one.
/// How a worker behind PgBouncer in transaction mode connects (docs/clusters.md): Diesel's
/// statement cache off, async connections made by `pooler::establish_async_pg`.
fn through_the_pooler() -> ConnOptions {
    ConnOptions {
        statement_cache: false,
        session: None,
        through_pooler: true,
    }
}

/// Six workers through `bouncer`, sync and async PostgreSQL in turn.
fn pooled_workers(bouncer: &PgBouncer, options: &ConnOptions) -> Vec<WorkerSpec> {
    [Kind::SyncPostgres, Kind::AsyncPostgres]
        .into_iter()
        .cycle()
        .take(6)
        .map(|kind| WorkerSpec {
            kind,
            urls: vec![bouncer.url()],
            options: options.clone(),
        })
        .collect()
}

/// Prints, under `heading`, the events of `broker`'s log that `keep` keeps, in order: for a
/// failure message.
fn print_trail(broker: &Broker, heading: &str, keep: impl Fn(&Event) -> bool) {
    let trail: Vec<String> = broker
        .state()
        .events
        .iter()
        .filter(|e| keep(e))
        .map(|e| format!("{e:?}"))
        .collect();
    eprintln!("{heading}:\n{}", trail.join("\n"));
}

fn terminate_held_transaction(server_port: u16) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let terminated = terminate_idle_transactions(server_port);
        if terminated > 0 || Instant::now() >= deadline {
            return terminated;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn terminate_idle_transactions(server_port: u16) -> usize {
    #[derive(QueryableByName)]
    struct Terminated {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        terminated: bool,
    }
    let url = Postgres::url_of(server_port, "postgres");
    let mut conn = PgConnection::establish(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let rows: Vec<Terminated> = diesel::sql_query(
        "SELECT pg_terminate_backend(pid) AS terminated FROM pg_stat_activity \
         WHERE datname = 'test' AND state = 'idle in transaction' \
         AND state_change < clock_timestamp() - INTERVAL '1 second'",
    )
    .load(&mut conn)
    .expect("pg_terminate_backend");
    rows.iter().filter(|r| r.terminated).count()
}

/// The keys API through PgBouncer in transaction mode, on async connections (whose statements
/// are always named: prepared and executed in two exchanges, each of which the pooler may send to
/// another server connection, where another client's statement may have the name). Three clients
/// at once: one looks keys up, one lists them, one forgets others; every call succeeds, every
/// key looked up is found, every key forgotten is gone, and no other key is. Runs on `direct`'s
/// tables, which it migrates and then leaves empty.
fn keys_api_through_the_pooler(bouncer: &PgBouncer, direct: &str) -> String {
    use idempotent_jobs::JobKey;
    static POOLED: idempotent_jobs::Job = idempotent_jobs::Job::new("pooled", "pooled:<n>");
    const KEYS: usize = 60;
    let mut setup = PgConnection::establish(direct).expect("the server");
    idempotent_jobs::migrate(&mut setup).expect("the runtime's tables");
    let key = |n: usize| JobKey::new(format!("pooled:{n}"));
    for n in 0..2 * KEYS {
        let ran = idempotent_jobs::run(&mut setup, &POOLED, &key(n), |_| {
            Ok::<_, idempotent_jobs::Error>(n)
        })
        .expect("a job");
        assert!(ran.is_ran());
    }
    let runtime = three_threads();
    let url = bouncer.url();
    let (looked_up, listed, forgot) = runtime.block_on(async {
        let connect = || async {
            idempotent_jobs::pooler::establish_async_pg(&url)
                .await
                .expect("through PgBouncer")
        };
        let (mut reader, mut lister, mut forgetter) =
            (connect().await, connect().await, connect().await);
        let reading = async {
            let mut found = 0;
            for round in 0..5 {
                for n in 0..KEYS {
                    let record = idempotent_jobs::keys::lookup_async(&mut reader, &key(n))
                        .await
                        .unwrap_or_else(|e| panic!("lookup {n} (round {round}): {e}"));
                    assert!(record.is_some(), "key {n}, never forgotten, was found");
                    found += 1;
                }
            }
            found
        };
        let listing = async {
            let mut listed = 0;
            for _ in 0..20 {
                let rows = idempotent_jobs::keys::list_async(
                    &mut lister,
                    &idempotent_jobs::keys::KeyQuery::default()
                        .job("pooled")
                        .limit(500),
                )
                .await
                .unwrap_or_else(|e| panic!("list: {e}"));
                assert!(rows.len() >= KEYS, "{} keys listed", rows.len());
                listed += 1;
            }
            listed
        };
        let forgetting = async {
            let mut forgot = 0;
            for n in KEYS..2 * KEYS {
                assert!(
                    idempotent_jobs::keys::forget_async(&mut forgetter, &key(n), "the test")
                        .await
                        .unwrap_or_else(|e| panic!("forget {n}: {e}")),
                    "key {n} was there to forget"
                );
                forgot += 1;
            }
            forgot
        };
        tokio::join!(reading, listing, forgetting)
    });
    let connects = connects_through_the_pooler(bouncer);
    let mut check = PgConnection::establish(direct).expect("the server");
    for n in 0..2 * KEYS {
        let there = idempotent_jobs::keys::lookup(&mut check, &key(n))
            .expect("a lookup")
            .is_some();
        assert_eq!(there, n < KEYS, "key {n}: forgotten exactly when asked");
    }
    check
        .batch_execute("DROP TABLE done_jobs, outbox, idempotent_schema")
        .expect("empty again");
    format!(
        "{looked_up} look-ups, {listed} lists, {forgot} forgets: all succeeded, each key as it \
         should be; {connects}"
    )
}

/// A multi-threaded tokio runtime of three worker threads, for the async clients of PgBouncer.
fn three_threads() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Async connects through PgBouncer, twenty clients at once, three connects each: with
/// diesel-async's `establish`, whose setup sends two named statements outside a transaction (the
/// count of failed connects is reported, not asserted: it depends on timing), and with
/// `pooler::establish_async_pg`, directly and as a deadpool pool's `custom_setup`, which must all
/// connect and then run a look-up. Needs `direct`'s tables.
fn connects_through_the_pooler(bouncer: &PgBouncer) -> String {
    use diesel_async::AsyncConnection as _;
    use diesel_async::pooled_connection::deadpool::Pool;
    use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
    const CLIENTS: usize = 20;
    const EACH: usize = 3;
    let runtime = three_threads();
    let url = bouncer.url();
    let key = idempotent_jobs::JobKey::new("pooled:none");
    runtime.block_on(async {
        let mut plain = tokio::task::JoinSet::new();
        for _ in 0..CLIENTS {
            let url = url.clone();
            plain.spawn(async move {
                let mut errors = Vec::new();
                for _ in 0..EACH {
                    if let Err(e) = diesel_async::AsyncPgConnection::establish(&url).await {
                        errors.push(e.to_string());
                    }
                }
                errors
            });
        }
        let mut plain_errors = Vec::new();
        while let Some(errors) = plain.join_next().await {
            plain_errors.extend(errors.expect("a connecting task"));
        }

        let mut wrapped = tokio::task::JoinSet::new();
        for client in 0..CLIENTS {
            let (url, key) = (url.clone(), key.clone());
            wrapped.spawn(async move {
                for n in 0..EACH {
                    let mut conn = idempotent_jobs::pooler::establish_async_pg(&url)
                        .await
                        .unwrap_or_else(|e| panic!("client {client}, connect {n}: {e}"));
                    let found = idempotent_jobs::keys::lookup_async(&mut conn, &key)
                        .await
                        .unwrap_or_else(|e| panic!("client {client}, connect {n}: {e}"));
                    assert!(found.is_none(), "a key never run");
                }
            });
        }
        while let Some(done) = wrapped.join_next().await {
            done.expect("every connect through pooler::establish_async_pg succeeds");
        }

        let mut config = ManagerConfig::default();
        config.custom_setup =
            Box::new(|url| Box::pin(idempotent_jobs::pooler::establish_async_pg(url)));
        let manager =
            AsyncDieselConnectionManager::<diesel_async::AsyncPgConnection>::new_with_config(
                url.clone(),
                config,
            );
        let pool = Pool::builder(manager)
            .max_size(CLIENTS)
            .build()
            .expect("a pool");
        let mut pooled = tokio::task::JoinSet::new();
        for client in 0..CLIENTS {
            let (pool, key) = (pool.clone(), key.clone());
            pooled.spawn(async move {
                let mut conn = pool
                    .get()
                    .await
                    .unwrap_or_else(|e| panic!("pooled client {client}: {e}"));
                let found = idempotent_jobs::keys::lookup_async(&mut *conn, &key)
                    .await
                    .unwrap_or_else(|e| panic!("pooled client {client}: {e}"));
                assert!(found.is_none(), "a key never run");
                // Hold it, so that the pool makes a connection for every client.
                tokio::time::sleep(Duration::from_millis(200)).await;
            });
        }
        while let Some(done) = pooled.join_next().await {
            done.expect("every pooled connection made by pooler::establish_async_pg works");
        }
        let made = pool.status().size;
        assert_eq!(made, CLIENTS, "the pool made a connection per client");

        format!(
            "{} connects, {CLIENTS} at once: diesel-async's establish failed {} (first: {:?}); \
             pooler::establish_async_pg failed none of {}, nor the pool's {made}",
            CLIENTS * EACH,
            plain_errors.len(),
            plain_errors.first(),
            CLIENTS * EACH
        )
    })
}

/// Sync and async workers through PgBouncer in transaction pooling mode, with fewer server
/// connections than workers: every worker migrates at start, keys race, and server connections
/// are terminated under jobs paused inside their transactions.
#[test]
fn pgbouncer_transaction_pooling() {
    const JOBS: usize = 300;
    const RACED: usize = 100;
    const TERMINATIONS: usize = 4;
    let _serial = serial();
    let started = Instant::now();
    let mut pg = Postgres::single("pgbouncer");
    let bouncer = PgBouncer::start(&mut pg, 3);
    let direct = Postgres::url_of(pg.primary.port, "test");
    postgres_cluster::execute(&direct, EFFECTS_POSTGRES);

    // What breaks with Diesel's default: cached statements are per client connection, prepared
    // statements per server connection, and PgBouncer swaps the second under the first.
    let keys_figures = keys_api_through_the_pooler(&bouncer, &direct);
    let cached_errors = pgbouncer_with_statement_cache(&bouncer, 100);
    assert!(
        cached_errors
            .iter()
            .any(|e| e.contains("prepared statement")),
        "with the statement cache on, PgBouncer 1.18 in transaction mode is expected to break \
         prepared statements; the workers met: {cached_errors:?}"
    );
    // Start again from empty tables.
    postgres_cluster::execute(
        &direct,
        "DROP TABLE done_jobs, outbox, idempotent_schema; TRUNCATE effects",
    );

    let broker = Broker::new();
    let jobs = jobs("bouncer", JOBS, RACED);
    let paused: Vec<String> = (0..TERMINATIONS)
        .map(|k| format!("bouncer-{}", RACED + 40 + k * 40))
        .collect();
    let hook = cluster_workers::hold_once(&broker, &paused);
    let options = through_the_pooler();
    let specs = pooled_workers(&bouncer, &options);
    broker.publish(&jobs);
    let workers = cluster_workers::spawn(&broker, specs, &hook);
    let mut terminated = 0;
    for k in 1..=TERMINATIONS {
        broker.wait(
            &format!("job {k} of {TERMINATIONS} pausing inside its transaction"),
            Duration::from_secs(60),
            |s| Broker::paused(s) >= k,
        );
        broker.event(Event::Fault(format!(
            "terminating the server connection under paused job {k}"
        )));
        terminated += terminate_held_transaction(pg.primary.port);
        let held = Broker::held(&broker.state(), k)
            .expect("the job held")
            .to_owned();
        broker.release(&held);
    }
    broker.wait_all_acked(Duration::from_secs(120));
    cluster_workers::stop(&broker, workers);
    let tally = broker.tally();
    let counts = cluster_workers::counts_postgres(&direct);
    figures::report(&format!(
        "pgbouncer keys API (async, statement cache off, 3 server connections): {keys_figures}"
    ));
    figures::report(&format!(
        "pgbouncer (transaction pooling, 3 server connections, 6 workers: 3 sync, 3 async, statement cache off): \
         jobs {JOBS}, raced keys {RACED}, server connections terminated under paused jobs {terminated}, \
         failed deliveries {}, reconnects {}, ran {}, replays {}, effects {}, claims {}, in {:.1?}; \
         with the cache on: {}",
        tally.total_failures(),
        tally.connects - 6,
        tally.runs(),
        tally.replays,
        counts.total_effects(),
        counts.claims,
        started.elapsed(),
        cached_errors
            .iter()
            .map(|e| e.split(": ").last().unwrap_or(e).to_owned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
            .join("; ")
    ));
    assert!(
        tally.migrate_failures.is_empty(),
        "six workers migrating at once through PgBouncer: {:?}",
        tally.migrate_failures
    );
    assert!(
        tally.unexpected.is_empty(),
        "failures before any fault: {:?}",
        tally.unexpected
    );
    assert_eq!(
        terminated, TERMINATIONS,
        "each paused job's server connection was terminated"
    );
    assert!(
        tally.total_failures() >= TERMINATIONS,
        "each terminated job failed and went back to the queue: {:?}",
        tally.failures
    );
    if counts.effects.values().any(|n| *n != 1) {
        // What the workers saw of each failed delivery and of the faults, for a doubled effect
        // (seen once in CI: one effect more than the workers' reports of `Ran`, beside two
        // failed deliveries more than the terminations made).
        print_trail(
            &broker,
            "through PgBouncer, the failures and faults in order",
            |e| {
                matches!(
                    e,
                    Event::Failed { .. } | Event::Fault(_) | Event::Paused { .. }
                ) || matches!(e, Event::Ran { job, .. } | Event::Replayed { job, .. }
                    if counts.effects.get(job).is_some_and(|n| *n != 1))
            },
        );
    }
    assert_exactly_once("through PgBouncer", &counts, &jobs);
    assert!(
        tally.ran.values().all(|n| *n == 1),
        "each job ran once, as the workers saw it"
    );
    assert_eq!(tally.runs(), JOBS);
    assert_eq!(
        tally.replays, RACED,
        "every second copy of a raced job replayed"
    );

    // Redeliveries through the pooler, sync and async: a read before the claim runs outside a
    // transaction, which transaction pooling cannot serve (its prepare and execute may reach two
    // server connections). Either the read works or the runtime turns reading first off and
    // claims; every redelivery replays, and nothing runs twice.
    use cluster_workers::WorkerConn as _;
    let mut sync_conn = PgConnection::connect(&bouncer.url(), &options)
        .expect("a sync connection through PgBouncer");
    let mut async_conn = cluster_workers::Async::<diesel_async::AsyncPgConnection>::connect(
        &bouncer.url(),
        &options,
    )
    .expect("an async connection through PgBouncer");
    for (n, (job, _)) in jobs.iter().take(60).enumerate() {
        let attempt = if n % 2 == 0 {
            idempotent_jobs::redelivered(true, || sync_conn.apply(job, 99, &|_: &str| {}))
        } else {
            idempotent_jobs::redelivered(true, || async_conn.apply(job, 99, &|_: &str| {}))
        }
        .unwrap_or_else(|e| panic!("{job} redelivered through PgBouncer: {e}"));
        assert_ne!(
            attempt, 99,
            "{job} replayed its first run, it did not run again"
        );
    }
    let counts = cluster_workers::counts_postgres(&direct);
    assert_exactly_once("redelivered through PgBouncer", &counts, &jobs);
}

/// Through PgBouncer in transaction mode, with workers connected as docs/clusters.md says, two
/// clients of the same pooler that connect with diesel-async's own `establish` (its session setup
/// prepared and executed outside a transaction, in two exchanges PgBouncer 1.18 may send to two
/// server connections), over and over. PgBouncer then loses track of which client a server
/// connection's answers are for, and a worker's statements reach the server outside the
/// transaction it opened. Before the runtime's claims checked that they run in their job's
/// transaction, one worker's `BEGIN` went to one server connection and its claim and its body's
/// insert to two others, each committed on its own, the failed release was read as a body's
/// `COMMIT` and took the claim back, and the job ran twice (1 run in 2 of 1,500 jobs; the same
/// with the workers themselves reconnecting with `establish` under terminated server
/// connections, 2 runs in 13). Such a claim is now refused, nothing of the job runs, and the next
/// delivery runs it (tests/jobs/pipeline.rs shows that case alone, deterministically).
///
/// What no check of the runtime's can stop on such a pooler is a statement of the body sent
/// elsewhere after the claim: no statement of the user's carries the job's mark. So this test
/// asserts the promise that holds regardless, that what a call reports is what the database
/// holds: every job's effect is there, one claim per job, and a job whose effect is there twice
/// had a delivery that said its work may have been committed. It reports how many there were
/// (none in 16 runs since the check).
#[test]
fn pgbouncer_crossed_by_other_clients_tells_every_outcome_truly() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const JOBS: usize = 1500;
    const RACED: usize = 300;
    let _serial = serial();
    let mut pg = Postgres::single("pgbouncer-crossed");
    let bouncer = PgBouncer::start(&mut pg, 3);
    let direct = Postgres::url_of(pg.primary.port, "test");
    postgres_cluster::execute(&direct, EFFECTS_POSTGRES);
    let broker = Broker::new();
    let jobs = jobs("crossed", JOBS, RACED);
    let specs = pooled_workers(&bouncer, &through_the_pooler());
    broker.publish(&jobs);
    let workers = cluster_workers::spawn(&broker, specs, &cluster_workers::no_hook());
    let stop = AtomicBool::new(false);
    let rogue_failed = AtomicUsize::new(0);
    let rogue_connects = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                while !stop.load(Ordering::Relaxed) {
                    let connected = runtime.block_on(
                        <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(
                            &bouncer.url(),
                        ),
                    );
                    rogue_connects.fetch_add(1, Ordering::Relaxed);
                    if connected.is_err() {
                        rogue_failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        broker.wait_all_acked(Duration::from_secs(240));
        stop.store(true, Ordering::Relaxed);
    });
    cluster_workers::stop(&broker, workers);
    let tally = broker.tally();
    let counts = cluster_workers::counts_postgres(&direct);
    let events = broker.state().events.clone();
    let failures_of = |job: &str| -> Vec<&str> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Failed { job: j, error, .. } if j == job => Some(error.as_str()),
                _ => None,
            })
            .collect()
    };
    let doubled: Vec<&String> = counts
        .effects
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(job, _)| job)
        .collect();
    // A job whose work may have been committed says so: "may or may not have been committed",
    // "may be committed", "the work before it was committed", ...; "nothing of the job was
    // committed" and a lost connection's "nothing ... committed" do not.
    let unannounced: Vec<&&String> = doubled
        .iter()
        .filter(|job| {
            !failures_of(job)
                .iter()
                .any(|error| !error.contains("nothing of the job was committed"))
        })
        .collect();
    let refused = events
        .iter()
        .filter(|e| matches!(e, Event::Failed { error, .. } if error.contains("the claim did not run in the transaction the job opened")))
        .count();
    figures::report(&format!(
        "pgbouncer crossed (transaction pooling, 3 server connections, 6 workers: 3 sync, 3 async, \
         connected as docs/clusters.md says; 2 clients connecting with diesel-async's own establish, \
         {} connects, {} of them failed): jobs {JOBS}, raced keys {RACED}, failed deliveries {}, \
         claims refused outside their job's transaction {refused}, ran {}, replays {}, effects {}, \
         claims {}, jobs whose effect is there twice {} (each announced by a failure that said \
         its work may be committed: {}), in {:.1?}",
        rogue_connects.load(Ordering::Relaxed),
        rogue_failed.load(Ordering::Relaxed),
        tally.total_failures(),
        tally.runs(),
        tally.replays,
        counts.total_effects(),
        counts.claims,
        doubled.len(),
        doubled.len() - unannounced.len(),
        started.elapsed(),
    ));
    if !unannounced.is_empty() {
        print_trail(
            &broker,
            "the deliveries of the jobs whose effect is there twice unannounced",
            |e| {
                matches!(e, Event::Failed { job, .. } | Event::Ran { job, .. } | Event::Replayed { job, .. }
                    if unannounced.iter().any(|u| **u == job))
            },
        );
    }
    assert!(
        rogue_failed.load(Ordering::Relaxed) > 0,
        "diesel-async's own establish through PgBouncer 1.18 in transaction mode is expected to \
         fail at times (its setup's two exchanges sent to two server connections); none did, so \
         the pooler was not crossed and the test showed nothing"
    );
    let missing: Vec<&String> = jobs
        .iter()
        .map(|(job, _)| job)
        .filter(|job| !counts.effects.contains_key(*job))
        .collect();
    assert!(missing.is_empty(), "jobs with no effect: {missing:?}");
    assert_eq!(counts.claims, JOBS as i64, "one claim per job");
    assert!(
        unannounced.is_empty(),
        "jobs whose effect is there twice while every failure of theirs said nothing was \
         committed: {unannounced:?}"
    );
}

/// The operator CLI through PgBouncer in transaction mode, as an operator whose `DATABASE_URL`
/// is the application's (the pooler's) runs it, while workers run jobs through the same pooler:
/// a prune in batches of one, a listing and `verify` all succeed, and the prune removes every
/// lapsed key. The CLI's `PgConnection` kept Diesel's statement cache on: each of its statements
/// was prepared under a name once (inside a transaction, on whichever server connection the
/// pooler lent it) and executed by that name in the transactions after, which the pooler may
/// send to another server connection, where no statement has the name.
#[test]
fn the_operator_cli_works_through_pgbouncer() {
    const LAPSED: usize = 40;
    let _serial = serial();
    let mut pg = Postgres::single("pgbouncer-cli");
    let bouncer = PgBouncer::start(&mut pg, 3);
    let direct = Postgres::url_of(pg.primary.port, "test");
    postgres_cluster::execute(&direct, EFFECTS_POSTGRES);
    let mut setup = PgConnection::establish(&direct).expect("the server");
    idempotent_jobs::migrate(&mut setup).expect("the runtime's tables");
    postgres_cluster::execute(
        &direct,
        &format!(
            "INSERT INTO done_jobs (key_digest, job_key, job_name, claim_token, result, done_at, expires_at) \
             SELECT sha256(convert_to('lapsed:' || i, 'UTF8')), 'lapsed:' || i, 'lapsed', i, '', \
             now() - INTERVAL '2 days', now() - INTERVAL '1 day' FROM generate_series(1, {LAPSED}) i"
        ),
    );
    // Workers keep the pooler's server connections busy, so that the CLI's transactions go to
    // whichever is free.
    let broker = Broker::new();
    let jobs = jobs("cli", 3000, 0);
    broker.publish(&jobs);
    let workers = cluster_workers::spawn(
        &broker,
        pooled_workers(&bouncer, &through_the_pooler()),
        &cluster_workers::no_hook(),
    );
    let dir = std::env::temp_dir().join(names::unique_name("pgbouncer_cli_cwd"));
    std::fs::create_dir_all(&dir).expect("a working directory");
    let run = |args: &[&str]| {
        let output = operator_cli::run(&bouncer.url(), args, &dir);
        let shown = format!(
            "idempotent-jobs {}: exit {:?}\n{}{}",
            args.join(" "),
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.code(), shown)
    };
    let pruned = run(&["prune", "--batch-size", "1", "--pace", "0"]);
    let listed = run(&["keys", "list", "--limit", "5"]);
    let verified = run(&["verify"]);
    broker.wait_all_acked(Duration::from_secs(120));
    cluster_workers::stop(&broker, workers);
    let _ = std::fs::remove_dir_all(&dir);
    for (code, shown) in [&pruned, &listed, &verified] {
        assert_eq!(*code, Some(0), "{shown}");
    }
    #[derive(QueryableByName)]
    struct Left {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let left: Vec<Left> =
        diesel::sql_query("SELECT COUNT(*) AS n FROM done_jobs WHERE job_name = 'lapsed'")
            .load(&mut setup)
            .expect("counting the lapsed keys");
    assert_eq!(left[0].n, 0, "every lapsed key pruned: {}", pruned.1);
    assert_exactly_once(
        "beside the CLI",
        &cluster_workers::counts_postgres(&direct),
        &jobs,
    );
}

// ---- MariaDB Galera --------------------------------------------------------------------------------

/// Every node migrating at the same moment, as workers started together on a cluster do, each
/// calling `migrate` again after a failure. Returns the failed attempts.
fn migrate_on_every_node(galera: &Galera) -> Vec<String> {
    let barrier = std::sync::Barrier::new(galera.nodes.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..galera.nodes.len())
            .map(|i| {
                let url = galera.url(i, "cluster");
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut conn =
                        MysqlConnection::establish(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
                    barrier.wait();
                    let mut failed = Vec::new();
                    while let Err(error) = idempotent_jobs::migrate(&mut conn) {
                        failed.push(format!("node {i}: {error}"));
                        assert!(
                            failed.len() < 10,
                            "migrate on node {i} kept failing: {failed:?}"
                        );
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    failed
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a migrating thread"))
            .collect()
    })
}

/// A job runs on node 0, and its redelivery comes at once to a worker on node 1, which may not
/// have applied the first run's write yet. Returns how many of `count` redeliveries ran their
/// body and then lost at commit (to be replayed by the next redelivery), with `wsrep_sync_wait`
/// at `sync_wait` on node 1's session.
fn redeliveries_to_a_lagging_node(galera: &Galera, count: usize, sync_wait: u8) -> usize {
    with_node_1_lagging(galera, sync_wait, |first, second, reconnect| {
        redeliver(first, second, reconnect, count, sync_wait)
    })
}

/// Runs `work` with a connection to node 0 and one to node 1, whose applier other writes keep
/// busy, so that node 1 lags behind what the cluster has committed, as a loaded node does; node
/// 1's session has `wsrep_sync_wait` at `sync_wait`, and is reached through a proxy that cuts a
/// session the server stopped answering (see `stall_proxy`).
fn with_node_1_lagging<R>(
    galera: &Galera,
    sync_wait: u8,
    work: impl FnOnce(&mut MysqlConnection, &mut MysqlConnection, &dyn Fn() -> MysqlConnection) -> R,
) -> R {
    use cluster_workers::WorkerConn as _;
    let options = ConnOptions::default();
    let mut first = MysqlConnection::connect(&galera.url(0, "cluster"), &options)
        .unwrap_or_else(|e| panic!("node 0: {e}"));
    let lagging = ConnOptions {
        statement_cache: true,
        session: Some(format!("SET SESSION wsrep_sync_wait = {sync_wait}")),
        through_pooler: false,
    };
    let proxy = stall_proxy::StallProxy::start(galera.nodes[1].port, Duration::from_secs(20));
    let second_url = format!("mysql://root@127.0.0.1:{}/cluster", proxy.port());
    let connect_second = || {
        MysqlConnection::connect(&second_url, &lagging).unwrap_or_else(|e| panic!("node 1: {e}"))
    };
    let mut second = connect_second();
    let loading = std::sync::atomic::AtomicBool::new(true);
    let url = galera.url(2, "cluster");
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut loader =
                MysqlConnection::establish(&url).unwrap_or_else(|e| panic!("node 2: {e}"));
            // At most 2 MB a round and 150 rounds, so that the nodes' disks never fill.
            for _ in 0..150 {
                if !loading.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                loader
                    .batch_execute(
                        "INSERT INTO filler (pad) SELECT REPEAT('x', 500) FROM seq_1_to_4000",
                    )
                    .unwrap_or_else(|e| panic!("loading node 2: {e}"));
            }
        });
        // Stops the loader however this returns, a failed assertion included.
        struct StopLoading<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopLoading<'_> {
            fn drop(&mut self) {
                self.0.store(false, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let _stop = StopLoading(&loading);
        let result = work(&mut first, &mut second, &connect_second);
        if proxy.cuts() > 0 {
            figures::report(&format!(
                "galera, wsrep_sync_wait={sync_wait}: node 1 stopped answering a session {} time(s) (a brute-force aborted session left without a reply); each was cut and its job delivered again",
                proxy.cuts()
            ));
        }
        result
    })
}

static FORGOTTEN: idempotent_jobs::Job = idempotent_jobs::Job::new("forgotten", "forgotten:<n>");

/// A key is done and forgotten on node 0 (an operator lets the job run again), and a redelivery
/// comes at once to a worker on node 1, which may not have applied the forget yet, with its
/// message's redelivered flag set (so it reads its key first). Returns how many of `rounds`
/// replayed the forgotten run instead of running the job.
fn forgets_seen_by_a_lagging_node(galera: &Galera, rounds: usize, sync_wait: u8) -> usize {
    use idempotent_jobs::{JobKey, Outcome};
    with_node_1_lagging(galera, sync_wait, |first, second, reconnect| {
        let mut replayed = 0;
        for n in 0..rounds {
            let key = JobKey::new(format!("forgotten:{sync_wait}:{n}"));
            let run = |conn: &mut MysqlConnection, value: usize| {
                idempotent_jobs::run(conn, &FORGOTTEN, &key, |_| {
                    Ok::<_, idempotent_jobs::Error>(value)
                })
            };
            assert_eq!(run(first, 1).expect("the first run"), Outcome::Ran(1));
            assert!(idempotent_jobs::keys::forget(first, &key, "the test").expect("a forget"));
            let mut tries = 0;
            loop {
                match idempotent_jobs::redelivered(true, || run(second, 2)) {
                    Ok(Outcome::Replayed(_)) => {
                        replayed += 1;
                        break;
                    }
                    Ok(Outcome::Ran(_)) => break,
                    Err(error) => {
                        // A lost session (cut by the proxy) or a write conflict: delivered again.
                        tries += 1;
                        assert!(tries < 10, "{key:?} on node 1: {error}");
                        *second = reconnect();
                    }
                }
            }
        }
        // Out of the run's counts below: this job has no effect of its own. Node 0 applies the
        // last runs node 1 committed in its own time: a causal read first (the README's
        // `wsrep_sync_wait = 1`) waits for them, so that the DELETE finds every row (without it,
        // one was left now and then, and the run's count of claims was one over).
        first
            .batch_execute("SET SESSION wsrep_sync_wait = 1")
            .expect("causal reads");
        let left: i64 = idempotent_jobs::schema::done_jobs::table
            .filter(idempotent_jobs::schema::done_jobs::job_name.eq("forgotten"))
            .count()
            .get_result(first)
            .expect("the keys of this phase");
        first
            .batch_execute("DELETE FROM done_jobs WHERE job_name = 'forgotten'")
            .expect("the keys of this phase gone");
        assert!(left > 0, "this phase's keys were read");
        replayed
    })
}

fn redeliver(
    first: &mut MysqlConnection,
    second: &mut MysqlConnection,
    reconnect: &dyn Fn() -> MysqlConnection,
    count: usize,
    sync_wait: u8,
) -> usize {
    use cluster_workers::WorkerConn as _;
    let mut wasted = 0;
    for k in 0..count {
        let job = format!("lag{sync_wait}-{k}");
        let ran = first
            .apply(&job, 1, &|_: &str| {})
            .unwrap_or_else(|e| panic!("{job} on node 0: {e}"));
        let mut tries = 0;
        let replayed = loop {
            match second.apply(&job, 2, &|_: &str| {}) {
                Ok(result) => break result,
                // The stall proxy cut a session the server stopped answering: a new connection.
                Err(error) if is_lost_connection(&error) => {
                    *second = reconnect();
                    tries += 1;
                    assert!(
                        tries < 10,
                        "{job}: node 1 kept dropping the session: {error}"
                    );
                }
                Err(error) => {
                    assert!(
                        matches!(
                            cluster_workers::classify(&error),
                            Failure::CertificationAtCommit | Failure::ConflictBeforeCommit
                        ),
                        "{job} on node 1: {error}"
                    );
                    wasted += 1;
                    tries += 1;
                    assert!(tries < 10, "{job} kept conflicting on node 1");
                }
            }
        };
        assert_eq!(replayed, ran, "{job}: node 1 replays node 0's result");
    }
    wasted
}

/// Whether a job failed because its connection went away.
fn is_lost_connection(error: &cluster_workers::WorkerError) -> bool {
    says_lost_connection(&cluster_workers::with_causes(error))
}

/// Whether an error's text says its connection went away.
fn says_lost_connection(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    [
        "lost connection",
        "server has gone away",
        "connection reset",
        "broken pipe",
    ]
    .iter()
    .any(|phrase| text.contains(phrase))
}

/// Two workers on two nodes claim one key at the same moment. Neither node has the other's write
/// when it claims, so both claims succeed locally and both bodies run; the first commit to be
/// ordered by the cluster wins, and the other transaction fails with deadlock 1213 (Galera's
/// certification failure, or its brute-force abort if the winner's write was applied first). The
/// loser's redelivery replays the winner's result.
fn certification_conflict(galera: &Galera) -> (Failure, String) {
    use cluster_workers::WorkerConn as _;
    let both_in_body = std::sync::Barrier::new(2);
    let outcomes: Vec<Result<u64, cluster_workers::WorkerError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|node| {
                let url = galera.url(node, "cluster");
                let both_in_body = &both_in_body;
                scope.spawn(move || {
                    let mut conn = MysqlConnection::connect(&url, &ConnOptions::default())
                        .unwrap_or_else(|e| panic!("{url}: {e}"));
                    let hook = |_: &str| {
                        both_in_body.wait();
                    };
                    conn.apply("conflict", node as u64 + 1, &hook)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a racing thread"))
            .collect()
    });
    let winners: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok().copied())
        .collect();
    let errors: Vec<&cluster_workers::WorkerError> =
        outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert_eq!(
        (winners.len(), errors.len()),
        (1, 1),
        "one of two claims racing on two nodes commits, the other fails: {outcomes:?}"
    );
    let failure = cluster_workers::classify(errors[0]);
    assert!(
        matches!(
            failure,
            Failure::CertificationAtCommit | Failure::ConflictBeforeCommit
        ),
        "the loser fails with Galera's deadlock 1213: {}",
        errors[0]
    );
    let loser = usize::from(winners[0] == 1);
    // The loser's redelivery, on its own node, and a third worker on the third node: both replay.
    for node in [loser, 2] {
        let url = galera.url(node, "cluster");
        let mut conn = MysqlConnection::connect(&url, &ConnOptions::default())
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let replayed = conn
            .apply("conflict", 99, &|_: &str| {})
            .unwrap_or_else(|e| panic!("the redelivery on node {node}: {e}"));
        assert_eq!(
            replayed, winners[0],
            "node {node} replays the winner's result"
        );
    }
    let counts = cluster_workers::counts_mysql(&galera.url(2, "cluster"));
    assert_eq!(
        counts.effects.get("conflict"),
        Some(&1),
        "the conflicting key's effect, once"
    );
    (failure, cluster_workers::with_causes(errors[0]))
}

/// Six workers (sync and async, two per node) on three Galera nodes, keys raced across nodes, and
/// one node SIGKILLed a third of the way through: its workers move to another node.
#[test]
fn galera_three_nodes() {
    const JOBS: usize = 300;
    const RACED: usize = 150;
    let _serial = serial();
    let started = Instant::now();
    let mut galera = Galera::start(3);
    let startup = started.elapsed();
    galera.admin(
        0,
        &format!(
            "CREATE DATABASE cluster; USE cluster; {EFFECTS_MYSQL}; \
             CREATE TABLE filler (id BIGINT AUTO_INCREMENT PRIMARY KEY, pad TEXT NOT NULL) ENGINE = InnoDB"
        ),
    );

    let migrate_failures = migrate_on_every_node(&galera);
    let (conflict, conflict_error) = certification_conflict(&galera);
    const LAGGING: usize = 200;
    let wasted_without_causal_reads = redeliveries_to_a_lagging_node(&galera, LAGGING, 0);
    let wasted_with_causal_reads = redeliveries_to_a_lagging_node(&galera, LAGGING, 1);
    const FORGETS: usize = 100;
    let replayed_without_causal_reads = forgets_seen_by_a_lagging_node(&galera, FORGETS, 0);
    let replayed_with_causal_reads = forgets_seen_by_a_lagging_node(&galera, FORGETS, 1);

    let broker = Broker::new();
    let jobs = jobs("galera", JOBS, RACED);
    // Workers reach each node through a proxy that cuts a session gone silent (see `stall_proxy`):
    // the workers stay busy until the queue is empty, so only a server that stopped answering is
    // cut, and the worker reconnects as after any lost connection.
    let proxies: Vec<stall_proxy::StallProxy> = galera
        .nodes
        .iter()
        .map(|node| stall_proxy::StallProxy::start(node.port, Duration::from_secs(30)))
        .collect();
    // TCP only: mysql_async would otherwise move an async worker's session to the node's Unix
    // socket once it learns of it, past the proxy (libmysqlclient ignores the parameter).
    let proxied = |node: usize| {
        format!(
            "mysql://root@127.0.0.1:{}/cluster?prefer_socket=false",
            proxies[node].port()
        )
    };
    let specs = (0..6)
        .map(|i| WorkerSpec {
            kind: if i % 2 == 0 {
                Kind::SyncMysql
            } else {
                Kind::AsyncMysql
            },
            // Its own node first, then the others: where it goes when its node dies.
            urls: (0..3).map(|k| proxied((i + k) % 3)).collect(),
            options: ConnOptions::default(),
        })
        .collect();
    broker.publish(&jobs);
    let run_started = Instant::now();
    let workers = cluster_workers::spawn(&broker, specs, &cluster_workers::no_hook());
    let total: usize = jobs.iter().map(|(_, copies)| copies).sum();
    broker.wait(
        "a third of the deliveries acknowledged",
        Duration::from_secs(60),
        |s| s.acked >= total / 3,
    );
    broker.event(Event::Fault("SIGKILL to node 2".to_owned()));
    galera.kill(2);
    broker.wait_all_acked(Duration::from_secs(120));
    let run_took = run_started.elapsed();
    cluster_workers::stop(&broker, workers);
    galera.wait_cluster_size(0, 2);

    let tally = broker.tally();
    let hangs: usize = proxies.iter().map(stall_proxy::StallProxy::cuts).sum();
    if hangs > 0 {
        figures::report(&format!(
            "galera run: a node stopped answering a worker's session {hangs} time(s) (a brute-force aborted session left without a reply); each was cut and its job delivered again"
        ));
    }
    let counts = cluster_workers::counts_mysql(&galera.url(0, "cluster"));
    let on_node_1 = cluster_workers::counts_mysql(&galera.url(1, "cluster"));
    figures::report(&format!(
        "galera (3 nodes, 6 workers: 3 sync, 3 async, 2 per node): started in {startup:.1?}; \
         migrate on 3 nodes at once: {} failed attempts; \
         a claim raced on two nodes: the loser got {conflict:?}; \
         {LAGGING} redeliveries right after the run on another node: {wasted_without_causal_reads} ran the body and lost at commit \
         with wsrep_sync_wait=0, {wasted_with_causal_reads} with wsrep_sync_wait=1; \
         run: jobs {JOBS} ({RACED} delivered twice at once to workers on different nodes), node 2 SIGKILLed \
         after {} deliveries, certification failures at commit {}, conflicts before commit {}, \
         commits in doubt (connection lost in COMMIT) {}, other failures {}, reconnects {}, ran {}, replays {}, \
         effects {}, claims {}, in {run_took:.1?}",
        migrate_failures.len(),
        total / 3,
        tally.failed(Failure::CertificationAtCommit),
        tally.failed(Failure::ConflictBeforeCommit),
        tally.failed(Failure::CommitInDoubt),
        tally.failed(Failure::Other),
        tally.connects - 6,
        tally.runs(),
        tally.replays,
        counts.total_effects(),
        counts.claims,
    ));
    assert!(
        conflict_error.contains("1213") || conflict_error.contains("Deadlock"),
        "{conflict_error}"
    );
    assert!(
        migrate_failures.is_empty(),
        "migrating on every node at once: a step another node made meanwhile is found done, so none fails: {migrate_failures:?}"
    );
    // A session the proxy cut for a server that stopped answering fails as a lost connection.
    let unexplained: Vec<&String> = tally
        .unexpected
        .iter()
        .filter(|error| !(hangs > 0 && says_lost_connection(error)))
        .collect();
    assert!(
        unexplained.is_empty(),
        "failures before the kill other than write conflicts (and sessions cut for a server that stopped answering): {unexplained:?}"
    );
    figures::report(&format!(
        "galera: {FORGETS} keys forgotten on node 0 and redelivered at once on a lagging node 1 (redelivered flag set): \
         the forgotten run replayed {replayed_without_causal_reads} times with wsrep_sync_wait=0 (the read first finds nothing without causal reads; the claim's insert can meet the row node 1 has not yet deleted), \
         {replayed_with_causal_reads} times with wsrep_sync_wait=1"
    ));
    assert_eq!(
        replayed_with_causal_reads, 0,
        "with wsrep_sync_wait=1 a node answers a redelivery only once it has applied the forget"
    );
    assert_eq!(
        wasted_with_causal_reads, 0,
        "with wsrep_sync_wait=1 a redelivery's BEGIN waits until its node has applied the first run"
    );
    let mut expected = jobs.clone();
    expected.push(("conflict".to_owned(), 1));
    expected
        .extend((0..LAGGING).flat_map(|k| [(format!("lag0-{k}"), 1), (format!("lag1-{k}"), 1)]));
    assert_exactly_once("on Galera after a node's death", &counts, &expected);
    assert_eq!(
        counts.effects, on_node_1.effects,
        "both surviving nodes hold the same effects"
    );
    // A job no worker saw run is one whose COMMIT lost its connection: it committed on the cluster
    // before the node died, and its redelivery replayed.
    for (job, _) in &jobs {
        match tally.ran.get(job).copied().unwrap_or(0) {
            1 => {}
            0 => assert!(
                tally.in_doubt.contains(job),
                "job {job} never ran as a worker saw it, yet no commit of it was in doubt"
            ),
            n => panic!("job {job} ran {n} times as the workers saw it"),
        }
    }
    assert_eq!(
        tally.runs() + tally.replays,
        total,
        "every delivery ran or replayed exactly once in the end"
    );
    assert!(
        tally.connects >= 6 + 2,
        "node 2's two workers reconnected to another node: {} connections",
        tally.connects
    );
}

// ---- PostgreSQL failover -----------------------------------------------------------------------------

/// Four workers (two sync on libpq, two async on tokio-postgres) on a multi-host URL that finds the
/// writable server. A third of the way through, the primary's WAL sender is stopped (the standby
/// falls behind, as over a slow or cut network), the workers go on for up to two seconds, then the
/// primary is SIGKILLed with all its processes and the standby promoted. The workers reconnect and
/// the queue's redeliveries finish. Then every job is delivered once more, as a producer that
/// retries after an outage would: what the failover lost runs a second time.
fn failover(replication: Replication) {
    // Enough that work is left when the primary dies: with 300, an asynchronous run on a quiet
    // machine once acknowledged every delivery before the kill landed, and no worker reconnected.
    const JOBS: usize = 600;
    const RACED: usize = 50;
    let _serial = serial();
    let started = Instant::now();
    let mut pg = Postgres::replicated(replication);
    let startup = started.elapsed();
    postgres_cluster::execute(&Postgres::url_of(pg.primary.port, "test"), EFFECTS_POSTGRES);

    let broker = Broker::new();
    let jobs = jobs("failover", JOBS, RACED);
    let specs = [Kind::SyncPostgres, Kind::AsyncPostgres]
        .into_iter()
        .cycle()
        .take(4)
        .map(|kind| WorkerSpec {
            kind,
            urls: vec![pg.url()],
            options: ConnOptions::default(),
        })
        .collect();
    broker.publish(&jobs);
    let workers = cluster_workers::spawn(&broker, specs, &cluster_workers::no_hook());
    let total: usize = jobs.iter().map(|(_, copies)| copies).sum();
    broker.wait(
        "a third of the deliveries acknowledged",
        Duration::from_secs(60),
        |s| s.acked >= total / 3,
    );

    let sender = pg.wal_sender_pid();
    broker.event(Event::Fault("the primary's WAL sender stopped".to_owned()));
    Postgres::pause(sender);
    // A commit that returned just before the stop is acknowledged a moment later; count from
    // after those (short: without a synchronous standby the workers go on at a job a millisecond).
    std::thread::sleep(Duration::from_millis(20));
    let behind_from = broker.acked();
    // Up to 10 acknowledgements, looked for every 2 ms (the workers go on at several a
    // millisecond): an asynchronous standby does not hold the primary back, so they come (a
    // minute is a deadline, not a measurement); a synchronous standby holds every commit back
    // while it is cut off, and two seconds without one is the window that shows it.
    let window = match replication {
        Replication::Synchronous => Duration::from_secs(2),
        Replication::Asynchronous => Duration::from_secs(60),
    };
    let deadline = Instant::now() + window;
    while Instant::now() < deadline && broker.acked() < behind_from + 10 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let acked_while_behind = broker.acked() - behind_from;
    broker.event(Event::Fault("the primary SIGKILLed".to_owned()));
    pg.kill_primary();
    let failover_started = Instant::now();
    pg.promote_standby();
    let promoted_in = failover_started.elapsed();
    broker.wait_all_acked(Duration::from_secs(120));
    let after_failover = cluster_workers::counts_postgres(&pg.standby_url("test"));
    let first_pass = broker.tally();

    // Every job once more.
    let again: Vec<(String, usize)> = jobs.iter().map(|(job, _)| (job.clone(), 1)).collect();
    broker.publish(&again);
    broker.wait_all_acked(Duration::from_secs(120));
    cluster_workers::stop(&broker, workers);
    let tally = broker.tally();
    let end = cluster_workers::counts_postgres(&pg.standby_url("test"));

    let lost_claims = JOBS - usize::try_from(after_failover.claims).expect("a count");
    let lost_effects = JOBS - after_failover.effects.len();
    let ran_twice = tally.ran.values().filter(|n| **n == 2).count();
    figures::report(&format!(
        "postgres failover ({replication:?} replication; 4 workers: 2 sync, 2 async, multi-host URL): \
         started in {startup:.1?}; jobs {JOBS} ({RACED} delivered twice at once); after {} deliveries the standby \
         was cut off: {acked_while_behind} jobs acknowledged while it was, then the primary was SIGKILLed and the \
         standby promoted in {promoted_in:.1?}; failed deliveries {} (commits in doubt {}), reconnects {}; \
         after the failover: committed claims lost {lost_claims}, effects lost {lost_effects}; every job delivered again: \
         ran twice {ran_twice}, replays {}; in {:.1?}",
        behind_from,
        first_pass.total_failures(),
        first_pass.failed(Failure::CommitInDoubt),
        first_pass.connects - 4,
        tally.replays - first_pass.replays,
        started.elapsed(),
    ));
    assert!(
        tally.unexpected.is_empty(),
        "failures before any fault: {:?}",
        tally.unexpected
    );
    assert!(
        first_pass.connects > 4,
        "the workers reconnected to the promoted standby"
    );
    // Whatever the failover lost, the second delivery ran once more; the database ends with one
    // effect per job either way.
    assert_exactly_once("on the promoted standby", &end, &jobs);
    assert_eq!(
        lost_claims, lost_effects,
        "a claim and its job's effect are lost together"
    );
    assert_eq!(
        ran_twice, lost_claims,
        "exactly the jobs whose claims were lost ran again"
    );
    assert!(tally.ran.values().all(|n| *n <= 2));
    match replication {
        Replication::Synchronous => {
            assert_eq!(
                acked_while_behind, 0,
                "no commit returns while the synchronous standby is cut off"
            );
            assert_eq!(
                lost_claims, 0,
                "a synchronous standby holds every acknowledged commit"
            );
            assert_eq!(ran_twice, 0, "nothing ran twice");
            assert_eq!(
                tally.replays - first_pass.replays,
                JOBS,
                "the second delivery replayed every job"
            );
        }
        Replication::Asynchronous => {
            assert!(
                acked_while_behind > 0,
                "the primary went on committing without its asynchronous standby"
            );
            assert!(
                lost_claims >= acked_while_behind,
                "every job committed while the standby was cut off is lost with the primary: \
                 {lost_claims} lost, {acked_while_behind} committed then"
            );
        }
    }
}

#[test]
fn postgres_failover_synchronous_standby() {
    failover(Replication::Synchronous);
}

#[test]
fn postgres_failover_asynchronous_standby() {
    failover(Replication::Asynchronous);
}

// ---- redeliveries on a replica that lags -----------------------------------------------------------

static STANDBY_JOB: idempotent_jobs::Job = idempotent_jobs::Job::new("standby_job", "standby:<n>");

/// A redelivery answered on a hot standby that lags the primary by 3 s
/// (`recovery_min_apply_delay`), sync and async, right after the primary forgot the key (and
/// after a rerun with another result): the standby still holds the old row, and the redelivery
/// must not replay it. A redelivery's read never answers on a standby (`pg_is_in_recovery()`),
/// and the claim, which writes, is refused there: the call fails, and says nothing ran.
#[test]
fn redeliveries_on_a_lagging_standby_never_replay_what_the_primary_forgot() {
    use idempotent_jobs::{JobKey, Outcome};
    let _serial = serial();
    let pg = Postgres::replicated_with(Replication::Asynchronous, &["recovery_min_apply_delay=3s"]);
    let primary_url = Postgres::url_of(pg.primary.port, "test");
    let standby_url = pg.standby_url("test");
    let mut primary = PgConnection::establish(&primary_url).expect("the primary");
    idempotent_jobs::migrate(&mut primary).expect("the runtime's tables");
    let key = JobKey::new("standby:1");
    let run = |conn: &mut PgConnection, value: u32| {
        idempotent_jobs::run(conn, &STANDBY_JOB, &key, |_| {
            Ok::<_, idempotent_jobs::Error>(value)
        })
    };
    assert_eq!(
        run(&mut primary, 7).expect("the first run"),
        Outcome::Ran(7)
    );
    processes::wait_until(
        "the standby applying the first run",
        Duration::from_secs(60),
        || {
            PgConnection::establish(&standby_url)
                .ok()
                .and_then(|mut standby| idempotent_jobs::keys::lookup(&mut standby, &key).ok())
                .flatten()
                .is_some()
        },
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut stale = Vec::new();
    let mut check_standby = |what: &str| {
        let mut standby = PgConnection::establish(&standby_url).expect("the standby");
        match idempotent_jobs::redelivered(true, || run(&mut standby, 0)) {
            Ok(Outcome::Replayed(value)) => stale.push(format!("{what}, sync: replayed {value}")),
            Ok(other) => stale.push(format!("{what}, sync: {other:?} on a read-only standby")),
            Err(_) => {}
        }
        let replayed = runtime.block_on(async {
            use diesel_async::AsyncConnection as _;
            let mut standby = diesel_async::AsyncPgConnection::establish(&standby_url)
                .await
                .expect("the standby");
            idempotent_jobs::redelivered_async(
                true,
                idempotent_jobs::run_async(&mut standby, &STANDBY_JOB, &key, async |_| {
                    Ok::<_, idempotent_jobs::Error>(0u32)
                }),
            )
            .await
        });
        match replayed {
            Ok(Outcome::Replayed(value)) => stale.push(format!("{what}, async: replayed {value}")),
            Ok(other) => stale.push(format!("{what}, async: {other:?} on a read-only standby")),
            Err(_) => {}
        }
    };
    assert!(
        idempotent_jobs::keys::forget(&mut primary, &key, "the test").expect("a forget"),
        "the primary forgot the key"
    );
    check_standby("right after a forget on the primary");
    assert_eq!(run(&mut primary, 9).expect("the rerun"), Outcome::Ran(9));
    check_standby("right after a rerun with another result");
    assert!(
        stale.is_empty(),
        "a lagging standby answered redeliveries from its old snapshot: {stale:?}"
    );
}

// ---- a prune under statement-based binary logging --------------------------------------------------

/// A prune runs each batch at READ COMMITTED on MySQL/MariaDB (no gap locks in front of new
/// claims). With statement-based binary logging the server refuses a DELETE on InnoDB at that
/// isolation (error 1665): the prune must go on at the session's own and remove every lapsed key,
/// and the live ones stay.
#[test]
fn a_prune_under_statement_based_binary_logging_removes_every_lapsed_key() {
    let _serial = serial();
    let server = mariadb::MariaDb::start(
        "binlog-statement",
        &[
            "--log-bin=binlog",
            "--binlog-format=STATEMENT",
            "--server-id=1",
        ],
    );
    let mut admin = MysqlConnection::establish(&server.url("mysql")).expect("the server");
    admin
        .batch_execute("CREATE DATABASE jobs")
        .expect("a database");
    let mut conn = MysqlConnection::establish(&server.url("jobs")).expect("the database");
    idempotent_jobs::migrate(&mut conn).expect("the runtime's tables");
    let rows = |prefix: &str, count: usize, expires_at: &str| {
        let values: Vec<String> = (0..count)
            .map(|i| {
                format!(
                    "(UNHEX(SHA2('{prefix}:{i}', 256)), '{prefix}:{i}', 'bulk', '2000-01-01', {expires_at})"
                )
            })
            .collect();
        format!(
            "INSERT INTO done_jobs (key_digest, job_key, job_name, done_at, expires_at) VALUES {}",
            values.join(", ")
        )
    };
    conn.batch_execute(&rows("lapsed", 2_500, "'2000-01-02'"))
        .expect("lapsed keys");
    conn.batch_execute(&rows("live", 10, "NULL"))
        .expect("live keys");
    let report = idempotent_jobs::prune(
        &mut conn,
        &idempotent_jobs::Prune::default().batch_size(1_000).pace(0),
    )
    .unwrap_or_else(|e| panic!("the prune: {}", cluster_workers::with_causes(&e)));
    assert_eq!((report.removed, report.batches), (2_500, 3));
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let left = diesel::sql_query("SELECT COUNT(*) AS n FROM done_jobs")
        .get_result::<N>(&mut conn)
        .expect("counting");
    assert_eq!(left.n, 10, "the live keys stay");
}

// ---- a lock wait timeout that rolls back the caller's whole transaction ----------------------------

/// A MariaDB server of the test's own with `innodb_rollback_on_timeout` (read only at its start),
/// a database `jobs` migrated, its URL and a connection to it. The server stops when the first
/// value drops.
fn rolling_back_on_timeout(setup: &str) -> (mariadb::MariaDb, String, MysqlConnection) {
    let server = mariadb::MariaDb::start(setup, &["--innodb-rollback-on-timeout"]);
    let mut admin = MysqlConnection::establish(&server.url("mysql")).expect("the server");
    admin
        .batch_execute("CREATE DATABASE jobs")
        .expect("a database");
    let url = server.url("jobs");
    let mut conn = MysqlConnection::establish(&url).expect("the database");
    idempotent_jobs::migrate(&mut conn).expect("the runtime's tables");
    (server, url, conn)
}

/// With `innodb_rollback_on_timeout` a lock wait timeout rolls back the whole transaction, not
/// the statement. A job called inside a caller's transaction, whose in-progress policy bounds the
/// claim's wait for another run of its key, times out there: the caller's transaction is gone
/// with the job. The call must say so (`CallersTransactionRolledBack`), not `InProgress` ("nothing
/// ran; retrying later is safe"), as it did before: the caller's earlier write was gone, and a
/// retry of the call alone would run outside any transaction.
#[test]
fn a_lock_wait_timeout_that_rolls_back_the_callers_transaction_says_so() {
    let _serial = serial();
    static BOUNDED: idempotent_jobs::Job = idempotent_jobs::Job::new("bounded", "bounded:<n>");
    let (_server, url, mut conn) = rolling_back_on_timeout("rollback-on-timeout");
    conn.batch_execute("CREATE TABLE caller_rows (id INT PRIMARY KEY) ENGINE = InnoDB")
        .expect("the caller's table");
    let key = idempotent_jobs::JobKey::new("bounded:1");
    // Another run holds the key: its claim is uncommitted while the caller's call waits for it.
    let mut holder = MysqlConnection::establish(&url).expect("the holder");
    holder
        .batch_execute("START TRANSACTION")
        .expect("the holder's transaction");
    holder
        .batch_execute(
            "INSERT INTO done_jobs (key_digest, job_key, job_name, done_at) \
             VALUES (UNHEX(SHA2('bounded:1', 256)), 'bounded:1', 'bounded', UTC_TIMESTAMP(6))",
        )
        .expect("the holder's claim");
    let called = conn.transaction::<_, diesel::result::Error, _>(|conn| {
        conn.batch_execute("INSERT INTO caller_rows VALUES (1)")?;
        Ok(idempotent_jobs::JobCall::new(&BOUNDED, &key)
            .while_in_progress(idempotent_jobs::WhileInProgress::Fail)
            .run(conn, |_| Ok::<_, idempotent_jobs::Error>(())))
    });
    holder.batch_execute("ROLLBACK").expect("the holder ends");
    let error = match called {
        Ok(Err(error)) => error,
        other => panic!("expected the call's error: {other:?}"),
    };
    assert!(
        matches!(
            error,
            idempotent_jobs::Error::CallersTransactionRolledBack { .. }
        ),
        "the caller's transaction was rolled back with the job: {error}"
    );
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let count = |conn: &mut MysqlConnection, sql: &str| {
        diesel::sql_query(sql)
            .get_result::<N>(conn)
            .expect("counting")
            .n
    };
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM caller_rows"),
        0,
        "the caller's write went with its transaction"
    );
    assert_eq!(count(&mut conn, "SELECT COUNT(*) AS n FROM done_jobs"), 0);
}

/// The same server setting at the job's end: the result's record (a statement of the runtime's
/// own) waits for a row lock, here through a trigger on `done_jobs`, past
/// `innodb_lock_wait_timeout`, and InnoDB rolls the whole transaction back. The call is the
/// database's error at the record, retryable, nothing committed. Before, the runtime found the
/// job's transaction gone and said that the body had rolled it back and gone on, "what it ran
/// after may be committed", with the lock wait timeout lost.
#[test]
fn a_lock_wait_timeout_at_the_record_that_rolls_back_the_transaction_is_the_databases_error() {
    let _serial = serial();
    static RECORDED: idempotent_jobs::Job = idempotent_jobs::Job::new("recorded", "recorded:<n>");
    let (_server, url, mut conn) = rolling_back_on_timeout("record-timeout");
    conn.batch_execute(
        "CREATE TABLE held (id INT PRIMARY KEY, n INT) ENGINE = InnoDB; \
         INSERT INTO held VALUES (1, 0); \
         CREATE TRIGGER record_waits BEFORE UPDATE ON done_jobs FOR EACH ROW \
         UPDATE held SET n = n + 1 WHERE id = 1; \
         SET SESSION innodb_lock_wait_timeout = 1",
    )
    .expect("a trigger that waits");
    let mut holder = MysqlConnection::establish(&url).expect("the holder");
    holder
        .batch_execute("BEGIN; UPDATE held SET n = n + 1 WHERE id = 1")
        .expect("the holder holds the row");
    let ran = idempotent_jobs::run(
        &mut conn,
        &RECORDED,
        &idempotent_jobs::JobKey::new("recorded:1"),
        |_conn| Ok::<_, idempotent_jobs::Error>(String::from("recorded")),
    );
    holder.batch_execute("ROLLBACK").expect("the holder ends");
    let error = ran.expect_err("the record waited past innodb_lock_wait_timeout");
    let shown = cluster_workers::with_causes(&error);
    assert!(
        matches!(
            error,
            idempotent_jobs::Error::Database {
                step: idempotent_jobs::Step::Record,
                ..
            }
        ) && shown.contains("Lock wait timeout")
            && shown.contains("nothing of the job was committed"),
        "{shown}"
    );
    assert!(error.is_retryable(), "{shown}");
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let done = diesel::sql_query("SELECT COUNT(*) AS n FROM done_jobs")
        .get_result::<N>(&mut conn)
        .expect("counting");
    assert_eq!(done.n, 0, "nothing committed");
    // The retry runs the job.
    conn.batch_execute("DROP TRIGGER record_waits")
        .expect("the trigger goes");
    let again = idempotent_jobs::run(
        &mut conn,
        &RECORDED,
        &idempotent_jobs::JobKey::new("recorded:1"),
        |_conn| Ok::<_, idempotent_jobs::Error>(String::from("recorded")),
    );
    assert!(
        matches!(&again, Ok(idempotent_jobs::Outcome::Ran(text)) if text == "recorded"),
        "{again:?}"
    );
}

/// A claim waiting for another run of its key, through PgBouncer, which ends it at its
/// `query_timeout` (1 s) with its own `FATAL` "query timeout" and closes the client's connection:
/// nothing of the call was committed, the connection is lost, and retrying (on a new connection)
/// is safe and replays the other run once it commits. diesel-async passed PgBouncer's farewell on
/// as an unknown database error: the call said not retryable, and a worker dead-lettered it.
#[test]
fn a_claim_ended_by_pgbouncers_query_timeout_is_retryable() {
    use idempotent_jobs::{Job, JobKey, Outcome};
    static SLOW: Job = Job::new("slow", "slow:<n>");
    let _serial = serial();
    let mut pg = Postgres::single("pgbouncer-query-timeout");
    let bouncer = PgBouncer::start_with(&mut pg, 3, "query_timeout = 1\n");
    let direct = Postgres::url_of(pg.primary.port, "test");
    let mut holder = PgConnection::establish(&direct).expect("a direct connection");
    idempotent_jobs::migrate(&mut holder).expect("migrate");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let through_the_pooler = |value: u32| {
        runtime.block_on(async {
            let mut conn = idempotent_jobs::pooler::establish_async_pg(&bouncer.url())
                .await
                .expect("a connection through PgBouncer");
            idempotent_jobs::run_async(&mut conn, &SLOW, &JobKey::new("slow:1"), async |_conn| {
                Ok::<_, idempotent_jobs::Error>(value)
            })
            .await
        })
    };
    std::thread::scope(|scope| {
        let (claimed, holds) = std::sync::mpsc::channel();
        let first = scope.spawn(move || {
            idempotent_jobs::run(&mut holder, &SLOW, &JobKey::new("slow:1"), |_conn| {
                let _ = claimed.send(());
                std::thread::sleep(Duration::from_secs(3));
                Ok::<_, idempotent_jobs::Error>(1u32)
            })
        });
        holds
            .recv_timeout(Duration::from_secs(60))
            .expect("the first run holds its claim");
        let error = through_the_pooler(2)
            .expect_err("PgBouncer ends the claim's wait after its query_timeout of 1 s");
        assert!(
            error.is_retryable() && error.is_connection_lost(),
            "a claim PgBouncer ended: {error}"
        );
        assert!(
            error
                .to_string()
                .contains("nothing of the job was committed"),
            "{error}"
        );
        let first = first.join().expect("the first run's thread");
        assert!(matches!(first, Ok(Outcome::Ran(1))), "{first:?}");
    });
    let retried = through_the_pooler(2).expect("the retry");
    assert!(matches!(retried, Outcome::Replayed(1)), "{retried:?}");
}
