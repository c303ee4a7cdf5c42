//! The runtime's record of a forgotten key, printed on stderr.
//!
//! `keys::forget` records each forget as a `tracing` event (target `idempotent_jobs::keys`: the
//! job, the key, its digest and the reason). A process without a subscriber drops it; this one
//! prints exactly those events, one line each, so that `--reason` ends up in the operator's
//! terminal or job log. Nothing else the runtime traces is printed.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::table::printable;

/// The target of the runtime's key events.
const TARGET: &str = "idempotent_jobs::keys";

/// Installs the subscriber for this process.
pub fn install() {
    // Fails only if one is installed already, which nothing else here does.
    let _ = tracing::subscriber::set_global_default(KeyEvents);
}

/// Prints the runtime's key events (info and above) on stderr.
struct KeyEvents;

impl Subscriber for KeyEvents {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && metadata.target() == TARGET && *metadata.level() <= Level::INFO
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Never called: no span is enabled.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        eprintln!(
            "audit: {} ({})",
            printable(&fields.message),
            printable(fields.rest.trim_start())
        );
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// An event's message, and its other fields as `name=value`.
#[derive(Default)]
struct Fields {
    /// The event's message.
    message: String,
    /// ` name=value` for each other field.
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}
