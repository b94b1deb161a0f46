//! One rate-limit rule as data: [`RuleConfig`] and its algorithm, [`LimitConfig`].

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde::{Deserialize, Serialize};

use super::key::KeyConfig;
use crate::backend::{Backend, FailurePolicy, ShareRounding};
use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::limit::{Algorithm, LayerBuilder, LimitLayer, MissingKey};
use crate::limiter::Limiter;
use crate::period::{Calendar, PeriodConfig, PeriodLimiter, UtcOffset, Weekday};
use crate::rolling::{RollingConfig, RollingWindowLimiter};
use crate::set::LimitConfig;
use crate::token_bucket::{TokenBucketConfig, TokenBucketLimiter};

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
///
/// In YAML the same forms are maps too (`missing_key: {reject: 401}`, `allow`,
/// `{key: anonymous}`); YAML's own tags (`!reject 401`) are read as well.
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
    /// The units every request costs (default 1: a fixed cost). Zero is refused: a rule
    /// whose requests are all free would never limit anything.
    #[serde(default = "one")]
    pub cost: u32,
    /// [`LayerBuilder::failure_policy`] (default: the backend's).
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
    pub missing_key: Option<MissingKey>,
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
    ) -> Result<LayerBuilder<LimitConfig, Box<dyn KeyExtractor>, u32>, ConfigError> {
        if self.cost == 0 {
            return Err(ConfigError::Zero { setting: "cost" });
        }
        let mut builder = LayerBuilder::new(backend, self.limit)
            .name(self.name.clone())
            .key(Box::new(self.key.build()?) as Box<dyn KeyExtractor>)
            .cost(self.cost)
            .shadow(self.shadow);
        if let Some(policy) = self.failure_policy {
            builder = builder.failure_policy(policy);
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
            builder = builder.on_missing_key(missing.clone());
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
    #[allow(clippy::type_complexity)] // the one type every rule builds, named in full
    pub fn build(
        &self,
        backend: &Backend,
    ) -> Result<LimitLayer<Arc<dyn Limiter>, Box<dyn KeyExtractor>>, ConfigError> {
        self.builder(backend)?.build()
    }
}

/// How a [`PeriodConfig`] is written in a file (the `"period"` row of [`LimitConfig`]).
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PeriodFile {
    quota: u64,
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Duration::is_zero"
    )]
    period: Duration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    align: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    calendar: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    week_starts: Option<String>,
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    lockout: Option<Duration>,
}

impl TryFrom<PeriodFile> for PeriodConfig {
    type Error = ConfigError;

    /// The calendar's names parsed (the zone itself is checked when the limiter is
    /// built).
    fn try_from(file: PeriodFile) -> Result<Self, ConfigError> {
        let calendar = match (&file.calendar, &file.zone) {
            (None, None) if file.week_starts.is_none() => None,
            (None, _) => {
                return Err(ConfigError::Missing {
                    setting: "calendar",
                })
            }
            (Some(_), None) => return Err(ConfigError::Missing { setting: "zone" }),
            (Some(unit), Some(zone)) => Some(match unit.as_str() {
                "week" => {
                    let first = match &file.week_starts {
                        Some(day) => day.parse()?,
                        None => Weekday::Monday,
                    };
                    Calendar::week(zone, first)
                }
                _ if file.week_starts.is_some() => {
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
                let mut config = PeriodConfig::calendar(file.quota, calendar);
                // A period given too is the limiter's to refuse.
                config.period = file.period;
                config
            }
            None => PeriodConfig::new(file.quota, file.period),
        };
        if let Some(offset) = &file.align {
            config = config.align(parse_offset(offset)?);
        }
        config.lockout = file.lockout;
        Ok(config)
    }
}

impl From<PeriodConfig> for PeriodFile {
    fn from(config: PeriodConfig) -> Self {
        let (calendar, zone, week_starts) = match config.calendar {
            Some(calendar) => {
                let (unit, week_starts) = calendar.unit_names();
                (
                    Some(unit.to_owned()),
                    Some(calendar.zone().to_owned()),
                    week_starts.map(str::to_owned),
                )
            }
            None => (None, None, None),
        };
        Self {
            quota: config.quota,
            period: config.period,
            align: config.align.map(format_offset),
            calendar,
            zone,
            week_starts,
            lockout: config.lockout,
        }
    }
}

/// How a [`TokenBucketConfig`] is written in a file (the `"token_bucket"` row of
/// [`LimitConfig`]).
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenBucketFile {
    rate: u64,
    #[serde(default = "one_second", with = "humantime_serde")]
    per: Duration,
    burst: u64,
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    lockout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease: Option<LeaseFile>,
}

/// A token bucket's `lease = { size = 50, lifetime = "100ms" }`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct LeaseFile {
    size: u64,
    #[serde(with = "humantime_serde")]
    lifetime: Duration,
}

fn one_second() -> Duration {
    Duration::from_secs(1)
}

impl From<TokenBucketFile> for TokenBucketConfig {
    fn from(file: TokenBucketFile) -> Self {
        let mut config = TokenBucketConfig::new(file.rate, file.per, file.burst);
        config.lockout = file.lockout;
        config.lease = file.lease.map(|lease| (lease.size, lease.lifetime));
        config
    }
}

impl From<TokenBucketConfig> for TokenBucketFile {
    fn from(config: TokenBucketConfig) -> Self {
        Self {
            rate: config.rate,
            per: config.period,
            burst: config.burst,
            lockout: config.lockout,
            lease: config
                .lease
                .map(|(size, lifetime)| LeaseFile { size, lifetime }),
        }
    }
}

/// How a [`RollingConfig`] is written in a file (the `"rolling_window"` row of
/// [`LimitConfig`]).
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RollingFile {
    limit: u64,
    buckets: u32,
    #[serde(with = "humantime_serde")]
    interval: Duration,
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    lockout: Option<Duration>,
}

impl From<RollingFile> for RollingConfig {
    fn from(file: RollingFile) -> Self {
        let mut config = RollingConfig::new(file.limit, file.buckets, file.interval);
        config.lockout = file.lockout;
        config
    }
}

impl From<RollingConfig> for RollingFile {
    fn from(config: RollingConfig) -> Self {
        Self {
            limit: config.limit,
            buckets: config.buckets,
            interval: config.interval,
            lockout: config.lockout,
        }
    }
}

/// Builds the algorithm's own limiter (with its own checks) behind one type.
impl Algorithm for LimitConfig {
    type Limiter = Arc<dyn Limiter>;

