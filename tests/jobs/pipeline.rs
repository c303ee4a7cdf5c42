//! diesel-async's PostgreSQL connection sends a job's `BEGIN` and its first claim in one flight
//! (pipelined): counted by a loopback proxy, and made safe for the case where that `BEGIN` fails
//! while the claim behind it runs anyway.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use diesel_async::{AsyncConnection as _, AsyncPgConnection};

use crate::backends::{AsyncConn, AsyncPostgres, Backend as _};
use crate::handlers::{self, Mode};
use crate::harness::Db;

/// A proxy on loopback that counts the client's flights (what it sends between two answers of the
/// server) and can spoil the next job's `BEGIN` so that the server refuses it.
struct Watch {
    address: String,
    upstream: String,
    flights: Arc<AtomicUsize>,
    spoil: Arc<AtomicBool>,
    begins: Arc<AtomicUsize>,
}

/// The start of the text batch that opens a job's transaction on PostgreSQL.
const JOB_BEGIN: &[u8] = b"BEGIN; SET LOCAL idempotent.job";

impl Watch {
    fn start(locator: &str) -> Watch {
        let upstream = crate::proxy::host_port(locator);
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let address = listener.local_addr().expect("its address").to_string();
        let (flights, spoil, begins) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (to, counted, spoiling, begun) = (
            upstream.clone(),
            Arc::clone(&flights),
            Arc::clone(&spoil),
            Arc::clone(&begins),
        );
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(&to) else {
                    continue;
                };
                let watched = Watched {
                    flights: Arc::clone(&counted),
                    spoil: Arc::clone(&spoiling),
                    begins: Arc::clone(&begun),
                };
                relay(client, server, watched);
            }
        });
        Watch {
            address,
            upstream,
            flights,
            spoil,
            begins,
        }
    }

    fn url(&self, locator: &str) -> String {
        let url = locator.replacen(&self.upstream, &self.address, 1);
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}sslmode=disable")
    }

    fn flights(&self) -> usize {
        self.flights.load(Ordering::SeqCst)
    }
}

/// What one relayed connection reports to its [`Watch`].
struct Watched {
    flights: Arc<AtomicUsize>,
    spoil: Arc<AtomicBool>,
    begins: Arc<AtomicUsize>,
}

fn relay(client: TcpStream, server: TcpStream, watched: Watched) {
    let Watched {
        flights,
        spoil,
        begins,
    } = watched;
    let (mut client_in, mut server_out) = (
        client.try_clone().expect("a client handle"),
        server.try_clone().expect("a server handle"),
    );
    let (mut server_in, mut client_out) = (server, client);
    // Whether the server has spoken since the client last sent: the client's next send starts a
    // new flight.
    let answered = Arc::new(AtomicBool::new(true));
    let heard = Arc::clone(&answered);
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(read) = client_in.read(&mut buffer) {
            if read == 0 {
                break;
            }
            let chunk = &mut buffer[..read];
            if let Some(at) = chunk.windows(JOB_BEGIN.len()).position(|w| w == JOB_BEGIN) {
                begins.fetch_add(1, Ordering::SeqCst);
                if spoil.swap(false, Ordering::SeqCst) {
                    // Same length, so the message's framing holds: `XEGIN` is a syntax error,
                    // and PostgreSQL runs none of the batch.
                    chunk[at] = b'X';
                }
            }
            if answered.swap(false, Ordering::SeqCst) {
                flights.fetch_add(1, Ordering::SeqCst);
            }
            if server_out.write_all(chunk).is_err() {
                break;
            }
        }
        // The client hung up: so does the proxy, and the server ends the session (rolling back
        // whatever it left open) as it would without a proxy between them.
        let _ = server_out.shutdown(std::net::Shutdown::Both);
    });
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(read) = server_in.read(&mut buffer) {
            if read == 0 {
                break;
            }
            heard.store(true, Ordering::SeqCst);
            if client_out.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        let _ = client_out.shutdown(std::net::Shutdown::Both);
    });
}

/// A connection through `watch` on a current-thread runtime: the connection's own task runs only
/// when the job's future waits, so what the job queues before it waits goes out together.
fn connect(db: &Db<AsyncPostgres>, watch: &Watch) -> AsyncConn<AsyncPgConnection> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let url = watch.url(db.locator());
    let conn = runtime
        .block_on(AsyncPgConnection::establish(&url))
        .unwrap_or_else(|e| panic!("PostgreSQL through the proxy at {url}: {e}"));
    AsyncConn { runtime, conn }
}

fn charge(c: &mut AsyncConn<AsyncPgConnection>, order: &str) -> Result<(), handlers::TestError> {
    c.runtime
        .block_on(handlers::charge_async(
            &mut c.conn,
            order,
            100,
            Mode::Succeed,
        ))
        .map(drop)
}

