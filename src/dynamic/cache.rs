//! One cache entry per key: the answer as atomics, so a fresh hit takes no lock and
//! allocates nothing, and a flag that keeps one lookup in flight.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;

/// Not looked up yet.
pub(super) const PENDING: u64 = 0;
/// The source's answer, or the failure policy: refuse the key's requests.
pub(super) const REFUSE: u64 = u64::MAX;
/// The default limit (the source said `None`, or a failure fell back to it).
pub(super) const DEFAULT: u64 = u64::MAX - 1;

/// A key's cached answer: [`PENDING`], [`REFUSE`], [`DEFAULT`], or a limit.
#[derive(Debug)]
pub(super) struct Slot {
    outcome: AtomicU64,
    /// The clock time (µs) until which `outcome` is used without a new lookup.
    fresh_until_us: AtomicU64,
    /// A lookup is in flight.
    refreshing: AtomicBool,
    /// Woken when a lookup ends.
    ready: Notify,
}

impl Slot {
    pub(super) fn new() -> Self {
        Self {
            outcome: AtomicU64::new(PENDING),
            fresh_until_us: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            ready: Notify::new(),
        }
    }

    pub(super) fn outcome(&self) -> u64 {
        self.outcome.load(Ordering::Acquire)
    }

    pub(super) fn is_stale(&self, now_us: u64) -> bool {
        now_us >= self.fresh_until_us.load(Ordering::Relaxed)
    }

    /// Claims the one lookup of this key; `false` when one is already in flight.
    pub(super) fn start_lookup(&self) -> bool {
        self.refreshing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Ends a lookup with `outcome`, used until `fresh_until_us`, and wakes waiters.
    pub(super) fn finish(&self, outcome: u64, fresh_until_us: u64) {
        self.fresh_until_us.store(fresh_until_us, Ordering::Relaxed);
        self.outcome.store(outcome, Ordering::Release);
        self.refreshing.store(false, Ordering::Release);
        self.ready.notify_waiters();
    }

    /// Waits until the key has an outcome (the first lookup ended).
    pub(super) async fn resolved(&self) -> u64 {
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let outcome = self.outcome();
            if outcome != PENDING {
                return outcome;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_lookup_at_a_time_and_waiters_wake() {
        let slot = std::sync::Arc::new(Slot::new());
        assert!(slot.start_lookup());
        assert!(!slot.start_lookup());
        assert!(slot.is_stale(0));
        let waiter = tokio::spawn({
            let slot = slot.clone();
            async move { slot.resolved().await }
        });
        tokio::task::yield_now().await;
        slot.finish(7, 100);
        assert_eq!(waiter.await.unwrap(), 7);
        assert!(!slot.is_stale(99));
        assert!(slot.is_stale(100));
        assert!(slot.start_lookup());
    }
}
