//! Job keys: built from a template's literal text and escaped placeholder values.
//!
//! A key is what makes two deliveries of one job "the same job". It is built from the job's purpose,
//! such as `invoice:2026-10:cust_481`, and it must be *injective*: two different argument tuples must
//! never give one key, or one customer's job would skip another's.
//!
//! # How values are escaped
//!
//! A placeholder's `Display` output is copied into the key with these characters percent-encoded
//! (each UTF-8 byte as `%XX`, upper-case hex):
//!
//! * `%` itself, so that an escape in the key is never ambiguous;
//! * every control character (`\0`, `\n`, ...), so the readable key is storable on every backend
//!   (PostgreSQL text cannot hold NUL);
//! * the first character of every separator that stands *between two placeholders* in the template.
//!   In `invoice:<month>:<customer_id>` that is `:`, so `("a:b", "c")` gives `invoice:a%3Ab:c` and
//!   `("a", "b:c")` gives `invoice:a:b%3Ac`.
//!
//! A separator between two placeholders must start with a character that cannot appear in an escape
//! sequence (not an ASCII letter or digit, and not `%`); the attribute checks this at compile time and
//! [`KeyBuilder::build`] at run time. Under that rule a key can be split back into its values
//! unambiguously, which is the proof that no two argument tuples share a key.
//!
//! The rules live in one place, the `idempotent-keys` crate, which the attribute compiles in too:
//! what the attribute checks and what the runtime writes cannot drift apart.
//!
//! Text that is not between two placeholders (`invoice:` at the front) needs no rule: it is the same
//! for every key of the template.
//!
//! The database indexes a SHA-256 digest of the key ([`JobKey::digest`]), so keys of any length and
//! content work on every backend; the readable key is stored beside it.

use std::borrow::Cow;
use std::fmt::{self, Display, Write as _};

use idempotent_keys::Part;
use idempotent_keys::escape::{ShapeProblem, push_escaped, shape_problems};
use sha2::{Digest as _, Sha256};

/// A job's idempotency key: the text that identifies one unit of work across redeliveries.
///
/// Build one with [`KeyBuilder`] (what the `#[idempotent_job]` attribute generates), or take a string
/// you already have with [`JobKey::new`]. The same key passed to another service as its idempotency
/// key (an `Idempotency-Key` header, say) makes that service's effect happen once too; use
/// [`JobKey::derive`] for several calls from one job.
///
/// ```
/// use idempotent_runtime::JobKey;
///
/// let key = JobKey::builder().text("invoice:").value("2026-10").text(":").value("cust_481").build()?;
/// assert_eq!(key.as_str(), "invoice:2026-10:cust_481");
/// assert_eq!(key.derive("charge").as_str(), "invoice:2026-10:cust_481/charge");
/// # Ok::<(), idempotent_runtime::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct JobKey {
    text: String,
}

impl JobKey {
    /// Takes `text` as the key, unchanged.
    ///
    /// Use this when your key is already unique by construction (a message id, a UUID). When it is
    /// assembled from several values, prefer [`JobKey::builder`], which escapes them.
    pub fn new(text: impl Into<String>) -> Self {
        Self { text: text.into() }
    }

    /// Starts a key from literal text and escaped values.
    pub fn builder() -> KeyBuilder {
        KeyBuilder::default()
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The SHA-256 digest of the key: the value stored in the indexed column.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.text.as_bytes()).into()
    }

    /// The key with control characters percent-encoded, as stored in the readable `job_key` column.
    ///
    /// Keys built by the attribute or by [`KeyBuilder`] contain no control characters, so this is the
    /// key itself; a key given to [`JobKey::new`] may need the escaping.
    pub fn readable(&self) -> Cow<'_, str> {
        if self.text.chars().any(char::is_control) {
            let mut out = String::with_capacity(self.text.len() + 8);
            push_escaped(&mut out, &self.text, &[]);
            Cow::Owned(out)
        } else {
            Cow::Borrowed(&self.text)
        }
    }

    /// A key for one of several calls made from this job, stable across reruns:
    /// `<this key>/<purpose>`, with `/` and `%` in `purpose` escaped so that no two
    /// (key, purpose) pairs give one derived key.
    ///
    /// ```
    /// # use idempotent_runtime::JobKey;
    /// let key = JobKey::new("order:42");
    /// assert_eq!(key.derive("refund").as_str(), "order:42/refund");
    /// assert_ne!(JobKey::new("a").derive("b/c"), JobKey::new("a/b").derive("c"));
    /// ```
    pub fn derive(&self, purpose: &str) -> JobKey {
        let mut text = String::with_capacity(self.text.len() + 1 + purpose.len());
        text.push_str(&self.text);
        text.push('/');
        push_escaped(&mut text, purpose, &['/']);
        JobKey { text }
    }
}

