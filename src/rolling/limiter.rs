//! The rolling-window limiter: a [`RollingConfig`] checked into a
//! [`RollingWindowLimiter`] on a [`Backend`], which asks `rolling.lua` on Redis or the
//! in-process counts (`memory.rs`) and turns either answer into a [`Decision`].
//!
//! The semantics are described in the [module documentation](super); the layer
//! (`RollingWindowLayer`) is defined with the other layers, in `layers.rs`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::memory::{Grid, Rings};
use crate::backend::decide::protocol::{Limit, RollingReply};
use crate::backend::{Args, Backend, Hosts, Owner, Remote};
use crate::decision::{Decision, Policy, Priority, Source, State};
use crate::error::ConfigError;
use crate::ring::StepBack;

/// The most buckets a window may have (each check of the Redis script visits them all).
pub(crate) const MAX_BUCKETS: u32 = 1_000;

/// The longest window accepted (ten years, as for the fixed window's period).
const MAX_WINDOW_MS: u64 = 10 * 366 * 86_400_000;

/// Rolling-window limits: at most `limit` units per key within any window of `buckets`
/// consecutive time buckets of `interval` each (10 buckets of 100 ms: a one-second
/// window that moves forward every 100 ms). Redis runs `rolling.lua`, the in-process
/// host a ring of counts per key, with the same semantics.
///
/// | item | what | file |
/// |---|---|---|
/// | [`RollingWindowLimiter`], [`RollingConfig`] | the settings, and the limiter on a backend (its layer is [`RollingWindowLayer`](crate::RollingWindowLayer)) | `limiter.rs` |
/// | in-process counts | per key a ring of counts and their sum: the pure step `(state, now, cost, settings) -> (state, outcome)` | `memory.rs` |
/// | the Redis script | the same step on a hash of bucket counts | `rolling.lua` |
///
/// # Semantics
///
/// A request is admitted when the units counted in the live buckets plus its cost stay
/// within the limit; the request that uses the last unit is
/// [`State::HitQuota`](crate::State::HitQuota), later ones
/// [`State::OverQuota`](crate::State::OverQuota) until enough old buckets expire.
/// Rejected requests are not counted. A rejection's `retry_after` is the time until the oldest buckets holding
/// enough units to admit its cost have expired, and `reset` the time until every counted
/// unit has.
///
/// # Compared with the fixed window
///
/// A [fixed window](crate::PeriodConfig) forgets everything at its edge, so a client can
/// spend the whole quota just before the edge and again just after it: twice the limit
/// within a moment. A rolling window forgets one bucket at a time, so units spent just
/// before an edge still count until a whole window later. The only slack is the
/// granularity of the buckets: units are forgotten when their bucket ends, not exactly
/// one window after their request, so the error is at most one bucket. Precisely, any
/// `buckets` consecutive buckets, and any span of `buckets - 1` intervals, never hold
/// more than `limit` admitted units; any span of one window never holds more than
/// `limit` plus what was admitted in its first interval. More buckets make the window
/// smoother at the cost of one counter per bucket per active key.
///
/// Bucket edges are multiples of the interval in Unix time, the same for every key and,
/// on Redis, for every instance (the Redis server's clock decides, unless the backend
/// uses the callers' clocks: see [Clocks](#clocks)). Intervals are whole
/// milliseconds: a sub-millisecond part is ignored.
///
/// # Storage
///
/// On Redis, each limited key is one hash (`<prefix>:{v1:<key>}:rolling:<name>`, the
/// [layout](crate::guide::deployments#redis-keys)) with one
/// field per non-empty live bucket, its absolute index `floor(unix_ms / interval)`,
/// holding that bucket's count. One atomic script sums the live buckets, deletes the
/// expired ones and counts the request; the hash expires one window plus one interval
/// after the last admitted request. In process, each key holds a ring of `buckets`
/// counters and their sum, in one allocation, in the backend's bounded state
/// ([`max_local_keys`](crate::BackendBuilder::max_local_keys), where a key counts as
/// `ceil(buckets / 8)` keys): about 250 bytes per key for 10 buckets.
///
/// # Clocks
///
/// Bucket indices come from the Redis server's clock. Each key holds the newest time it
/// has seen: when the clock steps back (an NTP step, a failover to a replica whose clock
/// is behind), a key's newest bucket is "in the future", and the key's time moves up to
/// that bucket by whole buckets (to the server's offset within its own bucket: at most
/// one interval past the last request, as if at most one interval had passed between
/// the last request and the step), then runs on at the server's rate (the skew, in buckets, is one more field of the key's
/// hash: no extra command, except one write when it changes). The buckets and the hash's
/// expiry stay in the key's time: so a step back of any size never admits more than the
/// limit, not even when the clock comes back (the window is then as the key left it),
/// and a refusal never waits more than one window, at any moment. Once the server's time
/// reaches the newest bucket again (the clock came back, or caught up), the skew is
/// dropped. Costs: a key's hash outlives its window by the step while the clock is
/// behind; a step back within the newest bucket's span is followed (units counted then
/// may expire up to that step early), and one across a bucket's edge moves the key's
/// time by whole buckets (units may expire up to one interval early: a step back of
/// 1 ms just after an edge of 250 ms buckets puts the key's time 249 ms ahead). A step forward expires buckets early (at most a
/// window's worth of counts); so does a return that lands before the newest bucket a key
/// has seen (it is a step forward from the time behind). The in-process state runs the
/// same rule; its clock is monotonic, so it only ever sees steps forward (a paused tokio
/// clock that is advanced).
///
/// With the callers' clocks ([`TimeSource::Caller`](crate::TimeSource)), say
/// within `s` of each other, buckets are never moved back (the ring's `StepBack::Hold`): a caller
/// whose clock is behind the newest bucket counts from that bucket instead (moving them back would age
/// them once per call of that caller, without bound). So a unit is forgotten when the
/// clock furthest ahead says so, and:
///
/// - any span of `(buckets - 1) × interval - s` holds at most `limit` admitted units (a
///   caller ahead by `s` makes the window up to `s` shorter, never the limit larger);
/// - a unit counts for at most one window plus `s` (a caller behind waits up to `s`
///   longer), and a key whose clock was pushed far ahead by one caller is freed at the
///   latest one window plus one interval after its last admission, when its hash expires.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, RollingConfig};
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// // At most 100 requests per API key within any second, in 10 buckets of 100 ms.
/// let limits = RollingConfig::new(100, 10, Duration::from_millis(100));
/// let layer = LimitLayer::builder(&Backend::in_process(), limits)
///     .name("api")
///     .key(HeaderKey::from_static("x-api-key"))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// A `RollingConfig` is what [`LimitLayer::builder`](crate::LimitLayer::builder) takes,
/// a member of a [`LimitSet`](crate::LimitSet) or a plan, and (with the `serde`
/// feature) the `"rolling_window"` limit of a rule file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(
        from = "crate::config::RollingFile",
        into = "crate::config::RollingFile"
    )
)]
pub struct RollingConfig {
    pub(crate) limit: u64,
    pub(crate) buckets: u32,
    pub(crate) interval: Duration,
    pub(crate) lockout: Option<Duration>,
}

