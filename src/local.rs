//! The in-process state of every limiter on a backend: one bounded concurrent cache
//! ([`quick_cache`](https://docs.rs/quick_cache)) shared by all limiters, holding a few
//! words per limited key.
//!
//! # The bound
//!
//! The backend holds at most [`max_local_keys`](crate::BackendBuilder::max_local_keys)
//! keys in all, whatever the number of layers built on it: the bound is on the memory of
//! the process, not on one limiter. A fixed-window or token-bucket key counts as one key,
//! a rolling-window key as `ceil(buckets / 8)` keys (its counters take that much room).
//!
//! # When full
//!
//! A new key makes room by dropping another one, chosen by the cache's CLOCK-PRO policy
//! (an S3-FIFO-like scheme): a key seen once waits in a small probation queue and is the
//! first to go; a key hit again is kept in the main queue, from which the least recently
//! hit keys go first. A flood of new keys therefore only churns the probation queue, and
//! cannot push out the state of the keys that are actually being limited (a throttled
//! client retrying is hit again and again).
//!
//! Among the candidates, a key that carries nothing goes before one that does: a key
//! back at its full limit (its window ended, its bucket refilled, its counts gone) or
//! a lease that has run out is dropped first, and a key that has spent part of its limit
//! or is blocked is passed over, up to [`KEPT_IN_A_ROW`] candidates in a row, for the
//! next one. So a limited key seen only once (a client that stopped retrying, a
//! lockout) outlives a flood of new keys while the store holds keys that carry nothing;
//! when only keys that carry something are left, the next candidate goes whatever it
//! holds, so the bound always holds. A dropped key starts again with its full limit:
//! for a limited key, that many more admissions than the limit allows (on Redis the
//! count is Redis's: this is the in-process state, used while Redis is unreachable);
//! every drop is counted (the metric `ratelimit_local_evictions_total`, see
//! [`metrics`](crate::guide::metrics)).
//!
//! # Expiry
//!
//! Nothing is swept: a key whose window or bucket has expired is reset when it is next
//! hit, and is a first candidate for eviction since nothing hits it. Every operation is
//! O(1) on one shard (one of 64) under its lock, so no request waits on a sweep; memory
//! grows with the number of keys up to the bound and stays there (it is reused, not
//! returned to the system).
//!
//! # Why `quick_cache`
//!
//! Compared with hand-written eviction over `DashMap`: the same sharded-lock hot path,
//! but a maintained, fuzzed eviction policy with scan resistance, weights, and an eviction
//! hook. Compared with `moka`: `moka` keeps per-entry expiry, but each entry carries
//! reference-counted nodes in several queues and a timer wheel (several times the bytes
//! per key of this crate's 16-byte states), values are cloned out, so an in-place update
//! needs `and_compute_with` or a `Mutex` per key, and its TinyLFU admission may refuse a
//! new key outright (its count then vanishes at once). `quick_cache`'s
//! [`entry`](quick_cache::sync::Cache::entry) updates a state in place under the shard
//! lock, and a key inserted by two requests at once is inserted once (the second waits
//! for the first).
//!
//! The price, measured (`benches/NOTES.md`): a check on a hot key costs what it did on
//! `DashMap` (~90 ns), but with 100 000 keys cycling it costs ~100 to ~150 ns more for
//! the token bucket and the fixed window (an index table, then the slab: one more cache
//! miss than a map holding the state inline). In exchange the store is bounded, never
//! swept, and a flood of new keys neither grows it nor resets the keys being limited.
//!
//! # Keys and bytes
//!
//! A key is stored as a 128-bit SipHash-1-3 of (limiter id, key bytes) with random keys
//! ([`siphasher`](https://docs.rs/siphasher), one pass), never as a copy of the key: no
//! allocation for a known key, fixed-size entries, and collisions out of reach of anyone
//! choosing keys. A state is four words ([`Slot`]; the token bucket and the fixed window
//! keep the skew of a clock step beside their state); measured in all when it was three,
//! about 70 bytes per fixed-window or token-bucket key (8 more now) while the bound is
//! not reached, ~100 with it reached
//! (the cache then also remembers the hashes of recently evicted keys, to recognise keys
//! that come back), and for a rolling window that plus its counters (8 bytes a bucket).
//!
//! The limiter id is derived from the limiter's algorithm and name (and, for a rolling
//! window, its bucket count), so every limiter of one name and algorithm on a backend
//! shares its in-process state, as it shares its Redis keys: a handle built with a
//! layer's name peeks, refunds, resets and blocks the layer's keys.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::cell::Cell;

