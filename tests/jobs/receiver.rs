//! A small payment and messaging service on loopback, as a job's side effects meet it in
//! production: it honours `Idempotency-Key` on charges and drops messages whose `Message-Id` it has
//! already acted on. Plain HTTP/1.1 over std's TCP, one request per connection.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the service has seen and done.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// Charge requests received, duplicates included.
    pub charge_requests: u64,
    /// Charges made, by idempotency key: the effect that must happen once.
    pub charges: HashMap<String, String>,
    /// Message deliveries received, duplicates included.
    pub deliveries: u64,
    /// Deliveries dropped because their message id had been acted on.
    pub duplicates_dropped: u64,
    /// Messages acted on, by id, with how many times each was delivered.
    pub messages: HashMap<String, u64>,
}

pub struct Service {
    addr: SocketAddr,
    ledger: Arc<Mutex<Ledger>>,
}

impl Service {
    /// Starts the service on a free loopback port; it runs until the test process ends.
    pub fn start() -> Service {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let shared = Arc::clone(&ledger);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let ledger = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let _ = serve(stream, &ledger);
                });
            }
        });
        Service { addr, ledger }
    }

    /// `host:port`, for [`post`].
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    pub fn ledger(&self) -> Ledger {
        self.ledger.lock().expect("ledger").clone()
    }
}

fn serve(stream: TcpStream, ledger: &Mutex<Ledger>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let path = request_line.split_whitespace().nth(1).unwrap_or("");

    let (status, reply) = {
        let mut ledger = ledger.lock().expect("ledger");
        match path {
            "/charges" => match headers.get("idempotency-key") {
                None => (400, "an Idempotency-Key header is required".to_owned()),
                Some(key) => {
                    ledger.charge_requests += 1;
                    let next = format!("ch_{}", ledger.charges.len() + 1);
                    let charge = ledger.charges.entry(key.clone()).or_insert(next).clone();
                    (200, charge)
                }
            },
            "/messages" => match headers.get("message-id") {
                None => (400, "a Message-Id header is required".to_owned()),
                Some(id) => {
                    ledger.deliveries += 1;
                    let seen = ledger.messages.entry(id.clone()).or_insert(0);
                    *seen += 1;
                    if *seen > 1 {
                        ledger.duplicates_dropped += 1;
                        (200, "duplicate dropped".to_owned())
                    } else {
                        (201, "acted on".to_owned())
                    }
                }
            },
            _ => (404, "no such path".to_owned()),
        }
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
        reply.len()
    )?;
    stream.flush()
}

/// `POST` to the service; returns the status and the body.
pub fn post(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}
