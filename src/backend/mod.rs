//! Where limits are kept: the [`Backend`] handle, its builder and its hosts (Redis, in process).

mod builder;
pub(crate) mod decide;
pub(crate) mod redis;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::decide::deny::DenyCache;
use self::decide::lease;
use self::redis::changes::Change;
use self::redis::fault::Fault;
use self::redis::RedisBackend;
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::local::LocalStore;

pub use self::builder::BackendBuilder;
pub(crate) use self::decide::block::Blocks;
pub(crate) use self::decide::check::{check, check_priority};
#[doc(hidden)]
pub use self::decide::engine::engine_script;
pub(crate) use self::decide::hosts::{Hosts, Remote};
pub(crate) use self::decide::layout::{Layout, Owner};
pub(crate) use self::decide::lease::Leases;
pub(crate) use self::decide::operate::{list_blocked, operate, peek_each, Operation};
pub use self::decide::protocol::engine_admits;
pub(crate) use self::redis::call::{Args, Call};
pub use self::redis::credentials::{Credentials, CredentialsProvider};
pub use self::redis::health::RedisState;
pub(crate) use self::redis::script::Scripts;
pub use self::redis::time::TimeSource;
#[doc(hidden)]
pub use crate::clock::ManualClock;

/// The default key prefix.
pub(crate) const DEFAULT_PREFIX: &str = "ratelimit";
/// The default deadline of one Redis round trip (pool wait included).
pub(crate) const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(100);
/// The default interval of the health probe while Redis is unreachable.
pub(crate) const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// The default number of refused keys the local deny cache remembers.
pub(crate) const DEFAULT_DENY_CACHE_CAPACITY: usize = 10_000;
/// The default of [`BackendBuilder::deny_cache_max_age`]: how long a refusal is answered
/// from the local deny cache at most before Redis is asked again.
pub(crate) const DEFAULT_DENY_CACHE_MAX_AGE: Duration = Duration::from_secs(1);
/// The default of [`BackendBuilder::batch_after`]: a limiter's checks of other keys go
/// together once two of its calls are in flight to a node.
pub(crate) const DEFAULT_BATCH_AFTER: usize = 2;
/// The default of [`BackendBuilder::max_local_keys`]: one million keys, under 256 MB
/// of in-process state with any algorithm (measured figures there).
pub(crate) const DEFAULT_MAX_LOCAL_KEYS: u64 = crate::local::DEFAULT_MAX_KEYS;

/// What a layer answers when Redis cannot: while the backend's breaker has judged Redis
/// unusable (see [`BackendBuilder::breaker_failure_ratio`]), and for a single check whose
/// own call failed (a timeout, or an error that concerns only its key, such as
/// `WRONGTYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(rename_all = "snake_case")
)]
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

/// How the in-process fallback turns a limit's [fallback
/// share](BackendBuilder::fallback_share) into whole units: the choice between keeping
/// every instance available and keeping the fleet within the limit, which differ only
/// when a share is below one unit.
///
/// Two export slots shared by three instances (`fallback_share(1.0 / 3.0)`): each
/// instance's share is 0.67 of a slot. [`AtLeastOne`](Self::AtLeastOne) gives each
/// one slot, so the three may run three exports at once while Redis is unreachable;
/// [`WithinLimit`](Self::WithinLimit) gives each none, so none runs until Redis is back.
///
/// ```
/// use tower_redis_ratelimit::{ShareRounding, Backend};
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let backend = Backend::builder()
///     .redis_url("redis://127.0.0.1:6379")
///     .fallback_share(1.0 / 3.0)
///     .fallback_rounding(ShareRounding::WithinLimit)
///     .build()?;
/// # let _ = backend; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum ShareRounding {
    /// Rounded down, but never below one unit (the default): every instance keeps
    /// admitting something, and N instances may admit up to N units where the limit's
    /// share rounds below one.
    #[default]
    AtLeastOne,
    /// Rounded down, to zero if need be: the instances together never admit more than
    /// the limit (N × share ≤ 1), and an instance whose share rounds to zero refuses
    /// every request of that limit (`429` with a retry-after of one probe interval,
    /// [`Source::Fallback`](crate::Source::Fallback)) until Redis answers again.
    WithinLimit,
}

