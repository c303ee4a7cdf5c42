//! The set of keys a template can produce, as an automaton over characters, and the intersection of
//! two such sets: whether two jobs can ever produce one same key.
//!
//! Each placeholder stands for any escaped value (any run of characters that need no escape, and
//! `%XX` escapes), so the check is exact for the template language.

use std::collections::{HashMap, VecDeque};

use crate::Part;

/// One position of a template, as an automaton over characters: a literal character, or a value
/// (any run of allowed characters and `%XX` escapes).
#[derive(Debug)]
enum Item {
    Char(char),
    Value { escapes: Vec<char> },
}

fn items(parts: &[Part<'_>]) -> Vec<Item> {
    // Inside every value the runtime escapes `%`, control characters and these.
    let escapes = crate::escape::escapes(parts);
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

/// A key both templates can produce, if any: breadth-first over the product of their automatons,
/// so the key found is a shortest one. `None` proves that no key is shared.
pub fn common_key(a: &[Part<'_>], b: &[Part<'_>]) -> Option<String> {
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
    use super::*;
    use crate::Part::{Text, Value};

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
