//! The in-process clock: Unix time in microseconds that follows tokio's clock.
//!
//! Unix time is read once, when the backend is created, and advanced by
//! [`tokio::time::Instant`] from then on. The in-process stores therefore never see time
//! go backwards, calendar alignment still works, and tests can drive them with tokio's
//! paused clock. Redis-backed checks use the Redis server's `TIME` instead, unless the
//! backend's time source is the caller's: then this clock is sent to the scripts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub(crate) enum Clock {
    /// Unix time at creation, advanced by tokio's clock.
    Tokio {
        base_instant: Instant,
        base_unix_us: u64,
    },
    /// A time the tests set (it may go back, as a stepped wall clock does).
    Manual(ManualClock),
}

impl Clock {
    pub(crate) fn new() -> Self {
        let base_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Self::Tokio {
            base_instant: Instant::now(),
            base_unix_us,
        }
    }

    /// Microseconds since the Unix epoch.
    pub(crate) fn now_us(&self) -> u64 {
        match self {
            Self::Tokio {
                base_instant,
                base_unix_us,
            } => {
                let elapsed = Instant::now().saturating_duration_since(*base_instant);
                base_unix_us.saturating_add(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX))
            }
            Self::Manual(clock) => clock.now_us(),
        }
    }

    /// Nanoseconds on a clock that starts at or after the Unix epoch (since the clock was
    /// created, or since the epoch for a manual clock).
    pub(crate) fn elapsed_ns(&self) -> u64 {
        match self {
            Self::Tokio { base_instant, .. } => {
                let elapsed = Instant::now().saturating_duration_since(*base_instant);
                u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
            }
            Self::Manual(clock) => clock.now_us().saturating_mul(1_000),
        }
    }
}

/// Not part of the API: a clock that tests set, for the in-process state of a backend
/// built with [`BackendBuilder::manual_clock`](crate::BackendBuilder::manual_clock), so that
/// scenarios run at times they choose, steps back included.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock at `unix_us` microseconds since the Unix epoch.
    #[must_use]
    pub fn new(unix_us: u64) -> Self {
        Self(Arc::new(AtomicU64::new(unix_us)))
    }

    /// Sets the time.
    pub fn set_us(&self, unix_us: u64) {
        self.0.store(unix_us, Ordering::Relaxed);
    }

    /// The time.
    #[must_use]
    pub fn now_us(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn follows_tokio_time() {
        let clock = Clock::new();
        let t0 = clock.now_us();
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(clock.now_us() - t0, 1_500_000);
    }

    #[test]
    fn a_manual_clock_reads_what_was_set() {
        let manual = ManualClock::new(5_000);
        let clock = Clock::Manual(manual.clone());
        manual.set_us(2_000);
        assert_eq!(clock.now_us(), 2_000);
        assert_eq!(clock.elapsed_ns(), 2_000_000);
    }
}
