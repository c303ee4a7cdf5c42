//! Figures the fault tests measure, for people as well as for assertions.

/// Prints a line of figures, and appends it to the file `IDEMPOTENT_FIGURES` names: passing tests'
/// output is captured, so `scripts/test` shows these lines after the run.
pub fn report(line: &str) {
    println!("{line}");
    if let Ok(path) = std::env::var("IDEMPOTENT_FIGURES") {
        use std::io::Write as _;
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
}
