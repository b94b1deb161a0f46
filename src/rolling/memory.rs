//! The in-process rolling windows: per key, a ring of `buckets` counters and the absolute
//! index of the newest bucket, with the same semantics as `rolling.lua`. Keys whose
//! buckets have all expired are swept on a schedule, so memory follows the keys active
//! within one window.

use std::sync::Arc;

use dashmap::DashMap;

use crate::local::{self, Sweep};

/// The bucket grid: `buckets` buckets of `interval_us`, bucket `i` covering
/// `[i * interval_us, (i + 1) * interval_us)` in Unix microseconds (the same edges as the
/// Redis script's millisecond grid).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grid {
    pub(crate) buckets: u64,
    pub(crate) interval_us: u64,
}

impl Grid {
    fn index(self, now_us: u64) -> u64 {
        now_us / self.interval_us
    }

    /// When bucket `index` stops counting.
    fn end_of_life_us(self, index: u64) -> u64 {
        index
            .saturating_add(self.buckets)
            .saturating_mul(self.interval_us)
    }
}

/// One key's buckets.
#[derive(Debug)]
struct Ring {
    /// Bucket `i` lives in slot `i % buckets`.
    counts: Box<[u64]>,
    /// The absolute index of the newest bucket; the live ones are
    /// `newest - buckets + 1 ..= newest`.
    newest: u64,
    /// The sum of `counts`.
    sum: u64,
}

impl Ring {
    fn new(buckets: u64) -> Self {
        let len = usize::try_from(buckets).expect("at most 1000 buckets");
        Self {
            counts: vec![0; len].into_boxed_slice(),
            newest: 0,
            sum: 0,
        }
    }

    fn slot(&self, grid: Grid, index: u64) -> usize {
        // The remainder is below `buckets`, which fits in a usize.
        (index % grid.buckets) as usize
    }

    /// Moves the newest bucket to `current`, clearing the buckets that expired in
    /// between (at most `buckets` of them).
    fn advance(&mut self, grid: Grid, current: u64) {
        if current <= self.newest {
            return;
        }
        let expired = (current - self.newest).min(grid.buckets);
        for step in 1..=expired {
            let slot = self.slot(grid, self.newest + step);
            self.sum -= self.counts[slot];
            self.counts[slot] = 0;
        }
        self.newest = current;
    }

    /// The live buckets, oldest first, as (index, count).
    fn live(&self, grid: Grid) -> impl Iterator<Item = (u64, u64)> + '_ {
        let oldest = self.newest.saturating_sub(grid.buckets - 1);
        (oldest..=self.newest).map(move |index| (index, self.counts[self.slot(grid, index)]))
    }
}

/// The outcome of one hit, in microseconds from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    pub(crate) admitted: bool,
    /// The sum of the live buckets after the hit.
    pub(crate) sum: u64,
    /// For a rejected hit: the time until enough old buckets expire to admit its cost.
    pub(crate) retry_us: u64,
    /// The time until every counted unit has expired.
    pub(crate) reset_us: u64,
}

#[derive(Debug)]
pub(crate) struct Rings {
    map: Arc<DashMap<Box<[u8]>, Ring>>,
    grid: Grid,
    sweep: Sweep,
}

impl Rings {
    pub(crate) fn new(grid: Grid) -> Self {
        let window_us = grid.buckets.saturating_mul(grid.interval_us);
        Self {
            map: Arc::default(),
            grid,
            sweep: Sweep::every(window_us.clamp(1_000_000, 60_000_000)),
        }
    }

