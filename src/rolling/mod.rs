//! Rolling-window limits: at most `limit` units per key within any window of `buckets`
//! consecutive time buckets of `interval` each (10 buckets of 100 ms: a one-second
//! window that moves forward every 100 ms). Redis runs `rolling.lua`, the in-process
//! host a ring of counts per key, with the same semantics.
//!
//! | item | what | file |
//! |---|---|---|
//! | [`RollingWindowLimiter`], [`RollingConfig`] | the settings, and the limiter on a backend (its layer is [`RollingWindowLayer`](crate::RollingWindowLayer)) | `limiter.rs` |
//! | in-process counts | per key a ring of counts and their sum: the pure step `(state, now, cost, settings) -> (state, outcome)` | `memory.rs` |
//! | the Redis script | the same step on a hash of bucket counts | `rolling.lua` |
//!
//! # Semantics
//!
//! A request is admitted when the units counted in the live buckets plus its cost stay
//! within the limit; the request that uses the last unit is
//! [`State::HitQuota`](crate::State::HitQuota), later ones
//! [`State::OverQuota`](crate::State::OverQuota) until enough old buckets expire.
//! Rejected requests are not counted. A rejection's `retry_after` is the time until the oldest buckets holding
//! enough units to admit its cost have expired, and `reset` the time until every counted
//! unit has.
//!
//! # Compared with the fixed window
//!
//! A [fixed window](crate::period) forgets everything at its edge, so a client can
//! spend the whole quota just before the edge and again just after it: twice the limit
//! within a moment. A rolling window forgets one bucket at a time, so units spent just
//! before an edge still count until a whole window later. The only slack is the
//! granularity of the buckets: units are forgotten when their bucket ends, not exactly
//! one window after their request, so the error is at most one bucket. Precisely, any
//! `buckets` consecutive buckets, and any span of `buckets - 1` intervals, never hold
//! more than `limit` admitted units; any span of one window never holds more than
//! `limit` plus what was admitted in its first interval. More buckets make the window
//! smoother at the cost of one counter per bucket per active key.
//!
//! Bucket edges are multiples of the interval in Unix time, the same for every key and,
//! on Redis, for every instance (the Redis server's clock decides, unless the backend
//! uses the callers' clocks: see [Clocks](#clocks)). Intervals are whole
//! milliseconds: a sub-millisecond part is ignored.
//!
//! # Storage
//!
//! On Redis, each limited key is one hash (`<prefix>:{v1:<key>}:rolling:<name>`, the
//! [layout](crate::backend#redis-keys)) with one
//! field per non-empty live bucket, its absolute index `floor(unix_ms / interval)`,
//! holding that bucket's count. One atomic script sums the live buckets, deletes the
//! expired ones and counts the request; the hash expires one window plus one interval
//! after the last admitted request. In process, each key holds a ring of `buckets`
//! counters and their sum, in one allocation, in the backend's bounded state
//! ([`max_local_keys`](crate::BackendBuilder::max_local_keys), where a key counts as
//! `ceil(buckets / 8)` keys): about 250 bytes per key for 10 buckets.
//!
//! # Clocks
//!
//! Bucket indices come from the Redis server's clock. Each key holds the newest time it
//! has seen: when the clock steps back (an NTP step, a failover to a replica whose clock
//! is behind), a key's newest bucket is "in the future", and the key's time moves up to
//! that bucket by whole buckets (to the server's offset within its own bucket: at most
//! one interval past the last request, as if at most one interval had passed between
//! the last request and the step), then runs on at the server's rate (the skew, in buckets, is one more field of the key's
//! hash: no extra command, except one write when it changes). The buckets and the hash's
//! expiry stay in the key's time: so a step back of any size never admits more than the
//! limit, not even when the clock comes back (the window is then as the key left it),
//! and a refusal never waits more than one window, at any moment. Once the server's time
//! reaches the newest bucket again (the clock came back, or caught up), the skew is
//! dropped. Costs: a key's hash outlives its window by the step while the clock is
//! behind; a step back within the newest bucket's span is followed (units counted then
//! may expire up to that step early), and one across a bucket's edge moves the key's
//! time by whole buckets (units may expire up to one interval early: a step back of
//! 1 ms just after an edge of 250 ms buckets puts the key's time 249 ms ahead). A step forward expires buckets early (at most a
//! window's worth of counts); so does a return that lands before the newest bucket a key
//! has seen (it is a step forward from the time behind). The in-process state runs the
//! same rule; its clock is monotonic, so it only ever sees steps forward (a paused tokio
//! clock that is advanced).
//!
//! With the callers' clocks ([`TimeSource::Caller`](crate::backend::TimeSource)), say
//! within `s` of each other, buckets are never moved back (the ring's `StepBack::Hold`): a caller
//! whose clock is behind the newest bucket counts from that bucket instead (moving them back would age
//! them once per call of that caller, without bound). So a unit is forgotten when the
//! clock furthest ahead says so, and:
//!
//! - any span of `(buckets - 1) × interval - s` holds at most `limit` admitted units (a
//!   caller ahead by `s` makes the window up to `s` shorter, never the limit larger);
//! - a unit counts for at most one window plus `s` (a caller behind waits up to `s`
//!   longer), and a key whose clock was pushed far ahead by one caller is freed at the
//!   latest one window plus one interval after its last admission, when its hash expires.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, RollingWindowLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! // At most 100 requests per API key within any second, in 10 buckets of 100 ms.
//! let layer = RollingWindowLayer::builder(&Backend::in_process())
//!     .name("api")
//!     .limit(100)
//!     .buckets(10)
//!     .interval(Duration::from_millis(100))
//!     .key(HeaderKey::from_static("x-api-key"))
//!     .build()?;
//! # let _ = layer; Ok(()) }
//! ```

pub(crate) mod counts;
mod limiter;
pub(crate) mod memory;

pub use self::limiter::{RollingConfig, RollingWindowLimiter};