impl RollingConfig {
    /// At most `limit` units within any `buckets` consecutive buckets of `interval`
    /// (whole milliseconds); checked when the limiter is built.
    #[must_use]
    pub fn new(limit: u64, buckets: u32, interval: Duration) -> Self {
        Self {
            limit,
            buckets,
            interval,
            lockout: None,
        }
    }

    /// Locks a key out for `duration` once this limit refuses it (fail2ban-style): every
    /// check of the key is refused until then, spending nothing, with the lock's end as
    /// its `Retry-After`. Kept in Redis next to the limit's key, so every instance
    /// honours it; a lock already running is not extended by further refusals. At least
    /// one millisecond.
    #[must_use]
    pub fn lockout(mut self, duration: Duration) -> Self {
        self.lockout = Some(duration);
        self
    }

    fn interval_ms(&self) -> u64 {
        u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX)
    }

    /// The limit, for [`dynamic`](crate::DynamicLimits) limits.
    pub(crate) fn limit_value(&self) -> u64 {
        self.limit
    }

    /// The same settings with another limit, for [`dynamic`](crate::DynamicLimits) limits.
    pub(crate) fn with_limit_value(&self, limit: u64) -> Self {
        Self { limit, ..*self }
    }
}

/// A rolling-window [`Limiter`](crate::Limiter) on a [`Backend`].
#[derive(Debug, Clone)]
pub struct RollingWindowLimiter {
    store: Arc<RollingHosts>,
}

#[derive(Debug)]
struct RollingHosts {
    remote: Remote,
    policy: Policy,
    limit: u64,
    /// The limit of the in-process state (the fallback share of `limit` on Redis).
    local_limit: u64,
    buckets: u32,
    interval_ms: u64,
    rings: Rings,
}

impl RollingWindowLimiter {
    /// Checks `config` and builds the limiter named `name` on `backend`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a zero limit, zero or more than 1 000 buckets, an
    /// interval under one millisecond, a window (`buckets` × `interval`) over ten years,
    /// more buckets than the backend's in-process state holds for one key (with a tiny
    /// [`max_local_keys`](crate::BackendBuilder::max_local_keys)), or an invalid name.
    pub fn new(backend: &Backend, name: &str, config: RollingConfig) -> Result<Self, ConfigError> {
        Self::with_owner(backend, Owner::Own(name), config)
    }

