//! The Grafana dashboard in `deploy/grafana/` queries only metrics the
//! server exports, by the names a scrape shows.

use crate::support;

use std::collections::BTreeSet;

use crate::support::{get, post_json, read_path, send, setup, stat_uri};
use axum::http::StatusCode;
use server::db::seed::object_path;
use server::settings::ReadPath;

const DASHBOARD: &str = include_str!("../../../../deploy/grafana/pgbatch-server.json");

/// PromQL words that are not metric names: modifiers, set operators, and
/// aggregations (which may come before their `by (...)`, not a `(`).
const KEYWORDS: [&str; 22] = [
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
];

/// The metric names a PromQL expression selects: identifiers outside
/// label matchers, strings and ranges that are neither functions nor
/// keywords (and not the label lists after `by` and the like).
fn metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    i += 1;
                }
                i += 1;
            }
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += 1;
                }
                i += 1;
            }
            '(' if skip_group => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                skip_group = false;
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|c| !c.is_whitespace());
                if KEYWORDS.contains(&word.as_str()) {
                    skip_group = matches!(word.as_str(), "by" | "without" | "on" | "ignoring");
                } else if next != Some(&'(') && !word.starts_with("$__") {
                    names.push(word);
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                // A number, with an exponent such as 1e9.
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn the_promql_reader_finds_metric_names_only() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{job=~"$job"}[$__rate_interval]))) / b / 1e9"#
        ),
        ["a_bucket", "b"]
    );
}

/// Every expression and query in the dashboard.
fn queries(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            out.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] == "query" {
            // `label_values(selector, label)`: the label is no metric.
            let query = variable["query"].as_str().unwrap();
            let selector = query
                .strip_prefix("label_values(")
                .and_then(|args| Some(&args[..args.rfind(',')?]))
                .unwrap_or(query);
            out.push(selector.to_owned());
        }
    }
    out
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("valid JSON");
    let wanted: BTreeSet<String> = queries(&dashboard)
        .iter()
        .flat_map(|q| metric_names(q))
        .collect();
    assert!(wanted.len() >= 20, "read the dashboard: {wanted:?}");

    let app = setup(&read_path(ReadPath::Cached)).await;
    // Traffic, so that families with labels have samples.
    assert_eq!(
        send(&app.router, get(&stat_uri("demo", &object_path(1))))
            .await
            .0,
        StatusCode::OK
    );
    let body = r#"{"paths": ["no/such/a", "no/such/b"]}"#;
    let uri = "/api/v1/repositories/demo/objects/stat";
    assert_eq!(
        send(&app.router, post_json(uri, body)).await.0,
        StatusCode::OK
    );
    let text = support::metrics_text(&app.router).await;
    let exported: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l[..l.find(['{', ' ']).unwrap()].to_owned())
        .collect();
    let missing: Vec<_> = wanted.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "queried, not exported: {missing:?}\n{text}"
    );
    // The two absent paths exist in a repository: the LEFT JOIN answers
    // them, and they still count as not found.
    assert!(
        text.contains(r#"batcher_not_found_total{batcher="object_stat"} 2"#),
        "{text}"
    );
}
