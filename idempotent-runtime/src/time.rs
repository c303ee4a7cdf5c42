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

/// Microseconds since the Unix epoch as RFC 3339 UTC, `2026-11-30T10:00:00.123456Z`.
pub(crate) fn rfc3339(micros: i64) -> String {
    let seconds = micros.div_euclid(1_000_000);
    let fraction = micros.rem_euclid(1_000_000);
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{fraction:06}Z",
        of_day / 3_600,
        of_day % 3_600 / 60,
        of_day % 60
    )
}

#[cfg(test)]
mod rfc3339_tests {
    #[test]
    fn formats_utc() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            super::rfc3339(1_764_547_200_123_456),
            "2025-12-01T00:00:00.123456Z"
        );
        assert_eq!(
            super::rfc3339(951_782_400_000_000),
            "2000-02-29T00:00:00.000000Z"
        );
        assert_eq!(super::rfc3339(-1), "1969-12-31T23:59:59.999999Z");
    }
}
