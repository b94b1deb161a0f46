//! Limits from the user's own store; the semantics are on [`DynamicLimits`].

mod cache;
mod limiter;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::time::Duration;

pub use self::limiter::DynamicLimiter;
use crate::error::BoxError;
use crate::key::TaggedKey;
use crate::limit::Algorithm;
use crate::period::PeriodConfig;
use crate::rolling::RollingConfig;
use crate::token_bucket::TokenBucketConfig;

/// Where per-key limits come from: your database or config service.
///
/// `Ok(Some(limit))` is the key's limit, `Ok(None)` means "the default limit" (the one
/// configured in the algorithm), an error is a failed lookup ([`OnSourceError`]).
///
/// The key is a [`TaggedKey`]: its [`value`](TaggedKey::value) is what the layer's key
/// extractor found (a header's value, an extension's `Display`, a closure's bytes),
/// without the crate's tags; its [`tag`](TaggedKey::tag) names the extractor. Implemented
/// for closures `Fn(TaggedKey<'_>) -> impl Future<Output = Result<Option<u64>, E>>`
/// whose future owns what it needs (copy the value out of the key):
///
/// ```
/// use tower_redis_ratelimit::{key::TaggedKey, LimitSource};
///
/// // Behind `ExtensionKey::<MerchantId>::new().tag("merchant")`: `ext:merchant:vip`.
/// let source = |key: TaggedKey<'_>| {
///     let vip = key.value() == b"vip";
///     async move { Ok::<_, std::io::Error>(vip.then_some(1_000)) }
/// };
/// # fn takes(_: impl LimitSource) {}
/// # takes(source);
/// ```
pub trait LimitSource: Send + Sync + 'static {
    /// Looks up the limit of `key`; any error that is `Send + Sync` (`tower::BoxError`).
    fn limit(
        &self,
        key: TaggedKey<'_>,
    ) -> impl Future<Output = Result<Option<u64>, Box<dyn std::error::Error + Send + Sync>>> + Send;
}

impl<F, Fut, E> LimitSource for F
where
    F: Fn(TaggedKey<'_>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<u64>, E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn limit(
        &self,
        key: TaggedKey<'_>,
    ) -> impl Future<Output = Result<Option<u64>, BoxError>> + Send {
        let lookup = self(key);
        async move { lookup.await.map_err(Into::into) }
    }
}

/// What applies to a key whose lookup failed or timed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnSourceError {
    /// The key's last answer, however old; the default limit if there never was one.
    #[default]
    LastKnown,
    /// This limit (at least 1).
    Limit(u64),
    /// Refuse the key's requests with `429` and a `Retry-After` of the
    /// [`error_ttl`](DynamicLimits::error_ttl), until a lookup succeeds.
    Refuse,
}

/// An algorithm whose limit a [`DynamicLimits`] can replace per key; see the table in
/// [`DynamicLimits`].
pub trait WithLimit: Algorithm + Clone + Send + Sync + 'static {
    /// The configured limit (the default one).
    fn limit(&self) -> u64;
    /// The same configuration with `limit` instead.
    #[must_use]
    fn with_limit(&self, limit: u64) -> Self;
}

impl WithLimit for PeriodConfig {
    fn limit(&self) -> u64 {
        self.quota_value()
    }

    fn with_limit(&self, limit: u64) -> Self {
        self.with_quota(limit)
    }
}

impl WithLimit for RollingConfig {
    fn limit(&self) -> u64 {
        self.limit_value()
    }

    fn with_limit(&self, limit: u64) -> Self {
        self.with_limit_value(limit)
    }
}

impl WithLimit for TokenBucketConfig {
    fn limit(&self) -> u64 {
        self.burst_value()
    }

    fn with_limit(&self, limit: u64) -> Self {
        self.with_burst_scaled(limit)
    }
}

/// The default [`ttl`](DynamicLimits::ttl): 30 seconds.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The default [`max_keys`](DynamicLimits::max_keys): 100 000.
pub(crate) const DEFAULT_MAX_KEYS: usize = 100_000;
/// The default [`lookup_timeout`](DynamicLimits::lookup_timeout): 250 ms.
pub(crate) const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_millis(250);
/// How many distinct limits keep a built limiter at once.
const MAX_LIMITS: usize = 4_096;

