//! The one-call check over every job in the binary: `charge` and `refund` (handlers.rs) share the
//! template `charge:<order_id>` on purpose, and the check must name them with a key both produce;
//! `identity.rs` holds two handlers sharing the name `process` on purpose, reported as such.

use idempotent_jobs::registry;

#[test]
fn overlapping_jobs_are_reported_with_a_shared_key() {
    let names: Vec<&str> = registry::registered().map(|r| r.job().name()).collect();
    for expected in ["charge", "refund", "pair"] {
        assert!(
            names.contains(&expected),
            "{expected} is registered: {names:?}"
        );
    }

    let overlaps = registry::check_key_spaces().expect_err("charge and refund overlap");
    let pairs: Vec<(String, String)> = overlaps
        .iter()
        .filter_map(|o| match o {
            registry::KeySpaceOverlap::SharedKey { first, second, .. } => {
                let mut pair = [first.0.clone(), second.0.clone()];
                pair.sort();
                Some((pair[0].clone(), pair[1].clone()))
            }
            registry::KeySpaceOverlap::SharedName { name, .. } if name == "process" => None,
            other => panic!("only charge and refund overlap: {other}"),
        })
        .collect();
    assert!(
        pairs
            .iter()
            .all(|p| *p == ("charge".to_owned(), "refund".to_owned())),
        "{pairs:?}"
    );
    assert!(!pairs.is_empty());
    let message = overlaps
        .iter()
        .find(|o| matches!(o, registry::KeySpaceOverlap::SharedKey { .. }))
        .expect("charge and refund")
        .to_string();
    assert!(message.contains("`charge:"), "{message}");
    assert!(message.contains("handlers.rs:"), "{message}");
}
