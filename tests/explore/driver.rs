//! The budget, the seeds, the figures, replays and the shrinker.

use std::time::{Duration, Instant};

use super::controller::{Figures, Report, Runner, run_schedule_with};
use super::model::{Db, Generator, Schedule, Violation, signature};

/// Parses `30m`, `20min`, `90s`, `1h`, `2h30m`, `500ms`, a bare number of seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(seconds) = text.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c.is_whitespace())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        rest = &rest[unit_end..];
        total += match unit {
            "ms" => Duration::from_millis(number),
            "s" | "sec" | "secs" => Duration::from_secs(number),
            "m" | "min" | "mins" => Duration::from_secs(number * 60),
            "h" | "hr" | "hours" | "hour" => Duration::from_secs(number * 3600),
            _ => return None,
        };
    }
    Some(total)
}

/// The default run's exploration time: what leaves the whole test under 3 minutes.
pub const DEFAULT_FOR: Duration = Duration::from_secs(140);
/// The longest single schedule: longer runs are a sequence of such epochs, each on a fresh
/// database with its own seed, so that a failure's schedule stays short enough to shrink.
pub const EPOCH: Duration = Duration::from_secs(150);

pub struct Settings {
    pub seed: u64,
    pub seed_given: bool,
    pub explore_for: Duration,
    pub steps: Option<usize>,
    pub dbs: Vec<Db>,
    pub shrink_for: Duration,
}

impl Settings {
    pub fn from_env() -> Settings {
        let seed_text = std::env::var("IDEMPOTENT_EXPLORE_SEED").ok();
        let seed = seed_text.as_deref().map(|s| {
            s.trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("IDEMPOTENT_EXPLORE_SEED={s}: not a number"))
        });
        let explore_for = std::env::var("IDEMPOTENT_EXPLORE_FOR")
            .ok()
            .map_or(DEFAULT_FOR, |s| {
                parse_duration(&s).unwrap_or_else(|| {
                    panic!("IDEMPOTENT_EXPLORE_FOR={s}: not a duration (write 30m, 90s, 1h)")
                })
            });
        let steps = std::env::var("IDEMPOTENT_EXPLORE_STEPS").ok().map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("IDEMPOTENT_EXPLORE_STEPS={s}: not a number"))
        });
        let dbs = std::env::var("IDEMPOTENT_EXPLORE_DB").ok().map_or_else(
            || vec![Db::Sqlite, Db::Postgres, Db::Mariadb],
            |list| {
                list.split(',')
                    .map(|name| match name.trim() {
                        "sqlite" => Db::Sqlite,
                        "postgres" => Db::Postgres,
                        "mariadb" | "mysql" => Db::Mariadb,
                        other => panic!("IDEMPOTENT_EXPLORE_DB: unknown database {other} (sqlite, postgres, mariadb)"),
                    })
                    .collect()
            },
        );
        let shrink_for = std::env::var("IDEMPOTENT_EXPLORE_SHRINK_FOR")
            .ok()
            .and_then(|s| parse_duration(&s))
            .unwrap_or(if explore_for > DEFAULT_FOR {
                Duration::from_secs(600)
            } else {
                Duration::from_secs(45)
            });
        let fresh = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 ^ u64::from(std::process::id()));
        Settings {
            seed: seed.unwrap_or(fresh % 1_000_000_000_000),
            seed_given: seed.is_some(),
            explore_for,
            steps,
            dbs,
            shrink_for,
        }
    }
}

/// One epoch on one database: generates steps from `seed` and runs them for `limit` (or exactly
/// `steps` of them), then finishes and checks.
pub fn explore_epoch(
    db: Db,
    seed: u64,
    limit: Duration,
    steps: Option<usize>,
) -> (Schedule, Report) {
    let started = Instant::now();
    let mut generator = Generator::new(seed, db);
    let modes = generator.modes.clone();
    // PostgreSQL's and MariaDB's epochs run on a server of their own, which the nemesis crashes
    // and restarts, unless IDEMPOTENT_POSTGRES_URL / IDEMPOTENT_MYSQL_URL names the server to use.
    let own_server = match db {
        Db::Postgres => std::env::var_os("IDEMPOTENT_POSTGRES_URL").is_none(),
        Db::Mariadb => std::env::var_os("IDEMPOTENT_MYSQL_URL").is_none(),
        Db::Sqlite => false,
    };
    let mut runner = Runner::new(db, &modes, own_server);
    let mut executed = Vec::new();
    loop {
        let more = match steps {
            Some(n) => executed.len() < n,
            None => started.elapsed() < limit,
        };
        if !more {
            break;
        }
        let step = generator.step();
        runner.step(&step);
        executed.push(step);
    }
    let report = runner.finish(started);
    (
        Schedule {
            db,
            seed,
            modes,
            steps: executed,
        },
        report,
    )
}

pub fn describe(figures: &Figures, db: Db) -> String {
    let faults: Vec<String> = figures
        .faults
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let outcomes: Vec<String> = figures
        .outcomes
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let checks: Vec<String> = figures
        .checks
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    format!(
        "explore {}: {:.0} s, {} steps, {} deliveries (+{} in the final round), {} keys, {} effects committed, \
         {} relay rounds, {} messages received ({} duplicates dropped by id); outcomes: {}; faults: {}; checks: {}",
        db.name(),
        figures.duration.as_secs_f64(),
        figures.steps,
        figures.deliveries,
        figures.final_deliveries,
        figures.keys,
        figures.effects,
        figures.relay_rounds,
        figures.received,
        figures.duplicates_received,
        outcomes.join(", "),
        faults.join(", "),
        checks.join(", "),
    )
}