/// Per-layer settings for Redis failures, carried by the backend handle a layer holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Failover {
    pub(crate) policy: FailurePolicy,
    /// The fraction of each limit the in-process fallback applies, in `(0, 1]`.
    pub(crate) share: f64,
    /// How the share is rounded to whole units.
    pub(crate) rounding: ShareRounding,
}

impl Default for Failover {
    fn default() -> Self {
        Self {
            policy: FailurePolicy::Fallback,
            share: 1.0,
            rounding: ShareRounding::AtLeastOne,
        }
    }
}

impl Failover {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
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
/// A backend is either in-process ([`Backend::in_process`]) or Redis
/// ([`Backend::redis`], a `deadpool-redis` pool). Every limiter built on a Redis backend
/// also keeps in-process state with the same semantics, which answers while Redis is
/// unreachable; one health state per backend decides which one answers, and one
/// background probe switches back when Redis recovers. What answers while Redis fails is
/// each layer's [`FailurePolicy`]; a [fallback share](BackendBuilder::fallback_share)
/// keeps N instances from admitting N times the limit meanwhile. A local deny cache
/// remembers Redis's refusals of hot keys until they expire, so a flood on one key costs
/// Redis almost nothing.
///
/// The Redis keys the crate writes, and what a block changes in them, are in
/// [Redis deployments](crate::guide::deployments#redis-keys).
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
    time: TimeSource,
    /// Added to the caller's clock sent to the scripts (tests only).
    caller_offset_us: i64,
    redis: Option<Arc<RedisBackend>>,
    deny: DenyCache,
    local: Arc<LocalStore>,
    /// Whether concurrent checks of one key share calls (see `coalesce.rs`).
    coalesce: bool,
    /// How many calls of a limiter may be in flight to a node before its checks go
    /// together (see `batch.rs`); 0: never.
    batch_after: usize,
    /// The layouts of the limiters with leases and their leases' ids in the local
    /// store, for the change subscription (read only when a change is heard).
    leased: Mutex<Vec<(Layout, u64)>>,
}

impl Inner {
    /// What the change subscription heard: a key reset or blocked (here or on another
    /// instance) is no longer refused from the deny cache nor answered from this
    /// process's lease; when the subscription was made again, every cached refusal is
    /// forgotten, since changes made meanwhile were not heard.
    fn changed(&self, change: Change<'_>) {
        match change {
            Change::Key(redis_key) => {
                if self.deny.is_enabled() {
                    self.deny.remove(self.deny.hash(redis_key));
                }
                let leased = self.leased.lock().unwrap_or_else(|e| e.into_inner());
                for (layout, id) in leased.iter() {
                    if let Some(key) = layout.key_of(redis_key) {
                        lease::forget(&self.local, *id, &key);
                    }
                }
            }
            Change::Resumed => self.deny.clear(),
        }
    }
}

impl Backend {
    /// Whether limits are kept in Redis (possibly answered by the fallback right now).
    #[must_use]
    pub fn is_redis(&self) -> bool {
        self.inner.redis.is_some()
    }

    /// Where the breaker stands: `None` for an in-process backend.
    ///
    /// ```
    /// use tower_redis_ratelimit::{RedisState, Backend};
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

