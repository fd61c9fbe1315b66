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

/// The module path of `file` under `src` (`batcher/handle.rs` is
/// `["batcher", "handle"]`; a `mod.rs`, `lib.rs` or `main.rs` is its
/// folder's).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The file a module path names, the longest prefix that is one: a file
/// of its own, not a folder's `mod.rs` (a folder's re-exports name no
/// file of their own).
fn file_of(src: &Path, path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let file = src.join(path[..n].join("/")).with_extension("rs");
        file.is_file().then_some(file)
    })
}

/// The module paths `code` names through `crate::`, `super::` and
/// `self::`, in `use` items (groups expanded) and in paths, as seen from
/// module `module` (a file of its own, not a folder's `mod.rs`).
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let parent: Vec<String> = module[..module.len().saturating_sub(1)].to_vec();
    let mut paths = Vec::new();
    let expand = |prefix: Vec<String>, rest: &str, paths: &mut Vec<Vec<String>>| {
        let mut path = prefix;
        for part in rest.split("::") {
            let word: String = part
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if word.is_empty() {
                break;
            }
            path.push(word);
        }
        paths.push(path);
    };
    // `use a::{b, c::d}`: each member with the group's prefix.
    for item in code.split(';') {
        let Some(at) = item.find("use ") else {
            continue;
        };
        let item = item[at + 4..].split_whitespace().collect::<String>();
        let Some(open) = item.find("::{") else {
            continue;
        };
        let prefix = &item[..open];
        let members = item[open + 3..].trim_end_matches('}');
        for member in members.split(',') {
            let full = format!("{prefix}::{member}");
            if let Some(rest) = full.strip_prefix("crate::") {
                expand(Vec::new(), rest, &mut paths);
            } else if let Some(rest) = full.strip_prefix("super::") {
                expand(parent.clone(), rest, &mut paths);
            }
        }
    }
    for (root, base) in [
        ("crate::", Vec::new()),
        ("super::", parent.clone()),
        ("self::", module.to_vec()),
    ] {
        for (at, _) in code.match_indices(root) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            expand(base.clone(), &code[at + root.len()..], &mut paths);
        }
    }
    paths
}

/// Every import circle between the source files under `src`, as the
/// files around it.
fn import_circles(src: &Path) -> Vec<Vec<PathBuf>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let aggregates = |f: &Path| {
        matches!(
            f.file_name().and_then(|n| n.to_str()),
            Some("mod.rs" | "lib.rs" | "main.rs")
        )
    };
    let mut edges: Vec<(PathBuf, Vec<PathBuf>)> = Vec::new();
    for file in &files {
        if aggregates(file) {
            continue;
        }
        let module = module_of(src, file);
        let text = fs::read_to_string(file).unwrap();
        // Tests may use anything of the module they test.
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut targets: Vec<PathBuf> = named_paths(&code, &module)
            .iter()
            .filter_map(|path| file_of(src, path))
            .filter(|target| target != file && !aggregates(target))
            .collect();
        targets.sort();
        targets.dedup();
        edges.push((file.clone(), targets));
    }
    let next = |f: &PathBuf| {
        edges
            .iter()
            .find(|(from, _)| from == f)
            .map_or(&[][..], |(_, to)| to.as_slice())
    };
    let mut circles = Vec::new();
    for (start, _) in &edges {
        // Depth-first from each file, reporting a path back to it.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = vec![start.clone()];
        while let Some((at, path)) = stack.pop() {
            for to in next(&at) {
                if to == start {
                    let mut circle = path.clone();
                    circle.push(start.clone());
                    circles.push(circle);
                } else if !seen.contains(to) {
                    seen.push(to.clone());
                    let mut longer = path.clone();
                    longer.push(to.clone());
                    stack.push((to.clone(), longer));
                }
            }
        }
    }
    circles
}

/// No source file, in the server or the crate it is built on, imports a
/// file that imports it back, however far round: a module and the one it
/// uses can then each be read, and changed, without the other.
#[test]
fn no_source_file_imports_a_file_that_imports_it_back() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in [manifest.join("src"), manifest.join("../batcher/src")] {
        let circles = import_circles(&src);
        let shown: Vec<String> = circles
            .iter()
            .map(|c| {
                c.iter()
                    .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
                    .collect::<Vec<_>>()
                    .join(" -> ")
            })
            .collect();
        assert!(shown.is_empty(), "{}:\n{}", src.display(), shown.join("\n"));
    }
}

#[test]
fn the_circle_checker_finds_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(src.join("lib.rs"), "mod a;\nmod c;\n").unwrap();
    fs::write(src.join("a/mod.rs"), "mod b;\n").unwrap();
    fs::write(src.join("a/b.rs"), "use crate::c::Thing;\n").unwrap();
    fs::write(
        src.join("c.rs"),
        "// use crate::a::b::X; (a comment names nothing)\nfn f() { crate::a::b::g() }\n",
    )
    .unwrap();
    let circles = import_circles(&src);
    assert_eq!(circles.len(), 2, "{circles:?}");
    fs::write(src.join("c.rs"), "// crate::a::b::g()\n").unwrap();
    assert!(import_circles(&src).is_empty());
}
