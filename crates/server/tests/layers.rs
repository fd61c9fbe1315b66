//! The server's subsystems import one way: a module uses only the folders
//! below its own in the crate's layer map (`lib.rs`), so a stray `use`
//! that would tie two subsystems into a circle fails here, not in review.
//! Doc comments may point anywhere; only code is checked.

use std::fs;
use std::path::{Path, PathBuf};

/// Top to bottom, as in `lib.rs`'s layer map: each may import from itself
/// and from what follows it. `model` (the data the service hands out) is
/// last: every layer may use it, and it imports nothing of the crate.
const LAYERS: &[&str] = &[
    "lib", "testing", "http", "service", "metrics", "domain", "cluster", "db", "cli", "settings",
    "logs", "model",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The layer a file belongs to: its top folder, or its own name at the top.
fn layer_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    Path::new(first)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The top-level modules `line`'s code names through `crate::`.
fn crate_paths(line: &str) -> Vec<&str> {
    line.match_indices("crate::")
        .filter(|(at, _)| {
            // `pgbatch_crate::` or a path inside a word is not ours.
            !line[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(at, m)| {
            let rest = &line[at + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

#[test]
fn subsystems_import_only_the_layers_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let rank = |layer: &str| LAYERS.iter().position(|l| *l == layer);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in &files {
        let layer = layer_of(&src, file);
        if layer == "main" {
            continue; // the binary uses the crate from outside, as `server::`
        }
        let Some(own) = rank(&layer) else {
            wrong.push(format!(
                "{}: `{layer}` is not in this test's LAYERS (nor lib.rs's map?)",
                file.display()
            ));
            continue;
        };
        for (n, line) in fs::read_to_string(file).unwrap().lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for target in crate_paths(line) {
                checked += 1;
                match rank(target) {
                    Some(t) if t >= own => {}
                    // Re-exports at the root (`crate::AppState`) belong to `lib`.
                    _ if target.chars().next().is_some_and(char::is_uppercase) => {
                        if own != 0 {
                            wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                        }
                    }
                    _ => wrong.push(format!("{}:{}: {}", file.display(), n + 1, line.trim())),
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} crate paths found: is src/ there?"
    );
    assert!(
        wrong.is_empty(),
        "imports against the layer map:\n{}",
        wrong.join("\n")
    );
}

/// The code lines (comments left out) of the files under `src/<folder>`
/// naming any of `words`, as `path:line: text`.
fn code_naming(folder: &str, words: &[&str]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join(folder), &mut files);
    assert!(!files.is_empty(), "no files under src/{folder}");
    let mut found = Vec::new();
    for file in &files {
        for (n, line) in fs::read_to_string(file).unwrap().lines().enumerate() {
            if !line.trim_start().starts_with("//") && words.iter().any(|w| line.contains(w)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn the_model_is_the_bottom_layer() {
    assert_eq!(LAYERS.last(), Some(&"model"));
    let upward: Vec<String> = code_naming("model", &["crate::"])
        .into_iter()
        .filter(|line| crate_paths(line).iter().any(|target| *target != "model"))
        .collect();
    assert!(
        upward.is_empty(),
        "model imports nothing of the crate:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_database_names_no_http_or_openapi_type() {
    let found = code_naming(
        "db",
        &["utoipa", "axum", "hyper", "Serialize", "crate::http"],
    );
    assert!(
        found.is_empty(),
        "wire types belong in `model`, routes in `http`:\n{}",
        found.join("\n")
    );
}

#[test]
fn handlers_do_not_reach_for_queries() {
    let found = code_naming("http", &["db::queries"]);
    assert!(
        found.is_empty(),
        "a handler goes through `domain`, and answers with `model`'s types:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_sees_an_upward_import() {
    assert_eq!(crate_paths("use crate::http::error::AppError;"), ["http"]);
    assert_eq!(
        crate_paths("let x = crate::db::pool(crate::settings::X);"),
        ["db", "settings"]
    );
    assert!(crate_paths("use pgbatch_crate::x;").is_empty());
    assert_eq!(
        crate_paths("use crate::model::objects::ObjectKey;"),
        ["model"]
    );
}
