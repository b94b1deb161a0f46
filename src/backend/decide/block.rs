//! Blocked keys: a key refused outright until a time, by [`Limiter::block`] or by a
//! limit's lockout (a refusal that locks the key out for a while, fail2ban-style).
//!
//! On Redis a block is one more key next to the limit's own (`…}:block:<algorithm>:<name>`,
//! see [Redis keys](super#redis-keys)), written by the engine when it blocks a key or a
//! lockout starts, and read by it on every call but a lean admission: the limits' keys
//! of a blocked key are marked, and a marked key is never admitted by the lean check
//! (see [Blocks on Redis](crate::backend#blocks-on-redis)), so every instance honours it. In process a block
//! is an entry of the backend's local store under the limit's name, shared by every
//! limiter of that name on the backend, and looked up only once a key of that name was
//! ever blocked (or the limit has a lockout).
//!
//! [`Limiter::block`]: crate::Limiter::block

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::local::{Blocked, LocalStore};

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
        }
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
    /// `replace`).
    pub(crate) fn block(&self, store: &LocalStore, key: &[u8], until_us: u64, replace: bool) {
        self.seen.store(true, Ordering::Relaxed);
        store.update(
            store.key(self.id, key),
            Blocked::default,
            |b: &mut Blocked| {
                if replace || b.0 < until_us {
                    b.0 = until_us;
                }
            },
        );
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
        Some(result)
    }

    /// Lifts `key`'s block in process.
    pub(crate) fn unblock(&self, store: &LocalStore, key: &[u8]) {
        if self.seen.load(Ordering::Relaxed) {
            store.remove(store.key(self.id, key));
        }
    }
}