use quick_cache::sync::{Cache, EntryAction, EntryResult};
use quick_cache::{Lifecycle, OptionsBuilder, Weighter};
use siphasher::sip128::{Hasher128, SipHasher13};

use crate::clock::Clock;
mod slot;
use slot::Now;
pub(crate) use slot::{ring_weight, Blocked, Lease, Slot, State, Tat};

/// The default of [`BackendBuilder::max_local_keys`](crate::BackendBuilder::max_local_keys).
pub(crate) const DEFAULT_MAX_KEYS: u64 = 1_000_000;

/// Shards of the cache: each has its own lock and its share of the bound.
const SHARDS: usize = 64;

/// How many eviction candidates in a row that carry something are passed over, at most,
/// before the next one goes whatever it holds: a few more entries read per eviction,
/// from the head of the queue (the same ones each time, while they last). Never more
/// than half the probation queue (which is 3% of a shard): the cache turns to its main queue
/// when every candidate of the probation queue is passed over, which would trade the
/// main queue's keys for the flood's.
const KEPT_IN_A_ROW: u32 = 8;

thread_local! {
    /// The candidates passed over in a row by the eviction running on this thread (a
    /// shard's eviction runs under its lock, on one thread), and the time it read at
    /// its first one. `quick_cache` asks [`Lifecycle::is_pinned`] of each candidate in
    /// turn, and evicts the first it is told is not pinned.
    static PASSED_OVER: Cell<(u32, Now)> = const { Cell::new((0, Now { us: 0, ns: 0 })) };
}

/// A 128-bit key: a hash of (limiter, key bytes) with per-process random seeds, so that
/// no owned key is stored or allocated and attackers cannot aim for collisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key(u64, u64);

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0);
    }
}

/// A hasher for [`Key`]s, whose bits are random already.
#[derive(Debug, Clone, Copy, Default)]
struct KeyBits;

impl BuildHasher for KeyBits {
    type Hasher = KeyBitsHasher;

    fn build_hasher(&self) -> KeyBitsHasher {
        KeyBitsHasher(0)
    }
}

#[derive(Debug, Default)]
struct KeyBitsHasher(u64);

impl Hasher for KeyBitsHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is reached for a `Key`; fold anything else in anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

#[derive(Debug, Clone, Copy)]
struct Weigh;

impl Weighter<Key, Slot> for Weigh {
    fn weight(&self, _key: &Key, slot: &Slot) -> u64 {
        slot.weight()
    }
}

/// Counts evictions (and records them as a metric).
#[derive(Clone)]
struct Evictions(Arc<EvictionCount>);

struct EvictionCount {
    count: AtomicU64,
    prefix: String,
    /// The backend's clock, which the states' times are on.
    clock: Clock,
    /// Candidates passed over in a row, at most (see [`KEPT_IN_A_ROW`]).
    kept_in_a_row: u32,
    #[cfg(feature = "metrics")]
    counter: std::sync::OnceLock<metrics::Counter>,
}

impl Lifecycle<Key, Slot> for Evictions {
    /// Evicted states are dropped in place: they are a few words (a rolling window's
    /// counters are one small allocation).
    type RequestState = ();

