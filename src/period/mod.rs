//! The fixed-window algorithm: its config, its limiter, its calendar windows; the semantics are on [`PeriodConfig`].

mod calendar;
pub(crate) mod memory;
pub(crate) mod window;

pub use self::calendar::{Calendar, Weekday};

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use self::calendar::Zoned;
use self::memory::{Schedule, Windows};
use crate::backend::decide::protocol::{Limit, WindowReply};
use crate::backend::{Args, Backend, Call, Hosts, Owner, Remote};
use crate::decision::{Decision, Policy, Priority, Source, State};
use crate::error::ConfigError;

/// The largest UTC offset accepted (±18 hours, as in RFC 3339 and most time libraries).
const MAX_OFFSET_SECS: i32 = 18 * 3_600;

/// A fixed offset from UTC that windows are aligned to.
///
/// Offsets are fixed: a zone with daylight saving time changes its offset twice a year,
/// which a fixed offset does not follow; a [`Calendar`] window does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UtcOffset {
    seconds: i32,
}

impl UtcOffset {
    /// UTC itself.
    pub const UTC: Self = Self { seconds: 0 };

    /// Whole hours east of UTC (negative for west); checked when the layer is built.
    #[must_use]
    pub const fn from_hours(hours: i8) -> Self {
        Self {
            seconds: hours as i32 * 3_600,
        }
    }

    /// Seconds east of UTC (e.g. `19_800` for UTC+5:30); checked when the layer is built.
    #[must_use]
    pub const fn from_seconds(seconds: i32) -> Self {
        Self { seconds }
    }

    /// Seconds east of UTC (how a rule file writes it back).
    #[cfg(feature = "serde")]
    #[must_use]
    pub(crate) const fn seconds(self) -> i32 {
        self.seconds
    }
}

/// Fixed-window limits: `quota` units per `period` per key, optionally aligned to a
/// fixed UTC offset ("5 SMS codes per phone per day, reset at midnight UTC+8"), or
/// windows that follow the calendar of an IANA time zone ([`Calendar`]: "5 per local day
/// in America/New_York", 23 or 25 hours on DST days; "10 000 per calendar month").
///
/// The request that uses the last unit of a window is [`State::HitQuota`] (admitted),
/// later ones [`State::OverQuota`] until the window ends. Rejected requests are not
/// counted, so a cost-5 request refused near the end of the quota does not use up the
/// units a cost-1 request could still have. One Redis key per limited key holds the
/// count, with the window's end as its expiry.
///
/// In process, windows live in the backend's bounded state
/// ([`max_local_keys`](crate::BackendBuilder::max_local_keys)): 24 bytes of state per
/// key (the count, the window's end, the skew of a clock step), about 80 to 110 bytes
/// in all.
///
/// # Clocks
///
/// On Redis, a window's end is the key's expiry, a Unix time of the Redis server's
/// clock. Each key holds the newest time it has seen: its time is the server's, but a
/// window whose end is more than one period away proves that the clock stepped back, and
/// the key's time is then at least the window's end minus one period, running on at the
/// server's rate (the skew is stored with the count, in the same value: no extra
/// command). The count is kept and the key's expiry is never moved: so a step back
/// admits nothing more, not even when the clock comes back (the window is then as the
/// key left it), and a refusal never waits more than one period, at any moment (a step
/// back of an hour does not refuse a key for an hour; over the whole step, a key is
/// refused at most two periods). Once the window's end is within one period of the
/// server's time again (the clock came back, or caught up), the skew is dropped. Costs:
/// a key outlives its expiry by the step while the clock is behind; a step back that
/// leaves the window's end within one period is followed (the count is kept, the
/// window ends on time: nothing more is admitted). When the clock steps forward past the
/// window's end, the window ends early; so does a return that lands before the newest
/// time a key has seen (it is a step forward from the time behind). In-process, time is
/// the monotonic clock: it never steps back, and the same rule applies if it did.
///
/// With the callers' clocks ([`TimeSource::Caller`](crate::TimeSource)), say
/// within `s` of each other:
///
/// - windows that start at a key's first request never read a clock: a window lasts
///   one period of the server's expiry, exactly as with server time, whatever `s`;
/// - [aligned](PeriodConfig::align) and [calendar](Calendar) windows end on the edge as
///   the caller that opened the window sees it: up to `s` early or late, never longer
///   than one period. A caller whose clock is behind the one that opened the previous
///   window can open one more window, of at most `s`, just before its own view of the
///   edge: a span of one period across an edge admits at most `(n + 1) × quota` with `n`
///   distinct clocks (three quotas with two), instead of twice the quota. A refusal
///   lasts until the window's key expires: at most `s` past the refused caller's own
///   view of the edge, and never more than one period.
///
/// # Calendar windows
///
/// A [`Calendar`] window runs from local midnight to local midnight (of a day, of the
/// first weekday of a week, of the first of a month) in its zone. The zone's rules are
/// the caller's: each call sends the engine the boundaries of the window holding the
/// caller's clock and of the windows on either side (computed with jiff once per window,
/// then cached), and the engine picks the window of the time it reads, ending the key at
/// that window's end (`PXAT`, or a time to live with the callers' clocks). The in-process
/// host picks from the same boundaries by the same rule. So with the server's clock the
/// Redis server decides which window a request is in, whatever the caller's clock says
/// (within a window of it: a server clock further away gets a window of the nearest
/// one's length, starting at its time). Clock steps follow the rules above with the
/// length of the window holding the time read as the period. With the callers' clocks,
/// a calendar window behaves as an aligned one.
///
/// A fixed window admits up to twice the quota across a window edge; use
/// [`TokenBucketLayer`](crate::TokenBucketLayer) or
/// [`RollingWindowLayer`](crate::RollingWindowLayer) when that matters.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig, UtcOffset};
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let limits = PeriodConfig::new(5, Duration::from_secs(86_400))
///     .align(UtcOffset::from_hours(8));
/// let layer = LimitLayer::builder(&Backend::in_process(), limits)
///     .name("sms")
///     .key(HeaderKey::from_static("x-phone"))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// A `PeriodConfig` is what [`LimitLayer::builder`](crate::LimitLayer::builder) takes,
/// a member of a [`LimitSet`](crate::LimitSet) or a plan, and (with the `serde`
/// feature) the `"period"` limit of a rule file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(
        try_from = "crate::config::PeriodFile",
        into = "crate::config::PeriodFile"
    )
)]
pub struct PeriodConfig {
    pub(crate) quota: u64,
    pub(crate) period: Duration,
    pub(crate) align: Option<UtcOffset>,
    pub(crate) calendar: Option<Calendar>,
    pub(crate) lockout: Option<Duration>,
}

