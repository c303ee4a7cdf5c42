//! Deterministic regression tests for what the explorer (tests/explore.rs) found: each replays a
//! shrunk schedule and checks its history against the database. See docs/explore.md.

#[path = "explore/controller.rs"]
#[allow(dead_code)]
mod controller;
#[path = "explore/driver.rs"]
#[allow(dead_code)]
mod driver;
#[path = "explore/model.rs"]
#[allow(dead_code)]
mod model;
#[path = "explore/worker.rs"]
#[allow(dead_code)]
mod worker;

/// The worker process's entry point (the controller runs this binary again as its workers).
#[test]
fn worker() {
    worker::main_if_worker();
}
