//! Times as the CLI reads and prints them: RFC 3339 in UTC, or a duration ago.
//!
//! A few lines of calendar arithmetic (days from a civil date and back, proleptic Gregorian) instead
//! of a date-time crate: the CLI only needs UTC timestamps in one format.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds in a day.
const DAY: i64 = 86_400;

/// Parses what `--since` and `--before` take: an RFC 3339 time (`2026-11-30T10:00:00Z`, with an
/// offset such as `+02:00`, or a date alone, meaning its midnight UTC), or a duration ago in the
/// project's one duration grammar (`2h`, `7d`, `30 days`, `1d 12h`: see
/// `idempotent_keys::duration`), counted back from this machine's clock.
pub fn parse_time_arg(text: &str) -> Result<SystemTime, String> {
    let text = text.trim();
    if looks_like_a_date(text) {
        return parse_rfc3339(text);
    }
    let ago = parse_duration(text)?;
    SystemTime::now()
        .checked_sub(ago)
        .ok_or_else(|| format!("`{text}` ago is before the start of time"))
}

/// Whether `text` starts as an RFC 3339 date does (`YYYY-`).
fn looks_like_a_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() >= 5 && bytes[..4].iter().all(u8::is_ascii_digit) && bytes[4] == b'-'
}

/// Parses a duration in the project's one grammar (`idempotent_keys::duration`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    idempotent_keys::duration::parse(text).map_err(|why| format!("`{text}`: {why}"))
}

/// Parses an RFC 3339 time: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`; `t`, `z` and a space
/// for `T` are accepted, seconds may be left out, and a date alone means its midnight UTC.
pub fn parse_rfc3339(text: &str) -> Result<SystemTime, String> {
    let bad = |why: &str| {
        format!(
            "`{text}` is not a time: {why}; write RFC 3339 (`2026-11-30T10:00:00Z`, or with an offset such as `+02:00`) or a duration ago (`2h`, `7d`)"
        )
    };
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = text.get(range)?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    };
    let (year, month, day) = match (number(0..4), bytes.get(4), number(5..7), bytes.get(7)) {
        (Some(y), Some(b'-'), Some(m), Some(b'-')) => match number(8..10) {
            Some(d) => (y, m, d),
            None => return Err(bad("the date must be YYYY-MM-DD")),
        },
        _ => return Err(bad("the date must be YYYY-MM-DD")),
    };
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return Err(bad("no such date"));
    }
    let date_seconds = days_from_civil(year, month, day) * DAY;
    if bytes.len() == 10 {
        return Ok(from_unix(date_seconds, 0));
    }
    if !matches!(bytes[10], b'T' | b't' | b' ') {
        return Err(bad("the date and the time must be separated by `T`"));
    }
    let (hour, minute) = match (number(11..13), bytes.get(13), number(14..16)) {
        (Some(h), Some(b':'), Some(m)) => (h, m),
        _ => return Err(bad("the time must be HH:MM:SS")),
    };
    let mut at = 16;
    let mut second = 0;
    if bytes.get(at) == Some(&b':') {
        second = number(at + 1..at + 3).ok_or_else(|| bad("the time must be HH:MM:SS"))?;
        at += 3;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(bad("no such time of day"));
    }
    let mut micros = 0u32;
    if bytes.get(at) == Some(&b'.') {
        let digits = bytes[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return Err(bad("a `.` must be followed by digits"));
        }
        for (i, b) in bytes[at + 1..at + 1 + digits].iter().enumerate().take(6) {
            micros += u32::from(b - b'0') * 10u32.pow(5 - i as u32);
        }
        at += 1 + digits;
    }
    let offset_seconds = parse_offset(&text[at..]).map_err(bad)?;
    let seconds = date_seconds + hour * 3_600 + minute * 60 + second - offset_seconds;
    Ok(from_unix(seconds, micros))
}

/// The seconds east of UTC that an RFC 3339 zone (`Z`, `+02:00`, `-05:30`) says.
fn parse_offset(offset: &str) -> Result<i64, &'static str> {
    const BAD: &str = "the time zone must be `Z` or an offset like `+02:00`";
    let sign = match offset.as_bytes().first() {
        None => return Err("it has no time zone: add `Z` for UTC, or an offset like `+02:00`"),
        Some(b'Z' | b'z') if offset.len() == 1 => return Ok(0),
        Some(b'+') => 1,
        Some(b'-') => -1,
        Some(_) => return Err(BAD),
    };
    let two_digits = |range: std::ops::Range<usize>| {
        offset
            .get(range)
            .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<i64>().ok())
    };
    match (two_digits(1..3), offset.as_bytes().get(3), two_digits(4..6)) {
        (Some(h), Some(b':'), Some(m)) if offset.len() == 6 && h <= 23 && m <= 59 => {
            Ok(sign * (h * 3_600 + m * 60))
        }
        _ => Err(BAD),
    }
}

