//! [`BackendBuilder`]: where Redis is (a URL, cluster URLs, sentinels or a pool of your
//! own), how it is judged (call timeout, breaker, probe, recovery) and what answers
//! meanwhile (failure policy, fallback share), checked when the backend is built.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::connect::{Connector, Tls};
use super::credentials::{CredentialsProvider, Rotation};
use super::deny::DenyCache;
use super::health::BreakerConfig;
use super::redis::RedisBackend;
use super::{
    Backend, Failover, FailurePolicy, Inner, TimeSource, DEFAULT_CALL_TIMEOUT,
    DEFAULT_DENY_CACHE_CAPACITY, DEFAULT_DENY_CACHE_MAX_AGE, DEFAULT_MAX_LOCAL_KEYS,
    DEFAULT_PREFIX, DEFAULT_PROBE_INTERVAL,
};
use crate::clock::Clock;
use crate::error::{validate_name, ConfigError};
use crate::local::LocalStore;

/// Where Redis is, as given to the builder.
enum Target {
    Pool(Connector),
    Url(String),
    #[cfg(feature = "cluster")]
    ClusterUrls(Vec<String>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        master: String,
        urls: Vec<String>,
    },
}

impl Target {
    fn kind(&self) -> &'static str {
        match self {
            Self::Pool(_) => "pool",
            Self::Url(_) => "url",
            #[cfg(feature = "cluster")]
            Self::ClusterUrls(_) => "cluster urls",
            #[cfg(feature = "sentinel")]
            Self::Sentinel { .. } => "sentinel",
        }
    }
}

