//! `#[idempotent_job]` in an edition 2015 crate: each misuse is its own error, read as written
//! (`tests/ui/fail`), and handlers compile and run (`tests/ui/pass`). After changing a message,
//! regenerate with `TRYBUILD=overwrite cargo test -p idempotent-jobs-edition2015` and read the
//! diff of the `.stderr` files.
extern crate trybuild;

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
