//! The jobs the benchmark runs, each the same body (one row into `bench_effects`) unless said
//! otherwise, and the variants that compare them.

use diesel::QueryResult;
use idempotent_jobs::idempotent_job;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::db::{BenchDb, Kind};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// What the value-returning variants return and store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    invoice: i64,
    total_cents: i64,
    currency: String,
}

pub fn receipt(job: i64) -> Receipt {
    Receipt {
        invoice: job,
        total_cents: job * 100 + 99,
        currency: "EUR".to_owned(),
    }
}

/// The job under the attribute.
#[idempotent_job(key = "bench:<job>")]
pub fn macro_job<C: BenchDb>(conn: &mut C, job: i64) -> Result<(), BenchError> {
    conn.insert_effect(job)?;
    Ok(())
}

/// The job returning a value, stored for replays.
#[idempotent_job(key = "value:<job>")]
pub fn macro_value<C: BenchDb>(conn: &mut C, job: i64) -> Result<Receipt, BenchError> {
    conn.insert_effect(job)?;
    Ok(receipt(job))
}

/// The attribute around nothing.
#[idempotent_job(key = "empty:<job>")]
pub fn macro_empty<C: BenchDb>(conn: &mut C, job: i64) -> Result<(), BenchError> {
    let _ = (conn, job);
    Ok(())
}

/// The key and its digest, as a user writing the pattern by hand would build them.
pub fn hand_key(prefix: &str, job: i64) -> (String, [u8; 32]) {
    let key = format!("{prefix}:{job}");
    let digest = Sha256::digest(key.as_bytes()).into();
    (key, digest)
}

/// `f` between [`BenchDb::fast_begin`] and [`BenchDb::fast_commit`]: the fewest round trips a
/// transaction takes on the backend.
pub fn fast_transaction<C: BenchDb>(
    conn: &mut C,
    f: impl FnOnce(&mut C) -> QueryResult<()>,
) -> QueryResult<()> {
    framed(conn, C::fast_begin, C::fast_commit, f)
}

/// `f` between `begin` and `commit`, rolled back (best transport) when it fails.
fn framed<C: BenchDb>(
    conn: &mut C,
    begin: fn(&mut C) -> QueryResult<()>,
    commit: fn(&mut C) -> QueryResult<()>,
    f: impl FnOnce(&mut C) -> QueryResult<()>,
) -> QueryResult<()> {
    begin(conn)?;
    match f(conn) {
        Ok(()) => commit(conn),
        Err(error) => {
            conn.fast_rollback()?;
            Err(error)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    Bare,
    FloorEmpty,
    Floor,
    FloorValue,
    FloorChecked,
    FloorProcedures,
    Hand,
    HandValue,
    Macro,
    MacroEmpty,
    MacroValue,
    NestedHand,
    NestedMacro,
    TwoPhase,
}

pub const VARIANTS: [Variant; 14] = [
    Variant::Bare,
    Variant::FloorEmpty,
    Variant::Floor,
    Variant::FloorValue,
    Variant::FloorChecked,
    Variant::FloorProcedures,
    Variant::Hand,
    Variant::HandValue,
    Variant::Macro,
    Variant::MacroEmpty,
    Variant::MacroValue,
    Variant::NestedHand,
    Variant::NestedMacro,
    Variant::TwoPhase,
];

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::FloorEmpty => "floor_empty",
            Variant::Floor => "floor",
            Variant::FloorValue => "floor_value",
            Variant::FloorChecked => "floor_checked",
            Variant::FloorProcedures => "floor_procedures",
            Variant::Hand => "hand",
            Variant::HandValue => "hand_value",
            Variant::Macro => "macro",
            Variant::MacroEmpty => "macro_empty",
            Variant::MacroValue => "macro_value",
            Variant::NestedHand => "nested_hand",
            Variant::NestedMacro => "nested_macro",
            Variant::TwoPhase => "two_phase",
        }
    }

    /// What the variant is, for the table's legend.
    pub fn legend(self) -> &'static str {
        match self {
            Variant::Bare => "the body in a transaction, no idempotency (best transport)",
            Variant::FloorEmpty => "true floor of macro_empty: the claim alone (best transport)",
            Variant::Floor => "true floor of macro: claim + body (best transport)",
            Variant::FloorValue => {
                "true floor of macro_value: claim + body + UPDATE of the result (best transport)"
            }
            Variant::FloorChecked => {
                "floor + SELECT @@in_transaction before COMMIT (MariaDB: the old implicit-commit check)"
            }
            Variant::FloorProcedures => {
                "floor with BEGIN + SAVEPOINT and RELEASE + COMMIT each one prepared CALL of a stored procedure (MariaDB: the implicit-commit check in 4 round trips)"
            }
            Variant::Hand => "idiomatic Diesel (conn.transaction), claim + body: not a floor",
            Variant::HandValue => {
                "idiomatic Diesel, claim + body + UPDATE of the result: not a floor"
            }
            Variant::Macro => "#[idempotent_job] around the body",
            Variant::MacroEmpty => "#[idempotent_job] around nothing",
            Variant::MacroValue => "#[idempotent_job] around the body, returning a stored receipt",
            Variant::NestedHand => {
                "inside a caller's idiomatic transaction that writes a row first: a nested conn.transaction (Diesel's savepoint), claim + body"
            }
            Variant::NestedMacro => {
                "inside the same caller's transaction: #[idempotent_job] around the body (Diesel's savepoint with the runtime's mark before it)"
            }
            Variant::TwoPhase => {
                "record in progress, commit, work, mark complete (best transport, 3 transactions)"
            }
        }
    }

    /// Whether the variant runs on this backend.
    pub fn applies(self, kind: Kind) -> bool {
        !matches!(self, Variant::FloorChecked | Variant::FloorProcedures) || kind == Kind::Mysql
    }

    /// One job of this variant; `job` is fresh for every call.
    pub fn run<C: BenchDb>(self, conn: &mut C, job: i64) -> Result<(), BenchError> {
        match self {
            Variant::Bare => fast_transaction(conn, |c| c.insert_effect(job))?,
            Variant::FloorEmpty => floor(conn, "floor-empty", job, Body::None, false)?,
            Variant::Floor => floor(conn, "floor", job, Body::Effect, false)?,
            Variant::FloorValue => floor(conn, "floor-value", job, Body::EffectAndRecord, false)?,
            Variant::FloorChecked => floor(conn, "floor-checked", job, Body::Effect, true)?,
            Variant::FloorProcedures => procedure_floor(conn, job)?,
            Variant::Hand => hand(conn, "hand", job, false)?,
            Variant::HandValue => hand(conn, "hand-value", job, true)?,
            Variant::Macro => macro_job(conn, job)?,
            Variant::MacroEmpty => macro_empty(conn, job)?,
            Variant::MacroValue => {
                let stored = macro_value(conn, job)?;
                assert_eq!(stored, receipt(job));
            }
            Variant::NestedHand => nested(conn, job, |c| {
                let (key, digest) = hand_key("nested-hand", job);
                c.transaction::<_, diesel::result::Error, _>(|c| {
                    if c.hand_claim(&digest, &key)? {
                        c.insert_effect(job)?;
                    }
                    Ok(())
                })
                .map_err(BenchError::from)
            })?,
            Variant::NestedMacro => nested(conn, job, |c| macro_job(c, job))?,
            Variant::TwoPhase => two_phase(conn, job)?,
        }
        Ok(())
    }
}

