//! A job that records an email in the outbox, and a relay that sends it once.
//!
//! ```text
//! cargo run --example outbox        # SQLite, a fresh database file, no server
//! ```
//!
//! The job runs twice (a redelivery), and its email is recorded once, in the job's own transaction.
//! The relay then sends pending messages; its delivery function is where you would call your mail
//! provider, passing the message id so that a resend after a relay crash is dropped there.

use diesel::prelude::*;
use idempotent_jobs::outbox::{self, OutboxMessage, Relay};
use idempotent_jobs::{JobStore, idempotent_job};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

#[derive(Debug, Serialize, Deserialize)]
struct WelcomeEmail {
    to: String,
    name: String,
}

/// Signs a user up: their row, and a welcome email recorded in the same transaction.
#[idempotent_job(key = "signup:<email>")]
fn sign_up<C: JobStore>(conn: &mut C, email: &str, name: &str) -> Result<String, AppError> {
    // ... insert the user's row here, with `conn` ...
    let message_id = outbox::push(
        conn,
        "welcome-email",
        &WelcomeEmail {
            to: email.to_owned(),
            name: name.to_owned(),
        },
    )?;
    Ok(message_id)
}

/// Where the relay hands each message: your mail provider, your broker.
fn send(message: &OutboxMessage) -> Result<(), String> {
    let email: WelcomeEmail = message.payload().map_err(|e| e.to_string())?;
    println!(
        "  sending {} to {} (message id {}, so the provider drops a resend)",
        message.topic(),
        email.to,
        message.message_id()
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("idempotent-outbox-example.db");
    let _ = std::fs::remove_file(&path);
    let mut conn = SqliteConnection::establish(&path.to_string_lossy())?;
    idempotent_jobs::migrate(&mut conn)?;

    for delivery in ["first delivery", "redelivery"] {
        let message_id = sign_up(&mut conn, "ada@example.com", "Ada")?;
        let pending: i64 = idempotent_jobs::schema::outbox::table
            .count()
            .get_result(&mut conn)?;
        println!("{delivery} of the sign-up job: message {message_id}; outbox messages: {pending}");
    }

    println!("relay:");
    let report = Relay::new().drain(&mut conn, send)?;
    println!("relay sent {} message(s)", report.delivered);
    let again = Relay::new().drain(&mut conn, send)?;
    println!("relay again: {} message(s) to send", again.leased);
    Ok(())
}
