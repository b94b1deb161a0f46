//! The in-process fixed windows: one counter and deadline per key, expired windows swept
//! on a schedule so memory follows the keys active within one period.

use std::sync::Arc;

use dashmap::DashMap;

use crate::local::{self, Sweep};

/// How a window's deadline is chosen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    pub(crate) period_us: u64,
    /// Align window ends to multiples of the period in this UTC offset.
    pub(crate) offset_us: Option<i64>,
}

impl Schedule {
    /// The end of a window that starts at `now_us`.
    pub(crate) fn window_end(&self, now_us: u64) -> u64 {
        match self.offset_us {
            None => now_us.saturating_add(self.period_us),
            Some(offset) => {
                let period = i128::from(self.period_us);
                let local = i128::from(now_us) + i128::from(offset);
                let into = local.rem_euclid(period);
                let end = i128::from(now_us) - into + period;
                u64::try_from(end).unwrap_or(u64::MAX)
            }
        }
    }
}

#[derive(Debug)]
struct Window {
    count: u64,
    ends_at_us: u64,
}

/// The outcome of one hit: the count after it, the window end, and whether it fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    pub(crate) count: u64,
    pub(crate) ends_at_us: u64,
    pub(crate) admitted: bool,
}

#[derive(Debug)]
pub(crate) struct Windows {
    map: Arc<DashMap<Box<[u8]>, Window>>,
    sweep: Sweep,
}

impl Windows {
    pub(crate) fn new(period_us: u64) -> Self {
        Self {
            map: Arc::default(),
            sweep: Sweep::every(period_us.clamp(1_000_000, 60_000_000)),
        }
    }

    /// Counts `cost` against `key` unless it would exceed `quota` (rejected hits are not
    /// counted, as in the Redis script).
    pub(crate) fn hit(
        &self,
        key: &[u8],
        cost: u64,
        quota: u64,
        schedule: Schedule,
        now_us: u64,
    ) -> Hit {
        local::sweep(&self.sweep, &self.map, now_us, move |_, w| {
            w.ends_at_us > now_us
        });
        let apply = |w: &mut Window| {
            if w.ends_at_us <= now_us {
                w.count = 0;
                w.ends_at_us = schedule.window_end(now_us);
            }
            let admitted = w.count + cost <= quota;
            if admitted {
                w.count += cost;
            }
            Hit {
                count: w.count,
                ends_at_us: w.ends_at_us,
                admitted,
            }
        };
        let new = || Window {
            count: 0,
            ends_at_us: 0,
        };
        local::update(&self.map, key, new, apply)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
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
        };
        // 2026-11-22T15:30:00Z is 23:30 in UTC+8: the window ends 30 minutes later.
        let now = 1_795_361_400 * SEC;
        assert_eq!(schedule.window_end(now), now + 1_800 * SEC);
        let west = Schedule {
            period_us: day,
            offset_us: Some(-5 * 3_600 * 1_000_000),
        };
        // 15:30Z is 10:30 in UTC-5: 13.5 hours to go.
        assert_eq!(west.window_end(now), now + 48_600 * SEC);
    }

    #[test]
    fn counts_resets_and_sweeps() {
        let windows = Windows::new(SEC);
        let schedule = Schedule {
            period_us: SEC,
            offset_us: None,
        };
        let t0 = 10 * SEC;
        for i in 1..=3 {
            let hit = windows.hit(b"k", 1, 3, schedule, t0);
            assert!(hit.admitted);
            assert_eq!(hit.count, i);
        }
        let over = windows.hit(b"k", 1, 3, schedule, t0 + 10);
        assert!(!over.admitted);
        assert_eq!(over.count, 3, "rejected hits are not counted");
        let next = windows.hit(b"k", 1, 3, schedule, t0 + SEC);
        assert!(next.admitted);
        assert_eq!(next.count, 1);
        assert_eq!(next.ends_at_us, t0 + 2 * SEC);
        windows.hit(b"other", 1, 3, schedule, t0 + SEC);
        assert_eq!(windows.len(), 2);
        // Long after both windows ended, the next hit sweeps them away.
        windows.hit(b"third", 1, 3, schedule, t0 + 100 * SEC);
        assert_eq!(windows.len(), 1);
    }
}
