//! The HTTP API end to end: answers under faults, the API, the edge, hardening, lakeFS compatibility, OpenAPI, overload.
//!
//! One test binary per folder, each file a module: every binary is a link
//! of the whole server on 2 cores, so fewer binaries build faster.

#[path = "../support/mod.rs"]
mod support;

mod answers;
mod api;
mod edge;
mod hardening;
mod lakefs;
mod lakefs_clients;
mod openapi;
mod openapi_fuzz;
mod overload;
