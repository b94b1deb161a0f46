//! Blocked keys: a key refused outright until a time, by [`Limiter::block`] or by a
//! limit's lockout (a refusal that locks the key out for a while, fail2ban-style).
//!
//! On Redis a block is one more key next to the limit's own (`…}:block:<algorithm>:<name>`,
//! see [Redis keys](super#redis-keys)), written by the engine when it blocks a key or a
//! lockout starts, and read by it on every call but a fast-path admission: the limits' keys
//! of a blocked key are marked, and a marked key is never admitted by the fast path
//! (see [Blocks on Redis](crate::guide::deployments#blocks-on-redis)), so every instance honours it. In process a block
//! is an entry of the backend's local store under the limit's name, shared by every
//! limiter of that name on the backend, and looked up only once a key of that name was
//! ever blocked (or the limit has a lockout).
//!
//! The local store knows a block only by its key's hash: the keys blocked in process
//! are also kept, for [listing](super::listing), in a [`Registry`] per name (the blocks
//! themselves, which are rare, bounded by [`MAX_REGISTERED`] and pruned as they end).
//!
//! [`Limiter::block`]: crate::Limiter::block

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::local::{Blocked, LocalStore};

/// The most keys one name's [`Registry`] holds: past it (and once the ended blocks are
/// pruned), a new block in process still refuses its key but is not listed.
pub(crate) const MAX_REGISTERED: usize = 10_000;

/// The keys of one name blocked in process, and until when (Unix µs): what an
/// in-process listing reads. Shared by every limiter of the name on a backend, as the
/// blocks are. Its `Debug` shows how many keys it holds, never the keys (they can be
/// secrets such as API keys).
#[derive(Default)]
pub(crate) struct Registry(Mutex<Entries>);

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Registry")
            .field("keys", &entries.until_us.len())
            .finish()
    }
}

#[derive(Default)]
struct Entries {
    until_us: HashMap<Box<[u8]>, u64>,
    /// The earliest end among the entries when they were last pruned: no entry has
    /// ended before then, so a full registry is pruned again only once one may have.
    prune_at_us: u64,
}

impl Registry {
    /// Records that `key` is blocked until `until_us` (seen at `now_us`).
    fn insert(&self, key: &[u8], until_us: u64, now_us: u64) {
        let mut entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let full = entries.until_us.len() >= MAX_REGISTERED;
        if full && !entries.until_us.contains_key(key) {
            if now_us < entries.prune_at_us {
                return;
            }
            entries.until_us.retain(|_, &mut until| until > now_us);
            entries.prune_at_us = entries.until_us.values().copied().min().unwrap_or(0);
            if entries.until_us.len() >= MAX_REGISTERED {
                return;
            }
        }
        entries.prune_at_us = entries.prune_at_us.min(until_us);
        entries.until_us.insert(key.into(), until_us);
    }

    fn remove(&self, key: &[u8]) {
        let mut entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        entries.until_us.remove(key);
    }

    /// The keys blocked at `now_us` (ended ones are pruned), soonest end first:
    /// `(key, until µs)`.
    pub(crate) fn list(&self, now_us: u64) -> Vec<(Vec<u8>, u64)> {
        let mut entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        entries.until_us.retain(|_, &mut until| until > now_us);
        entries.prune_at_us = entries.until_us.values().copied().min().unwrap_or(0);
        let mut listed: Vec<(Vec<u8>, u64)> = entries
            .until_us
            .iter()
            .map(|(key, &until)| (key.to_vec(), until))
            .collect();
        drop(entries);
        listed.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        listed
    }
}

/// One limiter's blocks: its lockout, and its blocked keys in the local store.
#[derive(Debug)]
pub(crate) struct Blocks {
    /// The id of this limiter's block entries in the local store.
    id: u64,
    /// How long a refused check locks its key out, in milliseconds (0: never).
    lockout_ms: u64,
    /// Whether a key of this name was ever blocked in process (shared by every limiter
    /// of the name on the backend): until then, in-process checks skip the lookup.
    seen: Arc<AtomicBool>,
    /// The keys of this name blocked in process, for listing (shared as `seen` is).
    registry: Arc<Registry>,
}

