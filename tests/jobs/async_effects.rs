//! The outbox end to end through async connections: an async job pushes, an async relay delivers
//! to the loopback service, two async relays share one outbox, failures back off and park.
//! Written once for every async backend (see `main.rs`).

use std::sync::Barrier;
use std::time::Duration;

use diesel::QueryResult;
use idempotent_jobs::idempotent_job;
use idempotent_jobs::outbox::{self, Relay, RelayReport};

use crate::backends::{AsyncConn, Backend};
use crate::effects::{deliver, each_delivered_once};
use crate::handlers::{AsyncTestConn, TestError};
use crate::harness::Db;
use crate::receiver::Service;

/// Queues a receipt for an order through the outbox: `effects::send_receipt` as an async job, so
/// it shares that job's name as well as its key.
#[idempotent_job(key = "receipt:<order_id>", name = "send_receipt")]
async fn send_receipt_async<C: AsyncTestConn>(
    conn: &mut C,
    order_id: &str,
) -> Result<String, TestError> {
    Ok(outbox::push_async(
        conn,
        "receipt",
        &serde_json::json!({ "order_id": order_id }),
    )
    .await?)
}

/// Runs a job twice, relays its one message to the service, and prunes it once delivered.
pub fn async_relay_delivers_each_message_once<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    let service = Service::start();
    let db = Db::<B>::fresh();
    let AsyncConn { runtime, mut conn } = db.connect();
    runtime.block_on(async {
        let first = send_receipt_async(&mut conn, "order-1").await.unwrap();
        let second = send_receipt_async(&mut conn, "order-1").await.unwrap();
        assert_eq!(
            first, second,
            "the replay returns the first run's message id"
        );
        assert_eq!(
            conn.outbox_rows().await.unwrap(),
            [(first.clone(), Some("receipt:order-1".to_owned()))],
            "one message for two runs"
        );

        let addr = service.addr();
        let relay = Relay::new();
        let report = relay
            .drain_async(&mut conn, async |message| deliver(&addr, message))
            .await
            .unwrap();
        assert_eq!((report.leased, report.delivered), (1, 1));
        let again = relay
            .drain_async(&mut conn, async |message| deliver(&addr, message))
            .await
            .unwrap();
        assert_eq!(again.leased, 0, "a delivered message is not sent again");

        let pruned = outbox::prune_delivered_async(
            &mut conn,
            Duration::ZERO,
            &idempotent_jobs::Prune::default().batch_size(1),
        )
        .await
        .unwrap();
        assert_eq!((pruned.removed, pruned.batches), (1, 2));
        assert!(conn.outbox_rows().await.unwrap().is_empty());
    });
    let ledger = service.ledger();
    assert_eq!(ledger.deliveries, 1);
    assert_eq!(ledger.messages.len(), 1);
}

/// Two async relays, each on its own connection and runtime, drain one outbox at once: no
/// message is handed to both.
pub fn two_async_relays_deliver_no_message_twice<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    const MESSAGES: usize = 120;
    let service = Service::start();
    let db = Db::<B>::fresh();
    {
        let AsyncConn { runtime, mut conn } = db.connect();
        runtime.block_on(async {
            for n in 0..MESSAGES {
                send_receipt_async(&mut conn, &format!("order-{n}"))
                    .await
                    .unwrap();
            }
        });
    }
    let barrier = Barrier::new(2);
    let reports: Vec<RelayReport> = std::thread::scope(|scope| {
        let relays: Vec<_> = (0..2)
            .map(|_| {
                let (db, barrier, addr) = (&db, &barrier, service.addr());
                scope.spawn(move || {
                    let AsyncConn { runtime, mut conn } = db.connect();
                    barrier.wait();
                    runtime
                        .block_on(
                            Relay::new()
                                .batch_size(7)
                                .drain_async(&mut conn, async |message| deliver(&addr, message)),
                        )
                        .expect("a relay")
                })
            })
            .collect();
        relays
            .into_iter()
            .map(|r| r.join().expect("relay thread"))
            .collect()
    });
    each_delivered_once(&service.ledger(), &reports, MESSAGES);
}