impl PeriodConfig {
    /// `quota` units per `period`, windows starting at each key's first request.
    #[must_use]
    pub fn new(quota: u64, period: Duration) -> Self {
        Self {
            quota,
            period,
            align: None,
            calendar: None,
            lockout: None,
        }
    }

    /// `quota` units per window of `calendar`: a local day, week or month in an IANA time
    /// zone, whatever its length (see [`Calendar`]). The zone is checked when the limit is
    /// built.
    ///
    /// ```
    /// use tower_redis_ratelimit::{Backend, Calendar, PeriodConfig, PeriodLimiter};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let sms = PeriodConfig::calendar(5, Calendar::day("America/New_York"));
    /// let limiter = PeriodLimiter::new(&Backend::in_process(), "sms", sms)?;
    /// # let _ = limiter;
    /// let unknown = PeriodConfig::calendar(5, Calendar::day("America/Gotham"));
    /// let error = PeriodLimiter::new(&Backend::in_process(), "sms", unknown).unwrap_err();
    /// assert!(error.to_string().contains("America/Gotham"));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn calendar(quota: u64, calendar: Calendar) -> Self {
        Self {
            quota,
            calendar: Some(calendar),
            ..Self::default()
        }
    }

    /// Locks a key out for `duration` once this limit refuses it (fail2ban-style): every
    /// check of the key is refused until then, spending nothing, with the lock's end as
    /// its `Retry-After`. Kept in Redis next to the limit's key, so every instance
    /// honours it; a lock already running is not extended by further refusals. At least
    /// one millisecond.
    #[must_use]
    pub fn lockout(mut self, duration: Duration) -> Self {
        self.lockout = Some(duration);
        self
    }

    /// Ends windows on multiples of the period in local time at `offset` (a one-day
    /// period then resets at local midnight) instead of one period after the first hit.
    /// For days, weeks or months in a zone with daylight saving time, or months of their
    /// true length, use [`calendar`](Self::calendar).
    #[must_use]
    pub fn align(mut self, offset: UtcOffset) -> Self {
        self.align = Some(offset);
        self
    }

    fn period_ms(&self) -> u64 {
        u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX)
    }

    /// The quota, for [`dynamic`](crate::DynamicLimits) limits.
    pub(crate) fn quota_value(&self) -> u64 {
        self.quota
    }

    /// The same settings with another quota, for [`dynamic`](crate::DynamicLimits) limits.
    pub(crate) fn with_quota(&self, quota: u64) -> Self {
        Self { quota, ..*self }
    }
}

/// A fixed-window [`Limiter`](crate::Limiter) on a [`Backend`].
#[derive(Debug, Clone)]
pub struct PeriodLimiter {
    store: Arc<PeriodHosts>,
}

