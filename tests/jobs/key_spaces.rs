//! The one-call check over every job in the binary: `charge` and `refund` (handlers.rs) share the
//! template `charge:<order_id>` on purpose, and the check must name them with a key both produce.

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
        .map(|o| match o {
            registry::KeySpaceOverlap::SharedKey { first, second, .. } => {
                let mut pair = [first.0.clone(), second.0.clone()];
                pair.sort();
                (pair[0].clone(), pair[1].clone())
            }
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
    let message = overlaps[0].to_string();
    assert!(message.contains("`charge:"), "{message}");
    assert!(message.contains("handlers.rs:"), "{message}");
}
