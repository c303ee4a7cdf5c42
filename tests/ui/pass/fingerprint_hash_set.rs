//! A `HashSet` parameter as a fingerprint input: each set iterates in an order of its own, so an
//! equal set built again (as a redelivered message is decoded) gave another fingerprint, and every
//! redelivery failed with `FingerprintMismatch`, the key never finished. Its elements are
//! fingerprinted in an order of their own.
#![deny(warnings)]

use std::collections::HashSet;

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "tag:<id>", fingerprint(tags))]
fn tag(conn: &mut SqliteConnection, id: u32, tags: &HashSet<String>) -> Result<usize, idempotent_jobs::Error> {
    let _ = (conn, id);
    Ok(tags.len())
}

#[idempotent_job(key = "owned:<id>", fingerprint(tags))]
fn owned(conn: &mut SqliteConnection, id: u32, tags: HashSet<u64>) -> Result<usize, idempotent_jobs::Error> {
    let _ = (conn, id);
    Ok(tags.len())
}

/// A type of the user's whose name merely ends in `HashSet`, not iterable: fingerprinted as it
/// serializes (it was refused: "`Unordered<'_, MyHashSet>` ... does not implement `Serialize`").
#[derive(serde::Serialize)]
struct MyHashSet(u32);

#[idempotent_job(key = "mine:<id>", fingerprint(set))]
fn mine(conn: &mut SqliteConnection, id: u32, set: &MyHashSet) -> Result<u32, idempotent_jobs::Error> {
    let _ = (conn, id);
    Ok(set.0)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    let tags = || -> HashSet<String> {
        ["eu", "vip", "b2b", "annual", "promo", "q4"].iter().map(|t| t.to_string()).collect()
    };
    assert!(tag::outcome(&mut conn, 1, &tags()).expect("a run").is_ran());
    for _ in 0..20 {
        assert!(tag::outcome(&mut conn, 1, &tags()).expect("a replay").is_replayed());
    }
    let mut other = tags();
    other.insert("new".to_owned());
    assert!(matches!(
        tag::outcome(&mut conn, 1, &other),
        Err(idempotent_jobs::Error::FingerprintMismatch { .. })
    ));
    assert!(mine::outcome(&mut conn, 3, &MyHashSet(7)).expect("a run").is_ran());
    assert!(mine::outcome(&mut conn, 3, &MyHashSet(7)).expect("a replay").is_replayed());
    let numbers = || (0..50_u64).collect::<HashSet<u64>>();
    assert!(owned::outcome(&mut conn, 2, numbers()).expect("a run").is_ran());
    for _ in 0..20 {
        assert!(owned::outcome(&mut conn, 2, numbers()).expect("a replay").is_replayed());
    }
}
