//! diesel-async's PostgreSQL connection sends a job's `BEGIN` and its first claim in one flight
//! (pipelined): counted by a loopback proxy, and made safe for the case where that `BEGIN` fails
//! while the claim behind it runs anyway.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use diesel_async::{AsyncConnection as _, AsyncPgConnection};

use crate::backends::{AsyncConn, AsyncPostgres, Backend as _};
use crate::handlers::{self, Mode};
use crate::harness::Db;

/// A proxy on loopback that counts the client's flights (what it sends between two answers of the
/// server) and can spoil the next job's `BEGIN` so that the server refuses it ([`SPOIL`]), or
/// blank it so that the server runs something else and answers without error ([`BLANK`]).
struct Watch {
    address: String,
    upstream: String,
    flights: Arc<AtomicUsize>,
    spoil: Arc<AtomicU8>,
    begins: Arc<AtomicUsize>,
}

/// What the proxy does to the next job's `BEGIN`: nothing, spoil it (`XEGIN`, refused), or blank it
/// (the batch's text replaced by `SELECT 1`: the client hears success, and nothing was begun).
const PASS: u8 = 0;
const SPOIL: u8 = 1;
const BLANK: u8 = 2;

/// The start of the text batch that opens a job's transaction on PostgreSQL.
const JOB_BEGIN: &[u8] = b"BEGIN; SET LOCAL idempotent.job";

impl Watch {
    fn start(locator: &str) -> Watch {
        let upstream = crate::proxy::host_port(locator);
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let address = listener.local_addr().expect("its address").to_string();
        let (flights, spoil, begins) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicU8::new(PASS)),
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
    spoil: Arc<AtomicU8>,
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
                match spoil.swap(PASS, Ordering::SeqCst) {
                    // Same length, so the message's framing holds: `XEGIN` is a syntax error,
                    // and PostgreSQL runs none of the batch.
                    SPOIL => chunk[at] = b'X',
                    // The batch's text, up to the query's closing NUL, replaced by `SELECT 1`
                    // and spaces: what reaches the server when the transport between the
                    // client and it loses track of the client's transaction.
                    BLANK => {
                        let end = chunk[at..]
                            .iter()
                            .position(|b| *b == 0)
                            .map_or(chunk.len(), |n| at + n);
                        chunk[at..end].fill(b' ');
                        chunk[at..at + 8].copy_from_slice(b"SELECT 1");
                    }
                    _ => {}
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

    watch.spoil.store(SPOIL, Ordering::SeqCst);
    let error = charge(&mut c, "order-2").expect_err("a job whose BEGIN the server refused");
    assert!(
        watch.spoil.load(Ordering::SeqCst) == PASS,
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
    // The next job fails on the broken connection (at once: nothing of it goes out), and the
    // connection's task, run while the runtime waits, sends what the dropped one queued.
    let next = charge(&mut c, "order-4");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while watch.begins.load(Ordering::SeqCst) == begins && std::time::Instant::now() < deadline {
        c.runtime.block_on(async {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        });
    }
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

/// A job whose `BEGIN` never took effect where its statements ran, while the client heard it
/// succeed: what a transaction pooler that lost track of its clients does (PgBouncer 1.18 in
/// transaction mode, crossed by another client's prepared statement sent outside a transaction,
/// sent a worker's `BEGIN` to one server connection and its claim to another; test
/// `pgbouncer_crossed_by_other_clients_tells_every_outcome_truly`). Here the proxy replaces
/// the batch by `SELECT 1`. Before the claims checked that they run in their job's transaction,
/// the claim and the body's writes each committed on their own, the release failed, the claim was
/// taken back as if the body had committed, and the next delivery charged the order again. Now
/// the claim is refused: nothing is committed, the error says why and that retrying is safe, and
/// the retry charges once. Sync (`PgConnection`: `BEGIN`, then the claim) and async (the two in
/// one flight).
fn a_job_whose_begin_never_took_effect_commits_nothing(
    watch: &Watch,
    mut charge: impl FnMut(&str) -> Result<(), handlers::TestError>,
    mut rows: impl FnMut(&str) -> (i64, i64),
) {
    charge("warm-up").expect("a first job");
    watch.spoil.store(BLANK, Ordering::SeqCst);
    let error = charge("order-5").expect_err("a job whose BEGIN never took effect");
    assert_eq!(
        watch.spoil.load(Ordering::SeqCst),
        PASS,
        "the proxy blanked the BEGIN"
    );
    let shown = crate::names::with_causes(&error);
    assert!(
        shown.contains("nothing of the job was committed")
            && shown.contains("did not run in the transaction the job opened")
            && shown.contains("retrying is safe"),
        "{shown}"
    );
    assert_eq!(
        rows("order-5"),
        (0, 0),
        "(claims, charges) after the refusal"
    );
    charge("order-5").expect("the retry");
    assert_eq!(rows("order-5"), (1, 1), "(claims, charges) after the retry");
}

#[test]
fn postgres_job_whose_begin_never_took_effect_commits_nothing() {
    use crate::backends::Postgres;
    use diesel::Connection as _;
    let db = Db::<Postgres>::fresh();
    let watch = Watch::start(db.locator());
    let url = watch.url(db.locator());
    let mut conn = diesel::PgConnection::establish(&url)
        .unwrap_or_else(|e| panic!("PostgreSQL through the proxy at {url}: {e}"));
    let mut direct = Postgres::connect(db.locator());
    a_job_whose_begin_never_took_effect_commits_nothing(
        &watch,
        |order| handlers::charge(&mut conn, order, 100, Mode::Succeed).map(drop),
        |order| {
            (
                Postgres::query_i64(
                    &mut direct,
                    &format!(
                        "SELECT COUNT(*) AS n FROM done_jobs WHERE job_key = 'charge:{order}'"
                    ),
                ),
                Postgres::count_charges(&mut direct, order),
            )
        },
    );
}

#[test]
fn async_postgres_job_whose_begin_never_took_effect_commits_nothing() {
    let db = Db::<AsyncPostgres>::fresh();
    let watch = Watch::start(db.locator());
    let mut c = connect(&db, &watch);
    let mut direct = AsyncPostgres::connect(db.locator());
    a_job_whose_begin_never_took_effect_commits_nothing(
        &watch,
        |order| charge(&mut c, order),
        |order| {
            (
                done_rows(&mut direct, order),
                AsyncPostgres::count_charges(&mut direct, order),
            )
        },
    );
}
