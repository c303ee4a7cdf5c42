//! Writes the crate's front page: the README, with its diagram inlined. On GitHub and the registry
//! the README shows `docs/one-call.svg` as an image; rustdoc cannot serve an image file from the
//! package, so the docs get the same SVG inline, and render it on docs.rs too.

use std::path::Path;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let out = std::env::var("OUT_DIR").unwrap_or_default();
    let dir = Path::new(&manifest);
    println!("cargo:rerun-if-changed=README.md");
    println!("cargo:rerun-if-changed=docs/one-call.svg");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap_or_default();
    let svg = std::fs::read_to_string(dir.join("docs/one-call.svg")).unwrap_or_default();
    let page: String = readme
        .lines()
        .map(|line| {
            if line.starts_with("![") && line.contains("docs/one-call.svg") && !svg.is_empty() {
                // A blank line before and after keeps the markdown around it intact.
                format!("\n<div>\n{}</div>\n", svg.trim_end())
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    if let Err(error) = std::fs::write(Path::new(&out).join("README-docs.md"), page) {
        println!("cargo:warning=could not write the docs' front page: {error}");
    }
}