/// A delivery that keeps failing is parked after its last attempt, is listed, and goes out after
/// a retry by hand.
pub fn failing_async_deliveries_park_then_retry<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    let db = Db::<B>::fresh();
    let AsyncConn { runtime, mut conn } = db.connect();
    runtime.block_on(async {
        let id = send_receipt_async(&mut conn, "order-1").await.unwrap();
        let relay = Relay::new()
            .max_attempts(3)
            .backoff(Duration::ZERO, Duration::ZERO);
        let mut attempts = 0;
        let report = relay
            .drain_async(&mut conn, async |_| {
                attempts += 1;
                Err("the mail server is down")
            })
            .await
            .unwrap();
        assert_eq!((attempts, report.failed, report.parked), (3, 2, 1));
        let parked = outbox::parked_async(&mut conn).await.unwrap();
        assert_eq!(parked.len(), 1);
        assert_eq!(
            (parked[0].message_id(), parked[0].attempts()),
            (id.as_str(), 3)
        );
        let idle = relay
            .drain_async(&mut conn, async |_| Ok::<_, String>(()))
            .await
            .unwrap();
        assert_eq!(idle.leased, 0, "parked stays parked");

        assert_eq!(
            outbox::retry_parked_async(&mut conn, Some(&id))
                .await
                .unwrap(),
            1
        );
        let mut sent = Vec::new();
        let report = relay
            .drain_async(&mut conn, async |message| {
                sent.push(message.message_id().to_owned());
                Ok::<_, String>(())
            })
            .await
            .unwrap();
        assert_eq!(report.delivered, 1);
        assert_eq!(sent, [id]);
        assert!(outbox::parked_async(&mut conn).await.unwrap().is_empty());
    });
}

/// A job that fails leaves no message behind, so the relay has nothing to send.
pub fn failed_async_job_leaves_no_message<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    #[idempotent_job(key = "notice:<order_id>")]
    async fn notify_then_fail<C: AsyncTestConn>(
        conn: &mut C,
        order_id: &str,
    ) -> Result<(), TestError> {
        outbox::push_async(conn, "notice", order_id).await?;
        Err(TestError::Declined)
    }

    let db = Db::<B>::fresh();
    let AsyncConn { runtime, mut conn } = db.connect();
    runtime.block_on(async {
        let error = notify_then_fail(&mut conn, "order-1").await.unwrap_err();
        assert!(matches!(error, TestError::Declined), "{error:?}");
        assert!(conn.outbox_rows().await.unwrap().is_empty());
        let report = Relay::new()
            .drain_async(&mut conn, async |_| Ok::<_, String>(()))
            .await
            .unwrap();
        assert_eq!(report.leased, 0);
        assert_eq!(conn.count_done().await.unwrap(), 0);
    });
}

/// A relay future dropped at any `.await` (a shutdown `select!`, a timeout around a batch) never
/// leaves its connection inside a transaction for the next batch to run in: afterwards the
/// connection is either clean or marked broken, never mid-transaction.
pub fn dropped_relay_never_leaves_a_transaction_open<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn + TransactionDepth,
{
    let db = Db::<B>::fresh();
    {
        let AsyncConn { runtime, mut conn } = db.connect();
        runtime.block_on(async {
            for n in 0..30 {
                send_receipt_async(&mut conn, &format!("order-{n}"))
                    .await
                    .unwrap();
            }
        });
    }
    let (mut finished, mut broken) = (0, 0);
    for pendings in 1..=12 {
        let AsyncConn { runtime, mut conn } = db.connect();
        let relay = Relay::new().batch_size(2);
        let completed = runtime.block_on(drop_after_pendings(
            pendings,
            relay.run_once_async(&mut conn, async |_| Ok::<_, String>(())),
        ));
        if completed.is_some() {
            finished += 1;
            continue;
        }
        match runtime.block_on(conn.transaction_depth()) {
            Ok(None) => {}
            Ok(Some(depth)) => panic!(
                "dropped after {pendings} pendings, the connection was left inside a transaction \
                 (depth {depth}) for the next batch to run in"
            ),
            Err(_) => broken += 1,
        }
    }
    crate::figures::report(&format!(
        "dropped async relays ({}): 12 drops, {broken} left the connection marked broken, {} clean, {finished} finished first",
        B::NAME,
        12 - broken - finished
    ));
}

