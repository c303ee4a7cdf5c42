//! The protocol model (`models/protocol.pml`, described in `docs/model.md`) checked with Spin: the
//! real model must hold every invariant over its whole state space, and each seeded mutant
//! (`-DMUTANT_...`) must break one.
//!
//! Each check runs `spin -a` with its `-D` flags in a directory of its own, compiles `pan.c` with
//! gcc (`-DSAFETY`: the properties are assertions and end states), runs `./pan` and reads its
//! report. The sized configurations run in CI; `IDEMPOTENT_MODEL_FULL=1` checks the larger ones
//! (three workers, two relays), which take minutes.
//!
//! Spin and gcc are required: without them the test fails and says so (`apt-get install spin gcc`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The model's files, copied into each check's directory.
const MODEL: &str = "models/protocol.pml";

/// The deepest search any configuration needs is under a thousand steps; a search that reaches
/// this depth is truncated, which the check refuses.
const MAX_DEPTH: &str = "-m200000";

/// One run of Spin on the model.
struct Check {
    name: String,
    defines: Vec<String>,
    /// A mutant: the search must find a violation.
    mutant: bool,
    /// The full configurations' tens of millions of states are stored compressed (`-DCOLLAPSE`,
    /// lossless: the search stays exhaustive).
    full: bool,
}

/// What `pan` reported.
struct Report {
    errors: u64,
    states: String,
    transitions: String,
    depth: String,
    memory: String,
    took: Duration,
    output: String,
}

/// The configurations: `jobs` checks the job protocol (workers, broker, keep, forget, prune,
/// read-first) and `outbox` the relay against the runs of one key. The relay reads only committed
/// outbox rows and writes only outbox columns, which no step of a job reads, so the split loses no
/// interleaving a property depends on (see docs/model.md).
fn checks(full: bool) -> Vec<Check> {
    let (jobs, outbox): (&[&str], &[&str]) = if full {
        (
            &["-DNW=3", "-DNK=2", "-DNR=0", "-DMAXFAULT=2"],
            &["-DNW=2", "-DNK=1", "-DNR=2", "-DMAXFAULT=2"],
        )
    } else {
        (
            &["-DNW=2", "-DNK=2", "-DNR=0", "-DMAXFAULT=2"],
            &["-DNW=2", "-DNK=1", "-DNR=1", "-DMAXFAULT=2"],
        )
    };
    let with = |base: &[&str], extra: Option<&str>| -> Vec<String> {
        base.iter()
            .copied()
            .chain(extra)
            .map(str::to_owned)
            .collect()
    };
    let mut checks = vec![
        Check {
            name: "jobs".to_owned(),
            defines: with(jobs, None),
            mutant: false,
            full,
        },
        Check {
            name: "outbox".to_owned(),
            defines: with(outbox, None),
            mutant: false,
            full,
        },
    ];
    for (mutant, base) in [
        ("MUTANT_FORGET_BY_DIGEST", jobs),
        ("MUTANT_RENEW_WITHOUT_LOCK", jobs),
        ("MUTANT_READ_FIRST_STALE", jobs),
        ("MUTANT_CLAIM_OWN_TXN", jobs),
        ("MUTANT_MARK_BEFORE_SEND", outbox),
        ("MUTANT_TAKE_AT_LAST_ATTEMPT", outbox),
    ] {
        checks.push(Check {
            name: mutant.to_owned(),
            defines: with(base, Some(&format!("-D{mutant}"))),
            mutant: true,
            full,
        });
    }
    checks
}

