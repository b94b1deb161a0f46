//! Shared in-flight limits: at most N requests of one key running at once, across every
//! instance sharing a Redis.
//!
//! [`InFlightLimitLayer`] takes a *slot* of the request's key
//! before calling the inner service and holds it until the response **body** ends (or
//! fails, or is dropped): a streamed export or a server-sent-event stream holds its slot
//! while it streams, which tower's `ConcurrencyLimit` (released when the response
//! future completes) does not count. A request refused for want of a slot gets the
//! layer's rejection (`429 Too Many Requests` by default) with `Retry-After`.
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, InFlightConfig, LimitLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let backend = Backend::in_process(); // or a Redis backend, shared by every instance
//! let config = InFlightConfig::new(2).slot_ttl(Duration::from_secs(10));
//! let exports = LimitLayer::builder(&backend, config)
//!     .name("export")
//!     .key(HeaderKey::from_static("x-merchant-id"))
//!     .build()?;
//! let app: Router = Router::new().route("/export", get(|| async { "..." })).layer(exports);
//! # let _ = app; Ok(()) }
//! ```
//!
//! # On Redis: leases
//!
//! Each limited key is one sorted set, `<prefix>:{v1:<key>}:inflight:<name>`, whose
//! members are the slots held and whose scores are their lease expiries on the Redis
//! server's clock (`TIME`, or the caller's with
//! [`TimeSource::Caller`](crate::TimeSource::Caller)). Taking a slot is one
//! script call (expired leases dropped, the count, the new slot added: one round trip);
//! giving it back is one more, sent in the background when the body ends. While a
//! request runs, its lease is renewed: one task per limiter renews every slot this
//! instance holds every third of a lease, with **one call per key** whatever the
//! number of slots held on it. So a process that dies (`kill -9`, a lost host) holds
//! its slots at most one [slot TTL](InFlightConfig::slot_ttl) more: the next request of the
//! key after that finds them expired, and no sweeper is needed. The set itself expires
//! at most one lease after its longest lease (its expiry is set to two leases whenever
//! less than one is left, so that most calls only read it). A renewal costs Redis less
//! than taking a slot: it drops the expired leases and extends this instance's, and
//! counts nothing.
//!
//! Giving a slot back and renewing run as tasks on the tokio runtime the request ran
//! on; without one (a slot dropped outside any runtime), the slot's lease runs out on
//! its own.
//!
//! Choose a lease well above a renewal's round trip and your longest pause (a lease of
//! 10 s renews every 3.3 s), and short enough that a dead instance's slots come back
//! soon enough.
//!
//! # `Retry-After`
//!
//! A slot frees when a running request ends, which nobody can foresee: a refusal says
//! `Retry-After:` [`retry_after`](InFlightConfig::retry_after) (default one second),
//! rounded up to whole seconds. No `RateLimit` or `RateLimit-Policy` headers are added:
//! they describe rates, and a count of requests running is not one. The [`Decision`]
//! of an admitted request
//! (in its extensions) says how many slots were left (`remaining`) of `limit`.
//!
//! # While Redis is out
//!
//! The layer's [`FailurePolicy`](crate::FailurePolicy) decides, as for every limit:
//! the default fallback takes slots in this process, each instance its
//! [fallback share](crate::BackendBuilder::fallback_share) of the slots (at least one,
//! or none with [`ShareRounding::WithinLimit`](crate::ShareRounding): then 2
//! slots over 3 instances run at most 2 at once, not 3), so that N instances do not
//! admit N times the limit. The leases of slots taken on
//! Redis cannot be renewed meanwhile: after an outage longer than a lease, requests
//! still running from before it hold no slot on Redis any more, so for up to their
//! remaining duration the fleet may run more than the limit. A slot taken in the
//! fallback is given back in this process; one taken on Redis is given back on Redis
//! (or runs out there).
//!
//! # Metrics
//!
//! As for the other layers (feature `metrics`): every request is counted in
//! `ratelimit_requests_total` under the layer's name, by outcome (a refusal, a shadow
//! refusal, a missing key; a request that took the last slot also in
//! `ratelimit_near_limit_total`), fallback decisions in
//! `ratelimit_fallback_decisions_total`, and each call that takes a slot on Redis in
//! `ratelimit_redis_duration_seconds` (the table: [`metrics`](crate::guide::metrics)).
//!
//! # Shadow mode
//!
//! A [shadow](crate::LayerBuilder::shadow) layer takes and holds slots as an enforcing
//! one would (in a task of its own, never making the request wait) and records every
//! refusal in the [metrics](crate::guide::metrics), but serves every request.

mod future;
pub(crate) mod host;
mod layer;
mod service;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use self::future::ResponseFuture;
use self::host::{Acquire, Held, Slots};
pub use self::layer::InFlightLimitLayer;
pub use self::service::InFlightLimit;
use crate::backend::Backend;
use crate::decision::{Decision, Policy};
use crate::error::ConfigError;

/// The default [slot TTL](InFlightConfig::slot_ttl): ten seconds.
pub(crate) const DEFAULT_SLOT_TTL: Duration = Duration::from_secs(10);
/// The default [`retry_after`](InFlightConfig::retry_after) of a refusal: one second.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The settings of an in-flight limit.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::in_flight::InFlightConfig;
///
/// // 10 at once per key; a slot outlives a process that died for at most 30 s.
/// let config = InFlightConfig::new(10).slot_ttl(Duration::from_secs(30));
/// # let _ = config;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightConfig {
    slots: u64,
    slot_ttl: Duration,
    retry_after: Duration,
}

impl Default for InFlightConfig {
    fn default() -> Self {
        Self::new(0)
    }
}

