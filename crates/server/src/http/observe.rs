//! What every request passes first, routed or not: its id, its span and
//! log line, its metrics, and a panic caught into a 500.
//!
//! One middleware for what tower-http's `SetRequestId`,
//! `PropagateRequestId`, `Trace` and `CatchPanic` layers and a metrics
//! layer did as five: axum boxes each layer it is given as a route that
//! every request clones, `Trace` wraps and re-boxes every response body
//! to watch its frames, and the metrics' labels were allocated per
//! request. Together they took about a third of the no-database route's
//! CPU (BENCHMARKS.md, "Over HTTP"). What each did is kept:
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

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::response::Response;
use tower::{Layer, Service};

use crate::http::error;
use crate::metrics::HttpMetrics;

/// The header that carries a request's id, both ways.
pub const REQUEST_ID: &str = "x-request-id";

/// [`REQUEST_ID`] as a header name: a `&str` key is checked and lowered
/// byte by byte on every lookup, twice per request.
const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static(REQUEST_ID);

/// The layer, with the service's HTTP metrics.
///
/// A hand-written [`Service`] rather than `axum::middleware::from_fn`:
/// `from_fn` clones the route inside it on every request (a boxed
/// service, so an allocation and a copy of everything below it), boxes it
/// again as `Next`, and boxes its future. Routes are always ready, so this
/// one calls the route it wraps directly and returns an unboxed future
/// (BENCHMARKS.md, "Over HTTP").
#[derive(Debug, Clone)]
pub struct ObserveLayer {
    metrics: Arc<HttpMetrics>,
}

impl ObserveLayer {
    /// Records into `metrics`.
    pub fn new(metrics: Arc<HttpMetrics>) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            metrics: Arc::clone(&self.metrics),
        }
    }
}

/// `S` observed: see the module's documentation.
#[derive(Debug, Clone)]
pub struct Observe<S> {
    inner: S,
    metrics: Arc<HttpMetrics>,
}

impl<S> Service<Request> for Observe<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Observed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let start = Instant::now();
        let id = match req.headers().get(&REQUEST_ID_HEADER) {
            Some(id) => id.clone(),
            None => {
                let id = random_id();
                req.headers_mut().insert(REQUEST_ID_HEADER, id.clone());
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
        // A route's `call` only starts its work, and its future does the
        // rest; a panic in either is caught.
        let called =
            span.in_scope(|| std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req))));
        let (inner, panicked) = match called {
            Ok(inner) => (Some(inner), None),
            Err(panic) => (None, Some(panic)),
        };
        Observed {
            inner,
            panicked,
            record: Some(Record {
                start,
                id,
                method,
                route,
                span,
                metrics: Arc::clone(&self.metrics),
            }),
        }
    }
}

/// What is recorded once the response is ready.
struct Record {
    start: Instant,
    id: HeaderValue,
    method: Method,
    route: Option<MatchedPath>,
    span: tracing::Span,
    metrics: Arc<HttpMetrics>,
}

impl Record {
    fn finish(self, mut response: Response) -> Response {
        let latency = self.start.elapsed();
        let status = response.status();
        self.span.in_scope(|| {
            // A quotient of integers, so the line reads `0.003757`, not the
            // `0.0037570000000000004` of seconds times 1e3.
            let latency_ms = latency.as_nanos() as f64 / 1e6;
            tracing::info!(status = status.as_u16(), latency_ms, "served");
            if status.is_server_error() {
                tracing::error!(status = status.as_u16(), latency_ms, "response failed");
            }
        });
        self.metrics
            .record(&self.method, self.route, status, latency);
        response
            .headers_mut()
            .entry(REQUEST_ID_HEADER)
            .or_insert(self.id);
        response
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Observe`]: the route's future, polled in
    /// the request's span with panics caught, then recorded.
    pub struct Observed<F> {
        #[pin]
        inner: Option<F>,
        // A panic of the route's `call`, answered at the first poll.
        panicked: Option<Box<dyn std::any::Any + Send>>,
        // Taken once the inner future is finished (or has panicked), so
        // that it is never polled again.
        record: Option<Record>,
    }
}

impl<F> Future for Observed<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let record = this
            .record
            .as_ref()
            .expect("an Observed future polled after it finished");
        let polled = match this.inner.as_pin_mut() {
            Some(inner) => {
                let _entered = record.span.enter();
                std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx)))
            }
            None => Err(this
                .panicked
                .take()
                .expect("without a route future there is the panic of its call")),
        };
        let response = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(Ok(response))) => response,
            Ok(Poll::Ready(Err(never))) => match never {},
            Err(panic) => record.span.in_scope(|| error::panic_response(panic)),
        };
        let record = this.record.take().expect("checked above");
        Poll::Ready(Ok(record.finish(response)))
    }
}

/// A request id as tower-http's `MakeRequestUuid` makes them (a random
/// UUID, version 4), from the thread's random generator: `MakeRequestUuid`
/// asks the kernel for 16 bytes per request, a system call that took about
/// 2% of the server's CPU on the no-database route (BENCHMARKS.md, "Over HTTP").
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
            .layer(ObserveLayer::new(Arc::new(metrics)));
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

    #[tokio::test]
    async fn a_panic_in_a_services_call_is_a_500_too() {
        // Routes only start their work in `call`, but a service that does
        // work there must not take the connection down either.
        let service = tower::service_fn(
            |_: Request| -> std::future::Ready<Result<Response, Infallible>> { panic!("in call") },
        );
        let mut observed = ObserveLayer::new(Arc::new(HttpMetrics::default())).layer(service);
        let req = Request::get("/x")
            .header(REQUEST_ID, "client-8")
            .body(Body::empty())
            .unwrap();
        let res = observed.call(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(res.headers()[REQUEST_ID], "client-8");
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
