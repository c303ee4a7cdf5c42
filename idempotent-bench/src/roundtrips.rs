//! Round trips and statements per job, counted rather than reasoned about: the client connects
//! through a loopback proxy that counts the client's flights (a send after the server has
//! answered, however many packets it takes), and Diesel's instrumentation lists the statements.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use diesel::connection::InstrumentationEvent;
use serde::Serialize;

use crate::db::BenchDb;
use crate::variants::{Variant, macro_job};

/// A loopback TCP proxy to `upstream` counting the client's flights over all its connections.
pub struct Proxy {
    pub addr: String,
    flights: Arc<AtomicU64>,
}

impl Proxy {
    pub fn start(upstream: &str) -> std::io::Result<Self> {
        Self::start_delayed(upstream, std::time::Duration::ZERO)
    }

    /// [`start`](Self::start), holding each flight of the client's `delay` before it goes on: a
    /// network's latency, once per round trip (`IDEMPOTENT_BENCH_LATENCY_US`).
    pub fn start_delayed(upstream: &str, delay: std::time::Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let flights = Arc::new(AtomicU64::new(0));
        let (counter, upstream) = (flights.clone(), upstream.to_owned());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if let Ok(server) = TcpStream::connect(&upstream) {
                    relay(client, server, counter.clone(), delay);
                }
            }
        });
        Ok(Self { addr, flights })
    }

    pub fn flights(&self) -> u64 {
        self.flights.load(Ordering::SeqCst)
    }
}

fn relay(
    client: TcpStream,
    server: TcpStream,
    flights: Arc<AtomicU64>,
    delay: std::time::Duration,
) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let answered = Arc::new(AtomicBool::new(true));
    let (Ok(client_in), Ok(server_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let answered_up = answered.clone();
    std::thread::spawn(move || {
        copy(client_in, server_out, |_| {
            if answered_up.swap(false, Ordering::SeqCst) {
                flights.fetch_add(1, Ordering::SeqCst);
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
            }
        });
    });
    std::thread::spawn(move || copy(server, client, |_| answered.store(true, Ordering::SeqCst)));
}

fn copy(mut from: TcpStream, mut to: TcpStream, mut seen: impl FnMut(usize)) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => {
                let _ = to.shutdown(std::net::Shutdown::Both);
                return;
            }
            Ok(n) => {
                seen(n);
                if to.write_all(&buffer[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// `url` with its host and port replaced by `addr`; and the host and port it had.
pub fn via(url: &str, addr: &str, default_port: u16) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (credentials, host_path) = match rest.rsplit_once('@') {
        Some((c, h)) => (format!("{c}@"), h),
        None => (String::new(), rest),
    };
    let end = host_path.find(['/', '?']).unwrap_or(host_path.len());
    let host = &host_path[..end];
    let upstream = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    };
    (
        format!("{scheme}://{credentials}{addr}{}", &host_path[end..]),
        upstream,
    )
}

#[derive(Debug, Serialize)]
pub struct Count {
    pub job: &'static str,
    /// Client flights per job (None: SQLite, in process).
    pub round_trips: Option<f64>,
    pub statements: f64,
    /// The statements of the last job, abridged.
    pub sent: Vec<String>,
}

/// What is counted: the variants on fresh keys, then replays.
const CASES: [&str; 12] = [
    "floor_empty",
    "floor",
    "floor_procedures",
    "floor_value",
    "hand",
    "hand_value",
    "macro",
    "macro_value",
    "macro_empty",
    "replay read first",
    "replay via claim",
    "read",
];

/// Counts each case over `calls` calls on `conn` (connected through `proxy`, if any).
pub fn count<C: BenchDb>(conn: &mut C, proxy: Option<&Proxy>, calls: i64) -> Vec<Count> {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = log.clone();
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            sink.lock().expect("log").push(abridged(&query.to_string()));
        }
    });
    let mut counts = Vec::new();
    for (n, case) in CASES.into_iter().enumerate() {
        let first = 7_000_000_000 + n as i64 * 10_000;
        for job in first..first + calls {
            one(conn, case, job, true); // warm-up; and the keys the replays replay
        }
        log.lock().expect("log").clear();
        let before = proxy.map(Proxy::flights);
        let mut last = 0;
        for job in first..first + calls {
            last = log.lock().expect("log").len();
            one(conn, case, job, false);
        }
        let sent = log.lock().expect("log").clone();
        counts.push(Count {
            job: case,
            round_trips: proxy
                .zip(before)
                .map(|(p, b)| (p.flights() - b) as f64 / calls as f64),
            statements: sent.len() as f64 / calls as f64,
            sent: sent[last..].to_vec(),
        });
    }
    counts
}

/// One call of `case`; `warm`: the call that precedes the counted one (fresh cases run on other
/// keys, replays claim their keys).
fn one<C: BenchDb>(conn: &mut C, case: &str, job: i64, warm: bool) {
    let fresh = if warm { job + 1_000_000 } else { job };
    let variant = match case {
        "floor_empty" => Variant::FloorEmpty,
        "floor" => Variant::Floor,
        "floor_value" => Variant::FloorValue,
        "floor_procedures" if C::KIND == crate::db::Kind::Mysql => Variant::FloorProcedures,
        "floor_procedures" => return,
        "hand" => Variant::Hand,
        "hand_value" => Variant::HandValue,
        "macro" => Variant::Macro,
        "macro_value" => Variant::MacroValue,
        "macro_empty" => Variant::MacroEmpty,
        "read" => {
            if warm {
                macro_job(conn, job).expect("a claim");
            } else {
                let (_, digest) = crate::variants::hand_key("bench", job);
                assert!(conn.read_done(&digest).expect("a read").is_some());
            }
            return;
        }
        replay => {
            let flag = replay == "replay read first";
            if warm {
                macro_job(conn, job).expect("a claim");
            } else {
                idempotent_jobs::redelivered(flag, || macro_job(conn, job)).expect("a replay");
            }
            return;
        }
    };
    variant.run(conn, fresh).expect("a job");
}

fn abridged(sql: &str) -> String {
    let sql = sql.split(" -- binds").next().unwrap_or(sql).trim();
    let mut short: String = sql.chars().take(72).collect();
    if short.len() < sql.len() {
        short.push('…');
    }
    short
}
