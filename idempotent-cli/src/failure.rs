//! Why a command failed, and the exit code that says so.

use std::fmt;

/// The exit codes, as `--help` and the README list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// 1: the key or message does not exist.
    NotFound = 1,
    /// 2: bad usage, or a confirmation that was refused or could not be asked.
    Usage = 2,
    /// 3: the database cannot be reached or opened.
    Connect = 3,
    /// 4: the runtime's tables are missing or incomplete, not usable by this connection (a grant;
    /// from `verify` and `migrate`, a session that cannot write), or made by a newer release.
    Schema = 4,
    /// 5: any other database error.
    Database = 5,
    /// 6: the key changed since it was read (another run renewed it); nothing was changed.
    Changed = 6,
}

/// A failed command: what to print on stderr, and how to exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The exit code.
    pub code: Code,
    /// The message, without the `error: ` prefix.
    pub message: String,
}

impl Failure {
    /// A failure with this code and message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}
