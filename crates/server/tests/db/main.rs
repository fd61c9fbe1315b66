//! The database layer against real servers: attaching, migrations, poolers, seeding, TLS.
//!
//! One test binary per folder, each file a module: every binary is a link
//! of the whole server on 2 cores, so fewer binaries build faster.

#[path = "../support/mod.rs"]
mod support;

mod attach;
mod migrations;
mod pooler;
mod seed;
mod tls;
