//! How values are written into keys, and read back out.
//!
//! A placeholder's `Display` output is copied into the key with these characters percent-encoded
//! (each UTF-8 byte as `%XX`, upper-case hex):
//!
//! * `%` itself, so that an escape in the key is never ambiguous;
//! * every control character (`\0`, `\n`, ...), so the readable key is storable on every backend
//!   (PostgreSQL text cannot hold NUL);
//! * the first character of every text that stands *between two placeholders* in the template.
//!   In `invoice:<month>:<customer_id>` that is `:`, so `("a:b", "c")` gives `invoice:a%3Ab:c` and
//!   `("a", "b:c")` gives `invoice:a:b%3Ac`.
//!
//! A text between two placeholders must start with a character that cannot appear in an escape
//! sequence (not an ASCII letter or digit, and not `%`) and that is not a control character; see
//! [`shape_problems`]. Under that rule [`split_key`] recovers every value from a key, so no two
//! argument tuples share a key.

use crate::Part;

/// Whether `c` may start a text between two values: it must not be producible by an escape sequence
/// (`%` followed by upper-case hex digits), nor be an ASCII letter or digit, nor a control character.
pub fn is_valid_separator_start(c: char) -> bool {
    !(c == '%' || c.is_ascii_alphanumeric() || c.is_control())
}

/// Whether `c` is written escaped inside a value of a template whose separators start with `escapes`.
pub fn needs_escape(c: char, escapes: &[char]) -> bool {
    c == '%' || c.is_control() || escapes.contains(&c)
}

/// Appends `value` to `out`, escaped for a template whose separators start with `escapes`.
pub fn push_escaped(out: &mut String, value: &str, escapes: &[char]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut rest = value;
    while let Some(at) = rest.find(|c| needs_escape(c, escapes)) {
        out.push_str(&rest[..at]);
        let Some(c) = rest[at..].chars().next() else {
            break;
        };
        let mut buf = [0u8; 4];
        for byte in c.encode_utf8(&mut buf).bytes() {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xF)]));
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.push_str(rest);
}

/// The characters escaped inside values: the first character of every text between two values,
/// each once, in template order.
pub fn escapes(parts: &[Part<'_>]) -> Vec<char> {
    let mut escapes = Vec::new();
    for window in parts.windows(3) {
        if let [Part::Value(_), Part::Text(text), Part::Value(_)] = window
            && let Some(first) = text.chars().next()
            && !escapes.contains(&first)
        {
            escapes.push(first);
        }
    }
    escapes
}

/// Why a template's shape would let two argument tuples share a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeProblem {
    /// Values `before` and `after` (indexes into the parts) have no text between them.
    Touching {
        /// Index of the first value's part.
        before: usize,
        /// Index of the second value's part.
        after: usize,
    },
    /// The text between values `before` and `after` starts with `starts_with`, which an escape or
    /// an ordinary value can produce.
    BadSeparator {
        /// Index of the first value's part.
        before: usize,
        /// Index of the second value's part.
        after: usize,
        /// The text's first character.
        starts_with: char,
    },
}

