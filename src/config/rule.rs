//! One rate-limit rule as data: [`RuleConfig`] and its algorithm, [`LimitConfig`].

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde::{Deserialize, Serialize};

use super::key::{KeyConfig, RuleKey};
use crate::backend::{Backend, FailurePolicy, ShareRounding};
use crate::cost::FixedCost;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::period::{Calendar, PeriodConfig, PeriodLimiter, UtcOffset, Weekday};
use crate::rolling::{RollingConfig, RollingWindowLimiter};
use crate::service::{Algorithm, LayerBuilder, LimitLayer, MissingKey};
use crate::token_bucket::{TokenBucketConfig, TokenBucketLimiter};

/// The layer a [`RuleConfig`] builds: one type whatever the algorithm and the key, so a
/// rule file's layers fit in one `Vec`.
pub type RuleLayer = LimitLayer<Arc<dyn Limiter>, RuleKey, FixedCost>;

/// One rate-limit rule: a named limit, its key and how its layer behaves.
///
/// Every setting left out keeps the default of [`LayerBuilder`]. Unknown fields are
/// errors.
///
/// ```toml
/// name = "api"
/// limit = { algorithm = "token_bucket", rate = 100, per = "1s", burst = 20 }
/// key = { or = [{ header = "x-api-key" }, "peer_ip"] }
/// failure_policy = "fallback"      # or "fail_open", "fail_closed"
/// fallback_share = 0.25
/// shadow = false
/// headers = true                   # `RateLimit` headers on admitted responses
/// missing_key = { reject = 400 }   # or "allow", or { key = "anonymous" }
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RuleConfig {
    /// The policy's name ([`LayerBuilder::name`]).
    pub name: String,
    /// The algorithm and its parameters.
    pub limit: LimitConfig,
    /// How requests are told apart (default `"global"`).
    #[serde(default)]
    pub key: KeyConfig,
    /// The units every request costs (default 1; [`FixedCost`]). Zero is refused: a rule
    /// whose requests are all free would never limit anything.
    #[serde(default = "one")]
    pub cost: u32,
    /// [`LayerBuilder::on_redis_failure`] (default: the backend's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    /// [`LayerBuilder::fallback_share`] (default: the backend's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_share: Option<f64>,
    /// [`LayerBuilder::fallback_rounding`] (default: the backend's): `at_least_one` or
    /// `within_limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_rounding: Option<ShareRounding>,
    /// [`LayerBuilder::shadow`] (default off).
    #[serde(default)]
    pub shadow: bool,
    /// [`LayerBuilder::admitted_headers`] (default on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<bool>,
    /// [`LayerBuilder::decision_extension`] (default on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_extension: Option<bool>,
    /// [`LayerBuilder::on_missing_key`] (default: reject with 400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_key: Option<MissingKeyConfig>,
    /// [`LayerBuilder::max_key_len`] (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_key_len: Option<usize>,
}

fn one() -> u32 {
    1
}

impl RuleConfig {
    /// A rule named `name` that applies `limit` to one global key; set the other
    /// fields before building.
    pub fn new(name: impl Into<String>, limit: LimitConfig) -> Self {
        Self {
            name: name.into(),
            limit,
            key: KeyConfig::default(),
            cost: 1,
            failure_policy: None,
            fallback_share: None,
            fallback_rounding: None,
            shadow: false,
            headers: None,
            decision_extension: None,
            missing_key: None,
            max_key_len: None,
        }
    }

    /// The [`LayerBuilder`] this rule sets up, for settings a file cannot hold (a
    /// rejection response of your own: [`LayerBuilder::on_rejection`]).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a zero cost, or a key or missing-key setting that cannot
    /// work; the others are checked by [`LayerBuilder::build`].
    pub fn builder(
        &self,
        backend: &Backend,
    ) -> Result<LayerBuilder<LimitConfig, RuleKey, FixedCost>, ConfigError> {
        if self.cost == 0 {
            return Err(ConfigError::Zero { setting: "cost" });
        }
        let mut builder = LayerBuilder::new(backend, self.limit.clone())
            .name(self.name.clone())
            .key(self.key.build()?)
            .cost(FixedCost(self.cost))
            .shadow(self.shadow);
        if let Some(policy) = self.failure_policy {
            builder = builder.on_redis_failure(policy);
        }
        if let Some(share) = self.fallback_share {
            builder = builder.fallback_share(share);
        }
        if let Some(rounding) = self.fallback_rounding {
            builder = builder.fallback_rounding(rounding);
        }
        if let Some(headers) = self.headers {
            builder = builder.admitted_headers(headers);
        }
        if let Some(extension) = self.decision_extension {
            builder = builder.decision_extension(extension);
        }
        if let Some(missing) = &self.missing_key {
            builder = builder.on_missing_key(missing.build()?);
        }
        if let Some(len) = self.max_key_len {
            builder = builder.max_key_len(len);
        }
        Ok(builder)
    }

