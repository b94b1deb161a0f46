//! [`InFlightLimitLayer`] and its builder: the slots, the lease and the settings every
//! layer has, checked when the layer is built.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::service::{InFlightService, Shared};
use super::{InFlightConfig, InFlightLimiter};
use crate::backend::{Backend, FailurePolicy};
use crate::error::ConfigError;
use crate::key::{GlobalKey, Key, KeyExtractor, KeyForError};
use crate::metrics::LayerMetrics;
use crate::response::{DefaultRejection, OnRejection};
use crate::service::{LayerBuilder, MissingKey, MissingKeyWarning};

/// A layer that allows at most N requests of one key in flight at once, across every
/// instance sharing the backend's Redis; see the [`in_flight`](super) module.
pub struct InFlightLimitLayer<K = GlobalKey, R = DefaultRejection> {
    shared: Arc<Shared<K, R>>,
}

impl InFlightLimitLayer {
    /// Starts building an in-flight layer on `backend`.
    pub fn builder(backend: &Backend) -> InFlightLayerBuilder {
        InFlightLayerBuilder {
            inner: LayerBuilder::new(backend, InFlightConfig::default()),
        }
    }
}

impl<K, R> InFlightLimitLayer<K, R> {
    /// The limiter every service of this layer asks (a handle for
    /// [`in_flight`](InFlightLimiter::in_flight)).
    pub fn limiter(&self) -> &InFlightLimiter {
        &self.shared.limiter
    }

    /// The keys this layer counts a request carrying the client's `value` under,
    /// exactly as its extractor would make them; see [`KeyExtractor::keys_for`] and
    /// [`LimitLayer::keys_for`](crate::LimitLayer::keys_for).
    ///
    /// Keys longer than the layer's [`max_key_len`](InFlightLayerBuilder::max_key_len)
    /// are left out: the layer never counts them.
    ///
    /// # Errors
    ///
    /// A [`KeyForError`] when the extractor never counts `value`, or cannot say
    /// ([`KeyForError::TooLong`] when its every key is too long for the layer).
    ///
    /// ```
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, InFlightLimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let exports = InFlightLimitLayer::builder(&Backend::in_process())
    ///     .name("export")
    ///     .slots(2)
    ///     .key(HeaderKey::from_static("x-merchant-id"))
    ///     .build()?;
    /// assert_eq!(exports.keys_for("acme")?, ["hdr:x-merchant-id:acme"]);
    /// # Ok(()) }
    /// ```
    pub fn keys_for(&self, value: impl AsRef<[u8]>) -> Result<Vec<Key<'static>>, KeyForError>
    where
        K: KeyExtractor,
    {
        let max_key_len = self.shared.options.max_key_len;
        crate::key::fitting(self.shared.key.keys_for(value.as_ref())?, max_key_len)
    }

    /// How many slots the client with `value` holds now
    /// ([`InFlightLimiter::in_flight`]), for each key of [`keys_for`](Self::keys_for).
    /// Changes nothing. (An in-flight limit has no reset or block: a slot is given back
    /// when its request ends, or its lease runs out.)
    ///
    /// # Errors
    ///
    /// A [`KeyForError`] when the extractor never counts `value`, or cannot say.
    ///
    /// ```
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, InFlightLimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let exports = InFlightLimitLayer::builder(&Backend::in_process())
    ///     .name("export")
    ///     .slots(2)
    ///     .key(HeaderKey::from_static("x-merchant-id"))
    ///     .build()?;
    /// let slot = exports.limiter().acquire(b"hdr:x-merchant-id:acme").await;
    /// let held = exports.in_flight_value("acme").await?;
    /// assert_eq!(held, [("hdr:x-merchant-id:acme".into(), 1)]);
    /// # drop(slot); Ok(()) }
    /// ```
    pub async fn in_flight_value(
        &self,
        value: impl AsRef<[u8]>,
    ) -> Result<Vec<(Key<'static>, u64)>, KeyForError>
    where
        K: KeyExtractor,
    {
        let keys = self.keys_for(value)?;
        let mut held = Vec::with_capacity(keys.len());
        for key in keys {
            let count = self.shared.limiter.in_flight(&key).await;
            held.push((key, count));
        }
        Ok(held)
    }
}

impl<K, R> Clone for InFlightLimitLayer<K, R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, R> fmt::Debug for InFlightLimitLayer<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimitLayer")
            .field("limiter", &self.shared.limiter)
            .field("shadow", &self.shared.options.shadow)
            .finish_non_exhaustive()
    }
}

impl<S, K, R> Layer<S> for InFlightLimitLayer<K, R> {
    type Service = InFlightService<S, K, R>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightService::new(inner, Arc::clone(&self.shared))
    }
}

/// Builds an [`InFlightLimitLayer`]: the slots and lease, then the key, rejection and
/// failure settings every layer has. Nothing is checked until [`build`](Self::build).
#[must_use = "a builder does nothing until `build` is called"]
pub struct InFlightLayerBuilder<K = GlobalKey, R = DefaultRejection> {
    inner: LayerBuilder<InFlightConfig, K, crate::UnitCost, R>,
}

