//! Durations as the statements bind them: whole microseconds, checked.
//!
//! Every time that decides anything is computed by the database from its own clock plus one of
//! these durations, so a duration is all the runtime ever sends. Each is bounded, so that the
//! database's arithmetic (`now + duration`) stays inside every backend's timestamp range:
//! `Duration::MAX` is a clear error, never an overflow or a panic.

use std::time::Duration;

use crate::error::Error;

/// The longest duration accepted anywhere: 100 years.
pub(crate) const MAX: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

/// `duration` in microseconds, or [`Error::InvalidDuration`] naming `what` when it is longer
/// than [`MAX`].
pub(crate) fn micros(duration: Duration, what: &'static str) -> Result<i64, Error> {
    if duration > MAX {
        return Err(Error::InvalidDuration {
            what,
            duration,
            max: MAX,
        });
    }
    i64::try_from(duration.as_micros()).map_err(|_| Error::InvalidDuration {
        what,
        duration,
        max: MAX,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_durations_are_refused_not_overflowed() {
        assert_eq!(micros(Duration::from_secs(2), "x").ok(), Some(2_000_000));
        assert!(micros(MAX, "x").is_ok());
        let error = micros(Duration::MAX, "the relay's lease").expect_err("too long");
        assert!(error.to_string().contains("the relay's lease"), "{error}");
    }
}