pub fn schedule_text(schedule: &Schedule) -> String {
    let mut text = format!(
        "{{\"db\":{},\"seed\":{},\"modes\":{},\"steps\":[\n",
        serde_json::to_string(&schedule.db).expect("json"),
        schedule.seed,
        serde_json::to_string(&schedule.modes).expect("json"),
    );
    for (i, step) in schedule.steps.iter().enumerate() {
        let comma = if i + 1 < schedule.steps.len() {
            ","
        } else {
            ""
        };
        text.push_str(&format!(
            "  {}{comma}\n",
            serde_json::to_string(step).expect("json")
        ));
    }
    text.push_str("]}");
    text
}

/// Delta debugging: removes chunks of steps while a violation of the same kind persists, for at
/// most `bound`. Returns the smallest failing schedule found and its violations.
pub fn shrink(
    schedule: &Schedule,
    violations: &[Violation],
    bound: Duration,
) -> (Schedule, Vec<Violation>) {
    shrink_with(schedule, violations, bound, false)
}

/// [`shrink`], with sabotaged workers when `sabotage` (to test the shrinker itself).
pub fn shrink_with(
    schedule: &Schedule,
    violations: &[Violation],
    bound: Duration,
    sabotage: bool,
) -> (Schedule, Vec<Violation>) {
    let started = Instant::now();
    super::controller::QUIET.with(|q| q.set(true));
    let wanted = signature(violations);
    let mut best = schedule.clone();
    let mut best_violations = violations.to_vec();
    let mut chunks = 2usize;
    let mut trials = 0;
    while best.steps.len() > 1 && started.elapsed() < bound {
        let size = best.steps.len().div_ceil(chunks);
        let mut reduced = false;
        for start in (0..best.steps.len()).step_by(size.max(1)) {
            if started.elapsed() >= bound {
                break;
            }
            let mut candidate = best.clone();
            candidate
                .steps
                .drain(start..(start + size).min(candidate.steps.len()));
            if candidate.steps.is_empty() {
                continue;
            }
            trials += 1;
            let report = run_schedule_with(&candidate, sabotage);
            let found = signature(&report.verdict.violations);
            if found.intersection(&wanted).next().is_some() {
                eprintln!(
                    "explore: shrink trial {trials}: {} steps still fail ({:?})",
                    candidate.steps.len(),
                    found
                );
                best = candidate;
                best_violations = report.verdict.violations;
                chunks = (chunks - 1).max(2);
                reduced = true;
                break;
            }
        }
        if !reduced {
            if size <= 1 {
                break;
            }
            chunks = (chunks * 2).min(best.steps.len());
        }
    }
    super::controller::QUIET.with(|q| q.set(false));
    eprintln!(
        "explore: shrinking took {:.0} s and {trials} trials: {} of {} steps left",
        started.elapsed().as_secs_f64(),
        best.steps.len(),
        schedule.steps.len()
    );
    (best, best_violations)
}

/// Prints a failure: the seed, how to replay it, the violations, then the shrunk schedule.
pub fn report_failure(schedule: &Schedule, report: &Report, shrink_for: Duration) -> String {
    let mut text = String::new();
    text.push_str(&format!(
        "\nexplore {}: {} violations with seed {} after {} steps.\nReplay the same schedule: \
         IDEMPOTENT_EXPLORE_SEED={} IDEMPOTENT_EXPLORE_DB={} IDEMPOTENT_EXPLORE_STEPS={} cargo test --all-features --test explore explore\n",
        schedule.db.name(),
        report.verdict.violations.len(),
        schedule.seed,
        schedule.steps.len(),
        schedule.seed,
        schedule.db.name(),
        schedule.steps.len(),
    ));
    for v in report.verdict.violations.iter().take(30) {
        text.push_str(&format!("  {v}\n"));
    }
    let path = std::env::temp_dir().join(format!(
        "explore-{}-{}.json",
        schedule.db.name(),
        schedule.seed
    ));
    let _ = std::fs::write(&path, schedule_text(schedule));
    text.push_str(&format!("The schedule is in {}\n", path.display()));
    eprintln!("{text}");
    if shrink_for > Duration::ZERO {
        let (small, violations) = shrink(schedule, &report.verdict.violations, shrink_for);
        let path = std::env::temp_dir().join(format!(
            "explore-{}-{}-shrunk.json",
            schedule.db.name(),
            schedule.seed
        ));
        let _ = std::fs::write(&path, schedule_text(&small));
        let shrunk = format!(
            "Shrunk to {} steps (replay: IDEMPOTENT_EXPLORE_SCHEDULE={} cargo test --all-features --test explore explore), violations:\n{}\n{}\n",
            small.steps.len(),
            path.display(),
            violations
                .iter()
                .take(10)
                .map(|v| format!("  {v}"))
                .collect::<Vec<_>>()
                .join("\n"),
            schedule_text(&small)
        );
        eprintln!("{shrunk}");
        text.push_str(&shrunk);
    }
    text
}
