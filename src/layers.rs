//! The algorithms' layers: for each algorithm, a name for the generic [`LimitLayer`]
//! applying its limiter, and that algorithm's settings on the [`LayerBuilder`].
//!
//! This is the only place where an algorithm meets tower: the algorithm modules
//! ([`period`](crate::period), [`token_bucket`](crate::token_bucket),
//! [`rolling`](crate::rolling)) know nothing of services and layers.

use std::time::Duration;

use crate::backend::Backend;
use crate::error::ConfigError;
use crate::limit::{Algorithm, LayerBuilder, LimitLayer};
use crate::period::{Calendar, PeriodConfig, PeriodLimiter, UtcOffset};
use crate::rolling::{RollingConfig, RollingWindowLimiter};
use crate::set::{LimitSet, SetLimiter, SetMember};
use crate::token_bucket::{TokenBucketConfig, TokenBucketLimiter};

// ---------------------------------------------------------------------------
// period
// ---------------------------------------------------------------------------

/// A layer that applies a fixed-window limit; see the [`period`](crate::period) module.
pub type PeriodLimitLayer<
    K = crate::key::GlobalKey,
    C = crate::UnitCost,
    R = crate::DefaultRejection,
> = LimitLayer<PeriodLimiter, K, C, R>;

impl PeriodLimitLayer {
    /// Starts building a fixed-window layer on `backend`.
    pub fn builder(backend: &Backend) -> LayerBuilder<PeriodConfig> {
        LayerBuilder::new(backend, PeriodConfig::default())
    }
}

/// Fixed-window settings on the layer builder.
impl<K, C, R> LayerBuilder<PeriodConfig, K, C, R> {
    /// Units admitted per window (required, at least 1).
    pub fn quota(mut self, quota: u64) -> Self {
        self.algorithm.quota = quota;
        self
    }

    /// The window length (required; whole milliseconds, at least 1 ms).
    pub fn period(mut self, period: Duration) -> Self {
        self.algorithm.period = period;
        self
    }

    /// Aligns windows to the calendar in a fixed UTC offset; see [`PeriodConfig::align`].
    pub fn align(mut self, offset: UtcOffset) -> Self {
        self.algorithm.align = Some(offset);
        self
    }

    /// Windows that follow the calendar of an IANA time zone (a local day, week or
    /// month), in place of [`period`](Self::period); see [`Calendar`].
    ///
    /// ```
    /// use tower_redis_ratelimit::{key::HeaderKey, period::Calendar, Backend, PeriodLimitLayer};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// // 5 SMS codes per phone per local day in New York (23 or 25 hours on DST days).
    /// let layer = PeriodLimitLayer::builder(&Backend::in_process())
    ///     .name("sms")
    ///     .quota(5)
    ///     .calendar(Calendar::day("America/New_York"))
    ///     .key(HeaderKey::from_static("x-phone"))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn calendar(mut self, calendar: Calendar) -> Self {
        self.algorithm.calendar = Some(calendar);
        self
    }

    /// Locks a key out for `duration` once this limit refuses it; see
    /// [`PeriodConfig::lockout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::key::GlobalKey;
    /// use tower_redis_ratelimit::{Backend, PeriodLimitLayer};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// // Five attempts per minute; a sixth locks the key out for 15 minutes.
    /// let layer = PeriodLimitLayer::builder(&Backend::in_process())
    ///     .name("login")
    ///     .key(GlobalKey)
    ///     .quota(5)
    ///     .period(Duration::from_secs(60))
    ///     .lockout(Duration::from_secs(15 * 60))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn lockout(mut self, duration: Duration) -> Self {
        self.algorithm.lockout = Some(duration);
        self
    }
}

impl Algorithm for PeriodConfig {
    type Limiter = PeriodLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<PeriodLimiter, ConfigError> {
        PeriodLimiter::new(backend, name, self)
    }
}

// ---------------------------------------------------------------------------
// token_bucket
// ---------------------------------------------------------------------------

/// A layer that applies a token bucket; see the [`token_bucket`](crate::token_bucket)
/// module.
pub type TokenBucketLayer<
    K = crate::key::GlobalKey,
    C = crate::UnitCost,
    R = crate::DefaultRejection,
> = LimitLayer<TokenBucketLimiter, K, C, R>;

impl TokenBucketLayer {
    /// Starts building a token-bucket layer on `backend`.
    pub fn builder(backend: &Backend) -> LayerBuilder<TokenBucketConfig> {
        LayerBuilder::new(backend, TokenBucketConfig::default())
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

    /// Leases tokens to this process, `size` at a time for at most `lifetime`
    /// (opt-in, approximate); see [`TokenBucketConfig::lease`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::key::GlobalKey;
    /// use tower_redis_ratelimit::{Backend, TokenBucketLayer};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// // 10 000 per second per key; each instance takes up to 50 at a time, for 100 ms.
    /// let layer = TokenBucketLayer::builder(&Backend::in_process())
    ///     .name("hot")
    ///     .key(GlobalKey)
    ///     .rate(10_000, Duration::from_secs(1))
    ///     .burst(10_000)
    ///     .lease(50, Duration::from_millis(100))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn lease(mut self, size: u64, lifetime: Duration) -> Self {
        self.algorithm.lease = Some((size, lifetime));
        self
    }

