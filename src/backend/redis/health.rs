//! The breaker that decides where checks go: to Redis, to the failure policy, or (while
//! recovering) a growing share to Redis and the rest to the failure policy.
//!
//! It judges Redis by traffic and by time, never by one failure: the backend moves to its
//! fallback when, over a rolling window, enough calls failed for a reason that concerns
//! the whole server (a transport or server-wide error: the ratio), or when Redis has
//! answered nothing for a sustained stretch (the streak: at least [`STREAK_CALLS`]
//! failures in a row over twice the call timeout, however far apart). The streak counts
//! what the ratio counts, plus what only time tells: checks that gave up waiting for a
//! connection attempt still under way, and the probe, which runs from the first failure
//! of a streak (see `redis.rs`), so that a quiet service is judged as soon as a busy
//! one. Errors that concern one key never count, nor do the answers of the failure
//! policies and of the deny cache (no call, no outcome): the breaker cannot hold itself
//! open.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use crate::error::ConfigError;
use crate::ring::RollingWindow;

/// The default span of recent calls the breaker judges.
pub(crate) const DEFAULT_BREAKER_WINDOW: Duration = Duration::from_secs(2);
/// The default number of calls within the window below which the ratio is not judged.
pub(crate) const DEFAULT_BREAKER_MIN_CALLS: u32 = 20;
/// The default share of failed calls within the window that opens the breaker.
pub(crate) const DEFAULT_BREAKER_FAILURE_RATIO: f64 = 0.5;
/// The default time over which traffic returns to Redis after a successful probe.
pub(crate) const DEFAULT_RECOVERY: Duration = Duration::from_secs(1);

/// The share of checks sent to Redis when recovery starts.
const FIRST_SHARE: f64 = 0.1;
/// Buckets of the rolling window.
const BUCKETS: usize = 20;
/// Consecutive failures that open the breaker once they span the streak length.
pub(crate) const STREAK_CALLS: u32 = 3;
/// `streak_since_ns` while no streak has started.
const NO_STREAK: u64 = u64::MAX;

/// How the breaker judges Redis; validated when the backend is built.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BreakerConfig {
    pub(crate) window: Duration,
    pub(crate) min_calls: u32,
    pub(crate) failure_ratio: f64,
    pub(crate) recovery: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            window: DEFAULT_BREAKER_WINDOW,
            min_calls: DEFAULT_BREAKER_MIN_CALLS,
            failure_ratio: DEFAULT_BREAKER_FAILURE_RATIO,
            recovery: DEFAULT_RECOVERY,
        }
    }
}

impl BreakerConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.window < Duration::from_millis(BUCKETS as u64) {
            return Err(ConfigError::ZeroDuration {
                setting: "breaker_window",
            });
        }
        if self.min_calls == 0 {
            return Err(ConfigError::Zero {
                setting: "breaker_min_calls",
            });
        }
        if !(self.failure_ratio.is_finite()
            && self.failure_ratio > 0.0
            && self.failure_ratio <= 1.0)
        {
            return Err(ConfigError::OutOfRange {
                setting: "breaker_failure_ratio",
                reason: "must be a fraction in (0, 1]",
            });
        }
        Ok(())
    }
}

/// Where the breaker stands.
///
/// ```
/// use tower_redis_ratelimit::RedisState;
///
/// assert_ne!(RedisState::Healthy, RedisState::Fallback);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisState {
    /// Checks go to Redis.
    Healthy,
    /// Redis is judged unusable: checks are answered by the layers' failure policies
    /// while a probe tries Redis every probe interval.
    Fallback,
    /// The probe reached Redis: a share of checks that grows over the recovery time goes
    /// to Redis again, the rest is answered by the failure policies.
    Recovering,
}

impl RedisState {
    /// The state's `to` label in the switches metric.
    fn metric_label(self) -> &'static str {
        match self {
            Self::Healthy => "redis",
            Self::Fallback => "fallback",
            Self::Recovering => "recovering",
        }
    }

    fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::Fallback,
            2 => Self::Recovering,
            _ => Self::Healthy,
        }
    }

    const fn as_u8(self) -> u8 {
        match self {
            Self::Healthy => 0,
            Self::Fallback => 1,
            Self::Recovering => 2,
        }
    }
}

/// What an outcome tells about Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Redis answered.
    Success,
    /// The call failed for a reason that concerns the whole server.
    Failure,
}

