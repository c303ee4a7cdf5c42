//! Keys never collide: different argument tuples give different keys, checked end to end through
//! the attribute (the readable keys it stores) and on the key writer directly.

use diesel::prelude::*;
use idempotent_jobs::JobKey;
use proptest::prelude::*;

use crate::backends::Sqlite;
use crate::handlers::pair;
use crate::harness::Db;

fn tricky_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c:%]{0,4}",
        "[a:%\\x00\\n/]{0,3}",
        any::<String>().prop_map(|s| s.chars().take(6).collect()),
    ]
}

fn key(left: &str, right: &str) -> JobKey {
    JobKey::builder()
        .text("pair:")
        .value(left)
        .text(":")
        .value(right)
        .build()
        .expect("valid shape")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The escaping is injective: two different tuples never give one key.
    #[test]
    fn different_tuples_never_share_a_key(
        a in (tricky_value(), tricky_value()),
        b in (tricky_value(), tricky_value()),
    ) {
        prop_assume!(a != b);
        prop_assert_ne!(key(&a.0, &a.1), key(&b.0, &b.1));
    }

    /// Keys never hold a control character, so the readable key is storable everywhere.
    #[test]
    fn keys_hold_no_control_characters(a in tricky_value(), b in tricky_value()) {
        prop_assert!(!key(&a, &b).as_str().chars().any(char::is_control));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Through the attribute: each distinct tuple claims its own key, and a repeat claims nothing.
    #[test]
    fn the_attribute_gives_each_tuple_its_own_key(
        tuples in prop::collection::vec((tricky_value(), tricky_value()), 1..6),
    ) {
        let db = Db::<Sqlite>::fresh();
        let mut conn = db.connect();
        for (left, right) in tuples.iter().chain(tuples.iter()) {
            pair(&mut conn, left, right).expect("pair job");
        }
        let distinct: std::collections::BTreeSet<_> = tuples.iter().collect();
        let done: i64 = idempotent_jobs::schema::done_jobs::table.count().get_result(&mut conn).unwrap();
        prop_assert_eq!(done as usize, distinct.len());
        let stored: Vec<String> = idempotent_jobs::schema::done_jobs::table
            .select(idempotent_jobs::schema::done_jobs::job_key)
            .load(&mut conn)
            .unwrap();
        for (left, right) in &distinct {
            prop_assert!(stored.contains(&key(left, right).as_str().to_owned()));
        }
    }
}
