//! [`InFlightLimitLayer`] and its builder: the slots, the lease and the settings every
//! layer has, checked when the layer is built.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use super::service::{InFlightLimit, Shared};
use super::{InFlightConfig, InFlightLimiter};
use crate::error::ConfigError;
use crate::key::{GlobalKey, Key, KeyExtractor, KeyForError};
use crate::limit::{LayerBuilder, MissingKeyWarning};
use crate::metrics::LayerMetrics;
use crate::response::{DefaultRejection, OnRejection};

/// A layer that allows at most N requests of one key in flight at once, across every
/// instance sharing the backend's Redis; see the [`in_flight`](super) module.
pub struct InFlightLimitLayer<K = GlobalKey, R = DefaultRejection> {
    shared: Arc<Shared<K, R>>,
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
    /// Keys longer than the layer's [`max_key_len`](LayerBuilder::max_key_len)
    /// are left out: the layer never counts them.
    ///
    /// # Errors
    ///
    /// A [`KeyForError`] when the extractor never counts `value`, or cannot say
    /// ([`KeyForError::TooLong`] when its every key is too long for the layer).
    ///
    /// ```
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, InFlightConfig, LimitLayer};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let exports = LimitLayer::builder(&Backend::in_process(), InFlightConfig::new(2))
    ///     .name("export")
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
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, InFlightConfig, LimitLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let exports = LimitLayer::builder(&Backend::in_process(), InFlightConfig::new(2))
    ///     .name("export")
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
    type Service = InFlightLimit<S, K, R>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimit::new(inner, Arc::clone(&self.shared))
    }
}

/// Building an in-flight layer: [`LimitLayer::builder`](crate::LimitLayer::builder) with
/// an [`InFlightConfig`] (the slots, how long a slot outlives its process, the
/// `Retry-After` of a refusal) and the settings every layer has (name, key, rejection,
/// shadow, exemptions, missing keys, failures).
impl<K, R> LayerBuilder<InFlightConfig, K, u32, R> {
    /// Checks every setting and builds the in-flight layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a missing or invalid name, a missing
    /// [key](LayerBuilder::key) (`.key(GlobalKey)` for one limit shared by every
    /// request), zero slots, a zero slot TTL or `retry_after`, a zero maximum key
    /// length, invalid failure settings, or a setting an in-flight limit has no use for
    /// ([`count_if`](LayerBuilder::count_if), [`settle`](LayerBuilder::settle): a slot is
    /// given back when the response ends, whatever it was; [`wait`](LayerBuilder::wait),
    /// [`priority`](LayerBuilder::priority): those shape a rate limit's checks).
    pub fn build(self) -> Result<InFlightLimitLayer<K, R>, ConfigError>
    where
        K: KeyExtractor,
        R: OnRejection,
    {
        let checked = self.checked()?;
        if checked.options.count_if.is_some() || checked.options.usage.is_some() {
            return Err(ConfigError::Conflict {
                reason: "an in-flight limit neither counts by outcome nor settles usage: \
                         `count_if` and `settle` are for rate limits",
            });
        }
        if checked.options.wait.is_some() || checked.options.priority.is_some() {
            return Err(ConfigError::Conflict {
                reason: "an in-flight limit neither waits nor has priority classes: \
                         `wait` and `priority` are for rate limits",
            });
        }
        let limiter = InFlightLimiter::new(&checked.backend, &checked.name, checked.algorithm)?;
        crate::limit::require_key(checked.keyed)?;
        let metrics = LayerMetrics::new(std::slice::from_ref(limiter.policy()), |_| &[]);
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
