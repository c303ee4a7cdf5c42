//! The expansion is clean in a user crate that denies warnings, a strict set of rustc lints and
//! `clippy::pedantic`: CI runs `cargo clippy --all-targets --all-features -- -D warnings`, which
//! lints this file, and the modules below, as the user's code. The modules are trybuild pass cases
//! too (`tests/ui/pass/strict_lints.rs`, `tests/ui/async/pass/strict_lints.rs`), which compile them
//! without clippy; here they also run as tests.
#![deny(warnings, future_incompatible, clippy::pedantic)]

#[path = "ui/pass/strict_lints.rs"]
mod strict_lints;

#[cfg(feature = "async-sqlite")]
#[path = "ui/async/pass/strict_lints.rs"]
mod strict_lints_async;

#[test]
fn every_kind_of_handler_runs_once() {
    strict_lints::main();
}

#[cfg(feature = "async-sqlite")]
#[test]
fn every_kind_of_async_handler_runs_once() {
    strict_lints_async::main();
}
