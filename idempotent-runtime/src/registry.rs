//! Every `#[idempotent_job]` in the binary, and a check that no two jobs can meet on one key.
//!
//! Two different jobs whose templates can yield the same key would silently skip each other's work:
//! `charge:<order_id>` and `refund:<order_id>` are fine, `charge:<order_id>` on two jobs is not, and
//! neither is `<anything>` next to `order:<id>`; nor are two handlers that share a job name. At run
//! time a key claimed by another job is an [`Error::KeyClaimedByOtherJob`](crate::error::Error::KeyClaimedByOtherJob)
//! and a shared name an [`Error::DuplicateJobName`](crate::error::Error::DuplicateJobName);
//! [`check_key_spaces`] finds both before they happen, from a test:
//!
//! ```
//! // In a test of your crate:
//! if let Err(problems) = idempotent_runtime::registry::check_key_spaces() {
//!     panic!("{}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
//! }
//! ```
//!
//! The check is exact for the template language: it intersects the sets of keys two templates can
//! produce (each placeholder stands for any escaped value) and reports a key both can produce.

use std::fmt;

use idempotent_keys::language::common_key;

use crate::job::Job;

/// A piece of a registered key template: literal text, or a placeholder by the parameter path it
/// names.
pub type Part = idempotent_keys::Part<'static>;

/// A job the attribute registered: its definition, key template and where it is written.
#[derive(Debug)]
pub struct RegisteredJob {
    job: &'static Job,
    parts: &'static [Part],
    file: &'static str,
    line: u32,
}

impl RegisteredJob {
    /// What the attribute registers.
    #[doc(hidden)]
    pub const fn new(
        job: &'static Job,
        parts: &'static [Part],
        file: &'static str,
        line: u32,
    ) -> Self {
        Self {
            job,
            parts,
            file,
            line,
        }
    }

    /// The job.
    pub fn job(&self) -> &'static Job {
        self.job
    }

    /// The template, parsed.
    pub fn parts(&self) -> &'static [Part] {
        self.parts
    }

    /// `file:line` of the handler.
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

inventory::collect!(RegisteredJob);

/// Every job annotated with `#[idempotent_job]` in this binary.
pub fn registered() -> impl Iterator<Item = &'static RegisteredJob> {
    inventory::iter::<RegisteredJob>.into_iter()
}

/// A problem between two jobs that would make one skip the other's work.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySpaceOverlap {
    /// Two jobs with different names whose templates can produce one same key.
    SharedKey {
        /// The first job's name and location.
        first: (String, String),
        /// The second job's name and location.
        second: (String, String),
        /// A key both jobs can produce.
        example_key: String,
    },
    /// Two different handlers with one job name.
    SharedName {
        /// The name.
        name: String,
        /// Where the first handler is.
        first: String,
        /// Where the second handler is.
        second: String,
    },
}

impl fmt::Display for KeySpaceOverlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySpaceOverlap::SharedKey {
                first,
                second,
                example_key,
            } => write!(
                f,
                "jobs `{}` ({}) and `{}` ({}) can both produce the key `{example_key}`; whichever runs second would skip its work. Give each job its own key prefix.",
                first.0, first.1, second.0, second.1
            ),
            KeySpaceOverlap::SharedName {
                name,
                first,
                second,
            } => write!(
                f,
                "the handlers at {first} and {second} are different jobs with one name, `{name}`; each would skip the other's keys as done. Give each its own `name = \"...\"` (or, if they are one job on purpose, name both explicitly with the same name and template)."
            ),
        }
    }
}

/// Checks every pair of registered jobs: `Err` lists each pair of different jobs whose key
/// templates can produce one same key, and each pair of different handlers sharing a name.
pub fn check_key_spaces() -> Result<(), Vec<KeySpaceOverlap>> {
    let jobs: Vec<&RegisteredJob> = registered().collect();
    let mut problems = Vec::new();
    for (i, first) in jobs.iter().enumerate() {
        for second in &jobs[i + 1..] {
            if first.job.name() == second.job.name() {
                if !first.job.same_job_as(second.job) {
                    problems.push(KeySpaceOverlap::SharedName {
                        name: first.job.name().to_owned(),
                        first: first.location(),
                        second: second.location(),
                    });
                }
                continue;
            }
            if let Some(example_key) = common_key(first.parts, second.parts) {
                problems.push(KeySpaceOverlap::SharedKey {
                    first: (first.job.name().to_owned(), first.location()),
                    second: (second.job.name().to_owned(), second.location()),
                    example_key,
                });
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}