fn done_rows(c: &mut AsyncConn<AsyncPgConnection>, order: &str) -> i64 {
    AsyncPostgres::query_i64(
        c,
        &format!("SELECT COUNT(*) AS n FROM done_jobs WHERE job_key = 'charge:{order}'"),
    )
}

/// A fresh job: `BEGIN` with the claim, the body's two inserts, the result's record, the release
/// and `COMMIT`: 5 flights (6 sent one after the other). A replay: `BEGIN` with the claim, the read
/// of the key's row, the end: 3 (4).
#[test]
fn async_postgres_sends_begin_with_the_first_claim() {
    let db = Db::<AsyncPostgres>::fresh();
    let watch = Watch::start(db.locator());
    let mut c = connect(&db, &watch);
    // Every statement prepared once, on this connection, before counting.
    charge(&mut c, "warm-up").expect("a first job");
    charge(&mut c, "warm-up").expect("its replay");

    let before = watch.flights();
    charge(&mut c, "order-1").expect("a job");
    let fresh = watch.flights() - before;
    let before = watch.flights();
    charge(&mut c, "order-1").expect("its replay");
    let replay = watch.flights() - before;
    crate::figures::report(&format!(
        "async PostgreSQL round trips: a fresh job with two statements and a result {fresh}, its replay {replay}"
    ));
    assert_eq!(AsyncPostgres::count_charges(&mut c, "order-1"), 1);
    assert_eq!((fresh, replay), (5, 3), "flights: fresh job, replay");
}

/// The worst case of sending the claim behind `BEGIN` before `BEGIN` answers: the server refuses
/// `BEGIN` and runs the claim anyway, on its own, committing at once. The claim must then insert
/// nothing: the call fails saying nothing was committed, no row holds the key, and the retry runs
/// the job once.
#[test]
fn async_postgres_claim_behind_a_failed_begin_commits_nothing() {
    let db = Db::<AsyncPostgres>::fresh();
    let watch = Watch::start(db.locator());
    let mut c = connect(&db, &watch);
    charge(&mut c, "warm-up").expect("a first job");

    watch.spoil.store(true, Ordering::SeqCst);
    let error = charge(&mut c, "order-2").expect_err("a job whose BEGIN the server refused");
    assert!(
        !watch.spoil.load(Ordering::SeqCst),
        "the proxy spoiled the BEGIN"
    );
    let shown = crate::names::with_causes(&error);
    assert!(
        shown.contains("nothing of the job was committed"),
        "{shown}"
    );
    assert_eq!(done_rows(&mut c, "order-2"), 0, "no claim left behind");
    assert_eq!(AsyncPostgres::count_charges(&mut c, "order-2"), 0);

    charge(&mut c, "order-2").expect("the retry");
    assert_eq!(done_rows(&mut c, "order-2"), 1);
    assert_eq!(AsyncPostgres::count_charges(&mut c, "order-2"), 1);
}

/// A job dropped with its `BEGIN` and claim queued but not yet answered (here: not even sent, the
/// connection's task not having run): the connection goes on to send them, so the server holds an
/// open transaction with an uncommitted claim. The job's guard marks the connection broken: the
/// next job on it fails instead of committing into that transaction, nothing of the dropped job is
/// ever committed, and its redelivery on a new connection runs it once.
#[test]
fn async_postgres_job_dropped_with_its_begin_in_flight_commits_nothing() {
    use std::task::Poll;

    let db = Db::<AsyncPostgres>::fresh();
    let watch = Watch::start(db.locator());
    let mut c = connect(&db, &watch);
    charge(&mut c, "warm-up").expect("a first job");

    let begins = watch.begins.load(Ordering::SeqCst);
    let AsyncConn { runtime, conn } = &mut c;
    runtime.block_on(async {
        let mut job = std::pin::pin!(handlers::charge_async(conn, "order-3", 100, Mode::Succeed));
        let first = std::future::poll_fn(|cx| Poll::Ready(job.as_mut().poll(cx))).await;
        assert!(first.is_pending(), "the job waits for its first answer");
    });
    // The next job lets the connection's task send what the dropped one queued.
    let next = charge(&mut c, "order-4");
    assert_eq!(
        watch.begins.load(Ordering::SeqCst),
        begins + 1,
        "the dropped job's BEGIN went out (and no later one)"
    );
    assert!(next.is_err(), "a job on the broken connection: {next:?}");

    let mut direct = AsyncPostgres::connect(db.locator());
    assert_eq!(done_rows(&mut direct, "order-3"), 0, "the claim committed");
    assert_eq!(done_rows(&mut direct, "order-4"), 0);
    drop(c);
    charge(&mut direct, "order-3").expect("the redelivery");
    assert_eq!(AsyncPostgres::count_charges(&mut direct, "order-3"), 1);
    assert_eq!(done_rows(&mut direct, "order-3"), 1);
}