/// `job` inside a caller's transaction, opened the idiomatic way, which writes a row of its own
/// before it (as a caller that calls a job from its own work does).
fn nested<C: BenchDb>(
    conn: &mut C,
    job: i64,
    mut inner: impl FnMut(&mut C) -> Result<(), BenchError>,
) -> Result<(), BenchError> {
    let mut failed = None;
    let outer = conn.idiomatic(&mut |c| {
        c.insert_effect(-job)?;
        inner(c).map_err(|error| {
            failed = Some(error);
            diesel::result::Error::RollbackTransaction
        })
    });
    match (failed, outer) {
        (Some(error), _) => Err(error),
        (None, outer) => outer.map_err(BenchError::from),
    }
}

#[derive(Clone, Copy)]
enum Body {
    None,
    Effect,
    EffectAndRecord,
}

/// The fewest statements and round trips a correct hand-written job sends: `BEGIN` (prepared on
/// MySQL), the claim, the body if claimed (and the result's `UPDATE`), `COMMIT`.
fn floor<C: BenchDb>(
    conn: &mut C,
    prefix: &str,
    job: i64,
    body: Body,
    check: bool,
) -> QueryResult<()> {
    let (key, digest) = hand_key(prefix, job);
    fast_transaction(conn, |c| {
        if c.hand_claim(&digest, &key)? {
            match body {
                Body::None => {}
                Body::Effect => c.insert_effect(job)?,
                Body::EffectAndRecord => {
                    c.insert_effect(job)?;
                    let json = serde_json::to_string(&receipt(job)).expect("a receipt");
                    c.fast_record(&digest, &json)?;
                }
            }
        }
        if check {
            c.check_in_transaction()?;
        }
        Ok(())
    })
}

/// [`floor`] opened and closed by the stored procedures of [`BenchDb::create_procedures`].
fn procedure_floor<C: BenchDb>(conn: &mut C, job: i64) -> QueryResult<()> {
    let (key, digest) = hand_key("floor-procedures", job);
    framed(conn, C::call_begin_job, C::call_commit_job, |c| {
        if c.hand_claim(&digest, &key)? {
            c.insert_effect(job)?;
        }
        Ok(())
    })
}

/// The pattern as a Diesel user writes it: `conn.transaction(|c| ...)`.
fn hand<C: BenchDb>(conn: &mut C, prefix: &str, job: i64, value: bool) -> QueryResult<()> {
    let (key, digest) = hand_key(prefix, job);
    conn.idiomatic(&mut |c| {
        if c.hand_claim(&digest, &key)? {
            c.insert_effect(job)?;
            if value {
                let json = serde_json::to_string(&receipt(job)).expect("a receipt");
                c.hand_record(&digest, &json)?;
            }
        }
        Ok(())
    })
}

/// What other idempotency libraries do: record "in progress" and commit, do the work in its own
/// transaction, then mark the record complete.
fn two_phase<C: BenchDb>(conn: &mut C, job: i64) -> QueryResult<()> {
    let (_, digest) = hand_key("two-phase", job);
    let mut started = false;
    fast_transaction(conn, |c| {
        started = c.two_phase_start(&digest)?;
        Ok(())
    })?;
    if started {
        fast_transaction(conn, |c| c.insert_effect(job))?;
        fast_transaction(conn, |c| c.two_phase_finish(&digest))?;
    }
    Ok(())
}
