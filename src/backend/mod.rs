//! Where limits are kept: one [`Backend`] handle, shared by every layer.
//!
//! A backend is either in-process ([`Backend::in_process`]) or Redis
//! ([`Backend::redis`], a `deadpool-redis` pool). Every limiter built on a Redis backend
//! also keeps in-process state with the same semantics, which answers while Redis is
//! unreachable; one health state per backend decides which one answers, and one
//! background probe switches back when Redis recovers. What answers while Redis fails is
//! each layer's [`FailurePolicy`]; a [fallback share](BackendBuilder::fallback_share)
//! keeps N instances from admitting N times the limit meanwhile. A local deny cache
//! remembers Redis's refusals of hot keys until they expire, so a flood on one key costs
//! Redis almost nothing.

mod deny;
mod redis;

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{Script, ScriptInvocation};

use crate::clock::Clock;
use crate::decision::{Decision, Source, State};
use crate::error::{check_name, ConfigError};
use crate::limiter::Check;
use crate::local::LocalStore;
use crate::metrics::RedisMetrics;

use self::deny::{Denied, DenyCache};
use self::redis::{RedisBackend, RedisPool, ScriptError};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "ratelimit";
/// The default deadline of one Redis round trip (pool wait included).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(100);
/// The default interval of the health probe while Redis is unreachable.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// The default number of refused keys the local deny cache remembers.
pub const DEFAULT_DENY_CACHE_CAPACITY: usize = 10_000;
/// The default of [`BackendBuilder::max_local_keys`]: one million keys, under 256 MB
/// of in-process state with any algorithm (measured figures there).
pub const DEFAULT_MAX_LOCAL_KEYS: u64 = crate::local::DEFAULT_MAX_KEYS;

/// A `deadpool-redis` configuration for a limiter backend: the pool's wait, create and
/// recycle timeouts are set to `timeout` (use the backend's call timeout), so a hung
/// Redis or a full pool fails fast instead of queueing requests.
///
/// The backend's [call timeout](BackendBuilder::call_timeout) bounds every check
/// anyway; pool timeouts also free the pool's slots and connection attempts promptly.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_redis_ratelimit::{backend::pool_config, deadpool_redis::Runtime, Backend};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = pool_config("redis://127.0.0.1:6379", Duration::from_millis(100))
///     .create_pool(Some(Runtime::Tokio1))?;
/// let backend = Backend::redis(pool);
/// # Ok(()) }
/// ```
#[must_use]
pub fn pool_config(url: impl Into<String>, timeout: Duration) -> deadpool_redis::Config {
    let mut config = deadpool_redis::Config::from_url(url);
    let mut pool = deadpool_redis::PoolConfig::default();
    pool.timeouts.wait = Some(timeout);
    pool.timeouts.create = Some(timeout);
    pool.timeouts.recycle = Some(timeout);
    config.pool = Some(pool);
    config
}

/// What a layer answers while Redis is unreachable (connection refused, timeout, script
/// error, pool exhausted: every kind of failure is treated alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Answer from the in-process state, which has the same semantics (the default).
    /// Combine with a [fallback share](BackendBuilder::fallback_share) so that N
    /// instances do not admit N times the limit.
    #[default]
    Fallback,
    /// Admit every request (fail open).
    FailOpen,
    /// Refuse every request (fail closed), with a retry-after of one probe interval.
    FailClosed,
}

/// Per-layer settings for Redis failures, carried by the backend handle a layer holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Failover {
    pub(crate) policy: FailurePolicy,
    /// The fraction of each limit the in-process fallback applies, in `(0, 1]`.
    pub(crate) share: f64,
}

impl Default for Failover {
    fn default() -> Self {
        Self {
            policy: FailurePolicy::Fallback,
            share: 1.0,
        }
    }
}

impl Failover {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.share.is_finite() && self.share > 0.0 && self.share <= 1.0 {
            Ok(())
        } else {
            Err(ConfigError::InvalidName {
                setting: "fallback_share",
                reason: "must be a fraction in (0, 1]",
            })
        }
    }
}

