//! A TCP proxy between a worker and its database that can cut the connection right after the
//! worker's `COMMIT` reached the server: the server commits, the reply never arrives.

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// The text after which a proxy arms itself, until it is seen.
type After = Arc<std::sync::Mutex<Option<&'static str>>>;

/// A proxy on loopback; see the module docs.
pub struct CommitCutter {
    address: String,
    upstream: String,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    /// A text after which the proxy arms itself ([`arm_after`](Self::arm_after)).
    after: After,
    /// Whether only a statement that is `COMMIT` counts (PostgreSQL, after `arm_after`).
    strict: Arc<AtomicBool>,
    /// A text that counts in place of `COMMIT` ([`arm_on`](Self::arm_on)).
    word: Word,
    /// What the client hears in place of the reply ([`arm_with_farewell`](Self::arm_with_farewell)).
    farewell: Word,
}

/// The text a proxy cuts at in place of `COMMIT`, when one is set.
type Word = Arc<std::sync::Mutex<Option<&'static str>>>;

impl CommitCutter {
    /// A proxy to the server a database `locator` (a URL) names.
    pub fn start(locator: &str) -> Self {
        let upstream = host_port(locator);
        let mysql = locator.starts_with("mysql");
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let address = listener.local_addr().expect("its address").to_string();
        let (armed, cuts) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let after = Arc::new(std::sync::Mutex::new(None));
        let strict = Arc::new(AtomicBool::new(false));
        let word: Word = Arc::new(std::sync::Mutex::new(None));
        let (to, armed_for_clients, cuts_for_clients, after_for_clients, strict_for_clients) = (
            upstream.clone(),
            Arc::clone(&armed),
            Arc::clone(&cuts),
            Arc::clone(&after),
            Arc::clone(&strict),
        );
        let word_for_clients = Arc::clone(&word);
        let farewell: Word = Arc::new(std::sync::Mutex::new(None));
        let farewell_for_clients = Arc::clone(&farewell);
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(&to) else {
                    continue;
                };
                let (armed, cuts, after, strict) = (
                    Arc::clone(&armed_for_clients),
                    Arc::clone(&cuts_for_clients),
                    Arc::clone(&after_for_clients),
                    Arc::clone(&strict_for_clients),
                );
                let (word, farewell) = (
                    Arc::clone(&word_for_clients),
                    Arc::clone(&farewell_for_clients),
                );
                relay(
                    client,
                    server,
                    mysql,
                    (armed, after, strict, word, farewell),
                    cuts,
                );
            }
        });
        CommitCutter {
            address,
            upstream,
            armed,
            cuts,
            after,
            strict,
            word,
            farewell,
        }
    }

    /// `locator` pointed at the proxy instead of the server, in plain text (no TLS, which would
    /// hide the `COMMIT`) and over TCP only (mysql_async would otherwise move to the server's Unix
    /// socket once it learns of it).
    pub fn url(&self, locator: &str) -> String {
        let url = locator.replacen(&self.upstream, &self.address, 1);
        let separator = if url.contains('?') { '&' } else { '?' };
        if url.starts_with("mysql") {
            format!("{url}{separator}prefer_socket=false")
        } else {
            format!("{url}{separator}sslmode=disable")
        }
    }

    /// Cuts the next connection that sends a `COMMIT`, once.
    pub fn arm(&self) {
        *self.word.lock().expect("the proxy's state") = None;
        *self.farewell.lock().expect("the proxy's state") = None;
        self.armed.store(true, Ordering::SeqCst);
    }

    /// As [`arm`](Self::arm), and the client hears a PostgreSQL `FATAL` error (SQLSTATE 08P01)
    /// saying `text` before the socket closes, in place of the reply: what PgBouncer sends a
    /// client whose server connection it lost or ended (`server conn crashed?`, `query timeout`).
    pub fn arm_with_farewell(&self, text: &'static str) {
        self.arm();
        self.say_at_the_cut(text);
    }

    /// The client hears a PostgreSQL `FATAL` error saying `text` at the next cut, before the
    /// socket closes (see [`arm_with_farewell`](Self::arm_with_farewell)).
    pub fn say_at_the_cut(&self, text: &'static str) {
        *self.farewell.lock().expect("the proxy's state") = Some(text);
    }

    /// Cuts the next connection that sends a `COMMIT` after a client sent `text` (a statement
    /// of the transaction whose commit is to be cut), once.
    pub fn arm_after(&self, text: &'static str) {
        self.strict.store(true, Ordering::SeqCst);
        *self.after.lock().expect("the proxy's state") = Some(text);
    }

    /// Cuts the next connection that sends `text` (in place of a `COMMIT`: a savepoint's
    /// release, say), once: the server answers it, the client never hears the answer.
    pub fn arm_on(&self, text: &'static str) {
        *self.word.lock().expect("the proxy's state") = Some(text);
        self.armed.store(true, Ordering::SeqCst);
    }

    /// How many connections were cut.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// `host:port` of a `scheme://user@host:port/...` URL.
