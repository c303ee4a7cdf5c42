//! The key-template syntax of `idempotent-jobs`, in one place.
//!
//! A job key is built from a template such as `invoice:<month>:<customer_id>`: literal text and
//! placeholders, each standing for a value's `Display` output, escaped. Three parts of the project
//! must agree on exactly how that works, or the product's core promise (two different argument
//! tuples never share a key) breaks silently:
//!
//! * the attribute checks templates at compile time ([`template::parse`]);
//! * the runtime escapes values while it writes keys ([`escape::push_escaped`]);
//! * the registry decides whether two jobs' templates can produce one same key
//!   ([`language::common_key`]).
//!
//! It also holds the one duration grammar ([`duration::parse`]). This crate is all of that, with one small dependency (humantime), compiled into both the macro crate and the
//! runtime. [`escape::split_key`] is the inverse of the escaping: it recovers the values from a key,
//! which is the proof that keys are injective, and the property tests check it against the parser.

#![deny(missing_docs)]

pub mod duration;
pub mod escape;
pub mod language;
pub mod template;

/// A piece of a template as the runtime and the registry see it: literal text, or a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part<'a> {
    /// Literal text, the same in every key of the template.
    Text(&'a str),
    /// A placeholder, by the parameter path it names (`customer_id`, `job.customer_id`).
    Value(&'a str),
}
