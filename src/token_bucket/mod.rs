//! The token-bucket algorithm (GCRA): its config and its limiter; the semantics are on [`TokenBucketConfig`].

pub(crate) mod memory;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use self::memory::{Bucket, Buckets, Outcome, Reservation};
use crate::backend::decide::protocol::{BucketReply, Limit};
use crate::backend::{self, Args, Backend, Hosts, Leases, Operation, Owner, Remote};
use crate::decision::{Decision, Policy, Priority, Source, State};
use crate::error::ConfigError;
use crate::limiter::DecisionFuture;

/// Arrival times in Redis count microseconds from this Unix time (2026-01-01T00:00:00Z),
/// so that the script's doubles keep sub-microsecond precision for decades.
const TAT_EPOCH_SECS: i64 = 1_767_225_600;

/// Token buckets: `rate` tokens per `period` refill a bucket of `burst` tokens per key;
/// a request takes its cost in tokens or is refused until enough have dripped back.
///
/// A bucket starts full, so a quiet client may send `burst` requests at once; after that
/// it gets the refill rate. Refill is continuous (not in whole-second steps) and costs
/// are weighted: a cost above `burst` can never pass and is refused as
/// [`State::ExceedsCapacity`] without a `Retry-After`.
///
/// In Redis a bucket is one key holding its theoretical arrival time (the GCRA form of a
/// token bucket), updated by a Lua script that reads the Redis server's clock (or the
/// caller's, see [Clocks](#clocks)) with microsecond precision; the key expires once the bucket would be full again (never
/// with a zero expiry, whatever the rate and burst). In-process, each bucket is its
/// arrival time (and the skew of a clock step: 24 bytes of state, about 80 to 110 bytes
/// in all) in the backend's bounded state
/// ([`max_local_keys`](crate::BackendBuilder::max_local_keys)), run by the same
/// algorithm in whole nanoseconds of the monotonic clock (the emission interval rounded
/// to whole nanoseconds).
///
/// # Clocks
///
/// The arrival time only ever moves forward, so no clock step refills a bucket beyond
/// what the elapsed time allows. Each key holds the newest time it has seen: its time is
/// the Redis server's, but never below its floor, the earliest time its state proves it
/// has seen (the arrival time minus a full refill: an empty bucket; or the time of a
/// reservation that took the arrival time further). When the server's clock steps back
/// below the floor, the key's time stops there and runs on at the server's rate (the
/// skew is stored with the arrival time, in the same value: no extra command), and the
/// arrival time stays in the key's time: so the step admits nothing more than the floor
/// allows, and a refusal never waits more than one full refill (`burst / rate`), at any
/// moment (a step back of an hour does not refuse a key for an hour). Once the server's
/// time is at the floor again (the clock came back, or caught up), the skew is dropped.
/// Costs: the key outlives its expiry by the step while the clock is behind (the expiry
/// stays in the key's time). The floor is a lower bound of the time the key has seen, up
/// to one refill behind it (a bucket not empty at its last write), so **a step back of
/// the server's clock and its return may give back up to one burst** (`tests/bound.rs`
/// reproduces it with `BOUND_CLOCK=1 BOUND_STRICT=1`), a known gap. Storing the key's
/// time at every write would narrow it (at a cost in Redis CPU on every check), not
/// close it: a bucket that was full had no key at all (it expires when full), so a step
/// back then spends up to a burst in the behind time, and the clock's return reads it as
/// refilled by the step (at most a burst). Only a time that every key of the server
/// shares would close it: one more read per check, in another hash slot on a cluster. A step back of less than what the bucket has refilled is followed the same way.
/// A step forward at most refills the bucket early; so does a return that lands before
/// the newest time a key has seen (it is a step forward from the time behind).
/// In-process, time is the monotonic clock, which never steps back (the same rule runs
/// there).
///
/// With the callers' clocks ([`TimeSource::Caller`](crate::TimeSource)), say
/// within `s` of each other, the stored arrival time still never moves back (a caller
/// behind it reads it as at most an empty bucket, and writes nothing then), so:
///
/// - over any span `L`, at most `burst + rate × (L + s)` tokens are taken: a caller
///   ahead by `s` may take up to `rate × s` tokens early, never more;
/// - a caller behind by `s` sees up to `rate × s` fewer tokens: it may be refused for up
///   to `s` longer, and its `retry_after` is up to `s` longer.
///
/// For this, a bucket's key is kept `max(full refill time, 1 s)` longer than its writer
/// needs (so that its expiry never hands a caller behind a full bucket early): the bound
/// holds for `s` up to that margin; beyond it, each expiry of an idle bucket's key can
/// give a caller behind up to `s` minus the margin of refill.
///
/// `RateLimit-Policy` advertises `q` = burst and `w` = the time to refill a full bucket
/// (burst ÷ rate, rounded up to whole seconds): a bucket of 100 per second with a burst
/// of 200 says `"service";q=200;w=2`, that is "200 at once, then back to 200 within 2
/// s", which is the same limit as 100 per second held on average. The draft's
/// `q`/`w` pair names a quota per window; a token bucket's window is its refill time.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{key::PeerIp, Backend, LimitLayer, TokenBucketConfig};
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// // 100 requests per second on average, bursts of up to 20.
/// let limits = TokenBucketConfig::new(100, Duration::from_secs(1), 20);
/// let layer = LimitLayer::builder(&Backend::in_process(), limits)
///     .name("api")
///     .key(PeerIp::new())
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// A `TokenBucketConfig` is what [`LimitLayer::builder`](crate::LimitLayer::builder)
/// takes, a member of a [`LimitSet`](crate::LimitSet) or a plan, and (with the `serde`
/// feature) the `"token_bucket"` limit of a rule file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(
        from = "crate::config::TokenBucketFile",
        into = "crate::config::TokenBucketFile"
    )
)]
pub struct TokenBucketConfig {
    pub(crate) rate: u64,
    pub(crate) period: Duration,
    pub(crate) burst: u64,
    pub(crate) lockout: Option<Duration>,
    /// Lease size and lifetime, when leases are on.
    pub(crate) lease: Option<(u64, Duration)>,
}

