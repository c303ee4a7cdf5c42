//! Checks of `#[idempotent_job]` in an edition 2015 crate (`tests/ui.rs`): its errors read as
//! written (they are reached through the runtime, which a 2015 crate names with `extern crate`,
//! not through `::core`, which it does not), and handlers compile and run, parameters named as
//! the edition allows included (written raw where syn reads a later edition's keyword).