    /// Counts `cost` against `key` unless the live buckets plus `cost` would exceed
    /// `limit` (rejected hits are not counted, as in the Redis script).
    pub(crate) fn hit(&self, key: &[u8], cost: u64, limit: u64, now_us: u64) -> Hit {
        let grid = self.grid;
        local::sweep(&self.sweep, &self.map, now_us, move |_, ring| {
            ring.sum > 0 && grid.end_of_life_us(ring.newest) > now_us
        });
        let current = grid.index(now_us);
        let apply = |ring: &mut Ring| {
            ring.advance(grid, current);
            if ring.sum.checked_add(cost).is_some_and(|sum| sum <= limit) {
                let slot = ring.slot(grid, ring.newest);
                ring.counts[slot] += cost;
                ring.sum += cost;
                return Hit {
                    admitted: true,
                    sum: ring.sum,
                    retry_us: 0,
                    reset_us: grid.end_of_life_us(ring.newest).saturating_sub(now_us),
                };
            }
            // The oldest buckets expire first: find the one whose expiry frees enough.
            let need = ring.sum.saturating_add(cost) - limit;
            let mut freed = 0u64;
            let mut frees_enough = None;
            let mut newest_used = None;
            for (index, count) in ring.live(grid) {
                if count == 0 {
                    continue;
                }
                freed = freed.saturating_add(count);
                if frees_enough.is_none() && freed >= need {
                    frees_enough = Some(index);
                }
                newest_used = Some(index);
            }
            let from_now = |index: u64| grid.end_of_life_us(index).saturating_sub(now_us);
            Hit {
                admitted: false,
                sum: ring.sum,
                // A cost above the limit (only possible for the fallback's share of the
                // limit) cannot pass here: try again in a window, Redis may be back.
                retry_us: frees_enough.map_or(grid.buckets * grid.interval_us, from_now),
                reset_us: newest_used.map_or(0, from_now),
            }
        };
        local::update(&self.map, key, || Ring::new(grid.buckets), apply)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;
    /// Ten buckets of 100 ms.
    const GRID: Grid = Grid {
        buckets: 10,
        interval_us: 100 * MS,
    };
    /// A bucket edge far from zero, like a real Unix time.
    const T0: u64 = 1_700_000_000_000 * MS;

    #[test]
    fn counts_within_the_window_and_frees_buckets_as_they_expire() {
        let rings = Rings::new(GRID);
        // 3 units in bucket 0, 2 in bucket 5.
        assert!(rings.hit(b"k", 3, 5, T0).admitted);
        let hit = rings.hit(b"k", 2, 5, T0 + 550 * MS);
        assert!(hit.admitted);
        assert_eq!(hit.sum, 5);
        assert_eq!(hit.reset_us, (1_500 - 550) * MS);
        // Full: a cost of 1 waits for bucket 0 (ends at 1 s), a cost of 4 for bucket 5.
        let over = rings.hit(b"k", 1, 5, T0 + 600 * MS);
        assert!(!over.admitted);
        assert_eq!(over.sum, 5, "rejected hits are not counted");
        assert_eq!(over.retry_us, 400 * MS);
        assert_eq!(over.reset_us, 900 * MS);
        let over = rings.hit(b"k", 4, 5, T0 + 600 * MS);
        assert_eq!(over.retry_us, 900 * MS);
        // Bucket 0 has expired at 1 s: its 3 units are free again.
        assert!(!rings.hit(b"k", 1, 5, T0 + 999 * MS).admitted);
        let hit = rings.hit(b"k", 3, 5, T0 + 1_000 * MS);
        assert!(hit.admitted);
        assert_eq!(hit.sum, 5);
        // Long after, everything has expired.
        let hit = rings.hit(b"k", 5, 5, T0 + 60_000 * MS);
        assert!(hit.admitted);
        assert_eq!(hit.sum, 5);
    }

    #[test]
    fn advancing_clears_only_expired_slots() {
        let mut ring = Ring::new(4);
        let grid = Grid {
            buckets: 4,
            interval_us: 1,
        };
        ring.advance(grid, 100);
        for i in 100..104 {
            ring.advance(grid, i);
            let slot = ring.slot(grid, i);
            ring.counts[slot] += i;
            ring.sum += i;
        }
        assert_eq!(ring.sum, 100 + 101 + 102 + 103);
        ring.advance(grid, 105);
        assert_eq!(ring.sum, 102 + 103);
        assert_eq!(
            ring.live(grid).collect::<Vec<_>>(),
            [(102, 102), (103, 103), (104, 0), (105, 0)]
        );
        ring.advance(grid, 1_000);
        assert_eq!(ring.sum, 0);
    }

    #[test]
    fn sweeps_keys_whose_buckets_all_expired() {
        let rings = Rings::new(GRID);
        rings.hit(b"a", 1, 5, T0);
        rings.hit(b"b", 1, 5, T0 + 500 * MS);
        assert_eq!(rings.len(), 2);
        // At 1.2 s "a" has expired (its bucket ended at 1 s), "b" has not; the first
        // sweep ran at T0, the next is due one second later.
        rings.hit(b"c", 1, 5, T0 + 1_200 * MS);
        assert_eq!(rings.len(), 2);
        rings.hit(b"c", 1, 5, T0 + 3_000 * MS);
        assert_eq!(rings.len(), 1);
    }
}