impl<K, R> fmt::Debug for InFlightLayerBuilder<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLayerBuilder")
            .field("config", &self.inner.algorithm)
            .finish_non_exhaustive()
    }
}

impl<K, R> InFlightLayerBuilder<K, R> {
    /// At most `slots` requests of one key in flight (required, at least 1).
    pub fn slots(mut self, slots: u64) -> Self {
        self.inner.algorithm.slots = slots;
        self
    }

    /// How long a slot on Redis outlives the process holding it (default 10 s); see
    /// [`InFlightConfig::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.inner.algorithm.lease = lease;
        self
    }

    /// The `Retry-After` of a refusal (default 1 s); see
    /// [`InFlightConfig::retry_after`].
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.inner.algorithm.retry_after = retry_after;
        self
    }

    /// The limit's name (required); see [`LayerBuilder::name`].
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.inner = self.inner.name(name);
        self
    }

    /// How requests are told apart (required; [`GlobalKey`] for one limit shared by
    /// every request); see [`LayerBuilder::key`].
    pub fn key<K2>(self, key: K2) -> InFlightLayerBuilder<K2, R> {
        InFlightLayerBuilder {
            inner: self.inner.key(key),
        }
    }

    /// The response for refused requests (default: [`DefaultRejection`], a plain 429).
    /// The layer adds `Retry-After`.
    pub fn on_rejection<R2>(self, rejection: R2) -> InFlightLayerBuilder<K, R2> {
        InFlightLayerBuilder {
            inner: self.inner.on_rejection(rejection),
        }
    }

    /// Whether admitted requests carry their [`Decision`](crate::Decision) in the request extensions
    /// (default: yes).
    pub fn decision_extension(mut self, enabled: bool) -> Self {
        self.inner = self.inner.decision_extension(enabled);
        self
    }

    /// Shadow mode (default: off): take and hold slots, record refusals, refuse nothing;
    /// see [`LayerBuilder::shadow`].
    pub fn shadow(mut self, enabled: bool) -> Self {
        self.inner = self.inner.shadow(enabled);
        self
    }

    /// Lets requests for which `predicate` says yes through without taking a slot; see
    /// [`LayerBuilder::exempt`].
    pub fn exempt(
        mut self,
        predicate: impl Fn(&http::request::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.inner = self.inner.exempt(predicate);
        self
    }

    /// What to do when no key can be extracted (default: reject with 400).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.inner = self.inner.on_missing_key(missing_key);
        self
    }

    /// The level of the event for a request without a usable key that is no
    /// misconfiguration: see [`LayerBuilder::missing_key_log_level`](crate::service::LayerBuilder::missing_key_log_level).
    pub fn missing_key_log_level(mut self, level: tracing::Level) -> Self {
        self.inner = self.inner.missing_key_log_level(level);
        self
    }

    /// The longest key accepted, in bytes (default: 256).
    pub fn max_key_len(mut self, max_key_len: usize) -> Self {
        self.inner = self.inner.max_key_len(max_key_len);
        self
    }

    /// What this layer answers while Redis is unreachable (default: the backend's).
    pub fn on_redis_failure(mut self, policy: FailurePolicy) -> Self {
        self.inner = self.inner.on_redis_failure(policy);
        self
    }

    /// The fraction of the slots each instance takes in the in-process fallback while
    /// Redis is unreachable (at least one slot, unless [`fallback_rounding`](Self::fallback_rounding)
    /// says otherwise); see [`BackendBuilder::fallback_share`](crate::BackendBuilder::fallback_share).
    pub fn fallback_share(mut self, share: f64) -> Self {
        self.inner = self.inner.fallback_share(share);
        self
    }

    /// How the fallback share of the slots is rounded below one slot: to one (the
    /// default: every instance can still run one) or to zero (the instances together
    /// never run more than the slots); see [`ShareRounding`](crate::backend::ShareRounding).
    pub fn fallback_rounding(mut self, rounding: crate::backend::ShareRounding) -> Self {
        self.inner = self.inner.fallback_rounding(rounding);
        self
    }

    /// Checks every setting and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a missing or invalid name, a missing
    /// [key](InFlightLayerBuilder::key) (`.key(GlobalKey)` for one limit shared by every
    /// request), zero slots, a zero lease or
    /// `retry_after`, a zero maximum key length, or invalid failure settings.
    pub fn build(self) -> Result<InFlightLimitLayer<K, R>, ConfigError>
    where
        K: Send + Sync + 'static,
        R: OnRejection,
    {
        let checked = self.inner.checked()?;
        let limiter = InFlightLimiter::new(&checked.backend, &checked.name, checked.algorithm)?;
        crate::service::require_key(checked.keyed)?;
        let metrics = LayerMetrics::new(std::slice::from_ref(limiter.policy()));
        Ok(InFlightLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                key: checked.key,
                rejection: checked.rejection,
                options: checked.options,
                metrics,
                missing_warning: MissingKeyWarning::new(std::any::type_name::<K>()),
            }),
        })
    }
}
