//! `idempotent-jobs`: the operator's command line for the idempotent-jobs runtime.
//!
//! Looks up, lists and forgets job keys, shows and retries outbox messages, prunes lapsed keys and
//! verifies the runtime's tables, through the runtime's own API on a sync Diesel connection to
//! SQLite, PostgreSQL or MySQL/MariaDB. `idempotent-jobs --help` lists the commands and the exit
//! codes; the crate's README shows each command's output.

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!(
    "idempotent-jobs needs at least one backend: enable the feature sqlite, postgres or mysql"
);

mod audit;
mod cli;
mod commands;
mod connect;
mod dotenv;
mod failure;
mod keyform;
mod nearest;
mod page;
mod secret;
#[cfg(feature = "serve")]
mod serve;
mod session;
mod table;
mod time;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command};
use crate::commands::Context;
use crate::connect::{Conn, Target};
use crate::failure::{Code, Failure};
use crate::secret::{scrub_text, scrub_typed};

fn main() -> ExitCode {
    install_panic_hook();
    if let Some(warning) = dotenv::load() {
        eprintln!("{warning}");
    }
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    audit::install();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        // Each message hides the database URL's secrets where it quotes the URL or a driver's
        // error (`Target::shown`, `Target::scrub`); keys and values read from the tables, and the
        // CLI's own words, are printed as they are: a scrubber run over the whole message took a
        // stored key `reset-link:password=x` for a secret and printed a key that is not there.
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code as u8)
        }
    }
}

/// Reads the command line. Clap's own messages (which quote a mistyped argument, perhaps a URL
/// with its password) are printed with secrets hidden: 2 for bad usage, 0 for --help and
/// --version.
fn parse() -> Result<Cli, ExitCode> {
    let command =
        Cli::command().after_long_help(format!("This build reads {}.", connect::known_forms()));
    let error = match command
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
    {
        Ok(cli) => return Ok(cli),
        Err(error) => error,
    };
    // An error quotes what was typed: every value of a parameter no driver knows is hidden. Help
    // and version quote nothing typed (the environment's values are hidden from the help), and
    // their own words (libpq `key=value` strings) stay as written; secret names are hidden still.
    let rendered = error.render().to_string();
    let text = if error.use_stderr() {
        scrub_typed(&rendered)
    } else {
        scrub_text(&rendered)
    };
    if error.use_stderr() {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    Err(ExitCode::from(
        u8::try_from(error.exit_code()).unwrap_or(Code::Usage as u8),
    ))
}

/// Connects and runs the command.
fn run(cli: &Cli) -> Result<(), Failure> {
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "idempotent-jobs",
            &mut std::io::stdout(),
        );
        return Ok(());
    }
    let url = cli.database_url.as_deref().ok_or_else(|| {
        Failure::new(
            Code::Usage,
            "no database given: set DATABASE_URL (in the environment or a .env file), or pass -D/--database-url URL",
        )
    })?;
    let target = Target::parse(url)?;
    audit::hide_secrets_of(&target);
    #[cfg(feature = "serve")]
    if let Command::Serve(args) = &cli.command {
        return serve::serve(target, args);
    }
    let cx = Context {
        target: &target,
        json: cli.json,
    };
    match target.connect()? {
        #[cfg(feature = "postgres")]
        Conn::Postgres(mut conn) => commands::run(&mut conn, &cx, &cli.command),
        #[cfg(feature = "mysql")]
        Conn::Mysql(mut conn) => commands::run(&mut conn, &cx, &cli.command),
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(mut conn) => commands::run(&mut conn, &cx, &cli.command),
    }
}

/// A panic's message goes through [`scrub_typed`] before it is printed: a panic that quotes a
/// connection string (a library's, the standard library's) never shows its password.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "error: idempotent-jobs panicked{at} (a bug; passwords in the message are masked): {}",
            scrub_typed(&message)
        );
    }));
}
