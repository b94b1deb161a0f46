//! What the reference model of `tests/model.rs` keeps of one limit, and how each
//! algorithm decides on it at a time of its host's clock, clock steps included.
//!
//! Times are milliseconds of the host's clocks ([`Clock`]): the monotonic one in
//! process (never stepped); on Redis the server's (stepped back and forward by the
//! test), which keys expire by, and the one the algorithm reads: the server's too, or
//! with the callers' clocks the caller's. Each key keeps the newest time it has seen as
//! the documented rules say (the "Clocks" sections of `src/period`, `src/token_bucket`
//! and `src/rolling`): its time is the server's plus a skew, stored with its state, and
//! its Redis expiry is a time of the server's clock, so a key expired on that clock is
//! gone, skew and all. With the callers' clocks there is no skew: a caller behind reads
//! a TAT as at most an empty bucket and counts from a rolling window's newest bucket,
//! and a window's end more than a period away is cut to one period.

use std::collections::BTreeMap;

use super::{answer, div_ceil, Answer, Limit};

/// The clocks of one operation (ms): the Redis server's (or the in-process host's),
/// which keys expire by, and the one the algorithm reads: the same, or with the
/// callers' clocks (`caller`), the caller's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    pub(crate) server: u64,
    pub(crate) now: u64,
    pub(crate) caller: bool,
}

/// A fixed window's key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    count: u64,
    /// The key's expiry (the window's end as a time of the host's clock).
    end: u64,
    /// The stored skew (ms).
    skew: u64,
}

/// A token bucket's key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    /// The theoretical arrival time in the key's time, in µs × rate (exact).
    tat: u128,
    /// The stored skew (µs).
    skew: u64,
    /// The stored floor (µs of the key's time), written with a TAT beyond a full burst.
    floor: Option<u128>,
    /// The key's expiry (ms of the host's clock).
    expiry: u64,
}

/// A rolling window's key.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ring {
    /// Count per bucket index (of the key's time).
    counts: BTreeMap<u64, u64>,
    /// The stored skew (buckets).
    skew: u64,
    /// The key's expiry (ms of the host's clock).
    expiry: u64,
}

/// One limit's state.
#[derive(Debug, Clone)]
pub(crate) enum Kept {
    Window(Option<Window>),
    Tat(Option<Bucket>),
    Buckets(Ring),
}

/// The next edge after `now` of the periods counted from midnight at `offset` (s).
fn edge(now: u64, period_ms: u64, offset: i32) -> u64 {
    let local = i128::from(now) + i128::from(offset) * 1_000;
    let into = local.rem_euclid(i128::from(period_ms));
    now - u64::try_from(into).expect("small") + period_ms
}

/// A fixed window as a check reads it at `t`.
struct WindowView {
    count: u64,
    /// Until the window ends, in the key's time.
    rem: u64,
    skew: u64,
    stored: u64,
    fresh: bool,
    /// The callers' clocks: an end more than a period away, cut to one period.
    cut: bool,
}

impl WindowView {
    fn at(window: Option<Window>, limit: Limit, c: Clock) -> Self {
        let Limit::Period {
            period_ms, align, ..
        } = limit
        else {
            unreachable!("a fixed window")
        };
        let live = window.filter(|w| w.end > c.server);
        let (mut count, stored) = live.map_or((0, 0), |w| (w.count, w.skew));
        let ttl = live.map_or(0, |w| w.end - c.server);
        let (mut skew, mut rem, mut fresh) = (0, ttl, live.is_none());
        let cut = !fresh && ttl > period_ms && c.caller;
        if cut {
            // The callers' clocks: cut to one period (written by a writing step).
            rem = period_ms;
        } else if !fresh && ttl > period_ms {
            // An end more than a period away: the clock stepped back. The key's time is
            // at least the window's end minus a period, running on from there.
            skew = stored.max(ttl - period_ms);
            rem = ttl.saturating_sub(skew);
            fresh = rem == 0;
        }
        if fresh {
            count = 0;
            let key_now = c.now + skew;
            rem = match align {
                None => period_ms,
                Some(offset) => edge(key_now, period_ms, offset) - key_now,
            };
        }
        Self {
            count,
            rem,
            skew,
            stored,
            fresh,
            cut,
        }
    }

    /// Whether a writing step writes the key even if it adds nothing.
    fn rekey(&self) -> bool {
        self.cut || self.skew != self.stored
    }

