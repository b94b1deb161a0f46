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
//!
//! # Redis keys
//!
//! Each limited key of each limiter is one Redis key (a string for the fixed window and
//! the token bucket, a hash for the rolling window), laid out as (layout version 1):
//!
//! ```text
//! <prefix>:{v1:<escaped key>}:<algorithm>:<name>
//! ```
//!
//! - `<prefix>` is the backend's [prefix](BackendBuilder::prefix) (default `ratelimit`);
//! - `v1` is the version of this layout: a later layout gets another version, so it can
//!   never read (or be read as) this one's state;
//! - `<escaped key>` is the key's bytes (as the [key extractor](crate::key) made them,
//!   tag included) with `%` written `%25`, `{` written `%7B` and `}` written `%7D`, every
//!   other byte (`:`, bytes that are not UTF-8, ...) kept as it is;
//! - `<algorithm>` is `period`, `token` or `rolling`, and `<name>` the limiter's
//!   [name](crate::LayerBuilder::name).
//!
//! For example, the `sms` fixed-window limit of the client with API key `k1` is
//! `ratelimit:{v1:hdr:x-api-key:k1}:period:sms`.
//!
//! No two (prefix, algorithm, name, key) tuples share a Redis key, whatever bytes they
//! hold: prefixes and names contain no `{` or `}` (checked when they are built), so the
//! first `{` ends the prefix; the escaped key contains no `{` or `}`, so the first `}`
//! ends it; the algorithm contains no `:`, so the name is the rest.
//!
//! The part in braces is a Redis Cluster hash tag: a key's slot is determined by
//! `v1:` and the escaped key alone, so keys spread over the whole cluster by limited key,
//! and the keys of every limit on one limited key share a slot (what a script that
//! checks several limits of one request at once needs). The tag is never empty, not even
//! for the empty key.
//!
//! # Migrating from the unversioned layout
//!
//! Earlier releases wrote `<prefix>:<algorithm>:<name>:<key>`, with untagged keys. The
//! new layout does not read those keys: every limit starts afresh after the upgrade, and
//! the old keys expire on their own within one window (they all carry an expiry). To
//! reclaim the memory at once, delete keys matching `<prefix>:period:*`,
//! `<prefix>:token:*` and `<prefix>:rolling:*` (with `SCAN`, on every master of a
//! cluster).

mod deny;
mod health;
mod layout;
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
use crate::metrics::RedisMetrics;

use self::deny::{Denied, DenyCache};
pub(crate) use self::deny::{KeyHasher, PreHashed};
use self::health::BreakerConfig;
pub use self::health::{
    RedisState, DEFAULT_BREAKER_FAILURE_RATIO, DEFAULT_BREAKER_MIN_CALLS, DEFAULT_BREAKER_WINDOW,
    DEFAULT_RECOVERY,
};
use self::layout::Layout;
use self::redis::{Fault, RedisBackend, RedisPool, ScriptError};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "ratelimit";
/// The default deadline of one Redis round trip (pool wait included).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(100);
/// The default interval of the health probe while Redis is unreachable.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// The default number of refused keys the local deny cache remembers.
pub const DEFAULT_DENY_CACHE_CAPACITY: usize = 10_000;

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

