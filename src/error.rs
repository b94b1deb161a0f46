//! Errors: [`ConfigError`] when a layer or backend is built, [`AdminError`] when an admin
//! action by value does nothing.

use std::fmt;

use crate::key::KeyForError;

/// The error a [`LimitSource`](crate::LimitSource) or a
/// [`CredentialsProvider`](crate::CredentialsProvider) may return: any error
/// that is `Send + Sync` (the same type as `tower::BoxError`).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A configuration that cannot work, reported when the layer or backend is built.
///
/// Nothing on the request path returns this error: every check that can fail is made up
/// front, so a layer that was built successfully never rejects a request because of its
/// own configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A count (quota, rate, burst, limit, buckets) is zero.
    #[non_exhaustive]
    Zero {
        /// The setting that is zero.
        setting: &'static str,
    },
    /// A duration (period, interval, timeout) is zero or too short to be measured.
    #[non_exhaustive]
    ZeroDuration {
        /// The setting that is zero.
        setting: &'static str,
    },
    /// A duration is longer than the backend can represent.
    #[non_exhaustive]
    TooLong {
        /// The setting that is too long.
        setting: &'static str,
    },
    /// A count is larger than the algorithm can handle.
    #[non_exhaustive]
    TooLarge {
        /// The setting that is too large.
        setting: &'static str,
        /// The largest value accepted.
        max: u64,
    },
    /// The Redis URL cannot be parsed.
    #[non_exhaustive]
    InvalidRedisUrl {
        /// What the Redis client said about it.
        reason: String,
    },
    /// A required setting was never given.
    #[non_exhaustive]
    Missing {
        /// The setting that is missing.
        setting: &'static str,
    },
    /// A name or prefix is empty or holds characters that would break key building.
    #[non_exhaustive]
    InvalidName {
        /// The setting that is invalid.
        setting: &'static str,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// A number lies outside the range the setting accepts.
    #[non_exhaustive]
    OutOfRange {
        /// The setting that is out of range.
        setting: &'static str,
        /// The range it accepts.
        reason: &'static str,
    },
    /// Two settings contradict each other.
    #[non_exhaustive]
    Conflict {
        /// What contradicts what.
        reason: &'static str,
    },
    /// A fixed cost (a `u32` [`Cost`](crate::Cost)) above what a limit can ever hold:
    /// every request would be refused (`429` with no `Retry-After`, since waiting never
    /// helps), or every request while Redis is unreachable when `fallback` is true (the
    /// in-process fallback applies the limit times the
    /// [fallback share](crate::BackendBuilder::fallback_share)).
    #[non_exhaustive]
    CostAboveCapacity {
        /// The policy whose capacity is too small (for a set, its smallest member).
        policy: String,
        /// The fixed cost of every request.
        cost: u32,
        /// The most units the policy can admit at once: a fixed window's quota, a token
        /// bucket's burst, a rolling window's limit (times the fallback share when
        /// `fallback` is true).
        capacity: u64,
        /// Whether only the in-process fallback's share of the limit is too small.
        fallback: bool,
    },
    /// A value given as text (a network, a header name, a file, a UTC offset) cannot be
    /// used, or needs a cargo feature that is off.
    #[non_exhaustive]
    InvalidValue {
        /// The setting whose value is invalid.
        setting: &'static str,
        /// Why, with the offending value when it is no secret.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zero { setting } => write!(f, "`{setting}` must be greater than zero"),
            Self::ZeroDuration { setting } => {
                write!(f, "`{setting}` must be at least one millisecond")
            }
            Self::TooLong { setting } => write!(f, "`{setting}` is too long"),
            Self::TooLarge { setting, max } => write!(f, "`{setting}` must be at most {max}"),
            Self::InvalidRedisUrl { reason } => write!(f, "invalid Redis URL: {reason}"),
            Self::Missing { setting: "key" } => f.write_str(
                "a layer needs a key: call `.key(..)` with how requests are told apart (a \
                 `PeerIp`, a header, ...); `.key(GlobalKey)` is one limit shared by every \
                 request",
            ),
            Self::Missing { setting } => write!(f, "`{setting}` is required but was not set"),
            Self::InvalidName { setting, reason } => write!(f, "invalid `{setting}`: {reason}"),
            Self::OutOfRange { setting, reason } => write!(f, "`{setting}` {reason}"),
            Self::Conflict { reason } => write!(f, "conflicting settings: {reason}"),
            Self::InvalidValue { setting, reason } => write!(f, "invalid `{setting}`: {reason}"),
            Self::CostAboveCapacity {
                policy,
                cost,
                capacity,
                fallback: false,
            } => write!(
                f,
                "a fixed cost of {cost} is above the capacity of policy \"{policy}\" \
                 ({capacity}: its quota, burst or limit), so every request would be refused; \
                 lower the cost or raise the limit to at least {cost}"
            ),
            Self::CostAboveCapacity {
                policy,
                cost,
                capacity,
                fallback: true,
            } => write!(
                f,
                "a fixed cost of {cost} is above the capacity of policy \"{policy}\" in the \
                 in-process fallback ({capacity}: its limit times `fallback_share`, rounded \
                 down), so every request would be refused while Redis is unreachable; lower \
                 the cost, raise the limit or `fallback_share`, or choose another \
                 `failure_policy` policy"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Checks a lockout: at least one millisecond, at most ten years.
pub(crate) fn validate_lockout(
    lockout: Option<std::time::Duration>,
) -> Result<Option<std::time::Duration>, ConfigError> {
    match lockout {
        Some(d) if d.as_millis() == 0 => Err(ConfigError::ZeroDuration { setting: "lockout" }),
        Some(d) if d.as_secs() > 10 * 366 * 86_400 => {
            Err(ConfigError::TooLong { setting: "lockout" })
        }
        other => Ok(other),
    }
}

/// Checks a key prefix or limiter name: non-empty, printable, no Redis hash-tag braces.
pub(crate) fn validate_name(setting: &'static str, value: &str) -> Result<(), ConfigError> {
    let reason = if value.is_empty() {
        "must not be empty"
    } else if value.len() > 128 {
        "must be at most 128 bytes"
    } else if value.contains(['{', '}']) {
        "must not contain `{` or `}` (they would change the Redis Cluster hash slot)"
    } else if value
        .chars()
        .any(|c| c.is_control() || c == '"' || c == '\\')
    {
        "must not contain control characters, quotes or backslashes"
    } else {
        return Ok(());
    };
    Err(ConfigError::InvalidName { setting, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_setting() {
        let e = ConfigError::Zero { setting: "quota" };
        assert_eq!(e.to_string(), "`quota` must be greater than zero");
        assert!(validate_name("prefix", "").is_err());
        assert!(validate_name("prefix", "a{b").is_err());
        assert!(validate_name("name", "say \"hi\"").is_err());
        assert!(validate_name("prefix", "ratelimit").is_ok());
    }
}

/// Why an admin action by value did nothing: the value names no key of the layer, the
/// layer's limiter cannot take the action, the action needs one of the layer's policies
/// named, or (a listing) Redis did not answer.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{key::PeerIp, AdminError, Backend, LimitLayer, PeriodConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = PeriodConfig::new(100, Duration::from_secs(60));
/// let layer = LimitLayer::builder(&Backend::in_process(), config)
///     .name("per-ip")
///     .key(PeerIp::new())
///     .build()?;
/// // An API key given to a per-address layer: no request is counted under it.
/// let err = layer.reset_value("trap").await.unwrap_err();
/// assert!(matches!(err, AdminError::Key(_)));
/// assert_eq!(
///     err.to_string(),
///     "the value names no key of this layer: `PeerIp` never counts this value: it is not an IP address"
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminError {
    /// The layer's extractor never counts the value, or cannot say which key it has.
    Key(KeyForError),
    /// The layer's limiter cannot take this action (a [`Limiter`](crate::Limiter) of your own that
    /// keeps the default, which answers `None`).
    #[non_exhaustive]
    Unsupported {
        /// The action: `peek`, `reset`, `block`, `refund` or `list`.
        action: &'static str,
    },
    /// The blocked keys could not be listed
    /// ([`LimitLayer::blocked`](crate::LimitLayer::blocked)): the store of the list did
    /// not answer (on Redis: a connection that failed or timed out, a refused command).
    /// The text says what the store said; it never holds a key, the Redis URL or a
    /// password.
    Listing(String),
    /// The action needs one policy of a layer that has several (a refund on a
    /// [`Plans`](crate::limit::Plans) layer: a key's plan is not known from its value,
    /// see [`LimitLayer::refund_value_in`](crate::LimitLayer::refund_value_in)), or the
    /// policy named is none of the layer's.
    #[non_exhaustive]
    Policy {
        /// The policy named, if one was.
        given: Option<String>,
        /// The layer's policies (`api.free`, `api.pro`).
        policies: Vec<String>,
    },
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key(error) => write!(f, "the value names no key of this layer: {error}"),
            Self::Unsupported { action: "list" } => {
                f.write_str("this layer's limiter cannot list its blocked keys")
            }
            Self::Unsupported { action } => {
                write!(f, "this layer's limiter cannot {action} a key")
            }
            Self::Listing(message) => {
                write!(f, "the blocked keys could not be listed: {message}")
            }
            Self::Policy {
                given: None,
                policies,
            } => write!(
                f,
                "this layer has several policies ({}): name the one to act under",
                policies.join(", ")
            ),
            Self::Policy {
                given: Some(given),
                policies,
            } => write!(
                f,
                "this layer has no policy named `{given}` (it has {})",
                policies.join(", ")
            ),
        }
    }
}

impl std::error::Error for AdminError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Key(error) => Some(error),
            Self::Unsupported { .. } => None,
            Self::Listing(_) | Self::Policy { .. } => None,
        }
    }
}
