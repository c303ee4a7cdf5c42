//! Behind a transaction pooler (PgBouncer with `pool_mode = transaction`) a client keeps its server
//! connection only within a transaction: a statement diesel-async prepares outside one (tokio-postgres
//! names it `sN`, prepares it in one exchange and runs and closes it in the next) may be prepared on
//! one server connection and run on another, leaving `sN` behind where another client's `sN` then
//! fails with "prepared statement already exists". So every statement the runtime prepares goes
//! inside a transaction. A proxy that follows the protocol counts those that do not: a `Parse` of a
//! named statement while the server's last `ReadyForQuery` said idle (and no `BEGIN` went before it
//! in the same flight).

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use diesel_async::AsyncPgConnection;

use crate::backends::{AsyncConn, AsyncPostgres, Backend as _};
use crate::handlers::{self, Mode};
use crate::harness::Db;

/// What the proxy saw: the statements prepared by name outside a transaction.
#[derive(Default)]
struct Seen {
    /// The server's transaction status as the client knows it: `b'I'` idle, `b'T'`/`b'E'` in one.
    status: u8,
    outside: Vec<String>,
}

/// A proxy to `locator`'s server; its URL, and what it saw.
fn watch(locator: &str) -> (String, Arc<Mutex<Seen>>) {
    let upstream = crate::proxy::host_port(locator);
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let address = listener.local_addr().expect("its address").to_string();
    let seen = Arc::new(Mutex::new(Seen {
        status: b'I',
        outside: Vec::new(),
    }));
    let shared = Arc::clone(&seen);
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            relay(client, server, Arc::clone(&shared));
        }
    });
    let url = locator.replacen(&crate::proxy::host_port(locator), &address, 1);
    let separator = if url.contains('?') { '&' } else { '?' };
    (format!("{url}{separator}sslmode=disable"), seen)
}

/// Whole messages (type byte, length) from `pending`, leaving a partial one there; the first
/// message of the client's side (the startup message) has no type byte.
fn messages(pending: &mut Vec<u8>, startup: &mut bool) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let (kind, header) = if *startup { (0, 0) } else { (1, 1) };
        if pending.len() < header + 4 {
            return out;
        }
        let length =
            u32::from_be_bytes(pending[header..header + 4].try_into().expect("4 bytes")) as usize;
        if pending.len() < header + length {
            return out;
        }
        let kind = if kind == 0 { 0 } else { pending[0] };
        let body = pending[header + 4..header + length].to_vec();
        pending.drain(..header + length);
        *startup = false;
        out.push((kind, body));
    }
}

