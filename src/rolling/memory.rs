//! The rolling-window limiter's in-process host: per key, a [`Ring`] of `buckets` counts
//! on a Unix-time grid plus their sum, in the backend's bounded [local store](crate::local).
//!
//! [`Counts::hit`] is the whole algorithm, a pure step with the same semantics as
//! `rolling.lua`: (state, now, cost, settings) -> (state, outcome).

use std::sync::Arc;

use crate::local::{Key, LocalStore};
use crate::ring::{Ring, StepBack};

/// The bucket grid: `buckets` buckets of `interval_us`, bucket `i` covering
/// `[i * interval_us, (i + 1) * interval_us)` in Unix microseconds (the same edges as the
/// Redis script's millisecond grid).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grid {
    pub(crate) buckets: u64,
    pub(crate) interval_us: u64,
    /// [`StepBack::Follow`] for one clock (the in-process clock, the Redis server's:
    /// after a step back the key's time runs ahead of the clock, see [`Counts::hit`]),
    /// [`StepBack::Hold`] for the callers' clocks.
    pub(crate) step_back: StepBack,
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

/// One key's counts: a [`Ring`] of `buckets` counts and their sum.
#[derive(Debug, Clone)]
pub(crate) struct Counts {
    /// One allocation: `[newest, sum, skew, counts...]`, so that a key's state is a
    /// (fat) pointer in the store. `newest` and `counts` are the ring's
    /// [parts](Ring::from_parts), `sum` the sum of the counts, `skew` how many buckets
    /// the key's time runs ahead of the clock after the clock stepped back.
    data: Box<[u64]>,
}

const NEWEST: usize = 0;
const SUM: usize = 1;
const SKEW: usize = 2;
const COUNTS: usize = 3;

impl Counts {
    pub(crate) fn new(buckets: u64) -> Self {
        let len = usize::try_from(buckets).expect("at most 1000 buckets");
        Self {
            data: vec![0; COUNTS + len].into_boxed_slice(),
        }
    }

    /// How many buckets the ring holds.
    pub(crate) fn len(&self) -> usize {
        self.data.len() - COUNTS
    }

    /// Runs `f` on the ring and the sum, then stores the ring's newest index back.
    fn with_ring<R>(&mut self, f: impl FnOnce(&mut Ring<&mut [u64]>, &mut u64) -> R) -> R {
        let (head, counts) = self.data.split_at_mut(COUNTS);
        let mut ring =
            Ring::from_parts(head[NEWEST], counts).expect("a limiter has at least one bucket");
        let result = f(&mut ring, &mut head[SUM]);
        head[NEWEST] = ring.newest();
        result
    }

    /// Moves the ring to bucket `current` (see [`Ring::advance`]), taking the counts that
    /// expired off the sum.
    #[cfg(test)]
    fn advance(&mut self, grid: Grid, current: u64) {
        self.with_ring(|ring, sum| {
            ring.advance(current, grid.step_back, |count| *sum -= count);
        });
    }