    /// Checks every setting with the builders' own checks and builds the layer.
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] the builders report for the first setting that cannot work.
    pub fn build(&self, backend: &Backend) -> Result<RuleLayer, ConfigError> {
        self.builder(backend)?.build()
    }
}

/// An algorithm and its parameters, tagged by `algorithm`.
///
/// | `algorithm` | parameters | built as |
/// |---|---|---|
/// | `"period"` | `quota`, `period`, optional `align` (`"UTC"`, `"+05:30"`, `"-08:00"`); or `quota`, `calendar` (`"day"`, `"week"`, `"month"`), `zone` (an IANA name) and for weeks `week_starts` (default `"monday"`) | [`PeriodConfig`] |
/// | `"token_bucket"` | `rate`, `per` (default `"1s"`), `burst` | [`TokenBucketConfig`] |
/// | `"rolling_window"` | `limit`, `buckets`, `interval` | [`RollingConfig`] |
///
/// Durations are [`humantime`](https://docs.rs/humantime) strings: `"100ms"`, `"2s"`,
/// `"1m"`, `"1day"`, `"1h 30m"`.
///
/// ```toml
/// # 5 SMS codes per phone per local day in New York (23 or 25 hours on DST days).
/// algorithm = "period"
/// quota = 5
/// calendar = "day"
/// zone = "America/New_York"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
#[non_exhaustive]
pub enum LimitConfig {
    /// A fixed window.
    Period(PeriodLimitConfig),
    /// A token bucket.
    TokenBucket(TokenBucketLimitConfig),
    /// A rolling window.
    RollingWindow(RollingLimitConfig),
}

/// The parameters of [`LimitConfig::Period`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PeriodLimitConfig {
    /// Units per window.
    pub quota: u64,
    /// The window (none with `calendar`).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Duration::is_zero"
    )]
    pub period: Duration,
    /// Aligns windows to local time at this UTC offset (`"UTC"`, `"+05:30"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub align: Option<String>,
    /// Calendar windows in place of `period`: `"day"`, `"week"` or `"month"` in `zone`
    /// ([`Calendar`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<String>,
    /// The IANA time zone of `calendar` (`"America/New_York"`, `"UTC"`); required with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The first day of a `"week"` calendar (`"monday"` to `"sunday"`; default
    /// `"monday"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub week_starts: Option<String>,
}

impl PeriodLimitConfig {
    /// The limiter's settings, with the calendar's names parsed (the zone itself is
    /// checked when the limiter is built).
    fn settings(&self) -> Result<PeriodConfig, ConfigError> {
        let calendar = match (&self.calendar, &self.zone) {
            (None, None) if self.week_starts.is_none() => None,
            (None, _) => {
                return Err(ConfigError::Missing {
                    setting: "calendar",
                })
            }
            (Some(_), None) => return Err(ConfigError::Missing { setting: "zone" }),
            (Some(unit), Some(zone)) => Some(match unit.as_str() {
                "week" => {
                    let first = match &self.week_starts {
                        Some(day) => day.parse()?,
                        None => Weekday::Monday,
                    };
                    Calendar::week(zone, first)
                }
                _ if self.week_starts.is_some() => {
                    return Err(ConfigError::Conflict {
                        reason: "`week_starts` is for a \"week\" calendar",
                    })
                }
                "day" => Calendar::day(zone),
                "month" => Calendar::month(zone),
                other => {
                    return Err(ConfigError::InvalidValue {
                        setting: "calendar",
                        reason: format!("{other:?} is not \"day\", \"week\" or \"month\""),
                    })
                }
            }),
        };
        let mut config = match calendar {
            Some(calendar) => {
                let mut config = PeriodConfig::calendar(self.quota, calendar);
                // A period given too is the limiter's to refuse.
                config.period = self.period;
                config
            }
            None => PeriodConfig::new(self.quota, self.period),
        };
        if let Some(offset) = &self.align {
            config = config.align(parse_offset(offset)?);
        }
        Ok(config)
    }
}

/// The parameters of [`LimitConfig::TokenBucket`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TokenBucketLimitConfig {
    /// Tokens added per `per`.
    pub rate: u64,
    /// The refill period (default one second).
    #[serde(default = "one_second", with = "humantime_serde")]
    pub per: Duration,
    /// The bucket's size.
    pub burst: u64,
}

fn one_second() -> Duration {
    Duration::from_secs(1)
}