/// What a layer answers when Redis cannot: while the backend's breaker has judged Redis
/// unusable (see [`BackendBuilder::breaker_failure_ratio`]), and for a single check whose
/// own call failed (a timeout, or an error that concerns only its key, such as
/// `WRONGTYPE`).
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
            Err(ConfigError::OutOfRange {
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

    /// Whether Redis currently answers every check: `None` for an in-process backend,
    /// `false` while the failure policies answer (or share the checks with Redis while it
    /// recovers).
    #[must_use]
    pub fn redis_healthy(&self) -> Option<bool> {
        self.inner.redis.as_ref().map(|r| r.is_healthy())
    }

    /// Where the breaker stands: `None` for an in-process backend.
    ///
    /// ```
    /// use tower_redis_ratelimit::{backend::RedisState, Backend};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder().redis_url("redis://127.0.0.1:6379").build()?;
    /// assert_eq!(backend.redis_state(), Some(RedisState::Healthy));
    /// assert_eq!(Backend::in_process().redis_state(), None);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn redis_state(&self) -> Option<RedisState> {
        self.inner.redis.as_ref().map(|r| r.state())
    }

    /// How many times the breaker has switched this backend to its failure policies
    /// since it was built: `None` for an in-process backend.
    #[must_use]
    pub fn redis_switches(&self) -> Option<u64> {
        self.inner.redis.as_ref().map(|r| r.switches())
    }

    /// The prefix of every Redis key.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    pub(crate) fn clock(&self) -> Clock {
        self.inner.clock
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

    /// The Redis key layout of one limiter's keys (see [Redis keys](self#redis-keys)).
    pub(crate) fn layout(&self, kind: &str, name: &str) -> Layout {
        Layout::new(&self.inner.prefix, kind, name)
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

/// What one limiter needs of the backend: the handle, its Redis key layout, and its
/// Redis metrics.
#[derive(Debug)]
pub(crate) struct Remote {
    backend: Backend,
    /// How this limiter's Redis keys are built.
    layout: Layout,
    /// The policy name, for metrics labels.
    name: String,
    metrics: RedisMetrics,
}

impl Remote {
    pub(crate) fn new(backend: &Backend, kind: &str, name: &str) -> Self {
        Self {
            backend: backend.clone(),
            layout: backend.layout(kind, name),
            name: name.to_owned(),
            metrics: RedisMetrics::default(),
        }
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The Redis key of `key` for this limiter.
    pub(crate) fn redis_key(&self, key: &[u8]) -> Vec<u8> {
        self.layout.redis_key(key)
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
    fn local(&self, key: &[u8], cost: NonZeroU32, source: Source) -> Decision;
}

/// Answers a check from Redis when the breaker lets it through (one round trip, run by
/// SHA), by the layer's [`FailurePolicy`] otherwise; a failed round trip is answered by
/// the failure policy too, and counts toward the breaker unless it concerns only its key.
/// A key Redis refused recently is refused from the deny cache without a round trip.
pub(crate) fn check<T: Store>(store: &Arc<T>, key: &[u8], cost: NonZeroU32) -> Check {
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
    if !redis.admit() {
        return Check::ready(unavailable(&**store, key, cost));
    }
    let redis_key = remote.redis_key(key);
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
        let result = redis.eval(store.script(), &invocation).await;
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
        let fault = error.fault();
        crate::metrics::redis_error(&remote.name, fault.label());
        if fault == Fault::Key {
            redis.key_error(remote.backend.inner.deny.hash(&redis_key), &error);
        }
        // The key, read back from the Redis key (only on this failure path).
        let key = remote.layout.key_of(&redis_key).unwrap_or_default();
        unavailable(&*store, &key, cost)
    })
}

/// The answer while Redis is unreachable, by the layer's failure policy.
fn unavailable<T: Store>(store: &T, key: &[u8], cost: NonZeroU32) -> Decision {
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
    #[cfg(feature = "cluster")]
    cluster_urls: Option<Vec<String>>,
    prefix: String,
    call_timeout: Duration,
    probe_interval: Duration,
    breaker: BreakerConfig,
    deny_cache: usize,
    failover: Failover,
}

impl Default for BackendBuilder {
    fn default() -> Self {
        Self {
            pool: None,
            url: None,
            #[cfg(feature = "cluster")]
            cluster_urls: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            breaker: BreakerConfig::default(),
            deny_cache: DEFAULT_DENY_CACHE_CAPACITY,
            failover: Failover::default(),
        }
    }
}

impl BackendBuilder {
    /// Keeps limits in the Redis at `url` (`redis://[user:password@]host:port/db`). The
    /// backend connects itself, with `TCP_NODELAY` on its socket (a pool built with
    /// `deadpool_redis::Config` leaves it off, which costs about a round trip per request
    /// under concurrency); this is the recommended way to reach a single Redis. Nothing
    /// connects until the first check.
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
    ///
    /// The backend takes one connection out of the pool and keeps it (every check is
    /// pipelined on it), replacing it when it fails. Its socket has the pool's settings:
    /// a pool built with `deadpool_redis::Config` leaves `TCP_NODELAY` off, which costs
    /// latency under concurrency; [`redis_url`](Self::redis_url) turns it on.
    pub fn redis(mut self, pool: deadpool_redis::Pool) -> Self {
        self.pool = Some(RedisPool::Single(pool));
        self
    }

    /// Keeps limits in the Redis Cluster whose nodes (some or all of them) are at `urls`.
    /// The backend connects itself, with `TCP_NODELAY` on every socket; this is the
    /// recommended way to reach a cluster. Every script touches one key, so each check
    /// runs on the node that owns the key's slot. Nothing connects until the first check.
    ///
    /// ```
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_cluster_urls(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .build()?;
    /// assert!(backend.is_redis());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn redis_cluster_urls<I, U>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        self.cluster_urls = Some(urls.into_iter().map(Into::into).collect());
        self
    }

    /// Keeps limits in a Redis Cluster through this pool. Every script touches one key,
    /// so each check runs on the node that owns the key's slot. The pool's connections
    /// keep deadpool's socket settings (`TCP_NODELAY` off);
    /// [`redis_cluster_urls`](Self::redis_cluster_urls) turns it on.
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
    /// between applications; see [Redis keys](self#redis-keys) for the whole layout.
    /// At most 128 bytes, without `{`, `}`, control characters, quotes or backslashes.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The deadline of one Redis check, waiting for a connection included (default
    /// 100 ms). A check that takes longer is answered by its layer's failure policy, and
    /// counts as a failure for the [breaker](Self::breaker_failure_ratio).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// How often the probe tries Redis while the breaker holds the backend on its failure
    /// policies (default 500 ms). A probe is one round trip: a script that writes one
    /// small key (`<prefix>:probe`), so a Redis that answers but refuses writes (`OOM`,
    /// `READONLY`, `LOADING`) is not taken for healthy.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// The span of recent calls the breaker judges (default 2 s, in 20 buckets).
    ///
    /// The breaker moves the backend to its failure policies when, within this span, at
    /// least [`breaker_min_calls`](Self::breaker_min_calls) calls were made and at least
    /// [`breaker_failure_ratio`](Self::breaker_failure_ratio) of them failed for a reason
    /// that concerns the whole server (a transport failure or timeout, or a server-wide
    /// error such as `OOM` or `READONLY`), or when three calls or more in a row failed over
    /// twice the [call timeout](Self::call_timeout) (so a quiet service does not need
    /// [`breaker_min_calls`](Self::breaker_min_calls) failures first). Errors that concern
    /// one key (`WRONGTYPE`, a script error caused by a stored value) never count: only
    /// that request is answered by its failure policy.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .breaker_window(Duration::from_secs(5))
    ///     .breaker_min_calls(50)
    ///     .breaker_failure_ratio(0.25)
    ///     .recovery(Duration::from_secs(2))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn breaker_window(mut self, window: Duration) -> Self {
        self.breaker.window = window;
        self
    }

    /// How many calls the [breaker window](Self::breaker_window) must hold before their
    /// failure ratio is judged (default 20).
    pub fn breaker_min_calls(mut self, calls: u32) -> Self {
        self.breaker.min_calls = calls;
        self
    }

    /// The share of failed calls within the [breaker window](Self::breaker_window) that
    /// moves the backend to its failure policies, in `(0, 1]` (default 0.5).
    pub fn breaker_failure_ratio(mut self, ratio: f64) -> Self {
        self.breaker.failure_ratio = ratio;
        self
    }

    /// How long traffic takes to return to Redis once a probe succeeds (default 1 s): a
    /// tenth of the checks at first, all of them at the end, the rest answered by the
    /// failure policies meanwhile, so a recovering Redis is not hit by every instance's
    /// whole traffic at once. A failure ratio over the threshold meanwhile moves the
    /// backend back to its failure policies.
    pub fn recovery(mut self, recovery: Duration) -> Self {
        self.breaker.recovery = recovery;
        self
    }

    /// Checks the settings and builds the backend.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for an invalid prefix, a zero timeout or probe interval, a
    /// fallback share or failure ratio outside `(0, 1]`, zero minimum calls, a breaker
    /// window under 20 ms, a Redis URL that cannot be parsed, or both a URL and a pool.
    pub fn build(mut self) -> Result<Backend, ConfigError> {
        check_name("prefix", &self.prefix)?;
        self.failover.check()?;
        self.breaker.check()?;
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
            let pool = RedisPool::from_url(&url).map_err(|error| ConfigError::InvalidRedisUrl {
                reason: error.to_string(),
            })?;
            self.pool = Some(pool);
        }
        #[cfg(feature = "cluster")]
        if let Some(urls) = self.cluster_urls.take() {
            if self.pool.is_some() {
                return Err(ConfigError::Conflict {
                    reason: "more than one of a Redis URL, cluster URLs and a pool were given",
                });
            }
            let pool = RedisPool::from_cluster_urls(&urls).map_err(|error| {
                ConfigError::InvalidRedisUrl {
                    reason: error.to_string(),
                }
            })?;
            self.pool = Some(pool);
        }
        let redis = self.pool.map(|pool| {
            crate::metrics::fallback_active(&self.prefix, false);
            Arc::new(RedisBackend::new(
                pool,
                self.prefix.clone(),
                self.call_timeout,
                self.probe_interval,
                self.breaker,
            ))
        });
        Ok(Backend {
            inner: Arc::new(Inner {
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
    fn redis_key_layout() {
        let b = Backend::builder().prefix("app").build().unwrap();
        let remote = Remote::new(&b, "period", "sms");
        assert_eq!(
            remote.redis_key(b"ip:1.2.3.4"),
            b"app:{v1:ip:1.2.3.4}:period:sms"
        );
        assert_eq!(b.redis_healthy(), None);
    }
}
