//! [`RollingWindow`]: statistics over the last `size` intervals (the sum and the count
//! of the values added in each), for a service's own error rates or load figures.
//!
//! It is a [`Ring`] of [`Bucket`]s behind a lock, moved by tokio's clock: buckets older
//! than `size * interval` fall out of the window automatically. The Redis backend's
//! breaker judges Redis with one; it is independent of the limiters.

use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{Ring, StepBack};

/// One bucket of a [`RollingWindow`]: the aggregate of the values added
/// during one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub(crate) struct Bucket {
    /// Sum of the values added to this bucket.
    pub sum: f64,
    /// Number of values added to this bucket.
    pub count: u64,
}

impl Bucket {
    fn add(&mut self, v: f64) {
        self.sum += v;
        self.count = self.count.saturating_add(1);
    }
}

/// Error returned when a [`RollingWindow`] cannot be created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RollingWindowError {
    /// The bucket interval was zero.
    #[error("rolling window interval must be greater than zero")]
    ZeroInterval,
}

/// A thread-safe window of `size` time buckets, each covering `interval`.
///
/// Values are added to the bucket of the current interval; buckets whose
/// interval ended more than `size` intervals ago are discarded. All methods
/// take `&self`, so a window can be shared (for example in an
/// [`Arc`](std::sync::Arc)) between tasks and threads.
///
/// Adding and reducing never allocate: the buckets are allocated once, when
/// the window is created.
///
/// The bucket grid is anchored at the moment the window is created: bucket
/// boundaries are always `creation + k * interval`, no matter when values are
/// added.
///
/// Time is read from [`tokio::time::Instant`], so a paused tokio clock (with
/// tokio's `test-util` feature) drives the window in tests. Outside a tokio
/// runtime the system's monotonic clock is used.
///
/// Inside, it is a [`Ring`] of [`Bucket`]s behind a mutex, advanced with
/// [`StepBack::Hold`].
///
/// The unit test `the_documented_statistics` records outcomes and reads them back.
#[derive(Debug)]
pub(crate) struct RollingWindow {
    /// Bucket `i` covers `start + i * interval` and the interval after it.
    ring: Mutex<Ring<Box<[Bucket]>>>,
    start: Instant,
    size: usize,
    interval: Duration,
    ignore_current: bool,
}

impl RollingWindow {
    /// Creates a window of `size` buckets of `interval` each, with its bucket
    /// grid anchored at the current time.
    ///
    /// # Errors
    ///
    /// Returns [`RollingWindowError::ZeroInterval`] if `interval` is zero.
    pub(crate) fn new(size: NonZeroUsize, interval: Duration) -> Result<Self, RollingWindowError> {
        Self::new_at(size, interval, Instant::now())
    }

    fn new_at(
        size: NonZeroUsize,
        interval: Duration,
        start: Instant,
    ) -> Result<Self, RollingWindowError> {
        if interval.is_zero() {
            return Err(RollingWindowError::ZeroInterval);
        }
        Ok(Self {
            ring: Mutex::new(Ring::new(size)),
            start,
            size: size.get(),
            interval,
            ignore_current: false,
        })
    }

    #[cfg(test)]
    /// Whether [`reduce`](Self::reduce) (and the helpers built on it) should
    /// skip the current, still-filling bucket. Off by default.
    ///
    /// This only makes a difference while the current interval is the one of
    /// the newest bucket: once time has moved past it, the newest bucket is
    /// complete and is always visited.
    #[must_use]
    pub(crate) fn ignore_current(mut self, yes: bool) -> Self {
        self.ignore_current = yes;
        self
    }

    /// Adds `v` to the bucket of the current interval.
    pub(crate) fn add(&self, v: f64) {
        self.add_at(Instant::now(), v);
    }

    /// Adds `v` to the bucket of the interval containing `now`.
    ///
    /// Times earlier than the start of the newest bucket (non-monotonic
    /// callers) are treated as belonging to the newest bucket.
    pub(crate) fn add_at(&self, now: Instant, v: f64) {
        let current = self.index(now);
        self.lock().advance(current, StepBack::Hold, drop).add(v);
    }

    /// Calls `f` on every bucket still inside the window, oldest first.
    ///
    /// Buckets that expired since the last [`add`](Self::add) are not
    /// visited; with [`ignore_current`](Self::ignore_current) the current,
    /// still-filling bucket is skipped too.
    ///
    /// The window is locked while `f` runs: `f` must not call methods of the
    /// same window.
    pub(crate) fn reduce<F: FnMut(&Bucket)>(&self, f: F) {
        self.reduce_at(Instant::now(), f);
    }

    /// Like [`reduce`](Self::reduce), but as seen at time `now`.
    ///
    /// Times earlier than the start of the newest bucket are treated as
    /// belonging to the newest bucket. The window is not modified.
    pub(crate) fn reduce_at<F: FnMut(&Bucket)>(&self, now: Instant, f: F) {
        let current = self.index(now);
        let ring = self.lock();
        let live = self.size - ring.expired_at(current);
        // The newest bucket is the current one until time has moved past it.
        let skip_current = self.ignore_current && current <= ring.newest();
        ring.live(current)
            .take(live - usize::from(skip_current))
            .for_each(f);
    }

    #[cfg(test)]
    /// Sum of all values in the live buckets (see [`reduce`](Self::reduce)).
    pub(crate) fn sum(&self) -> f64 {
        let mut sum = 0.0;
        self.reduce(|b| sum += b.sum);
        sum
    }

    #[cfg(test)]
    /// Number of values in the live buckets (see [`reduce`](Self::reduce)).
    pub(crate) fn count(&self) -> u64 {
        let mut count = 0u64;
        self.reduce(|b| count = count.saturating_add(b.count));
        count
    }

    #[cfg(test)]
    /// Copies of the live buckets, oldest first (see
    /// [`reduce`](Self::reduce)). Intended for inspection and tests; unlike
    /// the other methods it allocates.
    pub(crate) fn buckets(&self) -> Vec<Bucket> {
        let mut buckets = Vec::with_capacity(self.size());
        self.reduce(|b| buckets.push(*b));
        buckets
    }

    #[cfg(test)]
    /// Number of buckets in the window.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    #[cfg(test)]
    /// Time covered by each bucket.
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    fn lock(&self) -> MutexGuard<'_, Ring<Box<[Bucket]>>> {
        // The ring is valid after every statement, so a panic elsewhere while
        // the lock was held cannot have left it inconsistent.
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The index of the bucket that contains `now` (times before the start
    /// are in bucket 0).
    fn index(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start);
        u64::try_from(elapsed.as_nanos() / self.interval.as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
#[path = "window_tests.rs"]
mod tests;