/// A handle on where limits are kept; cheap to clone, shared by all layers.
///
/// ```
/// use tower_redis_ratelimit::Backend;
///
/// // No Redis: limits live in this process.
/// let local = Backend::in_process();
/// assert!(!local.is_redis());
/// ```
///
/// ```no_run
/// use tower_redis_ratelimit::{deadpool_redis, Backend};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
/// let backend = Backend::builder().redis(pool).prefix("myapp:rl").build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
    failover: Failover,
}

struct Inner {
    prefix: String,
    clock: Clock,
    redis: Option<Arc<RedisBackend>>,
    deny: DenyCache,
    local: Arc<LocalStore>,
}

impl Backend {
    /// A backend that keeps every limit in this process.
    #[must_use]
    pub fn in_process() -> Self {
        Self::builder()
            .build()
            .expect("the default configuration is valid")
    }

    /// A Redis backend on `pool` with the default settings.
    #[must_use]
    pub fn redis(pool: deadpool_redis::Pool) -> Self {
        Self::builder()
            .redis(pool)
            .build()
            .expect("the default configuration is valid")
    }

    /// Starts configuring a backend.
    pub fn builder() -> BackendBuilder {
        BackendBuilder::default()
    }

    /// Whether limits are kept in Redis (possibly answered by the fallback right now).
    #[must_use]
    pub fn is_redis(&self) -> bool {
        self.inner.redis.is_some()
    }

    /// Whether Redis currently answers checks: `None` for an in-process backend, `false`
    /// while the in-process fallback is answering.
    #[must_use]
    pub fn redis_healthy(&self) -> Option<bool> {
        self.inner.redis.as_ref().map(|r| r.is_healthy())
    }

    /// The prefix of every Redis key.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    pub(crate) fn clock(&self) -> Clock {
        self.inner.clock
    }

    /// The bounded in-process state shared by every limiter on this backend.
    pub(crate) fn local_store(&self) -> Arc<LocalStore> {
        Arc::clone(&self.inner.local)
    }

    pub(crate) fn redis_handle(&self) -> Option<&Arc<RedisBackend>> {
        self.inner.redis.as_ref()
    }

    /// This handle with other failure settings (for one layer).
    pub(crate) fn with_failover(&self, failover: Failover) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            failover,
        }
    }

    pub(crate) fn failover(&self) -> Failover {
        self.failover
    }

    /// Scales a limit for the in-process state: the fallback share of a Redis backend,
    /// the whole limit in-process (never below one).
    pub(crate) fn local_limit(&self, limit: u64) -> u64 {
        if self.inner.redis.is_none() || self.failover.share >= 1.0 {
            return limit;
        }
        ((limit as f64 * self.failover.share).floor() as u64).max(1)
    }

    /// The namespace of one limiter's keys: `<prefix>:<kind>:<name>:`.
    pub(crate) fn namespace(&self, kind: &str, name: &str) -> String {
        let mut ns = String::with_capacity(self.inner.prefix.len() + kind.len() + name.len() + 3);
        ns.push_str(&self.inner.prefix);
        ns.push(':');
        ns.push_str(kind);
        ns.push(':');
        ns.push_str(name);
        ns.push(':');
        ns
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("prefix", &self.inner.prefix)
            .field("redis", &self.inner.redis)
            .field("failover", &self.failover)
            .finish_non_exhaustive()
    }
}

/// What one limiter needs of the backend: the handle, its key namespace, and its Redis
/// metrics.
#[derive(Debug)]
pub(crate) struct Remote {
    backend: Backend,
    /// `<prefix>:<kind>:<name>:`, the start of every Redis key of this limiter.
    namespace: String,
    /// The policy name, for metrics labels.
    name: String,
    metrics: RedisMetrics,
}

impl Remote {
    pub(crate) fn new(backend: &Backend, kind: &str, name: &str) -> Self {
        Self {
            backend: backend.clone(),
            namespace: backend.namespace(kind, name),
            name: name.to_owned(),
            metrics: RedisMetrics::default(),
        }
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    #[cfg(test)]
    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }
}