impl Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("JobKey").field(&self.text).finish()
    }
}

impl From<&str> for JobKey {
    fn from(text: &str) -> Self {
        JobKey::new(text)
    }
}

impl From<String> for JobKey {
    fn from(text: String) -> Self {
        JobKey::new(text)
    }
}

/// Why [`KeyBuilder::build`] refused a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Two values were pushed with no text between them.
    #[error(
        "values {first} and {second} of the key touch; put a separator such as `:` between them so that keys stay unambiguous"
    )]
    AdjacentValues {
        /// Position (0-based) of the first value.
        first: usize,
        /// Position (0-based) of the second value.
        second: usize,
    },
    /// The text between two values starts with a character that escapes can produce.
    #[error(
        "the separator `{separator}` between values {first} and {second} of the key starts with `{starts_with}`; a separator must start with a symbol such as `:` or `/` (not a letter, digit or `%`)"
    )]
    AmbiguousSeparator {
        /// The separator text.
        separator: String,
        /// Its first character.
        starts_with: char,
        /// Position (0-based) of the value before it.
        first: usize,
        /// Position (0-based) of the value after it.
        second: usize,
    },
    /// Literal text contains a control character.
    #[error("the key text {text:?} contains a control character; keys are readable text")]
    ControlCharacter {
        /// The offending text.
        text: String,
    },
}

pub use idempotent_keys::escape::is_valid_separator_start;

/// Builds a [`JobKey`] from literal text and escaped values, checking the separator rule
/// described in the [module docs](self).
#[derive(Debug, Default, Clone)]
pub struct KeyBuilder {
    parts: Vec<BuilderPart>,
}

#[derive(Debug, Clone)]
enum BuilderPart {
    Text(String),
    Value(String),
}

impl KeyBuilder {
    /// Appends literal text (the same for every key of this shape).
    pub fn text(mut self, text: &str) -> Self {
        match self.parts.last_mut() {
            Some(BuilderPart::Text(previous)) => previous.push_str(text),
            _ => self.parts.push(BuilderPart::Text(text.to_owned())),
        }
        self
    }

    /// Appends a value, escaped when the key is built.
    pub fn value(mut self, value: impl Display) -> Self {
        self.parts.push(BuilderPart::Value(value.to_string()));
        self
    }

    /// Checks the separators and assembles the key.
    pub fn build(self) -> Result<JobKey, KeyError> {
        for part in &self.parts {
            if let BuilderPart::Text(text) = part
                && text.chars().any(char::is_control)
            {
                return Err(KeyError::ControlCharacter { text: text.clone() });
            }
        }
        let parts: Vec<Part<'_>> = self
            .parts
            .iter()
            .map(|part| match part {
                BuilderPart::Text(text) => Part::Text(text),
                BuilderPart::Value(value) => Part::Value(value),
            })
            .collect();
        // Values are numbered in order for the messages.
        let value_number = |index: usize| {
            parts[..index]
                .iter()
                .filter(|part| matches!(part, Part::Value(_)))
                .count()
        };
        if let Some(problem) = shape_problems(&parts).into_iter().next() {
            return Err(match problem {
                ShapeProblem::Touching { before, after } => KeyError::AdjacentValues {
                    first: value_number(before),
                    second: value_number(after),
                },
                ShapeProblem::BadSeparator {
                    before,
                    after,
                    starts_with,
                } => KeyError::AmbiguousSeparator {
                    separator: match parts.get(before + 1) {
                        Some(Part::Text(text)) => (*text).to_owned(),
                        _ => String::new(),
                    },
                    starts_with,
                    first: value_number(before),
                    second: value_number(after),
                },
            });
        }
        let escapes = idempotent_keys::escape::escapes(&parts);
        let mut text = String::new();
        for part in &parts {
            match part {
                Part::Text(t) => text.push_str(t),
                Part::Value(v) => push_escaped(&mut text, v, &escapes),
            }
        }
        Ok(JobKey { text })
    }
}

/// Writes keys for the `#[idempotent_job]` attribute, which has checked the template at compile time
/// and passes the separator characters to escape. Values are escaped while they are formatted, with
/// no intermediate string.
#[doc(hidden)]
#[derive(Debug)]
pub struct KeyWriter {
    text: String,
    escapes: &'static [char],
}

