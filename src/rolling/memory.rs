//! The rolling-window limiter's in-process host: per key, a [`Ring`](crate::ring::Ring) of `buckets` counts
//! on a Unix-time grid plus their sum, in the backend's bounded [local store](crate::local).
//!
//! [`Counts::hit`] is the whole algorithm, a pure step with the same semantics as
//! `rolling.lua`: (state, now, cost, settings) -> (state, outcome).

use std::sync::Arc;

use crate::local::{Key, LocalStore};

pub(crate) use super::counts::{Counts, Grid, Hit};

/// One limiter's rings in the backend's local store.
#[derive(Debug)]
pub(crate) struct Rings {
    store: Arc<LocalStore>,
    limiter: u64,
    grid: Grid,
}

impl Rings {
    /// The rings under `limiter` (the limiter name's id, for this many buckets) in
    /// `store`.
    pub(crate) fn new(store: Arc<LocalStore>, limiter: u64, grid: Grid) -> Self {
        Self {
            store,
            limiter,
            grid,
        }
    }

    fn key(&self, key: &[u8]) -> Key {
        self.store.key(self.limiter, key)
    }

    /// Takes `cost` units off `key`'s newest buckets.
    pub(crate) fn refund(&self, key: &[u8], cost: u64, now_us: u64) {
        let grid = self.grid;
        self.store.modify(self.key(key), |counts: &mut Counts| {
            counts.refund(grid, cost, now_us)
        });
    }

    /// Forgets `key`'s buckets.
    pub(crate) fn reset(&self, key: &[u8]) {
        self.store.remove(self.key(key));
    }