    /// Locks a key out for `duration` once this limit refuses it; see
    /// [`TokenBucketConfig::lockout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::key::GlobalKey;
    /// use tower_redis_ratelimit::{Backend, TokenBucketLayer};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let layer = TokenBucketLayer::builder(&Backend::in_process())
    ///     .name("api")
    ///     .key(GlobalKey)
    ///     .rate(10, Duration::from_secs(1))
    ///     .burst(20)
    ///     .lockout(Duration::from_secs(60))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn lockout(mut self, duration: Duration) -> Self {
        self.algorithm.lockout = Some(duration);
        self
    }
}

impl Algorithm for TokenBucketConfig {
    type Limiter = TokenBucketLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<TokenBucketLimiter, ConfigError> {
        TokenBucketLimiter::new(backend, name, self)
    }
}

// ---------------------------------------------------------------------------
// rolling
// ---------------------------------------------------------------------------

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

/// Rolling-window settings on the layer builder.
impl<K, C, R> LayerBuilder<RollingConfig, K, C, R> {
    /// Units admitted within any window (required, at least 1).
    pub fn limit(mut self, limit: u64) -> Self {
        self.algorithm.limit = limit;
        self
    }

    /// How many buckets make up the window (required, 1 to
    /// 1 000: each check of the Redis script visits them all). More buckets track the window more
    /// closely.
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

    /// Locks a key out for `duration` once this limit refuses it; see
    /// [`RollingConfig::lockout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::key::GlobalKey;
    /// use tower_redis_ratelimit::{Backend, RollingWindowLayer};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let layer = RollingWindowLayer::builder(&Backend::in_process())
    ///     .name("otp")
    ///     .key(GlobalKey)
    ///     .limit(3)
    ///     .buckets(10)
    ///     .interval(Duration::from_secs(6))
    ///     .lockout(Duration::from_secs(600))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn lockout(mut self, duration: Duration) -> Self {
        self.algorithm.lockout = Some(duration);
        self
    }
}

impl Algorithm for RollingConfig {
    type Limiter = RollingWindowLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<RollingWindowLimiter, ConfigError> {
        RollingWindowLimiter::new(backend, name, self)
    }
}

// ---------------------------------------------------------------------------
// set
// ---------------------------------------------------------------------------

/// A layer that applies a set of limits all or nothing; see the [`set`](crate::set)
/// module.
pub type LimitSetLayer<
    K = crate::key::GlobalKey,
    C = crate::UnitCost,
    R = crate::DefaultRejection,
> = LimitLayer<SetLimiter, K, C, R>;

impl LimitSetLayer {
    /// Starts building a layer of a set of limits on `backend`.
    pub fn builder(backend: &Backend) -> LayerBuilder<LimitSet> {
        LayerBuilder::new(backend, LimitSet::new())
    }
}

/// The limits of a set on the layer builder.
impl<K, C, R> LayerBuilder<LimitSet, K, C, R> {
    /// Adds the limit `name` with the settings of any algorithm (at least one is
    /// required); see [`LimitSet::limit`].
    pub fn limit(mut self, name: impl Into<String>, limit: impl Into<SetMember>) -> Self {
        self.algorithm = std::mem::take(&mut self.algorithm).limit(name, limit);
        self
    }

    /// Adds the limit `name` that counts requests, not their cost (one unit each, never
    /// settled); see [`LimitSet::requests`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::key::GlobalKey;
    /// use tower_redis_ratelimit::period::PeriodConfig;
    /// use tower_redis_ratelimit::{Backend, LimitSetLayer};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let minute = Duration::from_secs(60);
    /// let llm = LimitSetLayer::builder(&Backend::in_process())
    ///     .name("llm")
    ///     .key(GlobalKey)
    ///     .requests("rpm", PeriodConfig::new(60, minute))
    ///     .limit("tpm", PeriodConfig::new(10_000, minute))
    ///     .build()?;
    /// # let _ = llm; Ok(()) }
    /// ```
    pub fn requests(mut self, name: impl Into<String>, limit: impl Into<SetMember>) -> Self {
        self.algorithm = std::mem::take(&mut self.algorithm).requests(name, limit);
        self
    }

    /// Locks a key out for `duration` once the set refuses it, whichever limit refused;
    /// see [`LimitSet::lockout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::key::GlobalKey;
    /// use tower_redis_ratelimit::period::PeriodConfig;
    /// use tower_redis_ratelimit::{Backend, LimitSetLayer};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let layer = LimitSetLayer::builder(&Backend::in_process())
    ///     .name("login")
    ///     .key(GlobalKey)
    ///     .limit("minute", PeriodConfig::new(5, Duration::from_secs(60)))
    ///     .limit("day", PeriodConfig::new(20, Duration::from_secs(86_400)))
    ///     .lockout(Duration::from_secs(15 * 60))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn lockout(mut self, duration: Duration) -> Self {
        self.algorithm.lockout = Some(duration);
        self
    }
}

impl Algorithm for LimitSet {
    type Limiter = SetLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<SetLimiter, ConfigError> {
        SetLimiter::new(backend, name, self)
    }
}