/// The parameters of [`LimitConfig::RollingWindow`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RollingLimitConfig {
    /// Units within any window.
    pub limit: u64,
    /// Buckets per window.
    pub buckets: u32,
    /// The length of one bucket.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl LimitConfig {
    /// A fixed window of `quota` per `period`.
    pub fn period(quota: u64, period: Duration) -> Self {
        Self::Period(PeriodLimitConfig {
            quota,
            period,
            align: None,
            calendar: None,
            zone: None,
            week_starts: None,
        })
    }

    /// A fixed window of `quota` per local `calendar` unit (`"day"`, `"week"` or
    /// `"month"`) in the IANA time `zone`.
    pub fn calendar(quota: u64, calendar: &str, zone: &str) -> Self {
        Self::Period(PeriodLimitConfig {
            quota,
            period: Duration::ZERO,
            align: None,
            calendar: Some(calendar.to_owned()),
            zone: Some(zone.to_owned()),
            week_starts: None,
        })
    }

    /// A token bucket of `rate` per `per` with `burst`.
    pub fn token_bucket(rate: u64, per: Duration, burst: u64) -> Self {
        Self::TokenBucket(TokenBucketLimitConfig { rate, per, burst })
    }

    /// A rolling window of `limit` within `buckets` x `interval`.
    pub fn rolling_window(limit: u64, buckets: u32, interval: Duration) -> Self {
        Self::RollingWindow(RollingLimitConfig {
            limit,
            buckets,
            interval,
        })
    }
}

/// Builds the algorithm's own limiter (with its own checks) behind one type.
impl Algorithm for LimitConfig {
    type Limiter = Arc<dyn Limiter>;

    fn build(self, backend: &Backend, name: &str) -> Result<Self::Limiter, ConfigError> {
        Ok(match self {
            Self::Period(c) => Arc::new(PeriodLimiter::new(backend, name, c.settings()?)?),
            Self::TokenBucket(c) => Arc::new(TokenBucketLimiter::new(
                backend,
                name,
                TokenBucketConfig::new(c.rate, c.per, c.burst),
            )?),
            Self::RollingWindow(c) => Arc::new(RollingWindowLimiter::new(
                backend,
                name,
                RollingConfig::new(c.limit, c.buckets, c.interval),
            )?),
        })
    }
}

/// `UTC`, `Z`, `+HH`, `+HH:MM` or `-HH:MM`; the range is the period limiter's to check.
fn parse_offset(text: &str) -> Result<UtcOffset, ConfigError> {
    let invalid = || ConfigError::InvalidValue {
        setting: "align",
        reason: format!("{text:?} is not a UTC offset such as \"UTC\" or \"+05:30\""),
    };
    let text = text.trim();
    if text.eq_ignore_ascii_case("utc") || text == "Z" {
        return Ok(UtcOffset::UTC);
    }
    let (sign, rest) = match text.as_bytes().first() {
        Some(b'+') => (1, &text[1..]),
        Some(b'-') => (-1, &text[1..]),
        _ => return Err(invalid()),
    };
    let (hours, minutes) = rest.split_once(':').unwrap_or((rest, "0"));
    let digits = |s: &str| {
        (!s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<i32>().ok())
            .flatten()
    };
    let (Some(hours), Some(minutes)) = (digits(hours), digits(minutes)) else {
        return Err(invalid());
    };
    if minutes >= 60 {
        return Err(invalid());
    }
    Ok(UtcOffset::from_seconds(
        sign * (hours * 3_600 + minutes * 60),
    ))
}

/// What a rule does with a request that has no key: `"allow"`, `{ reject = 400 }` or
/// `{ key = "anonymous" }` ([`MissingKey`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MissingKeyConfig {
    /// Answer with this HTTP status.
    Reject(u16),
    /// Let the request through unlimited.
    Allow,
    /// Limit the request under this constant key.
    Key(String),
}

impl MissingKeyConfig {
    fn build(&self) -> Result<MissingKey, ConfigError> {
        Ok(match self {
            Self::Reject(code) => MissingKey::Reject(
                StatusCode::from_u16(*code)
                    .ok()
                    .filter(|status| status.is_client_error() || status.is_server_error())
                    .ok_or_else(|| ConfigError::InvalidValue {
                        setting: "missing_key",
                        reason: format!("{code} is not an HTTP error status (400 to 599)"),
                    })?,
            ),
            Self::Allow => MissingKey::Allow,
            Self::Key(key) => MissingKey::Key(Cow::Owned(key.clone())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_offset;

    #[test]
    fn offsets() {
        assert_eq!(parse_offset("UTC").unwrap().seconds(), 0);
        assert_eq!(parse_offset("+05:30").unwrap().seconds(), 19_800);
        assert_eq!(parse_offset("-08").unwrap().seconds(), -28_800);
        for bad in ["", "5", "+5:60", "+123", "+aa", "++1"] {
            assert!(parse_offset(bad).is_err(), "{bad}");
        }
    }
}