    /// Writes `added` units and the skew (`rekey`: it changed) as the key stores them.
    fn save(&self, window: &mut Option<Window>, c: Clock, added: u64, rekey: bool) {
        let t = c.server;
        if self.cut && rekey {
            // Cut to one period from now, the count kept (and what this step added).
            let w = window.as_mut().expect("a live window");
            w.count = self.count + added;
            w.end = t + self.rem;
            return;
        }
        if self.skew > 0 || self.stored > 0 {
            if self.fresh {
                if added > 0 {
                    *window = Some(Window {
                        count: added,
                        end: t + self.rem + self.skew,
                        skew: self.skew,
                    });
                }
            } else if added > 0 || rekey {
                // The expiry is kept.
                let w = window.as_mut().expect("a live window");
                w.count = self.count + added;
                w.skew = self.skew;
            }
            return;
        }
        if added == 0 {
            return;
        }
        *window = Some(match *window {
            Some(w) if !self.fresh => Window {
                count: w.count + added,
                ..w
            },
            _ => Window {
                count: added,
                end: t + self.rem,
                skew: 0,
            },
        });
    }
}

fn bucket_params(limit: Limit) -> (u128, u128, u128, u64) {
    let Limit::Bucket {
        rate,
        period_ms,
        burst,
    } = limit
    else {
        unreachable!("a token bucket")
    };
    // In µs × rate: the emission interval is the period in µs, exactly.
    let interval = u128::from(period_ms) * 1_000;
    (
        u128::from(rate),
        interval,
        interval * u128::from(burst),
        burst,
    )
}

/// A token bucket as a check reads it at `t`: the key's time and its TAT (at least it).
struct BucketView {
    now: u128,
    tat: u128,
    skew: u64,
    stored: u64,
}

impl BucketView {
    fn at(bucket: Option<Bucket>, limit: Limit, c: Clock) -> Self {
        let (rate, _, tau, _) = bucket_params(limit);
        let live = bucket.filter(|b| b.expiry >= c.server);
        let read = u128::from(c.now) * 1_000 * rate;
        let stored = live.map_or(0, |b| b.skew);
        let (mut now, mut skew) = (read, 0);
        if let Some(b) = live.filter(|_| !c.caller) {
            // The floor: the earliest time the state proves the key has seen.
            let floor = b.floor.map_or(b.tat.saturating_sub(tau), |f| f * rate);
            if now < floor {
                skew = stored.max(u64::try_from(div_ceil(floor - now, rate)).expect("small"));
                now = read + u128::from(skew) * rate;
            }
        }
        let tat = live.map_or(now, |b| b.tat.max(now));
        Self {
            now,
            tat,
            skew,
            stored,
        }
    }

    /// With the callers' clocks, a caller's view of the TAT: never beyond an empty bucket.
    fn clamped(&self, limit: Limit, c: Clock) -> u128 {
        let (_, _, tau, _) = bucket_params(limit);
        if c.caller {
            self.tat.min(self.now + tau)
        } else {
            self.tat
        }
    }

    fn store(&self, bucket: &mut Option<Bucket>, limit: Limit, c: Clock, tat: u128) {
        let (rate, _, tau, _) = bucket_params(limit);
        let read = u128::from(c.now) * 1_000 * rate;
        // Kept until the TAT as a time of the clock read (whole ms, at least one); with
        // the callers' clocks, a full refill (at least 1 s) longer.
        let mut ttl = div_ceil(tat - read, 1_000 * rate).max(1);
        if c.caller {
            ttl += div_ceil(tau, 1_000 * rate).max(1_000);
        }
        *bucket = Some(Bucket {
            tat,
            skew: self.skew,
            floor: (!c.caller && tat > tau + self.now).then(|| self.now / rate),
            expiry: c.server + u64::try_from(ttl).expect("small"),
        });
    }
}

impl Ring {
    fn expire(&mut self, t: u64) {
        if t > self.expiry {
            *self = Self::default();
        }
    }

    /// The key's current bucket and time at `t`, and its skew (buckets).
    fn current(&self, interval_ms: u64, c: Clock) -> (u64, u64, u64) {
        let current = c.now / interval_ms;
        match self.counts.keys().next_back() {
            // The callers' clocks: a caller behind counts from the newest bucket.
            Some(&newest) if newest > current && c.caller => (newest, c.now, 0),
            Some(&newest) if newest > current => {
                let skew = self.skew.max(newest - current);
                (current + skew, c.now + skew * interval_ms, skew)
            }
            _ => (current, c.now, 0),
        }
    }

