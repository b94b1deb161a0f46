//! Token buckets: `rate` tokens per `period` refill a bucket of `burst` tokens per key;
//! a request takes its cost in tokens or is refused until enough have dripped back.
//!
//! A bucket starts full, so a quiet client may send `burst` requests at once; after that
//! it gets the refill rate. Refill is continuous (not in whole-second steps) and costs
//! are weighted: a cost above `burst` can never pass and is refused as
//! [`State::ExceedsCapacity`] without a `Retry-After`.
//!
//! In Redis a bucket is one key holding its theoretical arrival time (the GCRA form of a
//! token bucket), updated by a Lua script that reads the Redis server's clock with
//! microsecond precision; the key expires once the bucket would be full again (never
//! with a zero expiry, whatever the rate and burst). In-process, buckets are kept by
//! [`governor`](https://docs.rs/governor) with the same algorithm; there the emission
//! interval is rounded down to whole nanoseconds, and idle buckets are dropped on a
//! schedule.
//!
//! `RateLimit-Policy` advertises `q` = burst and `w` = the time to refill a full bucket.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{key::PeerIp, Backend, TokenBucketLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! // 100 requests per second on average, bursts of up to 20.
//! let layer = TokenBucketLayer::builder(&Backend::in_process())
//!     .name("api")
//!     .rate(100, Duration::from_secs(1))
//!     .burst(20)
//!     .key(PeerIp::new())
//!     .build()?;
//! # let _ = layer; Ok(()) }
//! ```

use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_redis::redis::{Script, ScriptInvocation};
use governor::clock::Clock as GovernorClock;
use governor::middleware::StateInformationMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

use crate::backend::{self, Backend, KeyHasher, PreHashed, Remote, Store};
use crate::clock::Clock;
use crate::decision::{Decision, Policy, Source, State};
use crate::error::{check_name, ConfigError};
use crate::limiter::{Check, Limiter};
use crate::local::{self, Sweep};
use crate::service::{Algorithm, LayerBuilder, RateLimitLayer};

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("token_bucket.lua")));

/// Arrival times in Redis count microseconds from this Unix time (2026-01-01T00:00:00Z),
/// so that the script's doubles keep sub-microsecond precision for decades.
const TAT_EPOCH_SECS: i64 = 1_767_225_600;

/// How often idle in-process buckets are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// One check in this many looks at the clock to see whether a sweep is due.
const SWEEP_SAMPLE: u32 = 64;

/// The settings of a token bucket.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucketConfig {
    rate: u64,
    period: Duration,
    burst: u64,
}

impl Default for TokenBucketConfig {
    fn default() -> Self {
        Self {
            rate: 0,
            period: Duration::from_secs(1),
            burst: 0,
        }
    }
}

impl TokenBucketConfig {
    /// `rate` tokens per `period` (e.g. 100 per second, 1 per minute, 5000 per hour)
    /// into a bucket of `burst` tokens.
    #[must_use]
    pub fn new(rate: u64, period: Duration, burst: u64) -> Self {
        Self {
            rate,
            period,
            burst,
        }
    }
}

impl Algorithm for TokenBucketConfig {
    type Limiter = TokenBucketLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<TokenBucketLimiter, ConfigError> {
        TokenBucketLimiter::new(backend, name, self)
    }
}

/// A token-bucket [`Limiter`] on a [`Backend`].
#[derive(Debug, Clone)]
pub struct TokenBucketLimiter {
    store: Arc<BucketStore>,
}

type Buckets =
    RateLimiter<u128, DashMapStateStore<u128, PreHashed>, TokioClock, StateInformationMiddleware>;

struct BucketStore {
    remote: Remote,
    policy: Policy,
    burst: u64,
    /// Microseconds per token, for the script.
    interval_us: f64,
    /// The in-process bucket's capacity (the fallback share of `burst` on Redis).
    local_burst: u64,
    /// Nanoseconds per token in-process (the fallback share of the rate on Redis).
    local_interval_ns: u64,
    buckets: Arc<Buckets>,
    hasher: KeyHasher,
    sweep: Sweep,
    /// Checks so far, to sample the sweep's clock reads.
    checks: AtomicU32,
}

impl fmt::Debug for BucketStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("policy", &self.policy)
            .field("interval_us", &self.interval_us)
            .field("local_buckets", &self.buckets.len())
            .finish_non_exhaustive()
    }
}