fn relay(client: TcpStream, server: TcpStream, seen: Arc<Mutex<Seen>>) {
    let (mut client_in, mut server_out) = (
        client.try_clone().expect("a client handle"),
        server.try_clone().expect("a server handle"),
    );
    let (mut server_in, mut client_out) = (server, client);
    let from_client = Arc::clone(&seen);
    std::thread::spawn(move || {
        let (mut buffer, mut pending, mut startup) = (vec![0u8; 64 * 1024], Vec::new(), true);
        while let Ok(read) = client_in.read(&mut buffer) {
            if read == 0 {
                break;
            }
            pending.extend_from_slice(&buffer[..read]);
            for (kind, body) in messages(&mut pending, &mut startup) {
                let mut seen = from_client.lock().expect("the proxy's state");
                let text = |at: usize| {
                    let end = body[at..]
                        .iter()
                        .position(|b| *b == 0)
                        .map_or(body.len(), |n| at + n);
                    String::from_utf8_lossy(&body[at..end]).into_owned()
                };
                match kind {
                    b'Q' if text(0)
                        .trim_start()
                        .to_ascii_uppercase()
                        .starts_with("BEGIN") =>
                    {
                        seen.status = b'T';
                    }
                    b'P' => {
                        let name = text(0);
                        if !name.is_empty() && seen.status == b'I' {
                            let query = text(name.len() + 1);
                            seen.outside.push(format!("{name}: {query}"));
                        }
                    }
                    _ => {}
                }
            }
            if server_out.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        let _ = server_out.shutdown(std::net::Shutdown::Both);
    });
    std::thread::spawn(move || {
        let (mut buffer, mut pending, mut startup) = (vec![0u8; 64 * 1024], Vec::new(), false);
        while let Ok(read) = server_in.read(&mut buffer) {
            if read == 0 {
                break;
            }
            pending.extend_from_slice(&buffer[..read]);
            for (kind, body) in messages(&mut pending, &mut startup) {
                if kind == b'Z' && !body.is_empty() {
                    seen.lock().expect("the proxy's state").status = body[0];
                }
            }
            // The status first, then the client hears it and sends its next message.
            if client_out.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        let _ = client_out.shutdown(std::net::Shutdown::Both);
    });
}

/// diesel-async's PostgreSQL connection through the proxy, on a current-thread runtime.
fn connect(url: &str) -> AsyncConn<AsyncPgConnection> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let conn = runtime
        .block_on(idempotent_jobs::pooler::establish_async_pg(url))
        .unwrap_or_else(|e| panic!("PostgreSQL through the proxy at {url}: {e}"));
    AsyncConn { runtime, conn }
}

/// A job that runs, one that replays, one whose claim the database refuses on its own (a trigger:
/// a failure that does not pass, after which the runtime asks whether `done_jobs` is there), and
/// the keys API's look-up and a forget the database refuses (the same question after it): no
/// statement is prepared by name outside a transaction. Before, the questions after a refusal
/// were (`TableExists`, prepared outside any transaction).
#[test]
fn async_postgres_prepares_nothing_outside_a_transaction() {
    let db = Db::<AsyncPostgres>::fresh();
    let (url, seen) = watch(db.locator());
    let mut c = connect(&url);
    let charge = |c: &mut AsyncConn<AsyncPgConnection>, order: &str| {
        c.runtime.block_on(handlers::charge_async(
            &mut c.conn,
            order,
            100,
            Mode::Succeed,
        ))
    };
    charge(&mut c, "order-1").expect("a job");
    charge(&mut c, "order-1").expect("its replay");
    everything_else(&mut c);
    let mut direct = AsyncPostgres::connect(db.locator());
    AsyncPostgres::execute(
        &mut direct,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$; \
         CREATE TRIGGER refuse_claims BEFORE INSERT OR DELETE ON done_jobs FOR EACH ROW \
         EXECUTE FUNCTION refuse()",
    );
    let refused = charge(&mut c, "order-2").expect_err("a claim the trigger refuses");
    assert!(
        format!("{refused:?}").contains("refused by a trigger"),
        "{refused:?}"
    );
    let key = idempotent_jobs::JobKey::new("charge:order-1");
    c.runtime
        .block_on(idempotent_jobs::keys::lookup_async(&mut c.conn, &key))
        .expect("a look-up");
    let forget = c.runtime.block_on(idempotent_jobs::keys::forget_async(
        &mut c.conn,
        &key,
        "test",
    ));
    assert!(
        forget.is_err(),
        "the trigger refuses the forget: {forget:?}"
    );
    let outside = std::mem::take(&mut seen.lock().expect("the proxy's state").outside);
    assert!(
        outside.is_empty(),
        "statements prepared by name outside a transaction: {outside:#?}"
    );
}

static NOTIFY: idempotent_jobs::Job = idempotent_jobs::Job::new("notify", "notify:<n>");

/// The rest of the API on `c`: migrate and verify, a job that pushes an outbox message and a
/// relay that delivers it, the outbox's reads, the keys API's reads, a prune.
fn everything_else(c: &mut AsyncConn<AsyncPgConnection>) {
    use idempotent_jobs::{keys, outbox};
    let (runtime, conn) = (&c.runtime, &mut c.conn);
    runtime.block_on(async {
        idempotent_jobs::migrate_async(conn).await.expect("migrate");
        idempotent_jobs::verify_async(conn).await.expect("verify");
        let pushed = idempotent_jobs::run_async(
            conn,
            &NOTIFY,
            &idempotent_jobs::JobKey::new("notify:1"),
            async |conn| {
                outbox::push_async(conn, "notices", &"hello").await?;
                Ok::<_, idempotent_jobs::Error>(())
            },
        )
        .await
        .expect("a job that pushes a message");
        assert!(pushed.is_ran());
        let delivered = outbox::Relay::default()
            .drain_async(conn, async |_message| Ok::<_, String>(()))
            .await
            .expect("a relay");
        assert_eq!(delivered.delivered, 1, "{delivered:?}");
        outbox::unsent_async(conn, 10).await.expect("unsent");
        outbox::parked_async(conn).await.expect("parked");
        outbox::counts_async(conn).await.expect("counts");
        keys::list_async(conn, &keys::KeyQuery::default())
            .await
            .expect("a list");
        keys::job_counts_async(conn).await.expect("job counts");
        idempotent_jobs::prune_async(conn, &idempotent_jobs::Prune::default())
            .await
            .expect("a prune");
    });
}
