//! Compile-time checks of `#[idempotent_job]`: every misuse is one error that names the problem,
//! the fix and the token (`tests/ui/fail/*.rs`, with the reviewed compiler output beside each), and
//! every supported shape of handler compiles without a warning and runs its body once per key
//! (`tests/ui/pass/*.rs`; `strict_lints.rs` under a strict lint set, which `tests/lints.rs` also
//! lints with clippy). Async handlers have their own cases, built when the `async-sqlite` feature
//! is on.
//!
//! File names say what a case is about: `args_` the attribute's arguments, `attr_` the attribute
//! itself, `sig_` the signature's shape, `template_` the key template, `types_` what only the types
//! tell, `companion_` the companion type, `lint_` lints on the handler.
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