/// Polls `future` until it has been pending `pendings` times, then drops it; `Some` if it finished
/// first.
pub(crate) async fn drop_after_pendings<F: std::future::Future>(
    pendings: u32,
    future: F,
) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut left = pendings;
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        std::task::Poll::Ready(output) => std::task::Poll::Ready(Some(output)),
        std::task::Poll::Pending if left <= 1 => std::task::Poll::Ready(None),
        std::task::Poll::Pending => {
            left -= 1;
            std::task::Poll::Pending
        }
    })
    .await
}

/// How deep in transactions a connection's transaction manager thinks it is; `Err` when it is
/// marked broken.
pub trait TransactionDepth {
    fn transaction_depth(&mut self) -> impl std::future::Future<Output = QueryResult<Option<u32>>>;
}

#[allow(unused_macros)] // used when a server-backed async feature is on
macro_rules! ansi_transaction_depth {
    ($conn:ty) => {
        impl TransactionDepth for $conn {
            async fn transaction_depth(&mut self) -> QueryResult<Option<u32>> {
                use diesel_async::TransactionManager;
                diesel_async::AnsiTransactionManager::transaction_manager_status_mut(self)
                    .transaction_depth()
                    .map(|depth| depth.map(std::num::NonZeroU32::get))
            }
        }
    };
}

#[cfg(feature = "async-postgres")]
ansi_transaction_depth!(diesel_async::AsyncPgConnection);
#[cfg(feature = "async-mysql")]
ansi_transaction_depth!(diesel_async::AsyncMysqlConnection);

#[cfg(feature = "async-sqlite")]
impl TransactionDepth
    for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
{
    async fn transaction_depth(&mut self) -> QueryResult<Option<u32>> {
        self.spawn_blocking(|conn| {
            use diesel::connection::TransactionManager;
            diesel::connection::AnsiTransactionManager::transaction_manager_status_mut(conn)
                .transaction_depth()
                .map(|depth| depth.map(std::num::NonZeroU32::get))
        })
        .await
    }
}

/// An async delivery that panics counts as a failed attempt; the rest of the batch goes on.
pub fn a_panicking_async_delivery_fails_alone<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    let db = Db::<B>::fresh();
    let AsyncConn { runtime, mut conn } = db.connect();
    runtime.block_on(async {
        for order in 1..=3 {
            send_receipt_async(&mut conn, &format!("order-{order}"))
                .await
                .unwrap();
        }
        let mut delivered = 0;
        let report = Relay::new()
            .max_attempts(1)
            .drain_async(&mut conn, async |message| {
                let payload: serde_json::Value = message.payload().expect("JSON");
                assert_ne!(payload["order_id"], "order-2", "this delivery explodes");
                delivered += 1;
                Ok::<_, String>(())
            })
            .await
            .expect("the relay survives its delivery's panic");
        assert_eq!((delivered, report.delivered, report.parked), (2, 2, 1));
        let parked = outbox::parked_async(&mut conn).await.unwrap();
        assert!(
            parked[0]
                .last_error()
                .is_some_and(|e| e.contains("panicked"))
        );
    });
}

/// An async job that pushes `bytes` characters of payload to any topic.
#[idempotent_job(key = "notify-any:<id>", name = "notify_any")]
async fn notify_any_async<C: AsyncTestConn>(
    conn: &mut C,
    id: &str,
    topic: &str,
    bytes: usize,
) -> Result<String, TestError> {
    Ok(outbox::push_async(conn, topic, &"p".repeat(bytes)).await?)
}

