//! The three uses of the key syntax agree: every template the parser accepts writes keys that
//! split back into exactly their values (so keys are injective), and that the overlap automaton
//! counts as keys of that template.

use idempotent_keys::Part;
use idempotent_keys::escape::{escapes, push_escaped, split_key};
use idempotent_keys::language::common_key;
use idempotent_keys::template::parse;
use proptest::prelude::*;

fn template_source() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            "[a-z:/\\-_.é%]{1,4}",
            "<[a-z_][a-z0-9_]{0,5}>",
            "\\\\[<>\\\\]",
        ],
        1..6,
    )
    .prop_map(|parts| parts.concat())
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c:%/\\-é]{0,5}",
        "[a:%\\x00\\n/<>]{0,3}",
        any::<String>().prop_map(|s| s.chars().take(6).collect()),
    ]
}

fn write(parts: &[Part<'_>], values: &[String]) -> String {
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

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 500,
        max_global_rejects: 100_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn accepted_templates_write_keys_that_split_back(
        source in template_source(),
        values in prop::collection::vec(value(), 6),
    ) {
        let (template, errors) = parse(&source);
        prop_assume!(errors.is_empty());
        let parts = template.parts();
        let count = parts.iter().filter(|p| matches!(p, Part::Value(_))).count();
        let values = &values[..count];
        let key = write(&parts, values);
        prop_assert_eq!(split_key(&parts, &key), Some(values.to_vec()), "key {:?}", key);
        prop_assert!(!key.chars().any(char::is_control));
        prop_assert_eq!(common_key(&parts, &[Part::Text(&key)]), Some(key.clone()));
    }

    #[test]
    fn different_values_never_share_a_key(
        source in template_source(),
        a in prop::collection::vec(value(), 6),
        b in prop::collection::vec(value(), 6),
    ) {
        let (template, errors) = parse(&source);
        prop_assume!(errors.is_empty());
        let parts = template.parts();
        let count = parts.iter().filter(|p| matches!(p, Part::Value(_))).count();
        prop_assume!(a[..count] != b[..count]);
        prop_assert_ne!(write(&parts, &a[..count]), write(&parts, &b[..count]));
    }
}