/// Runs `program`, failing the test with what to install when it is missing.
fn run(program: &str, args: &[&str], dir: &Path) -> Output {
    match Command::new(program).args(args).current_dir(dir).output() {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!(
            "`{program}` is not installed, and the protocol model cannot be checked without it: \
             install Spin and gcc (`apt-get install spin gcc`)"
        ),
        Err(error) => panic!("running `{program}` failed: {error}"),
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The first whitespace-separated word of the line that contains `marker`, or of the text right
/// after it when `after` is set.
fn field(output: &str, marker: &str, after: bool) -> Option<String> {
    let line = output.lines().find(|line| line.contains(marker))?;
    let rest = match after {
        true => &line[line.find(marker)? + marker.len()..],
        false => line,
    };
    rest.split_whitespace()
        .next()
        .map(|word| word.trim_end_matches(',').to_owned())
}

/// A fresh directory under the system's temporary one.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idempotent-model-{}-{name}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("clearing an old scratch directory");
    }
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

fn verify(check: &Check, model: &Path) -> Report {
    let dir = scratch(&check.name);
    std::fs::copy(model, dir.join("protocol.pml")).expect("copying the model");
    let started = Instant::now();
    let mut spin_args: Vec<&str> = vec!["-a"];
    spin_args.extend(check.defines.iter().map(String::as_str));
    spin_args.push("protocol.pml");
    let spin = run("spin", &spin_args, &dir);
    assert!(
        spin.status.success() && dir.join("pan.c").exists(),
        "{}: spin -a failed:\n{}",
        check.name,
        text(&spin)
    );
    // A mutant's search stops at its first violation: compiling fast matters more than searching
    // fast there.
    let optimize = if check.mutant { "-O0" } else { "-O2" };
    let mut gcc_args = vec![optimize, "-DSAFETY", "-w", "-o", "pan", "pan.c"];
    if check.full {
        gcc_args.extend(["-DCOLLAPSE", "-DMEMLIM=8192"]);
    } else {
        gcc_args.push("-DMEMLIM=4096");
    }
    let gcc = run("gcc", &gcc_args, &dir);
    assert!(
        gcc.status.success(),
        "{}: compiling pan.c failed:\n{}",
        check.name,
        text(&gcc)
    );
    let pan = run("./pan", &[MAX_DEPTH], &dir);
    let output = text(&pan);
    let took = started.elapsed();
    let errors = field(&output, "errors:", true)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}: pan reported no error count:\n{output}", check.name));
    let report = Report {
        errors,
        states: field(&output, "states, stored", false).unwrap_or_default(),
        transitions: field(&output, "transitions (= stored+matched)", false).unwrap_or_default(),
        depth: field(&output, "depth reached", true).unwrap_or_default(),
        memory: field(&output, "total actual memory usage", false).unwrap_or_default(),
        took,
        output,
    };
    if check.mutant || report.errors == 0 {
        std::fs::remove_dir_all(&dir).ok();
    } else {
        // The real model's counterexample, for `spin -t -p <flags> protocol.pml` there.
        println!("{}: trail kept in {}", check.name, dir.display());
    }
    report
}

#[test]
fn protocol_model() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = root.join(MODEL);
    assert!(model.exists(), "the model is missing: {}", model.display());
    run("spin", &["-V"], root);
    run("gcc", &["--version"], root);

    let full = std::env::var_os("IDEMPOTENT_MODEL_FULL").is_some_and(|v| v == "1");
    let checks = checks(full);
    let reports: Vec<Mutex<Option<Report>>> = checks.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    // Two at a time: the real models' searches are the long ones, and run side by side.
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(check) = checks.get(i) else { break };
                    let report = verify(check, &model);
                    *reports[i].lock().expect("a report slot") = Some(report);
                }
            });
        }
    });

    let mut failures = Vec::new();
    println!(
        "{:<27} {:>6} {:>12} {:>12} {:>6} {:>9} {:>8}  flags",
        "check", "errors", "states", "transitions", "depth", "memory MB", "time"
    );
    for (check, report) in checks.iter().zip(reports) {
        let report = report
            .into_inner()
            .expect("a report slot")
            .expect("every check ran");
        println!(
            "{:<27} {:>6} {:>12} {:>12} {:>6} {:>9} {:>7.1}s  {}",
            check.name,
            report.errors,
            report.states,
            report.transitions,
            report.depth,
            report.memory,
            report.took.as_secs_f64(),
            check.defines.join(" ")
        );
        let truncated = report.output.contains("max search depth too small");
        let out_of_memory =
            report.output.contains("out of memory") || report.output.contains("reached -DMEMLIM");
        if check.mutant {
            if report.errors == 0 {
                failures.push(format!(
                    "{}: Spin found no violation in the mutant\n{}",
                    check.name, report.output
                ));
            } else if let Some(line) = report.output.lines().find(|l| l.contains("violated")) {
                println!("    {}", line.trim());
            }
        } else if report.errors != 0 || truncated || out_of_memory {
            failures.push(format!(
                "{}: the real model must hold every invariant over a complete search \
                 (errors: {}, depth truncated: {truncated}, out of memory: {out_of_memory})\n{}",
                check.name, report.errors, report.output
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