/// `outbox_faults::what_the_database_cannot_hold_is_refused_whole` through an async connection:
/// on MariaDB (a session with a non-strict `sql_mode`) a 300-character topic and a 20 MiB key are
/// refused before anything is sent, and the connection runs the next job; elsewhere both are
/// stored whole.
pub fn what_the_database_cannot_hold_is_refused_whole_async<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    let db = Db::<B>::fresh();
    let AsyncConn { runtime, mut conn } = db.connect();
    let mysql = B::SERVER == crate::harness::Server::Mysql;
    runtime.block_on(async {
        if mysql {
            conn.execute_sql("SET SESSION sql_mode = ''").await.unwrap();
        }
        let long_topic = "t".repeat(300);
        let huge_key = "k".repeat(20 << 20);
        let long = notify_any_async(&mut conn, "long-topic", &long_topic, 10).await;
        let keyed = notify_any_async(&mut conn, &huge_key, "small", 1).await;
        notify_any_async(&mut conn, "after", "small", 1)
            .await
            .expect("a job on the same connection after those");
        let mut topics = Vec::new();
        Relay::new()
            .drain_async(&mut conn, async |message| {
                topics.push(message.topic().to_owned());
                Ok::<_, String>(())
            })
            .await
            .unwrap();
        if mysql {
            assert!(
                matches!(
                    long,
                    Err(TestError::Idempotent(
                        idempotent_jobs::Error::OutboxMessageRefused { .. }
                    ))
                ),
                "{long:?}"
            );
            assert!(
                matches!(
                    keyed,
                    Err(TestError::Idempotent(
                        idempotent_jobs::Error::KeyTooLarge { .. }
                    ))
                ),
                "{:?}",
                keyed.map_err(|e| e.to_string().chars().take(300).collect::<String>())
            );
            assert_eq!(topics, ["small"]);
            assert_eq!(conn.count_done().await.unwrap(), 1);
        } else {
            long.expect("a long topic");
            keyed.expect("a large key");
            assert_eq!(topics, [long_topic.as_str(), "small", "small"]);
            assert_eq!(conn.count_done().await.unwrap(), 3);
        }
    });
}

/// Runs one round of `relay` whose delivery never ends, and drops it in its first delivery (as a
/// caller's timeout would); the id of the message that was in delivery.
async fn drop_in_first_delivery<C: AsyncTestConn>(relay: &Relay, conn: &mut C) -> String {
    let started = std::sync::atomic::AtomicBool::new(false);
    let mut handed = Vec::new();
    {
        let round = relay.run_once_async(conn, async |message| {
            handed.push(message.message_id().to_owned());
            started.store(true, std::sync::atomic::Ordering::SeqCst);
            std::future::pending::<()>().await;
            Ok::<_, String>(())
        });
        let mut round = std::pin::pin!(round);
        let finished = std::future::poll_fn(|cx| match round.as_mut().poll(cx) {
            std::task::Poll::Ready(_) => std::task::Poll::Ready(true),
            std::task::Poll::Pending if started.load(std::sync::atomic::Ordering::SeqCst) => {
                std::task::Poll::Ready(false)
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        })
        .await;
        assert!(
            !finished,
            "the delivery never ends: the round cannot finish"
        );
        // The round is dropped here, in its first delivery.
    }
    assert_eq!(handed.len(), 1, "one message handed over before the drop");
    handed.remove(0)
}

/// A round whose future is dropped while it delivers its first message (a caller's timeout, a
/// `select!`) leased the rest of its batch and counted an attempt for each; none of them was
/// handed to the delivery. The relay gives them back at its next round, their attempt uncounted:
/// they are delivered at once, not held until the lease lapses and then parked as messages that
/// "may have been delivered". The message that was in delivery when the future was dropped may
/// have reached its receiver: it stays leased until its lease lapses, and is then parked (its one
/// allowed attempt spent), as the relay's docs say.
pub fn a_dropped_round_gives_back_what_it_never_tried<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    let db = Db::<B>::fresh();
    let AsyncConn { runtime, mut conn } = db.connect();
    runtime.block_on(async {
        let mut ids = Vec::new();
        for n in 1..=3 {
            ids.push(
                send_receipt_async(&mut conn, &format!("order-{n}"))
                    .await
                    .unwrap(),
            );
        }
        let lease = Duration::from_millis(600);
        let relay = Relay::new().batch_size(3).max_attempts(1).lease(lease);
        let in_delivery = drop_in_first_delivery(&relay, &mut conn).await;

        let mut sent = Vec::new();
        let report = relay
            .run_once_async(&mut conn, async |message| {
                sent.push(message.message_id().to_owned());
                Ok::<_, String>(())
            })
            .await
            .unwrap();
        let mut untried: Vec<String> = ids
            .iter()
            .filter(|id| **id != in_delivery)
            .cloned()
            .collect();
        untried.sort();
        sent.sort();
        assert_eq!(
            (report.delivered, report.parked, &sent),
            (2, 0, &untried),
            "the next round delivers the two messages the dropped round never handed over, at once"
        );
        let counts = outbox::counts_async(&mut conn).await.unwrap();
        assert_eq!(
            (counts.delivered, counts.leased, counts.parked),
            (2, 1, 0),
            "the message in delivery at the drop stays leased"
        );

        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        let report = relay
            .run_once_async(&mut conn, async |message| -> Result<(), String> {
                panic!("{} was parked, not delivered", message.message_id())
            })
            .await
            .unwrap();
        assert_eq!((report.leased, report.parked), (0, 1));
        let parked = outbox::parked_async(&mut conn).await.unwrap();
        assert_eq!(
            parked.iter().map(|m| m.message_id()).collect::<Vec<_>>(),
            [in_delivery.as_str()],
            "only the message that was in delivery is parked as one that may have been delivered"
        );
    });
}

