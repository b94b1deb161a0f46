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
//! use tower_redis_ratelimit::{
//!     key::HeaderKey, Backend, LimitLayer, PeriodConfig, TokenBucketConfig,
//! };
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let backend = Backend::in_process();
//! let key = || HeaderKey::from_static("x-api-key");
//! let config = TokenBucketConfig::new(5, Duration::from_secs(1), 10);
//! let burst = LimitLayer::builder(&backend, config)
//!     .name("burst")
//!     .key(key())
//!     .build()?;
//! let config = PeriodConfig::new(10_000, Duration::from_secs(86_400));
//! let daily = LimitLayer::builder(&backend, config)
//!     .name("daily")
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
//! merchant), a [`LimitSet`](crate::LimitSet) layer decides them together: on Redis
//! in one script call, where every limit first decides without writing and only when
//! all admit does each count the request; in process under a lock per key. A refusal
//! by any limit spends none. Mix any algorithms; each limit is the policy
//! `<set>.<limit>` in the headers, in the set's order. Use a set when the limits share
//! a key; stacked layers when the keys differ (per user *and* per merchant), putting
//! the short limit outermost.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{
//!     key::HeaderKey, Backend, LimitLayer, LimitSet, PeriodConfig, TokenBucketConfig,
//! };
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let config = LimitSet::new()
//!     .limit("burst", TokenBucketConfig::new(2, Duration::from_secs(1), 2))
//!     .limit("daily", PeriodConfig::new(10, Duration::from_secs(86_400)));
//! let reports = LimitLayer::builder(&Backend::in_process(), config)
//!     .name("reports")
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
//!
//! # Exemptions: preflights, health checks, internal callers
//!
//! A request that should never count (a CORS preflight, a load balancer's health check,
//! your own batch job, an allowlisted client) is exempted by the layer itself with
//! [`exempt`](crate::LayerBuilder::exempt): it is neither checked nor counted and its
//! response carries no rate-limit headers. The predicate sees the request's head; give
//! several, and any of them exempts:
//!
//! ```
//! use std::collections::HashSet;
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use axum::{extract::ConnectInfo, routing::get, Router};
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let partners: HashSet<&'static str> = ["partner-1", "partner-2"].into();
//! let config = PeriodConfig::new(100, Duration::from_secs(60));
//! let limit = LimitLayer::builder(&Backend::in_process(), config)
//!     .name("api")
//!     .key(HeaderKey::from_static("x-api-key"))
//!     .exempt(|req| req.method == http::Method::OPTIONS)
//!     .exempt(|req| req.uri.path() == "/healthz")
//!     .exempt(move |req| {
//!         let key = req.headers.get("x-api-key").and_then(|v| v.to_str().ok());
//!         key.is_some_and(|key| partners.contains(key))
//!     })
//!     // Callers from the cluster's own network.
//!     .exempt(|req| {
//!         req.extensions
//!             .get::<ConnectInfo<SocketAddr>>()
//!             .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback())
//!     })
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .route("/healthz", get(|| async { "up" }))
//!     .layer(limit);
//! # let _ = app; Ok(()) }
//! ```
//!
//! The predicate runs on every request, on the request's task: keep it to reading the
//! head and sets in memory (an allowlist from your store belongs in memory, refreshed
//! in the background, not looked up per request).
//!
//! **Where the limit goes relative to a CORS layer.** Put the CORS layer *outside* the
//! limit (added after it with `Router::layer`, or above it in a `ServiceBuilder`): the
//! CORS layer then answers preflights itself before they reach the limit, and adds its
//! `Access-Control-Allow-Origin` to every response coming back through it, the limit's
//! `429`s included, so that a browser lets the page read the refusal and its
//! `Retry-After`. A limit outside the CORS layer counts preflights (unless exempted)
//! and sends `429`s without CORS headers, which a browser reports as a network error.
//!
//! ```ignore
//! // tower-http's CorsLayer, outside the limit: `.layer` wraps what came before.
//! let app = Router::new()
//!     .route("/", get(handler))
//!     .layer(limit)
//!     .layer(tower_http::cors::CorsLayer::permissive());
//! ```
//!
//! # What combines with what
//!
//! Every way of making a limit yields an algorithm config that a
//! [`LayerBuilder`](crate::LayerBuilder) builds, so they nest:
//!
//! | this | holds | for |
//! |---|---|---|
//! | a [`PeriodConfig`](crate::PeriodConfig), [`TokenBucketConfig`](crate::TokenBucketConfig) or [`RollingConfig`](crate::RollingConfig) | one limit | one layer, a set's member, a plan |
//! | a [`LimitSet`](crate::LimitSet) | several algorithms on one key, all or nothing | a layer, a plan |
//! | [`Plans`](crate::Plans) | one limit per plan, chosen per request: any of the above | a layer |
//! | [`DynamicLimits`](crate::DynamicLimits) | one algorithm whose number comes from your store per key | a layer, a plan |
//! | stacked layers | limits on different keys (per user *and* per merchant) | a router |
//!
//! A plan may be a set: per-minute *and* daily limits per plan, decided together.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{
//!     LimitLayer, key::ExtensionKey, Backend, ExtensionPlan, LimitSet, PeriodConfig, Plans,
//! };
//!
//! #[derive(Clone, Copy, PartialEq, Debug)]
//! enum Plan { Free, Pro }
//! #[derive(Clone, Debug)]
//! struct ApiKey(String);
//! impl std::fmt::Display for ApiKey {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(&self.0) }
//! }
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let (minute, day) = (Duration::from_secs(60), Duration::from_secs(86_400));
//! let plans = Plans::new(ExtensionPlan::<Plan>::new())
//!     .plan(Plan::Free, "free", LimitSet::new()
//!         .limit("minute", PeriodConfig::new(60, minute))
//!         .limit("daily", PeriodConfig::new(1_000, day)))
//!     .plan(Plan::Pro, "pro", LimitSet::new()
//!         .limit("minute", PeriodConfig::new(600, minute))
//!         .limit("daily", PeriodConfig::new(10_000, day)));
//! let api = LimitLayer::builder(&Backend::in_process(), plans)
//!     .name("api")
//!     .key(ExtensionKey::<ApiKey>::new())
//!     .build()?;
//! # let _ = api; Ok(()) }
//! ```
//!
//! The headers name each plan's limits (`"api.pro.minute"`, `"api.pro.daily"`), and a refusal by
//! either spends neither.
