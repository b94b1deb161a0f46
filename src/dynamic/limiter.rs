//! The [`Limiter`] of a [`DynamicLimits`] layer: the cache, the lookups and the limiters
//! built per distinct limit.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use quick_cache::sync::Cache;

use super::cache::{Slot, DEFAULT, PENDING, REFUSE};
use super::{DynamicLimits, LimitSource, OnSourceError, TaggedKey, WithLimit, MAX_LIMITS};
use crate::backend::Backend;
use crate::blocked::Listing;
use crate::decision::{Decision, Policy, Source, State};
use crate::error::ConfigError;
use crate::limit::Algorithm;
use crate::limiter::{DecisionFuture, Limiter};
use crate::response::policy_header;

/// A limiter built for one limit, with its `RateLimit-Policy` value.
struct Limited<L> {
    limiter: L,
    header: HeaderValue,
}

/// The [`Limiter`] of a [`DynamicLimits`] layer.
///
/// Its [`policy`](Limiter::policy) is the default one; each check applies the key's
/// limit from the source (see [`DynamicLimits`](super::DynamicLimits)).
pub struct DynamicLimiter<A: Algorithm, S> {
    shared: Arc<Shared<A, S>>,
}

impl<A: Algorithm, S> Clone for DynamicLimiter<A, S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<A: Algorithm, S> fmt::Debug for DynamicLimiter<A, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamicLimiter")
            .field("policy", self.shared.default.limiter.policy())
            .field("cached_keys", &self.shared.slots.len())
            .field("ttl", &Duration::from_micros(self.shared.ttl_us))
            .field("on_error", &self.shared.on_error)
            .finish_non_exhaustive()
    }
}

struct Shared<A: Algorithm, S> {
    config: A,
    backend: Backend,
    name: String,
    source: S,
    default: Limited<A::Limiter>,
    default_limit: u64,
    slots: Cache<Vec<u8>, Arc<Slot>>,
    limiters: Cache<u64, Arc<Limited<A::Limiter>>>,
    ttl_us: u64,
    error_ttl: Duration,
    timeout: Duration,
    on_error: OnSourceError,
}

impl<A, S> Algorithm for DynamicLimits<A, S>
where
    A: WithLimit,
    S: LimitSource,
{
    type Limiter = DynamicLimiter<A, S>;

    fn build(self, backend: &Backend, name: &str) -> Result<Self::Limiter, ConfigError> {
        if self.ttl.is_zero() {
            return Err(ConfigError::ZeroDuration { setting: "ttl" });
        }
        let error_ttl = self
            .error_ttl
            .unwrap_or(Duration::from_secs(1).min(self.ttl));
        if error_ttl.is_zero() {
            return Err(ConfigError::ZeroDuration {
                setting: "error_ttl",
            });
        }
        if error_ttl > self.ttl {
            return Err(ConfigError::Conflict {
                reason: "error_ttl is longer than ttl",
            });
        }
        if self.max_keys == 0 {
            return Err(ConfigError::Zero {
                setting: "max_keys",
            });
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::ZeroDuration {
                setting: "lookup_timeout",
            });
        }
        let default_limit = self.config.limit();
        let limiter = self.config.clone().build(backend, name)?;
        let default = Limited {
            header: policy_header(limiter.policy()),
            limiter,
        };
        let shared = Shared {
            config: self.config,
            backend: backend.clone(),
            name: name.to_owned(),
            source: self.source,
            default,
            default_limit,
            slots: Cache::new(self.max_keys),
            limiters: Cache::new(MAX_LIMITS),
            ttl_us: u64::try_from(self.ttl.as_micros()).unwrap_or(u64::MAX),
            error_ttl,
            timeout: self.timeout,
            on_error: self.on_error,
        };
        if let OnSourceError::Limit(limit) = self.on_error {
            if limit == 0 {
                return Err(ConfigError::Zero {
                    setting: "on_error limit",
                });
            }
            shared.valid(limit)?;
        }
        Ok(DynamicLimiter {
            shared: Arc::new(shared),
        })
    }
}

impl<A: WithLimit, S: LimitSource> Shared<A, S> {
    /// The outcome for a source limit, building its limiter if needed.
    fn valid(&self, limit: u64) -> Result<u64, ConfigError> {
        if limit == self.default_limit {
            return Ok(DEFAULT);
        }
        if limit == 0 {
            return Err(ConfigError::Zero { setting: "limit" });
        }
        if limit >= DEFAULT {
            return Err(ConfigError::TooLarge {
                setting: "limit",
                max: DEFAULT - 1,
            });
        }
        if self.limiters.get(&limit).is_none() {
            self.limiters.insert(limit, Arc::new(self.build(limit)?));
        }
        Ok(limit)
    }

