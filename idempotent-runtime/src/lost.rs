//! How each database says that its connection failed (closed, reset, killed, gone away): the
//! texts its `Database::connection_lost` matches, and [`anywhere`], which
//! [`Error::is_connection_lost`](crate::Error::is_connection_lost) asks without knowing the
//! database. A leaf module: the error type does not depend on the database modules.

use diesel::result::{DatabaseErrorKind, Error as DieselError};

/// PostgreSQL's (libpq's, tokio-postgres') texts for a failed connection.
#[cfg(any(feature = "postgres", feature = "async-postgres"))]
pub(crate) const POSTGRES: &[&str] = &[
    "server closed the connection",
    "terminating connection",
    "no connection to the server",
    "could not receive data",
    "could not send data",
    "connection closed",
    // libpq over TLS: "SSL connection has been closed unexpectedly".
    "connection has been closed",
    "Connection reset",
    "Broken pipe",
    "unexpected EOF",
    // tokio-postgres' own texts, without their cause, for a connection reset or timed out, or a
    // protocol it could not follow: diesel-async passes them on as they are.
    "error communicating with the server",
    "unexpected message from server",
    "error parsing response from server",
];

/// MySQL's and MariaDB's (libmysqlclient's, mysql_async's) texts for a failed connection.
#[cfg(any(feature = "mysql", feature = "async-mysql"))]
pub(crate) const MYSQL: &[&str] = &[
    "Lost connection",
    "server has gone away",
    "Connection reset",
    "Broken pipe",
    "Input/output error",
    "connection closed",
    "Connection refused",
    // MariaDB 1927 (KILL), MySQL 8 4031 (wait_timeout), mysql_async's closed stream.
    "Connection was killed",
    "disconnected by the server because of inactivity",
    "Connection to the server is closed",
];

/// Whether `error` (or, for a commit Diesel tried to roll back, the commit's own error) is one of
/// `phrases`, a database's ways of saying the connection failed.
#[cfg(any(
    feature = "postgres",
    feature = "async-postgres",
    feature = "mysql",
    feature = "async-mysql"
))]
pub(crate) fn connection_lost(error: &DieselError, phrases: &[&str]) -> bool {
    match error {
        DieselError::RollbackErrorOnCommit { commit_error, .. } => {
            connection_lost(commit_error, phrases)
        }
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _) => true,
        DieselError::DatabaseError(_, info) => {
            let message = info.message().to_ascii_lowercase();
            phrases
                .iter()
                .any(|p| message.contains(&p.to_ascii_lowercase()))
        }
        _ => false,
    }
}

/// Whether `error` is any compiled-in database's way of saying the connection failed.
pub(crate) fn anywhere(error: &DieselError) -> bool {
    #[cfg(any(feature = "postgres", feature = "async-postgres"))]
    if connection_lost(error, POSTGRES) {
        return true;
    }
    #[cfg(any(feature = "mysql", feature = "async-mysql"))]
    if connection_lost(error, MYSQL) {
        return true;
    }
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _)
    )
}

#[cfg(all(test, any(feature = "postgres", feature = "async-postgres")))]
mod tests {
    use super::*;

    /// diesel-async reports a tokio-postgres error without a SQLSTATE by its `Display` alone,
    /// which for a reset connection is "error communicating with the server": at a `COMMIT`, that
    /// is an unknown outcome, not "nothing was committed".
    #[test]
    fn tokio_postgres_transport_failures_are_lost_connections() {
        for text in [
            "error communicating with the server",
            "unexpected message from server",
            "error parsing response from server",
            "connection closed",
        ] {
            let error = DieselError::DatabaseError(
                DatabaseErrorKind::UnableToSendCommand,
                Box::new(text.to_owned()),
            );
            assert!(connection_lost(&error, POSTGRES), "{text}");
            assert!(anywhere(&error), "{text}");
        }
    }
}
