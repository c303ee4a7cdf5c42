//! Captures the `tracing` events a piece of code emits, with the fields of the spans around them.
//!
//! One global subscriber for the whole test binary records into a buffer of the current thread,
//! when that thread is capturing. (A scoped `with_default` subscriber per test would race other
//! tests for tracing's global per-callsite interest cache, and lose events.)

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Once;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

/// One event: its own fields, then those of every span around it (inner spans win).
pub type Fields = BTreeMap<String, String>;

#[derive(Default)]
struct Recorder(BTreeMap<String, String>);

impl Visit for Recorder {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

struct SpanFields(BTreeMap<String, String>);

struct Capture;

thread_local! {
    static BUFFER: RefCell<Option<Vec<Fields>>> = const { RefCell::new(None) };
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut recorder = Recorder::default();
        attrs.record(&mut recorder);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(recorder.0));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut recorder = Recorder::default();
        event.record(&mut recorder);
        let mut fields = recorder.0;
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(SpanFields(span_fields)) = span.extensions().get::<SpanFields>() {
                    for (name, value) in span_fields {
                        fields.entry(name.clone()).or_insert_with(|| value.clone());
                    }
                }
            }
        }
        fields.insert("level".to_owned(), event.metadata().level().to_string());
        fields.insert("target".to_owned(), event.metadata().target().to_owned());
        BUFFER.with(|buffer| {
            if let Some(events) = buffer.borrow_mut().as_mut() {
                events.push(fields);
            }
        });
    }
}

/// Runs `f` and returns the events it emitted on this thread.
pub fn events<R>(f: impl FnOnce() -> R) -> (R, Vec<Fields>) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("no other global subscriber in this test binary");
        // A callsite first hit while the subscriber was being installed may have cached "never".
        tracing::callsite::rebuild_interest_cache();
    });
    BUFFER.with(|buffer| *buffer.borrow_mut() = Some(Vec::new()));
    let result = f();
    let events = BUFFER
        .with(|buffer| buffer.borrow_mut().take())
        .unwrap_or_default();
    (result, events)
}

/// The events that end a job call (they carry an `outcome`).
pub fn outcomes(events: &[Fields]) -> Vec<&Fields> {
    events
        .iter()
        .filter(|e| e.contains_key("outcome"))
        .collect()
}