    fn build(self, backend: &Backend, name: &str) -> Result<Self::Limiter, ConfigError> {
        Ok(match self {
            Self::Period(c) => Arc::new(PeriodLimiter::new(backend, name, c)?),
            Self::TokenBucket(c) => Arc::new(TokenBucketLimiter::new(backend, name, c)?),
            Self::RollingWindow(c) => Arc::new(RollingWindowLimiter::new(backend, name, c)?),
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

/// The form [`parse_offset`] reads: `UTC`, or `+HH:MM` / `-HH:MM`.
fn format_offset(offset: UtcOffset) -> String {
    let seconds = offset.seconds();
    if seconds == 0 {
        return "UTC".to_owned();
    }
    let sign = if seconds < 0 { '-' } else { '+' };
    let minutes = seconds.unsigned_abs() / 60;
    format!("{sign}{:02}:{:02}", minutes / 60, minutes % 60)
}

/// How a [`MissingKey`] is written in a file: `"allow"`, `{ reject = 400 }` or
/// `{ key = "anonymous" }`, in every format: a one-entry table or map (TOML, JSON, and
/// YAML's `{reject: 401}`), or an enum value the format has its own syntax for (YAML's
/// `!reject 401`).
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MissingKeyFile {
    Reject(u16),
    Allow,
    Key(String),
}

/// The names of [`MissingKeyFile`], for serde's messages.
const MISSING_KEY_FORMS: &[&str] = &["reject", "allow", "key"];

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum MissingKeyTag {
    Reject,
    Allow,
    Key,
}

/// The same enum, derived: what an enum value of the format (a YAML tag) reads into.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum MissingKeyEnum {
    Reject(u16),
    Allow,
    Key(String),
}

impl<'de> Deserialize<'de> for MissingKeyFile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{self, EnumAccess, MapAccess, Visitor};

        struct Form;

        impl<'de> Visitor<'de> for Form {
            type Value = MissingKeyFile;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"allow\", { reject = <status> } or { key = \"<key>\" }")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<MissingKeyFile, E> {
                match name {
                    "allow" => Ok(MissingKeyFile::Allow),
                    "reject" | "key" => Err(E::custom(format_args!(
                        "`{name}` needs a value: write {{ {name} = ... }}"
                    ))),
                    _ => Err(E::unknown_variant(name, MISSING_KEY_FORMS)),
                }
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<MissingKeyFile, M::Error> {
                let Some(tag) = map.next_key::<MissingKeyTag>()? else {
                    return Err(de::Error::invalid_length(0, &"one of reject, allow, key"));
                };
                let form = match tag {
                    MissingKeyTag::Reject => MissingKeyFile::Reject(map.next_value()?),
                    MissingKeyTag::Allow => map
                        .next_value::<de::IgnoredAny>()
                        .map(|_| MissingKeyFile::Allow)?,
                    MissingKeyTag::Key => MissingKeyFile::Key(map.next_value()?),
                };
                if map.next_key::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom(
                        "`missing_key` is one of reject, allow or key, not several",
                    ));
                }
                Ok(form)
            }

            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<MissingKeyFile, A::Error> {
                let value =
                    MissingKeyEnum::deserialize(de::value::EnumAccessDeserializer::new(data))?;
                Ok(match value {
                    MissingKeyEnum::Reject(code) => MissingKeyFile::Reject(code),
                    MissingKeyEnum::Allow => MissingKeyFile::Allow,
                    MissingKeyEnum::Key(key) => MissingKeyFile::Key(key),
                })
            }
        }

        deserializer.deserialize_any(Form)
    }
}

impl TryFrom<MissingKeyFile> for MissingKey {
    type Error = ConfigError;

    fn try_from(file: MissingKeyFile) -> Result<Self, ConfigError> {
        Ok(match file {
            MissingKeyFile::Reject(code) => MissingKey::Reject(
                StatusCode::from_u16(code)
                    .ok()
                    .filter(|status| status.is_client_error() || status.is_server_error())
                    .ok_or_else(|| ConfigError::InvalidValue {
                        setting: "missing_key",
                        reason: format!("{code} is not an HTTP error status (400 to 599)"),
                    })?,
            ),
            MissingKeyFile::Allow => MissingKey::Allow,
            MissingKeyFile::Key(key) => MissingKey::Key(Cow::Owned(key)),
        })
    }
}

impl From<MissingKey> for MissingKeyFile {
    fn from(missing: MissingKey) -> Self {
        match missing {
            MissingKey::Reject(status) => Self::Reject(status.as_u16()),
            MissingKey::Allow => Self::Allow,
            MissingKey::Key(key) => Self::Key(key.into_owned()),
        }
    }
}

#[cfg(test)]
#[path = "rule_tests.rs"]
mod tests;
