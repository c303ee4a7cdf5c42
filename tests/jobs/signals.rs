//! Points where a test and a job's body meet: a body tells the test it got somewhere, or waits at a
//! barrier with another body. Keyed by a name the test chooses, since tests run in parallel.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier, Mutex, OnceLock, PoisonError};
use std::time::Duration;

type Senders = Mutex<HashMap<String, Sender<()>>>;
type Barriers = Mutex<HashMap<String, Arc<Barrier>>>;

fn senders() -> &'static Senders {
    static SENDERS: OnceLock<Senders> = OnceLock::new();
    SENDERS.get_or_init(Senders::default)
}

fn barriers() -> &'static Barriers {
    static BARRIERS: OnceLock<Barriers> = OnceLock::new();
    BARRIERS.get_or_init(Barriers::default)
}

/// What a test waits on: a body's `notify(name)`.
pub struct Signal(Receiver<()>, String);

impl Signal {
    /// Waits for the body's signal, failing the test with `what` if it does not come in time.
    pub fn wait(&self, what: &str) {
        self.0
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{what} did not happen within 30 s (signal `{}`)", self.1));
    }

    /// Whether the body's signal has come already, without waiting: an order of events a test
    /// can assert instead of a duration.
    pub fn happened(&self) -> bool {
        self.0.try_recv().is_ok()
    }
}

/// The signal a body that holds its key (`held_job`) sends when it has finished working, just
/// before it returns and its run commits.
pub fn body_done(id: &str) -> String {
    format!("{id}-body-done")
}

/// Prepares the signal `name` for a test to wait on.
pub fn expect(name: &str) -> Signal {
    let (sender, receiver) = channel();
    senders()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(name.to_owned(), sender);
    Signal(receiver, name.to_owned())
}

/// Tells the test waiting on `name`, if any.
pub fn notify(name: &str) {
    let sender = senders()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(name)
        .cloned();
    if let Some(sender) = sender {
        let _ = sender.send(());
    }
}

/// Prepares a barrier `name` for `parties` bodies.
pub fn barrier(name: &str, parties: usize) {
    barriers()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(name.to_owned(), Arc::new(Barrier::new(parties)));
}

/// Waits at the barrier `name`, if one was prepared.
pub fn meet(name: &str) {
    let barrier = barriers()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(name)
        .cloned();
    if let Some(barrier) = barrier {
        barrier.wait();
    }
}
