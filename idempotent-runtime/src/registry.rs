//! Every `#[idempotent_job]` in the binary, and a check that no two jobs share a key space.
//!
//! Two different jobs whose templates can yield the same key would silently skip each other's work:
//! `charge:<order_id>` and `refund:<order_id>` are fine, `charge:<order_id>` on two jobs is not, and
//! neither is `<anything>` next to `order:<id>`. At run time a key already claimed by another job is
//! an [`Error::KeyClaimedByOtherJob`](crate::Error::KeyClaimedByOtherJob); [`check_key_spaces`]
//! finds the overlap before it happens, from a test:
//!
//! ```
//! // In a test of your crate:
//! if let Err(overlaps) = idempotent_runtime::registry::check_key_spaces() {
//!     panic!("{}", overlaps.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
//! }
//! ```
//!
//! The check is exact for the template language: it intersects the sets of keys two templates can
//! produce (each placeholder stands for any escaped value) and reports a key both can produce.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use crate::job::Job;

/// A piece of a registered key template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Literal text.
    Text(&'static str),
    /// A placeholder, by the parameter path it names (`customer_id`, `job.customer_id`).
    Value(&'static str),
}

/// A job the attribute registered: its name, key template and where it is defined.
#[derive(Debug)]
pub struct RegisteredJob {
    job: &'static Job,
    parts: &'static [Part],
    file: &'static str,
    line: u32,
}

impl RegisteredJob {
    /// What the attribute registers.
    #[doc(hidden)]
    pub const fn new(
        job: &'static Job,
        parts: &'static [Part],
        file: &'static str,
        line: u32,
    ) -> Self {
        Self {
            job,
            parts,
            file,
            line,
        }
    }

    /// The job.
    pub fn job(&self) -> &'static Job {
        self.job
    }

    /// The template, parsed.
    pub fn parts(&self) -> &'static [Part] {
        self.parts
    }

    /// `file:line` of the handler.
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

inventory::collect!(RegisteredJob);

/// Every job annotated with `#[idempotent_job]` in this binary.
pub fn registered() -> impl Iterator<Item = &'static RegisteredJob> {
    inventory::iter::<RegisteredJob>.into_iter()
}

/// Two jobs that can produce the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpaceOverlap {
    /// The first job's name and location.
    pub first: (String, String),
    /// The second job's name and location.
    pub second: (String, String),
    /// A key both jobs can produce.
    pub example_key: String,
}

impl fmt::Display for KeySpaceOverlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "jobs `{}` ({}) and `{}` ({}) can both produce the key `{}`; whichever runs second would skip its work. Give each job its own key prefix.",
            self.first.0, self.first.1, self.second.0, self.second.1, self.example_key
        )
    }
}

/// Checks every pair of registered jobs with different names: `Err` lists each pair whose key
/// templates can produce one same key.
pub fn check_key_spaces() -> Result<(), Vec<KeySpaceOverlap>> {
    let jobs: Vec<&RegisteredJob> = registered().collect();
    let mut overlaps = Vec::new();
    for (i, first) in jobs.iter().enumerate() {
        for second in &jobs[i + 1..] {
            if first.job.name() == second.job.name() {
                continue;
            }
            if let Some(example_key) = common_key(first.parts, second.parts) {
                overlaps.push(KeySpaceOverlap {
                    first: (first.job.name().to_owned(), first.location()),
                    second: (second.job.name().to_owned(), second.location()),
                    example_key,
                });
            }
        }
    }
    if overlaps.is_empty() {
        Ok(())
    } else {
        Err(overlaps)
    }
}

/// One position of a template, as an automaton over characters: a literal character, or a value
/// (any run of allowed characters and `%XX` escapes).
#[derive(Debug)]
enum Item {
    Char(char),
    Value { escapes: Vec<char> },
}

fn items(parts: &[Part]) -> Vec<Item> {
    // The runtime escapes, inside every value, the first character of each text that stands
    // between two values (see `key`), plus `%` and control characters.
    let mut escapes = Vec::new();
    for window in parts.windows(3) {
        if let [Part::Value(_), Part::Text(text), Part::Value(_)] = window
            && let Some(first) = text.chars().next()
        {
            escapes.push(first);
        }
    }
    let mut items = Vec::new();
    for part in parts {
        match part {
            Part::Text(text) => items.extend(text.chars().map(Item::Char)),
            Part::Value(_) => items.push(Item::Value {
                escapes: escapes.clone(),
            }),
        }
    }
    items
}

/// A state: position in the items, and for a value, how many hex digits of an escape remain.
type State = (usize, u8);

/// A state of both automatons at once.
type Pair = (State, State);

