//! Every public async call is a future a multi-threaded executor takes: `tokio::spawn` (and axum,
//! apalis, any `Send + 'static` bound) accepts it on every async connection type, owned and
//! pooled. The checks are at compile time, one function per connection type (a call that is not
//! `Send` there fails the build of this suite, naming the line); `spawned_calls_on_sqlite` then
//! runs the whole API in spawned tasks and checks what each did.
//!
//! Before the fix, `keys::lookup_async`, `forget_async` and `list_async`, `migrate_async`,
//! `prune_async` and the relay's `run_once_async` failed here with "implementation of `Send` is
//! not general enough": an async closure the runtime passed to its own transaction helper
//! borrowed an argument, a shape whose future rustc cannot prove `Send` for every lifetime.

use idempotent_jobs::{JobKey, Prune, keys, outbox, testing};

static SPAWNED: idempotent_jobs::Job = idempotent_jobs::Job::new("spawned", "spawned:<n>");

/// Compiles only for a future that may be spawned on a multi-threaded executor.
fn spawnable<T: Send + 'static>(_future: T) {}

/// A connection of type `C`, for futures that are built and never run.
#[allow(dead_code)]
async fn never<C>() -> C {
    unreachable!("the compile-time checks never run their futures")
}

/// The whole async API on `$conn`, each call in a future of its own that must be
/// `Send + 'static` (so that an error names the call's line); `$get` is an async expression that
/// yields the connection (the futures are built, never run).
macro_rules! every_call_is_spawnable {
    ($name:ident, $conn:ty, $get:expr) => {
        #[allow(dead_code, unused_variables)]
        fn $name() {
            macro_rules! spawnable {
                (|$c:ident, $key:ident, $borrowed:ident| $call:expr) => {
                    spawnable(async move {
                        let mut conn: $conn = $get;
                        let $c = &mut *conn;
                        let $key = JobKey::new("spawned:1");
                        let owned = String::from("borrowed by the call");
                        let $borrowed = &owned;
                        let _ = $call;
                    });
                };
            }
            spawnable!(|c, key, borrowed| idempotent_jobs::migrate_async(c).await);
            spawnable!(|c, key, borrowed| idempotent_jobs::Migrate::new().run_async(c).await);
            spawnable!(|c, key, borrowed| idempotent_jobs::verify_async(c).await);
            spawnable!(|c, key, borrowed| idempotent_jobs::run_async(
                c,
                &SPAWNED,
                &key,
                async |c| {
                    outbox::push_async(c, "topic", borrowed).await?;
                    Ok::<usize, idempotent_jobs::Error>(borrowed.len())
                }
            )
            .await);
            spawnable!(
                |c, key, borrowed| idempotent_jobs::redelivered_async(true, async {
                    borrowed.len()
                })
                .await
            );
            spawnable!(|c, key, borrowed| keys::lookup_async(c, &key).await);
            spawnable!(|c, key, borrowed| keys::lookup_digest_async(c, &key.digest()).await);
            spawnable!(|c, key, borrowed| keys::list_async(
                c,
                &keys::KeyQuery::default().job(borrowed)
            )
            .await);
            spawnable!(|c, key, borrowed| keys::job_counts_async(c).await);
            spawnable!(|c, key, borrowed| if let Ok(Some(record)) =
                keys::lookup_async(&mut *c, &key).await
            {
                let _ = keys::forget_record_async(c, &record, borrowed).await;
            });
            spawnable!(|c, key, borrowed| keys::forget_async(c, &key, borrowed).await);
            spawnable!(
                |c, key, borrowed| keys::forget_digest_async(c, &key.digest(), borrowed).await
            );
            spawnable!(|c, key, borrowed| idempotent_jobs::prune_async(c, &Prune::default()).await);
            spawnable!(|c, key, borrowed| outbox::push_async(c, borrowed, &[1, 2]).await);
            spawnable!(|c, key, borrowed| outbox::unsent_async(c, 10).await);
            spawnable!(|c, key, borrowed| outbox::parked_async(c).await);
            spawnable!(
                |c, key, borrowed| outbox::retry_parked_async(c, Some(borrowed.as_str())).await
            );
            spawnable!(|c, key, borrowed| outbox::prune_delivered_async(
                c,
                std::time::Duration::from_secs(60),
                &Prune::default()
            )
            .await);
            spawnable!(|c, key, borrowed| outbox::counts_async(c).await);
            spawnable!(|c, key, borrowed| outbox::Relay::new()
                .run_once_async(c, async |m: &outbox::OutboxMessage| {
                    Ok::<usize, String>(m.message_id().len()).map(drop)
                })
                .await);
            spawnable!(|c, key, borrowed| outbox::Relay::new()
                .drain_async(c, async |m: &outbox::OutboxMessage| {
                    Ok::<usize, String>(m.message_id().len()).map(drop)
                })
                .await);
            spawnable!(|c, key, borrowed| testing::Snapshot::take_async(c).await);
            // A delivery function that uses a client of its own (a broker's channel, say): it owns
            // it (`async move`, a clone of the client) and is spawnable; one that borrows from
            // the caller's stack is not (docs/outbox.md, "The relay in a spawned task").
            spawnable!(|c, key, borrowed| {
                let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
                outbox::Relay::new()
                    .run_once_async(c, async move |m: &outbox::OutboxMessage| {
                        sent.lock().unwrap().push(m.message_id().to_owned());
                        Ok::<(), String>(())
                    })
                    .await
            });
        }
    };
}