    /// Connects to Redis now and runs the health probe (a script that writes one small
    /// key with a time to live) and, on the server's clock ([`TimeSource::Server`]), a
    /// script that reads `TIME`: `Ok` when checks can go to Redis. Meant for start-up, to
    /// fail or warn early on a wrong address, password or certificate, or a server or
    /// user that refuses what the scripts need, and to have the connection made and the
    /// engine loaded before the first request. A backend that is not warmed up connects
    /// on its first check: the checks waiting for that first connection wait up to the
    /// connect timeout (four [call timeouts](BackendBuilder::call_timeout), at least
    /// 1 s), not one call timeout, and its failure policies answer if it fails. `Ok` for
    /// an in-process backend.
    ///
    /// A refusal is named with its remedy: `TIME` inside scripts (use
    /// [`TimeSource::Caller`]), Lua scripts at all (none in the crate: an in-process
    /// backend), keys with a time to live (unsupported).
    ///
    /// # Errors
    ///
    /// [`RedisUnavailable`] with what Redis (or the way to it) said; it never holds the
    /// URL or a password.
    ///
    /// ```no_run
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder().redis_url("redis://127.0.0.1:6379").build()?;
    /// if let Err(error) = backend.warm_up().await {
    ///     tracing::warn!(%error, "starting on the fallback");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn warm_up(&self) -> Result<(), RedisUnavailable> {
        match &self.inner.redis {
            None => Ok(()),
            Some(redis) => redis.verify().await.map_err(|error| RedisUnavailable {
                server: error.fault() != Fault::Transport,
                message: error.to_string(),
            }),
        }
    }

    /// The prefix of every Redis key.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The leases of the limiter whose keys are laid out as `layout`, on this backend.
    pub(crate) fn leases(&self, layout: &Layout, size: u64, lifetime: Duration) -> Leases {
        let id = layout.local_id(b"lease", 0);
        if self.inner.redis.is_some() {
            let mut leased = self.inner.leased.lock().unwrap_or_else(|e| e.into_inner());
            if !leased.iter().any(|&(_, known)| known == id) {
                leased.push((layout.clone(), id));
            }
        }
        Leases::new(id, size, lifetime)
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The bounded in-process state shared by every limiter on this backend.
    pub(crate) fn local_store(&self) -> Arc<LocalStore> {
        Arc::clone(&self.inner.local)
    }

    /// [`local_store`](Self::local_store), borrowed (no reference count touched).
    pub(crate) fn local(&self) -> &LocalStore {
        &self.inner.local
    }

    /// The deny cache: the keys Redis refused moments ago, refused here until then.
    pub(crate) fn deny(&self) -> &DenyCache {
        &self.inner.deny
    }

    /// Whether concurrent checks of one key share calls (see `decide/coalesce.rs`).
    pub(crate) fn coalesces(&self) -> bool {
        self.inner.coalesce
    }

    /// How many calls of a limiter may be in flight to a node before its checks go
    /// together (see `decide/batch.rs`); 0: never.
    pub(crate) fn batch_after(&self) -> usize {
        self.inner.batch_after
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
    /// rounded down (never below one, or to zero, as its [`ShareRounding`] says); the
    /// whole limit in-process.
    pub(crate) fn local_limit(&self, limit: u64) -> u64 {
        if self.inner.redis.is_none() || self.failover.share >= 1.0 {
            return limit;
        }
        let share = (limit as f64 * self.failover.share).floor() as u64;
        match self.failover.rounding {
            ShareRounding::AtLeastOne => share.max(1),
            ShareRounding::WithinLimit => share,
        }
    }

    /// The Redis key layout of one limiter's keys (see [Redis keys](self#redis-keys)).
    pub(crate) fn layout(&self, kind: &str, owner: Owner<'_>) -> Layout {
        Layout::new(&self.inner.prefix, kind, owner)
    }
}

impl Backend {
    /// Where the Redis scripts take the time from (see
    /// [`BackendBuilder::time_source`]).
    #[must_use]
    pub fn time_source(&self) -> TimeSource {
        self.inner.time
    }

    /// The time sent to the scripts with [`TimeSource::Caller`]: Unix microseconds.
    pub(crate) fn caller_now_us(&self) -> u64 {
        let now_us = self.clock().now_us();
        now_us.saturating_add_signed(self.inner.caller_offset_us)
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("prefix", &self.inner.prefix)
            .field("redis", &self.inner.redis)
            .field("failover", &self.failover)
            .field("time_source", &self.inner.time)
            .finish_non_exhaustive()
    }
}

/// Why [`Backend::warm_up`] found that checks cannot go to Redis.
#[derive(Debug, Clone, thiserror::Error)]
#[error("redis cannot answer checks: {message}")]
pub struct RedisUnavailable {
    server: bool,
    message: String,
}

impl RedisUnavailable {
    /// Whether Redis was reached and refused (a wrong password, missing rights,
    /// `READONLY`, `OOM`, ...), rather than not reached at all (refused, timed out, a TLS
    /// handshake that failed).
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        self.server
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
        assert_eq!(backend.redis_state(), Some(RedisState::Healthy));
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
        let remote = Remote::new(&b, "period", Owner::Own("sms"), None);
        assert_eq!(
            remote.redis_key(b"ip:1.2.3.4"),
            b"app:{v1:ip:1.2.3.4}:period:sms"
        );
        assert_eq!(b.redis_state(), None);
    }
}
