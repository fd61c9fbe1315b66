//! What every request passes first, routed or not: its id, its span and
//! log line, its metrics, and a panic caught into a 500.
//!
//! One middleware for what tower-http's `SetRequestId`,
//! `PropagateRequestId`, `Trace` and `CatchPanic` layers and a metrics
//! layer did as five: axum boxes each layer it is given as a route that
//! every request clones, `Trace` wraps and re-boxes every response body
//! to watch its frames, and the metrics' labels were allocated per
//! request. Together they took about a third of the no-database route's
//! CPU (BENCHMARKS.md §5). What each did is kept:
//!
//! - the id: the client's `x-request-id` if it sent one, else a random
//!   UUID, set on the request for the handler and on every response, a
//!   panic's included;
//! - the span `request` (method, matched route, request id) around the
//!   handler, so its log lines carry the id, and one `info` line `served`
//!   with status and latency; a 5xx is logged at `error` too. Headers and
//!   the raw URI, whose query may name private paths, are never logged;
//! - count and latency by method and route template ([`HttpMetrics::record`]);
//! - a panicking handler costs its request a 500, not the connection.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use futures_util::FutureExt as _;
use tracing::Instrument as _;

use crate::http::error;
use crate::metrics::HttpMetrics;

/// The header that carries a request's id, both ways.
pub const REQUEST_ID: &str = "x-request-id";

/// The middleware (for `axum::middleware::from_fn_with_state`, with the
/// service's HTTP metrics as its state).
pub async fn observe(
    State(metrics): State<Arc<HttpMetrics>>,
    mut req: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let id = match req.headers().get(REQUEST_ID) {
        Some(id) => id.clone(),
        None => {
            let id = random_id();
            req.headers_mut().insert(REQUEST_ID, id.clone());
            id
        }
    };
    let method = req.method().clone();
    let route = req.extensions().get::<MatchedPath>().cloned();
    let span = tracing::info_span!(
        "request",
        method = %method,
        route = route.as_ref().map_or("(no route)", MatchedPath::as_str),
        request_id = id.to_str().unwrap_or(""),
    );
    let mut response = AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .instrument(span.clone())
        .await
        .unwrap_or_else(|panic| span.in_scope(|| error::panic_response(panic)));
    let latency = start.elapsed();
    let status = response.status();
    span.in_scope(|| {
        let latency_ms = latency.as_secs_f64() * 1e3;
        tracing::info!(status = status.as_u16(), latency_ms, "served");
        if status.is_server_error() {
            tracing::error!(status = status.as_u16(), latency_ms, "response failed");
        }
    });
    metrics.record(&method, route, status, latency);
    response.headers_mut().entry(REQUEST_ID).or_insert(id);
    response
}

/// A request id as tower-http's `MakeRequestUuid` makes them (a random
/// UUID, version 4), from the thread's random generator: `MakeRequestUuid`
/// asks the kernel for 16 bytes per request, a system call that took about
/// 2% of the server's CPU on the no-database route (BENCHMARKS.md §5).
fn random_id() -> HeaderValue {
    // One `u128` draws 16 bytes of the generator's stream; an array of 16
    // `u8`s would draw 4 bytes for each.
    let id = uuid::Builder::from_random_bytes(rand::random::<u128>().to_le_bytes()).into_uuid();
    let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
    HeaderValue::from_str(id.hyphenated().encode_lower(&mut text))
        .expect("a hyphenated UUID is a valid header value")
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::middleware::from_fn_with_state;
    use axum::routing::get;
    use axum::Router;
    use prometheus_client::registry::Registry;
    use tower::ServiceExt as _;

    use super::*;

    /// A router with a route that answers and one that panics, behind
    /// `observe`, and the registry its metrics are in.
    fn app() -> (Router, Registry) {
        let metrics = HttpMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let router = Router::new()
            .route("/ok/{n}", get(|| async { "fine" }))
            .route(
                "/boom",
                get(|| async {
                    if true {
                        panic!("a bug");
                    }
                    "unreachable"
                }),
            )
            .layer(from_fn_with_state(Arc::new(metrics), observe));
        (router, registry)
    }

    async fn send(router: &Router, uri: &str, id: Option<&str>) -> Response {
        let mut req = Request::get(uri);
        if let Some(id) = id {
            req = req.header(REQUEST_ID, id);
        }
        router
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_panic_is_a_500_with_a_json_body_and_the_request_id() {
        let (router, registry) = app();
        let res = send(&router, "/boom", Some("client-7")).await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(res.headers()[REQUEST_ID], "client-7");
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "internal", "{body}");
        // The service goes on answering.
        let res = send(&router, "/ok/1", None).await;
        assert_eq!(res.status(), StatusCode::OK);
        let id = res.headers()[REQUEST_ID].to_str().unwrap();
        assert!(uuid::Uuid::parse_str(id).is_ok(), "a generated id: {id}");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"http_requests_total{method="GET",route="/boom",status="500"} 1"#,
            r#"http_requests_total{method="GET",route="/ok/{n}",status="200"} 1"#,
            r#"http_request_duration_seconds_count{method="GET",route="/ok/{n}"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn request_ids_are_distinct_random_uuids() {
        let ids: std::collections::HashSet<String> = (0..1000)
            .map(|_| {
                let text = random_id().to_str().unwrap().to_owned();
                let parsed = uuid::Uuid::parse_str(&text).expect("a UUID");
                assert_eq!(parsed.get_version(), Some(uuid::Version::Random), "{text}");
                assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122, "{text}");
                assert_eq!(
                    text,
                    parsed.hyphenated().to_string(),
                    "lowercase, hyphenated"
                );
                text
            })
            .collect();
        assert_eq!(ids.len(), 1000, "no repeats");
    }
}
