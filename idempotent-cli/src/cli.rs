//! The command line, as clap reads it.

use std::time::SystemTime;

use clap::{Args, Parser, Subcommand};

use crate::time::parse_time_arg;

/// What `--help` says before the commands.
pub const LONG_ABOUT: &str = "\
Operate idempotent-jobs in production: look up, list and forget job keys, inspect and retry the
outbox, prune lapsed keys and verify the runtime's tables, on SQLite, PostgreSQL and MySQL/MariaDB.

The database comes from -D/--database-url or DATABASE_URL (also read from a .env file in this
directory or a parent): postgres:// or postgresql:// URLs and libpq key=value strings (PostgreSQL),
mysql:// or mariadb:// (MySQL, MariaDB), sqlite://path, a file: URI or a file path (SQLite, the
file must exist). Another scheme is refused. Prefer DATABASE_URL or .env: arguments are visible to
other users in the process list. Passwords are never printed.

Exit codes:
  0  success (reading commands on tables a newer release made also warn on stderr)
  1  not found: the key or outbox message does not exist (nothing was changed)
  2  bad usage, or a confirmation that was refused or could not be asked (nothing was changed)
  3  cannot connect (bad URL, server down, SQLite file missing), or the connection was lost
     before the command changed anything
  4  the database lacks the runtime's tables, or they are incomplete: run idempotent-jobs migrate;
     or this connection may not use them (a grant; verify: a read-only session), or a newer release made
     them (upgrade this CLI; prune, keys forget and outbox retry then change nothing)
  5  any other database error (a write a read-only session refused), or a failed operation that
     changed something (a prune's batches)
  6  the key changed since it was read (another run renewed it): nothing was changed, look again";

/// The `idempotent-jobs` command line.
#[derive(Debug, Parser)]
#[command(
    name = "idempotent-jobs",
    version,
    about = "Operate idempotent-jobs: keys, outbox, prune, verify",
    long_about = LONG_ABOUT
)]
pub struct Cli {
    /// The database: postgres://..., mysql://..., mariadb://..., sqlite://... or a SQLite file path [env: DATABASE_URL]
    #[arg(
        short = 'D',
        long,
        env = "DATABASE_URL",
        hide_env = true,
        hide_env_values = true,
        global = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,