    /// A writing step: dead buckets deleted, the skew stored, `added` counted.
    fn save(&mut self, limit: Limit, c: Clock, added: u64) {
        let Limit::Rolling {
            buckets,
            interval_ms,
            ..
        } = limit
        else {
            unreachable!("a rolling window")
        };
        let (current, _, skew) = self.current(interval_ms, c);
        // The expiry is set when the current bucket starts, but for an odd bucket after
        // the even one the key holds (whose start set an expiry reaching this one's
        // end); with a skew (or one dropped now) and with the callers' clocks, at every
        // write.
        let before = current
            .checked_sub(1)
            .is_some_and(|b| self.counts.contains_key(&b));
        let stored = self.skew;
        self.counts.retain(|&index, _| index + buckets > current);
        self.skew = skew;
        if added > 0 {
            let starts = !self.counts.contains_key(&current);
            *self.counts.entry(current).or_default() += added;
            let kept = before && current % 2 == 1;
            if c.caller || skew > 0 || stored > 0 || (starts && !kept) {
                self.expiry = c.server + (buckets + 1 + skew) * interval_ms;
            }
        }
    }
}

impl Kept {
    pub(crate) fn new(limit: Limit) -> Self {
        match limit {
            Limit::Period { .. } => Self::Window(None),
            Limit::Bucket { .. } => Self::Tat(None),
            Limit::Rolling { .. } => Self::Buckets(Ring::default()),
        }
    }

    /// Forgets the key if it expired before `t`.
    pub(crate) fn expire(&mut self, t: u64) {
        match self {
            Self::Window(window) => {
                if window.is_some_and(|w| t > w.end) {
                    *window = None;
                }
            }
            Self::Tat(bucket) => {
                if bucket.is_some_and(|b| t > b.expiry) {
                    *bucket = None;
                }
            }
            Self::Buckets(ring) => ring.expire(t),
        }
    }

    /// Keeps a token bucket's or a rolling window's key until `t` at least (a blocked
    /// key's mark: see `Model::mark`).
    pub(crate) fn keep_until(&mut self, t: u64) {
        match self {
            Self::Window(_) => {}
            Self::Tat(bucket) => {
                if let Some(bucket) = bucket {
                    bucket.expiry = bucket.expiry.max(t);
                }
            }
            Self::Buckets(ring) => ring.expiry = ring.expiry.max(t),
        }
    }

    /// Decides `cost` at `t`; with `write` (a check's writing step), spends it if
    /// admitted and stores a changed skew.
    pub(crate) fn decide(&mut self, limit: Limit, c: Clock, cost: u64, write: bool) -> Answer {
        match (self, limit) {
            (Self::Window(window), Limit::Period { quota, .. }) => {
                let view = WindowView::at(*window, limit, c);
                let reset = u128::from(view.rem) * 1_000;
                let rekey = write && view.rekey();
                if view.count + cost > quota {
                    view.save(window, c, 0, rekey);
                    let left = quota.saturating_sub(view.count);
                    return answer(false, quota, left, reset, Some(reset));
                }
                if write {
                    view.save(window, c, cost, rekey);
                }
                answer(true, quota, quota - view.count - cost, reset, None)
            }
            (Self::Tat(bucket), Limit::Bucket { .. }) => {
                let (rate, interval, tau, burst) = bucket_params(limit);
                let view = BucketView::at(*bucket, limit, c);
                let (now, current) = (view.now, view.clamped(limit, c));
                let next = current + u128::from(cost) * interval;
                if next > tau + now {
                    if write && view.skew != view.stored {
                        view.store(bucket, limit, c, current);
                    }
                    let wait = next - tau - now;
                    let left = (tau + now).saturating_sub(current) / interval;
                    return answer(
                        false,
                        burst,
                        left as u64,
                        div_ceil(current - now, rate),
                        Some(div_ceil(wait, rate)),
                    );
                }
                if write {
                    view.store(bucket, limit, c, next);
                }
                let left = (tau - (next - now)) / interval;
                answer(true, burst, left as u64, div_ceil(next - now, rate), None)
            }
            (
                Self::Buckets(ring),
                Limit::Rolling {
                    limit: most,
                    buckets,
                    interval_ms,
                },
            ) => {
                ring.expire(c.server);
                let (current, now, _) = ring.current(interval_ms, c);
                let live = |index: u64| index + buckets > current;
                let sum: u64 = ring
                    .counts
                    .iter()
                    .filter(|(&i, _)| live(i))
                    .map(|(_, c)| c)
                    .sum();
                let ms = |end: u64| u128::from(end - now) * 1_000;
                if sum + cost <= most {
                    if write {
                        ring.save(limit, c, cost);
                    }
                    let reset = ms((current + buckets) * interval_ms);
                    return answer(true, most, most - sum - cost, reset, None);
                }
                let need = sum + cost - most;
                let mut freed = 0;
                let mut retry = 0;
                let mut newest = None;
                for (&index, &count) in ring.counts.iter().filter(|(&i, _)| live(i)) {
                    freed += count;
                    if freed >= need && retry == 0 {
                        retry = ms((index + buckets) * interval_ms);
                    }
                    newest = Some(index);
                }
                let reset = newest.map_or(0, |newest| ms((newest + buckets) * interval_ms));
                if write {
                    ring.save(limit, c, 0);
                }
                answer(false, most, most.saturating_sub(sum), reset, Some(retry))
            }
            _ => unreachable!("a limit's state is of its algorithm"),
        }
    }

