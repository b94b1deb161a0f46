//! Rolling-window limits: at most `limit` units per key within any window of `buckets`
//! consecutive time buckets of `interval` each (10 buckets of 100 ms: a one-second
//! window that moves forward every 100 ms).
//!
//! A request is admitted when the units counted in the live buckets plus its cost stay
//! within the limit; the request that uses the last unit is [`State::HitQuota`], later
//! ones [`State::OverQuota`] until enough old buckets expire. Rejected requests are not
//! counted. A rejection's `retry_after` is the time until the oldest buckets holding
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
//! On Redis, each limited key is one hash (`<prefix>:rolling:<name>:<key>`) with one
//! field per non-empty live bucket, its absolute index `floor(unix_ms / interval)`,
//! holding that bucket's count. One atomic script sums the live buckets, deletes the
//! expired ones and counts the request; the hash expires one window plus one interval
//! after the last admitted request. In process, each key holds a ring of `buckets`
//! counters in the backend's bounded state
//! ([`max_local_keys`](crate::BackendBuilder::max_local_keys), where a key counts as
//! `ceil(buckets / 8)` keys): about 250 bytes per key for 10 buckets.
//!
//! # Clocks
//!
//! Bucket indices come from the Redis server's clock. When it steps back (an NTP step, a
//! failover to a replica whose clock is behind), a key's buckets are "in the future":
//! they are moved back with the clock, keeping their counts and their order, as if no
//! time had passed between the last request and the step. So a step back of any size
//! never admits more than the limit, and never refuses a key for longer than one window.
//! A step forward expires buckets early (at most a window's worth of counts). The
//! in-process state does the same; its clock is monotonic, so it only ever sees steps
//! forward (a paused tokio clock that is advanced).
//!
//! With the callers' clocks ([`TimeSource::Caller`](crate::backend::TimeSource)), say
//! within `s` of each other, buckets are never moved back: a caller whose clock is
//! behind the newest bucket counts from that bucket instead (moving them back would age
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
//! use tower_redis_ratelimit::{key::HeaderKey, rolling::RollingWindowLayer, Backend};
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

pub(crate) mod memory;

use std::num::NonZeroU32;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_redis::redis::ScriptInvocation;

use self::memory::{Grid, Rings};
use crate::backend::{self, Backend, Hosts, Remote, Scripts};
use crate::decision::{Decision, Policy, Source, State};
use crate::error::ConfigError;
use crate::limiter::{Check, Limiter};
use crate::service::{Algorithm, LayerBuilder, LimitLayer};

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new(include_str!("rolling.lua")));

/// The most buckets a window may have (each check of the Redis script visits them all).
pub const MAX_BUCKETS: u32 = 1_000;

/// The longest window accepted (ten years, as for the fixed window's period).
const MAX_WINDOW_MS: u64 = 10 * 366 * 86_400_000;

/// The settings of a rolling-window limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct RollingConfig {
    limit: u64,
    buckets: u32,
    interval: Duration,
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
        }
    }

    fn interval_ms(&self) -> u64 {
        u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX)
    }

    /// The limit, for [`dynamic`](crate::dynamic) limits.
    pub(crate) fn limit_value(&self) -> u64 {
        self.limit
    }

    /// The same settings with another limit, for [`dynamic`](crate::dynamic) limits.
    pub(crate) fn with_limit_value(&self, limit: u64) -> Self {
        Self { limit, ..*self }
    }
}

impl Algorithm for RollingConfig {
    type Limiter = RollingWindowLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<RollingWindowLimiter, ConfigError> {
        RollingWindowLimiter::new(backend, name, self)
    }
}

/// A rolling-window [`Limiter`] on a [`Backend`].
#[derive(Debug, Clone)]
pub struct RollingWindowLimiter {
    store: Arc<RollingStore>,
}

