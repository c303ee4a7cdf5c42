//! When a key is not found: the form that was looked for, and the stored keys nearest to it.
//!
//! Values in keys are escaped (`invoice:<month>:<customer_id>` stores the values `a:b` and `c` as
//! `invoice:a%3Ab:c`), so a key typed from the values by hand is often not the stored one. The job is
//! the one whose newest key shares the longest start with the key looked for; its keys are ranked
//! by how many characters must change to turn the key looked for into each one, read with its
//! escapes decoded (a stored key that reads the same decoded comes first, at distance 0).

use idempotent_runtime::keys::{self, KeyQuery};
use idempotent_runtime::{Error, JobStore};

/// How many of a job's newest keys are compared.
const SCANNED: u32 = 1_000;
/// Keys longer than this are compared by their first this many characters.
const COMPARED_CHARS: usize = 200;

/// A stored key near the one looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The key as stored.
    pub key: String,
    /// The stored key with its escapes decoded, when that differs from it.
    pub decoded: Option<String>,
    /// Characters to change, on the decoded form.
    pub distance: usize,
}

/// The job a key most likely belongs to, and its stored keys nearest to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nearest {
    /// The job.
    pub job: String,
    /// Its nearest keys, nearest first.
    pub keys: Vec<Candidate>,
    /// Whether the job has more keys than were compared.
    pub more: bool,
}

/// The stored keys nearest to `wanted`, at most `max`; `None` when no job's keys share a start
/// with it.
pub fn nearest<C: JobStore>(
    conn: &mut C,
    wanted: &str,
    max: usize,
) -> Result<Option<Nearest>, Error> {
    let mut best: Option<(usize, String)> = None;
    for count in keys::job_counts(conn)? {
        let newest = keys::list(conn, &KeyQuery::default().job(count.job.as_str()).limit(1))?;
        let Some(record) = newest.first() else {
            continue;
        };
        let shared = shared_start(&record.key, wanted);
        if shared > 0 && best.as_ref().is_none_or(|(most, _)| shared > *most) {
            best = Some((shared, count.job));
        }
    }
    let Some((_, job)) = best else {
        return Ok(None);
    };
    let records = keys::list(
        conn,
        &KeyQuery::default().job(job.as_str()).limit(SCANNED + 1),
    )?;
    let more = records.len() > SCANNED as usize;
    let mut candidates: Vec<Candidate> = records
        .into_iter()
        .take(SCANNED as usize)
        .map(|record| candidate(record.key, wanted))
        .collect();
    candidates.sort_by(|a, b| a.distance.cmp(&b.distance).then_with(|| a.key.cmp(&b.key)));
    candidates.truncate(max);
    Ok(Some(Nearest {
        job,
        keys: candidates,
        more,
    }))
}

/// A stored key, compared with `wanted`.
fn candidate(key: String, wanted: &str) -> Candidate {
    let decoded = idempotent_keys::escape::unescape(&key).filter(|decoded| *decoded != key);
    let distance = distance(decoded.as_deref().unwrap_or(&key), wanted).min(distance(&key, wanted));
    Candidate {
        key,
        decoded,
        distance,
    }
}

/// How many characters two texts share at their start, up to the last separator (a character
/// that is not a letter or digit) among them: `invoice:2026` and `invoice:2025` share `invoice:`.
fn shared_start(a: &str, b: &str) -> usize {
    let mut last_separator = 0;
    for (count, (x, y)) in a.chars().zip(b.chars()).enumerate() {
        if x != y {
            break;
        }
        if !x.is_alphanumeric() {
            last_separator = count + 1;
        }
    }
    last_separator
}

/// The Levenshtein distance of two texts, by character, on their first [`COMPARED_CHARS`].
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().take(COMPARED_CHARS).collect();
    let b: Vec<char> = b.chars().take(COMPARED_CHARS).collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, x) in a.iter().enumerate() {
        current[0] = i + 1;
        for (j, y) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(x != y);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance("invoice:a:b:c", "invoice:a:b:c"), 0);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("東京", "東都"), 1);
    }

    #[test]
    fn decoded_keys_match_what_was_typed() {
        let c = candidate("invoice:a%3Ab:c".to_owned(), "invoice:a:b:c");
        assert_eq!(c.distance, 0);
        assert_eq!(c.decoded.as_deref(), Some("invoice:a:b:c"));
        let c = candidate("invoice:x:y".to_owned(), "invoice:x:z");
        assert_eq!((c.distance, c.decoded), (1, None));
    }

    #[test]
    fn jobs_are_told_by_the_start_of_their_keys() {
        assert_eq!(shared_start("invoice:2026-10:c1", "invoice:2025-01:c9"), 8);
        assert_eq!(shared_start("invoice:x", "inv"), 0);
        assert_eq!(shared_start("charge:1", "invoice:1"), 0);
    }
}