    /// Print one JSON document on stdout instead of tables (times in RFC 3339, digests in hex)
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Look up, list and forget the keys of done jobs
    #[command(subcommand)]
    Keys(KeysCommand),
    /// One row per job: its keys, how many have lapsed, the oldest and the newest
    Jobs,
    /// The outbox: messages waiting to be sent, parked messages, and sending parked ones again
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Delete lapsed keys in batches (--dry-run: only count them)
    Prune {
        /// Count the lapsed keys a prune would delete, and delete nothing
        #[arg(long)]
        dry_run: bool,
        /// Rows deleted per statement, each statement a short transaction of its own
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        batch_size: u32,
        /// After each batch, pause this many times as long as the batch took, leaving the
        /// database to the workers (0: no pause, for a maintenance window)
        #[arg(long, default_value_t = 9)]
        pace: u32,
    },
    /// Check, reading only, that the runtime's tables are present, current and usable
    Verify,
    /// Create or upgrade the runtime's tables (what idempotent_jobs::migrate does), as the
    /// schema's owner: for the deploy step
    Migrate,
    /// Serve the operator's dashboard over HTTP (read-only unless --allow-writes)
    #[cfg(feature = "serve")]
    #[command(after_help = SERVE_HELP)]
    Serve(ServeArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout
    #[command(after_help = COMPLETIONS_HELP)]
    Completions {
        /// The shell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// What `serve --help` adds.
#[cfg(feature = "serve")]
const SERVE_HELP: &str = "\
The access token comes from IDEMPOTENT_DASHBOARD_TOKEN (in the environment or .env) or
--token-file; it is never printed. Log in with it in the browser, or send it as
`Authorization: Bearer TOKEN`. Example:
  export IDEMPOTENT_DASHBOARD_TOKEN=$(openssl rand -hex 32)
  idempotent-jobs serve --allow-writes        # http://127.0.0.1:8080/";

/// `serve`'s options.
#[cfg(feature = "serve")]
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on; 127.0.0.1 keeps it on this machine (port 0: any free port)
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8080")]
    pub bind: std::net::SocketAddr,
    /// Allow forgetting keys and retrying parked messages (each written to the audit log)
    #[arg(long)]
    pub allow_writes: bool,
    /// Read the access token from this file instead of IDEMPOTENT_DASHBOARD_TOKEN
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Also answer requests for this Host (NAME:PORT), e.g. behind a reverse proxy
    #[arg(long = "allowed-host", value_name = "NAME:PORT")]
    pub allowed_hosts: Vec<String>,
}

/// How to install the completions, in `completions --help`.
const COMPLETIONS_HELP: &str = "\
Install, for example:
  bash:  idempotent-jobs completions bash > ~/.local/share/bash-completion/completions/idempotent-jobs
  zsh:   idempotent-jobs completions zsh > ~/.zfunc/_idempotent-jobs   (with fpath+=~/.zfunc)
  fish:  idempotent-jobs completions fish > ~/.config/fish/completions/idempotent-jobs.fish";

/// `keys ...`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Show one key's record: its job, when it was done, when it lapses, what is stored
    Show {
        /// Which key.
        #[command(flatten)]
        key: KeyArg,
    },
    /// List keys, newest first
    List {
        /// Only the keys of this job
        #[arg(long, value_name = "NAME")]
        job: Option<String>,
        /// Only keys done at or after TIME: RFC 3339 (2026-11-30T10:00:00Z) or a duration ago (2h, 7d)
        #[arg(long, value_name = "TIME", value_parser = parse_time_arg)]
        since: Option<SystemTime>,
        /// Only keys done before TIME: RFC 3339 (2026-11-30T10:00:00Z) or a duration ago (2h, 7d)
        #[arg(long, value_name = "TIME", value_parser = parse_time_arg)]
        before: Option<SystemTime>,
        /// Only the keys after POSITION: the next page, as the last page's end printed it
        #[arg(long, value_name = "POSITION", value_parser = crate::page::parse_after_arg)]
        after: Option<crate::page::After>,
        /// At most this many keys
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },
    /// Forget a key, so that the job's next delivery runs it again (asks first, unless --yes)
    Forget {
        /// Which key.
        #[command(flatten)]
        key: KeyArg,
        /// Why: goes into the runtime's record of the forget, printed on stderr [default: "idempotent-jobs CLI (user $USER)"]
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Do not ask for confirmation (needed when stdin is not a terminal)
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

/// A key: by its text, its digest, or a handler's template and inputs.
#[derive(Debug, Args)]
pub struct KeyArg {
    /// Which key.
    #[command(flatten)]
    pub which: KeyWhich,
    /// A value for the next placeholder of --template, in order (once per placeholder)
    #[arg(long = "value", value_name = "VALUE")]
    pub values: Vec<String>,
}

/// The ways to name a key; exactly one.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct KeyWhich {
    /// The key exactly as stored, as `keys list` prints it (e.g. invoice:2026-10:cust_481)
    pub key: Option<String>,
    /// The key's SHA-256 digest, 64 hex digits (for keys stored as `redacted:...`)
    #[arg(long, value_name = "HEX", value_parser = parse_digest_arg)]
    pub digest: Option<[u8; 32]>,
    /// The handler's key template, with one --value per placeholder: the key is built as the
    /// handler builds it, values escaped (e.g. --template 'invoice:<month>:<customer_id>' --value 2026-10 --value cust_481)
    #[arg(long, value_name = "TEMPLATE")]
    pub template: Option<String>,
}

/// `outbox ...`
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Messages not yet delivered and not parked, oldest first
    Pending {
        /// At most this many messages
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },
    /// Messages parked after too many failed deliveries, with their last error
    Parked,
    /// Send parked messages again: one (--message-id) or all (--all)
    Retry {
        /// Which parked messages.
        #[command(flatten)]
        target: RetryTarget,
    },
}

/// Which parked messages `outbox retry` sends again.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct RetryTarget {
    /// The message's id, as `outbox parked` prints it
    #[arg(long, value_name = "ID")]
    pub message_id: Option<String>,
    /// Every parked message
    #[arg(long)]
    pub all: bool,
}

/// Reads `--digest`.
fn parse_digest_arg(text: &str) -> Result<[u8; 32], String> {
    idempotent_runtime::keys::parse_digest(text).ok_or_else(|| {
        "a digest is 64 hexadecimal digits, as `keys show` and `keys list --json` print it"
            .to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
