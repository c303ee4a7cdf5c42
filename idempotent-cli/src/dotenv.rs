//! `.env`: the `DATABASE_URL` (and anything else) of the project the operator stands in, as
//! diesel_cli and sqlx-cli read it.
//!
//! The nearest `.env` in the working directory or a parent is read before the command line, so that
//! a variable already set in the environment wins over it, and `-D`/`--database-url` over both. A
//! file that does not parse is ignored whole, with a warning that names the entry but never quotes
//! it (the line may hold a password).

use std::path::{Path, PathBuf};

/// Loads the nearest `.env`; returns a warning to print when one was found but not loaded.
pub fn load() -> Option<String> {
    let path = find()?;
    // Every entry checked first: none can make the loader's `set_var` panic (and quote its value).
    if let Err(why) = check(&path) {
        return Some(warning(&path, &why));
    }
    dotenvy::from_path(&path)
        .err()
        .map(|error| warning(&path, &describe(&error)))
}

/// The `.env` in the working directory or its nearest parent that has one.
fn find() -> Option<PathBuf> {
    let dir = std::env::current_dir().ok()?;
    dir.ancestors()
        .map(|dir| dir.join(".env"))
        .find(|path| path.is_file())
}

/// Reads the whole file without loading it: `Err` says which entry does not
/// parse or cannot be an environment variable (an empty name, `=` in the name, a NUL byte: the
/// environment cannot hold them, and setting one would panic with its value in the message).
fn check(path: &Path) -> Result<(), String> {
    let entries = dotenvy::from_path_iter(path).map_err(|error| describe(&error))?;
    for (index, entry) in entries.enumerate() {
        let (name, value) =
            entry.map_err(|error| format!("entry {}: {}", index + 1, describe(&error)))?;
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return Err(format!(
                "entry {}: its name is empty or holds '=' or a NUL byte, or its value holds a NUL byte, which no environment variable can (the entry is not shown: it may hold a password)",
                index + 1
            ));
        }
    }
    Ok(())
}

/// What went wrong, without the line's text.
fn describe(error: &dotenvy::Error) -> String {
    match error {
        dotenvy::Error::LineParse(_, _) => {
            "it is not NAME=VALUE, or a quote is not closed (the line is not shown: it may hold a password)"
                .to_owned()
        }
        dotenvy::Error::Io(error) => error.to_string(),
        dotenvy::Error::EnvVar(error) => error.to_string(),
        _ => "it cannot be read".to_owned(),
    }
}

/// The warning for a `.env` that was not loaded.
fn warning(path: &Path, why: &str) -> String {
    format!(
        "warning: ignored {}, none of its variables were set: {why}",
        path.display()
    )
}