/// One algorithm's two halves: its Redis script and its in-process state with the same
/// semantics. [`check`] picks the half that answers.
pub(crate) trait Store: Send + Sync + 'static {
    fn remote(&self) -> &Remote;
    /// The largest cost that can ever be admitted at once.
    fn capacity(&self) -> u64;
    /// The decision for a cost above [`capacity`](Self::capacity).
    fn exceeds_capacity(&self, source: Source) -> Decision;
    /// The script, run with `KEYS[1]` = the limited key.
    fn script(&self) -> &'static Script;
    /// Appends the script's `ARGV`.
    fn args(&self, invocation: &mut ScriptInvocation<'static>, cost: NonZeroU32);
    /// Reads the script's reply; `None` when it is not of the expected shape.
    fn decide(&self, reply: &[i64], cost: NonZeroU32) -> Option<Decision>;
    /// Answers from the in-process state.
    fn local(&self, key: &str, cost: NonZeroU32, source: Source) -> Decision;
}

/// Answers a check from Redis while it is healthy (one round trip, run by SHA), from the
/// in-process state otherwise; a failed round trip is answered by the layer's
/// [`FailurePolicy`] and switches the backend to it until the probe reaches Redis again.
/// A key Redis refused recently is refused from the deny cache without a round trip.
pub(crate) fn check<T: Store>(store: &Arc<T>, key: &str, cost: NonZeroU32) -> Check {
    let remote = store.remote();
    let backend = &remote.backend;
    let redis = backend.redis_handle();
    if u64::from(cost.get()) > store.capacity() {
        let source = match redis {
            None => Source::InProcess,
            Some(redis) if redis.is_healthy() => Source::Redis,
            Some(_) => Source::Fallback,
        };
        return Check::ready(store.exceeds_capacity(source));
    }
    let Some(redis) = redis else {
        return Check::ready(store.local(key, cost, Source::InProcess));
    };
    if !redis.is_healthy() {
        return Check::ready(unavailable(&**store, key, cost));
    }
    let namespace = &remote.namespace;
    let mut redis_key = String::with_capacity(namespace.len() + key.len());
    redis_key.push_str(namespace);
    redis_key.push_str(key);
    let deny = &backend.inner.deny;
    let deny_key = deny.is_enabled().then(|| deny.hash(&redis_key));
    if let Some(hash) = deny_key {
        let now_us = backend.clock().now_us();
        if let Some(denied) = deny.get(hash, now_us) {
            let us = |t: u64| Duration::from_micros(t.saturating_sub(now_us));
            let decision = Decision::new(
                State::OverQuota,
                store.capacity(),
                0,
                us(denied.reset_us),
                Source::DenyCache,
            );
            return Check::ready(decision.with_retry_after(us(denied.until_us)));
        }
    }
    let mut invocation = store.script().key(&redis_key);
    store.args(&mut invocation, cost);
    let store = Arc::clone(store);
    let redis = Arc::clone(redis);
    Check::pending(async move {
        let remote = store.remote();
        let started = std::time::Instant::now();
        let result = redis.eval(&invocation).await;
        remote.metrics.duration(&remote.name, started.elapsed());
        let error = match result {
            Ok(reply) => match store.decide(&reply, cost) {
                Some(decision) => {
                    if let (Some(hash), Some(retry), 1) =
                        (deny_key, decision.retry_after, cost.get())
                    {
                        let backend = &remote.backend;
                        let now_us = backend.clock().now_us();
                        let at = |d: Duration| {
                            now_us.saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
                        };
                        let denied = Denied {
                            until_us: at(retry),
                            reset_us: at(decision.reset),
                        };
                        backend.inner.deny.insert(hash, denied, now_us);
                    }
                    return decision;
                }
                None => ScriptError::Reply(reply),
            },
            Err(error) => error,
        };
        crate::metrics::redis_error(&remote.name, error.kind());
        redis.mark_unhealthy(&error);
        let key = &redis_key[remote.namespace.len()..];
        unavailable(&*store, key, cost)
    })
}

/// The answer while Redis is unreachable, by the layer's failure policy.
fn unavailable<T: Store>(store: &T, key: &str, cost: NonZeroU32) -> Decision {
    let backend = &store.remote().backend;
    match backend.failover.policy {
        FailurePolicy::Fallback => store.local(key, cost, Source::Fallback),
        FailurePolicy::FailOpen => {
            let limit = store.capacity();
            Decision::new(
                State::Allowed,
                limit,
                limit,
                Duration::ZERO,
                Source::FailOpen,
            )
        }
        FailurePolicy::FailClosed => {
            let retry = backend
                .redis_handle()
                .map_or(DEFAULT_PROBE_INTERVAL, |r| r.probe_interval());
            Decision::new(
                State::OverQuota,
                store.capacity(),
                0,
                retry,
                Source::FailClosed,
            )
            .with_retry_after(retry)
        }
    }
}

