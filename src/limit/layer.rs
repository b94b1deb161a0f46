//! [`LimitLayer`], the one layer every algorithm builds (with
//! [`LayerBuilder`](super::LayerBuilder)): it wraps a service in a [`Limit`] that shares
//! the layer's limiter.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::{Limit, Shared};
use crate::key::GlobalKey;
use crate::limiter::Limiter;
use crate::response::DefaultRejection;

/// A tower [`Layer`] that rate-limits requests with limiter `L`, keyed by `K`, costed by
/// `C`, and answered with `R` when rejected.
///
/// Built with [`LimitLayer::builder`] and a config ([`PeriodConfig`](crate::PeriodConfig),
/// [`TokenBucketConfig`](crate::TokenBucketConfig), [`RollingConfig`](crate::RollingConfig),
/// [`LimitSet`](crate::LimitSet), [`Plans`](super::Plans),
/// [`DynamicLimits`](crate::DynamicLimits)). Cloning is cheap:
/// every clone, and every service it builds, shares one limiter.
pub struct LimitLayer<L, K = GlobalKey, C = u32, R = DefaultRejection> {
    pub(super) shared: Arc<Shared<L, K, C, R>>,
}

impl<L, K, C, R> LimitLayer<L, K, C, R> {
    /// The limiter every service of this layer asks.
    pub fn limiter(&self) -> &L {
        &self.shared.limiter
    }

    /// The layer's name (the builder's [`name`](super::LayerBuilder::name)).
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn name(&self) -> &str {
        &self.shared.name
    }

    /// The key extractor every service of this layer asks (for the admin actions by
    /// value).
    pub(super) fn extractor(&self) -> &K {
        &self.shared.key
    }

    /// The key this layer counts the request whose head is `parts` under, if it has one
    /// (within [`max_key_len`](Self::max_key_len)).
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn key_of(&self, parts: &http::request::Parts) -> Option<crate::key::Key<'static>>
    where
        K: crate::key::KeyExtractor,
    {
        let key = self.shared.key.extract(parts)?;
        (key.len() <= self.max_key_len()).then(|| key.into_owned())
    }

    /// The longest key this layer counts (longer ones are missing keys to it).
    pub(super) fn max_key_len(&self) -> usize {
        self.shared.options.max_key_len
    }
}

impl<L, K, C, R> Clone for LimitLayer<L, K, C, R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<L: Limiter, K, C, R> fmt::Debug for LimitLayer<L, K, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitLayer")
            .field("policies", &self.shared.limiter.policies())
            .field("shadow", &self.shared.options.shadow)
            .field("missing_key", &self.shared.options.missing_key)
            .finish_non_exhaustive()
    }
}

impl<S, L, K, C, R> Layer<S> for LimitLayer<L, K, C, R> {
    type Service = Limit<S, L, K, C, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Limit::from_shared(inner, Arc::clone(&self.shared))
    }
}