/// The breaker of one Redis backend.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    /// How long Redis must have answered nothing, over at least [`STREAK_CALLS`]
    /// failures, before the breaker opens without a ratio to judge (twice the call
    /// timeout).
    streak_span: Duration,
    state: AtomicU8,
    /// Outcomes of recent calls: 1.0 a failure, 0.0 a success. Replaced when recovery
    /// starts, so the failures that opened the breaker are not judged twice.
    window: ArcSwap<RollingWindow>,
    /// Failures since the last success, and when the first of them happened (ns since
    /// `base`; [`NO_STREAK`] before it is known).
    streak: AtomicU32,
    streak_since_ns: AtomicU64,
    /// When recovery started (ns since `base`).
    recovering_since_ns: AtomicU64,
    /// Counts checks while recovering, to pick the share that goes to Redis.
    picks: AtomicU64,
    /// Switches to the fallback since the backend was built.
    switches: AtomicU64,
    /// When the backend last left Redis (ns since `base`, at least 1); 0 while it is on
    /// Redis.
    away_since_ns: AtomicU64,
    /// Time away from Redis in the outages that are over (ns).
    away_done_ns: AtomicU64,
    /// Whole seconds away from Redis counted in the metrics so far.
    away_counted_s: AtomicU64,
    base: Instant,
    /// The backend's key prefix, naming it in metrics.
    prefix: String,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig, call_timeout: Duration, prefix: String) -> Self {
        Self {
            config,
            streak_span: call_timeout.saturating_mul(2),
            state: AtomicU8::new(RedisState::Healthy.as_u8()),
            window: ArcSwap::from_pointee(new_window(config.window)),
            streak: AtomicU32::new(0),
            streak_since_ns: AtomicU64::new(NO_STREAK),
            recovering_since_ns: AtomicU64::new(0),
            picks: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            away_since_ns: AtomicU64::new(0),
            away_done_ns: AtomicU64::new(0),
            away_counted_s: AtomicU64::new(0),
            base: Instant::now(),
            prefix,
        }
    }

    /// Where the breaker stands; a recovery whose time is over ends here.
    pub(crate) fn state(&self) -> RedisState {
        let state = RedisState::from_u8(self.state.load(Ordering::Acquire));
        if state == RedisState::Recovering && self.recovered_share().is_none() {
            self.close();
            return RedisState::from_u8(self.state.load(Ordering::Acquire));
        }
        state
    }

    /// The time over which traffic returns to Redis after a successful probe.
    pub(crate) fn recovery(&self) -> Duration {
        self.config.recovery
    }

    pub(crate) fn switches(&self) -> u64 {
        self.switches.load(Ordering::Relaxed)
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The share of checks that go to Redis while recovering: from a tenth to all of
    /// them over the recovery time; `None` once that time is over.
    fn recovered_share(&self) -> Option<f64> {
        let since = self.recovering_since_ns.load(Ordering::Acquire);
        let elapsed = self.now_ns().saturating_sub(since);
        let recovery = u64::try_from(self.config.recovery.as_nanos()).unwrap_or(u64::MAX);
        (elapsed < recovery)
            .then(|| FIRST_SHARE + (1.0 - FIRST_SHARE) * elapsed as f64 / recovery as f64)
    }

    /// Ends a recovery: every check goes to Redis again.
    fn close(&self) {
        if self
            .state
            .compare_exchange(
                RedisState::Recovering.as_u8(),
                RedisState::Healthy.as_u8(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            // The outage ended when the recovery time was over, whenever this is noticed.
            let end = self.recovery_end_ns().min(self.now_ns());
            let since = self.away_since_ns.swap(0, Ordering::AcqRel);
            let away = end.saturating_sub(since);
            self.away_done_ns.fetch_add(away, Ordering::AcqRel);
            self.count_away();
            crate::metrics::redis_switch(&self.prefix, RedisState::Healthy.metric_label());
            let away = Duration::from_nanos(away);
            tracing::info!(?away, "redis recovered: every check goes to redis again");
        }
    }

    /// When the recovery under way ends (ns since `base`).
    fn recovery_end_ns(&self) -> u64 {
        let recovery = u64::try_from(self.config.recovery.as_nanos()).unwrap_or(u64::MAX);
        self.recovering_since_ns
            .load(Ordering::Acquire)
            .saturating_add(recovery)
    }

    /// Adds the whole seconds spent away from Redis since the last count to the
    /// metrics: called by the probe on every tick of an outage, and when it is over.
    pub(crate) fn count_away(&self) {
        let since = self.away_since_ns.load(Ordering::Acquire);
        let current = if since == 0 {
            0
        } else {
            let mut end = self.now_ns();
            if self.state.load(Ordering::Acquire) == RedisState::Recovering.as_u8() {
                end = end.min(self.recovery_end_ns());
            }
            end.saturating_sub(since)
        };
        let total = self.away_done_ns.load(Ordering::Acquire) + current;
        let seconds = total / 1_000_000_000;
        let counted = self.away_counted_s.fetch_max(seconds, Ordering::AcqRel);
        if seconds > counted {
            crate::metrics::redis_away(&self.prefix, seconds - counted);
        }
    }

    /// Whether failures have come since Redis last answered (a streak is under way).
    pub(crate) fn failing(&self) -> bool {
        self.streak.load(Ordering::Acquire) != 0
    }

    fn end_streak(&self) {
        if self.streak.load(Ordering::Relaxed) != 0 {
            self.streak_since_ns.store(NO_STREAK, Ordering::Release);
            self.streak.store(0, Ordering::Release);
        }
    }

    /// Whether this check goes to Redis: all of them while healthy, none in fallback, a
    /// growing share while recovering.
    pub(crate) fn admit(&self) -> bool {
        match self.state() {
            RedisState::Healthy => true,
            RedisState::Fallback => false,
            RedisState::Recovering => {
                let Some(share) = self.recovered_share() else {
                    return true;
                };
                // Spread the picks evenly: the n-th check goes to Redis when the
                // fractional part of n times the golden ratio is below the share.
                let n = self.picks.fetch_add(1, Ordering::Relaxed);
                let spread = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
                (spread as f64) < share * (1u64 << 53) as f64
            }
        }
    }

    /// Records the outcome of a call or a connection attempt: judged by the ratio and the
    /// streak. Returns the reason when this outcome opened the breaker.
    pub(crate) fn record(&self, outcome: Outcome) -> Option<Trip> {
        self.judge(outcome, true)
    }

    /// Records what only time tells (a check that gave up waiting for a connection
    /// attempt still under way, a probe's outcome): judged by the streak alone, so
    /// that many checks waiting for one slow connection, or probes, never make a ratio.
    pub(crate) fn note(&self, outcome: Outcome) -> Option<Trip> {
        self.judge(outcome, false)
    }

    fn judge(&self, outcome: Outcome, ratio: bool) -> Option<Trip> {
        let state = self.state();
        if state == RedisState::Fallback {
            return None;
        }
        let window = self.window.load();
        match outcome {
            Outcome::Success => {
                if ratio {
                    window.add(0.0);
                }
                self.end_streak();
                None
            }
            Outcome::Failure => {
                if ratio {
                    window.add(1.0);
                }
                let now = self.now_ns();
                let span = u64::try_from(self.streak_span.as_nanos()).unwrap_or(u64::MAX);
                // However far apart: a quiet service's failures are a streak until Redis
                // answers, and the probe adds one every probe interval meanwhile.
                let streak = self.streak.fetch_add(1, Ordering::AcqRel);
                if streak == 0 {
                    self.streak_since_ns.store(now, Ordering::Release);
                }
                let since = self.streak_since_ns.load(Ordering::Acquire);
                let lasted = now.saturating_sub(since);
                let trip = if streak + 1 >= STREAK_CALLS && lasted >= span {
                    Some(Trip::Streak {
                        failures: streak + 1,
                        span: Duration::from_nanos(lasted),
                    })
                } else if ratio {
                    let (mut failures, mut calls) = (0.0, 0u64);
                    window.reduce(|bucket| {
                        failures += bucket.sum;
                        calls += bucket.count;
                    });
                    let ratio = failures / calls.max(1) as f64;
                    (calls >= u64::from(self.config.min_calls)
                        && ratio >= self.config.failure_ratio)
                        .then_some(Trip::Ratio { ratio, calls })
                } else {
                    None
                };
                let trip = trip?;
                self.open(state).then_some(trip)
            }
        }
    }

    /// Moves from `from` to the fallback; `false` if another call did it first.
    fn open(&self, from: RedisState) -> bool {
        let opened = self
            .state
            .compare_exchange(
                from.as_u8(),
                RedisState::Fallback.as_u8(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if opened {
            self.switches.fetch_add(1, Ordering::Relaxed);
            self.end_streak();
            // From recovering, the outage goes on.
            if from == RedisState::Healthy {
                self.away_since_ns
                    .store(self.now_ns().max(1), Ordering::Release);
            }
            crate::metrics::redis_switch(&self.prefix, RedisState::Fallback.metric_label());
        }
        opened
    }

    /// Opens the breaker whatever it judged so far.
    #[cfg(test)]
    pub(crate) fn force_open(&self) -> bool {
        let state = self.state();
        state != RedisState::Fallback && self.open(state)
    }

    /// The probe reached Redis: start sending a share of checks to it.
    pub(crate) fn start_recovery(&self) {
        self.window
            .store(std::sync::Arc::new(new_window(self.config.window)));
        self.end_streak();
        self.recovering_since_ns
            .store(self.now_ns(), Ordering::Release);
        self.state
            .store(RedisState::Recovering.as_u8(), Ordering::Release);
        crate::metrics::redis_switch(&self.prefix, RedisState::Recovering.metric_label());
    }
}

fn new_window(span: Duration) -> RollingWindow {
    let size = NonZeroUsize::new(BUCKETS).expect("non-zero");
    RollingWindow::new(size, span / BUCKETS as u32)
        .expect("the window was checked to be at least one millisecond per bucket")
}

/// Why the breaker opened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Trip {
    /// Too many of the recent calls failed.
    Ratio { ratio: f64, calls: u64 },
    /// Redis answered nothing for a sustained stretch.
    Streak { failures: u32, span: Duration },
}

impl std::fmt::Display for Trip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ratio { ratio, calls } => {
                write!(f, "{:.0}% of the last {calls} calls failed", ratio * 100.0)
            }
            Self::Streak { failures, span } => {
                write!(
                    f,
                    "{failures} failures in a row, nothing answered for {span:?}"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests;
