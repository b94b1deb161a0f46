//! Leases (opt-in, approximate): a limiter takes a small lease of quota from Redis and
//! answers checks of that key in process until the lease is used up or expires.
//!
//! A lease is taken by the same one round trip a check would make (engine op `l`): at
//! least the check's cost, at most the lease size, and never more than half of what the
//! bucket holds beyond the cost, so leases shrink as the key nears its limit and are
//! exact there. Every leased unit left the shared bucket before it is used, so the limit
//! is never exceeded overall; a leased unit is only used later, up to the lease's
//! lifetime. Over any window, N instances with leases of size L admit at most the
//! limit plus N × L. A lease that expires unused is refunded to the bucket. Leases live
//! in the backend's bounded local store.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::check::{cached_refusal, conclude, engine_call, unavailable};
use super::hosts::Hosts;
use super::operate::{operate, Operation};
use super::redis::RedisBackend;
use crate::decision::{Decision, Source, State};
use crate::limiter::Check;
use crate::local::{Key, Lease, LocalStore};

/// One limiter's leases: their size and lifetime, and their entries in the local store.
#[derive(Debug)]
pub(crate) struct Leases {
    id: u64,
    size: u64,
    lifetime_us: u64,
}

/// What a key's lease says of a check.
enum Take {
    /// Answered in process: this many units of the lease are left.
    Taken(u64),
    /// No lease that covers the cost; this many units of an expired lease were unused.
    Missing(u64),
}

impl Leases {
    /// Leases of `size` for `lifetime`, under `id` in the local store (the limiter's
    /// name's: see [`Layout::local_id`](super::Layout::local_id)).
    pub(crate) fn new(id: u64, size: u64, lifetime: Duration) -> Self {
        Self {
            id,
            size,
            lifetime_us: u64::try_from(lifetime.as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// The local store's key of `key`'s lease: computed once per check, for both
    /// [`take`](Self::take) and [`keep`](Self::keep).
    fn key(&self, store: &LocalStore, key: &[u8]) -> Key {
        store.key(self.id, key)
    }

    fn take(&self, store: &LocalStore, key: Key, cost: u64, now_us: u64) -> Take {
        store.update(key, Lease::default, |lease: &mut Lease| {
            if lease.expires_us > now_us && lease.units >= cost {
                lease.units -= cost;
                return Take::Taken(lease.units);
            }
            let unused = if lease.expires_us <= now_us {
                lease.units
            } else {
                0
            };
            if lease.expires_us <= now_us {
                lease.units = 0;
            }
            Take::Missing(unused)
        })
    }

    fn keep(&self, store: &LocalStore, key: Key, units: u64, now_us: u64) {
        let expires_us = now_us.saturating_add(self.lifetime_us);
        store.update(key, Lease::default, |lease: &mut Lease| {
            // Units of a lease still running (taken by a concurrent check) are kept.
            let running = if lease.expires_us > now_us {
                lease.units
            } else {
                0
            };
            *lease = Lease {
                units: running.saturating_add(units),
                expires_us,
            };
        });
    }
}

/// A check of a limiter with leases: from the key's lease in process when it covers
/// the cost, else one round trip that takes a new lease (and gives an expired lease's
/// unused units back, in the background).
pub(crate) fn check_leased<T: Hosts + ?Sized>(
    store: &Arc<T>,
    leases: &Leases,
    redis: &Arc<RedisBackend>,
    key: &[u8],
    cost: NonZeroU32,
) -> Check {
    let remote = store.remote();
    let backend = remote.backend();
    // Borrowed, not cloned: no shared reference count touched per check.
    let local = &*backend.inner.local;
    let now_us = backend.clock().now_us();
    let lease_key = leases.key(local, key);
    let unused = match leases.take(local, lease_key, u64::from(cost.get()), now_us) {
        Take::Taken(left) => {
            let state = if left == 0 {
                State::HitQuota
            } else {
                State::Allowed
            };
            return Check::ready(Decision::new(
                state,
                store.capacity(),
                left,
                Duration::ZERO,
                Source::Lease,
            ));
        }
        Take::Missing(unused) => unused,
    };
    // An expired lease's unused tokens go back with the call that takes the next lease,
    // or by themselves (in the background) when this check makes no call.
    let unused = u32::try_from(unused).unwrap_or(u32::MAX);
    let give_back = |store: &Arc<T>| {
        if unused > 0 {
            let refund = operate(store, Operation::Refund, key, u64::from(unused));
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(refund);
            }
        }
    };
    if !redis.admit() {
        give_back(store);
        return Check::ready(unavailable(&**store, key, cost));
    }
    let redis_key = remote.redis_key(key);
    // A key Redis refused moments ago is refused here until then, as without leases.
    let deny_key = match cached_refusal(&**store, &redis_key) {
        Ok(deny_key) => deny_key,
        Err(refused) => {
            give_back(store);
            return Check::ready(refused);
        }
    };
    let call = engine_call(
        &**store,
        key,
        &redis_key,
        "l",
        u64::from(cost.get()),
        leases.size,
        &[unused],
    );
    let store = Arc::clone(store);
    let redis = Arc::clone(redis);
    let size = leases.size;
    Check::pending(async move {
        let remote = store.remote();
        let started = std::time::Instant::now();
        let result = redis.eval(&call).await;
        remote.record_duration(started.elapsed());
        // An admitted lease: `{1, 0, 1, left, taken, full in}`; the check keeps its
        // cost, the rest is the lease.
        if let Ok(reply) = &result {
            if let &[1, 0, 1, left, taken, full_us] = reply.as_slice() {
                let taken = u64::try_from(taken).unwrap_or(0).min(size.max(1));
                let backend = remote.backend();
                let leftover = taken.saturating_sub(u64::from(cost.get()));
                if let Some(leases) = store.leases() {
                    let now_us = backend.clock().now_us();
                    leases.keep(&backend.inner.local, lease_key, leftover, now_us);
                }
                let left = u64::try_from(left).unwrap_or(0);
                let state = if left + leftover == 0 {
                    State::HitQuota
                } else {
                    State::Allowed
                };
                let reset = Duration::from_micros(u64::try_from(full_us).unwrap_or(0));
                return Decision::new(
                    state,
                    store.capacity(),
                    left + leftover,
                    reset,
                    Source::Redis,
                );
            }
        }
        conclude(
            &*store,
            &redis,
            result.map_err(Some),
            &redis_key,
            cost,
            deny_key,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_answers_until_used_up_or_expired() {
        let store = LocalStore::new(100, "t");
        let leases = Leases::new(1, 5, Duration::from_millis(10));
        let (k, other) = (leases.key(&store, b"k"), leases.key(&store, b"other"));
        assert!(matches!(leases.take(&store, k, 1, 0), Take::Missing(0)));
        leases.keep(&store, k, 4, 0);
        assert!(matches!(leases.take(&store, k, 3, 1_000), Take::Taken(1)));
        assert!(matches!(leases.take(&store, k, 2, 1_000), Take::Missing(0)));
        // Expired: the unused unit is reported once, to be given back.
        assert!(matches!(
            leases.take(&store, k, 1, 10_000),
            Take::Missing(1)
        ));
        assert!(matches!(
            leases.take(&store, k, 1, 10_000),
            Take::Missing(0)
        ));
        assert!(matches!(leases.take(&store, other, 1, 0), Take::Missing(0)));
    }
}
