//! Atomic sets of limits; the semantics are on [`LimitSet`].

use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use http::HeaderValue;

use crate::backend::{Args, Backend, Blocks, Call, Hosts, Owner, Remote};
use crate::decision::{Decision, Policy, RateLimitValue, Source, State};
use crate::error::{validate_name, ConfigError};
use crate::limiter::Limiter;
use crate::period::{PeriodConfig, PeriodLimiter};
use crate::response::HeaderParts;
use crate::rolling::{RollingConfig, RollingWindowLimiter};
use crate::token_bucket::{TokenBucketConfig, TokenBucketLimiter};

/// The most limits in one set.
pub(crate) const MAX_LIMITS: usize = 8;

/// Locks of the in-process set checks: one is taken per check, by key.
const LOCKS: usize = 64;

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

struct SetHosts {
    members: Box<[Arc<dyn Hosts>]>,
    /// Per member: whether it counts requests (one each) rather than cost.
    per_request: Box<[bool]>,
    /// Each member's header pieces, in order.
    headers: Box<[HeaderParts]>,
    /// The members' policies: the first one is the set's (for metrics, under the set's
    /// name).
    policy: Policy,
    /// Every member's `RateLimit-Policy` item, in order.
    policy_header: HeaderValue,
    /// Room for the `RateLimit` value with every member's largest numbers.
    ratelimit_capacity: usize,
    capacity: u64,
    /// The policy of the member with the smallest capacity (the first of them).
    smallest: Policy,
    locks: Box<[Mutex<()>]>,
    hasher: std::collections::hash_map::RandomState,
    /// The set's blocked keys and lockout (its members have none of their own).
    blocks: Blocks,
}

impl std::fmt::Debug for SetHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetHosts")
            .field("policy", &self.policy)
            .field("members", &self.members.len())
            .finish_non_exhaustive()
    }
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

/// `items` as one comma-separated header value.
fn join<'a>(items: impl Iterator<Item = &'a [u8]>) -> HeaderValue {
    let mut v = BytesMut::new();
    for item in items {
        if !v.is_empty() {
            v.put_slice(b", ");
        }
        v.put_slice(item);
    }
    HeaderValue::from_maybe_shared(v.freeze()).expect("made of valid header values")
}

crate::hosted::hosted_limiter!(SetLimiter, hosts, {
    /// The set's smallest member: the largest cost the set can ever admit is its quota.
    fn bounding_policy(&self) -> Option<&Policy> {
        Some(self.smallest_member())
    }
});

impl SetHosts {
    /// One decision from the members': the admitting one with the least left when all
    /// admit, else the refusing one with the longest wait; with every member in the
    /// headers.
    fn combine(&self, decisions: &[Decision]) -> Decision {
        let chosen = if decisions.iter().all(Decision::is_admitted) {
            decisions.iter().min_by_key(|d| d.remaining)
        } else {
            // The longest wait; on a tie, the first limit (`rev`: `max_by_key` keeps the last).
            decisions
                .iter()
                .filter(|d| !d.is_admitted())
                .rev()
                .max_by_key(|d| d.retry_after)
        };
        let mut decision = chosen.cloned().expect("a set has at least one limit");
        decision.ratelimit_header = Some(self.ratelimit_value(decisions.iter()));
        decision.policy_header = Some(self.policy_header.clone());
        decision
    }

    /// The set's decision for a key blocked for `wait` more: the one its limits'
    /// `decisions` give (as [`combine`](Self::combine)), blocked, with every limit in
    /// the headers blocked too (no units left until the block's end at least).
    fn combine_blocked(&self, decisions: &[Decision], wait: Duration) -> Decision {
        let mut decision = self.combine(decisions).blocked(wait);
        let blocked = decisions.iter().map(|d| d.clone().blocked(wait));
        decision.ratelimit_header = Some(self.ratelimit_value(blocked));
        decision
    }

    /// Every member's item of the `RateLimit` header, in one allocation.
    fn ratelimit_value<D: std::borrow::Borrow<Decision>>(
        &self,
        decisions: impl Iterator<Item = D>,
    ) -> RateLimitValue {
        let mut value = Vec::with_capacity(self.ratelimit_capacity);
        for (i, (parts, d)) in self.headers.iter().zip(decisions).enumerate() {
            if i > 0 {
                value.extend_from_slice(b", ");
            }
            parts.write_ratelimit_value(d.borrow(), &mut value);
        }
        RateLimitValue(bytes::Bytes::from(value))
    }

    /// Each limit's decision in the engine's reply (its limits' parts, in order).
    fn split(&self, reply: &[i64], cost: NonZeroU32) -> Option<Vec<Decision>> {
        if reply.len() != self.reply_len() {
            return None;
        }
        let mut rest = reply;
        let mut decisions = Vec::with_capacity(self.members.len());
        for member in self.members.iter() {
            let (part, tail) = rest.split_at(member.reply_len());
            decisions.push(member.decide(part, cost)?);
            rest = tail;
        }
        Some(decisions)
    }

    /// What member `i` spends of a request's cost: the cost, or one for a member that
    /// counts requests (none for a cost of 0), as the engine's `units`.
    fn units(&self, i: usize, cost: u32) -> u32 {
        if self.per_request[i] {
            cost.min(1)
        } else {
            cost
        }
    }

