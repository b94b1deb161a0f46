//! The outcome of one rate-limit check, as data.

use std::fmt;
use std::time::Duration;

/// Where a request stands against its limit after a check.
///
/// The states follow go-zero's period limiter: the request that uses the last unit of the
/// quota is [`HitQuota`](State::HitQuota) (admitted, and the last one), so a batch job can
/// pause until the window resets instead of running into rejections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Admitted, with quota left.
    Allowed,
    /// Admitted, and it used the last of the quota.
    HitQuota,
    /// Rejected: the limit is used up until the time in [`Decision::retry_after`].
    OverQuota,
    /// Rejected for good: the request costs more than the limit can ever admit at once
    /// (a cost above the burst or the limit). Waiting does not help, so there is no
    /// retry-after.
    ExceedsCapacity,
}

impl State {
    /// Whether the request was admitted.
    #[must_use]
    pub fn is_admitted(self) -> bool {
        matches!(self, Self::Allowed | Self::HitQuota)
    }
}

/// Which store answered a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The shared Redis state.
    Redis,
    /// The in-process state, because the backend has no Redis.
    InProcess,
    /// The in-process state standing in while Redis is unreachable.
    Fallback,
    /// The local deny cache: Redis refused this key moments ago until a time not yet
    /// reached.
    DenyCache,
    /// Redis is unreachable and the layer's failure policy admits everything.
    FailOpen,
    /// Redis is unreachable and the layer's failure policy refuses everything.
    FailClosed,
    /// A lease of quota this process took from Redis moments ago (token buckets with
    /// [`lease`](crate::TokenBucketConfig::lease)): admitted without a
    /// round trip.
    Lease,
}

impl Source {
    /// Its name in traces: `redis`, `in_process`, `fallback`, `deny_cache`,
    /// `fail_open`, `fail_closed` or `lease`.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::InProcess => "in_process",
            Self::Fallback => "fallback",
            Self::DenyCache => "deny_cache",
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::Lease => "lease",
        }
    }
}

/// The outcome of one check: state, limit, what is left, and when it resets.
///
/// Admitted requests carry their `Decision` in the request extensions, so a handler can
/// read it:
///
/// ```
/// use axum::Extension;
/// use tower_redis_ratelimit::{Decision, State};
///
/// async fn handler(Extension(decision): Extension<Decision>) -> String {
///     if decision.state == State::HitQuota {
///         format!("that was the last one; next window in {:?}", decision.reset)
///     } else {
///         format!("{} left", decision.remaining)
///     }
/// }
/// # let _ = axum::Router::<()>::new().route("/", axum::routing::get(handler));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Admitted or not, and why.
    pub state: State,
    /// The limit this check ran against (quota, burst, or window limit).
    pub limit: u64,
    /// Units still available right after this check.
    pub remaining: u64,
    /// Time until the limit is fully available again (window end, or a full bucket).
    pub reset: Duration,
    /// For a rejected request that can succeed later: the time until it could be admitted.
    pub retry_after: Option<Duration>,
    /// Which store answered.
    pub source: Source,
    /// The `RateLimit-Policy` value when the limit was chosen for this request
    /// ([`dynamic`](crate::DynamicLimits) limits) rather than the layer's policy.
    pub(crate) policy_header: Option<http::HeaderValue>,
    /// The `RateLimit` value when it lists more than one limit ([`set`](crate::LimitSet)s),
    /// checked as a header value when it is sent. Bytes rather than a `HeaderValue`
    /// (8 bytes less): a `Decision` of at most 128 bytes is moved with a few vector
    /// moves instead of a `memcpy` call, and every request moves it several times.
    pub(crate) ratelimit_header: Option<RateLimitValue>,
    /// For a [set](crate::LimitSet)'s refusal: the index of the limit that refused (the
    /// one whose numbers this decision carries); `None` otherwise, and for a refusal by
    /// the set's block.
    pub(crate) rejected_by: Option<u8>,
}