    /// [`new`](Self::new) for `owner`'s keys (a limiter's own, or a set's limit).
    pub(crate) fn with_owner(
        backend: &Backend,
        owner: Owner<'_>,
        config: RollingConfig,
    ) -> Result<Self, ConfigError> {
        owner.validate()?;
        let name = &*owner.policy_name();
        if config.limit == 0 {
            return Err(ConfigError::Zero { setting: "limit" });
        }
        if config.buckets == 0 {
            return Err(ConfigError::Zero { setting: "buckets" });
        }
        if config.buckets > MAX_BUCKETS {
            return Err(ConfigError::TooLarge {
                setting: "buckets",
                max: u64::from(MAX_BUCKETS),
            });
        }
        let interval_ms = config.interval_ms();
        if interval_ms == 0 {
            return Err(ConfigError::ZeroDuration {
                setting: "interval",
            });
        }
        let window_ms = interval_ms
            .checked_mul(u64::from(config.buckets))
            .filter(|&ms| ms <= MAX_WINDOW_MS)
            .ok_or(ConfigError::TooLong {
                setting: "interval",
            })?;
        let store = backend.local_store();
        if !store.fits(crate::local::ring_weight(config.buckets as usize)) {
            return Err(ConfigError::Conflict {
                reason: "the backend's max_local_keys is too small for this many buckets",
            });
        }
        let lockout = crate::error::validate_lockout(config.lockout)?;
        let remote = Remote::new(backend, "rolling", owner, lockout);
        // Limiters of one name share their rings only if they have as many buckets.
        let id = remote.local_id(b"state", u64::from(config.buckets));
        Ok(Self {
            store: Arc::new(RollingHosts {
                remote,
                policy: Policy::new(name, config.limit, Duration::from_millis(window_ms))
                    .with_algorithm("rolling_window"),
                limit: config.limit,
                local_limit: backend.local_limit(config.limit),
                buckets: config.buckets,
                interval_ms,
                rings: Rings::new(
                    store,
                    id,
                    Grid {
                        buckets: u64::from(config.buckets),
                        interval_us: interval_ms * 1_000,
                        // As the script on the server's clock (the in-process clock
                        // itself never steps back).
                        step_back: StepBack::Follow,
                    },
                ),
            }),
        })
    }
}

impl RollingWindowLimiter {
    /// The limiter's two hosts, for a [set](crate::LimitSet) of limits.
    pub(crate) fn hosts(&self) -> Arc<dyn Hosts> {
        self.store.clone()
    }
}

crate::hosted::hosted_limiter!(RollingWindowLimiter, store);

impl RollingHosts {
    fn decision(
        limit: u64,
        admitted: bool,
        sum: u64,
        retry_after: Duration,
        reset: Duration,
        source: Source,
    ) -> Decision {
        let remaining = limit.saturating_sub(sum);
        match (admitted, remaining) {
            (true, 0) => Decision::new(State::HitQuota, limit, 0, reset, source),
            (true, _) => Decision::new(State::Allowed, limit, remaining, reset, source),
            (false, _) => Decision::new(State::OverQuota, limit, remaining, reset, source)
                .with_retry_after(retry_after),
        }
    }
}

impl Hosts for RollingHosts {
    fn remote(&self) -> &Remote {
        &self.remote
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn exceeds_capacity(&self, source: Source) -> Decision {
        Decision::new(
            State::ExceedsCapacity,
            self.limit,
            0,
            self.policy.window(),
            source,
        )
    }

    fn limit_args(&self, args: &mut Args) {
        let limit = Limit::Rolling {
            limit: self.limit,
            buckets: self.buckets,
            interval_ms: self.interval_ms,
        };
        limit.write(args);
    }

    fn reply_len(&self) -> usize {
        RollingReply::SLOTS.len()
    }

    fn decide(&self, reply: &[i64], _cost: NonZeroU32) -> Option<Decision> {
        let reply = RollingReply::read(reply)?;
        let ms = Duration::from_millis;
        Some(Self::decision(
            self.limit,
            reply.admitted,
            reply.sum,
            ms(reply.retry_ms),
            ms(reply.reset_ms),
            Source::Redis,
        ))
    }

    fn local_priority(
        &self,
        key: &[u8],
        cost: u32,
        priority: Priority,
        source: Source,
        spend: bool,
    ) -> Decision {
        let now_us = self.remote.backend().clock().now_us();
        let limit = self.local_limit;
        // A class that leaves `keep` to others admits within the limit less `keep`.
        let keep = priority.keep(limit);
        let hit = self
            .rings
            .hit(key, u64::from(cost), limit - keep, now_us, spend);
        Self::decision(
            limit,
            hit.admitted,
            hit.sum,
            Duration::from_micros(hit.retry_us),
            Duration::from_micros(hit.reset_us),
            source,
        )
        .keeping(keep)
    }

    fn local_refund(&self, key: &[u8], cost: u32) {
        let now_us = self.remote.backend().clock().now_us();
        self.rings.refund(key, u64::from(cost), now_us);
    }

    fn local_charge(&self, key: &[u8], cost: u64) {
        let now_us = self.remote.backend().clock().now_us();
        self.rings.hit(key, cost, u64::MAX, now_us, true);
    }

    fn local_reset(&self, key: &[u8]) {
        self.rings.reset(key);
    }
}

#[cfg(test)]
#[path = "limiter_tests.rs"]
mod tests;
