//! What every test crate needs by name: a name no other test uses, and an error with its causes.
#![allow(dead_code, reason = "each test crate uses what it needs of it")]

use std::sync::atomic::{AtomicU32, Ordering};

/// A name no other test (in this process or another) uses: `prefix`, the process id, a counter and
/// the clock's nanoseconds; short enough for a MySQL identifier with a prefix of up to 25
/// characters.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// An error and its causes, as a reporter (anyhow, eyre) prints them, each once: the runtime's
/// message says what happened to the job, and the database's own error is its source.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(source) = cause {
        let line = source.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        cause = source.source();
    }
    text
}
