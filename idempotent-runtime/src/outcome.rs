//! Whether a call ran its job or replayed an earlier run.

/// The result of [`run`](crate::run): the job's value, and whether this call produced it.
///
/// Called on a connection with no transaction open, the job's own transaction has committed when
/// the call returns. Called inside a transaction of the caller's, the job's work (or, for a
/// replay, nothing) is part of that transaction: it commits or rolls back with it, and is
/// committed only once the caller's transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub enum Outcome<T> {
    /// The key was free: the body ran, and its effects and the claim are committed (inside a
    /// caller's transaction: written in it, committed with it).
    Ran(T),
    /// The key was already claimed: the body did not run, nothing changed, and this is the value the
    /// first run stored (inside a caller's transaction, a run that transaction may still roll
    /// back).
    Replayed(T),
}

impl<T> Outcome<T> {
    /// The value, whichever way it came.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Ran(value) | Outcome::Replayed(value) => value,
        }
    }

    /// A reference to the value.
    pub fn value(&self) -> &T {
        match self {
            Outcome::Ran(value) | Outcome::Replayed(value) => value,
        }
    }

    /// `true` when the body did not run because the key was already claimed.
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }

    /// `true` when the body ran in this call.
    pub fn is_ran(&self) -> bool {
        matches!(self, Outcome::Ran(_))
    }

    /// Applies `f` to the value, keeping how it came.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Ran(value) => Outcome::Ran(f(value)),
            Outcome::Replayed(value) => Outcome::Replayed(f(value)),
        }
    }
}