    fn lock(&self, key: &[u8]) -> std::sync::MutexGuard<'_, ()> {
        let index = (self.hasher.hash_one(key) % LOCKS as u64) as usize;
        // A panic while holding a set lock leaves no state half-written (each member's
        // change is one step): carry on.
        self.locks[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Hosts for SetHosts {
    fn remote(&self) -> &Remote {
        self.members[0].remote()
    }

    fn blocks(&self) -> &Blocks {
        &self.blocks
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn exceeds_capacity(&self, source: Source) -> Decision {
        let decisions: Vec<_> = self
            .members
            .iter()
            .zip(self.per_request.iter())
            .map(|(m, &per_request)| {
                if m.capacity() == self.capacity && !per_request {
                    m.exceeds_capacity(source)
                } else {
                    Decision::new(
                        State::Allowed,
                        m.capacity(),
                        m.capacity(),
                        Duration::ZERO,
                        source,
                    )
                }
            })
            .collect();
        self.combine(&decisions)
    }

    fn limit_count(&self) -> usize {
        self.members.len()
    }

    fn extra_keys(&self, key: &[u8], call: &mut Call) {
        for member in &self.members[1..] {
            member.remote().add_redis_key(key, call);
        }
    }

    fn limit_args(&self, args: &mut Args) {
        for (member, &per_request) in self.members.iter().zip(self.per_request.iter()) {
            let letter = args.len();
            member.limit_args(args);
            if per_request {
                // A member that counts requests: its letter in capitals.
                args.capitalize(letter);
            }
        }
    }

    fn window_args(&self, now_ms: i64, call: &mut Call) {
        for member in self.members.iter() {
            member.window_args(now_ms, call);
        }
    }

    fn reply_len(&self) -> usize {
        self.members.iter().map(|m| m.reply_len()).sum()
    }

    fn decide(&self, reply: &[i64], cost: NonZeroU32) -> Option<Decision> {
        Some(self.combine(&self.split(reply, cost)?))
    }

    fn decide_blocked(&self, reply: &[i64], cost: NonZeroU32, wait: Duration) -> Option<Decision> {
        Some(self.combine_blocked(&self.split(reply, cost)?, wait))
    }

    fn combine_members_blocked(&self, members: &[Decision], wait: Duration) -> Option<Decision> {
        (members.len() == self.members.len()).then(|| self.combine_blocked(members, wait))
    }

    fn local_blocked(&self, key: &[u8], cost: u32, source: Source, wait: Duration) -> Decision {
        let _guard = self.lock(key);
        // What the set's check would say, spending nothing: its refusal if a limit would
        // refuse (the refusing limits as they refuse, the others where they stand), else
        // where every limit stands.
        let mut members: Vec<_> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| m.local(key, self.units(i, cost), source, false))
            .collect();
        let admitted = members.iter().all(Decision::is_admitted);
        for (member, decision) in self.members.iter().zip(&mut members) {
            if admitted || decision.is_admitted() {
                *decision = member.local(key, 0, source, false);
            }
        }
        self.combine_blocked(&members, wait)
    }

    fn member_decisions(&self, reply: &[i64], cost: NonZeroU32) -> Option<Arc<[Decision]>> {
        self.split(reply, cost).map(Arc::from)
    }

    fn combine_members(&self, members: &[Decision]) -> Option<Decision> {
        (members.len() == self.members.len()).then(|| self.combine(members))
    }

    fn local(&self, key: &[u8], cost: u32, source: Source, spend: bool) -> Decision {
        let _guard = self.lock(key);
        let mut decisions: Vec<_> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| m.local(key, self.units(i, cost), source, false))
            .collect();
        let admitted = decisions.iter().all(Decision::is_admitted);
        for (i, (member, decision)) in self.members.iter().zip(&mut decisions).enumerate() {
            if admitted && spend {
                *decision = member.local(key, self.units(i, cost), source, true);
            } else if !admitted && decision.is_admitted() {
                // Refused by another limit: this one stands where it was.
                *decision = member.local(key, 0, source, false);
            }
        }
        self.combine(&decisions)
    }

    fn local_refund(&self, key: &[u8], cost: u32) {
        let _guard = self.lock(key);
        for (i, member) in self.members.iter().enumerate() {
            member.local_refund(key, self.units(i, cost));
        }
    }

    fn local_charge(&self, key: &[u8], cost: u64) {
        self.local_settle(key, i64::try_from(cost).unwrap_or(i64::MAX));
    }

    /// Settles the members that count cost; those that count requests are left alone.
    fn local_settle(&self, key: &[u8], delta: i64) {
        let _guard = self.lock(key);
        for (member, &per_request) in self.members.iter().zip(self.per_request.iter()) {
            if !per_request {
                member.local_settle(key, delta);
            }
        }
    }

    fn local_reset(&self, key: &[u8]) {
        let _guard = self.lock(key);
        for member in self.members.iter() {
            member.local_reset(key);
        }
    }

    fn local_members(&self, key: &[u8], cost: u32, source: Source) -> Option<Vec<Decision>> {
        let backend = self.remote().backend();
        let now_us = || backend.clock().now_us();
        let until = self.blocks.until(&backend.local_store(), key, now_us);
        let _guard = self.lock(key);
        let mut decided: Vec<Decision> = (self.members.iter().enumerate())
            .map(|(i, member)| member.local(key, self.units(i, cost), source, false))
            .collect();
        if decided.iter().any(|d| !d.is_admitted()) {
            // As the engine answers a set's refusal: the members that would admit say
            // where they stand (a cost of 0).
            for (member, decision) in self.members.iter().zip(decided.iter_mut()) {
                if decision.is_admitted() {
                    *decision = member.local(key, 0, source, false);
                }
            }
        }
        let each = decided.into_iter().map(|decision| match until {
            Some(until) => decision.blocked(Duration::from_micros(until.saturating_sub(now_us()))),
            None => decision,
        });
        Some(each.collect())
    }
}
