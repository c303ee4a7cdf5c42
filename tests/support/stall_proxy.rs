//! A TCP proxy that cuts a connection that fell silent for `stall`: for a connection the test keeps
//! busy, a server that stopped answering. MariaDB 10.11 under Galera can leave a session it brute-force aborted
//! without a reply (its thread shows `Killed` in the process list and never finishes), and the
//! client then waits for ever; through this proxy it gets a lost connection instead, and the test
//! counts the hang and delivers the job again on a new connection. A legitimate wait longer than
//! `stall` (a lock wait, say) would be cut too: the test using it has none.

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// See the module docs.
pub struct StallProxy {
    port: u16,
    cuts: Arc<AtomicUsize>,
}

impl StallProxy {
    /// A proxy on loopback to `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16, stall: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let cuts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&cuts);
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)) else {
                    continue;
                };
                relay(client, server, stall, Arc::clone(&counted));
            }
        });
        Self { port, cuts }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many connections were cut for a server that stopped answering.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

fn relay(client: TcpStream, server: TcpStream, stall: Duration, cuts: Arc<AtomicUsize>) {
    let epoch = Instant::now();
    let millis = move || u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
    // When a byte last went either way. The test keeps the connection busy from its first statement
    // to its last, so a silence of `stall` means a server that stopped mid-reply (it may have sent
    // part of a result, so "no reply at all" would not catch it).
    let last_traffic = Arc::new(AtomicU64::new(millis()));
    let closed = Arc::new(AtomicBool::new(false));
    let (mut client_in, mut server_out) = (
        client.try_clone().expect("a client handle"),
        server.try_clone().expect("a server handle"),
    );
    let (mut server_in, mut client_out) = (
        server.try_clone().expect("a server handle"),
        client.try_clone().expect("a client handle"),
    );
    let (sent, answered) = (Arc::clone(&last_traffic), Arc::clone(&last_traffic));
    let (closed_in, closed_out) = (Arc::clone(&closed), Arc::clone(&closed));
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(read) = client_in.read(&mut buffer) {
            sent.store(millis(), Ordering::SeqCst);
            if read == 0 || server_out.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        closed_in.store(true, Ordering::SeqCst);
        let _ = server_out.shutdown(Shutdown::Both);
    });
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(read) = server_in.read(&mut buffer) {
            answered.store(millis(), Ordering::SeqCst);
            if read == 0 || client_out.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        closed_out.store(true, Ordering::SeqCst);
        let _ = client_out.shutdown(Shutdown::Both);
    });
    std::thread::spawn(move || {
        while !closed.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
            let silent = millis().saturating_sub(last_traffic.load(Ordering::SeqCst));
            if silent > u64::try_from(stall.as_millis()).unwrap_or(u64::MAX) {
                cuts.fetch_add(1, Ordering::SeqCst);
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
                break;
            }
        }
    });
}
