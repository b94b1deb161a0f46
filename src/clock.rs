//! The in-process clock: Unix time in microseconds that follows tokio's clock.
//!
//! Unix time is read once, when the backend is created, and advanced by
//! [`tokio::time::Instant`] from then on. The in-process stores therefore never see time
//! go backwards, calendar alignment still works, and tests can drive them with tokio's
//! paused clock. Redis-backed checks use the Redis server's `TIME` instead, unless the
//! backend's time source is the caller's: then this clock is sent to the scripts.

use std::time::{SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    base_instant: Instant,
    base_unix_us: u64,
}

impl Clock {
    pub(crate) fn new() -> Self {
        let base_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Self {
            base_instant: Instant::now(),
            base_unix_us,
        }
    }

    /// Microseconds since the Unix epoch.
    pub(crate) fn now_us(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.base_instant);
        self.base_unix_us
            .saturating_add(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX))
    }
}

impl Clock {
    /// Nanoseconds since the clock was created.
    pub(crate) fn elapsed_ns(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.base_instant);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
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
}
