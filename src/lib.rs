//! Distributed rate limiting for [tower] and [axum]: fixed window, token bucket and
//! rolling window, kept in Redis so every instance of a service shares one limit, and
//! answered in-process when Redis is unreachable.
//!
//! # Overview
//!
//! Each algorithm is a tower [`Layer`](tower_layer::Layer) that wraps any `Service`
//! taking `http::Request`s (axum routers, tonic servers, plain tower stacks):
//!
//! | layer | limits | for |
//! |---|---|---|
//! | [`PeriodLimitLayer`] | `quota` per fixed `period`, optionally aligned to a UTC offset, or per local day, week or month of an IANA zone ([`Calendar`]) | daily quotas, "5 SMS codes per phone per day in the customer's zone", "10 000 per month" |
//! | [`TokenBucketLayer`] | `rate` per `period` with bursts up to `burst`, weighted costs | API rate limits that tolerate short bursts |
//! | [`RollingWindowLayer`] | at most `limit` within any window of `buckets` x `interval` | limits with no 2x burst at window edges |
//! | [`InFlightLimitLayer`] | at most `slots` requests of one key in flight at once, held until the response body ends | exports, streams, expensive queries: "2 exports per merchant at a time" ([`in_flight`]) |
//!
//! Every layer is built on a [`Backend`]: [`Backend::in_process`] keeps limits in this
//! process; [`Backend::redis`] keeps them in Redis (through a [`deadpool_redis`] pool,
//! with one atomic Lua engine that reads the Redis server's clock, loaded once per
//! server as a library of Redis Functions on Redis 7 and later, as a script run by SHA before), and falls back
//! to in-process state with the same semantics while Redis is unreachable (or admits or
//! refuses everything, as each layer's [`FailurePolicy`] says). A local deny cache keeps
//! a flood on one refused key away from Redis.
//!
//! A request's key comes from a [`KeyExtractor`](key::KeyExtractor) (peer IP, the client
//! IP behind trusted proxies, a header, an authenticated user, or any closure); its cost
//! from a [`Cost`]. An admitted request carries the [`Decision`] in its extensions and
//! its response carries the IETF `RateLimit` and `RateLimit-Policy` headers; a rejected
//! one gets `429 Too Many Requests` with `Retry-After` without reaching the inner
//! service.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use tower_redis_ratelimit::{
//!     key::{HeaderKey, KeyExtractor, PeerIp}, Backend, LimitLayer, PeriodConfig,
//! };
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! // One backend for the process, shared by every layer. From a URL it makes its own
//! // connections (TCP_NODELAY, and the subscription that brings resets and blocks from
//! // other instances); nothing connects until the first check. `Backend::in_process()`
//! // for tests; a pool of yours: `BackendBuilder::redis`.
//! let backend = Backend::builder().redis_url("redis://127.0.0.1:6379").build()?;
//! let limit = LimitLayer::builder(&backend, PeriodConfig::new(100, Duration::from_secs(60)))
//!     .name("api")
//!     .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
//!     .build()?;
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(limit);
//! # let _ = app; Ok(()) }
//! ```
//!
//! The [`guide`] has one page per topic:
//!
//! - [choosing an algorithm](guide::algorithms);
//! - [choosing a key](guide::keys), and limits from your own store ([`DynamicLimits`]);
//! - [stacked limits, and sets of limits decided all or nothing](guide::stacking);
//! - [calendar windows](guide::calendar): days, weeks and months in a time zone;
//! - [limiters in your own code](guide::limiters);
//! - [counting by outcome, usage and settlement, lockouts](guide::usage);
//! - [in-flight limits](guide::in_flight);
//! - [outbound limits](guide::outbound);
//! - [running behind a proxy](guide::proxies);
//! - [Redis deployments](guide::deployments): Cluster, TLS, ACL users, Sentinel, hot keys;
//! - [failure modes](guide::failure_modes): Redis failures, key floods, clock steps;
//! - [gRPC](guide::grpc);
//! - [operations](guide::operations): shadow mode, configuration as data, listing what
//!   is blocked, the admin flow end to end, upgrading, metrics;
//! - [the crate's layout](guide::architecture).
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! |---|---|---|
//! | `axum` | yes | key extractors that read axum's `ConnectInfo` and `MatchedPath` ([`PeerIp`](key::PeerIp) reads the peer address, `key::MatchedPathKey`), and `Rules::apply` on an `axum::Router` |
//! | `admin` | no | an axum router with JSON endpoints that peek, reset, block and refund a client by the value its requests carry, and list what is blocked (`AdminRouter`) |
//! | `cluster` | no | Redis Cluster pools (`BackendBuilder::redis_cluster`, `redis_cluster_urls`) |
//! | `grpc` | no | gRPC rejections for tonic: trailers-only `RESOURCE_EXHAUSTED` with `RetryInfo` and `QuotaFailure` ([`guide::grpc`]), and the peer address of tonic's `TcpConnectInfo` for [`PeerIp`](key::PeerIp) |
//! | `tls` | no | TLS to Redis with rustls and ring (no system OpenSSL): `rediss://` URLs, a custom CA (`BackendBuilder::tls_ca_pem`), client certificates (`tls_client_auth_pem`) |
//! | `sentinel` | no | Redis Sentinel: a backend that follows the master a group of sentinels names (`BackendBuilder::redis_sentinel`) |
//! | `serde` | no | configuration as data: the backend and rules from a TOML/YAML/JSON file or the environment (`RulesConfig`) |
//! | `metrics` | no | counters and histograms with the [`metrics`](https://docs.rs/metrics) crate (listed in [`guide::metrics`]) |
//!
//! Items that need a feature say which one in these docs. The examples that need one
//! declare it: `cargo run --example grpc` says to add `--features grpc`.
//!
//! [tower]: https://docs.rs/tower
//! [axum]: https://docs.rs/axum
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
mod admin;
mod backend;
mod blocked;
mod clock;
#[cfg(feature = "serde")]
mod config;
mod cost;
mod decision;
mod denied;
mod dynamic;
mod error;
#[cfg(all(test, feature = "serde", feature = "axum"))]
mod fuzz;
pub mod guide;
mod hosted;
pub mod in_flight;
pub mod key;
mod layers;
pub mod limit;
mod limiter;
mod local;
mod lua_texts;
mod metrics;
pub mod outbound;
mod period;
mod response;
mod ring;
mod rolling;
mod set;
mod token_bucket;