/// Limits from your own store: each key's limit looked up at request time through a
/// [`LimitSource`] (a database, a config service), cached in process.
///
/// [`DynamicLimits`] wraps the configuration of any algorithm. Its limit is the
/// default; the source may name another limit for a key, which then replaces it for
/// that key's requests, on Redis and in process alike:
///
/// | algorithm | what the source's limit replaces |
/// |---|---|
/// | [`PeriodConfig`] | the quota per period |
/// | [`RollingConfig`] | the limit per window |
/// | [`TokenBucketConfig`] | the burst, and the rate in proportion (a source limit of twice the burst doubles the rate too; at least one token per period) |
///
/// The source is asked with a [`TaggedKey`]: the value the layer's key extractor found
/// ([`value`](TaggedKey::value): `acme` for the header `x-merchant-id: acme`, `42` for a
/// merchant id `42` in the extensions), without the crate's [key tags](crate::key#tags),
/// which stay available ([`tag`](TaggedKey::tag): `hdr:x-merchant-id`, `ext:merchant`)
/// for a source behind several extractors.
///
/// # Cache
///
/// Answers are kept for a [TTL](DynamicLimits::ttl) in a bounded cache
/// ([`max_keys`](DynamicLimits::max_keys) entries, `quick_cache`), so most requests pay
/// no lookup: a merchant's new limit applies at most one TTL (plus one lookup) after it
/// changed in the source, with no restart.
///
/// - A key seen for the first time waits for its lookup (at most the
///   [lookup timeout](DynamicLimits::lookup_timeout)).
/// - A key whose answer is older than the TTL is checked at once against that answer
///   while one lookup refreshes it in the background.
/// - There is at most one lookup in flight per key: concurrent requests for a key being
///   looked up wait for that lookup (first time) or use the stale answer.
/// - Lookups run on spawned tokio tasks, so a client that goes away does not cancel a
///   lookup others wait for.
///
/// # When the source fails
///
/// An error, an invalid limit (`0`, or one the algorithm refuses), a lookup slower than
/// the timeout, or a panic in the source is a failed lookup; [`OnSourceError`] says
/// what applies: the last answer for the key ([`LastKnown`](OnSourceError::LastKnown),
/// the default), a fixed limit ([`Limit`](OnSourceError::Limit)), or refusing the
/// key's requests ([`Refuse`](OnSourceError::Refuse): `429 Too Many Requests`, or gRPC
/// `RESOURCE_EXHAUSTED`, with a `Retry-After`, as a rate-limit rejection with
/// [`Source::FailClosed`](crate::Source::FailClosed)). The failed key is asked again
/// after [`error_ttl`](DynamicLimits::error_ttl) (default: one second, or the TTL if
/// shorter), so a failing store is not asked on every request. Never a panic, never a
/// `500`.
///
/// # Headers and counts
///
/// `RateLimit-Policy` shows the limit that applied (`"api";q=500;w=60` for a merchant
/// whose source limit is 500); the policy name, metrics label and Redis key stay the
/// layer's (a request refused by [`OnSourceError::Refuse`] shows the default policy, as
/// does a custom rejection's [`Rejection::policy`](crate::Rejection::policy)), so a
/// key's count carries over when its limit changes, on Redis and in process (and in
/// the Redis fallback) alike: a raised limit admits what is left under it, a lowered
/// one refuses at once if the count is already at or above it (a token bucket keeps
/// when it is full again, read at the new rate and burst). The backend's deny cache
/// answers a refusal only under the limit it was made under: once an instance applies
/// a key's new limit, its next check goes to Redis under it (a raised limit admits at
/// once, not after the deny cache's max age).
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{
///     LimitLayer, key::{HeaderKey, TaggedKey}, Backend, DynamicLimits, OnSourceError, PeriodConfig,
/// };
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// // Your store: `None` means "the default limit". `value` is the header's value.
/// let source = |key: TaggedKey<'_>| {
///     let merchant = key.value().to_vec();
///     async move {
///         Ok::<_, std::io::Error>(match merchant.as_slice() {
///             b"acme" => Some(1_000),
///             _ => None,
///         })
///     }
/// };
/// let limits = DynamicLimits::new(PeriodConfig::new(100, Duration::from_secs(60)), source)
///     .ttl(Duration::from_secs(30))
///     .max_keys(100_000)
///     .lookup_timeout(Duration::from_millis(200))
///     .on_error(OnSourceError::LastKnown);
/// let layer = LimitLayer::builder(&Backend::in_process(), limits)
///     .name("payments")
///     .key(HeaderKey::from_static("x-merchant-id"))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// `DynamicLimits` holds the configuration `A` of any algorithm (whose limit is the
/// default) and the [`LimitSource`]; it is what
/// [`LimitLayer::builder`](crate::LimitLayer::builder) takes.
#[must_use = "dynamic limits do nothing until a layer is built with them"]
pub struct DynamicLimits<A, S> {
    pub(crate) config: A,
    pub(crate) source: S,
    pub(crate) ttl: Duration,
    pub(crate) error_ttl: Option<Duration>,
    pub(crate) max_keys: usize,
    pub(crate) timeout: Duration,
    pub(crate) on_error: OnSourceError,
}

impl<A, S> DynamicLimits<A, S> {
    /// Limits of `config` by default, per key from `source`.
    pub fn new(config: A, source: S) -> Self {
        Self {
            config,
            source,
            ttl: DEFAULT_TTL,
            error_ttl: None,
            max_keys: DEFAULT_MAX_KEYS,
            timeout: DEFAULT_LOOKUP_TIMEOUT,
            on_error: OnSourceError::default(),
        }
    }

    /// How long an answer is used before it is looked up again (default 30 s; not
    /// zero). A change in the source applies within this time plus one lookup.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long the outcome of a failed lookup is used before the key is asked again
    /// (default: 1 s, or the TTL if shorter; not zero, at most the TTL).
    pub fn error_ttl(mut self, error_ttl: Duration) -> Self {
        self.error_ttl = Some(error_ttl);
        self
    }

    /// How many keys the cache holds at most (default 100 000; not zero). Beyond it
    /// the least used keys are evicted and looked up again when they come back.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// How long one lookup may take before it counts as failed (default 250 ms; not
    /// zero). A key's first request waits at most this long.
    pub fn lookup_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What applies when a lookup fails or times out (default
    /// [`OnSourceError::LastKnown`]).
    pub fn on_error(mut self, policy: OnSourceError) -> Self {
        self.on_error = policy;
        self
    }
}

impl<A: std::fmt::Debug, S> std::fmt::Debug for DynamicLimits<A, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamicLimits")
            .field("config", &self.config)
            .field("ttl", &self.ttl)
            .field("error_ttl", &self.error_ttl)
            .field("max_keys", &self.max_keys)
            .field("lookup_timeout", &self.timeout)
            .field("on_error", &self.on_error)
            .finish_non_exhaustive()
    }
}
