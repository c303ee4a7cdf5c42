//! MySQL refuses to prepare `BEGIN` and the savepoint statements (`ER_UNSUPPORTED_PS`, 1295), where
//! MariaDB takes them. A proxy in front of MariaDB answers a COM_STMT_PREPARE of any of them with
//! that error, as MySQL does, and the runtime must fall back to text (`BEGIN` with the job's
//! savepoint, its release with the `COMMIT`) and lose nothing: jobs run once and replay, a failing
//! job leaves nothing, and a body whose DDL commits the transaction is still caught. Its own test
//! binary: the fall-back is process-wide.

#[path = "support/mysql_database.rs"]
mod mysql_database;

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

diesel::table! {
    refusal_effects (id) {
        id -> BigInt,
        order_id -> Text,
    }
}

#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

#[idempotent_job(key = "refusal:<order_id>")]
fn charge(conn: &mut MysqlConnection, order_id: &str) -> Result<u32, TestError> {
    diesel::insert_into(refusal_effects::table)
        .values(refusal_effects::order_id.eq(order_id))
        .execute(conn)?;
    Ok(7)
}

/// Writes its effect, then runs `then` (DDL commits the transaction on MySQL), then fails or not.
#[idempotent_job(key = "refusal-then:<order_id>")]
fn charge_then(
    conn: &mut MysqlConnection,
    order_id: &str,
    then: &str,
    fail: bool,
) -> Result<u32, TestError> {
    diesel::insert_into(refusal_effects::table)
        .values(refusal_effects::order_id.eq(order_id))
        .execute(conn)?;
    if !then.is_empty() {
        conn.batch_execute(then)?;
    }
    if fail {
        return Err(diesel::result::Error::RollbackTransaction.into());
    }
    Ok(8)
}

/// What MySQL refuses to prepare.
fn refused(statement: &[u8]) -> bool {
    let statement = String::from_utf8_lossy(statement).to_ascii_uppercase();
    let statement = statement.trim_start();
    [
        "BEGIN",
        "START TRANSACTION",
        "SAVEPOINT",
        "RELEASE SAVEPOINT",
        "ROLLBACK TO",
    ]
    .iter()
    .any(|refused| statement.starts_with(refused))
}

const COM_STMT_PREPARE: u8 = 0x16;

/// An ERR packet with sequence number 1 (the reply to a command), as MySQL sends for a statement
/// its prepared statement protocol does not take.
fn unsupported_ps() -> Vec<u8> {
    let message = b"This command is not supported in the prepared statement protocol yet";
    let mut payload = vec![0xFF];
    payload.extend_from_slice(&1295u16.to_le_bytes());
    payload.extend_from_slice(b"#HY000");
    payload.extend_from_slice(message);
    let length = u32::try_from(payload.len())
        .expect("a short packet")
        .to_le_bytes();
    let mut packet = vec![length[0], length[1], length[2], 1];
    packet.extend_from_slice(&payload);
    packet
}

