//! HTTP requests' metrics: count by method, route template and status,
//! latency by method and route; labels that borrow the router's
//! `MatchedPath`, so nothing is allocated per request.

use std::time::Duration;

use axum::extract::MatchedPath;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    route: RouteLabel,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: &'static str,
    route: RouteLabel,
}

/// A route template as a label value: the router's own shared string, so
/// a request's labels are built without allocating.
#[derive(Debug, Clone)]
struct RouteLabel(Option<MatchedPath>);

impl RouteLabel {
    fn as_str(&self) -> &str {
        self.0.as_ref().map_or("unmatched", MatchedPath::as_str)
    }
}

impl PartialEq for RouteLabel {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for RouteLabel {}

impl std::hash::Hash for RouteLabel {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl EncodeLabelValue for RouteLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// HTTP requests: their count by method, route and status, and their
/// latency by method and route.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(|| {
                // 50 µs to about 3.3 s.
                Histogram::new(exponential_buckets(0.000_05, 2.0, 17))
            }),
        }
    }
}

impl HttpMetrics {
    /// Adds these metrics to `registry` (as `http_requests` and
    /// `http_request_duration_seconds`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "http_requests",
            "HTTP requests by method, route and status",
            self.requests.clone(),
        );
        registry.register_with_unit(
            "http_request_duration",
            "HTTP request latency by method and route",
            Unit::Seconds,
            self.latency.clone(),
        );
    }

    /// Counts a request and its latency under its route template
    /// (`/api/v1/kv/{pk}`, not the raw path, to bound cardinality;
    /// `unmatched` when no route matched).
    pub fn record(
        &self,
        method: &axum::http::Method,
        route: Option<MatchedPath>,
        status: axum::http::StatusCode,
        latency: Duration,
    ) {
        let method = method_label(method);
        let route = RouteLabel(route);
        self.requests
            .get_or_create(&RequestLabels {
                method,
                route: route.clone(),
                status: status.as_u16(),
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels { method, route })
            .observe(latency.as_secs_f64());
    }
}

/// The method as a label. Clients may send any token as a method; naming
/// only the standard ones keeps a client from creating label sets (and
/// memory) without bound.
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}