/// The messages a dropped round left untried stay in the relay's keeping until their release
/// commits: a next round dropped while it gives them back (a row lock holds the release) loses
/// none of them, and the round after it delivers them. Before, the relay emptied its list before
/// the release: the dropped give-back lost the messages, which then waited for their lease to
/// lapse and were parked (`max_attempts(1)`) as "may have been delivered".
pub fn a_give_back_dropped_midway_loses_nothing<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    let db = Db::<B>::fresh();
    let AsyncConn { runtime, mut conn } = db.connect();
    let AsyncConn {
        runtime: _locker_runtime,
        conn: mut locker,
    } = db.connect();
    let relay = Relay::new()
        .batch_size(3)
        .max_attempts(1)
        .lease(Duration::from_secs(30));
    let in_delivery = runtime.block_on(async {
        for n in 1..=3 {
            send_receipt_async(&mut conn, &format!("order-{n}"))
                .await
                .unwrap();
        }
        drop_in_first_delivery(&relay, &mut conn).await
    });
    runtime.block_on(async {
        // Another session locks every outbox row: the give-back's release waits.
        locker
            .batch_execute("BEGIN")
            .await
            .expect("the locker's BEGIN");
        locker
            .batch_execute("SELECT id FROM outbox FOR UPDATE")
            .await
            .expect("the locker's lock");
        let dropped = tokio::time::timeout(
            Duration::from_millis(500),
            relay.run_once_async(&mut conn, async |message| -> Result<(), String> {
                panic!(
                    "{} handed over while the give-back waits",
                    message.message_id()
                )
            }),
        )
        .await;
        assert!(
            dropped.is_err(),
            "the round waits for the lock: {dropped:?}"
        );
    });
    // The dropped round's connection is of no more use (and its server session still waits).
    drop(conn);
    let AsyncConn {
        runtime: _next_runtime,
        mut conn,
    } = db.connect();
    runtime.block_on(async {
        locker
            .batch_execute("ROLLBACK")
            .await
            .expect("the locker's ROLLBACK");
        let mut sent = Vec::new();
        let report = relay
            .run_once_async(&mut conn, async |message| {
                sent.push(message.message_id().to_owned());
                Ok::<_, String>(())
            })
            .await
            .unwrap();
        assert_eq!(
            (report.delivered, report.parked, sent.len()),
            (2, 0, 2),
            "the two untried messages are given back and delivered at once: {report:?}"
        );
        assert!(!sent.contains(&in_delivery), "{sent:?}");
        let counts = outbox::counts_async(&mut conn).await.unwrap();
        assert_eq!((counts.delivered, counts.leased), (2, 1), "{counts:?}");
    });
}