/// Configures a [`Backend`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct BackendBuilder {
    pool: Option<RedisPool>,
    url: Option<String>,
    prefix: String,
    call_timeout: Duration,
    probe_interval: Duration,
    deny_cache: usize,
    max_local_keys: u64,
    failover: Failover,
}

impl Default for BackendBuilder {
    fn default() -> Self {
        Self {
            pool: None,
            url: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            deny_cache: DEFAULT_DENY_CACHE_CAPACITY,
            max_local_keys: DEFAULT_MAX_LOCAL_KEYS,
            failover: Failover::default(),
        }
    }
}

impl BackendBuilder {
    /// Keeps limits in the Redis at `url` (`redis://host:port/db`, `rediss://` for TLS
    /// when the `redis` crate was built with it), through a pool that
    /// [`build`](Self::build) creates with [`pool_config`]: the pool's wait, create and
    /// recycle timeouts equal the [call timeout](Self::call_timeout). Nothing connects
    /// until the first check.
    ///
    /// ```
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .prefix("myapp")
    ///     .build()?;
    /// assert!(backend.is_redis());
    /// # Ok(()) }
    /// ```
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Keeps limits in Redis through this pool (without it, limits stay in-process).
    pub fn redis(mut self, pool: deadpool_redis::Pool) -> Self {
        self.pool = Some(RedisPool::Single(pool));
        self
    }