pub fn host_port(locator: &str) -> String {
    let after_at = locator.split_once('@').map_or(locator, |(_, rest)| rest);
    after_at
        .split(['/', '?'])
        .next()
        .expect("a host")
        .to_owned()
}

fn relay(
    client: TcpStream,
    server: TcpStream,
    mysql: bool,
    (armed, after, strict_commits, word, farewell): (
        Arc<AtomicBool>,
        After,
        Arc<AtomicBool>,
        Word,
        Word,
    ),
    cuts: Arc<AtomicUsize>,
) {
    let (mut client_in, mut server_out) = (
        client.try_clone().expect("a client handle"),
        server.try_clone().expect("a server handle"),
    );
    let (mut server_in, mut client_out) = (server, client);
    let (mut client_for_cut, server_for_cut) = (
        client_out.try_clone().expect("a client handle"),
        server_out.try_clone().expect("a server handle"),
    );
    // Set before the commit is forwarded: from then on nothing the server says reaches the client.
    let cutting = Arc::new(AtomicBool::new(false));
    let silenced = Arc::clone(&cutting);
    // The server's first reply after that (to the COMMIT): it has committed, and the cut follows.
    let (answered, commit_answered) = std::sync::mpsc::channel::<()>();
    // A MySQL client may send `COMMIT` as a prepared statement: the text goes once, in
    // COM_STMT_PREPARE, and each commit is a COM_STMT_EXECUTE of the id the server answered with.
    let (preparing_commit, commit_statement) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(u64::MAX)),
    );
    let (answering_commit, commit_statement_seen) =
        (Arc::clone(&preparing_commit), Arc::clone(&commit_statement));
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(read) = client_in.read(&mut buffer) {
            if read == 0 {
                break;
            }
            let chunk = &buffer[..read];
            // Armed from the chunk after the one holding the text (whose SQL may say "commit").
            let text_seen = after.lock().is_ok_and(|mut after| {
                let seen = after.is_some_and(|text| {
                    chunk
                        .windows(text.len())
                        .any(|w| w.eq_ignore_ascii_case(text.as_bytes()))
                });
                if seen {
                    *after = None;
                }
                seen
            });
            // Armed by `arm_after` (its `after` taken): only a statement that is `COMMIT`, not
            // the word in a comment of the migrations' SQL.
            let strict = !mysql
                && after.lock().is_ok_and(|after| after.is_none())
                && armed.load(Ordering::SeqCst)
                && strict_commits.load(Ordering::SeqCst);
            let word = *word.lock().expect("the proxy's state");
            let is_commit = if let Some(word) = word {
                chunk
                    .windows(word.len())
                    .any(|w| w.eq_ignore_ascii_case(word.as_bytes()))
            } else if strict {
                pg_commit_statement(chunk)
            } else if mysql {
                // One write may hold several packets (a statement's close goes out with the next
                // command).
                mysql_packets(chunk)
                    .iter()
                    .any(|(command, body)| match *command {
                        COM_STMT_PREPARE => {
                            if names_commit(body) {
                                preparing_commit.store(true, Ordering::SeqCst);
                            }
                            false
                        }
                        COM_STMT_EXECUTE => body.get(..4).is_some_and(|id| {
                            u64::from(u32::from_le_bytes([id[0], id[1], id[2], id[3]]))
                                == commit_statement.load(Ordering::SeqCst)
                        }),
                        COM_QUERY => names_commit(body),
                        _ => false,
                    })
            } else {
                names_commit(chunk)
            };
            let cut = is_commit && armed.swap(false, Ordering::SeqCst);
            if cut {
                cutting.store(true, Ordering::SeqCst);
            }
            if text_seen {
                armed.store(true, Ordering::SeqCst);
            }
            if server_out.write_all(chunk).is_err() {
                break;
            }
            if cut {
                // Once the server has answered the COMMIT (it committed: an event, not a guess at
                // how long that takes; a minute is only a deadline), neither side hears from the
                // other. Counted before the cut: the client sees its error as soon as the socket
                // closes, and the test reads the count right after (counting after the shutdown
                // lost that race in CI, 0 cuts seen for 1 made).
                let _ = commit_answered.recv_timeout(Duration::from_secs(60));
                cuts.fetch_add(1, Ordering::SeqCst);
                if let Some(text) = *farewell.lock().expect("the proxy's state") {
                    let _ = client_for_cut.write_all(&pg_fatal(text));
                }
                let _ = client_for_cut.shutdown(Shutdown::Both);
                let _ = server_for_cut.shutdown(Shutdown::Both);
                break;
            }
        }
    });
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        while let Ok(read) = server_in.read(&mut buffer) {
            if read == 0 {
                break;
            }
            if silenced.load(Ordering::SeqCst) {
                // The reply to the COMMIT: kept from the client.
                let _ = answered.send(());
                break;
            }
            // COM_STMT_PREPARE_OK: status 0x00, then the statement id.
            if answering_commit.swap(false, Ordering::SeqCst) && read >= 9 && buffer[4] == 0 {
                let id = u32::from_le_bytes([buffer[5], buffer[6], buffer[7], buffer[8]]);
                commit_statement_seen.store(u64::from(id), Ordering::SeqCst);
            }
            if client_out.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
    });
}