#[cfg(feature = "async-sqlite")]
every_call_is_spawnable!(
    sqlite_owned,
    Box<diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>>,
    never().await
);
#[cfg(feature = "async-postgres")]
every_call_is_spawnable!(
    postgres_owned,
    Box<diesel_async::AsyncPgConnection>,
    never().await
);
#[cfg(feature = "async-mysql")]
every_call_is_spawnable!(
    mysql_owned,
    Box<diesel_async::AsyncMysqlConnection>,
    never().await
);
#[cfg(all(feature = "async-postgres", feature = "deadpool"))]
every_call_is_spawnable!(
    postgres_deadpool,
    diesel_async::pooled_connection::deadpool::Object<diesel_async::AsyncPgConnection>,
    never().await
);
#[cfg(all(feature = "async-mysql", feature = "bb8"))]
every_call_is_spawnable!(
    mysql_bb8,
    diesel_async::pooled_connection::bb8::PooledConnection<
        'static,
        diesel_async::AsyncMysqlConnection,
    >,
    never().await
);

/// The API in spawned tasks on a multi-threaded runtime, on async SQLite: a job that pushes an
/// outbox message runs, then replays, its key is looked up, listed and counted, the relay
/// delivers the message through a delivery function that owns its client, prune keeps the key
/// (it has no expiry), forget removes it, and a look-up no longer finds it.
#[cfg(feature = "async-sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_calls_on_sqlite() {
    use diesel_async::AsyncConnection as _;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use std::sync::{Arc, Mutex};
    type Conn = SyncConnectionWrapper<diesel::SqliteConnection>;

    async fn job(conn: &mut Conn, key: &JobKey) -> idempotent_jobs::Outcome<u32> {
        idempotent_jobs::run_async(conn, &SPAWNED, key, async |c: &mut Conn| {
            outbox::push_async(c, "spawned", &7u32).await?;
            Ok::<u32, idempotent_jobs::Error>(7)
        })
        .await
        .expect("the job")
    }
    let conn = Conn::establish(":memory:").await.expect("in-memory SQLite");
    let key = JobKey::new("spawned:1");
    let (conn, first, second) = tokio::spawn({
        let key = key.clone();
        async move {
            let mut conn = conn;
            idempotent_jobs::migrate_async(&mut conn)
                .await
                .expect("migrate");
            let first = job(&mut conn, &key).await;
            let second = job(&mut conn, &key).await;
            (conn, first, second)
        }
    })
    .await
    .expect("the job's task");
    assert!(
        first.is_ran() && second.is_replayed(),
        "{first:?}, {second:?}"
    );

    let sent = Arc::new(Mutex::new(Vec::new()));
    let (conn, found, listed, report, pruned) = tokio::spawn({
        let (key, sent) = (key.clone(), Arc::clone(&sent));
        async move {
            let mut conn = conn;
            let found = keys::lookup_async(&mut conn, &key).await.expect("lookup");
            let listed = keys::list_async(&mut conn, &keys::KeyQuery::default().job("spawned"))
                .await
                .expect("list")
                .len();
            let report = outbox::Relay::new()
                .run_once_async(&mut conn, async move |m: &outbox::OutboxMessage| {
                    sent.lock()
                        .unwrap()
                        .push(m.payload::<u32>().expect("a u32"));
                    Ok::<(), String>(())
                })
                .await
                .expect("the relay");
            let pruned = idempotent_jobs::prune_async(&mut conn, &Prune::default())
                .await
                .expect("prune")
                .removed;
            (conn, found, listed, report, pruned)
        }
    })
    .await
    .expect("the inspecting task");
    assert_eq!(found.map(|r| r.job), Some("spawned".to_owned()));
    assert_eq!(listed, 1);
    assert_eq!((report.leased, report.delivered), (1, 1));
    assert_eq!(*sent.lock().unwrap(), [7]);
    assert_eq!(pruned, 0, "a key without expiry is kept");

    let (forgot, after) = tokio::spawn(async move {
        let mut conn = conn;
        let forgot = keys::forget_async(&mut conn, &key, "spawned test")
            .await
            .expect("forget");
        let after = keys::lookup_async(&mut conn, &key).await.expect("lookup");
        (forgot, after)
    })
    .await
    .expect("the forgetting task");
    assert!(forgot, "the key was there to forget");
    assert!(after.is_none(), "a forgotten key is gone");
}