#[derive(Debug)]
struct PeriodHosts {
    remote: Remote,
    policy: Policy,
    quota: u64,
    /// The quota of the in-process state (the fallback share of `quota` on Redis).
    local_quota: u64,
    period_ms: u64,
    offset_ms: Option<i64>,
    /// Calendar windows: the zone's rules, which give each call its window boundaries.
    calendar: Option<Zoned>,
    windows: Windows,
}

impl PeriodLimiter {
    /// Checks `config` and builds the limiter named `name` on `backend`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a zero quota, a period under one millisecond or over ten
    /// years, an offset beyond ±18 hours, an unknown time zone, a calendar with a period
    /// or an offset, or an invalid name.
    pub fn new(backend: &Backend, name: &str, config: PeriodConfig) -> Result<Self, ConfigError> {
        Self::with_owner(backend, Owner::Own(name), config)
    }

    /// [`new`](Self::new) for `owner`'s keys (a limiter's own, or a set's limit).
    pub(crate) fn with_owner(
        backend: &Backend,
        owner: Owner<'_>,
        config: PeriodConfig,
    ) -> Result<Self, ConfigError> {
        owner.validate()?;
        let name = &*owner.policy_name();
        if config.quota == 0 {
            return Err(ConfigError::Zero { setting: "quota" });
        }
        let calendar = match &config.calendar {
            None => None,
            Some(_) if config.period != Duration::ZERO => {
                return Err(ConfigError::Conflict {
                    reason: "a calendar window has the calendar's length: set `calendar` or \
                             `period`, not both",
                })
            }
            Some(_) if config.align.is_some() => {
                return Err(ConfigError::Conflict {
                    reason: "a calendar window is aligned to its zone: set `calendar` or \
                             `align`, not both",
                })
            }
            Some(calendar) => Some(calendar.resolve()?),
        };
        let period_ms = match &config.calendar {
            Some(calendar) => u64::try_from(calendar.nominal().as_millis()).unwrap_or(u64::MAX),
            None => config.period_ms(),
        };
        if period_ms == 0 {
            return Err(ConfigError::ZeroDuration { setting: "period" });
        }
        if period_ms > 10 * 366 * 86_400_000 {
            return Err(ConfigError::TooLong { setting: "period" });
        }
        if let Some(offset) = config.align {
            if offset.seconds.abs() > MAX_OFFSET_SECS {
                return Err(ConfigError::TooLong { setting: "align" });
            }
        }
        let offset_ms = config.align.map(|o| i64::from(o.seconds) * 1_000);
        let lockout = crate::error::validate_lockout(config.lockout)?;
        let remote = Remote::new(backend, "period", owner, lockout);
        let windows = Windows::new(backend.local_store(), remote.local_id(b"state", 0));
        Ok(Self {
            store: Arc::new(PeriodHosts {
                remote,
                policy: Policy::new(name, config.quota, Duration::from_millis(period_ms))
                    .with_algorithm("fixed_window"),
                quota: config.quota,
                local_quota: backend.local_limit(config.quota),
                period_ms,
                offset_ms,
                calendar,
                windows,
            }),
        })
    }
}

impl PeriodLimiter {
    /// The limiter's two hosts, for a [set](crate::LimitSet) of limits.
    pub(crate) fn hosts(&self) -> Arc<dyn Hosts> {
        self.store.clone()
    }
}

crate::hosted::hosted_limiter!(PeriodLimiter, store);

impl PeriodHosts {
    fn decision(
        quota: u64,
        count: u64,
        reset: Duration,
        admitted: bool,
        source: Source,
    ) -> Decision {
        let remaining = quota.saturating_sub(count);
        match (admitted, remaining) {
            (true, 0) => Decision::new(State::HitQuota, quota, 0, reset, source),
            (true, _) => Decision::new(State::Allowed, quota, remaining, reset, source),
            (false, _) => Decision::new(State::OverQuota, quota, remaining, reset, source)
                .with_retry_after(reset),
        }
    }
}

impl PeriodHosts {
    /// How the in-process window open at `now_us` is chosen: by the period (and its
    /// alignment), or by the calendar.
    fn schedule(&self, now_us: u64) -> Schedule {
        match &self.calendar {
            None => Schedule {
                period_us: self.period_ms * 1_000,
                offset_us: self.offset_ms.map(|ms| ms * 1_000),
                calendar: None,
            },
            Some(calendar) => {
                let now_ms = i64::try_from(now_us / 1_000).unwrap_or(i64::MAX);
                let bounds = calendar.bounds(now_ms);
                let (_, length_ms) = bounds.window(now_ms);
                Schedule {
                    period_us: u64::try_from(length_ms).unwrap_or(0) * 1_000,
                    offset_us: None,
                    calendar: Some(bounds),
                }
            }
        }
    }
}

impl Hosts for PeriodHosts {
    fn remote(&self) -> &Remote {
        &self.remote
    }

    fn capacity(&self) -> u64 {
        self.quota
    }