/// A PostgreSQL `ErrorResponse` of severity `FATAL`, SQLSTATE 08P01, saying `text`.
fn pg_fatal(text: &str) -> Vec<u8> {
    let mut fields = Vec::new();
    for (code, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "08P01"),
        (b'M', text),
    ] {
        fields.push(code);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut message = vec![b'E'];
    message.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
    message.extend_from_slice(&fields);
    message
}

/// Whether `chunk` holds a PostgreSQL simple query ('Q') one of whose statements is `COMMIT`.
fn pg_commit_statement(chunk: &[u8]) -> bool {
    let mut at = 0;
    while at + 5 <= chunk.len() {
        let kind = chunk[at];
        let length =
            u32::from_be_bytes([chunk[at + 1], chunk[at + 2], chunk[at + 3], chunk[at + 4]])
                as usize;
        let end = (at + 1 + length).min(chunk.len());
        if kind == b'Q' {
            let text = String::from_utf8_lossy(&chunk[at + 5..end]);
            if text
                .trim_end_matches('\0')
                .split(';')
                .any(|statement| statement.trim().eq_ignore_ascii_case("COMMIT"))
            {
                return true;
            }
        }
        if length < 4 {
            break;
        }
        at = end;
    }
    false
}

const COM_QUERY: u8 = 0x03;
const COM_STMT_PREPARE: u8 = 0x16;
const COM_STMT_EXECUTE: u8 = 0x17;

/// `COMMIT`, or the `CALL` of MySQL's job procedure that releases the job's savepoint and
/// commits (`idempotent_finish_job`).
fn names_commit(bytes: &[u8]) -> bool {
    bytes.windows(6).any(|w| w.eq_ignore_ascii_case(b"COMMIT"))
        || bytes
            .windows(10)
            .any(|w| w.eq_ignore_ascii_case(b"finish_job"))
}

/// The MySQL client packets in `chunk` (3 length bytes, a sequence byte, then the command and its
/// body), as `(command, body)`; a packet cut off at the end of the chunk is left out.
fn mysql_packets(chunk: &[u8]) -> Vec<(u8, &[u8])> {
    let mut packets = Vec::new();
    let mut at = 0;
    while let Some(header) = chunk.get(at..at + 4) {
        let length =
            usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
        let Some(payload) = chunk.get(at + 4..at + 4 + length) else {
            break;
        };
        if let Some((command, body)) = payload.split_first() {
            packets.push((*command, body));
        }
        at += 4 + length;
    }
    packets
}