impl Blocks {
    /// The blocks under `id` in `store` (the name's: see
    /// [`Layout::local_id`](super::layout::Layout::local_id)), with `lockout`.
    pub(crate) fn new(store: &LocalStore, id: u64, lockout: Option<Duration>) -> Self {
        let lockout_ms = lockout.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let seen = store.flag(id);
        if lockout_ms > 0 {
            seen.store(true, Ordering::Relaxed);
        }
        Self {
            id,
            lockout_ms,
            seen,
            registry: store.shared(id),
        }
    }

    /// The keys of this name blocked in process.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The lockout in milliseconds (0: none), for the engine.
    pub(crate) fn lockout_ms(&self) -> u64 {
        self.lockout_ms
    }

    /// Until when (Unix µs) `key` is blocked in process, if it is at `now_us()` (the
    /// clock is read only once a key of this limiter was ever blocked).
    pub(crate) fn until(
        &self,
        store: &LocalStore,
        key: &[u8],
        now_us: impl FnOnce() -> u64,
    ) -> Option<u64> {
        if !self.seen.load(Ordering::Relaxed) {
            return None;
        }
        let now_us = now_us();
        let until = store.peek(
            store.key(self.id, key),
            Blocked::default,
            |b: &mut Blocked| b.0,
        );
        (until > now_us).then_some(until)
    }

    /// Blocks `key` in process until `until_us` (never shortening a longer block unless
    /// `replace`), seen at `now_us`.
    pub(crate) fn block(
        &self,
        store: &LocalStore,
        key: &[u8],
        until_us: u64,
        replace: bool,
        now_us: u64,
    ) {
        self.seen.store(true, Ordering::Relaxed);
        let until = store.update(
            store.key(self.id, key),
            Blocked::default,
            |b: &mut Blocked| {
                if replace || b.0 < until_us {
                    b.0 = until_us;
                }
                b.0
            },
        );
        self.registry.insert(key, until, now_us);
    }

    /// Starts the lockout of `key` after a refusal at `now_us`, unless one is running:
    /// until when it is blocked, if there is a lockout.
    pub(crate) fn lock_out(&self, store: &LocalStore, key: &[u8], now_us: u64) -> Option<u64> {
        if self.lockout_ms == 0 {
            return None;
        }
        let until = now_us.saturating_add(self.lockout_ms.saturating_mul(1_000));
        let mut result = until;
        store.update(
            store.key(self.id, key),
            Blocked::default,
            |b: &mut Blocked| {
                if b.0 <= now_us {
                    b.0 = until;
                }
                result = b.0;
            },
        );
        self.registry.insert(key, result, now_us);
        Some(result)
    }

    /// Lifts `key`'s block in process.
    pub(crate) fn unblock(&self, store: &LocalStore, key: &[u8]) {
        if self.seen.load(Ordering::Relaxed) {
            store.remove(store.key(self.id, key));
            self.registry.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_bounded_and_pruned_as_blocks_end() {
        let registry = Registry::default();
        for i in 0..MAX_REGISTERED {
            registry.insert(format!("k{i}").as_bytes(), 1_000 + i as u64, 0);
        }
        // Full, and no block has ended yet: a new one is not registered.
        registry.insert(b"late", 50_000, 500);
        assert_eq!(registry.list(500).len(), MAX_REGISTERED);
        // A known key's end still changes.
        registry.insert(b"k0", 60_000, 500);
        // Once some have ended, they make room.
        registry.insert(b"late", 50_000, 1_010);
        let listed = registry.list(1_010);
        // (k1 to k10 ended; k0 was moved on.)
        assert_eq!(listed.len(), MAX_REGISTERED - 10 + 1);
        assert_eq!(listed[0], (b"k11".to_vec(), 1_011), "soonest end first");
        assert_eq!(
            &listed[listed.len() - 2..],
            [(b"late".to_vec(), 50_000), (b"k0".to_vec(), 60_000)]
        );
        registry.remove(b"late");
        assert!(registry.list(1_010).iter().all(|(key, _)| key != b"late"));
        // Its `Debug` never shows a key.
        let shown = format!("{registry:?}");
        assert_eq!(
            shown,
            format!("Registry {{ keys: {} }}", MAX_REGISTERED - 10)
        );
    }
}