#[derive(Debug)]
struct RollingStore {
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
    /// A [`ConfigError`] for a zero limit, zero or more than [`MAX_BUCKETS`] buckets, an
    /// interval under one millisecond, a window (`buckets` × `interval`) over ten years,
    /// more buckets than the backend's in-process state holds for one key (with a tiny
    /// [`max_local_keys`](crate::BackendBuilder::max_local_keys)), or an invalid name.
    pub fn new(backend: &Backend, name: &str, config: RollingConfig) -> Result<Self, ConfigError> {
        crate::error::validate_name("name", name)?;
        if config.limit == 0 {
            return Err(ConfigError::Zero { setting: "limit" });
        }
        if config.buckets == 0 {
            return Err(ConfigError::Zero { setting: "buckets" });
        }
        if config.buckets > MAX_BUCKETS {
            return Err(ConfigError::TooLong { setting: "buckets" });
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
        Ok(Self {
            store: Arc::new(RollingStore {
                remote: Remote::new(backend, "rolling", name),
                policy: Policy::new(name, config.limit, Duration::from_millis(window_ms)),
                limit: config.limit,
                local_limit: backend.local_limit(config.limit),
                buckets: config.buckets,
                interval_ms,
                rings: Rings::new(
                    store,
                    Grid {
                        buckets: u64::from(config.buckets),
                        interval_us: interval_ms * 1_000,
                    },
                ),
            }),
        })
    }
}

impl Limiter for RollingWindowLimiter {
    fn policy(&self) -> &Policy {
        &self.store.policy
    }

    fn check(&self, key: &[u8], cost: NonZeroU32) -> Check {
        backend::check(&self.store, key, cost)
    }
}

impl RollingStore {
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

impl Hosts for RollingStore {
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

    fn scripts(&self) -> &'static Scripts {
        &SCRIPTS
    }

    fn args(&self, invocation: &mut ScriptInvocation<'static>, cost: NonZeroU32) {
        invocation
            .arg(self.limit)
            .arg(self.buckets)
            .arg(self.interval_ms)
            .arg(cost.get());
    }

    fn decide(&self, reply: &[i64], _cost: NonZeroU32) -> Option<Decision> {
        let &[admitted, sum, retry_ms, reset_ms] = reply else {
            return None;
        };
        let admitted = match admitted {
            1 => true,
            0 => false,
            _ => return None,
        };
        let sum = u64::try_from(sum).ok()?;
        let ms = |value: i64| Duration::from_millis(u64::try_from(value).unwrap_or(0));
        Some(Self::decision(
            self.limit,
            admitted,
            sum,
            ms(retry_ms),
            ms(reset_ms),
            Source::Redis,
        ))
    }

    fn local(&self, key: &[u8], cost: NonZeroU32, source: Source) -> Decision {
        let now_us = self.remote.backend().clock().now_us();
        let limit = self.local_limit;
        let hit = self.rings.hit(key, u64::from(cost.get()), limit, now_us);
        Self::decision(
            limit,
            hit.admitted,
            hit.sum,
            Duration::from_micros(hit.retry_us),
            Duration::from_micros(hit.reset_us),
            source,
        )
    }
}

/// Rolling-window settings on the layer builder.
impl<K, C, R> LayerBuilder<RollingConfig, K, C, R> {
    /// Units admitted within any window (required, at least 1).
    pub fn limit(mut self, limit: u64) -> Self {
        self.algorithm.limit = limit;
        self
    }

    /// How many buckets make up the window (required, 1 to [`MAX_BUCKETS`]). More
    /// buckets track the window more closely.
    pub fn buckets(mut self, buckets: u32) -> Self {
        self.algorithm.buckets = buckets;
        self
    }

    /// The time one bucket covers (required; whole milliseconds, at least 1 ms). The
    /// window is `buckets` × `interval`.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.algorithm.interval = interval;
        self
    }
}

/// A layer that applies a rolling-window limit; see the [`rolling`](crate::rolling)
/// module.
pub type RollingWindowLayer<
    K = crate::key::GlobalKey,
    C = crate::UnitCost,
    R = crate::DefaultRejection,
> = LimitLayer<RollingWindowLimiter, K, C, R>;

