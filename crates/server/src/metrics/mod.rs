//! Prometheus metrics: HTTP requests by route and status (recorded by
//! [`crate::http::observe`]), and, read at
//! scrape time, the batchers' statistics and the connection pool's usage.
//!
//! The registry belongs to the application state (no global recorder), so
//! several apps in one process (tests) keep separate counts.
//!
//! Imports from `domain` and `cluster` (whose statistics it reads at
//! scrape time) only; `http::observe` records into its `HttpMetrics`, and
//! `service` owns the registry.

//!
//! `http` holds the request metrics, `collector` what is read at scrape
//! time, `process` the `process_*` metrics from `/proc`.

mod collector;
mod http;
pub mod process;

use std::sync::Arc;

use pgbatch::pg::Pool;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::cluster::coherence::Coherence;
use crate::cluster::replicas::ReadRouter;
use crate::domain::auth::Authenticator;
use crate::domain::reads::Reads;
use crate::domain::writes::Writes;

use self::collector::ServiceCollector;
pub use self::http::HttpMetrics;

/// The service's metrics registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    http: Arc<HttpMetrics>,
}

impl Metrics {
    /// A registry with the HTTP metrics and a collector reading, on each
    /// scrape, the batchers and caches of `reads`, `writes` and `auth`, and
    /// `pool`'s usage.
    pub fn new(
        reads: Reads,
        writes: Writes,
        auth: Authenticator,
        pool: Pool,
        coherence: Coherence,
        router: ReadRouter,
    ) -> Self {
        let mut registry = Registry::default();
        let http = HttpMetrics::default();
        http.register(&mut registry);
        // An OpenMetrics info metric: exported as `pgbatch_build_info`.
        registry.register(
            "pgbatch_build",
            "The running build, labelled with its version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        registry.register_collector(Box::new(process::ProcessCollector));
        registry.register_collector(Box::new(ServiceCollector {
            reads,
            writes,
            auth,
            pool,
            coherence,
            router,
        }));
        Self {
            registry,
            http: Arc::new(http),
        }
    }

    /// The metrics in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// The HTTP requests' metrics, for [`crate::http::observe`] to record into.
    pub fn http(&self) -> Arc<HttpMetrics> {
        Arc::clone(&self.http)
    }
}
