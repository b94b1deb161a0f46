//! [`BackendBuilder`]: where Redis is (a URL, cluster URLs, sentinels or a pool of your
//! own), how it is judged (call timeout, breaker, probe, recovery) and what answers
//! meanwhile (failure policy, fallback share), checked when the backend is built.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::decide::deny::DenyCache;
use super::decide::engine::ENGINE;
use super::redis::changes::OnChange;
use super::redis::connect::{Target, Tls};
use super::redis::credentials::BoxedProvider;
use super::redis::health::BreakerConfig;
use super::redis::time::TimeSource;
use super::redis::{Engine, RedisBackend};
use super::{
    Backend, Failover, FailurePolicy, Inner, ShareRounding, DEFAULT_BATCH_AFTER,
    DEFAULT_CALL_TIMEOUT, DEFAULT_DENY_CACHE_CAPACITY, DEFAULT_DENY_CACHE_MAX_AGE,
    DEFAULT_MAX_LOCAL_KEYS, DEFAULT_PREFIX, DEFAULT_PROBE_INTERVAL,
};
use crate::clock::Clock;
use crate::error::{validate_name, ConfigError};
use crate::local::LocalStore;

mod target;

/// Configures a [`Backend`].
///
/// Its `Debug` output never shows URLs (they may hold passwords) or certificates.
#[must_use = "a builder does nothing until `build` is called"]
pub struct BackendBuilder {
    target: Option<Target>,
    /// More than one place for Redis was given.
    targets: usize,
    tls: Tls,
    /// Where the change subscription of a backend on a pool connects.
    subscription_url: Option<String>,
    #[cfg(feature = "sentinel")]
    master_auth: Option<(String, String)>,
    credentials: Option<Box<dyn BoxedProvider>>,
    prefix: String,
    call_timeout: Duration,
    probe_interval: Duration,
    breaker: BreakerConfig,
    deny_cache: usize,
    deny_max_age: Duration,
    coalesce: bool,
    batch: usize,
    max_local_keys: u64,
    failover: Failover,
    /// See [`time_source`](Self::time_source) (in `time.rs`).
    pub(super) time: TimeSource,
    pub(super) caller_offset_us: i64,
    /// Whether the engine may run as Redis Functions (see [`Self::engine_functions`]).
    functions: bool,
    pub(super) manual_clock: Option<crate::clock::ManualClock>,
}

impl Default for BackendBuilder {
    fn default() -> Self {
        Self {
            target: None,
            targets: 0,
            tls: Tls::default(),
            subscription_url: None,
            #[cfg(feature = "sentinel")]
            master_auth: None,
            credentials: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            breaker: BreakerConfig::default(),
            deny_cache: DEFAULT_DENY_CACHE_CAPACITY,
            deny_max_age: DEFAULT_DENY_CACHE_MAX_AGE,
            coalesce: true,
            batch: DEFAULT_BATCH_AFTER,
            max_local_keys: DEFAULT_MAX_LOCAL_KEYS,
            failover: Failover::default(),
            time: TimeSource::default(),
            caller_offset_us: 0,
            functions: true,
            manual_clock: None,
        }
    }
}

impl fmt::Debug for BackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendBuilder")
            .field("redis", &self.target.as_ref().map(Target::kind))
            .field("tls", &self.tls)
            .field("credentials_provider", &self.credentials.is_some())
            .field("subscription_url", &self.subscription_url.is_some())
            .field("prefix", &self.prefix)
            .field("call_timeout", &self.call_timeout)
            .field("probe_interval", &self.probe_interval)
            .field("breaker", &self.breaker)
            .field("deny_cache", &self.deny_cache)
            .field("deny_cache_max_age", &self.deny_max_age)
            .field("max_local_keys", &self.max_local_keys)
            .field("failover", &self.failover)
            .field("time_source", &self.time)
            .finish_non_exhaustive()
    }
}

impl BackendBuilder {
    /// How many refused keys the local deny cache remembers (default 10 000; `0` turns
    /// it off). While Redis refuses a key until a known time, further requests on that
    /// key are refused locally until then without a round trip.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }

    /// The longest a refusal is answered from the local deny cache without asking Redis
    /// again (default 1 s; at least 1 ms), however long
    /// the refusal lasts; a key flooded while refused costs Redis one call per max age
    /// per instance. A reset, refund or block made through this backend reaches its
    /// answers at once; another instance's reset or block of a key (an administrator
    /// lifting a 15-minute lockout) within about a round trip, by the change
    /// subscription, and within this max age while that subscription is down or
    /// missing (a backend on a pool of yours without a
    /// [`subscription_url`](Self::subscription_url)): see
    /// [Changes on every instance](crate::guide::operations#changes-on-every-instance).
    ///
    /// A cached refusal's `Retry-After` is Redis's, counted down by this process's
    /// clock: it may tell a client to retry earlier than Redis would say now (by at most
    /// its age, so at most this max age: a client that comes back early is refused
    /// again), never later.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .deny_cache_max_age(Duration::from_millis(250))
    ///     .build()?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn deny_cache_max_age(mut self, max_age: Duration) -> Self {
        self.deny_max_age = max_age;
        self
    }

    /// Whether concurrent checks of one key in this process share Redis calls (default
    /// on). While a check of a key waits for Redis, the checks of that key arriving
    /// meanwhile queue, and go to Redis together in one script call when it returns;
    /// the script decides each in arrival order as its own call would, so decisions are
    /// exactly those of one call each. A hot key under many concurrent requests then
    /// costs about two calls per round trip instead of one per request; a check that
    /// queued waits for the call in flight and its own (at most two round trips). Off:
    /// one call per check, always.
    pub fn coalesce(mut self, enabled: bool) -> Self {
        self.coalesce = enabled;
        self
    }

    /// Batching: how many calls of one limiter may be in flight to a Redis node (on
    /// Redis Cluster, to one slot) before its checks of other keys (and its
    /// [settlements](crate::Limiter::settle)) wait and go together (default 2; 0
    /// turns batching off).
    ///
    /// A check goes to Redis at once while fewer calls of its limiter are in flight;
    /// past that it queues, and when one of those calls returns, every check queued
    /// meanwhile goes in one script call, which decides each exactly as its own call would
    /// (one call's fixed cost in Redis shared by all of them: see `benches/NOTES.md`). A
    /// queued check waits for a call that was ahead of it at Redis anyway, then for its
    /// own, and never longer than the [call timeout](Self::call_timeout) in all. Below
    /// that load nothing changes: one call per check, sent at once. On Redis Cluster only
    /// keys of one slot go together; behind a proxy that refuses a call whose keys span
    /// slots (`CROSSSLOT`), the limiter stops batching and each check makes its own call.
    ///
    /// ```
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// // Batch once four calls of a limiter are in flight.
    /// let backend = Backend::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .batch_after(4)
    ///     .build()?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn batch_after(mut self, calls_in_flight: usize) -> Self {
        self.batch = calls_in_flight;
        self
    }

    /// The most keys the in-process state of this backend holds, all layers together
    /// (default 1 000 000). This state answers every check
    /// of an in-process backend and a Redis backend's checks while Redis is unreachable.
    ///
    /// A fixed-window or token-bucket key counts as one key, a rolling-window key as
    /// `ceil(buckets / 8)` keys (a window of 10 buckets counts as 2). When the state is
    /// full, a new key makes room by dropping another: keys seen only once go first (they
    /// wait in a small probation queue), then the keys hit least recently; and among
    /// those, keys that carry nothing (back at their full limit, their window or block
    /// ended) before keys that have spent part of their limit or are blocked. A dropped
    /// key starts again with its full limit (a limited key dropped when only such keys
    /// are left admits up to its limit again), and each drop is counted in the
    /// `ratelimit_local_evictions_total` [metric](crate::guide::metrics).
    /// Expired state is never swept: it is reset when its key is hit again, and is the
    /// first to go when room is needed, so no request ever waits on a sweep. The bound
    /// is split evenly over up to 64 shards, each with its own lock (so it is rounded
    /// down to a multiple of their number).
    ///
    /// Measured resident bytes per key with the bound reached (`VmRSS`, glibc; see
    /// `benches/NOTES.md`): about 100 for the fixed window and the token bucket, about 250
    /// for a rolling window of 10 buckets (two keys' worth), at most about 190 per key's
    /// worth for any rolling window: the default stays under 256 MB (under 100 MiB for
    /// the fixed window and the token bucket) whatever the number of keys. Size it to
    /// the keys active within one window (or refill time) of your longest limit.
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
    /// [`LayerBuilder::failure_policy`](crate::LayerBuilder::failure_policy).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failover.policy = policy;
        self
    }

    /// The fraction of every limit that the in-process fallback applies while Redis is
    /// unreachable (default 1.0), e.g. `1.0 / 4.0` when four instances share the limit,
    /// so that together they admit about the limit, not four times it. Limits are
    /// rounded down, never below one unless [`fallback_rounding`](Self::fallback_rounding)
    /// says [`ShareRounding::WithinLimit`]. Layers can override it with
    /// [`LayerBuilder::fallback_share`](crate::LayerBuilder::fallback_share).
    pub fn fallback_share(mut self, share: f64) -> Self {
        self.failover.share = share;
        self
    }

    /// How a [fallback share](Self::fallback_share) below one unit is rounded: to one
    /// (every instance stays available; the default) or to zero (the fleet never
    /// admits above the limit; such an instance refuses that limit's requests while
    /// Redis is unreachable). See [`ShareRounding`]. Layers can override it with
    /// [`LayerBuilder::fallback_rounding`](crate::LayerBuilder::fallback_rounding).
    pub fn fallback_rounding(mut self, rounding: ShareRounding) -> Self {
        self.failover.rounding = rounding;
        self
    }

    /// The prefix of every Redis key (default `ratelimit`), e.g. to share one Redis
    /// between applications; see [Redis keys](crate::guide::deployments#redis-keys) for the whole layout.
    /// At most 128 bytes, without `{`, `}`, control characters, quotes or backslashes.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Not part of the API: with `false`, the engine runs by `EVALSHA` even on servers
    /// with Redis Functions (the default: Functions where the server has them, Redis 7
    /// and later; `EVALSHA` elsewhere), so that tests and benchmarks cover both paths.
    /// The library reads no environment variable: the tests' support sets this from
    /// `TOWER_REDIS_RATELIMIT_EVALSHA`.
    #[doc(hidden)]
    pub fn engine_functions(mut self, enabled: bool) -> Self {
        self.functions = enabled;
        self
    }

    /// The deadline of one Redis check, waiting for a connection included (default
    /// 100 ms). A check that takes longer is answered by its layer's failure policy, and
    /// counts as a failure for the [breaker](Self::breaker_failure_ratio). A connection
    /// attempt may take four call timeouts (at least 1 s); while a backend's first one
    /// is under way, its checks wait for it that long, and then for their reply
    /// (connecting and loading the engine take several round trips: see
    /// [`Backend::warm_up`](crate::Backend::warm_up)).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// How often the probe tries Redis while the breaker holds the backend on its failure
    /// policies, and from the first failure before that until Redis answers again or the
    /// breaker opens (default 500 ms). A probe is one round trip: a script that writes one
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
    /// error such as `OOM` or `READONLY`), or when three failures in a row, with nothing
    /// answered between them, span twice the [call timeout](Self::call_timeout) or more,
    /// however far apart they are. Those failures include checks that gave up waiting for
    /// a connection attempt still under way, and failed probes: from the first failure,
    /// the probe tries Redis every [probe interval](Self::probe_interval) whatever the
    /// traffic, so a quiet service moves to its failure policies within two probe
    /// intervals and two call timeouts of its first failed check (1.2 s by default; see
    /// [Failure modes](crate::guide::failure_modes#failure-modes)). Errors that concern one key
    /// (`WRONGTYPE`, a script error caused by a stored value) never count: only that
    /// request is answered by its failure policy; nor do the answers of the failure
    /// policies and of the deny cache, so the breaker cannot hold itself open.
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
    /// window under 20 ms, zero [`max_local_keys`](Self::max_local_keys), a Redis URL that
    /// cannot work (its message names what: the scheme, with the accepted ones, the
    /// host, the port, the cargo feature `rediss://` needs; never the URL's password),
    /// more than one place for Redis, or a
    /// [`subscription_url`](Self::subscription_url) without a pool.
    pub fn build(mut self) -> Result<Backend, ConfigError> {
        validate_name("prefix", &self.prefix)?;
        if self.max_local_keys == 0 {
            return Err(ConfigError::Zero {
                setting: "max_local_keys",
            });
        }
        self.failover.validate()?;
        self.breaker.validate()?;
        if self.call_timeout < Duration::from_millis(1) {
            return Err(ConfigError::ZeroDuration {
                setting: "call_timeout",
            });
        }
        if self.deny_max_age < Duration::from_millis(1) {
            return Err(ConfigError::ZeroDuration {
                setting: "deny_cache_max_age",
            });
        }
        if self.probe_interval < Duration::from_millis(1) {
            return Err(ConfigError::ZeroDuration {
                setting: "probe_interval",
            });
        }
        let connector = self.connector()?;
        let clock = self.manual_clock.map_or_else(Clock::new, Clock::Manual);
        let local = Arc::new(LocalStore::new(
            self.max_local_keys,
            &self.prefix,
            clock.clone(),
        ));
        // The Redis side hears the changes of every instance (`redis/changes.rs`) and
        // hands them to this backend's deny cache and leases, through a callback that
        // holds the backend weakly (the backend holds the Redis side).
        let inner = Arc::new_cyclic(|inner: &std::sync::Weak<Inner>| {
            let redis = connector.map(|connector| {
                crate::metrics::redis_backend_built(&self.prefix);
                let inner = inner.clone();
                let on_change: OnChange = Box::new(move |change| {
                    if let Some(inner) = inner.upgrade() {
                        inner.changed(change);
                    }
                });
                Arc::new(RedisBackend::new(
                    connector,
                    self.prefix.clone(),
                    self.call_timeout,
                    self.probe_interval,
                    self.breaker,
                    Engine {
                        scripts: &ENGINE,
                        time: self.time,
                        functions: self.functions,
                    },
                    on_change,
                ))
            });
            Inner {
                local,
                prefix: self.prefix,
                clock,
                time: self.time,
                caller_offset_us: self.caller_offset_us,
                redis,
                deny: DenyCache::new(self.deny_cache, self.deny_max_age),
                coalesce: self.coalesce,
                batch_after: self.batch,
                leased: std::sync::Mutex::default(),
            }
        });
        Ok(Backend {
            inner,
            failover: self.failover,
        })
    }
}