    /// Keeps limits in a Redis Cluster through this pool. Every script touches one key,
    /// so each check runs on the node that owns the key's slot.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn redis_cluster(mut self, pool: deadpool_redis::cluster::Pool) -> Self {
        self.pool = Some(RedisPool::Cluster(pool));
        self
    }

    /// How many refused keys the local deny cache remembers (default 10 000; `0` turns
    /// it off). While Redis refuses a key until a known time, further requests on that
    /// key are refused locally until then without a round trip.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }

    /// The most keys the in-process state of this backend holds, all layers together
    /// (default [`DEFAULT_MAX_LOCAL_KEYS`], one million). This state answers every check
    /// of an in-process backend and a Redis backend's checks while Redis is unreachable.
    ///
    /// A fixed-window or token-bucket key counts as one key, a rolling-window key as
    /// `ceil(buckets / 8)` keys (a window of 10 buckets counts as 2). When the state is full, a new key makes room by dropping
    /// another: keys seen only once go first (they wait in a small probation queue), then
    /// the keys hit least recently; a dropped key starts again with its full limit, and
    /// each drop is counted in the
    /// [`ratelimit_local_evictions_total`](crate::metrics::LOCAL_EVICTIONS_TOTAL) metric.
    /// Expired state is never swept: it is reset when its key is hit again, and is the
    /// first to go when room is needed, so no request ever waits on a sweep. The bound
    /// is split evenly over up to 64 shards, each with its own lock (so it is rounded
    /// down to a multiple of their number).
    ///
    /// Measured resident bytes per key with the bound reached (`VmRSS`, glibc; see
    /// `BENCHMARKS.md`): about 100 for the fixed window and the token bucket, about 250
    /// for a rolling window of 10 buckets (two keys' worth), at most about 190 per key's
    /// worth for any rolling window: the default stays under 256 MB (under 100 MiB for
    /// the fixed window and the token bucket) whatever the number of keys. Size it to the keys active within one window (or refill time) of your
    /// longest limit.
    ///
    /// ```
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// // A small service: 100 000 keys, about 10 to 20 MB at most.
    /// let backend = Backend::builder().max_local_keys(100_000).build()?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn max_local_keys(mut self, keys: u64) -> Self {
        self.max_local_keys = keys;
        self
    }

    /// The default [`FailurePolicy`] of layers on this backend (default: fallback).
    /// Layers can override it with
    /// [`LayerBuilder::on_redis_failure`](crate::LayerBuilder::on_redis_failure).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failover.policy = policy;
        self
    }

    /// The fraction of every limit that the in-process fallback applies while Redis is
    /// unreachable (default 1.0), e.g. `1.0 / 4.0` when four instances share the limit,
    /// so that together they admit about the limit, not four times it. Limits are
    /// rounded down, never below one. Layers can override it with
    /// [`LayerBuilder::fallback_share`](crate::LayerBuilder::fallback_share).
    pub fn fallback_share(mut self, share: f64) -> Self {
        self.failover.share = share;
        self
    }

    /// The prefix of every Redis key (default `ratelimit`), e.g. to share one Redis
    /// between applications.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The deadline of one Redis check, pool wait included (default 100 ms). A check that
    /// takes longer is answered by the fallback, and Redis counts as unreachable until the
    /// probe reaches it again.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// How often the health probe pings Redis while it is unreachable (default 500 ms).
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// Checks the settings and builds the backend.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for an invalid prefix, a zero timeout or probe interval, a
    /// fallback share outside `(0, 1]`, zero [`max_local_keys`](Self::max_local_keys),
    /// a Redis URL that cannot be parsed, or both a URL and a pool.
    pub fn build(mut self) -> Result<Backend, ConfigError> {
        check_name("prefix", &self.prefix)?;
        if self.max_local_keys == 0 {
            return Err(ConfigError::Zero {
                setting: "max_local_keys",
            });
        }
        self.failover.check()?;
        if self.call_timeout < Duration::from_millis(1) {
            return Err(ConfigError::ZeroDuration {
                setting: "call_timeout",
            });
        }
        if self.probe_interval < Duration::from_millis(1) {
            return Err(ConfigError::ZeroDuration {
                setting: "probe_interval",
            });
        }
        if let Some(url) = self.url.take() {
            if self.pool.is_some() {
                return Err(ConfigError::Conflict {
                    reason: "both a Redis URL and a pool were given",
                });
            }
            let pool = pool_config(url, self.call_timeout)
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .map_err(|error| ConfigError::InvalidRedisUrl {
                    reason: error.to_string(),
                })?;
            self.pool = Some(RedisPool::Single(pool));
        }
        let redis = self.pool.map(|pool| {
            crate::metrics::fallback_active(&self.prefix, false);
            Arc::new(RedisBackend::new(
                pool,
                self.prefix.clone(),
                self.call_timeout,
                self.probe_interval,
            ))
        });
        let local = Arc::new(LocalStore::new(self.max_local_keys, &self.prefix));
        Ok(Backend {
            inner: Arc::new(Inner {
                local,
                prefix: self.prefix,
                clock: Clock::new(),
                redis,
                deny: DenyCache::new(self.deny_cache),
            }),
            failover: self.failover,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_settings_fail_when_built() {
        assert!(matches!(
            Backend::builder().prefix("").build(),
            Err(ConfigError::InvalidName {
                setting: "prefix",
                ..
            })
        ));
        assert!(matches!(
            Backend::builder().prefix("{app}").build(),
            Err(ConfigError::InvalidName {
                setting: "prefix",
                ..
            })
        ));
        assert!(matches!(
            Backend::builder().call_timeout(Duration::ZERO).build(),
            Err(ConfigError::ZeroDuration {
                setting: "call_timeout"
            })
        ));
        assert_eq!(
            Backend::builder().max_local_keys(0).build().unwrap_err(),
            ConfigError::Zero {
                setting: "max_local_keys"
            }
        );
        assert!(matches!(
            Backend::builder().probe_interval(Duration::ZERO).build(),
            Err(ConfigError::ZeroDuration {
                setting: "probe_interval"
            })
        ));
    }

    #[test]
    fn redis_urls_are_checked_when_built() {
        let backend = Backend::builder()
            .redis_url("redis://127.0.0.1:1")
            .build()
            .unwrap();
        assert_eq!(backend.redis_healthy(), Some(true));
        let err = Backend::builder()
            .redis_url("http://not-redis")
            .build()
            .unwrap_err();
        assert!(matches!(err, ConfigError::InvalidRedisUrl { .. }), "{err}");
        assert!(err.to_string().starts_with("invalid Redis URL: "), "{err}");
    }

    #[test]
    fn namespace_layout() {
        let b = Backend::builder().prefix("app").build().unwrap();
        assert_eq!(b.namespace("period", "sms"), "app:period:sms:");
        assert_eq!(b.redis_healthy(), None);
    }
}
