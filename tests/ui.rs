//! Compile-time checks of `#[idempotent_job]`: every misuse is an error that names the problem
//! (`tests/ui/fail/*.rs`, with the reviewed compiler output beside each), and every supported shape
//! of handler compiles and runs (`tests/ui/pass/*.rs`). Async handlers have their own cases, built
//! when the `async-sqlite` feature is on.
//!
//! After changing a message, regenerate with `TRYBUILD=overwrite cargo test --all-features --test ui`
//! and read the diff of the `.stderr` files before committing it.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    cases.pass("tests/ui/pass/*.rs");
    #[cfg(feature = "async-sqlite")]
    {
        cases.compile_fail("tests/ui/async/fail/*.rs");
        cases.pass("tests/ui/async/pass/*.rs");
    }
}