impl BackendBuilder {
    /// Where the Redis scripts take the current time from (default
    /// [`TimeSource::Server`], the Redis server's `TIME`). [`TimeSource::Caller`] sends
    /// this backend's clock to every script as one more argument instead, and no script
    /// calls `TIME`: for servers that refuse `TIME` in scripts (reported of ElastiCache
    /// Serverless; [`Backend::warm_up`](crate::Backend::warm_up) names the
    /// refusal and this remedy). Instances whose clocks differ then
    /// keep each algorithm's guarantees within a documented bound (see [`TimeSource`]);
    /// every instance on one Redis must use the same setting.
    ///
    /// ```
    /// use tower_redis_ratelimit::{TimeSource, Backend};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_url("redis://serverless.internal:6379")
    ///     .time_source(TimeSource::Caller)
    ///     .build()?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// Not part of the API: moves the clock that [`TimeSource::Caller`] sends to the
    /// scripts by `offset_us` microseconds (negative: behind), so that tests can run
    /// instances whose clocks differ.
    #[doc(hidden)]
    pub fn caller_clock_offset_us(mut self, offset_us: i64) -> Self {
        self.caller_offset_us = offset_us;
        self
    }

    /// Not part of the API: the in-process state (and the caller's time sent to the
    /// scripts) reads `clock`, which the tests set, instead of tokio's clock.
    #[doc(hidden)]
    pub fn manual_clock(mut self, clock: crate::clock::ManualClock) -> Self {
        self.manual_clock = Some(clock);
        self
    }
}

/// The ways to build a backend.
impl Backend {
    /// A backend that keeps every limit in this process.
    #[must_use]
    pub fn in_process() -> Self {
        Self::builder()
            .build()
            .expect("the default configuration is valid")
    }

    /// A Redis backend on `pool` with the default settings: its sockets are the pool's,
    /// and it has no change subscription (resets and blocks made on other instances
    /// reach it within the deny cache's max age, 1 s). For both, build the pool with
    /// `TCP_NODELAY` and give its URL to
    /// [`subscription_url`](BackendBuilder::subscription_url): see
    /// [`BackendBuilder::redis`], which says why the backend cannot derive either from
    /// the pool.
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
}