    fn exceeds_capacity(&self, source: Source) -> Decision {
        Decision::new(
            State::ExceedsCapacity,
            self.quota,
            0,
            Duration::from_millis(self.period_ms),
            source,
        )
    }

    fn limit_args(&self, args: &mut Args) {
        let (quota, period_ms) = (self.quota, self.period_ms);
        let limit = if self.calendar.is_some() {
            // A calendar window: its boundaries follow in each call (`window_args`).
            Limit::Calendar { quota, period_ms }
        } else {
            let offset_ms = self.offset_ms;
            Limit::Window {
                quota,
                period_ms,
                offset_ms,
            }
        };
        limit.write(args);
    }

    fn window_args(&self, now_ms: i64, call: &mut Call) {
        if let Some(calendar) = &self.calendar {
            for bound in calendar.bounds(now_ms).0 {
                call.arg(bound);
            }
        }
    }

    fn reply_len(&self) -> usize {
        WindowReply::SLOTS.len()
    }

    fn decide(&self, reply: &[i64], _cost: NonZeroU32) -> Option<Decision> {
        let reply = WindowReply::read(reply)?;
        Some(Self::decision(
            self.quota,
            reply.count,
            Duration::from_millis(reply.window_ms),
            reply.admitted,
            Source::Redis,
        ))
    }

    fn local_priority(
        &self,
        key: &[u8],
        cost: u32,
        priority: Priority,
        source: Source,
        spend: bool,
    ) -> Decision {
        let now_us = self.remote.backend().clock().now_us();
        let schedule = self.schedule(now_us);
        let quota = self.local_quota;
        // A class that leaves `keep` to others admits within the quota less `keep`.
        let keep = priority.keep(quota);
        let hit = self
            .windows
            .hit(key, u64::from(cost), quota - keep, schedule, now_us, spend);
        let reset = Duration::from_micros(hit.ends_at_us.saturating_sub(now_us));
        Self::decision(quota, hit.count, reset, hit.admitted, source).keeping(keep)
    }

    fn local_refund(&self, key: &[u8], cost: u32) {
        let now_us = self.remote.backend().clock().now_us();
        self.windows.refund(key, u64::from(cost), now_us);
    }

    fn local_charge(&self, key: &[u8], cost: u64) {
        let now_us = self.remote.backend().clock().now_us();
        let schedule = self.schedule(now_us);
        self.windows
            .hit(key, cost, u64::MAX, schedule, now_us, true);
    }

    fn local_reset(&self, key: &[u8]) {
        self.windows.reset(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Limiter;

    fn build(config: PeriodConfig) -> Result<PeriodLimiter, ConfigError> {
        PeriodLimiter::new(&Backend::in_process(), "t", config)
    }

    #[test]
    fn invalid_configurations() {
        let sec = Duration::from_secs(1);
        assert_eq!(
            build(PeriodConfig::new(0, sec)).unwrap_err(),
            ConfigError::Zero { setting: "quota" }
        );
        assert_eq!(
            build(PeriodConfig::new(1, Duration::ZERO)).unwrap_err(),
            ConfigError::ZeroDuration { setting: "period" }
        );
        assert_eq!(
            build(PeriodConfig::new(1, Duration::from_micros(999))).unwrap_err(),
            ConfigError::ZeroDuration { setting: "period" }
        );
        assert_eq!(
            build(PeriodConfig::new(1, sec).align(UtcOffset::from_hours(19))).unwrap_err(),
            ConfigError::TooLong { setting: "align" }
        );
        assert!(PeriodLimiter::new(&Backend::in_process(), "", PeriodConfig::new(1, sec)).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn go_zero_states_in_process() {
        let limiter = build(PeriodConfig::new(5, Duration::from_secs(1))).unwrap();
        let one = NonZeroU32::MIN;
        let mut states = Vec::new();
        for _ in 0..7 {
            states.push(limiter.check(b"k", one).await.state);
        }
        use State::*;
        assert_eq!(
            states,
            [Allowed, Allowed, Allowed, Allowed, HitQuota, OverQuota, OverQuota]
        );
        let over = limiter.check(b"k", one).await;
        assert_eq!(over.remaining, 0);
        assert_eq!(over.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(over.source, Source::InProcess);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(limiter.check(b"k", one).await.state, Allowed);
    }

    #[tokio::test(start_paused = true)]
    async fn cost_above_quota_can_never_pass() {
        let limiter = build(PeriodConfig::new(3, Duration::from_secs(1))).unwrap();
        let d = limiter.check(b"k", NonZeroU32::new(4).unwrap()).await;
        assert_eq!(d.state, State::ExceedsCapacity);
        assert_eq!(d.retry_after, None);
        let d = limiter.check(b"k", NonZeroU32::new(3).unwrap()).await;
        assert_eq!(d.state, State::HitQuota);
    }
}