/// Configures a [`Backend`].
///
/// Its `Debug` output never shows URLs (they may hold passwords) or certificates.
#[must_use = "a builder does nothing until `build` is called"]
pub struct BackendBuilder {
    target: Option<Target>,
    /// More than one place for Redis was given.
    targets: usize,
    tls: Tls,
    #[cfg(feature = "sentinel")]
    master_auth: Option<(String, String)>,
    credentials: Option<Box<dyn CredentialsProvider>>,
    prefix: String,
    call_timeout: Duration,
    probe_interval: Duration,
    breaker: BreakerConfig,
    deny_cache: usize,
    deny_max_age: Duration,
    coalesce: bool,
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
            max_local_keys: DEFAULT_MAX_LOCAL_KEYS,
            failover: Failover::default(),
            time: TimeSource::default(),
            caller_offset_us: 0,
            functions: std::env::var_os("TOWER_REDIS_RATELIMIT_EVALSHA")
                .is_none_or(|v| v.is_empty()),
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
    fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self.targets += 1;
        self
    }

    /// Keeps limits in the Redis at `url`: `redis://[user:password@]host:port/db`, or
    /// with the `tls` feature `rediss://` (the system's certificate authorities, or the
    /// ones given to [`tls_ca_pem`](Self::tls_ca_pem)). The backend connects itself, with
    /// `TCP_NODELAY` on its socket (a pool built with `deadpool_redis::Config` leaves it
    /// off, which costs about a round trip per request under concurrency); this is the
    /// recommended way to reach a single Redis. Nothing connects until the first check:
    /// [`Backend::probe_redis`](crate::Backend::probe_redis) tells at start-up whether
    /// Redis accepts the credentials.
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
    pub fn redis_url(self, url: impl Into<String>) -> Self {
        self.target(Target::Url(url.into()))
    }

    /// Keeps limits in Redis through this pool (without it, limits stay in-process).
    ///
    /// The backend takes one connection out of the pool and keeps it (every check is
    /// pipelined on it), replacing it when it fails. Its socket has the pool's settings:
    /// a pool built with `deadpool_redis::Config` leaves `TCP_NODELAY` off, which costs
    /// latency under concurrency; [`redis_url`](Self::redis_url) turns it on.
    pub fn redis(self, pool: deadpool_redis::Pool) -> Self {
        self.target(Target::Pool(Connector::Pool(pool)))
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
    pub fn redis_cluster_urls<I, U>(self, urls: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        self.target(Target::ClusterUrls(
            urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// Keeps limits in the master that the Redis Sentinels at `sentinel_urls` name
    /// `master` (`redis://[user:password@]host:port` of each sentinel; `rediss://` with
    /// the `tls` feature, for the sentinels and the master alike). Every new connection
    /// asks the sentinels for the current master, so after a failover the backend
    /// follows the new one (its connection to the old one fails, and the failure policies
    /// answer until then). The master's own credentials are
    /// [`sentinel_master_auth`](Self::sentinel_master_auth).
    ///
    /// Counts that the old master had not yet replicated when it failed are lost with
    /// it: those keys may admit up to that many requests again.
    ///
    /// ```
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_sentinel("mymaster", ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"])
    ///     .sentinel_master_auth("limiter", "secret")
    ///     .build()?;
    /// assert!(backend.is_redis());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn redis_sentinel<I, U>(self, master: impl Into<String>, sentinel_urls: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        self.target(Target::Sentinel {
            master: master.into(),
            urls: sentinel_urls.into_iter().map(Into::into).collect(),
        })
    }

    /// The ACL user and password of the master found through
    /// [`redis_sentinel`](Self::redis_sentinel) (`default` as the user for a
    /// `requirepass` password).
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_master_auth(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.master_auth = Some((username.into(), password.into()));
        self
    }

    /// Authenticates every connection the backend makes with credentials from
    /// `provider`, for short-lived tokens (AWS ElastiCache and MemoryDB IAM auth, Azure
    /// Entra ID) or passwords that rotate. A new connection uses credentials at most
    /// three quarters through their lifetime (asking the provider for new ones if
    /// needed); before they expire, the backend asks again and every kept connection
    /// re-authenticates (`AUTH`, pipelined with its checks: no decision fails at the
    /// switch). One backend asks the provider once per renewal, however many
    /// connections it has (a cluster's nodes).
    ///
    /// A provider that fails is asked again with a backoff (100 ms doubling to 30 s)
    /// and logged at most every ten seconds; kept connections stay on their current
    /// credentials meanwhile, and a new connection fails, which the layers'
    /// [failure policy](crate::FailurePolicy) answers for.
    ///
    /// For connections the backend makes ([`redis_url`](Self::redis_url),
    /// [`redis_cluster_urls`](Self::redis_cluster_urls), the master of
    /// [`redis_sentinel`](Self::redis_sentinel)); credentials in a URL are replaced.
    /// [`build`](Self::build) refuses it with a pool (configure the pool's own
    /// connections) or with [`sentinel_master_auth`](Self::sentinel_master_auth).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{backend::Credentials, Backend};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .credentials(|| async {
    ///         let token = std::env::var("REDIS_TOKEN")?;
    ///         Ok::<_, std::env::VarError>(
    ///             Credentials::new("limiter", token).expires_in(Duration::from_secs(900)),
    ///         )
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn credentials(mut self, provider: impl CredentialsProvider) -> Self {
        self.credentials = Some(Box::new(provider));
        self
    }

    /// Trusts the certificate authorities in `pem` (one or more PEM certificates) for
    /// `rediss://` connections, instead of the system's.
    ///
    /// ```no_run
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder()
    ///     .redis_url("rediss://limiter:secret@redis.internal:6380")
    ///     .tls_ca_pem(std::fs::read("ca.pem")?)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (PEM) on `rediss://` connections, for
    /// servers that require mutual TLS (`tls-auth-clients yes`).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_auth_pem(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((certificate.into(), key.into()));
        self
    }

    /// Keeps limits in a Redis Cluster through this pool. Every script touches one key,
    /// so each check runs on the node that owns the key's slot. The pool's connections
    /// keep deadpool's socket settings (`TCP_NODELAY` off);
    /// [`redis_cluster_urls`](Self::redis_cluster_urls) turns it on.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn redis_cluster(self, pool: deadpool_redis::cluster::Pool) -> Self {
        self.target(Target::Pool(Connector::ClusterPool(pool)))
    }

    /// How many refused keys the local deny cache remembers (default 10 000; `0` turns
    /// it off). While Redis refuses a key until a known time, further requests on that
    /// key are refused locally until then without a round trip.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }

    /// The longest a refusal is answered from the local deny cache without asking Redis
    /// again (default [`DEFAULT_DENY_CACHE_MAX_AGE`], 1 s; at least 1 ms), however long
    /// the refusal lasts. It bounds how long another instance's reset or new block of a
    /// key (an administrator lifting a 15-minute lockout) takes to reach this process's
    /// answers; a key flooded while refused costs Redis one call per max age per
    /// instance. A reset, refund or block made through this backend reaches its answers
    /// at once.
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

    /// The most keys the in-process state of this backend holds, all layers together
    /// (default [`DEFAULT_MAX_LOCAL_KEYS`], one million). This state answers every check
    /// of an in-process backend and a Redis backend's checks while Redis is unreachable.
    ///
    /// A fixed-window or token-bucket key counts as one key, a rolling-window key as
    /// `ceil(buckets / 8)` keys (a window of 10 buckets counts as 2). When the state is
    /// full, a new key makes room by dropping another: keys seen only once go first (they
    /// wait in a small probation queue), then the keys hit least recently; a dropped key
    /// starts again with its full limit, and each drop is counted in the
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
    /// between applications; see [Redis keys](crate::backend#redis-keys) for the whole layout.
    /// At most 128 bytes, without `{`, `}`, control characters, quotes or backslashes.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Not part of the API: with `false`, the engine runs by `EVALSHA` even on servers
    /// with Redis Functions (the default: Functions where the server has them, Redis 7
    /// and later; `EVALSHA` elsewhere), so that tests and benchmarks cover both paths.
    /// The environment variable `TOWER_REDIS_RATELIMIT_EVALSHA` (any value) sets the
    /// default to `false`.
    #[doc(hidden)]
    pub fn engine_functions(mut self, enabled: bool) -> Self {
        self.functions = enabled;
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
    /// [Failure modes](crate::guide#failure-modes)). Errors that concern one key
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
    /// or more than one place for Redis.
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
        if self.targets > 1 {
            return Err(ConfigError::Conflict {
                reason:
                    "more than one of a Redis URL, cluster URLs, sentinels and a pool were given",
            });
        }
        if self.credentials.is_some() && matches!(self.target, Some(Target::Pool(_))) {
            return Err(ConfigError::Conflict {
                reason: "credentials apply to connections the backend makes from URLs, not to \
                         a pool's: give the pool's own configuration the credentials",
            });
        }
        #[cfg(feature = "sentinel")]
        if self.credentials.is_some() && self.master_auth.is_some() {
            return Err(ConfigError::Conflict {
                reason: "both sentinel_master_auth and a credentials provider were given",
            });
        }
        let credentials = self.credentials.take().map(Rotation::new);
        let invalid = |error: deadpool_redis::redis::RedisError| ConfigError::InvalidRedisUrl {
            reason: error.to_string(),
        };
        let connector = match self.target.take() {
            None => None,
            Some(Target::Pool(connector)) => Some(connector),
            Some(Target::Url(url)) => {
                check_url(&url, None)?;
                Some(Connector::from_url(&url, &self.tls, credentials).map_err(invalid)?)
            }
            #[cfg(feature = "cluster")]
            Some(Target::ClusterUrls(urls)) => {
                if urls.is_empty() {
                    return Err(ConfigError::Missing {
                        setting: "redis_cluster_urls",
                    });
                }
                for (i, url) in urls.iter().enumerate() {
                    check_url(url, Some(("cluster URL", i)))?;
                }
                Some(Connector::from_cluster_urls(&urls, &self.tls, credentials).map_err(invalid)?)
            }
            #[cfg(feature = "sentinel")]
            Some(Target::Sentinel { master, urls }) => {
                for (i, url) in urls.iter().enumerate() {
                    check_url(url, Some(("sentinel URL", i)))?;
                }
                Some(
                    Connector::from_sentinels(
                        &master,
                        &urls,
                        self.master_auth.as_ref(),
                        &self.tls,
                        credentials,
                    )
                    .map_err(invalid)?,
                )
            }
        };
        let redis = connector.map(|connector| {
            crate::metrics::fallback_active(&self.prefix, false);
            Arc::new(RedisBackend::new(
                connector,
                self.prefix.clone(),
                self.call_timeout,
                self.probe_interval,
                self.breaker,
                self.functions,
            ))
        });
        let local = Arc::new(LocalStore::new(self.max_local_keys, &self.prefix));
        Ok(Backend {
            inner: Arc::new(Inner {
                local,
                prefix: self.prefix,
                clock: self.manual_clock.map_or_else(Clock::new, Clock::Manual),
                time: self.time,
                caller_offset_us: self.caller_offset_us,
                redis,
                deny: DenyCache::new(self.deny_cache, self.deny_max_age),
                coalesce: self.coalesce,
            }),
            failover: self.failover,
        })
    }
}