impl KeyWriter {
    /// A writer for a template whose separators between placeholders start with `escapes`.
    pub fn new(capacity: usize, escapes: &'static [char]) -> Self {
        Self {
            text: String::with_capacity(capacity),
            escapes,
        }
    }

    /// Appends literal template text.
    pub fn text(&mut self, text: &str) {
        self.text.push_str(text);
    }

    /// Appends a placeholder's value, escaped.
    pub fn value<T: Display + ?Sized>(&mut self, value: &T) {
        let mut writer = EscapingWriter {
            out: &mut self.text,
            escapes: self.escapes,
        };
        // Writing into a String cannot fail; a `Display` impl that returns an error is a bug in that
        // impl (the standard library panics in `to_string` for the same case). We keep what was written.
        let _ = write!(writer, "{value}");
    }

    /// The finished key.
    pub fn finish(self) -> JobKey {
        JobKey { text: self.text }
    }
}

struct EscapingWriter<'a> {
    out: &'a mut String,
    escapes: &'a [char],
}

impl fmt::Write for EscapingWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        push_escaped(self.out, s, self.escapes);
        Ok(())
    }
}

/// An id no other run shares: 16 bytes of SHA-256 over the key's digest, the time, the process, a
/// process-wide counter, and a random hasher seed.
pub(crate) fn run_id(digest: &[u8; 32]) -> [u8; 16] {
    use std::hash::{BuildHasher as _, Hasher as _};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
    seed.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let mut hasher = Sha256::new();
    hasher.update(digest);
    hasher.update(seed.finish().to_be_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    hasher.update(now.to_be_bytes());
    hasher.update(std::process::id().to_be_bytes());
    let digest = hasher.finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    id
}

/// Twelve hex digits no other caller gets (a relay's lease token).
pub(crate) fn token() -> String {
    run_id(&[0; 32])[..6]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invoice(month: &str, customer: &str) -> JobKey {
        let mut w = KeyWriter::new(32, &[':']);
        w.text("invoice:");
        w.value(month);
        w.text(":");
        w.value(customer);
        w.finish()
    }

    #[test]
    fn separators_inside_values_are_escaped() {
        assert_eq!(invoice("a:b", "c").as_str(), "invoice:a%3Ab:c");
        assert_eq!(invoice("a", "b:c").as_str(), "invoice:a:b%3Ac");
        assert_ne!(invoice("a:b", "c"), invoice("a", "b:c"));
    }

    #[test]
    fn readable_values_stay_readable() {
        assert_eq!(
            invoice("2026-10", "cust_481").as_str(),
            "invoice:2026-10:cust_481"
        );
    }

    #[test]
    fn percent_and_control_characters_are_escaped() {
        assert_eq!(
            invoice("100%", "a\0b\n").as_str(),
            "invoice:100%25:a%00b%0A"
        );
    }

    #[test]
    fn builder_matches_writer() {
        let built = JobKey::builder()
            .text("invoice:")
            .value("a:b")
            .text(":")
            .value("c%")
            .build()
            .unwrap();
        assert_eq!(built, invoice("a:b", "c%"));
    }

    #[test]
    fn builder_rejects_ambiguous_shapes() {
        assert_eq!(
            JobKey::builder().value(1).value(2).build(),
            Err(KeyError::AdjacentValues {
                first: 0,
                second: 1
            })
        );
        assert!(matches!(
            JobKey::builder().value(1).text("x").value(2).build(),
            Err(KeyError::AmbiguousSeparator {
                starts_with: 'x',
                ..
            })
        ));
        assert!(matches!(
            JobKey::builder().text("a\nb").build(),
            Err(KeyError::ControlCharacter { .. })
        ));
    }

    #[test]
    fn non_ascii_separators_are_escaped_by_their_bytes() {
        let key = JobKey::builder()
            .value("é")
            .text("é")
            .value("x")
            .build()
            .unwrap();
        assert_eq!(key.as_str(), "%C3%A9éx");
    }

    #[test]
    fn readable_form_escapes_control_characters_only_when_present() {
        assert!(matches!(JobKey::new("plain").readable(), Cow::Borrowed(_)));
        assert_eq!(JobKey::new("a\0b").readable(), "a%00b");
    }

    #[test]
    fn digest_is_sha256_of_the_key() {
        assert_eq!(
            JobKey::new("abc").digest()[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "SHA-256(\"abc\") starts ba7816bf"
        );
    }
}