/// A `RateLimit` value not yet checked as a header value (see
/// [`Decision::ratelimit_header`]); shown by `Debug` as a header value is.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RateLimitValue(pub(crate) bytes::Bytes);

impl fmt::Debug for RateLimitValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(value) => fmt::Debug::fmt(value, f),
            Err(_) => fmt::Debug::fmt(&self.0, f),
        }
    }
}

impl Decision {
    /// Builds a decision; meant for [`Limiter`](crate::Limiter) implementations.
    #[must_use]
    pub fn new(state: State, limit: u64, remaining: u64, reset: Duration, source: Source) -> Self {
        Self {
            state,
            limit,
            remaining: remaining.min(limit),
            reset,
            retry_after: None,
            source,
            policy_header: None,
            ratelimit_header: None,
            rejected_by: None,
        }
    }

    /// Sets the time after which a rejected request could be admitted.
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// This decision for a key blocked for `wait` more: refused, with nothing left until
    /// then (the wait is the longer of the block's and the limit's own).
    pub(crate) fn blocked(mut self, wait: Duration) -> Self {
        self.state = State::OverQuota;
        self.remaining = 0;
        self.reset = self.reset.max(wait);
        self.retry_after = Some(self.retry_after.map_or(wait, |r| r.max(wait)));
        self
    }

    /// This decision for a request that may use only part of the limit (a priority
    /// class, [`LayerBuilder::priority`](crate::LayerBuilder::priority)), which leaves `keep`
    /// units of it to other requests: what remains is what remains for this request's
    /// class; the limit stays the limit's.
    pub(crate) fn keeping(mut self, keep: u64) -> Self {
        self.remaining = self.remaining.saturating_sub(keep);
        if self.state == State::Allowed && self.remaining == 0 {
            self.state = State::HitQuota;
        }
        self
    }

    /// Whether the request was admitted.
    #[must_use]
    pub fn is_admitted(&self) -> bool {
        self.state.is_admitted()
    }
}

/// The decisions of every stacked layer that admitted a request, outermost first.
///
/// A request that passed one layer carries only its [`Decision`]; once a second layer
/// admits it too, the request extensions also hold `Decisions` with both (and any
/// further layer's), while `Decision` itself is the innermost layer's.
///
/// ```
/// use axum::Extension;
/// use tower_redis_ratelimit::{Decision, Decisions};
///
/// async fn handler(
///     Extension(last): Extension<Decision>,
///     all: Option<Extension<Decisions>>,
/// ) -> String {
///     let left = all.map_or(last.remaining, |Extension(all)| {
///         all.iter().map(|d| d.remaining).min().unwrap_or(0)
///     });
///     format!("{left} left before some limit refuses")
/// }
/// # let _ = axum::Router::<()>::new().route("/", axum::routing::get(handler));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decisions(pub(crate) Vec<Decision>);

/// The decisions as a slice, outermost layer first (`all.len()`, `all.iter()`,
/// `all[0]`).
impl std::ops::Deref for Decisions {
    type Target = [Decision];

    fn deref(&self) -> &[Decision] {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// What a limiter enforces, as advertised in the `RateLimit-Policy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    name: String,
    quota: u64,
    window: Duration,
    /// The algorithm's name in a caller's usage (`fixed_window`, ...; `custom` for a
    /// limiter of your own).
    algorithm: &'static str,
}

impl Policy {
    /// A policy named `name` admitting `quota` units per `window`.
    #[must_use]
    pub fn new(name: impl Into<String>, quota: u64, window: Duration) -> Self {
        Self {
            name: name.into(),
            quota,
            window,
            algorithm: "custom",
        }
    }

    /// The policy of a built-in algorithm, named so in a caller's usage.
    pub(crate) fn with_algorithm(mut self, algorithm: &'static str) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The algorithm's name: `fixed_window`, `token_bucket`, `rolling_window`,
    /// `in_flight`, or `custom` (for the admin feature's usage route).
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn algorithm(&self) -> &'static str {
        self.algorithm
    }

