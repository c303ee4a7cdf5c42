//! Writes the crate's documentation pages: the README (the front page) and the guide's chapters
//! under `docs/` (the modules of `idempotent_jobs::guide`), each read by `src/lib.rs` with
//! `include_str!` from `OUT_DIR`.
//!
//! The same markdown files are read on GitHub and the registry, where links are relative paths and
//! images are files beside them. rustdoc can do neither, so the copies made here differ in two ways:
//!
//! * an image on a line of its own is inlined (an SVG as markup, a PNG as a `data:` URL), because
//!   rustdoc cannot serve a file from the package; an image the package does not ship (the
//!   benchmark's chart) becomes a link to it in the repository;
//! * a link to a chapter becomes an intra-doc link to its module (`docs/outbox.md#relay` ->
//!   `crate::guide::outbox#relay`), a link to the README a link to the crate's root, a link to the
//!   attribute's page one to the attribute, and a link to any other file of the repository an
//!   absolute link to it there. rustdoc checks the intra-doc links (CI denies broken ones).
//!
//! Code blocks are copied as they are: rustdoc compiles the Rust ones as doctests.

use std::path::{Path, PathBuf};

/// The guide's chapters: the file under `docs/` and the module of `idempotent_jobs::guide` that
/// shows it. `src/lib.rs` declares the same modules.
const CHAPTERS: &[(&str, &str)] = &[
    ("handlers-and-keys.md", "handlers_and_keys"),
    ("second-run.md", "second_run"),
    ("outbox.md", "outbox"),
    ("workers-and-brokers.md", "workers_and_brokers"),
    ("operating.md", "operating"),
    ("clusters.md", "clusters"),
    ("performance.md", "performance"),
    ("testing.md", "testing"),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    let repository = std::env::var("CARGO_PKG_REPOSITORY").unwrap_or_default();
    let pages = Pages {
        root: &manifest,
        repository: repository.trim_end_matches('/'),
    };

    let mut written = vec![("README.md".to_owned(), out.join("README-docs.md"))];
    for (file, _) in CHAPTERS {
        written.push((format!("docs/{file}"), out.join("guide").join(file)));
    }
    if let Err(error) = std::fs::create_dir_all(out.join("guide")) {
        println!("cargo:warning=could not create the guide's directory: {error}");
    }
    for (source, target) in written {
        println!("cargo:rerun-if-changed={source}");
        let text = std::fs::read_to_string(manifest.join(&source)).unwrap_or_default();
        // Always write the page, even empty: `include_str!` needs the file.
        if let Err(error) = std::fs::write(&target, pages.render(&text, &source)) {
            println!("cargo:warning=could not write the docs page for {source}: {error}");
        }
    }
    for image in [
        "docs/one-call.svg",
        "docs/dashboard.png",
        "docs/bench-jobs.svg",
    ] {
        println!("cargo:rerun-if-changed={image}");
    }
}

struct Pages<'a> {
    /// The package's directory: where the files links and images point at are looked for.
    root: &'a Path,
    /// The `repository` URL of the manifest, for links to files the package does not ship.
    repository: &'a str,
}

impl Pages<'_> {
    /// The rustdoc copy of the markdown file `source` (a path relative to the package's root).
    fn render(&self, text: &str, source: &str) -> String {
        let dir = source.rsplit_once('/').map_or("", |(dir, _)| dir);
        let mut in_code = false;
        let mut page = Vec::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                page.push(line.to_owned());
            } else if in_code {
                page.push(line.to_owned());
            } else if let Some(image) = self.image(line, dir) {
                page.push(image);
            } else {
                page.push(self.links(line, dir));
            }
        }
        let mut page = page.join("\n");
        page.push('\n');
        page
    }

    /// A line that is one image, `![alt](path)`, as rustdoc can show it.
    fn image(&self, line: &str, dir: &str) -> Option<String> {
        let rest = line.trim().strip_prefix("![")?;
        let (alt, rest) = rest.split_once("](")?;
        let target = rest.strip_suffix(')')?;
        if is_external(target) {
            return None;
        }
        let path = resolve(dir, target);
        let file = self.root.join(&path);
        // A blank line before and after keeps the markdown around the HTML intact.
        if path.ends_with(".svg")
            && let Ok(svg) = std::fs::read_to_string(&file)
        {
            return Some(format!("\n<div>\n{}</div>\n", svg.trim_end()));
        }
        if path.ends_with(".png")
            && let Ok(png) = std::fs::read(&file)
        {
            return Some(format!(
                "\n<img src=\"data:image/png;base64,{}\" alt=\"{}\">\n",
                base64(&png),
                alt.replace('"', "&quot;")
            ));
        }
        // Not in the package: link to it in the repository instead.
        Some(format!("[{alt}]({}/blob/main/{path})", self.repository))
    }

    /// `line` with each relative link rewritten for rustdoc.
    fn links(&self, line: &str, dir: &str) -> String {
        let mut out = String::with_capacity(line.len());
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let (before, after) = rest.split_at(at + 2);
            out.push_str(before);
            let Some(end) = after.find(')') else {
                rest = after;
                break;
            };
            let target = &after[..end];
            if is_external(target) || target.contains(' ') {
                out.push_str(target);
            } else {
                out.push_str(&self.link(dir, target));
            }
            rest = &after[end..];
        }
        out.push_str(rest);
        out
    }

    /// Where a relative link from a file in `dir` to `target` points in the docs.
    fn link(&self, dir: &str, target: &str) -> String {
        let (path, fragment) = match target.split_once('#') {
            Some((path, fragment)) => (path, format!("#{fragment}")),
            None => (target, String::new()),
        };
        let path = resolve(dir, path);
        if path == "README.md" {
            return format!("crate{fragment}");
        }
        if path == "docs/attribute.md" {
            return format!("macro@crate::idempotent_job{fragment}");
        }
        if let Some((_, module)) = CHAPTERS
            .iter()
            .find(|(file, _)| path.strip_prefix("docs/") == Some(file))
        {
            return format!("crate::guide::{module}{fragment}");
        }
        format!("{}/blob/main/{path}{fragment}", self.repository)
    }
}

/// Whether a link target is left as it is: a URL, an anchor on the same page, an intra-doc link.
fn is_external(target: &str) -> bool {
    target.is_empty()
        || target.starts_with('#')
        || target.contains("://")
        || target.starts_with("mailto:")
        || target.starts_with("data:")
        || target.starts_with("crate::")
}

/// `target` relative to `dir`, as a path from the package's root with `/` separators.
fn resolve(dir: &str, target: &str) -> String {
    let mut parts: Vec<&str> = dir.split('/').filter(|part| !part.is_empty()).collect();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

/// Standard base64 with padding, for `data:` URLs.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                text.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                text.push('=');
            }
        }
    }
    text
}
