//! The algorithms' layers: for each algorithm, a name for the generic [`LimitLayer`]
//! applying its limiter, and that algorithm's settings on the [`LayerBuilder`].
//!
//! This is the only place where an algorithm meets tower: the algorithm modules
//! ([`period`](crate::period), [`token_bucket`](crate::token_bucket),
//! [`rolling`](crate::rolling)) know nothing of services and layers.

use std::time::Duration;

use crate::backend::Backend;
use crate::error::ConfigError;
use crate::period::{PeriodConfig, PeriodLimiter, UtcOffset};
use crate::service::{Algorithm, LayerBuilder, LimitLayer};
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
}

impl Algorithm for TokenBucketConfig {
    type Limiter = TokenBucketLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<TokenBucketLimiter, ConfigError> {
        TokenBucketLimiter::new(backend, name, self)
    }
}