/// governor's clock, driven by the crate's clock (so tokio's paused clock drives it).
#[derive(Debug, Clone)]
struct TokioClock(Clock);

impl GovernorClock for TokioClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::new(self.0.elapsed_ns())
    }
}

impl TokenBucketLimiter {
    /// Checks `config` and builds the limiter named `name` on `backend`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a zero rate, burst or period, a burst above `u32::MAX`, a
    /// rate above one token per microsecond (the precision of the Redis script's clock
    /// arithmetic), a full-bucket refill time above ten years, or an invalid name.
    pub fn new(
        backend: &Backend,
        name: &str,
        config: TokenBucketConfig,
    ) -> Result<Self, ConfigError> {
        check_name("name", name)?;
        if config.rate == 0 {
            return Err(ConfigError::Zero { setting: "rate" });
        }
        if config.burst == 0 {
            return Err(ConfigError::Zero { setting: "burst" });
        }
        if config.period.is_zero() {
            return Err(ConfigError::ZeroDuration { setting: "period" });
        }
        let burst = u32::try_from(config.burst).map_err(|_| ConfigError::TooLarge {
            setting: "burst",
            max: u64::from(u32::MAX),
        })?;
        let burst = NonZeroU32::new(burst).expect("checked above");
        let period_ns = config.period.as_nanos();
        let interval_ns = u64::try_from(period_ns / u128::from(config.rate)).unwrap_or(u64::MAX);
        if interval_ns < 1_000 {
            return Err(ConfigError::Conflict {
                reason: "the rate is above one token per microsecond (1 000 000 per second)",
            });
        }
        let refill_ns = u128::from(interval_ns) * u128::from(config.burst);
        if refill_ns > 10 * 366 * 86_400 * 1_000_000_000 {
            return Err(ConfigError::TooLong { setting: "period" });
        }
        // The in-process state applies the fallback share of both rate and burst.
        let local_burst = backend.local_limit(config.burst);
        let share = local_burst as f64 / config.burst as f64;
        let local_interval_ns = (interval_ns as f64 / share).ceil() as u64;
        let quota = Quota::with_period(Duration::from_nanos(local_interval_ns))
            .expect("interval is at least one nanosecond")
            .allow_burst(
                NonZeroU32::new(u32::try_from(local_burst).unwrap_or(burst.get())).unwrap_or(burst),
            );
        let buckets = RateLimiter::dashmap_with_clock_and_hasher(
            quota,
            TokioClock(backend.clock()),
            PreHashed,
        )
        .with_middleware::<StateInformationMiddleware>();
        let refill = Duration::from_nanos(u64::try_from(refill_ns).unwrap_or(u64::MAX));
        Ok(Self {
            store: Arc::new(BucketStore {
                remote: Remote::new(backend, "token", name),
                policy: Policy::new(name, config.burst, refill),
                burst: config.burst,
                local_burst,
                local_interval_ns,
                // Exact, not rounded to nanoseconds: 3 per second is 333333.33 µs.
                interval_us: config.period.as_secs_f64() * 1e6 / config.rate as f64,
                buckets: Arc::new(buckets),
                hasher: KeyHasher::default(),
                checks: AtomicU32::new(0),
                sweep: Sweep::every(u64::try_from(SWEEP_EVERY.as_nanos()).unwrap_or(u64::MAX)),
            }),
        })
    }
}

impl Limiter for TokenBucketLimiter {
    fn policy(&self) -> &Policy {
        &self.store.policy
    }

    fn check(&self, key: &[u8], cost: NonZeroU32) -> Check {
        backend::check(&self.store, key, cost)
    }
}

impl BucketStore {
    fn tokens_duration(&self, tokens: u64) -> Duration {
        Duration::from_nanos(self.local_interval_ns.saturating_mul(tokens))
    }

    /// A 128-bit key for governor: hashing with two random seeds avoids allocating an
    /// owned key per check, and collisions are out of reach of attackers.
    fn local_key(&self, key: &[u8]) -> u128 {
        self.hasher.hash(key)
    }

