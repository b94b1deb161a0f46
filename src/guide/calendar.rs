//! Calendar windows: a local day, week or month of an IANA time zone.
//!
//! # Calendar windows
//!
//! Quotas are sold per day in the customer's zone and per month on a plan, and a fixed
//! period gets both wrong: a day in `America/New_York` lasts 23 hours on 2026-03-08 and
//! 25 on 2026-11-01, a month 28 to 31 days. A [`Calendar`](crate::Calendar)
//! window is a local day, week (from the weekday you choose) or month in an IANA zone,
//! from local midnight to local midnight whatever the zone's offset does in between;
//! `RateLimit` and `Retry-After` count to its true end. The zone's name is checked when
//! the layer is built (an unknown zone is a `ConfigError` naming it). Check a zone's rules
//! with `cargo run --example calendar -- day America/New_York 2026-03-08` (the window's
//! start and end in UTC, and its 23 hours).
//!
//! 10 000 requests per month per merchant, months in UTC:
//!
//! ```
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, Calendar, LimitLayer, PeriodConfig};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let config = PeriodConfig::calendar(10_000, Calendar::month("UTC"));
//! let monthly = LimitLayer::builder(&Backend::in_process(), config)
//!     .name("monthly")
//!     .key(HeaderKey::from_static("x-merchant-id"))
//!     .build()?;
//! # let _ = monthly; Ok(()) }
//! ```
//!
//! 5 SMS codes per phone per day in the customer's zone: one plan per zone you serve
//! ([`Plans`](crate::Plans)), picked from the zone your authentication layer found (here
//! a header); a request from a zone not listed falls under the first plan. Each plan is
//! its own limit (`sms.America/New_York`), and a phone has one zone, so its count lives
//! in one place. Put the two limits of a plan in a [set](crate::guide::stacking#several-limits-at-once-all-or-nothing)
//! to mix them: a day in the zone and a month, both spent only when both admit.
//!
//! ```
//! use http::request::Parts;
//! use tower_redis_ratelimit::{LimitLayer, key::HeaderKey, Backend, Calendar, PeriodConfig, Plans};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! const ZONES: [&str; 3] = ["America/New_York", "Europe/Berlin", "Asia/Kolkata"];
//! let zone = |parts: &Parts| {
//!     let zone = parts.headers.get("x-customer-zone")?.to_str().ok()?;
//!     ZONES.into_iter().find(|known| *known == zone)
//! };
//! let mut plans = Plans::new(zone);
//! for zone in ZONES {
//!     plans = plans.plan(zone, zone, PeriodConfig::calendar(5, Calendar::day(zone)));
//! }
//! let sms = LimitLayer::builder(&Backend::in_process(), plans)
//!     .name("sms")
//!     .key(HeaderKey::from_static("x-phone"))
//!     .build()?;
//! # let _ = sms; Ok(()) }
//! ```
//!
//! The windows are the same on both hosts. Each call sends the Redis script the
//! boundaries of three windows around the caller's clock (the one before, the current
//! one, the next), computed from the zone's rules with [jiff](https://docs.rs/jiff) and
//! cached until the window ends; the script picks the window of the time it reads (the
//! Redis server's, or the caller's with [`TimeSource::Caller`](crate::TimeSource))
//! and the key expires at that window's end (`PXAT`). So with the server's clock, the
//! server decides which day a request falls in, even when the caller's clock is off by
//! seconds; with the callers' clocks, an edge is as precise as the clocks (see the table
//! in [TLS, ACL users and Sentinel](crate::guide::deployments#tls-acl-users-and-sentinel)). Zone rules come from the system's time zone database
//! (`/usr/share/zoneinfo`), or from the copy built into the crate where the system has
//! none: keep it current on every instance, since instances with different rules for a
//! zone disagree on its windows. The `RateLimit-Policy` header's `w` is the nominal
//! length: 86400 for a day, 604800 for a week, 2592000 (30 days) for a month.