fn is_hex(c: char) -> bool {
    c.is_ascii_digit() || ('A'..='F').contains(&c)
}

fn step(items: &[Item], (at, pending): State, c: char) -> Option<State> {
    match items.get(at)? {
        Item::Char(expected) => (*expected == c).then_some((at + 1, 0)),
        Item::Value { escapes } => match pending {
            0 if c == '%' => Some((at, 2)),
            0 if !c.is_control() && !escapes.contains(&c) => Some((at, 0)),
            0 => None,
            n => is_hex(c).then_some((at, n - 1)),
        },
    }
}

/// A value may end (be empty) wherever no escape is half-written.
fn skip(items: &[Item], (at, pending): State) -> Option<State> {
    matches!(items.get(at), Some(Item::Value { .. }))
        .then_some(())
        .filter(|()| pending == 0)
        .map(|()| (at + 1, 0))
}

/// A key both templates can produce, if any: breadth-first over the product automaton.
fn common_key(a: &[Part], b: &[Part]) -> Option<String> {
    let (a, b) = (items(a), items(b));
    let mut alphabet: Vec<char> = "%0123456789ABCDEF".chars().collect();
    for item in a.iter().chain(&b) {
        match item {
            Item::Char(c) => alphabet.push(*c),
            Item::Value { escapes } => alphabet.extend(escapes),
        }
    }
    // One character no template mentions stands for all the others.
    let other = "xyzqjkvw_ᚠ"
        .chars()
        .find(|c| !alphabet.contains(c))
        .unwrap_or('ᚠ');
    alphabet.push(other);
    alphabet.sort_unstable();
    alphabet.dedup();

    let start = ((0, 0), (0, 0));
    // How each pair was first reached (from which pair, reading which character), for the witness.
    let mut parent: HashMap<Pair, Option<(Pair, Option<char>)>> = HashMap::new();
    parent.insert(start, None);
    let mut queue = VecDeque::from([start]);
    while let Some(pair @ (p, q)) = queue.pop_front() {
        if p == (a.len(), 0) && q == (b.len(), 0) {
            let mut key: Vec<char> = Vec::new();
            let mut at = pair;
            while let Some(Some((previous, c))) = parent.get(&at) {
                key.extend(c);
                at = *previous;
            }
            return Some(key.into_iter().rev().collect());
        }
        let mut next: Vec<(Pair, Option<char>)> = Vec::new();
        if let Some(p2) = skip(&a, p) {
            next.push(((p2, q), None));
        }
        if let Some(q2) = skip(&b, q) {
            next.push(((p, q2), None));
        }
        for &c in &alphabet {
            if let (Some(p2), Some(q2)) = (step(&a, p, c), step(&b, q, c)) {
                next.push(((p2, q2), Some(c)));
            }
        }
        for (state, c) in next {
            parent.entry(state).or_insert_with(|| {
                queue.push_back(state);
                Some((pair, c))
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::Part::{Text, Value};
    use super::*;

    #[test]
    fn identical_templates_overlap() {
        let t = [Text("charge:"), Value("order_id")];
        assert_eq!(common_key(&t, &t).as_deref(), Some("charge:"));
    }

    #[test]
    fn different_prefixes_do_not_overlap() {
        assert_eq!(
            common_key(
                &[Text("charge:"), Value("id")],
                &[Text("refund:"), Value("id")]
            ),
            None
        );
    }

    #[test]
    fn escaped_separators_keep_shapes_apart() {
        // Values of the first cannot contain `:`, so its keys have exactly two colons.
        let two = [Text("invoice:"), Value("m"), Text(":"), Value("c")];
        let three = [
            Text("invoice:"),
            Value("m"),
            Text(":"),
            Value("c"),
            Text(":retry"),
        ];
        assert_eq!(common_key(&two, &three), None);
    }

    #[test]
    fn a_catch_all_template_overlaps_everything() {
        let key = common_key(&[Value("anything")], &[Text("order:"), Value("id")]);
        assert_eq!(key.as_deref(), Some("order:"));
    }

    #[test]
    fn a_value_can_cover_literal_text() {
        let key = common_key(&[Text("a:"), Value("x")], &[Text("a:b-"), Value("y")]);
        assert_eq!(key.as_deref(), Some("a:b-"));
    }

    #[test]
    fn a_percent_in_literal_text_is_matched_only_by_an_escape() {
        // Values never hold a bare `%`, only `%XX`.
        assert_eq!(common_key(&[Text("p:"), Value("x")], &[Text("p:%")]), None);
        assert_eq!(
            common_key(&[Text("p:"), Value("x")], &[Text("p:%41")]).as_deref(),
            Some("p:%41")
        );
    }
}
