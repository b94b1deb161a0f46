//! The local deny cache: once Redis refuses a key until a known time, this process
//! refuses it locally until then, so a flood on a hot key costs Redis almost nothing.
//!
//! Only refusals of a one-unit request are cached: if one unit is not available before
//! `T`, no larger cost is either, so the cached answer is the one Redis would give.
//!
//! A refusal is answered from the cache for at most the backend's
//! [`deny_cache_max_age`](crate::BackendBuilder::deny_cache_max_age) (1 s by default),
//! however far `T` is. A reset, refund or block made through this backend forgets the
//! entry at once; a reset or block made on another instance (an administrator lifting
//! a lockout) forgets it when its message arrives on the change subscription
//! (`redis/changes.rs`: within about a round trip of the change), and, while that
//! subscription is down, this process learns it from Redis within the max age. A
//! refusal made under another limit of the key (a dynamic limit that changed) is not
//! answered. A flooded key therefore costs Redis at most one call per max age per
//! instance.
//!
//! A set's refusal keeps each of its limits' decisions, so the answer from the cache
//! lists every limit in the headers, as Redis's answer did.
//! Entries are keyed by a 128-bit keyed hash of the full Redis key (random keys, so
//! attackers cannot aim for collisions) and capped in number; expired entries are
//! dropped whenever the cap is reached.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher as _};

use dashmap::DashMap;
use siphasher::sip128::{Hasher128, SipHasher13};

/// Hashes keys to 128 bits in one pass (SipHash-1-3, as the local store does) with
/// per-process random keys.
#[derive(Debug)]
pub(crate) struct KeyHasher(u64, u64);

impl Default for KeyHasher {
    fn default() -> Self {
        // Random keys, from the standard library's per-process random state.
        let random = RandomState::new();
        Self(random.hash_one(0u8), random.hash_one(1u8))
    }
}

impl KeyHasher {
    pub(crate) fn hash(&self, key: &[u8]) -> u128 {
        let mut hasher = SipHasher13::new_with_keys(self.0, self.1);
        hasher.write(key);
        hasher.finish128().as_u128()
    }
}

/// A `BuildHasher` for keys that already are [`KeyHasher`] output: their bits are random,
/// so hashing them again would only cost time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PreHashed;

impl BuildHasher for PreHashed {
    type Hasher = PreHashedHasher;

    fn build_hasher(&self) -> PreHashedHasher {
        PreHashedHasher(0)
    }
}

/// Keeps the low 64 bits of a `u128` written to it.
#[derive(Debug, Default)]
pub(crate) struct PreHashedHasher(u64);

impl std::hash::Hasher for PreHashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys other than `u128`; fold them in anyway.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(word);
        }
    }

    fn write_u128(&mut self, value: u128) {
        // Truncation intended: the low half is as random as the whole.
        self.0 = value as u64;
    }
}

/// What a cached refusal remembers of Redis's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Denied {
    /// Answered from the cache until this time (the crate clock's microseconds): the
    /// refusal's end, or the cache's max age, whichever comes first.
    pub(crate) until_us: u64,
    /// When the key could be admitted again.
    pub(crate) retry_us: u64,
    /// When the limit is fully available again.
    pub(crate) reset_us: u64,
    /// When the key's block (or lockout) ends, if Redis refused it for one (0: none).
    pub(crate) blocked_until_us: u64,
    /// When Redis gave the refusal.
    pub(crate) made_us: u64,
    /// A set's limits' decisions as Redis gave them (`None` for one limit).
    pub(crate) members: Option<std::sync::Arc<[crate::decision::Decision]>>,
    /// The limit the refusal was made under: a check under another limit of the same
    /// key (a [dynamic limit](crate::DynamicLimits) raised or lowered) is not answered by it.
    pub(crate) limit: u64,
}

#[derive(Debug)]
pub(crate) struct DenyCache {
    entries: DashMap<u128, Denied, PreHashed>,
    capacity: usize,
    /// The longest an entry is answered, in microseconds.
    max_age_us: u64,
    hasher: KeyHasher,
}

impl DenyCache {
    pub(crate) fn new(capacity: usize, max_age: std::time::Duration) -> Self {
        Self {
            entries: DashMap::with_hasher(PreHashed),
            capacity,
            max_age_us: u64::try_from(max_age.as_micros()).unwrap_or(u64::MAX),
            hasher: KeyHasher::default(),
        }
    }

    /// Until when a refusal made at `now_us` that lasts until `retry_us` is answered
    /// from the cache.
    pub(crate) fn answer_until(&self, now_us: u64, retry_us: u64) -> u64 {
        retry_us.min(now_us.saturating_add(self.max_age_us))
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.capacity > 0
    }

    pub(crate) fn hash(&self, key: &[u8]) -> u128 {
        self.hasher.hash(key)
    }

    /// The cached refusal of `key`, if it still holds at `now_us`.
    pub(crate) fn get(&self, key: u128, now_us: u64) -> Option<Denied> {
        let denied = self.entries.get(&key)?.clone();
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

    /// Forgets `key`'s refusal (after a refund or a reset).
    pub(crate) fn remove(&self, key: u128) {
        self.entries.remove(&key);
    }

    /// Forgets every refusal (the change subscription was made again: changes made
    /// while it was down were not heard).
    pub(crate) fn clear(&self) {
        self.entries.clear();
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
        let cache = DenyCache::new(2, std::time::Duration::from_secs(1));
        let (a, b, c) = (cache.hash(b"a"), cache.hash(b"b"), cache.hash(b"c"));
        assert_ne!(a, b);
        let denied = |until_us| Denied {
            until_us,
            retry_us: until_us,
            reset_us: until_us,
            blocked_until_us: 0,
            made_us: 0,
            members: None,
            limit: 1,
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
