//! In-flight limits: how many requests of one key run at once.
//!
//! # In-flight limits
//!
//! A rate says how often; some work needs a cap on how much runs *at once*: exports,
//! report builds, server-sent-event streams, anything whose cost is its duration.
//! [`InFlightLimitLayer`](crate::InFlightLimitLayer) admits at most `slots` requests of
//! one key at a time across every instance on the Redis, and holds each request's slot
//! until its response body ends (or fails, or is dropped with a client that went
//! away), so a stream counts for as long as it streams:
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, InFlightConfig, LimitLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let config = InFlightConfig::new(2).slot_ttl(Duration::from_secs(10));
//! let exports = LimitLayer::builder(&Backend::in_process(), config)
//!     .name("export")
//!     .key(HeaderKey::from_static("x-merchant-id"))
//!     .build()?;
//! # let _ = exports; Ok(()) }
//! ```
//!
//! On Redis a slot is a lease that the running request renews (one call per key every
//! third of a lease, however many slots the instance holds on it), so the slots of a
//! process killed mid-request come back within one lease, without a sweeper. A refusal
//! is a `429` with `Retry-After: 1` by default (when a slot frees cannot be foreseen;
//! [`retry_after`](crate::InFlightConfig::retry_after) changes it).
//! While Redis is out, the failure policy decides; the fallback gives each instance
//! its [share](crate::BackendBuilder::fallback_share) of the slots. Put an in-flight
//! limit next to a rate limit, not instead of one: it bounds concurrency, not volume.
//! The `tenants` example limits `GET /export` so; see the [`in_flight`](crate::in_flight)
//! module for the design and its costs (`benches/NOTES.md`).
