//! Why a wait for the limit failed, and the outbound service's error.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use crate::decision::Decision;

/// Why [`Waiter::acquire`](super::Waiter::acquire) (or a call through the
/// [`OutboundLayer`](super::OutboundLayer)) gave up. Nothing was spent against the
/// limit in any case.
///
/// ```
/// use tower_redis_ratelimit::outbound::WaitError;
///
/// fn describe(error: &WaitError) -> &'static str {
///     match error {
///         WaitError::TimedOut { .. } => "try again later",
///         WaitError::ExceedsCapacity { .. } => "split the request",
///         WaitError::Unavailable { .. } => "the shared limit is unreachable",
///         _ => "refused",
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The limit would not admit the request within the maximum wait: the next possible
    /// admission lies beyond it (known at once, so the caller did not wait for nothing),
    /// or the waiters ahead of it on the same key held the queue until the deadline.
    #[error("the rate limit would not admit the request within the maximum wait of {max_wait:?}")]
    #[non_exhaustive]
    TimedOut {
        /// The maximum wait that was given.
        max_wait: Duration,
        /// The last refusal, with its `retry_after`; `None` when the deadline passed
        /// while waiters ahead on the same key held the queue.
        decision: Option<Decision>,
    },
    /// The cost is more than the limit can ever admit at once (above the burst or the
    /// limit): waiting cannot help.
    #[error("the request costs more than the rate limit can ever admit at once")]
    #[non_exhaustive]
    ExceedsCapacity {
        /// The refusal ([`State::ExceedsCapacity`](crate::State::ExceedsCapacity)).
        decision: Decision,
    },
    /// Redis cannot answer and the limiter's [`FailurePolicy`](crate::FailurePolicy) is
    /// `FailClosed`: the request is refused rather than sent unlimited.
    #[error("redis is unreachable and the rate limit's failure policy refuses")]
    #[non_exhaustive]
    Unavailable {
        /// The refusal ([`Source::FailClosed`](crate::Source::FailClosed)).
        decision: Decision,
    },
    /// A limiter refused without saying when the request could pass (no `retry_after`
    /// and no `reset`); only custom [`Limiter`](crate::Limiter)s do that.
    #[error("the rate limit refused without a time at which the request could pass")]
    #[non_exhaustive]
    Refused {
        /// The refusal.
        decision: Decision,
    },
}

impl WaitError {
    /// The last decision the limiter made, if any.
    #[must_use]
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Self::TimedOut { decision, .. } => decision.as_ref(),
            Self::ExceedsCapacity { decision }
            | Self::Unavailable { decision }
            | Self::Refused { decision } => Some(decision),
        }
    }
}

/// The error of the [`Outbound`](super::Outbound) service: the wait for the limit
/// failed (the inner service was not called), or the inner service failed.
///
/// ```
/// use tower_redis_ratelimit::outbound::{OutboundError, WaitError};
///
/// fn retryable<E>(error: &OutboundError<E>) -> bool {
///     matches!(error, OutboundError::Wait(WaitError::TimedOut { .. }))
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum OutboundError<E> {
    /// The limit did not admit the request; it was not sent.
    Wait(WaitError),
    /// The inner service's own error.
    Inner(E),
}

impl<E> OutboundError<E> {
    /// The wait error, if the request was not sent.
    #[must_use]
    pub fn wait_error(&self) -> Option<&WaitError> {
        match self {
            Self::Wait(error) => Some(error),
            Self::Inner(_) => None,
        }
    }

    /// The inner service's error, if it failed.
    pub fn into_inner(self) -> Option<E> {
        match self {
            Self::Inner(error) => Some(error),
            Self::Wait(_) => None,
        }
    }
}

impl<E> fmt::Display for OutboundError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Wait(_) => {
                f.write_str("the request was not sent: waiting for the rate limit failed")
            }
            Self::Inner(_) => f.write_str("the inner service failed"),
        }
    }
}

impl<E: Error + 'static> Error for OutboundError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Wait(error) => Some(error),
            Self::Inner(error) => Some(error),
        }
    }
}
