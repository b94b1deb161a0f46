//! Stacking and sets: several limits on one route, one by one or all or nothing.
//!
//! # Stacked limits
//!
//! Put one layer per limit on the route, for instance a burst limit and a daily quota.
//! The layers are checked from the outermost in, and each refuses on its own:
//!
//! - a request refused by an outer layer never reaches the inner layers, so it uses
//!   none of their quota;
//! - a request admitted by an outer layer and refused by an inner one has used one unit
//!   of the outer layers' limits (it was counted when they admitted it).
//!
//! So **put the short limit outermost** and the long one inside: a request refused by
//! the burst limit does not burn the daily quota, and a request refused by the daily
//! quota only spends a burst unit, which returns within seconds. (The other order would
//! let a client's burst of refused requests eat its daily quota.)
//!
//! Every admitted response lists each policy in one `RateLimit-Policy` and one
//! `RateLimit` header, outermost first; a refused one lists the policies that saw it,
//! and `Retry-After` holds the longest wait among them. The request extensions hold
//! the [`Decision`](crate::Decision) of the innermost layer, and
//! [`Decisions`](crate::Decisions) lists every layer's, outermost first.
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use tower::ServiceBuilder;
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, PeriodLimitLayer, TokenBucketLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let backend = Backend::in_process();
//! let key = || HeaderKey::from_static("x-api-key");
//! let burst = TokenBucketLayer::builder(&backend)
//!     .name("burst")
//!     .rate(5, Duration::from_secs(1))
//!     .burst(10)
//!     .key(key())
//!     .build()?;
//! let daily = PeriodLimitLayer::builder(&backend)
//!     .name("daily")
//!     .quota(10_000)
//!     .period(Duration::from_secs(86_400))
//!     .key(key())
//!     .build()?;
//! // `ServiceBuilder` applies its layers top to bottom: `burst` is checked first.
//! // (With axum's `.layer(..).layer(..)` it is the other way round: the last is outermost.)
//! let app: Router = Router::new().route(
//!     "/search",
//!     get(|| async { "results" }).layer(ServiceBuilder::new().layer(burst).layer(daily)),
//! );
//! # let _ = app; Ok(()) }
//! ```
//!
//! ```text
//! RateLimit-Policy: "burst";q=10;w=2, "daily";q=10000;w=86400
//! RateLimit: "burst";r=9;t=1, "daily";r=9999;t=86400
//! ```
//!
//! # Several limits at once, all or nothing
//!
//! Stacked layers decide one by one, so an inner refusal has already spent the outer
//! limits. When several limits guard one key (2 per second *and* 10 per day per
//! merchant), a [`LimitSetLayer`](crate::LimitSetLayer) decides them together: on Redis
//! in one script call, where every limit first decides without writing and only when
//! all admit does each count the request; in process under a lock per key. A refusal
//! by any limit spends none. Mix any algorithms; each limit is the policy
//! `<set>.<limit>` in the headers, in the set's order. Use a set when the limits share
//! a key; stacked layers when the keys differ (per user *and* per merchant), putting
//! the short limit outermost.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::key::HeaderKey;
//! use tower_redis_ratelimit::period::PeriodConfig;
//! use tower_redis_ratelimit::token_bucket::TokenBucketConfig;
//! use tower_redis_ratelimit::{Backend, LimitSetLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let reports = LimitSetLayer::builder(&Backend::in_process())
//!     .name("reports")
//!     .limit("burst", TokenBucketConfig::new(2, Duration::from_secs(1), 2))
//!     .limit("daily", PeriodConfig::new(10, Duration::from_secs(86_400)))
//!     .key(HeaderKey::from_static("x-merchant-id"))
//!     .build()?;
//! # let _ = reports; Ok(()) }
//! ```
//!
//! ```text
//! RateLimit-Policy: "reports.burst";q=2;w=1, "reports.daily";q=10;w=86400
//! RateLimit: "reports.burst";r=1;t=1, "reports.daily";r=9;t=86400
//! ```
//!
//! On Redis Cluster a set needs nothing more: its keys share the limited key's hash tag,
//! so one slot.