    /// A candidate that carries something is passed over, up to [`KEPT_IN_A_ROW`] in a
    /// row (so the bound always holds).
    fn is_pinned(&self, _key: &Key, slot: &Slot) -> bool {
        // A small store passes over nothing: no clock read per candidate.
        if self.0.kept_in_a_row == 0 {
            return false;
        }
        PASSED_OVER.with(|passed| {
            let (count, now) = passed.get();
            let now = if count == 0 {
                Now {
                    us: self.0.clock.now_us(),
                    ns: self.0.clock.elapsed_ns(),
                }
            } else {
                now
            };
            let keep = count < self.0.kept_in_a_row && slot.carries(now);
            passed.set((if keep { count + 1 } else { 0 }, now));
            keep
        })
    }

    fn on_evict(&self, _: &mut (), _key: Key, _slot: Slot) {
        self.0.count.fetch_add(1, Ordering::Relaxed);
        crate::metrics::local_eviction(
            #[cfg(feature = "metrics")]
            &self.0.counter,
            &self.0.prefix,
        );
    }
}

/// State of any type kept by [`LocalStore::shared`].
type SharedState = Arc<dyn std::any::Any + Send + Sync>;

/// The bounded in-process state of one backend.
pub(crate) struct LocalStore {
    cache: Cache<Key, Slot, Weigh, KeyBits, Evictions>,
    /// SipHash-1-3 keys, random per store.
    seeds: (u64, u64),
    evictions: Evictions,
    /// Flags shared by the limiters of one name (whether a key was ever blocked), by id.
    flags: std::sync::Mutex<std::collections::HashMap<u64, Arc<std::sync::atomic::AtomicBool>>>,
    /// State shared by the limiters of one name that lives outside the bounded cache (the
    /// [in-flight](crate::in_flight) counts, which must never be evicted), by id.
    shared: std::sync::Mutex<std::collections::HashMap<u64, SharedState>>,
    max_keys: u64,
    /// The bound of one shard: no single key may weigh more.
    shard_capacity: u64,
}

impl fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalStore")
            .field("max_keys", &self.max_keys)
            .field("keys", &self.cache.len())
            .field("evictions", &self.evictions())
            .finish_non_exhaustive()
    }
}

impl LocalStore {
    /// A store of at most `max_keys` keys (at least 1) whose states are on `clock`;
    /// `prefix` labels its metric.
    pub(crate) fn new(max_keys: u64, prefix: &str, clock: Clock) -> Self {
        let max_keys = max_keys.max(1);
        let items = usize::try_from(max_keys).unwrap_or(usize::MAX);
        // quick_cache gives each shard at least 32 items, halving the shard count until
        // it does, and rounds each shard's share up: round the bound down to a multiple
        // of the shard count instead, so the store never holds more than `max_keys`.
        let mut shards = SHARDS as u64;
        while shards > 1 && max_keys.div_ceil(shards) < 32 {
            shards /= 2;
        }
        // The probation queue is 3% of a shard (quick_cache's default split): pass over
        // at most half of it.
        let probation = max_keys / shards * 3 / 100;
        let evictions = Evictions(Arc::new(EvictionCount {
            count: AtomicU64::new(0),
            prefix: prefix.to_owned(),
            clock,
            kept_in_a_row: u32::try_from(probation / 2)
                .unwrap_or(u32::MAX)
                .min(KEPT_IN_A_ROW),
            #[cfg(feature = "metrics")]
            counter: std::sync::OnceLock::new(),
        }));
        let options = OptionsBuilder::new()
            .shards(SHARDS)
            .estimated_items_capacity(items)
            .weight_capacity(max_keys / shards * shards)
            .build()
            .expect("every option is set");
        let cache = Cache::with_options(options, Weigh, KeyBits, evictions.clone());
        let shard_capacity = cache.shard_capacity();
        Self {
            cache,
            seeds: {
                // Random keys, from the standard library's per-process random state.
                let random = RandomState::new();
                (random.hash_one(0u8), random.hash_one(1u8))
            },
            evictions,
            flags: std::sync::Mutex::default(),
            shared: std::sync::Mutex::default(),
            max_keys,
            shard_capacity,
        }
    }

    /// The flag of `id`, shared by every caller asking for the same id (taken when a
    /// limiter is built, never on a check).
    pub(crate) fn flag(&self, id: u64) -> Arc<std::sync::atomic::AtomicBool> {
        let mut flags = self
            .flags
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(flags.entry(id).or_default())
    }