impl RollingWindowLayer {
    /// Starts building a rolling-window layer on `backend`.
    pub fn builder(backend: &Backend) -> LayerBuilder<RollingConfig> {
        LayerBuilder::new(backend, RollingConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: NonZeroU32 = NonZeroU32::MIN;
    const MS: Duration = Duration::from_millis(1);

    fn cost(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    fn build(config: RollingConfig) -> Result<RollingWindowLimiter, ConfigError> {
        RollingWindowLimiter::new(&Backend::in_process(), "t", config)
    }

    /// `limit` per 10 buckets of 100 ms.
    fn limiter(limit: u64) -> RollingWindowLimiter {
        build(RollingConfig::new(limit, 10, 100 * MS)).unwrap()
    }

    fn now_us(limiter: &RollingWindowLimiter) -> u64 {
        limiter.store.remote.backend().clock().now_us()
    }

    /// Advances the paused clock to the next multiple of `step_us` in Unix time (a
    /// bucket or window edge) and returns the time there.
    async fn align(limiter: &RollingWindowLimiter, step_us: u64) -> u64 {
        let into = now_us(limiter) % step_us;
        if into != 0 {
            tokio::time::advance(Duration::from_micros(step_us - into)).await;
        }
        now_us(limiter)
    }

    #[test]
    fn invalid_configurations() {
        let ms = Duration::from_millis(1);
        let cases = [
            (
                RollingConfig::new(0, 10, ms),
                ConfigError::Zero { setting: "limit" },
            ),
            (
                RollingConfig::new(1, 0, ms),
                ConfigError::Zero { setting: "buckets" },
            ),
            (
                RollingConfig::new(1, 10, Duration::ZERO),
                ConfigError::ZeroDuration {
                    setting: "interval",
                },
            ),
            (
                RollingConfig::new(1, 10, Duration::from_micros(999)),
                ConfigError::ZeroDuration {
                    setting: "interval",
                },
            ),
            (
                RollingConfig::new(1, MAX_BUCKETS + 1, ms),
                ConfigError::TooLong { setting: "buckets" },
            ),
            (
                RollingConfig::new(1, 10, Duration::from_secs(367 * 86_400)),
                ConfigError::TooLong {
                    setting: "interval",
                },
            ),
            (
                RollingConfig::new(1, 1, Duration::MAX),
                ConfigError::TooLong {
                    setting: "interval",
                },
            ),
            (
                RollingConfig::default(),
                ConfigError::Zero { setting: "limit" },
            ),
        ];
        for (config, error) in cases {
            assert_eq!(build(config).unwrap_err(), error, "{config:?}");
        }
        assert!(matches!(
            RollingWindowLimiter::new(&Backend::in_process(), "", RollingConfig::new(1, 1, ms)),
            Err(ConfigError::InvalidName { .. })
        ));
        assert!(matches!(
            RollingWindowLimiter::new(&Backend::in_process(), "{x}", RollingConfig::new(1, 1, ms)),
            Err(ConfigError::InvalidName { .. })
        ));
        // A key must fit in the in-process state.
        let small = Backend::builder().max_local_keys(10).build().unwrap();
        assert!(matches!(
            RollingWindowLimiter::new(&small, "t", RollingConfig::new(1, MAX_BUCKETS, ms)),
            Err(ConfigError::Conflict { .. })
        ));
        assert!(RollingWindowLimiter::new(&small, "t", RollingConfig::new(1, 80, ms)).is_ok());
        // The edges that are accepted.
        assert!(build(RollingConfig::new(1, MAX_BUCKETS, ms)).is_ok());
        assert!(build(RollingConfig::new(1, 10, Duration::from_secs(365 * 86_400))).is_ok());
    }

    #[test]
    fn builder_sets_the_policy() {
        let layer = RollingWindowLayer::builder(&Backend::in_process())
            .name("api")
            .limit(7)
            .buckets(4)
            .interval(Duration::from_micros(250_900))
            .build()
            .unwrap();
        let policy = layer.limiter().policy();
        assert_eq!(policy.name(), "api");
        assert_eq!(policy.quota(), 7);
        // Sub-millisecond parts of the interval are ignored: 4 × 250 ms.
        assert_eq!(policy.window(), Duration::from_secs(1));
        assert_eq!(
            layer.limiter().store.remote.redis_key(b"k"),
            b"ratelimit:{v1:k}:rolling:api"
        );
        let missing = RollingWindowLayer::builder(&Backend::in_process())
            .name("api")
            .limit(7)
            .interval(MS)
            .build()
            .unwrap_err();
        assert_eq!(missing, ConfigError::Zero { setting: "buckets" });
    }

    #[tokio::test(start_paused = true)]
    async fn admits_exactly_the_limit_within_a_window() {
        let limiter = limiter(5);
        let mut states = Vec::new();
        for _ in 0..7 {
            states.push(limiter.check(b"k", ONE).await.state);
            tokio::time::advance(10 * MS).await;
        }
        use State::*;
        assert_eq!(
            states,
            [Allowed, Allowed, Allowed, Allowed, HitQuota, OverQuota, OverQuota]
        );
        let over = limiter.check(b"k", ONE).await;
        assert_eq!(over.source, Source::InProcess);
        assert_eq!(over.limit, 5);
        assert_eq!(over.remaining, 0);
        assert!(over.retry_after.unwrap() <= Duration::from_secs(1));
        // Another key is unaffected.
        assert_eq!(limiter.check(b"other", ONE).await.remaining, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn buckets_expire_one_at_a_time() {
        let limiter = limiter(4);
        let t0 = align(&limiter, 100_000).await;
        // Two units in bucket 0, two in bucket 3.
        limiter.check(b"k", cost(2)).await;
        tokio::time::advance(300 * MS).await;
        let d = limiter.check(b"k", cost(2)).await;
        assert_eq!(d.state, State::HitQuota);
        // Every unit expires when bucket 3 does, 1.3 s after t0.
        assert_eq!(d.reset, Duration::from_millis(1_000));
        // Until bucket 0 ends (1 s after t0), nothing fits.
        tokio::time::advance(Duration::from_micros(
            1_000_000 - 1 - (now_us(&limiter) - t0),
        ))
        .await;
        let over = limiter.check(b"k", ONE).await;
        assert_eq!(over.state, State::OverQuota);
        assert_eq!(over.retry_after, Some(Duration::from_micros(1)));
        assert_eq!(over.reset, Duration::from_micros(300_001));
        // Then bucket 0's two units are free, but not bucket 3's.
        tokio::time::advance(Duration::from_micros(1)).await;
        assert_eq!(limiter.check(b"k", ONE).await.state, State::Allowed);
        assert_eq!(limiter.check(b"k", ONE).await.state, State::HitQuota);
        assert_eq!(limiter.check(b"k", ONE).await.state, State::OverQuota);
        // A whole window after the last admission, everything is free again.
        tokio::time::advance(Duration::from_secs(1)).await;
        let d = limiter.check(b"k", cost(4)).await;
        assert_eq!(d.state, State::HitQuota);
    }

    #[tokio::test(start_paused = true)]
    async fn weighted_costs() {
        let limiter = limiter(10);
        let d = limiter.check(b"k", cost(6)).await;
        assert_eq!((d.state, d.remaining), (State::Allowed, 4));
        // Too much for what is left: rejected, and not counted.
        let over = limiter.check(b"k", cost(5)).await;
        assert_eq!((over.state, over.remaining), (State::OverQuota, 4));
        let d = limiter.check(b"k", cost(4)).await;
        assert_eq!((d.state, d.remaining), (State::HitQuota, 0));
        // More than the whole limit can never pass, and says so without a retry-after.
        let never = limiter.check(b"fresh", cost(11)).await;
        assert_eq!(never.state, State::ExceedsCapacity);
        assert_eq!(never.retry_after, None);
        assert_eq!(never.reset, Duration::from_secs(1));
        assert_eq!(
            limiter.check(b"fresh", cost(10)).await.state,
            State::HitQuota
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_exact() {
        let limiter = limiter(10);
        // Each cost waits for a different bucket to expire.
        for units in [1, 3, 4, 6, 9, 10] {
            let key = format!("k{units}");
            // Units spread over several buckets, at odd times within them.
            for (wait_ms, u) in [(0, 3), (130, 2), (170, 4), (260, 1)] {
                tokio::time::advance(wait_ms * MS).await;
                assert!(limiter.check(key.as_bytes(), cost(u)).await.is_admitted());
            }
            tokio::time::advance(20 * MS).await;
            let over = limiter.check(key.as_bytes(), cost(units)).await;
            assert_eq!(over.state, State::OverQuota, "cost {units}");
            let retry = over.retry_after.unwrap();
            assert!(retry > Duration::ZERO && retry <= Duration::from_secs(1));
            assert!(retry <= over.reset);
            tokio::time::advance(retry - Duration::from_micros(1)).await;
            let early = limiter.check(key.as_bytes(), cost(units)).await;
            assert_eq!(early.state, State::OverQuota, "cost {units}, just before");
            assert_eq!(early.retry_after, Some(Duration::from_micros(1)));
            tokio::time::advance(Duration::from_micros(1)).await;
            let d = limiter.check(key.as_bytes(), cost(units)).await;
            assert!(d.is_admitted(), "cost {units}, after retry-after: {d:?}");
        }
    }

    const WINDOW_US: u64 = 1_000_000;
    const INTERVAL_US: u64 = 100_000;

    /// Sends a burst of `limit` unit requests spread over the last `spread_ms` before a
    /// window edge, then unit probes every `probe_ms` for two windows from `phase_us`
    /// after the edge. Returns the admission times (µs since the start of the window).
    async fn straddle(
        limiter: &RollingWindowLimiter,
        key: &str,
        limit: u64,
        spread_ms: u64,
        probe_ms: u64,
        phase_us: u64,
    ) -> Vec<u64> {
        let t0 = align(limiter, WINDOW_US).await;
        let burst_start = WINDOW_US - spread_ms * 1_000;
        let burst = (0..limit).map(|i| burst_start + i * spread_ms * 1_000 / limit);
        let probes = (0..)
            .map(|i| WINDOW_US + phase_us + i * probe_ms * 1_000)
            .take_while(|&at| at < 3 * WINDOW_US);
        let mut admitted = Vec::new();
        for (i, at) in burst.chain(probes).enumerate() {
            tokio::time::advance(Duration::from_micros(t0 + at - now_us(limiter))).await;
            let d = limiter.check(key.as_bytes(), ONE).await;
            if (i as u64) < limit {
                assert!(d.is_admitted(), "the burst fits");
            }
            if d.is_admitted() {
                admitted.push(at);
            }
        }
        admitted
    }

    /// The rolling window's guarantees on a list of admission times (µs, one per unit).
    fn assert_rolling_bounds(admitted: &[u64], limit: usize, buckets: u64, interval_us: u64) {
        let window_us = buckets * interval_us;
        let count = |from: u64, to_excl: u64| {
            admitted
                .iter()
                .filter(|&&t| t >= from && t < to_excl)
                .count()
        };
        for &s in admitted {
            // Any span of buckets - 1 intervals (closed) holds at most the limit.
            let short = count(s, s + (buckets - 1) * interval_us + 1);
            assert!(
                short <= limit,
                "{short} admitted within (B-1) intervals from {s}"
            );
            // Any window-long span: at most the limit plus its first interval (the error
            // is at most one bucket).
            let long = count(s, s + window_us);
            let first = count(s, s + interval_us);
            assert!(
                long <= limit + first,
                "{long} admitted in the window from {s} ({first} in its first interval)"
            );
        }
        // Any `buckets` consecutive buckets hold at most the limit.
        let last = admitted.iter().max().copied().unwrap_or(0);
        for k in 0..=last / interval_us {
            let aligned = count(k * interval_us, (k + buckets) * interval_us);
            assert!(
                aligned <= limit,
                "{aligned} admitted in buckets {k}..+{buckets}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn straddling_a_window_edge_does_not_double_the_limit() {
        let limit = 10;
        let limiter = limiter(limit);
        let mut scenario = 0;
        for spread_ms in [1, 100, 250, 500] {
            for probe_ms in [1, 7, 10, 33] {
                for phase_us in [0, 1, 40_000, 99_999] {
                    scenario += 1;
                    let key = format!("s{scenario}");
                    let admitted =
                        straddle(&limiter, &key, limit, spread_ms, probe_ms, phase_us).await;
                    // A fixed window would admit `limit` more right after the edge; here
                    // nothing is admitted until the burst's first bucket has expired.
                    let burst_start = WINDOW_US - spread_ms * 1_000;
                    let first_free = (burst_start / INTERVAL_US) * INTERVAL_US + WINDOW_US;
                    let early = admitted
                        .iter()
                        .filter(|&&t| t >= WINDOW_US && t < first_free)
                        .count();
                    assert_eq!(early, 0, "scenario {scenario}: {admitted:?}");
                    // Probing for two windows admits again once the burst's buckets end.
                    assert!(admitted.len() > 10, "scenario {scenario}: {admitted:?}");
                    assert_rolling_bounds(&admitted, 10, 10, INTERVAL_US);
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_of_probes_never_beats_the_bounds() {
        // Many keys probed at different rates and phases, some with weighted costs.
        let limiter = build(RollingConfig::new(6, 4, 50 * MS)).unwrap();
        let t0 = align(&limiter, 200_000).await;
        let mut admitted: Vec<Vec<u64>> = vec![Vec::new(); 12];
        for step in 0..2_000u64 {
            let at = now_us(&limiter) - t0;
            for (k, times) in admitted.iter_mut().enumerate() {
                let k = k as u64;
                // Key k asks every (k % 5 + 1) ms with cost k % 3 + 1.
                if (step + k) % (k % 5 + 1) == 0 {
                    let c = (k % 3 + 1) as u32;
                    if limiter
                        .check(format!("key{k}").as_bytes(), cost(c))
                        .await
                        .is_admitted()
                    {
                        times.extend(std::iter::repeat_n(at, c as usize));
                    }
                }
            }
            tokio::time::advance(MS).await;
        }
        for times in &admitted {
            assert!(times.len() >= 6 * 5, "{}", times.len());
            assert_rolling_bounds(times, 6, 4, 50_000);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn fallback_source_is_reported() {
        let limiter = limiter(1);
        let d = limiter.store.local(b"k", ONE, Source::Fallback);
        assert_eq!(d.source, Source::Fallback);
        assert_eq!(d.state, State::HitQuota);
    }

    #[tokio::test(start_paused = true)]
    async fn the_fallback_applies_its_share_of_the_limit() {
        let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        let backend = Backend::builder()
            .redis(pool)
            .fallback_share(0.25)
            .build()
            .unwrap();
        let limiter =
            RollingWindowLimiter::new(&backend, "t", RollingConfig::new(10, 10, 100 * MS)).unwrap();
        assert_eq!(limiter.policy().quota(), 10);
        let store = &limiter.store;
        let first = store.local(b"k", ONE, Source::Fallback);
        assert_eq!(
            (first.state, first.limit, first.remaining),
            (State::Allowed, 2, 1)
        );
        assert_eq!(
            store.local(b"k", ONE, Source::Fallback).state,
            State::HitQuota
        );
        let over = store.local(b"k", ONE, Source::Fallback);
        assert_eq!(
            (over.state, over.source),
            (State::OverQuota, Source::Fallback)
        );
        // A cost within the limit but above the fallback's share waits for a window.
        let big = store.local(b"other", cost(3), Source::Fallback);
        assert_eq!(big.state, State::OverQuota);
        assert_eq!(big.retry_after, Some(Duration::from_secs(1)));
    }

    #[test]
    fn redis_replies_are_read() {
        let limiter = limiter(10);
        let store = &limiter.store;
        let d = store.decide(&[1, 10, 0, 950], ONE).unwrap();
        assert_eq!(
            (d.state, d.remaining, d.source),
            (State::HitQuota, 0, Source::Redis)
        );
        assert_eq!(d.reset, Duration::from_millis(950));
        let d = store.decide(&[1, 3, 0, 950], ONE).unwrap();
        assert_eq!((d.state, d.remaining), (State::Allowed, 7));
        let d = store.decide(&[0, 9, 120, 990], cost(2)).unwrap();
        assert_eq!((d.state, d.remaining), (State::OverQuota, 1));
        assert_eq!(d.retry_after, Some(Duration::from_millis(120)));
        assert!(store.decide(&[1, 2, 3], ONE).is_none());
        assert!(store.decide(&[2, 2, 3, 4], ONE).is_none());
        assert!(store.decide(&[1, -2, 3, 4], ONE).is_none());
    }
}
