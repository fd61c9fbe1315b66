//! The HTTP handlers, one module per resource. Each handler starts with
//! what it needs through extractors ([`crate::http::extract`]) and keeps its
//! request and response bodies beside it.

pub(crate) mod fallback;
pub(crate) mod health;
pub(crate) mod kv;
pub(crate) mod lakefs;
pub(crate) mod metrics;
pub(crate) mod objects;
pub(crate) mod repositories;
pub(crate) mod user;
