//! One name, one job: the check that no two job definitions in a process share a name, made
//! once per definition at its first call.
//!
//! A job's name is its identity in `done_jobs`: a key claimed under one name is replayed only for
//! that name. Two handlers that share a name would each skip the other's work as done, so every
//! annotated handler (they register themselves) is compared with every other at the first job
//! call in the process, and every definition, annotated or `Job::new`, with those called before it.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::error::Error;
use crate::job::Job;
use crate::registry::{self, RegisteredJob};

/// Checks `job`, once per definition; see the [module docs](self).
pub(crate) fn check(job: &'static Job) -> Result<(), Error> {
    if job.checked() {
        return Ok(());
    }
    if let Some((first, second)) = name_conflict(job.name()) {
        return Err(Error::DuplicateJobName {
            name: job.name(),
            first,
            second,
        });
    }
    static CALLED: Mutex<Option<HashMap<&'static str, &'static Job>>> = Mutex::new(None);
    let mut called = CALLED.lock().unwrap_or_else(PoisonError::into_inner);
    let called = called.get_or_insert_with(HashMap::new);
    match called.get(job.name()) {
        Some(other) if !job.same_job_as(other) => {
            return Err(Error::DuplicateJobName {
                name: job.name(),
                first: describe(other),
                second: describe(job),
            });
        }
        Some(_) => {}
        None => {
            called.insert(job.name(), job);
        }
    }
    job.mark_checked();
    Ok(())
}

/// Two registered handlers that use `name` as different jobs, described, if any. Computed once
/// per process, at the first job call.
fn name_conflict(name: &str) -> Option<(String, String)> {
    static CONFLICTS: OnceLock<HashMap<&'static str, (String, String)>> = OnceLock::new();
    CONFLICTS
        .get_or_init(|| {
            let mut conflicts = HashMap::new();
            let jobs: Vec<&RegisteredJob> = registry::registered().collect();
            for (i, first) in jobs.iter().enumerate() {
                for second in &jobs[i + 1..] {
                    if first.job().name() == second.job().name()
                        && !first.job().same_job_as(second.job())
                    {
                        conflicts
                            .entry(first.job().name())
                            .or_insert_with(|| (describe(first.job()), describe(second.job())));
                    }
                }
            }
            conflicts
        })
        .get(name)
        .cloned()
}

/// A job definition as an error shows it: the handler's location, or the plain `Job::new`.
fn describe(job: &'static Job) -> String {
    match registry::registered().find(|r| std::ptr::eq(r.job(), job)) {
        Some(registered) => format!("the handler at {}", registered.location()),
        None => format!(
            "a `Job::new({:?}, {:?})` definition",
            job.name(),
            job.template()
        ),
    }
}
