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
//! in the backend's bounded local store. The handles see them too (`operate.rs`): a
//! peek answers from the key's lease as a check would, and a block or a reset ends it,
//! on every instance: another instance's block or reset ends this one's lease of the
//! key (its units forgotten) as soon as the change's message arrives (see
//! `redis/changes.rs`; within the lease's lifetime while the subscription is down).

use std::time::Duration;

use crate::decision::{Decision, Source, State};
use crate::local::{Key, Lease, LocalStore};

/// One limiter's leases: their size and lifetime, and their entries in the local store.
#[derive(Debug)]
pub(crate) struct Leases {
    id: u64,
    pub(super) size: u64,
    lifetime_us: u64,
}

/// What a key's lease says of a check.
pub(super) enum Take {
    /// Answered in process: this many units of the lease are left.
    Taken(u64),
    /// No lease that covers the cost; this many units of an expired lease were unused.
    Missing(u64),
}

impl Leases {
    /// Leases of `size` for `lifetime`, under `id` in the local store (the limiter's
    /// name's: see [`Layout::local_id`](super::layout::Layout::local_id)).
    pub(crate) fn new(id: u64, size: u64, lifetime: Duration) -> Self {
        Self {
            id,
            size,
            lifetime_us: u64::try_from(lifetime.as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// The local store's key of `key`'s lease: computed once per check, for both
    /// [`take`](Self::take) and [`keep`](Self::keep).
    pub(super) fn key(&self, store: &LocalStore, key: &[u8]) -> Key {
        store.key(self.id, key)
    }

    pub(super) fn take(&self, store: &LocalStore, key: Key, cost: u64, now_us: u64) -> Take {
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

    /// What [`take`](Self::take) of `cost` would leave of `key`'s running lease,
    /// spending nothing: `None` when no running lease covers the cost.
    pub(super) fn peek(&self, store: &LocalStore, key: Key, cost: u64, now_us: u64) -> Option<u64> {
        store.peek(key, Lease::default, |lease: &mut Lease| {
            (lease.expires_us > now_us && lease.units >= cost).then(|| lease.units - cost)
        })
    }

    /// Ends `key`'s lease (a block or a reset of the key): the units it still held,
    /// running or expired, are the caller's to give back or forget.
    pub(super) fn end(&self, store: &LocalStore, key: Key) -> u64 {
        let mut units = 0;
        store.modify(key, |lease: &mut Lease| {
            units = std::mem::take(lease).units;
        });
        units
    }

    pub(super) fn keep(&self, store: &LocalStore, key: Key, units: u64, now_us: u64) {
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

/// Ends `key`'s lease among the leases under `id` (a limiter's: see [`Leases::new`]),
/// forgetting its units: another instance reset or blocked the key (see
/// `redis/changes.rs`), so this one answers from Redis again.
pub(crate) fn forget(store: &LocalStore, id: u64, key: &[u8]) {
    store.modify(store.key(id, key), |lease: &mut Lease| {
        *lease = Lease::default();
    });
}

/// A check's answer from a lease: `left` units of it after the cost.
pub(super) fn answer(capacity: u64, left: u64) -> Decision {
    let state = if left == 0 {
        State::HitQuota
    } else {
        State::Allowed
    };
    Decision::new(state, capacity, left, Duration::ZERO, Source::Lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_answers_until_used_up_or_expired() {
        let store = LocalStore::new(100, "t", crate::clock::Clock::new());
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
        // A peek spends nothing; an end hands over what is left, once.
        leases.keep(&store, k, 4, 20_000);
        assert_eq!(leases.peek(&store, k, 3, 20_000), Some(1));
        assert_eq!(leases.peek(&store, k, 5, 20_000), None);
        assert_eq!(leases.peek(&store, k, 4, 30_000), None);
        assert_eq!(leases.end(&store, k), 4);
        assert_eq!(leases.end(&store, k), 0);
        assert!(matches!(
            leases.take(&store, k, 1, 20_000),
            Take::Missing(0)
        ));
        assert_eq!(leases.end(&store, other), 0);
    }
}
