//! One key's fixed window, a pure step (state, now, cost, settings) -> (state, outcome):
//! what the backend's [local store](crate::local) keeps per key, with no access to the
//! store itself ([`Windows`](super::memory::Windows) does that).

use super::calendar::Bounds;

/// How a window's deadline is chosen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// The period; for a calendar window, the length of the window holding the clock's
    /// time (as the engine takes it).
    pub(crate) period_us: u64,
    /// Align window ends to multiples of the period in this UTC offset.
    pub(crate) offset_us: Option<i64>,
    /// Calendar windows: the boundaries around the clock's time.
    pub(crate) calendar: Option<Bounds>,
}

impl Schedule {
    /// The end of a window that starts at `now_us`.
    pub(crate) fn window_end(&self, now_us: u64) -> u64 {
        if let Some(bounds) = self.calendar {
            let now_ms = i64::try_from(now_us / 1_000).unwrap_or(i64::MAX);
            let (end_ms, length_ms) = bounds.window(now_ms);
            return if bounds.0[0] <= now_ms && now_ms < bounds.0[3] {
                u64::try_from(end_ms).unwrap_or(0).saturating_mul(1_000)
            } else {
                // Beyond the boundaries: one window's length from now on.
                now_us.saturating_add(u64::try_from(length_ms).unwrap_or(0) * 1_000)
            };
        }
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

/// One key's window: its count, its end in the key's time, and how far the key's time
/// runs ahead of the clock after the clock stepped back (0 on a monotonic clock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Window {
    count: u64,
    ends_at_us: u64,
    skew_us: u64,
}

/// The outcome of one hit: the count after it, the window end, and whether it fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    pub(crate) count: u64,
    pub(crate) ends_at_us: u64,
    pub(crate) admitted: bool,
}

impl Window {
    /// Whether the window open at `now_us` has counted anything (one that has ended
    /// counts nothing any more).
    pub(crate) fn carries(&self, now_us: u64) -> bool {
        self.count > 0 && self.ends_at_us > now_us.saturating_add(self.skew_us)
    }

    /// Counts `cost` unless it would exceed `quota` (rejected hits are not counted, as in
    /// the Redis script). A window that has ended starts a new one. `Hit::ends_at_us` is
    /// the window's end on the clock of `now_us`.
    ///
    /// Clock steps (as in `period.lua`): a window that ends more than one period after
    /// `now_us` means the clock stepped back. The key's time is then the later of the
    /// clock plus the key's skew and the window's end minus one period, and the skew is
    /// kept: the count is kept (never admitting more than the quota), the window ends
    /// within one period of the step, and the window's end stays in the key's time, so
    /// the clock's return finds the window as the key left it. Once the end is within a
    /// period of the clock again, the skew is dropped. A step forward ends the window
    /// early.
    pub(crate) fn hit(&mut self, cost: u64, quota: u64, schedule: Schedule, now_us: u64) -> Hit {
        let skew = match self.ends_at_us.checked_sub(now_us) {
            Some(ttl) if ttl > schedule.period_us => self.skew_us.max(ttl - schedule.period_us),
            _ => 0,
        };
        self.skew_us = skew;
        let now_us_key = now_us.saturating_add(skew);
        if self.ends_at_us <= now_us_key {
            self.count = 0;
            self.ends_at_us = schedule.window_end(now_us_key);
        }
        let admitted = self.count.saturating_add(cost) <= quota;
        if admitted {
            self.count += cost;
        }
        Hit {
            count: self.count,
            ends_at_us: self.ends_at_us - skew,
            admitted,
        }
    }
}

impl Window {
    /// Gives `cost` units back to the window open at `now_us`; a window it empties is
    /// forgotten (the next hit starts a new one), as in the script.
    pub(crate) fn refund(&mut self, cost: u64, now_us: u64) {
        if self.ends_at_us > now_us && self.count > 0 {
            if self.count <= cost {
                *self = Self::default();
            } else {
                self.count -= cost;
            }
        }
    }
}