    /// The policy's name, also the namespace of its keys.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Units admitted per window (`q` in `RateLimit-Policy`).
    #[must_use]
    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// The window (`w` in `RateLimit-Policy`, in whole seconds rounded up).
    #[must_use]
    pub fn window(&self) -> Duration {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admitted_states() {
        assert!(State::Allowed.is_admitted());
        assert!(State::HitQuota.is_admitted());
        assert!(!State::OverQuota.is_admitted());
        assert!(!State::ExceedsCapacity.is_admitted());
    }

    #[test]
    fn a_decision_is_moved_inline() {
        // LLVM copies up to 128 bytes with inline moves on x86-64; a larger decision is
        // copied by a `memcpy` call at every move.
        assert!(std::mem::size_of::<Decision>() <= 128);
    }

    #[test]
    fn a_set_value_reads_as_a_header_value_in_debug() {
        let value = "\"a\";r=1;t=1, \"b\";r=2;t=3";
        assert_eq!(
            format!(
                "{:?}",
                RateLimitValue(bytes::Bytes::from_static(value.as_bytes()))
            ),
            format!("{:?}", http::HeaderValue::from_static(value))
        );
    }

    #[test]
    fn remaining_never_exceeds_limit() {
        let d = Decision::new(State::Allowed, 5, 9, Duration::ZERO, Source::InProcess);
        assert_eq!(d.remaining, 5);
    }
}

/// The part of a limit a request of a priority class may use
/// ([`LayerBuilder::priority`](crate::LayerBuilder::priority)), in millionths: a check of
/// `cost` admits when `cost` plus the units the class leaves to other requests
/// ([`keep`](Self::keep)) fit, and spends only `cost`. Millionths rather than a float,
/// so that every host works out the same units (`0.29` of 100 is 29, where the float
/// product is 28.999…).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Priority(u32);

impl Priority {
    /// The whole limit: a check as without a priority.
    pub(crate) const WHOLE: Priority = Priority(1_000_000);

    /// `fraction` of the limit, rounded to the millionth: below 0 (or NaN) none of it,
    /// above 1 all of it.
    pub(crate) fn new(fraction: f64) -> Self {
        if fraction.is_nan() || fraction <= 0.0 {
            return Priority(0);
        }
        // (Within 0..=1_000_000 by the clamp: the cast is exact.)
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Priority((fraction.min(1.0) * 1_000_000.0).round() as u32)
    }

    /// Whether it is the whole limit.
    pub(crate) fn is_whole(self) -> bool {
        self == Self::WHOLE
    }

    /// The units of a limit of `capacity` this class may use: `capacity × fraction`,
    /// rounded down.
    pub(crate) fn allowed(self, capacity: u64) -> u64 {
        let units = u128::from(capacity) * u128::from(self.0) / 1_000_000;
        u64::try_from(units).unwrap_or(capacity)
    }

    /// The units of a limit of `capacity` it leaves to other requests.
    pub(crate) fn keep(self, capacity: u64) -> u64 {
        capacity - self.allowed(capacity)
    }
}

#[cfg(test)]
mod priority_tests {
    use super::Priority;

    #[test]
    fn a_priority_is_exact_in_units() {
        assert_eq!(Priority::new(0.29).allowed(100), 29);
        assert_eq!(Priority::new(0.6).keep(100), 40);
        assert_eq!(Priority::new(0.85).keep(100), 15);
        assert_eq!(Priority::new(1.0).keep(100), 0);
        assert!(Priority::new(2.0).is_whole());
        assert_eq!(Priority::new(f64::NAN).allowed(100), 0);
        assert_eq!(Priority::new(-1.0).allowed(u64::MAX), 0);
        assert_eq!(Priority::new(0.5).allowed(u64::MAX), u64::MAX / 2);
        assert_eq!(Priority::new(0.6).allowed(7), 4);
    }
}