    /// The state of type `T` of `id`, shared by every caller asking for the same id and
    /// type (taken when a limiter is built, never on a check).
    pub(crate) fn shared<T: Default + Send + Sync + 'static>(&self, id: u64) -> Arc<T> {
        let mut shared = self
            .shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let state = shared
            .entry(id)
            .or_insert_with(|| Arc::new(T::default()) as SharedState);
        match Arc::clone(state).downcast::<T>() {
            Ok(state) => state,
            // Another type under the same id: never with ids from `Layout::local_id`.
            Err(_) => {
                let state = Arc::new(T::default());
                shared.insert(id, Arc::clone(&state) as SharedState);
                state
            }
        }
    }

    /// Whether a key of `weight` fits in the store at all.
    pub(crate) fn fits(&self, weight: u64) -> bool {
        weight <= self.shard_capacity
    }

    /// The cache key of `key` for limiter `limiter`: SipHash-1-3 with 128-bit output and
    /// random keys, in one pass.
    pub(crate) fn key(&self, limiter: u64, key: &[u8]) -> Key {
        let mut h = SipHasher13::new_with_keys(self.seeds.0, self.seeds.1);
        h.write_u64(limiter);
        h.write(key);
        let hash = h.finish128();
        Key(hash.h1, hash.h2)
    }

    /// Forgets `key`'s state.
    pub(crate) fn remove(&self, key: Key) {
        self.cache.remove(&key);
    }

    /// Runs `f` on `key`'s state if it has one, creating nothing.
    pub(crate) fn modify<S: State>(&self, key: Key, f: impl FnOnce(&mut S)) {
        if !self.cache.contains_key(&key) {
            return;
        }
        // A key evicted meanwhile leaves a placeholder guard, dropped at once.
        let _ = self.cache.entry(&key, None, |_, slot| {
            if let Some(state) = S::get(slot) {
                f(state);
            }
            EntryAction::<()>::Retain(())
        });
    }

    /// Runs `f` on a copy of `key`'s state (or on `init()` if the key is new), storing
    /// nothing: what [`update`](Self::update) would answer, without its change.
    pub(crate) fn peek<S: State + Clone, R>(
        &self,
        key: Key,
        init: impl FnOnce() -> S,
        f: impl FnOnce(&mut S) -> R,
    ) -> R {
        let mut state = self
            .cache
            .peek(&key)
            .and_then(|mut slot| S::get(&mut slot).cloned())
            .unwrap_or_else(init);
        f(&mut state)
    }

    /// Runs `f` on `key`'s state, creating it with `init` first if the key is new (or was
    /// evicted). Two requests on a new key at once create it once.
    pub(crate) fn update<S: State, R>(
        &self,
        key: Key,
        init: impl FnOnce() -> S,
        f: impl FnOnce(&mut S) -> R,
    ) -> R {
        let mut f = Some(f);
        let mut init = Some(init);
        let result = self.cache.entry(&key, None, |_, slot| {
            let f = f.take().expect("called once");
            if S::get(slot).is_none() {
                // Another algorithm's state under the same 128-bit hash: never in practice.
                *slot = (init.take().expect("called once"))().into_slot();
            }
            let state = S::get(slot).expect("just set");
            EntryAction::Retain(f(state))
        });
        match result {
            EntryResult::Retained(r) => r,
            EntryResult::Vacant(guard) | EntryResult::Replaced(guard, _) => {
                let mut state = (init.take().expect("not called yet"))();
                let r = (f.take().expect("not called yet"))(&mut state);
                // Err only if the placeholder was removed meanwhile: nothing to keep then.
                let _ = guard.insert(state.into_slot());
                r
            }
            EntryResult::Removed(..) | EntryResult::Timeout => {
                unreachable!("the callback always retains, and there is no timeout")
            }
        }
    }

    /// Keys dropped to make room so far.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions.0.count.load(Ordering::Relaxed)
    }

    /// Keys held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.cache.len()
    }
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
