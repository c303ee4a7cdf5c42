//! `idempotent-jobs`: the operator's command line for the idempotent-jobs runtime.
//!
//! Looks up, lists and forgets job keys, shows and retries outbox messages, prunes lapsed keys and
//! verifies the runtime's tables, through the runtime's own API on a sync Diesel connection to
//! SQLite, PostgreSQL or MySQL/MariaDB. `idempotent-jobs --help` lists the commands and the exit
//! codes; the crate's README shows each command's output.

mod audit;
mod cli;
mod commands;
mod connect;
mod failure;
mod table;
mod time;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::commands::Context;
use crate::connect::{Conn, Target};
use crate::failure::{Code, Failure};

fn main() -> ExitCode {
    // Clap exits by itself: 2 for bad usage, 0 for --help and --version.
    let cli = Cli::parse();
    audit::install();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {failure}");
            ExitCode::from(failure.code as u8)
        }
    }
}

/// Connects and runs the command.
fn run(cli: &Cli) -> Result<(), Failure> {
    let url = cli.database_url.as_deref().ok_or_else(|| {
        Failure::new(
            Code::Usage,
            "no database given: set DATABASE_URL, or pass --database-url URL",
        )
    })?;
    let target = Target::parse(url)?;
    let cx = Context {
        target: &target,
        json: cli.json,
    };
    match target.connect()? {
        Conn::Postgres(mut conn) => commands::run(&mut conn, &cx, &cli.command),
        Conn::Mysql(mut conn) => commands::run(&mut conn, &cx, &cli.command),
        Conn::Sqlite(mut conn) => commands::run(&mut conn, &cx, &cli.command),
    }
}
