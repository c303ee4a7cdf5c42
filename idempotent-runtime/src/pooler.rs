//! Connecting an `AsyncPgConnection` through a transaction pooler (PgBouncer in transaction
//! pooling mode).
//!
//! diesel-async's `AsyncPgConnection::establish` sets the session up with two statements sent at
//! once (`SET TIME ZONE 'UTC'` and `SET CLIENT_ENCODING TO 'UTF8'`), each prepared and then
//! executed as a named statement, outside any transaction. A transaction pooler hands each
//! transaction, and so each of those exchanges, whichever server connection is free: PgBouncer
//! 1.18 (Debian 12's) runs a statement's preparation on one server connection and its execution
//! on another, and the connect fails with `CouldntSetupConfiguration(... prepared statement "s4"
//! does not exist)`, or `unexpected message from server` when two clients' exchanges cross.
//! With twenty clients connecting at once through three server connections, 51 of 60 such connects
//! failed in the PgBouncer test, one client's 20 times in a row; through these functions, none.
//!
//! [`establish_async_pg`] and [`from_client_and_connection`] run the same setup inside a
//! transaction of its own (`BEGIN`, the setup, `COMMIT`), where the pooler keeps the client on one
//! server connection, and return the connection with Diesel's prepared-statement cache turned
//! off, as a pooler needs (docs/clusters.md). What they return is the connection `establish`
//! returns: the same session settings, errors and notifications.
//!
//! ```no_run
//! # async fn f() -> Result<(), diesel::ConnectionError> {
//! let mut conn =
//!     idempotent_runtime::pooler::establish_async_pg("postgres://worker@pgbouncer:6432/app").await?;
//! # Ok(())
//! # }
//! ```
//!
//! With a pool, the same function makes each connection: deadpool's and bb8's managers take it as
//! their `custom_setup` (`ManagerConfig::custom_setup = Box::new(|url|
//! Box::pin(idempotent_jobs::pooler::establish_async_pg(url)))`, `idempotent_jobs` being the
//! facade crate that re-exports this module).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use diesel::ConnectionError;
use diesel::connection::CacheSize;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use tokio_postgres::tls::TlsStream;
use tokio_postgres::{Client, Connection, Socket};

/// Connects to `url` without TLS and sets the session up inside a transaction, so that it works
/// through PgBouncer in transaction mode; Diesel's prepared-statement cache is off. For TLS,
/// connect with `tokio_postgres::connect` and your connector and pass both halves to
/// [`from_client_and_connection`].
///
/// # Errors
///
/// `ConnectionError::BadConnection` when the server cannot be reached or refuses the session,
/// `ConnectionError::CouldntSetupConfiguration` when the setup fails. Nothing has run on the
/// session then; retrying is safe.
pub async fn establish_async_pg(url: &str) -> Result<AsyncPgConnection, ConnectionError> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| ConnectionError::BadConnection(e.to_string()))?;
    from_client_and_connection(client, connection).await
}

/// Makes an `AsyncPgConnection` of a client and its connection (not yet spawned: this function
/// drives it, and the returned connection then does), with the session set up inside a
/// transaction, so that it works through PgBouncer in transaction mode; Diesel's
/// prepared-statement cache is off.
///
/// # Errors
///
/// As [`establish_async_pg`]'s, but for reaching the server, done by the caller.
pub async fn from_client_and_connection<S>(
    client: Client,
    mut connection: Connection<Socket, S>,
) -> Result<AsyncPgConnection, ConnectionError>
where
    S: TlsStream + Unpin + Send + 'static,
{
    // `BEGIN` first, driving the connection by hand until the server has answered (diesel-async
    // spawns its task only when it gets the connection).
    {
        let mut begin = std::pin::pin!(client.batch_execute("BEGIN"));
        std::future::poll_fn(|cx| {
            if let Poll::Ready(result) = begin.as_mut().poll(cx) {
                return Poll::Ready(result.map_err(|e| e.to_string()));
            }
            match Pin::new(&mut connection).poll(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e.to_string())),
                Poll::Ready(Ok(())) => Poll::Ready(Err("the server closed the connection".into())),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
        .map_err(|e| ConnectionError::BadConnection(format!("BEGIN before the setup: {e}")))?;
    }
    // The setup runs inside that transaction, on one server connection; its statements are
    // closed before the COMMIT (tokio-postgres sends a statement's Close when it is dropped).
    let mut conn = AsyncPgConnection::try_from_client_and_connection(client, connection).await?;
    conn.batch_execute("COMMIT")
        .await
        .map_err(ConnectionError::CouldntSetupConfiguration)?;
    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
    Ok(conn)
}