    /// Drops idle buckets when a sweep is due; the clock is read on one check in
    /// [`SWEEP_SAMPLE`] only, so the common check reads it once (in governor).
    fn maybe_sweep(&self) {
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_SAMPLE != 0 {
            return;
        }
        if self.sweep.due(self.remote.backend().clock().elapsed_ns()) {
            let buckets = Arc::clone(&self.buckets);
            local::off_the_request_path(move || {
                buckets.retain_recent();
                buckets.shrink_to_fit();
            });
        }
    }
}

impl Store for BucketStore {
    fn remote(&self) -> &Remote {
        &self.remote
    }

    fn capacity(&self) -> u64 {
        self.burst
    }

    fn exceeds_capacity(&self, source: Source) -> Decision {
        Decision::new(
            State::ExceedsCapacity,
            self.burst,
            0,
            Duration::ZERO,
            source,
        )
    }

    fn script(&self) -> &'static Script {
        &SCRIPT
    }

    fn args(&self, invocation: &mut ScriptInvocation<'static>, cost: NonZeroU32) {
        invocation
            .arg(self.interval_us)
            .arg(self.burst)
            .arg(cost.get())
            .arg(TAT_EPOCH_SECS);
    }

    fn decide(&self, reply: &[i64], _cost: NonZeroU32) -> Option<Decision> {
        let &[admitted, left, wait_us, full_us] = reply else {
            return None;
        };
        let us = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
        let left = u64::try_from(left).unwrap_or(0);
        Some(if admitted == 1 {
            let state = if left == 0 {
                State::HitQuota
            } else {
                State::Allowed
            };
            Decision::new(state, self.burst, left, us(full_us), Source::Redis)
        } else {
            Decision::new(
                State::OverQuota,
                self.burst,
                left,
                us(full_us),
                Source::Redis,
            )
            .with_retry_after(us(wait_us))
        })
    }

    fn local(&self, key: &[u8], cost: NonZeroU32, source: Source) -> Decision {
        self.maybe_sweep();
        let key = self.local_key(key);
        match self.buckets.check_key_n(&key, cost) {
            Ok(Ok(snapshot)) => {
                let burst = self.local_burst;
                let left = u64::from(snapshot.remaining_burst_capacity());
                let state = if left == 0 {
                    State::HitQuota
                } else {
                    State::Allowed
                };
                let reset = self.tokens_duration(burst - left.min(burst));
                Decision::new(state, burst, left, reset, source)
            }
            Ok(Err(not_until)) => {
                let now = self.buckets.clock().now();
                let wait = not_until.wait_time_from(now);
                let cost = u64::from(cost.get());
                let burst = self.local_burst;
                let missing = wait.as_nanos().div_ceil(u128::from(self.local_interval_ns));
                let left = cost.saturating_sub(u64::try_from(missing).unwrap_or(u64::MAX));
                let reset = wait + self.tokens_duration(burst - cost.min(burst));
                Decision::new(State::OverQuota, burst, left, reset, source).with_retry_after(wait)
            }
            // Above the burst, or above the fallback share of it.
            Err(_) => Decision::new(
                State::ExceedsCapacity,
                self.local_burst,
                0,
                Duration::ZERO,
                source,
            ),
        }
    }
}

/// Token-bucket settings on the layer builder.
impl<K, C, R> LayerBuilder<TokenBucketConfig, K, C, R> {
    /// `tokens` added per `period` (required; e.g. `rate(100, Duration::from_secs(1))`).
    pub fn rate(mut self, tokens: u64, period: Duration) -> Self {
        self.algorithm.rate = tokens;
        self.algorithm.period = period;
        self
    }

    /// The bucket's capacity: the largest burst, and the largest cost (required).
    pub fn burst(mut self, burst: u64) -> Self {
        self.algorithm.burst = burst;
        self
    }
}

/// A layer that applies a token bucket; see the [`token_bucket`](crate::token_bucket)
/// module.
pub type TokenBucketLayer<
    K = crate::key::GlobalKey,
    C = crate::UnitCost,
    R = crate::DefaultRejection,
> = RateLimitLayer<TokenBucketLimiter, K, C, R>;

impl TokenBucketLayer {
    /// Starts building a token-bucket layer on `backend`.
    pub fn builder(backend: &Backend) -> LayerBuilder<TokenBucketConfig> {
        LayerBuilder::new(backend, TokenBucketConfig::default())
    }
}

#[cfg(test)]
mod tests;
