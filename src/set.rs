//! Atomic sets of limits; the semantics are on [`LimitSet`].

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::{Backend, Hosts, Owner};
use crate::decision::{Decision, Policy};
use crate::error::{validate_name, ConfigError};
use crate::limiter::Limiter;
use crate::period::{PeriodConfig, PeriodLimiter};
use crate::response::HeaderParts;
use crate::rolling::{RollingConfig, RollingWindowLimiter};
use crate::token_bucket::{TokenBucketConfig, TokenBucketLimiter};

mod hosts;
use hosts::{join, SetHosts, LOCKS};

/// The most limits in one set.
pub(crate) const MAX_LIMITS: usize = 8;

/// A limit of any of the three algorithms: a member of a [`LimitSet`] (`.limit("daily",
/// PeriodConfig::new(..))` converts), and (feature `serde`) the `limit` of a rule file,
/// tagged by `algorithm` and read as the algorithm's own config type:
///
/// | `algorithm` | parameters | reads |
/// |---|---|---|
/// | `"period"` | `quota`, `period`, optional `align` (`"UTC"`, `"+05:30"`, `"-08:00"`); or `quota`, `calendar` (`"day"`, `"week"`, `"month"`), `zone` (an IANA name) and for weeks `week_starts` (default `"monday"`); optional `lockout` | [`PeriodConfig`] |
/// | `"token_bucket"` | `rate`, `per` (default `"1s"`), `burst`; optional `lockout`, `lease = { size, lifetime }` | [`TokenBucketConfig`] |
/// | `"rolling_window"` | `limit`, `buckets`, `interval`; optional `lockout` | [`RollingConfig`] |
///
/// Durations are [`humantime`](https://docs.rs/humantime) strings: `"100ms"`, `"2s"`,
/// `"1m"`, `"1day"`, `"1h 30m"`. What only a file can get wrong (an unknown calendar unit,
/// a zone missing, an offset that does not parse) fails when the file is read; values the
/// limiters refuse (a zero quota, an unknown zone) fail when the rule is built, with the
/// builders' own errors.
///
/// ```toml
/// # 5 SMS codes per phone per local day in New York (23 or 25 hours on DST days).
/// algorithm = "period"
/// quota = 5
/// calendar = "day"
/// zone = "America/New_York"
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(tag = "algorithm", rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum LimitConfig {
    /// A fixed window.
    Period(PeriodConfig),
    /// A token bucket.
    TokenBucket(TokenBucketConfig),
    /// A rolling window.
    RollingWindow(RollingConfig),
}

impl From<PeriodConfig> for LimitConfig {
    fn from(config: PeriodConfig) -> Self {
        Self::Period(config)
    }
}

impl From<TokenBucketConfig> for LimitConfig {
    fn from(config: TokenBucketConfig) -> Self {
        Self::TokenBucket(config)
    }
}

impl From<RollingConfig> for LimitConfig {
    fn from(config: RollingConfig) -> Self {
        Self::RollingWindow(config)
    }
}

/// Atomic sets of limits: several limits on one key (2 per second *and* 10 per day),
/// decided all or nothing in one round trip, so that a refusal by any of them spends
/// none of the others.
///
/// Stacked layers check their limits one by one: when the inner one refuses, the outer
/// ones have already counted the request. A [`LimitSet`] puts the limits in one layer
/// instead. On Redis, one script call decides them all: every limit first decides
/// without writing, and only when all of them admit does each one count the request.
/// In process (and in the fallback while Redis is unreachable), the same two passes run
/// under a lock per key, so concurrent checks of a set never admit more than any of its
/// limits allows. Any mix of the three algorithms works.
///
/// Each limit of a set named `reports` is the policy `reports.<limit>`, listed in the
/// `RateLimit-Policy` and `RateLimit` headers in the set's order. A refusal's
/// `Retry-After` is the longest wait among the limits that refused.
///
/// On Redis Cluster, the keys of one request's limits share one hash slot: they are
/// built around the same `{v1:<key>}` hash tag (see [Redis keys](crate::guide::deployments#redis-keys)),
/// so a set needs nothing more. A set decides the limits of one key; limits on different
/// keys (per user *and* per merchant) are separate layers.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{
///     key::HeaderKey, Backend, LimitLayer, LimitSet, PeriodConfig, TokenBucketConfig,
/// };
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let limits = LimitSet::new()
///     .limit("burst", TokenBucketConfig::new(2, Duration::from_secs(1), 2))
///     .limit("daily", PeriodConfig::new(10, Duration::from_secs(86_400)));
/// let layer = LimitLayer::builder(&Backend::in_process(), limits)
///     .name("reports")
///     .key(HeaderKey::from_static("x-merchant-id"))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// A `LimitSet` is what [`LimitLayer::builder`](crate::LimitLayer::builder) takes, or
/// a plan.
#[derive(Debug, Clone, Default)]
pub struct LimitSet {
    pub(crate) limits: Vec<(String, LimitConfig)>,
    /// Per limit, in order: whether it counts requests (one each) rather than cost.
    pub(crate) per_request: Vec<bool>,
    pub(crate) lockout: Option<Duration>,
}

impl LimitSet {
    /// An empty set; add at least one limit with [`limit`](Self::limit).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the limit `name` (its policy is `<set>.<name>`) with the settings of any
    /// algorithm. Limits are decided, and listed in the headers, in the order they are
    /// added.
    #[must_use]
    pub fn limit(mut self, name: impl Into<String>, limit: impl Into<LimitConfig>) -> Self {
        self.limits.push((name.into(), limit.into()));
        self.per_request.push(false);
        self
    }

    /// Adds the limit `name` that counts requests, not their cost: each admitted request
    /// spends one unit of it, whatever its cost (a cost of 0 is free), and settling
    /// after the response ([`Limiter::settle`]) leaves it alone. With a limit that counts
    /// cost, it makes the pair LLM APIs publish, decided all or nothing: requests per
    /// minute and tokens per minute.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{LimitSet, PeriodConfig};
    ///
    /// let minute = Duration::from_secs(60);
    /// let set = LimitSet::new()
    ///     .requests("rpm", PeriodConfig::new(60, minute))
    ///     .limit("tpm", PeriodConfig::new(10_000, minute));
    /// # let _ = set;
    /// ```
    #[must_use]
    pub fn requests(mut self, name: impl Into<String>, limit: impl Into<LimitConfig>) -> Self {
        self.limits.push((name.into(), limit.into()));
        self.per_request.push(true);
        self
    }

    /// Locks a key out for `duration` once the set refuses it, whichever limit refused
    /// (see [`PeriodConfig::lockout`]).
    #[must_use]
    pub fn lockout(mut self, duration: Duration) -> Self {
        self.lockout = Some(duration);
        self
    }
}

/// A [`Limiter`] for a [`LimitSet`] on a [`Backend`].
#[derive(Debug, Clone)]
pub struct SetLimiter {
    hosts: Arc<SetHosts>,
}

impl SetLimiter {
    /// Checks `set` and builds the limiter named `name` on `backend`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for an empty set, more than 8 limits, two limits
    /// of the same name, an invalid name, or a limit's own invalid settings.
    pub fn new(backend: &Backend, name: &str, set: LimitSet) -> Result<Self, ConfigError> {
        validate_name("name", name)?;
        let lockout = crate::error::validate_lockout(set.lockout)?;
        if set.limits.is_empty() {
            return Err(ConfigError::Missing { setting: "limit" });
        }
        if set.limits.len() > MAX_LIMITS {
            return Err(ConfigError::TooLarge {
                setting: "limit",
                max: MAX_LIMITS as u64,
            });
        }
        let mut members: Vec<Arc<dyn Hosts>> = Vec::with_capacity(set.limits.len());
        let mut policies = Vec::with_capacity(set.limits.len());
        for (i, (limit, member)) in set.limits.iter().enumerate() {
            validate_name("limit", limit)?;
            if set.limits[..i].iter().any(|(other, _)| other == limit) {
                return Err(ConfigError::Conflict {
                    reason: "two limits of a set have the same name",
                });
            }
            let owner = Owner::Member { set: name, limit };
            let (hosts, policy) = match *member {
                LimitConfig::Period(config) => {
                    let limiter = PeriodLimiter::with_owner(backend, owner, config)?;
                    (limiter.hosts(), limiter.policy().clone())
                }
                LimitConfig::TokenBucket(config) => {
                    let limiter = TokenBucketLimiter::with_owner(backend, owner, config)?;
                    (limiter.hosts(), limiter.policy().clone())
                }
                LimitConfig::RollingWindow(config) => {
                    let limiter = RollingWindowLimiter::with_owner(backend, owner, config)?;
                    (limiter.hosts(), limiter.policy().clone())
                }
            };
            members.push(hosts);
            policies.push(policy);
        }
        let headers: Box<[HeaderParts]> = policies.iter().map(HeaderParts::new).collect();
        let policy_header = join(headers.iter().map(|h| h.policy_value().as_bytes()));
        let first = &policies[0];
        // A member's capacity is its policy's quota: quota, burst or limit.
        // A member that counts requests spends at most one: it bounds no cost.
        let per_request: Box<[bool]> = (0..set.limits.len())
            .map(|i| set.per_request.get(i).copied().unwrap_or(false))
            .collect();
        let smallest = policies
            .iter()
            .zip(per_request.iter())
            .filter(|(_, &per_request)| !per_request)
            .map(|(p, _)| p)
            .min_by_key(|p| p.quota())
            .unwrap_or(first)
            .clone();
        let capacity = members
            .iter()
            .zip(per_request.iter())
            .filter(|(_, &per_request)| !per_request)
            .map(|(m, _)| m.capacity())
            .min()
            .unwrap_or(u64::from(u32::MAX));
        let blocks = members[0].remote().set_blocks(lockout);
        Ok(Self {
            hosts: Arc::new(SetHosts {
                members: members.into(),
                per_request,
                headers,
                limits: policies.clone().into_boxed_slice(),
                policy: Policy::new(name, first.quota(), first.window()),
                policy_header,
                ratelimit_capacity: policies.iter().map(|p| p.name().len() + 48).sum(),
                capacity,
                smallest,
                locks: (0..LOCKS).map(|_| Mutex::new(())).collect(),
                hasher: std::collections::hash_map::RandomState::new(),
                blocks,
            }),
        })
    }
}

impl SetLimiter {
    /// Where `key` stands under each limit of the set for a check of `cost`, spending
    /// nothing: every limit's own decision (blocked while the key is), in the set's
    /// order, beside its policy, from Redis when it answers, else from the in-process
    /// state. When a limit would refuse the cost, the others say where they stand (what
    /// they have left now, as the set's `RateLimit` header does after a refusal), since
    /// the check would spend nothing. The set's [`peek`](Limiter::peek) says the one decision the set's check
    /// would: the refusing limit with the longest wait, else the admitting limit with
    /// the least left (its `RateLimit` header lists every limit).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{
    ///     Backend, LimitSet, Limiter, PeriodConfig, SetLimiter, TokenBucketConfig,
    /// };
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let minute = Duration::from_secs(60);
    /// let set = LimitSet::new()
    ///     .requests("rpm", TokenBucketConfig::new(60, minute, 60))
    ///     .limit("tpm", PeriodConfig::new(20_000, minute));
    /// let llm = SetLimiter::new(&Backend::in_process(), "llm", set)?;
    /// // A request of 500 tokens, then what one more token would leave of each limit.
    /// llm.check(b"key-1", NonZeroU32::new(500).unwrap()).await;
    /// let each = llm.peek_limits(b"key-1", NonZeroU32::MIN).await;
    /// let left: Vec<_> = each.iter().map(|(policy, d)| (policy.name(), d.remaining)).collect();
    /// assert_eq!(left, [("llm.rpm", 58), ("llm.tpm", 19_499)]);
    /// # Ok(()) }
    /// ```
    pub async fn peek_limits(&self, key: &[u8], cost: NonZeroU32) -> Vec<(Policy, Decision)> {
        let hosts = Arc::clone(&self.hosts);
        let each = crate::backend::peek_each(hosts, key.to_vec(), cost).await;
        let policies = self
            .hosts
            .headers
            .iter()
            .map(|parts| parts.policy().clone());
        policies.zip(each.unwrap_or_default()).collect()
    }

    /// The policy of the member with the smallest capacity: the largest cost the set can
    /// ever admit is its quota.
    pub(crate) fn smallest_member(&self) -> &Policy {
        &self.hosts.smallest
    }
}

crate::hosted::hosted_limiter!(SetLimiter, hosts, {
    /// The set's smallest member: the largest cost the set can ever admit is its quota.
    fn bounding_policy(&self) -> Option<&Policy> {
        Some(self.smallest_member())
    }

    /// The set's limits' policies, in order.
    fn members(&self, index: usize) -> &[Policy] {
        let _ = index;
        &self.hosts.limits
    }

    /// Each limit of the set, as [`peek_limits`](SetLimiter::peek_limits) answers.
    fn peek_limits(
        &self,
        index: usize,
        key: &[u8],
        cost: ::std::num::NonZeroU32,
    ) -> Option<futures_util::future::BoxFuture<'static, Vec<(Policy, crate::Decision)>>> {
        let _ = index;
        let set = self.clone();
        let key = key.to_vec();
        Some(Box::pin(async move { set.peek_limits(&key, cost).await }))
    }
});