impl Default for TokenBucketConfig {
    fn default() -> Self {
        Self {
            rate: 0,
            period: Duration::from_secs(1),
            burst: 0,
            lockout: None,
            lease: None,
        }
    }
}

impl TokenBucketConfig {
    /// `rate` tokens per `period` (e.g. 100 per second, 1 per minute, 5000 per hour)
    /// into a bucket of `burst` tokens.
    #[must_use]
    pub fn new(rate: u64, period: Duration, burst: u64) -> Self {
        Self {
            rate,
            period,
            burst,
            lockout: None,
            lease: None,
        }
    }

    /// Leases (opt-in, approximate): on Redis, a check that goes to Redis takes up to
    /// `size` tokens at once (never more than half of what the bucket holds beyond its
    /// cost, so leases shrink near the limit and are exact there), and this process
    /// answers the key's next checks from them without a round trip until they are used
    /// up or `lifetime` has passed; unused tokens then go back to the bucket. Every
    /// leased token left the shared bucket before it is used, so nothing is admitted
    /// beyond the limit overall, but a token may be used up to `lifetime` after it was
    /// taken: over any window, N instances admit at most the limit plus N × `size`.
    /// Off by default: exactness is the default promise. `size` from 1 to the burst,
    /// `lifetime` at least one millisecond. Not with a [`lockout`](Self::lockout) (a
    /// check answered from a lease never reaches Redis to lock a key out): the limiter
    /// is then refused with [`ConfigError::Conflict`].
    ///
    /// The handles ([`Limiter`](crate::Limiter)) and this process's lease of a key:
    /// [`peek`](crate::Limiter::peek) answers from the lease when it covers the cost,
    /// as the check would (spending nothing), and from Redis otherwise;
    /// [`block`](crate::Limiter::block) ends the lease, giving its unused tokens back to
    /// the bucket first, so the key is refused at once;
    /// [`reset`](crate::Limiter::reset) ends it and forgets its tokens (the bucket starts
    /// full, and no more than a burst is admitted after it);
    /// [`refund`](crate::Limiter::refund) gives the tokens to the shared bucket and
    /// leaves the lease as it is. Another instance's lease is its own: after a block or
    /// a reset there it may still answer the tokens it holds (at most `size`, within
    /// `lifetime`, as in the bound above) before it asks Redis again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::TokenBucketConfig;
    ///
    /// // 10 000 per second per key; each instance takes up to 50 at a time, for 100 ms.
    /// let config = TokenBucketConfig::new(10_000, Duration::from_secs(1), 10_000)
    ///     .lease(50, Duration::from_millis(100));
    /// # let _ = config;
    /// ```
    #[must_use]
    pub fn lease(mut self, size: u64, lifetime: Duration) -> Self {
        self.lease = Some((size, lifetime));
        self
    }

