//! The runtime's record of a forgotten key, printed on stderr.
//!
//! `keys::forget` records each forget as a `tracing` event (target `idempotent_jobs::keys`: the
//! job, the key, its digest and the reason). A process without a subscriber drops it; this one
//! prints exactly those events, one line each, so that `--reason` ends up in the operator's
//! terminal or job log. Nothing else the runtime traces is printed.

use std::fmt::{self, Write as _};
use std::sync::OnceLock;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::connect::Target;
use crate::secret::scrub_text;
use crate::table::printable;

/// The target of the runtime's key events.
const TARGET: &str = "idempotent_jobs::keys";

/// Installs the subscriber for this process.
pub fn install() {
    // Fails only if one is installed already, which nothing else here does.
    let _ = tracing::subscriber::set_global_default(KeyEvents(|line: String| eprintln!("{line}")));
}

/// The database this process talks to: its password, as written, decoded and encoded, is hidden
/// in every audit line, as in every other error the CLI prints.
static TARGET_SECRETS: OnceLock<Target> = OnceLock::new();

/// Hides `target`'s secrets in the audit lines printed from now on (a driver's error may quote
/// the password decoded, where no `password=` or URL form shows it).
pub fn hide_secrets_of(target: &Target) {
    let _ = TARGET_SECRETS.set(target.clone());
}

/// `text` with every secret hidden: the target's (once known) and those of any URL or
/// `password=` parameter.
fn scrub(text: &str) -> String {
    TARGET_SECRETS
        .get()
        .map_or_else(|| scrub_text(text), |target| target.scrub(text))
}

/// Hands each of the runtime's key events (info and above), as one line, to its function: the
/// process's prints it on stderr.
struct KeyEvents<W>(W);

impl<W: Fn(String) + Send + Sync + 'static> Subscriber for KeyEvents<W> {
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
        (self.0)(format!(
            "audit: {} ({})",
            printable(&fields.message),
            printable(fields.rest.trim_start())
        ));
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

impl Fields {
    /// ` name=value`, the value as the event wrote it; an error's text (a forget of unknown outcome
    /// carries the database's) with its secrets hidden, as every other error the CLI prints.
    fn push(&mut self, field: &Field, value: String) {
        let value = if field.name() == "error" {
            scrub(&value)
        } else {
            value
        };
        let _ = write!(self.rest, " {}={value}", field.name());
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.push(field, format!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.push(field, format!("{value:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The audit lines of the events `emit` makes.
    fn lines(emit: impl FnOnce()) -> Vec<String> {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let subscriber = KeyEvents(move |line: String| sink.lock().unwrap().push(line));
        tracing::subscriber::with_default(subscriber, emit);
        lines.lock().unwrap().clone()
    }

    /// A forget of unknown outcome carries the database's error; a password in it (a connection
    /// string quoted by a driver or a proxy) is hidden. Before, the line printed it.
    #[test]
    fn an_audited_error_hides_its_secrets() {
        let error = "the connection to postgres://app:hunter2@db/jobs failed (password=hunter2)";
        let lines = lines(|| {
            tracing::warn!(
                target: "idempotent_jobs::keys",
                job = "invoice",
                key = "invoice:2026-11:42",
                reason = "refund",
                %error,
                "may have forgotten a key"
            );
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(!lines[0].contains("hunter2"), "{}", lines[0]);
        assert!(
            lines[0].contains("may have forgotten a key")
                && lines[0].contains("key=\"invoice:2026-11:42\"")
                && lines[0].contains("reason=\"refund\"")
                && lines[0].contains("postgres://"),
            "{}",
            lines[0]
        );
    }

    /// A driver's error may quote the password decoded (`p@ss` for the URL's `p%40ss`), where
    /// neither a URL nor a `password=` shows it: the target's own secrets are hidden too. Before,
    /// the line printed it.
    #[test]
    fn an_audited_error_hides_the_targets_password_however_quoted() {
        let target = Target::parse("postgres://app:s3cr%40t%21@db/jobs").unwrap();
        hide_secrets_of(&target);
        let lines = lines(|| {
            tracing::warn!(
                target: "idempotent_jobs::keys",
                job = "invoice",
                key = "invoice:2026-11:42",
                reason = "refund",
                error = "authentication for app with s3cr@t! failed",
                "may have forgotten a key"
            );
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(!lines[0].contains("s3cr@t!"), "{}", lines[0]);
        assert!(
            lines[0].contains("authentication for app with *** failed"),
            "{}",
            lines[0]
        );
    }

    /// Events of other targets are not printed.
    #[test]
    fn only_the_key_events_are_printed() {
        let lines = lines(|| tracing::warn!(target: "idempotent_jobs::relay", "relayed"));
        assert!(lines.is_empty(), "{lines:?}");
    }
}