    fn build(&self, limit: u64) -> Result<Limited<A::Limiter>, ConfigError> {
        let limiter = self
            .config
            .with_limit(limit)
            .build(&self.backend, &self.name)?;
        Ok(Limited {
            header: policy_header(limiter.policy()),
            limiter,
        })
    }

    fn now_us(&self) -> u64 {
        self.backend.clock().now_us()
    }

    /// Checks under a resolved outcome.
    fn apply(&self, outcome: u64, key: &[u8], cost: NonZeroU32, priority: f64) -> DecisionFuture {
        match outcome {
            PENDING | DEFAULT => self.default.limiter.check_priority(0, key, cost, priority),
            REFUSE => DecisionFuture::ready(
                Decision::new(
                    State::OverQuota,
                    self.default_limit,
                    0,
                    self.error_ttl,
                    Source::FailClosed,
                )
                .with_retry_after(self.error_ttl),
            ),
            limit => {
                let limited = match self.limiters.get(&limit) {
                    Some(limited) => limited,
                    // Evicted among more than `MAX_LIMITS` distinct limits: built again.
                    None => match self.build(limit) {
                        Ok(limited) => {
                            let limited = Arc::new(limited);
                            self.limiters.insert(limit, limited.clone());
                            limited
                        }
                        Err(_) => {
                            return self.default.limiter.check_priority(0, key, cost, priority)
                        }
                    },
                };
                limited
                    .limiter
                    .check_priority(0, key, cost, priority)
                    .with_policy_header(limited.header.clone())
            }
        }
    }

    /// Runs `op` on the limiter of `key`'s known limit (the default one while the
    /// key's limit is unknown, pending or refused), marking a non-default limit's
    /// answer with its policy. Every limiter of the layer shares the layer's name, so
    /// they all see the key's one state; they differ only in the limit they apply.
    fn with_limiter(
        &self,
        key: &[u8],
        op: impl FnOnce(&A::Limiter) -> Option<DecisionFuture>,
    ) -> Option<DecisionFuture> {
        let outcome = self.slots.get(key).map_or(DEFAULT, |slot| slot.outcome());
        match outcome {
            PENDING | DEFAULT | REFUSE => op(&self.default.limiter),
            limit => match self.limiters.get(&limit) {
                Some(limited) => op(&limited.limiter)
                    .map(|check| check.with_policy_header(limited.header.clone())),
                None => op(&self.default.limiter),
            },
        }
    }

    /// The outcome of a failed lookup, given the key's previous one.
    fn on_failure(&self, previous: u64) -> u64 {
        match self.on_error {
            OnSourceError::LastKnown if previous == PENDING || previous == REFUSE => DEFAULT,
            OnSourceError::LastKnown => previous,
            OnSourceError::Limit(limit) => self.valid(limit).unwrap_or(DEFAULT),
            OnSourceError::Refuse => REFUSE,
        }
    }
}

/// Ends a lookup by the failure policy if it is dropped before it finished (a panic in
/// the source, a runtime shutting down).
struct Finish<A: WithLimit, S: LimitSource> {
    shared: Arc<Shared<A, S>>,
    slot: Arc<Slot>,
    done: bool,
}

impl<A: WithLimit, S: LimitSource> Finish<A, S> {
    fn fail(&mut self) {
        let shared = &self.shared;
        let outcome = shared.on_failure(self.slot.outcome());
        let until = shared
            .now_us()
            .saturating_add(u64::try_from(shared.error_ttl.as_micros()).unwrap_or(u64::MAX));
        self.slot.finish(outcome, until);
        self.done = true;
    }
}

impl<A: WithLimit, S: LimitSource> Drop for Finish<A, S> {
    fn drop(&mut self) {
        if !self.done {
            tracing::warn!(
                policy = self.shared.name,
                "limit lookup ended without an answer; the failure policy applies"
            );
            self.fail();
        }
    }
}

async fn lookup<A: WithLimit, S: LimitSource>(mut finish: Finish<A, S>, key: Vec<u8>) {
    let shared = finish.shared.clone();
    let answer =
        tokio::time::timeout(shared.timeout, shared.source.limit(TaggedKey::parse(&key))).await;
    let outcome = match answer {
        Ok(Ok(None)) => Ok(DEFAULT),
        Ok(Ok(Some(limit))) => shared.valid(limit).map_err(|error| {
            tracing::warn!(policy = shared.name, %error, "the limit source gave an invalid limit");
        }),
        Ok(Err(error)) => {
            tracing::warn!(policy = shared.name, "limit lookup failed");
            tracing::debug!(policy = shared.name, %error, "limit lookup error");
            Err(())
        }
        Err(_) => {
            tracing::warn!(policy = shared.name, timeout = ?shared.timeout, "limit lookup timed out");
            Err(())
        }
    };
    match outcome {
        Ok(outcome) => {
            let until = shared.now_us().saturating_add(shared.ttl_us);
            finish.slot.finish(outcome, until);
            finish.done = true;
        }
        Err(()) => finish.fail(),
    }
}