    /// Locks a key out for `duration` once this limit refuses it (fail2ban-style): every
    /// check of the key is refused until then, spending nothing, with the lock's end as
    /// its `Retry-After`. Kept in Redis next to the limit's key, so every instance
    /// honours it; a lock already running is not extended by further refusals. At least
    /// one millisecond; not with a [`lease`](Self::lease) ([`ConfigError::Conflict`]).
    #[must_use]
    pub fn lockout(mut self, duration: Duration) -> Self {
        self.lockout = Some(duration);
        self
    }

    /// The burst, for [`dynamic`](crate::DynamicLimits) limits.
    pub(crate) fn burst_value(&self) -> u64 {
        self.burst
    }

    /// The same settings with burst `burst` and the rate scaled by the same factor (at
    /// least one token per period), for [`dynamic`](crate::DynamicLimits) limits.
    pub(crate) fn with_burst_scaled(&self, burst: u64) -> Self {
        let scaled = u128::from(self.rate) * u128::from(burst) / u128::from(self.burst.max(1));
        Self {
            rate: u64::try_from(scaled).unwrap_or(u64::MAX).max(1),
            period: self.period,
            burst,
            lockout: self.lockout,
            lease: self.lease,
        }
    }
}

/// A token-bucket [`Limiter`](crate::Limiter) on a [`Backend`].
#[derive(Debug, Clone)]
pub struct TokenBucketLimiter {
    store: Arc<TokenBucketHosts>,
}

#[derive(Debug)]
struct TokenBucketHosts {
    remote: Remote,
    policy: Policy,
    burst: u64,
    /// Microseconds per token, for the script.
    interval_us: f64,
    /// The in-process bucket: the fallback share of `burst` and of the rate on Redis.
    local: Bucket,
    buckets: Buckets,
    leases: Option<Leases>,
}

impl TokenBucketLimiter {
    /// Checks `config` and builds the limiter named `name` on `backend`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a zero rate, burst or period, a burst above `u32::MAX`, a
    /// rate above one token per microsecond (the precision of the Redis script's clock
    /// arithmetic), a full-bucket refill time above ten years, or an invalid name.
    pub fn new(
        backend: &Backend,
        name: &str,
        config: TokenBucketConfig,
    ) -> Result<Self, ConfigError> {
        Self::with_owner(backend, Owner::Own(name), config)
    }