/// Checks a Redis URL before the Redis client parses it, so that its error says what is
/// wrong (the scheme, the host, the port, a cargo feature) instead of "did not parse".
/// `which` names one URL of several (`cluster URL`, its index). Never puts the URL's
/// user information (a password) into the message.
fn check_url(url: &str, which: Option<(&str, usize)>) -> Result<(), ConfigError> {
    url_problem(url, cfg!(feature = "tls")).map_or(Ok(()), |reason| {
        Err(ConfigError::InvalidRedisUrl {
            reason: match which {
                Some((what, i)) => format!("{what} #{}: {reason}", i + 1),
                None => reason,
            },
        })
    })
}

/// The schemes the Redis client accepts, for messages.
const SCHEMES: &str = "`redis://`, `rediss://` (TLS), `valkey://`, `valkeys://` (TLS), \
                       `redis+unix://`, `valkey+unix://` or `unix://`";

/// What is wrong with `url`, if something is; `tls`: whether the `tls` feature is on.
fn url_problem(url: &str, tls: bool) -> Option<String> {
    let url = url.trim();
    if url.is_empty() {
        return Some(format!(
            "the URL is empty; expected `redis://host:6379` (schemes: {SCHEMES})"
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!(
            "no scheme: expected `redis://host:6379`, `rediss://host:6380` or \
             `redis+unix:///path/to/redis.sock` (schemes: {SCHEMES})"
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        "redis" | "valkey" => {}
        "rediss" | "valkeys" if tls => {}
        "rediss" | "valkeys" => {
            return Some(format!(
                "`{scheme}://` (TLS) needs the `tls` cargo feature of tower-redis-ratelimit: \
                 `features = [\"tls\"]` in Cargo.toml"
            ));
        }
        "redis+unix" | "valkey+unix" | "unix" => {
            let path = rest.split(['?', '#']).next().unwrap_or_default();
            return (!path.starts_with('/')).then(|| {
                format!(
                    "`{scheme}://` needs the socket's absolute path: \
                     `{scheme}:///path/to/redis.sock`"
                )
            });
        }
        "redis+cluster" | "redis-cluster" => {
            return Some(
                "Redis Cluster: give the nodes' `redis://` URLs to `redis_cluster_urls` \
                 (cargo feature `cluster`)"
                    .to_owned(),
            );
        }
        "redis+sentinel" | "redis-sentinel" | "sentinel" => {
            return Some(
                "Redis Sentinel: give the master's name and the sentinels' `redis://` URLs \
                 to `redis_sentinel` (cargo feature `sentinel`)"
                    .to_owned(),
            );
        }
        _ => {
            // The scheme is shown only when it looks like one (never a mangled secret).
            let shown = if !scheme.is_empty()
                && scheme.len() <= 16
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.')
            {
                format!("`{scheme}://`")
            } else {
                "the scheme".to_owned()
            };
            return Some(format!("{shown} is not a Redis scheme; expected {SCHEMES}"));
        }
    }
    if rest.contains(",redis") || rest.contains(", redis") {
        return Some(
            "several URLs in one: give a cluster's nodes to `redis_cluster_urls` (cargo \
             feature `cluster`)"
                .to_owned(),
        );
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // A password with `/`, `?` or `#` cuts the authority short: then nothing of it is
    // shown, since what looks like a host or a port may be part of the password.
    let has_userinfo = url.contains('@');
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, port)) => match port.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Some("unexpected text after the IPv6 address `]`".to_owned()),
            },
            None => return Some("an IPv6 address without its closing `]`".to_owned()),
        }
    } else {
        match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Some("no host: expected `redis://host:6379`".to_owned());
    }
    if let Some(port) = port {
        let secret = |text: String| {
            if has_userinfo {
                format!("{text} (a password with `/`, `?`, `#` or `@` must be percent-encoded)")
            } else {
                text
            }
        };
        if port.is_empty() {
            return Some("empty port after `:`; expected 1 to 65535".to_owned());
        }
        if !port.bytes().all(|b| b.is_ascii_digit()) {
            return Some(secret(
                "the port is not a number; expected 1 to 65535".to_owned(),
            ));
        }
        if !matches!(port.parse::<u32>(), Ok(1..=65_535)) {
            let shown = if has_userinfo {
                "the port".to_owned()
            } else {
                format!("port {port}")
            };
            return Some(secret(format!(
                "{shown} is out of range: expected 1 to 65535"
            )));
        }
    }
    let path = rest[authority.len()..]
        .split(['?', '#'])
        .next()
        .unwrap_or_default();
    let db = path.trim_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Some(
            "the path must be a database number (`redis://host:6379/2`), or nothing".to_owned(),
        );
    }
    None
}

