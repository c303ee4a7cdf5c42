//! The one duration grammar of `idempotent-jobs`: what `keep = "..."` and
//! `in_progress = "wait at most ..."` take at compile time, and the CLI's `--since` and
//! `--before` at run time. It is [humantime](https://docs.rs/humantime)'s: a number and a unit,
//! several of them one after the other, with or without spaces: `"90s"`, `"500ms"`, `"15min"` (or
//! `"15m"`), `"12h"`, `"30d"` (or `"30 days"`), `"2w"`, `"1d 12h"`, `"1h30m"`. Units: `ms`, `s`,
//! `m`/`min`, `h`, `d`, `w`, `M` (a month, 30.44 days) and `y` (365.25 days), and their long names.

use std::time::Duration;

/// The longest duration the runtime accepts: 100 years of 366 days.
pub const MAX: Duration = Duration::from_secs(100 * 366 * 24 * 3_600);

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    /// Not a duration: what humantime says about it.
    Invalid(String),
    /// A duration of zero.
    Zero,
    /// Longer than [`MAX`].
    TooLong,
}

impl std::fmt::Display for DurationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DurationError::Invalid(why) => write!(
                f,
                "not a duration ({why}); write a number and a unit, like \"90s\", \"500ms\", \"15min\", \"12h\", \"30d\" or \"1d 12h\""
            ),
            DurationError::Zero => f.write_str("a duration of zero"),
            DurationError::TooLong => f.write_str("longer than the 100 years the runtime accepts"),
        }
    }
}

/// Parses `text` in the grammar above: a positive duration of at most [`MAX`].
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    let duration = match humantime::parse_duration(text) {
        Ok(duration) => duration,
        Err(humantime::DurationError::NumberOverflow) => return Err(DurationError::TooLong),
        Err(error) => return Err(DurationError::Invalid(error.to_string())),
    };
    if duration.is_zero() {
        Err(DurationError::Zero)
    } else if duration > MAX {
        Err(DurationError::TooLong)
    } else {
        Ok(duration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_grammar_for_every_duration() {
        for (text, seconds) in [
            ("30d", 30 * 86_400),
            ("30 days", 30 * 86_400),
            ("1d12h", 86_400 + 12 * 3_600),
            ("1d 12h", 86_400 + 12 * 3_600),
            ("90s", 90),
            ("15m", 900),
            ("15min", 900),
            ("2w", 14 * 86_400),
        ] {
            assert_eq!(parse(text), Ok(Duration::from_secs(seconds)), "{text:?}");
        }
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5_400)));
        for bad in ["", "30", "d", "30x", "-1d", "forever"] {
            assert!(
                matches!(parse(bad), Err(DurationError::Invalid(_))),
                "{bad:?}: {:?}",
                parse(bad)
            );
        }
        for zero in ["0s", "0d 0h", "00m", "0ms"] {
            assert_eq!(parse(zero), Err(DurationError::Zero), "{zero:?}");
        }
        for long in ["5300w", "99999999999999999999s", "36601d", "101y"] {
            assert_eq!(parse(long), Err(DurationError::TooLong), "{long:?}");
        }
        assert_eq!(parse("36600d"), Ok(Duration::from_secs(36_600 * 86_400)));
    }
}