    /// [`new`](Self::new) for `owner`'s keys (a limiter's own, or a set's limit).
    pub(crate) fn with_owner(
        backend: &Backend,
        owner: Owner<'_>,
        config: TokenBucketConfig,
    ) -> Result<Self, ConfigError> {
        owner.validate()?;
        let name = &*owner.policy_name();
        if config.rate == 0 {
            return Err(ConfigError::Zero { setting: "rate" });
        }
        if config.burst == 0 {
            return Err(ConfigError::Zero { setting: "burst" });
        }
        if config.period.is_zero() {
            return Err(ConfigError::ZeroDuration { setting: "period" });
        }
        let burst = u32::try_from(config.burst).map_err(|_| ConfigError::TooLarge {
            setting: "burst",
            max: u64::from(u32::MAX),
        })?;
        let burst = NonZeroU32::new(burst).expect("checked above");
        let period_ns = config.period.as_nanos();
        let interval_ns = u64::try_from(period_ns / u128::from(config.rate)).unwrap_or(u64::MAX);
        if interval_ns < 1_000 {
            return Err(ConfigError::Conflict {
                reason: "the rate is above one token per microsecond (1 000 000 per second)",
            });
        }
        let refill_ns = u128::from(interval_ns) * u128::from(config.burst);
        if refill_ns > 10 * 366 * 86_400 * 1_000_000_000 {
            return Err(ConfigError::TooLong { setting: "period" });
        }
        let refill = Duration::from_nanos(u64::try_from(refill_ns).unwrap_or(u64::MAX));
        let lockout = crate::error::validate_lockout(config.lockout)?;
        if config.lease.is_some() && lockout.is_some() {
            // A check answered from a lease never reaches Redis, and the call that takes
            // a lease cannot lock a key out: the lockout would silently do nothing.
            return Err(ConfigError::Conflict {
                reason: "a token bucket's lease and lockout: checks answered from a lease \
                         never lock a key out; choose one",
            });
        }
        let remote = Remote::new(backend, "token", owner, lockout);
        let leases = match config.lease {
            None => None,
            Some((0, _)) => return Err(ConfigError::Zero { setting: "lease" }),
            Some((size, _)) if size > config.burst => {
                return Err(ConfigError::TooLarge {
                    setting: "lease",
                    max: config.burst,
                })
            }
            Some((_, lifetime)) if lifetime.as_millis() == 0 => {
                return Err(ConfigError::ZeroDuration {
                    setting: "lease lifetime",
                })
            }
            // Leases are taken from Redis: without it there is nothing to lease.
            Some(_) if !backend.is_redis() => None,
            Some((size, lifetime)) => Some(backend.leases(remote.layout(), size, lifetime)),
        };
        // The in-process state applies the fallback share of both rate and burst.
        let local_burst = backend
            .local_limit(config.burst)
            .min(u64::from(burst.get()));
        let share = local_burst as f64 / config.burst as f64;
        let local_interval_ns = (interval_ns as f64 / share).ceil() as u64;
        Ok(Self {
            store: Arc::new(TokenBucketHosts {
                buckets: Buckets::new(backend.local_store(), remote.local_id(b"state", 0)),
                remote,
                policy: Policy::new(name, config.burst, refill).with_algorithm("token_bucket"),
                burst: config.burst,
                local: Bucket {
                    interval_ns: local_interval_ns.max(1),
                    burst: local_burst,
                },
                // Exact, not rounded to nanoseconds: 3 per second is 333333.33 µs.
                interval_us: config.period.as_secs_f64() * 1e6 / config.rate as f64,
                leases,
            }),
        })
    }
}

impl TokenBucketLimiter {
    /// The limiter's two hosts, for a [set](crate::LimitSet) of limits.
    pub(crate) fn hosts(&self) -> Arc<dyn Hosts> {
        self.store.clone()
    }
}

crate::hosted::hosted_limiter!(TokenBucketLimiter, store, {
    fn reserve(&self, key: &[u8], cost: NonZeroU32, max_wait: Duration) -> Option<DecisionFuture> {
        let max_wait_us = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        Some(backend::operate(
            &self.store,
            Operation::Reserve { max_wait_us },
            key,
            u64::from(cost.get()),
        ))
    }
});

impl Hosts for TokenBucketHosts {
    fn leases(&self) -> Option<&Leases> {
        self.leases.as_ref()
    }

    fn remote(&self) -> &Remote {
        &self.remote
    }

    fn capacity(&self) -> u64 {
        self.burst
    }

    fn exceeds_capacity(&self, source: Source) -> Decision {
        Decision::new(
            State::ExceedsCapacity,
            self.burst,
            0,
            Duration::ZERO,
            source,
        )
    }

    fn limit_args(&self, args: &mut Args) {
        let limit = Limit::TokenBucket {
            interval_us: self.interval_us,
            burst: self.burst,
            epoch_secs: TAT_EPOCH_SECS,
        };
        limit.write(args);
    }

