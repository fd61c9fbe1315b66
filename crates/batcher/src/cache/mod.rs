//! A coalescing TTL cache in front of any async loader, in particular a
//! [`Batcher`](crate::Batcher).
//!
//! - **One load per key at a time.** Concurrent misses for a key share one
//!   load, and every caller gets its result.
//!   - Over a [`Batcher`](crate::Batcher)
//!     ([`build_with_batcher`](CacheBuilder::build_with_batcher)), the
//!     batcher's worker, which already knows every running load, joins a
//!     miss to its key's load, and the load's own task fills the cache
//!     from the batch's result before the callers are answered. A miss
//!     then costs a stamp and a channel send, not a map entry, a lock and
//!     a shared future of its own.
//!   - Over any other loader ([`build`](CacheBuilder::build)), every
//!     waiting caller polls the shared load, so whichever runs drives it;
//!     a caller that gives up (an HTTP client disconnecting) hands it to a
//!     task of its own, so it cannot make the others fail, retry or hang.
//!     moka's own `get_with` runs the load inside the first caller's
//!     future alone, which is that hazard (moka issues #59 and #240), so
//!     the coalescing is done here and moka only stores.
//! - **Jittered expiry.** Each entry lives its TTL plus a random part of
//!   the jitter, so entries loaded together, or by several instances after a
//!   deploy, do not all expire at the same moment.
//! - **Errors are not cached.** "Not found" is cached only with a
//!   [`negative_ttl`](CacheBuilder::negative_ttl).
//! - **Invalidation wins over running loads.** After
//!   [`invalidate`](Cache::invalidate) returns, no load that started
//!   before it can put its (possibly stale) value into the cache, and no
//!   later miss joins such a load. Each miss carries its key's
//!   invalidation epoch (`epochs`), and a value is stored only while that
//!   epoch is still current.
//! - **Bounded.** Capacity by entry count or by weight, with moka's
//!   TinyLFU eviction.
//! - **Admission.** By default ([`Admission::SecondMiss`]) a key's value
//!   is stored from its second miss on, so keys read once (but for the
//!   doorkeeper's few false positives) never reach moka.
//!
//! # Modules
//!
//! A module uses only those listed below it (`Cache::builder` is defined
//! in `builder`, so `handle` does not name `CacheBuilder`; the two ways to
//! load a miss, `fill` and `flights`, share only `shared`). From the rest
//! of the crate: the
//! engine's handle and fill hooks (`crate::batcher`: `Stamp`, `Fill`,
//! `FillFn`, `Filled`), and the crate's errors.
//!
//! - `builder`: `CacheBuilder`, validation, and the two ways to build
//!   (over a batcher, or over any loader).
//! - `expiry`: the jittered TTL as moka's `Expiry` over `shared`'s
//!   stored entries.
//! - `handle`: `Cache`: hits, where a miss goes, `insert` and
//!   invalidation, stats.
//! - `fill`: misses over a batcher: `FillFrom`, through which the
//!   batcher's loads fill the store.
//! - `flights`: misses over any other loader: one shared load per key.
//! - `shared`: `Inner`, what the handle and both strategies share: the
//!   store and its entries, the flights' map, the counters, and the
//!   checked put that fills the store.
//! - `epochs`: the striped invalidation counters that stamp each miss.
//! - `accepted`: the scopes whose loads the database accepted lately,
//!   the only ones served a value shared by every scope.
//! - `admission`: `Admission` and the second-miss doorkeeper.

mod accepted;
mod admission;
mod builder;
mod epochs;
mod expiry;
mod fill;
mod flights;
mod handle;
mod shared;
mod slot;

pub use admission::Admission;
pub use builder::CacheBuilder;
pub use handle::{Cache, CacheStats};
