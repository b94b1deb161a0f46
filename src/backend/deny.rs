//! The local deny cache: once Redis refuses a key until a known time, this process
//! refuses it locally until then, so a flood on a hot key costs Redis almost nothing.
//!
//! Only refusals of a one-unit request are cached: if one unit is not available before
//! `T`, no larger cost is either, so the cached answer is the one Redis would give.
//! Entries are keyed by a 128-bit hash of the full Redis key (two random seeds, so
//! attackers cannot aim for collisions) and capped in number; expired entries are
//! dropped whenever the cap is reached.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use dashmap::DashMap;

/// Hashes keys to 128 bits with per-process random seeds.
#[derive(Debug, Default)]
pub(crate) struct KeyHasher(RandomState, RandomState);

impl KeyHasher {
    pub(crate) fn hash(&self, key: &str) -> u128 {
        (u128::from(self.0.hash_one(key)) << 64) | u128::from(self.1.hash_one(key))
    }
}

/// What a cached refusal remembers of Redis's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Denied {
    /// Refused until this time (the crate clock's microseconds).
    pub(crate) until_us: u64,
    /// When the limit is fully available again.
    pub(crate) reset_us: u64,
}

#[derive(Debug)]
pub(crate) struct DenyCache {
    entries: DashMap<u128, Denied>,
    capacity: usize,
    hasher: KeyHasher,
}

impl DenyCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: DashMap::new(),
            capacity,
            hasher: KeyHasher::default(),
        }
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.capacity > 0
    }

    pub(crate) fn hash(&self, key: &str) -> u128 {
        self.hasher.hash(key)
    }

    /// The cached refusal of `key`, if it still holds at `now_us`.
    pub(crate) fn get(&self, key: u128, now_us: u64) -> Option<Denied> {
        let denied = *self.entries.get(&key)?;
        if now_us < denied.until_us {
            return Some(denied);
        }
        self.entries.remove_if(&key, |_, d| d.until_us <= now_us);
        None
    }

    /// Remembers that `key` is refused until `denied.until_us`.
    pub(crate) fn insert(&self, key: u128, denied: Denied, now_us: u64) {
        if self.entries.len() >= self.capacity {
            self.entries.retain(|_, d| d.until_us > now_us);
            if self.entries.len() >= self.capacity {
                return;
            }
        }
        self.entries.insert(key, denied);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_expire_and_stay_bounded() {
        let cache = DenyCache::new(2);
        let (a, b, c) = (cache.hash("a"), cache.hash("b"), cache.hash("c"));
        assert_ne!(a, b);
        let denied = |until_us| Denied {
            until_us,
            reset_us: until_us,
        };
        cache.insert(a, denied(100), 0);
        cache.insert(b, denied(50), 0);
        assert_eq!(cache.get(a, 10), Some(denied(100)));
        // Full: nothing has expired yet, so `c` is not cached.
        cache.insert(c, denied(100), 10);
        assert_eq!(cache.get(c, 10), None);
        // Once `b` expired, room is made for `c`.
        cache.insert(c, denied(100), 60);
        assert_eq!(cache.get(c, 60), Some(denied(100)));
        assert_eq!(cache.get(a, 100), None, "expired at 100");
        assert!(cache.len() <= 2);
    }
}