    /// Counts `cost` against `key` unless the live buckets plus `cost` would exceed
    /// `limit`; with `spend` false, only says what counting would answer.
    pub(crate) fn hit(&self, key: &[u8], cost: u64, limit: u64, now_us: u64, spend: bool) -> Hit {
        let grid = self.grid;
        let init = || Counts::new(grid.buckets);
        let step = |counts: &mut Counts| counts.hit(grid, cost, limit, now_us);
        if spend {
            self.store.update(self.key(key), init, step)
        } else {
            self.store.peek(self.key(key), init, step)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::counts::SUM;
    use super::*;
    use crate::ring::StepBack;

    fn rings() -> Rings {
        Rings::new(
            Arc::new(LocalStore::new(1_000, "t", crate::clock::Clock::new())),
            1,
            GRID,
        )
    }

    const MS: u64 = 1_000;
    /// Ten buckets of 100 ms.
    const GRID: Grid = Grid {
        buckets: 10,
        interval_us: 100 * MS,
        step_back: StepBack::Follow,
    };
    /// A bucket edge far from zero, like a real Unix time.
    const T0: u64 = 1_700_000_000_000 * MS;

    #[test]
    fn counts_within_the_window_and_frees_buckets_as_they_expire() {
        let rings = rings();
        // 3 units in bucket 0, 2 in bucket 5.
        assert!(rings.hit(b"k", 3, 5, T0, true).admitted);
        let hit = rings.hit(b"k", 2, 5, T0 + 550 * MS, true);
        assert!(hit.admitted);
        assert_eq!(hit.sum, 5);
        assert_eq!(hit.reset_us, (1_500 - 550) * MS);
        // Full: a cost of 1 waits for bucket 0 (ends at 1 s), a cost of 4 for bucket 5.
        let over = rings.hit(b"k", 1, 5, T0 + 600 * MS, true);
        assert!(!over.admitted);
        assert_eq!(over.sum, 5, "rejected hits are not counted");
        assert_eq!(over.retry_us, 400 * MS);
        assert_eq!(over.reset_us, 900 * MS);
        let over = rings.hit(b"k", 4, 5, T0 + 600 * MS, true);
        assert_eq!(over.retry_us, 900 * MS);
        // Bucket 0 has expired at 1 s: its 3 units are free again.
        assert!(!rings.hit(b"k", 1, 5, T0 + 999 * MS, true).admitted);
        let hit = rings.hit(b"k", 3, 5, T0 + 1_000 * MS, true);
        assert!(hit.admitted);
        assert_eq!(hit.sum, 5);
        // Long after, everything has expired.
        let hit = rings.hit(b"k", 5, 5, T0 + 60_000 * MS, true);
        assert!(hit.admitted);
        assert_eq!(hit.sum, 5);
    }

    #[test]
    fn advancing_clears_only_expired_slots() {
        let mut ring = Counts::new(4);
        let grid = Grid {
            buckets: 4,
            interval_us: 1,
            step_back: StepBack::Follow,
        };
        ring.advance(grid, 100);
        for i in 100..104 {
            ring.with_ring(|r, sum| {
                *r.advance(i, grid.step_back, drop) += i;
                *sum += i;
            });
        }
        assert_eq!(ring.data[SUM], 100 + 101 + 102 + 103);
        ring.advance(grid, 105);
        assert_eq!(ring.data[SUM], 102 + 103);
        assert_eq!(ring.live(), [(102, 102), (103, 103), (104, 0), (105, 0)]);
        ring.advance(grid, 1_000);
        assert_eq!(ring.data[SUM], 0);
    }

    #[test]
    fn a_step_back_keeps_every_count() {
        let mut ring = Counts::new(GRID.buckets);
        // 5 units spread over the window, then the clock steps back an hour.
        for i in 0..5 {
            assert!(ring.hit(GRID, 1, 5, T0 + i * 200 * MS).admitted);
        }
        let back = T0 + 800 * MS - 3_600_000 * MS;
        let over = ring.hit(GRID, 1, 5, back);
        assert!(!over.admitted, "a step back must not free anything");
        assert_eq!(over.sum, 5);
        // The step counted as no time: the oldest unit (800 ms old) frees 200 ms later.
        assert_eq!(over.retry_us, 200 * MS);
        assert!(!ring.hit(GRID, 1, 5, back + 199 * MS).admitted);
        assert!(ring.hit(GRID, 1, 5, back + 200 * MS).admitted);
        // A step back by less than the window, and by a whole number of windows.
        let mut ring = Counts::new(GRID.buckets);
        assert!(ring.hit(GRID, 5, 5, T0).admitted);
        for step in [300 * MS, 1_000 * MS, 20_000 * MS] {
            let hit = ring.hit(GRID, 1, 5, T0 - step);
            assert!(!hit.admitted, "{step}");
            assert_eq!(hit.sum, 5);
        }
    }

    #[test]
    fn callers_clocks_hold_the_newest_bucket() {
        // As `rolling.lua` with the callers' clocks: a caller behind the newest bucket
        // counts in it, and nothing moves back.
        let grid = Grid {
            step_back: StepBack::Hold,
            ..GRID
        };
        let mut ring = Counts::new(GRID.buckets);
        assert!(ring.hit(grid, 3, 5, T0 + 500 * MS).admitted);
        let hit = ring.hit(grid, 2, 5, T0 + 200 * MS);
        assert!(hit.admitted);
        assert_eq!(hit.sum, 5);
        // The newest bucket ends at 1.5 s, 1.3 s after this caller's time.
        assert_eq!(hit.reset_us, 1_300 * MS);
        let over = ring.hit(grid, 1, 5, T0 + 200 * MS);
        assert!(!over.admitted);
        assert_eq!(over.retry_us, 1_300 * MS);
        assert!(!ring.hit(grid, 1, 5, T0 + 1_499 * MS).admitted);
        assert!(ring.hit(grid, 5, 5, T0 + 1_500 * MS).admitted);
    }

    #[test]
    fn a_step_forward_at_most_expires_the_window_early() {
        let mut ring = Counts::new(GRID.buckets);
        assert!(ring.hit(GRID, 5, 5, T0).admitted);
        assert!(!ring.hit(GRID, 1, 5, T0 + 500 * MS).admitted);
        let hit = ring.hit(GRID, 5, 5, T0 + 3_600_000 * MS);
        assert!(hit.admitted);
        assert_eq!(hit.sum, 5);
    }

    #[test]
    fn rotating_keeps_each_count_in_its_bucket() {
        let grid = Grid {
            buckets: 4,
            interval_us: 1,
            step_back: StepBack::Follow,
        };
        let mut ring = Counts::new(4);
        for i in 100..104 {
            ring.hit(grid, i - 99, 100, i);
        }
        // Back by 9 buckets: bucket 103 becomes 94, 100 becomes 91.
        ring.advance(grid, 94);
        assert_eq!(ring.live(), [(91, 1), (92, 2), (93, 3), (94, 4)]);
        ring.advance(grid, 95);
        assert_eq!(ring.data[SUM], 2 + 3 + 4);
    }
}