#[cfg(test)]
mod url_tests {
    use super::url_problem;

    fn problem(url: &str) -> String {
        url_problem(url, true).unwrap_or_else(|| panic!("{url} was accepted"))
    }

    #[test]
    fn valid_urls_pass() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://127.0.0.1",
            "redis://localhost:6379/2",
            "redis://user:p%40ss@redis.internal:6380/0",
            "redis://:secret@[::1]:6379",
            "rediss://redis.internal:6380#insecure",
            "valkey://h:1",
            "redis+unix:///run/redis.sock",
            "unix:///run/redis.sock?db=2",
        ] {
            assert_eq!(url_problem(url, true), None, "{url}");
        }
    }

    #[test]
    fn each_problem_is_named() {
        assert!(problem("").contains("empty"));
        let scheme = problem("http://127.0.0.1:6379");
        assert!(
            scheme.contains("`http://` is not a Redis scheme"),
            "{scheme}"
        );
        assert!(
            scheme.contains("`redis://`") && scheme.contains("`rediss://`"),
            "{scheme}"
        );
        assert!(scheme.contains("`redis+unix://`"), "{scheme}");
        assert!(problem("127.0.0.1:6379").starts_with("no scheme"));
        assert!(problem("localhost").starts_with("no scheme"));
        let port = problem("redis://127.0.0.1:99999");
        assert_eq!(port, "port 99999 is out of range: expected 1 to 65535");
        assert!(problem("redis://h:0").contains("out of range"));
        assert!(problem("redis://h:abc").contains("not a number"));
        assert!(problem("redis://:6379").starts_with("no host"));
        assert!(problem("redis://").starts_with("no host"));
        assert!(problem("redis://h:6379/x").contains("database number"));
        assert!(problem("unix://run/redis.sock").contains("absolute path"));
        assert!(problem("redis://a:1,redis://b:2").contains("redis_cluster_urls"));
        assert!(problem("redis+sentinel://h:26379").contains("`sentinel`"));
        assert!(problem("redis+cluster://h:7000").contains("`cluster`"));
        let tls = url_problem("rediss://h:6380", false).unwrap();
        assert!(tls.contains("the `tls` cargo feature"), "{tls}");
        assert!(url_problem("valkeys://h:6380", false)
            .unwrap()
            .contains("`tls`"));
    }

    #[test]
    fn no_message_shows_a_password() {
        for url in [
            "redis://user:s3cr3t/x@host:6379",
            "redis://user:99999/x@host:6379",
            "redis://user:s3cr3t@host:99999",
            "redis://user:s3cr3t@host:port",
            "redis://user:s3cr3t@:6379",
            "http://user:s3cr3t@host:6379",
            "redis://user:s3cr3t@host:6379/db",
            "rediss://user:s3cr3t@host:6379",
        ] {
            let message = url_problem(url, false).unwrap_or_default();
            for secret in ["s3cr3t", "99999", "user"] {
                assert!(!message.contains(secret), "{url}: {message}");
            }
        }
    }
}
