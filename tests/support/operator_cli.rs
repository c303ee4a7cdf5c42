//! The operator CLI's binary (package `idempotent-jobs-cli`), run as an operator would.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The operator CLI's binary, beside this test binary's directory.
pub fn cli_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the target directory");
    let binary = dir.join("idempotent-jobs");
    assert!(
        binary.is_file(),
        "the operator CLI is not built at {}: run `cargo build -p idempotent-jobs-cli` first",
        binary.display()
    );
    binary
}

/// The CLI with `args`, against `url`, in the working directory `dir` (no `.env` of the
/// project's), with no inherited `DATABASE_URL`.
pub fn run(url: &str, args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(cli_binary())
        .args(args)
        .env("DATABASE_URL", url)
        .env("RUST_BACKTRACE", "0")
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("running the CLI")
}