/// Every shape problem of `parts`, in order. Texts that touch (`Text`, `Text`) are read as one text.
pub fn shape_problems(parts: &[Part<'_>]) -> Vec<ShapeProblem> {
    let mut problems = Vec::new();
    let mut previous_value: Option<usize> = None;
    let mut between: Option<char> = None;
    let mut between_is_empty = true;
    for (index, part) in parts.iter().enumerate() {
        match part {
            Part::Text(text) => {
                if between_is_empty && let Some(first) = text.chars().next() {
                    between = Some(first);
                    between_is_empty = false;
                }
            }
            Part::Value(_) => {
                if let Some(before) = previous_value {
                    match between {
                        None => problems.push(ShapeProblem::Touching {
                            before,
                            after: index,
                        }),
                        Some(first) if !is_valid_separator_start(first) => {
                            problems.push(ShapeProblem::BadSeparator {
                                before,
                                after: index,
                                starts_with: first,
                            });
                        }
                        Some(_) => {}
                    }
                }
                previous_value = Some(index);
                between = None;
                between_is_empty = true;
            }
        }
    }
    problems
}

/// Decodes the percent escapes of one value; `None` when a `%` is not followed by two upper-case hex
/// digits, or the bytes are not UTF-8 (neither can come out of [`push_escaped`]).
pub fn unescape(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let high = hex_value(*bytes.get(at + 1)?)?;
            let low = hex_value(*bytes.get(at + 2)?)?;
            out.push(high << 4 | low);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// The values of `key`, if a template of `parts` produced it: the inverse of writing a key.
///
/// Each value but the last ends at the first unescaped separator character (values hold none); the
/// last one ends where the template's trailing text begins. `None` when the key does not have the
/// template's shape. Templates with [`shape_problems`] have no unique inverse and give `None` too.
pub fn split_key(parts: &[Part<'_>], key: &str) -> Option<Vec<String>> {
    if !shape_problems(parts).is_empty() {
        return None;
    }
    let escapes = escapes(parts);
    let mut values = Vec::new();
    let mut rest = key;
    let mut index = 0;
    while index < parts.len() {
        match parts[index] {
            Part::Text(text) => rest = rest.strip_prefix(text)?,
            Part::Value(_) => {
                // The literal text up to the next value (or the end of the template).
                let mut following = String::new();
                let mut next = index + 1;
                while let Some(Part::Text(text)) = parts.get(next) {
                    following.push_str(text);
                    next += 1;
                }
                let is_last = next >= parts.len();
                let raw = if is_last {
                    rest.strip_suffix(following.as_str())?
                } else {
                    let end = rest.find(|c| escapes.contains(&c)).unwrap_or(rest.len());
                    &rest[..end]
                };
                if raw.chars().any(|c| c.is_control() || escapes.contains(&c)) {
                    return None;
                }
                values.push(unescape(raw)?);
                rest = &rest[raw.len()..];
            }
        }
        index += 1;
    }
    rest.is_empty().then_some(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(parts: &[Part<'_>], values: &[&str]) -> String {
        let escapes = escapes(parts);
        let mut values = values.iter();
        let mut key = String::new();
        for part in parts {
            match part {
                Part::Text(text) => key.push_str(text),
                Part::Value(_) => push_escaped(&mut key, values.next().expect("a value"), &escapes),
            }
        }
        key
    }

    const INVOICE: &[Part<'static>] = &[
        Part::Text("invoice:"),
        Part::Value("month"),
        Part::Text(":"),
        Part::Value("customer_id"),
    ];

    #[test]
    fn separators_inside_values_are_escaped() {
        assert_eq!(write(INVOICE, &["a:b", "c"]), "invoice:a%3Ab:c");
        assert_eq!(write(INVOICE, &["a", "b:c"]), "invoice:a:b%3Ac");
    }

    #[test]
    fn percent_and_control_characters_are_escaped() {
        assert_eq!(
            write(INVOICE, &["100%", "a\0b\n"]),
            "invoice:100%25:a%00b%0A"
        );
    }

    #[test]
    fn non_ascii_separators_are_escaped_by_their_bytes() {
        let parts = [Part::Value("a"), Part::Text("é"), Part::Value("b")];
        assert_eq!(write(&parts, &["é", "x"]), "%C3%A9éx");
        assert_eq!(
            split_key(&parts, "%C3%A9éx"),
            Some(vec!["é".to_owned(), "x".to_owned()])
        );
    }

    #[test]
    fn keys_split_back_into_their_values() {
        let key = write(INVOICE, &["a:b", "c%d\n"]);
        assert_eq!(
            split_key(INVOICE, &key),
            Some(vec!["a:b".to_owned(), "c%d\n".to_owned()])
        );
        assert_eq!(
            split_key(INVOICE, "invoice:a:b:c"),
            None,
            "a bare separator"
        );
        assert_eq!(split_key(INVOICE, "refund:a:b"), None, "another prefix");
        assert_eq!(split_key(INVOICE, "invoice:a%4:b"), None, "a broken escape");
    }

    #[test]
    fn a_trailing_text_may_repeat_inside_the_last_value() {
        let parts = [Part::Text("t:"), Part::Value("x"), Part::Text("-end")];
        let key = write(&parts, &["a-end"]);
        assert_eq!(key, "t:a-end-end");
        assert_eq!(split_key(&parts, &key), Some(vec!["a-end".to_owned()]));
    }

    #[test]
    fn shape_problems_are_found() {
        let touching = [Part::Value("a"), Part::Value("b")];
        assert_eq!(
            shape_problems(&touching),
            [ShapeProblem::Touching {
                before: 0,
                after: 1
            }]
        );
        let letter = [Part::Value("a"), Part::Text("x"), Part::Value("b")];
        assert!(matches!(
            shape_problems(&letter)[..],
            [ShapeProblem::BadSeparator {
                starts_with: 'x',
                ..
            }]
        ));
        assert!(shape_problems(INVOICE).is_empty());
    }

    #[test]
    fn unescape_refuses_what_escaping_cannot_produce() {
        assert_eq!(unescape("a%3Ab").as_deref(), Some("a:b"));
        assert_eq!(unescape("a%3ab"), None, "lower-case hex");
        assert_eq!(unescape("a%"), None);
        assert_eq!(unescape("%FF"), None, "not UTF-8");
    }
}
