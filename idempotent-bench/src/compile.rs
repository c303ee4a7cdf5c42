//! Rebuild time of a crate of 100 handlers with the attribute, and of the same without it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::stats::median;

#[derive(Debug, Serialize)]
pub struct CompileTime {
    pub handlers: usize,
    /// Median seconds to rebuild the crate, by variant.
    pub with_attribute_seconds: f64,
    pub without_attribute_seconds: f64,
    pub ratio: f64,
}

/// Rebuild time of a crate of 100 handlers with the attribute, and of the same without it.
pub fn measure(workspace: &Path, out: &Path) -> Option<CompileTime> {
    const HANDLERS: usize = 100;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let target = out.join("compile-target");
    let mut seconds = BTreeMap::new();
    for with in [true, false] {
        let dir = out.join(if with {
            "compile-with"
        } else {
            "compile-without"
        });
        std::fs::create_dir_all(dir.join("src")).ok()?;
        std::fs::write(
            dir.join("Cargo.toml"),
            format!(
                "[package]\nname = \"handlers-{}\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\n[dependencies]\nidempotent-jobs = {{ path = {:?} }}\ndiesel = {{ version = \"2.3\", default-features = false, features = [\"sqlite\"] }}\n\n[workspace]\n",
                if with { "with" } else { "without" },
                workspace.display().to_string()
            ),
        )
        .ok()?;
        let mut source = String::from("use diesel::SqliteConnection;\n\n");
        for i in 0..HANDLERS {
            if with {
                let _ = writeln!(
                    source,
                    "#[idempotent_jobs::idempotent_job(key = \"job{i}:<id>\")]"
                );
            }
            let _ = writeln!(
                source,
                "pub fn job_{i}(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {{\n    let _ = conn;\n    Ok(id + {i})\n}}\n"
            );
        }
        let lib = dir.join("src").join("lib.rs");
        let build = |source: &str| -> Option<f64> {
            std::fs::write(&lib, source).ok()?;
            let started = Instant::now();
            let status = std::process::Command::new(&cargo)
                .args(["build", "--offline", "--quiet"])
                .current_dir(&dir)
                .env("CARGO_TARGET_DIR", &target)
                .status()
                .ok()?;
            status.success().then(|| started.elapsed().as_secs_f64())
        };
        build(&source)?; // dependencies, once
        let mut rebuilds = Vec::new();
        for n in 0..3 {
            rebuilds.push(build(&format!("{source}\n// rebuild {n}\n"))?);
        }
        seconds.insert(with, median(rebuilds));
    }
    Some(CompileTime {
        handlers: HANDLERS,
        with_attribute_seconds: seconds[&true],
        without_attribute_seconds: seconds[&false],
        ratio: seconds[&true] / seconds[&false],
    })
}