impl InFlightConfig {
    /// At most `slots` requests of one key in flight at once (at least 1), with the
    /// default slot TTL and retry-after.
    #[must_use]
    pub fn new(slots: u64) -> Self {
        Self {
            slots,
            slot_ttl: DEFAULT_SLOT_TTL,
            retry_after: DEFAULT_RETRY_AFTER,
        }
    }

    /// How long a slot on Redis outlives the process holding it (default 10 s; whole
    /// milliseconds, at least 1 ms): a running request renews its slot's TTL every third
    /// of it, so a slot is given back at most one TTL after its process died.
    #[must_use]
    pub fn slot_ttl(mut self, ttl: Duration) -> Self {
        self.slot_ttl = ttl;
        self
    }

    /// The `Retry-After` of a refusal (default 1 s, rounded up to whole seconds in the
    /// header).
    #[must_use]
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.slots == 0 {
            return Err(ConfigError::Zero { setting: "slots" });
        }
        if self.slot_ttl.as_millis() == 0 {
            return Err(ConfigError::ZeroDuration {
                setting: "slot_ttl",
            });
        }
        if self.slot_ttl.as_secs() > 366 * 86_400 {
            return Err(ConfigError::TooLong {
                setting: "slot_ttl",
            });
        }
        if self.retry_after.is_zero() {
            return Err(ConfigError::ZeroDuration {
                setting: "retry_after",
            });
        }
        Ok(())
    }
}

/// An in-flight limit bound to a backend: takes slots of keys, and says how many are
/// held. Cheap to clone; every clone shares the limit. Limiters of one name on one
/// backend share their slots (on Redis, and in this process).
///
/// A layer's limiter is [`InFlightLimitLayer::limiter`]; build one of your own with
/// [`InFlightLimiter::new`] to hold slots around work that is not an HTTP request.
///
/// ```
/// use tower_redis_ratelimit::{in_flight::{InFlightConfig, InFlightLimiter}, Backend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let jobs = InFlightLimiter::new(&Backend::in_process(), "jobs", InFlightConfig::new(1))?;
/// let slot = jobs.acquire(b"tenant-7").await.expect("a free slot");
/// assert!(jobs.acquire(b"tenant-7").await.is_err());
/// assert_eq!(jobs.in_flight(b"tenant-7").await, 1);
/// drop(slot); // the job is done: the slot is given back
/// assert_eq!(jobs.in_flight(b"tenant-7").await, 0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct InFlightLimiter {
    slots: Arc<Slots>,
    policy: Arc<Policy>,
}

impl fmt::Debug for InFlightLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimiter")
            .field("policy", &self.policy)
            .field("slot_ttl", &self.slots.lease)
            .finish_non_exhaustive()
    }
}

impl InFlightLimiter {
    /// The in-flight limit `name` on `backend`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for an invalid name, zero slots, a lease under one
    /// millisecond (or above a year), or a zero `retry_after`.
    pub fn new(backend: &Backend, name: &str, config: InFlightConfig) -> Result<Self, ConfigError> {
        crate::error::validate_name("name", name)?;
        config.validate()?;
        backend.failover().validate()?;
        Ok(Self {
            slots: Arc::new(Slots::new(
                backend,
                name,
                config.slots,
                config.slot_ttl,
                config.retry_after,
            )),
            policy: Arc::new(
                Policy::new(name, config.slots, config.slot_ttl).with_algorithm("in_flight"),
            ),
        })
    }

    /// What this limit enforces: its name, the slots per key (`quota`) and the lease
    /// (`window`).
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Takes a slot of `key`, held until the [`Slot`] is dropped; `Err` with the
    /// refusal when every slot is taken. One round trip on Redis.
    pub fn acquire(&self, key: &[u8]) -> impl Future<Output = Result<Slot, Decision>> + Send {
        let slots = Arc::clone(&self.slots);
        let acquire = self.slots.acquire(key);
        async move { Slot::from_acquired(slots, acquire.await) }
    }

    /// How many slots of `key` are held now, across every instance on Redis (expired
    /// leases not counted), in this process otherwise. Changes nothing.
    pub fn in_flight(&self, key: &[u8]) -> impl Future<Output = u64> + Send {
        self.slots.in_flight(key)
    }

    pub(crate) fn acquire_raw(&self, key: &[u8]) -> Acquire {
        self.slots.acquire(key)
    }

    pub(crate) fn slots(&self) -> &Arc<Slots> {
        &self.slots
    }
}

/// What a response holds until its body ends: a slot, or the sender whose drop tells a
/// shadow slot's task to give it back. Held only to be dropped.
#[allow(dead_code)]
pub(crate) enum Guard {
    Slot(Slot),
    Shadow(tokio::sync::oneshot::Sender<()>),
}

/// A slot held: given back when dropped. Its [`decision`](Self::decision) says how
/// many slots were left when it was taken.
#[must_use = "the slot is given back as soon as it is dropped"]
pub struct Slot {
    held: Option<(Arc<Slots>, Held)>,
    decision: Decision,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("decision", &self.decision)
            .finish_non_exhaustive()
    }
}

impl Slot {
    // A refusal is the decision itself (as `acquire` answers), moved once.
    #[allow(clippy::result_large_err)]
    fn from_acquired(
        slots: Arc<Slots>,
        (decision, held): host::Acquired,
    ) -> Result<Self, Decision> {
        if !decision.is_admitted() {
            return Err(decision);
        }
        Ok(Self {
            held: held.map(|held| (slots, held)),
            decision,
        })
    }

    /// The decision that admitted this slot.
    #[must_use]
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((slots, held)) = self.held.take() {
            slots.release(held);
        }
    }
}

#[cfg(test)]
mod tests;