/// A proxy to `upstream` that refuses to prepare what MySQL refuses; counts the refusals.
fn start_proxy(upstream: String, refusals: Arc<AtomicUsize>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let refusals = Arc::clone(&refusals);
            let (mut client_in, mut client_out) = (client.try_clone().expect("client"), client);
            let (mut server_in, mut server_out) = (server.try_clone().expect("server"), server);
            // Replies to the client come from the server, or from the proxy for a refused prepare.
            let answering = client_out.try_clone().expect("client");
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; 64 * 1024];
                while let Ok(read) = client_in.read(&mut buffer) {
                    if read == 0 {
                        break;
                    }
                    // One write may hold several packets (a statement's close goes out with the
                    // next command): the others go on to the server.
                    let mut forward = Vec::new();
                    let mut refuse = false;
                    let mut at = 0;
                    let chunk = &buffer[..read];
                    while let Some(header) = chunk.get(at..at + 4) {
                        let length = usize::from(header[0])
                            | usize::from(header[1]) << 8
                            | usize::from(header[2]) << 16;
                        let end = (at + 4 + length).min(chunk.len());
                        let packet = &chunk[at..end];
                        if packet.get(4) == Some(&COM_STMT_PREPARE) && refused(&packet[5..]) {
                            refuse = true;
                        } else {
                            forward.extend_from_slice(packet);
                        }
                        at = end;
                    }
                    forward.extend_from_slice(&chunk[at..]);
                    if !forward.is_empty() && server_out.write_all(&forward).is_err() {
                        break;
                    }
                    if refuse {
                        refusals.fetch_add(1, Ordering::SeqCst);
                        if (&answering).write_all(&unsupported_ps()).is_err() {
                            break;
                        }
                    }
                }
            });
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; 64 * 1024];
                while let Ok(read) = server_in.read(&mut buffer) {
                    if read == 0 || client_out.write_all(&buffer[..read]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

fn status(conn: &mut MysqlConnection, name: &str) -> i64 {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(format!(
        "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS n FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = '{name}'"
    ))
    .get_result::<N>(conn)
    .expect("a status variable")
    .n
}

#[test]
fn a_server_that_refuses_a_prepared_begin_gets_a_text_begin() {
    let database = format!("refusal_{}", std::process::id());
    let (refusals, switches, effects, effects_after) =
        mysql_database::in_database(&database, "", |url| {
            through_a_refusing_proxy(url, &database)
        });
    assert_eq!(refusals, 1, "refused once, then not asked again");
    assert_eq!(effects, 3, "each job ran once, and replayed once");
    assert_eq!(
        effects_after - effects,
        3,
        "d ran once (its failed run left nothing); e's run before the DDL committed its effect, as the error says, and its retry ran once more"
    );
    assert!(
        switches >= 6 * 4,
        "every job's BEGIN and COMMIT went as text batches: {switches} multi-statement switches"
    );
}

/// The job walk-through behind a proxy that refuses a prepared `BEGIN`, in the database at `url`:
/// the proxy's refusals, the multi-statement switches the jobs made, and the effects before and
/// after the last jobs.
fn through_a_refusing_proxy(url: &str, database: &str) -> (usize, i64, i64, i64) {
    let (server, _) = url.rsplit_once('/').expect("a database in the URL");
    let host_port = server
        .rsplit_once('@')
        .map_or(server, |(_, h)| h)
        .to_owned();
    let refusals = Arc::new(AtomicUsize::new(0));
    let port = start_proxy(host_port.clone(), Arc::clone(&refusals));
    let url = format!(
        "{}/{database}",
        server.replacen(&host_port, &format!("127.0.0.1:{port}"), 1)
    );
    let mut conn = MysqlConnection::establish(&url).expect("through the proxy");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    // MySQL prepares a `CALL` of the job procedures, and runs `BEGIN` and the savepoints inside
    // them: without them (tests/mysql_procedures.rs) the runtime prepares the statements
    // themselves, which is what MySQL refuses.
    conn.batch_execute(
        "DROP PROCEDURE idempotent_begin_job; DROP PROCEDURE idempotent_begin_and_claim; DROP PROCEDURE idempotent_finish_job",
    )
        .expect("without the job procedures");
    conn.batch_execute(
        "CREATE TABLE refusal_effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(100) NOT NULL)",
    )
    .expect("the effects table");

    let switches = status(&mut conn, "COM_SET_OPTION");
    for order in ["a", "b", "c"] {
        assert_eq!(charge(&mut conn, order).expect("runs"), 7);
        assert_eq!(charge(&mut conn, order).expect("replays"), 7);
    }
    let switches = status(&mut conn, "COM_SET_OPTION") - switches;
    let effects: i64 = refusal_effects::table
        .count()
        .get_result(&mut conn)
        .expect("a count");
    // A failing job leaves nothing; its retry runs once.
    charge_then(&mut conn, "d", "", true).expect_err("fails");
    assert_eq!(charge_then(&mut conn, "d", "", false).expect("runs"), 8);
    assert_eq!(charge_then(&mut conn, "d", "", false).expect("replays"), 8);
    // DDL in the body commits the job's transaction: caught, the claim taken back, a retry runs.
    let error = charge_then(
        &mut conn,
        "e",
        "CREATE TABLE IF NOT EXISTS refusal_probe (id INT)",
        false,
    )
    .expect_err("the transaction ended in the body");
    assert!(
        matches!(
            error,
            TestError::Idempotent(idempotent_jobs::Error::TransactionEndedInBody { .. })
        ),
        "{error}"
    );
    assert_eq!(
        charge_then(&mut conn, "e", "", false).expect("a retry runs"),
        8
    );
    let effects_after: i64 = refusal_effects::table
        .count()
        .get_result(&mut conn)
        .expect("a count");
    (
        refusals.load(Ordering::SeqCst),
        switches,
        effects,
        effects_after,
    )
}
