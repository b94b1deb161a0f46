//! Shaping traffic on one limit: requests that wait their turn instead of a `429`, and
//! priority classes that share one limit.
//!
//! # Waiting instead of refusing
//!
//! [`LayerBuilder::wait`](crate::LayerBuilder::wait) turns a refusal into a wait when
//! the request's turn comes soon enough (nginx's `limit_req` without `nodelay`, an
//! OpenTelemetry collector's `throttle_behavior: delay`): a refused request whose
//! `Retry-After` falls within the wait of its arrival sleeps until then and is checked
//! again, and so on until it is admitted or its next turn would fall past the wait
//! (then it is refused as without waiting, with the same `429`).
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! // 5 a second per user; a burst beyond that is smoothed over up to 2 s.
//! let layer = LimitLayer::builder(&Backend::in_process(), PeriodConfig::new(5, Duration::from_secs(1)))
//!     .name("api")
//!     .key(HeaderKey::from_static("x-user"))
//!     .wait(Duration::from_secs(2))
//!     .build()?;
//! # let _ = layer; Ok(()) }
//! ```
//!
//! - **Exact across instances**: every turn is a check of the shared state, so the limit
//!   holds on Redis whatever the number of instances and waiters (`tests/wait.rs`: 20
//!   clients at twice the rate on two instances, never more than 5 in a second).
//! - **A waiter holds nothing**: it spends only when it is admitted. A client that goes
//!   away while it waits (its response future dropped) has spent nothing.
//! - **Bounded**: at most 64 requests of one key wait at once in one process; more are
//!   refused at once. Waiters are not queued in order: each retries at its own
//!   `Retry-After`, so under contention a waiter may lose its turn to a newer request
//!   and wait again, within its bound.
//! - **Each turn is a round trip**: a waiter costs Redis one engine call per turn, as
//!   a check does. The deny cache answers a turn only before the refusal's
//!   `Retry-After`, which is when a waiter sleeps.
//! - **Needs a tokio runtime** (the waits are tokio timers); a
//!   [shadow](crate::LayerBuilder::shadow) layer never waits.
//!
//! While Redis is unreachable, the waits follow the failure policy's answers, as checks
//! do: under [`FailurePolicy::Fallback`](crate::FailurePolicy::Fallback) a waiter is
//! admitted in its turn by the in-process state (this instance's
//! [share](crate::BackendBuilder::fallback_share) of the limit); under `FailOpen` it is
//! admitted at once; under `FailClosed` every check is refused with a `Retry-After` of
//! the probe interval (500 ms by default), so a waiter whose wait is longer retries at
//! that pace and is admitted by Redis once the probe finds it back, or refused when its
//! wait runs out.
//!
//! # Priority classes
//!
//! Critical, standard and sheddable traffic can share one limit instead of each having
//! its own (which wastes what one class leaves unused, or lets sheddable traffic starve
//! critical): [`LayerBuilder::priority`](crate::LayerBuilder::priority) gives each request
//! the fraction of the limit its class may use. A request is admitted when its cost fits
//! within that fraction, counted on the one state every class spends from, and spends
//! only its cost.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, LimitSet};
//! use tower_redis_ratelimit::{PeriodConfig, TokenBucketConfig};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! // An LLM gateway: 60 requests a minute and 100 000 tokens a minute per tenant, of
//! // which batch jobs use at most 60% and interactive traffic 85%; health probes and
//! // billing, the rest.
//! let limits = LimitSet::new()
//!     .limit("rpm", PeriodConfig::new(60, Duration::from_secs(60)))
//!     .limit("tpm", TokenBucketConfig::new(100_000, Duration::from_secs(60), 100_000));
//! let layer = LimitLayer::builder(&Backend::in_process(), limits)
//!     .name("llm")
//!     .key(HeaderKey::from_static("x-tenant"))
//!     .priority(|parts| match parts.headers.get("x-priority").map(|v| v.as_bytes()) {
//!         Some(b"critical") => 1.0,
//!         Some(b"batch") => 0.6,
//!         _ => 0.85,
//!     })
//!     .build()?;
//! # let _ = layer; Ok(()) }
//! ```
//!
//! With 100 units a minute: sheddable (0.6) requests are admitted while 60 or fewer are
//! used, standard (0.85) while 85 or fewer, critical (1.0) up to the last unit.
//!
//! | | what it does |
//! |---|---|
//! | the decision | one atomic step, as any check: one engine call on Redis (each limit admits when the cost and the units the class leaves to others fit, then spends the cost), one step under the key's lock in process; a set holds the class back on each of its limits, in the same call |
//! | rounding | a fraction is of whole units, rounded down (0.6 of 7 is 4); below 0 or NaN counts as 0 (every request refused), above 1 as 1 |
//! | the headers | `RateLimit`'s `r` and the [`Decision`](crate::Decision)'s `remaining` are what remains for the request's class; `RateLimit-Policy` states the limit itself |
//! | a cost above the class's part | never admitted: `ExceedsCapacity` |
//! | the deny cache | a refusal it holds is the limit's own (a check of the whole limit refused) and refuses every class; a class's refusal is never put in it, since it would refuse the classes above |
//! | lockouts | a class's refusal starts none: the limit is not used up |
//! | coalescing, leases | a class below 1 takes neither (each would answer for another class); its checks go in batches as any check's, each item with its class's keeps |
//! | streams | a [`StreamLimit`](crate::StreamLimit) keeps the class of the request that opened it |
//! | a class of 1 | a check as without classes, every shortcut included |
//!
//! The cost on Redis (`scripts/bench-engine`, 64 checks in flight, see `BENCHMARKS.md`):
//! a class's check takes the fast path, each limit with what the class leaves to others
//! in its test, and goes in batches as a plain check does: it costs Redis within 4% of
//! the instructions of a plain check.
//!
//! While Redis is unreachable, [`FailurePolicy::Fallback`](crate::FailurePolicy::Fallback)
//! applies each class's fraction to the limits in force (this instance's share of
//! them); `FailOpen` admits every class; `FailClosed` refuses every class.
