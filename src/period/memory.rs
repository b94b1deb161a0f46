//! The in-process fixed windows: one counter, deadline and skew per key, 24 bytes of
//! state in the backend's bounded [local store](crate::local).
//!
//! [`Window::hit`] is the whole algorithm, a pure step: (state, now, cost, settings) ->
//! (state, outcome).

use crate::local::{Key, LocalStore};

pub(crate) use super::window::{Hit, Schedule, Window};

/// One limiter's windows in the backend's local store.
#[derive(Debug)]
pub(crate) struct Windows {
    store: std::sync::Arc<LocalStore>,
    limiter: u64,
}

impl Windows {
    /// The windows under `limiter` (the limiter name's id) in `store`.
    pub(crate) fn new(store: std::sync::Arc<LocalStore>, limiter: u64) -> Self {
        Self { store, limiter }
    }

    fn key(&self, key: &[u8]) -> Key {
        self.store.key(self.limiter, key)
    }

    /// Gives `cost` units back to `key`'s window.
    pub(crate) fn refund(&self, key: &[u8], cost: u64, now_us: u64) {
        self.store
            .modify(self.key(key), |w: &mut Window| w.refund(cost, now_us));
    }

    /// Forgets `key`'s window.
    pub(crate) fn reset(&self, key: &[u8]) {
        self.store.remove(self.key(key));
    }

    /// Counts `cost` against `key` unless it would exceed `quota`; with `spend` false,
    /// only says what counting would answer.
    pub(crate) fn hit(
        &self,
        key: &[u8],
        cost: u64,
        quota: u64,
        schedule: Schedule,
        now_us: u64,
        spend: bool,
    ) -> Hit {
        let step = |w: &mut Window| w.hit(cost, quota, schedule, now_us);
        if spend {
            self.store.update(self.key(key), Window::default, step)
        } else {
            self.store.peek(self.key(key), Window::default, step)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000;

    #[test]
    fn aligned_window_ends_at_local_midnight() {
        let day = 86_400 * SEC;
        let schedule = Schedule {
            period_us: day,
            offset_us: Some(8 * 3_600 * 1_000_000),
            calendar: None,
        };
        // 2026-11-22T15:30:00Z is 23:30 in UTC+8: the window ends 30 minutes later.
        let now = 1_795_361_400 * SEC;
        assert_eq!(schedule.window_end(now), now + 1_800 * SEC);
        let west = Schedule {
            period_us: day,
            offset_us: Some(-5 * 3_600 * 1_000_000),
            calendar: None,
        };
        // 15:30Z is 10:30 in UTC-5: 13.5 hours to go.
        assert_eq!(west.window_end(now), now + 48_600 * SEC);
    }

    fn windows() -> Windows {
        Windows::new(
            std::sync::Arc::new(LocalStore::new(1_000, "t", crate::clock::Clock::new())),
            1,
        )
    }

    const SCHEDULE: Schedule = Schedule {
        period_us: SEC,
        offset_us: None,
        calendar: None,
    };

    #[test]
    fn counts_and_resets() {
        let windows = windows();
        let t0 = 10 * SEC;
        for i in 1..=3 {
            let hit = windows.hit(b"k", 1, 3, SCHEDULE, t0, true);
            assert!(hit.admitted);
            assert_eq!(hit.count, i);
        }
        let over = windows.hit(b"k", 1, 3, SCHEDULE, t0 + 10, true);
        assert!(!over.admitted);
        assert_eq!(over.count, 3, "rejected hits are not counted");
        let next = windows.hit(b"k", 1, 3, SCHEDULE, t0 + SEC, true);
        assert!(next.admitted);
        assert_eq!(next.count, 1);
        assert_eq!(next.ends_at_us, t0 + 2 * SEC);
        assert_eq!(
            windows.hit(b"other", 1, 3, SCHEDULE, t0 + SEC, true).count,
            1
        );
        assert_eq!(windows.store.len(), 2);
    }

    #[test]
    fn a_step_back_keeps_the_count_for_at_most_a_period() {
        let mut w = Window::default();
        let t0 = 1_000_000 * SEC;
        for _ in 0..3 {
            assert!(w.hit(1, 3, SCHEDULE, t0).admitted);
        }
        // The clock steps back an hour: still full, and the window now ends one period
        // from the new time, not an hour and a period later.
        let back = t0 - 3_600 * SEC;
        let hit = w.hit(1, 3, SCHEDULE, back);
        assert!(!hit.admitted);
        assert_eq!(hit.ends_at_us, back + SEC);
        assert!(!w.hit(1, 3, SCHEDULE, back + SEC - 1).admitted);
        assert!(w.hit(1, 3, SCHEDULE, back + SEC).admitted);
    }

    #[test]
    fn a_step_forward_at_most_ends_the_window_early() {
        let mut w = Window::default();
        let t0 = 1_000_000 * SEC;
        for _ in 0..3 {
            assert!(w.hit(1, 3, SCHEDULE, t0).admitted);
        }
        let hit = w.hit(1, 3, SCHEDULE, t0 + 3_600 * SEC);
        assert!(hit.admitted);
        assert_eq!(hit.count, 1);
    }

    #[test]
    fn limiters_on_one_store_keep_their_keys_apart() {
        let store = std::sync::Arc::new(LocalStore::new(1_000, "t", crate::clock::Clock::new()));
        let (a, b) = (
            Windows::new(store.clone(), 1),
            Windows::new(store.clone(), 2),
        );
        assert!(a.hit(b"k", 1, 1, SCHEDULE, SEC, true).admitted);
        assert!(!a.hit(b"k", 1, 1, SCHEDULE, SEC, true).admitted);
        assert!(b.hit(b"k", 1, 1, SCHEDULE, SEC, true).admitted);
        assert_eq!(store.len(), 2);
    }
}
