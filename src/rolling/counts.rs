//! One key's rolling window, a pure step with the same semantics as `rolling.lua`:
//! (state, now, cost, settings) -> (state, outcome), on a [`Ring`] of counts; what the
//! backend's [local store](crate::local) keeps per key, with no access to the store
//! itself ([`Rings`](super::memory::Rings) does that).

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
    pub(super) data: Box<[u64]>,
}

const NEWEST: usize = 0;
pub(super) const SUM: usize = 1;
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

    /// The sum of the counts (as of the ring's newest bucket).
    pub(crate) fn sum(&self) -> u64 {
        self.data[SUM]
    }

    /// Runs `f` on the ring and the sum, then stores the ring's newest index back.
    pub(super) fn with_ring<R>(
        &mut self,
        f: impl FnOnce(&mut Ring<&mut [u64]>, &mut u64) -> R,
    ) -> R {
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
    pub(super) fn advance(&mut self, grid: Grid, current: u64) {
        self.with_ring(|ring, sum| {
            ring.advance(current, grid.step_back, |count| *sum -= count);
        });
    }

    /// The buckets, oldest first, as (index, count).
    #[cfg(test)]
    pub(super) fn live(&self) -> Vec<(u64, u64)> {
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
