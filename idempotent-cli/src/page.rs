//! Where a page of `keys list` (and the dashboard's `/keys`) ends: the next page starts after it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotent_runtime::keys::{self, KeyQuery, KeyRecord};

/// The last key of a page, as `keys list --after` and the dashboard's "Older keys" link carry it:
/// `<microseconds since 1970>.<digest in hex>`. By time alone, keys done at the same instant as
/// the last one shown (a busy worker commits several in one millisecond) would be on no page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct After {
    done_at: SystemTime,
    digest: [u8; 32],
}

impl After {
    /// The page after the one that ends with `record`.
    pub fn of(record: &KeyRecord) -> Self {
        Self {
            done_at: record.done_at,
            digest: record.digest,
        }
    }

    /// `query`, restricted to the keys after this one.
    pub fn apply(self, query: KeyQuery) -> KeyQuery {
        query.after(self.done_at, self.digest)
    }

    /// Reads what [`Display`](std::fmt::Display) wrote.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "not a page position: {text:?} (copy it from the `--after` that `keys list` printed)"
            )
        };
        let (micros, digest) = text.trim().split_once('.').ok_or_else(bad)?;
        let micros: i64 = micros.parse().map_err(|_| bad())?;
        let digest = keys::parse_digest(digest).ok_or_else(bad)?;
        let done_at = if micros >= 0 {
            UNIX_EPOCH.checked_add(Duration::from_micros(micros.unsigned_abs()))
        } else {
            UNIX_EPOCH.checked_sub(Duration::from_micros(micros.unsigned_abs()))
        }
        .ok_or_else(bad)?;
        Ok(Self { done_at, digest })
    }
}

impl std::fmt::Display for After {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let micros = match self.done_at.duration_since(UNIX_EPOCH) {
            Ok(after) => i128::try_from(after.as_micros()).unwrap_or(i128::MAX),
            Err(before) => -i128::try_from(before.duration().as_micros()).unwrap_or(i128::MAX),
        };
        write!(f, "{micros}.")?;
        for byte in self.digest {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// `clap`'s parser for `--after`.
pub fn parse_after_arg(text: &str) -> Result<After, String> {
    After::parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_back_as_written() {
        for micros in [0i64, 1_796_379_332_123_000, -1_500_000] {
            let done_at = if micros >= 0 {
                UNIX_EPOCH + Duration::from_micros(micros.unsigned_abs())
            } else {
                UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
            };
            let after = After {
                done_at,
                digest: [0xab; 32],
            };
            assert_eq!(After::parse(&after.to_string()), Ok(after));
        }
        assert!(After::parse("12.zz").is_err());
        assert!(After::parse("").is_err());
    }
}