/// `time` as RFC 3339 in UTC, to the second: `2026-11-30T10:00:00Z` (for tables).
pub fn format_seconds(time: SystemTime) -> String {
    let (seconds, _) = to_unix(time);
    format_unix(seconds, None)
}

/// `time` as RFC 3339 in UTC, to the microsecond: `2026-11-30T10:00:00.123456Z` (for JSON).
pub fn format_micros(time: SystemTime) -> String {
    let (seconds, micros) = to_unix(time);
    format_unix(seconds, Some(micros))
}

/// A duration for people: `45s`, `12m 5s`, `3h 5m`, `2d 4h`.
pub fn format_age(age: Duration) -> String {
    let s = age.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m {}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h {}m", s / 3_600, s % 3_600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3_600),
    }
}

/// Seconds since the epoch as RFC 3339 in UTC, with microseconds when given.
fn format_unix(seconds: i64, micros: Option<u32>) -> String {
    let days = seconds.div_euclid(DAY);
    let of_day = seconds.rem_euclid(DAY);
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (of_day / 3_600, of_day % 3_600 / 60, of_day % 60);
    match micros {
        Some(micros) => format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{micros:06}Z"),
        None => format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z"),
    }
}

/// Whole seconds since the epoch (negative before it) and the microseconds past them.
fn to_unix(time: SystemTime) -> (i64, u32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => (
            i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
            after.subsec_micros(),
        ),
        Err(before) => {
            let before = before.duration();
            let mut seconds = -i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
            let mut micros = before.subsec_micros();
            if micros > 0 {
                seconds -= 1;
                micros = 1_000_000 - micros;
            }
            (seconds, micros)
        }
    }
}

/// The time `seconds` (negative: before the epoch) and `micros` after the epoch.
fn from_unix(seconds: i64, micros: u32) -> SystemTime {
    let whole = Duration::from_secs(seconds.unsigned_abs());
    let base = if seconds >= 0 {
        UNIX_EPOCH + whole
    } else {
        UNIX_EPOCH - whole
    };
    base + Duration::from_micros(u64::from(micros))
}

/// Whether `year` is a leap year.
fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// How many days `month` of `year` has.
fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day counted from 1970-01-01 (the inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        parse_rfc3339(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn rfc3339_round_trips() {
        for text in [
            "1970-01-01T00:00:00Z",
            "2026-11-30T10:00:00Z",
            "2000-02-29T23:59:59Z",
            "1969-12-31T23:59:59Z",
            "2400-12-31T00:00:01Z",
        ] {
            assert_eq!(format_seconds(at(text)), text);
        }
        assert_eq!(
            format_micros(at("2026-11-30T10:00:00.123456789Z")),
            "2026-11-30T10:00:00.123456Z"
        );
        assert_eq!(
            format_micros(at("1969-12-31T23:59:59.5Z")),
            "1969-12-31T23:59:59.500000Z"
        );
    }

    #[test]
    fn offsets_dates_and_lenient_forms() {
        assert_eq!(at("2026-11-30T12:00:00+02:00"), at("2026-11-30T10:00:00Z"));
        assert_eq!(at("2026-11-30T08:30:00-01:30"), at("2026-11-30T10:00:00Z"));
        assert_eq!(at("2026-11-30 10:00z"), at("2026-11-30T10:00:00Z"));
        assert_eq!(at("2026-11-30"), at("2026-11-30T00:00:00Z"));
        assert_eq!(
            at("2026-11-30T10:00:00Z")
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .ok(),
            Some(1_796_032_800)
        );
    }

    #[test]
    fn bad_times_say_why() {
        for (text, why) in [
            ("2026-11-30T10:00:00", "no time zone"),
            ("2026-02-30T10:00:00Z", "no such date"),
            ("2026-11-30T24:00:00Z", "no such time"),
            ("30.11.2026", "YYYY-MM-DD"),
            ("2026-11-30T10:00:00+2", "offset"),
            ("2026-11-30X10:00:00Z", "separated"),
        ] {
            let error = parse_rfc3339(text).expect_err(text);
            assert!(error.contains(why), "{text}: {error}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(parse_duration("1d12h"), Ok(Duration::from_secs(129_600)));
        assert_eq!(parse_duration("1w"), Ok(Duration::from_secs(604_800)));
        assert_eq!(
            parse_duration("30 days"),
            Ok(Duration::from_secs(30 * 86_400))
        );
        for bad in ["", "h", "2", "2x", "99999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        let ago = parse_time_arg("7d").expect("7d");
        let expected = SystemTime::now() - Duration::from_secs(7 * 86_400);
        let skew = expected.duration_since(ago).unwrap_or_default();
        assert!(skew < Duration::from_secs(5));
    }

    #[test]
    fn ages() {
        assert_eq!(format_age(Duration::from_secs(45)), "45s");
        assert_eq!(format_age(Duration::from_secs(725)), "12m 5s");
        assert_eq!(format_age(Duration::from_secs(11_100)), "3h 5m");
        assert_eq!(format_age(Duration::from_secs(187_200)), "2d 4h");
    }
}