    fn reply_len(&self) -> usize {
        BucketReply::SLOTS.len()
    }

    fn decide(&self, reply: &[i64], _cost: NonZeroU32) -> Option<Decision> {
        let BucketReply {
            admitted,
            left,
            wait_us,
            full_us,
        } = BucketReply::read(reply)?;
        let us = Duration::from_micros;
        Some(if admitted {
            let state = if left == 0 {
                State::HitQuota
            } else {
                State::Allowed
            };
            let decision = Decision::new(state, self.burst, left, us(full_us), Source::Redis);
            // A reservation: the wait before using the tokens.
            if wait_us > 0 {
                decision.with_retry_after(us(wait_us))
            } else {
                decision
            }
        } else {
            Decision::new(
                State::OverQuota,
                self.burst,
                left,
                us(full_us),
                Source::Redis,
            )
            .with_retry_after(us(wait_us))
        })
    }

    fn local_priority(
        &self,
        key: &[u8],
        cost: u32,
        priority: Priority,
        source: Source,
        spend: bool,
    ) -> Decision {
        let now_ns = self.remote.backend().clock().elapsed_ns();
        let burst = self.local.burst;
        let keep = priority.keep(burst);
        // Rounded up to the microsecond, as the script's durations are.
        let ns = |ns: u64| Duration::from_micros(ns.div_ceil(1_000));
        match self
            .buckets
            .hit(key, self.local, u64::from(cost), keep, now_ns, spend)
        {
            Outcome::Admitted { left, full_in_ns } => {
                let state = if left == 0 {
                    State::HitQuota
                } else {
                    State::Allowed
                };
                Decision::new(state, burst, left, ns(full_in_ns), source).keeping(keep)
            }
            Outcome::Refused {
                left,
                wait_ns,
                full_in_ns,
            } => Decision::new(State::OverQuota, burst, left, ns(full_in_ns), source)
                .with_retry_after(ns(wait_ns))
                .keeping(keep),
            // Above the burst, or above the fallback share of it.
            Outcome::ExceedsCapacity => {
                Decision::new(State::ExceedsCapacity, burst, 0, Duration::ZERO, source)
            }
        }
    }

    fn local_refund(&self, key: &[u8], cost: u32) {
        let now_ns = self.remote.backend().clock().elapsed_ns();
        self.buckets
            .refund(key, self.local, u64::from(cost), now_ns);
    }

    fn local_charge(&self, key: &[u8], cost: u64) {
        let now_ns = self.remote.backend().clock().elapsed_ns();
        self.buckets.charge(key, self.local, cost, now_ns);
    }

    fn local_reset(&self, key: &[u8]) {
        self.buckets.reset(key);
    }

    fn local_reserve(
        &self,
        key: &[u8],
        cost: u32,
        max_wait_us: u64,
        source: Source,
    ) -> Option<Decision> {
        let now_ns = self.remote.backend().clock().elapsed_ns();
        let max_wait_ns = max_wait_us.saturating_mul(1_000);
        let us = |ns: u64| Duration::from_micros(ns.div_ceil(1_000));
        let burst = self.local.burst;
        Some(
            match self
                .buckets
                .reserve(key, self.local, u64::from(cost), now_ns, max_wait_ns)
            {
                Reservation::Admitted {
                    left,
                    wait_ns,
                    full_in_ns,
                } => {
                    let state = if left == 0 {
                        State::HitQuota
                    } else {
                        State::Allowed
                    };
                    let decision = Decision::new(state, burst, left, us(full_in_ns), source);
                    if wait_ns > 0 {
                        decision.with_retry_after(us(wait_ns))
                    } else {
                        decision
                    }
                }
                Reservation::Refused {
                    left,
                    wait_ns,
                    full_in_ns,
                } => Decision::new(State::OverQuota, burst, left, us(full_in_ns), source)
                    .with_retry_after(us(wait_ns)),
            },
        )
    }
}

#[cfg(test)]
mod tests;