pub use deadpool_redis;
/// The [`ipnet`](https://docs.rs/ipnet) crate, whose `IpNet` lists the trusted proxies
/// of [`ForwardedIp`](key::ForwardedIp): re-exported so that its version always matches
/// this crate's (a new major version of `ipnet` is a new major version of this crate).
pub use ipnet;

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub use crate::admin::AdminRouter;
#[doc(hidden)]
pub use crate::backend::{engine_admits, engine_script, ManualClock};
pub use crate::backend::{
    Backend, BackendBuilder, Credentials, CredentialsProvider, FailurePolicy, RedisState,
    RedisUnavailable, ShareRounding, TimeSource,
};
pub use crate::blocked::Blocked;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use crate::config::{BackendConfig, KeyConfig, RuleConfig, Rules, RulesConfig};
pub use crate::cost::{Cost, HeaderCost};
pub use crate::decision::{Decision, Decisions, Policy, Source, State};
pub use crate::denied::Denied;
pub use crate::dynamic::{DynamicLimiter, DynamicLimits, LimitSource, OnSourceError, WithLimit};
pub use crate::error::{AdminError, ConfigError};
pub use crate::in_flight::{InFlightConfig, InFlightLimitLayer, InFlightLimiter};
pub use crate::layers::{PeriodLimitLayer, RollingWindowLayer, TokenBucketLayer};
pub use crate::limit::{
    ExtensionPlan, LayerBuilder, Limit, LimitLayer, MissingKey, Plans, StreamLimit,
};
pub use crate::limiter::{DecisionFuture, Limiter};
#[doc(hidden)]
pub use crate::lua_texts::lua_texts;
pub use crate::period::{Calendar, PeriodConfig, PeriodLimiter, UtcOffset, Weekday};
pub use crate::response::{DefaultRejection, OnRejection, ProblemJson, Rejection};
pub use crate::rolling::{RollingConfig, RollingWindowLimiter};
pub use crate::set::{LimitConfig, LimitSet, SetLimiter};
pub use crate::token_bucket::{TokenBucketConfig, TokenBucketLimiter};

/// The README's Rust code blocks, compiled by `cargo test --doc`, so that what users
/// copy from the crates.io page builds.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
