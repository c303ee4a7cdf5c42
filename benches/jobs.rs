//! `cargo bench --bench jobs`: builds and runs the benchmark program in `idempotent-bench/`.
//!
//! The benchmark measures SQLite, PostgreSQL and MariaDB side by side, so it links libpq and
//! libmysqlclient. It lives in a package of its own so that the `idempotent-jobs` package's default
//! build (SQLite only) never needs those libraries; this bench target is the front door.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    // `cargo bench` passes `--bench`; anything after `--` goes to the benchmark.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let status = Command::new(cargo)
        .args([
            "run",
            "--release",
            "--quiet",
            "--package",
            "idempotent-bench",
            "--",
        ])
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("the benchmark failed: {status}");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("could not run cargo to build the benchmark: {error}");
            ExitCode::FAILURE
        }
    }
}