impl<A: WithLimit, S: LimitSource> DynamicLimiter<A, S> {
    /// Starts the lookup of `key` unless one is in flight.
    fn refresh(&self, slot: &Arc<Slot>, key: &[u8]) {
        if !slot.start_lookup() {
            return;
        }
        let finish = Finish {
            shared: self.shared.clone(),
            slot: slot.clone(),
            done: false,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(lookup(finish, key.to_vec()));
            }
            // No runtime to look up on: the failure policy (`finish` dropped).
            Err(_) => drop(finish),
        }
    }

    /// How many keys the cache holds now (for tests of its bound).
    #[doc(hidden)]
    #[must_use]
    pub fn cached_keys(&self) -> usize {
        self.shared.slots.len()
    }
}

impl<A: WithLimit, S: LimitSource> Limiter for DynamicLimiter<A, S> {
    /// The default limit's policy.
    fn policy(&self) -> &Policy {
        self.shared.default.limiter.policy()
    }

    fn check(&self, key: &[u8], cost: NonZeroU32) -> DecisionFuture {
        self.check_priority(0, key, cost, 1.0)
    }

    fn decides_priority(&self) -> bool {
        self.shared.default.limiter.decides_priority()
    }

    fn check_priority(
        &self,
        _index: usize,
        key: &[u8],
        cost: NonZeroU32,
        priority: f64,
    ) -> DecisionFuture {
        let shared = &self.shared;
        let slot = match shared.slots.get(key) {
            Some(slot) => slot,
            None => shared
                .slots
                .get_or_insert_with(key, || {
                    Ok::<_, std::convert::Infallible>(Arc::new(Slot::new()))
                })
                .unwrap_or_else(|never| match never {}),
        };
        let outcome = slot.outcome();
        if outcome == PENDING || slot.is_stale(shared.now_us()) {
            self.refresh(&slot, key);
        }
        // Read again: a lookup without a runtime ends at once.
        let outcome = if outcome == PENDING {
            slot.outcome()
        } else {
            outcome
        };
        if outcome != PENDING {
            return shared.apply(outcome, key, cost, priority);
        }
        let shared = self.shared.clone();
        let key = key.to_vec();
        let wait = shared.timeout + Duration::from_millis(50);
        DecisionFuture::pending(async move {
            let outcome = match tokio::time::timeout(wait, slot.resolved()).await {
                Ok(outcome) => outcome,
                Err(_) => shared.on_failure(PENDING),
            };
            shared.apply(outcome, &key, cost, priority).await
        })
    }

    /// What a check would answer now under `key`'s known limit (the default limit's
    /// while it is not known yet; this does not look it up).
    fn peek(&self, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        self.shared.with_limiter(key, |l| l.peek(key, cost))
    }

    /// Gives units back under `key`'s known limit.
    fn refund(&self, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        self.shared.with_limiter(key, |l| l.refund(key, cost))
    }

    /// Settles under `key`'s known limit.
    fn settle(&self, key: &[u8], delta: i64) -> Option<DecisionFuture> {
        self.shared.with_limiter(key, |l| l.settle(key, delta))
    }

    /// Forgets `key` (its state is one whatever its limit).
    fn reset(&self, key: &[u8]) -> Option<DecisionFuture> {
        self.shared.with_limiter(key, |l| l.reset(key))
    }

    /// Blocks `key` (its state is one whatever its limit).
    fn block(&self, key: &[u8], duration: Duration) -> Option<DecisionFuture> {
        self.shared.with_limiter(key, |l| l.block(key, duration))
    }

    /// Unblocks `key` (its block is one whatever its limit).
    fn unblock(&self, key: &[u8]) -> Option<DecisionFuture> {
        self.shared.with_limiter(key, |l| l.unblock(key))
    }

    /// The keys blocked now (a key's block is one whatever its limit).
    fn blocked(&self, max: usize) -> Option<Listing> {
        self.shared.default.limiter.blocked(max)
    }

    /// Reserves under `key`'s known limit.
    fn reserve(&self, key: &[u8], cost: NonZeroU32, max_wait: Duration) -> Option<DecisionFuture> {
        self.shared
            .with_limiter(key, |l| l.reserve(key, cost, max_wait))
    }
}