    /// The buckets, oldest first, as (index, count).
    #[cfg(test)]
    fn live(&self) -> Vec<(u64, u64)> {
        let newest = self.data[NEWEST];
        let len = self.len() as u64;
        let ring = Ring::from_parts(newest, &self.data[COUNTS..]).expect("not empty");
        ring.iter()
            .zip(0..)
            .map(|(&count, k)| ((newest + k + 1).wrapping_sub(len), count))
            .collect()
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

impl Counts {
    /// Takes `cost` units off the buckets live at `now_us`, newest first (the units
    /// spent last), as the script does.
    pub(crate) fn refund(&mut self, grid: Grid, cost: u64, now_us: u64) {
        let current = grid.index(now_us).saturating_add(self.data[SKEW]);
        self.with_ring(|ring, sum| {
            let live = ring.size() - ring.expired_at(current);
            let mut left = cost;
            for count in ring.iter_mut().rev().take(live) {
                if left == 0 {
                    break;
                }
                let take = left.min(*count);
                *count -= take;
                *sum -= take;
                left -= take;
            }
        });
    }
}

impl Counts {
    /// The index of the newest bucket holding a count, if any.
    fn newest_counted(&self) -> Option<u64> {
        let newest = self.data[NEWEST];
        let len = self.len() as u64;
        (0..len.min(newest.saturating_add(1)))
            .map(|k| newest - k)
            .find(|&index| self.data[COUNTS + (index % len) as usize] > 0)
    }

    /// The key's current bucket at the clock's bucket `server`, and the key's skew in
    /// buckets (as in `rolling.lua`): a bucket holding a count newer than `server` means
    /// the clock stepped back, and the key's time is then the later of the clock plus
    /// the stored skew and that bucket. Once the clock reaches the newest counted bucket
    /// again, the skew is dropped.
    fn key_index(&self, server: u64) -> (u64, u64) {
        if self.data[NEWEST] <= server {
            return (server, 0);
        }
        match self.newest_counted() {
            Some(newest) if newest > server => {
                let skew = self.data[SKEW].max(newest - server);
                (server.saturating_add(skew), skew)
            }
            _ => (server, 0),
        }
    }

    /// Counts `cost` unless the live buckets plus `cost` would exceed `limit` (rejected
    /// hits are not counted, as in the Redis script).
    ///
    /// When the clock stepped back (`now_us` before the newest counted bucket), the
    /// key's time moves up to that bucket and runs on at the clock's rate from there
    /// (see [`key_index`](Self::key_index)); the buckets stay where they are, in the
    /// key's time: the step counts as no time at all, so it never frees a unit early,
    /// and the clock's return finds the buckets as the key left them (as in
    /// `rolling.lua`). With [`StepBack::Hold`] (the script with the callers' clocks) the
    /// hit counts in the newest bucket.
    pub(crate) fn hit(&mut self, grid: Grid, cost: u64, limit: u64, now_us: u64) -> Hit {
        let mut current = grid.index(now_us);
        let mut now_us = now_us;
        if grid.step_back == StepBack::Follow {
            let (key_current, skew) = self.key_index(current);
            self.data[SKEW] = skew;
            now_us = now_us.saturating_add(skew.saturating_mul(grid.interval_us));
            current = key_current;
            // Buckets newer than the key's current one hold no count (the ring moved to
            // them for refused hits, which the script does not write): the ring's newest
            // bucket comes back to the current one, every bucket staying in its slot.
            if current < self.data[NEWEST] {
                self.data[NEWEST] = current;
            }
        }
        self.with_ring(|ring, sum| {
            let newest = ring.advance(current, grid.step_back, |count| *sum -= count);
            if sum.checked_add(cost).is_some_and(|after| after <= limit) {
                *newest += cost;
                *sum += cost;
                return Hit {
                    admitted: true,
                    sum: *sum,
                    retry_us: 0,
                    reset_us: grid.end_of_life_us(ring.newest()).saturating_sub(now_us),
                };
            }
            // The oldest buckets expire first: find the one whose expiry frees enough.
            // The k-th bucket (oldest first) stops counting at `newest + k + 1` intervals.
            let need = sum.saturating_add(cost) - limit;
            let mut freed = 0u64;
            let mut frees_enough = None;
            let mut newest_used = None;
            for (k, &count) in (0u64..).zip(ring.iter()) {
                if count == 0 {
                    continue;
                }
                freed = freed.saturating_add(count);
                if frees_enough.is_none() && freed >= need {
                    frees_enough = Some(k);
                }
                newest_used = Some(k);
            }
            let from_now = |k: u64| {
                ring.newest()
                    .saturating_add(k + 1)
                    .saturating_mul(grid.interval_us)
                    .saturating_sub(now_us)
            };
            Hit {
                admitted: false,
                sum: *sum,
                // A cost above the limit (only possible for the fallback's share of the
                // limit) cannot pass here: try again in a window, Redis may be back.
                retry_us: frees_enough.map_or(grid.buckets * grid.interval_us, from_now),
                reset_us: newest_used.map_or(0, from_now),
            }
        })
    }
}

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
    use super::*;

    fn rings() -> Rings {
        Rings::new(Arc::new(LocalStore::new(1_000, "t")), 1, GRID)
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