    /// Gives `cost` back at `t`.
    pub(crate) fn refund(&mut self, limit: Limit, c: Clock, cost: u64) {
        match (self, limit) {
            (Self::Window(window), Limit::Period { .. }) => {
                if let Some(w) = window.filter(|w| w.end > c.server) {
                    *window = (w.count > cost).then(|| Window {
                        count: w.count - cost,
                        ..w
                    });
                }
            }
            (Self::Tat(bucket), Limit::Bucket { .. }) => {
                let (_, interval, _, _) = bucket_params(limit);
                let view = BucketView::at(*bucket, limit, c);
                if view.tat > view.now {
                    let back = view
                        .tat
                        .saturating_sub(u128::from(cost) * interval)
                        .max(view.now);
                    if back > view.now {
                        view.store(bucket, limit, c, back);
                    } else {
                        *bucket = None;
                    }
                }
            }
            (
                Self::Buckets(ring),
                Limit::Rolling {
                    buckets,
                    interval_ms,
                    ..
                },
            ) => {
                ring.expire(c.server);
                // The stored skew, as it is (buckets "in the future" count too).
                let current = c.now / interval_ms + ring.skew;
                let mut cost = cost;
                let newest_first: Vec<u64> = ring
                    .counts
                    .keys()
                    .rev()
                    .copied()
                    .filter(|&index| index + buckets > current)
                    .collect();
                for index in newest_first {
                    if cost == 0 {
                        break;
                    }
                    let count = ring.counts.get_mut(&index).expect("listed");
                    let take = cost.min(*count);
                    *count -= take;
                    cost -= take;
                    if *count == 0 {
                        ring.counts.remove(&index);
                    }
                }
            }
            _ => unreachable!("a limit's state is of its algorithm"),
        }
    }

    /// Spends `cost` at `t` whatever the limit holds: a window's count above its quota,
    /// a TAT beyond a full burst ahead, a sum above the limit.
    pub(crate) fn charge(&mut self, limit: Limit, c: Clock, cost: u64) {
        match (self, limit) {
            (Self::Window(window), Limit::Period { .. }) => {
                let view = WindowView::at(*window, limit, c);
                view.save(window, c, cost, view.rekey());
            }
            (Self::Tat(bucket), Limit::Bucket { .. }) => {
                let (_, interval, _, _) = bucket_params(limit);
                let view = BucketView::at(*bucket, limit, c);
                view.store(bucket, limit, c, view.tat + u128::from(cost) * interval);
            }
            (Self::Buckets(ring), Limit::Rolling { .. }) => {
                ring.expire(c.server);
                ring.save(limit, c, cost);
            }
            _ => unreachable!("a limit's state is of its algorithm"),
        }
    }

    /// A token bucket reserving `cost` at most `max_wait_ms` ahead, at `t`.
    pub(crate) fn reserve(
        &mut self,
        limit: Limit,
        c: Clock,
        cost: u64,
        max_wait_ms: u64,
    ) -> Answer {
        let Self::Tat(bucket) = self else {
            unreachable!("a token bucket")
        };
        let (rate, interval, tau, burst) = bucket_params(limit);
        let view = BucketView::at(*bucket, limit, c);
        let (now, current) = (view.now, view.tat);
        let next = current + u128::from(cost) * interval;
        let wait = next.saturating_sub(tau + now);
        if wait > u128::from(max_wait_ms) * 1_000 * rate {
            if view.skew != view.stored {
                view.store(bucket, limit, c, current);
            }
            let left = (tau + now).saturating_sub(current) / interval;
            return answer(
                false,
                burst,
                left as u64,
                div_ceil(current - now, rate),
                Some(div_ceil(wait, rate)),
            );
        }
        view.store(bucket, limit, c, next);
        // Left at the reserved time; the wait before using the tokens.
        let left = ((tau + wait) - (next - now)) / interval;
        let mut reserved = answer(true, burst, left as u64, div_ceil(next - now, rate), None);
        if wait > 0 {
            reserved.retry_us = Some(div_ceil(wait, rate));
        }
        reserved
    }
}
