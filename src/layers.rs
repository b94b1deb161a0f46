//! The algorithms' layers: for each algorithm, a name for the generic [`LimitLayer`]
//! applying its limiter, and its config's [`Algorithm`] impl (the config a
//! [`LimitLayer::builder`] takes).
//!
//! This is the only place where an algorithm meets tower: the algorithm modules
//! ([`period`](crate::PeriodConfig), [`token_bucket`](crate::TokenBucketConfig),
//! [`rolling`](crate::RollingConfig)) know nothing of services and layers.

use crate::backend::Backend;
use crate::error::ConfigError;
use crate::limit::{Algorithm, LimitLayer};
use crate::period::{PeriodConfig, PeriodLimiter};
use crate::rolling::{RollingConfig, RollingWindowLimiter};
use crate::set::{LimitSet, SetLimiter};
use crate::token_bucket::{TokenBucketConfig, TokenBucketLimiter};

// ---------------------------------------------------------------------------
// period
// ---------------------------------------------------------------------------

/// A layer that applies a fixed-window limit; see the [`period`](crate::PeriodConfig) module.
pub type PeriodLimitLayer<K = crate::key::GlobalKey, C = u32, R = crate::DefaultRejection> =
    LimitLayer<PeriodLimiter, K, C, R>;

impl Algorithm for PeriodConfig {
    type Limiter = PeriodLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<PeriodLimiter, ConfigError> {
        PeriodLimiter::new(backend, name, self)
    }
}

// ---------------------------------------------------------------------------
// token_bucket
// ---------------------------------------------------------------------------

/// A layer that applies a token bucket; see the [`token_bucket`](crate::TokenBucketConfig)
/// module.
pub type TokenBucketLayer<K = crate::key::GlobalKey, C = u32, R = crate::DefaultRejection> =
    LimitLayer<TokenBucketLimiter, K, C, R>;

impl Algorithm for TokenBucketConfig {
    type Limiter = TokenBucketLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<TokenBucketLimiter, ConfigError> {
        TokenBucketLimiter::new(backend, name, self)
    }
}

// ---------------------------------------------------------------------------
// rolling
// ---------------------------------------------------------------------------

/// A layer that applies a rolling-window limit; see the [`rolling`](crate::RollingConfig)
/// module.
pub type RollingWindowLayer<K = crate::key::GlobalKey, C = u32, R = crate::DefaultRejection> =
    LimitLayer<RollingWindowLimiter, K, C, R>;

impl Algorithm for RollingConfig {
    type Limiter = RollingWindowLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<RollingWindowLimiter, ConfigError> {
        RollingWindowLimiter::new(backend, name, self)
    }
}

// ---------------------------------------------------------------------------
// set
// ---------------------------------------------------------------------------

impl Algorithm for LimitSet {
    type Limiter = SetLimiter;

    fn build(self, backend: &Backend, name: &str) -> Result<SetLimiter, ConfigError> {
        SetLimiter::new(backend, name, self)
    }
}
