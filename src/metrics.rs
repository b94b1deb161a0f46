//! The layers' metrics (feature `metrics`): the names are listed in [`guide::metrics`](crate::guide::metrics).

use std::time::Duration;

use crate::decision::{Decision, Policy, Source};

/// Requests by `policy` and `outcome` (counter).
#[cfg(feature = "metrics")]
pub(crate) const REQUESTS_TOTAL: &str = "ratelimit_requests_total";
/// Admitted requests that left at most 10 % of the limit, by `policy` (counter).
#[cfg(feature = "metrics")]
pub(crate) const NEAR_LIMIT_TOTAL: &str = "ratelimit_near_limit_total";
/// Decisions taken without Redis while it was unreachable, by `policy` and `source`
/// (counter).
#[cfg(feature = "metrics")]
pub(crate) const FALLBACK_DECISIONS_TOTAL: &str = "ratelimit_fallback_decisions_total";
/// `1` while a Redis backend answers from its fallback, by `prefix` (gauge).
#[cfg(feature = "metrics")]
pub(crate) const FALLBACK_ACTIVE: &str = "ratelimit_fallback_active";
/// Failed Redis calls of checks and of the handles' operations (a settlement, a peek,
/// ...), by `policy` and `kind` (counter).
#[cfg(feature = "metrics")]
pub(crate) const REDIS_ERRORS_TOTAL: &str = "ratelimit_redis_errors_total";
/// Breaker transitions of a Redis backend, by `prefix` and `to` (counter).
#[cfg(feature = "metrics")]
pub(crate) const REDIS_SWITCHES_TOTAL: &str = "ratelimit_redis_switches_total";
/// Time a Redis backend spent away from Redis, in whole seconds, by `prefix` (counter).
#[cfg(feature = "metrics")]
pub(crate) const REDIS_FALLBACK_SECONDS_TOTAL: &str = "ratelimit_redis_fallback_seconds_total";
/// The time of each Redis check in seconds, by `policy` (histogram).
#[cfg(feature = "metrics")]
pub(crate) const REDIS_DURATION_SECONDS: &str = "ratelimit_redis_duration_seconds";

/// Units settled after responses, by `policy` and `direction` (`charged`: spent beyond
/// the estimates; `returned`: given back) (counter).
#[cfg(feature = "metrics")]
pub(crate) const SETTLED_UNITS_TOTAL: &str = "ratelimit_settled_units_total";

/// Keys dropped from a backend's full in-process state, by `prefix` (counter).
#[cfg(feature = "metrics")]
pub(crate) const LOCAL_EVICTIONS_TOTAL: &str = "ratelimit_local_evictions_total";

/// Whether an admitted decision left at most 10 % of its limit.
fn near_limit(decision: &Decision) -> bool {
    decision.is_admitted() && decision.remaining.saturating_mul(10) <= decision.limit
}

/// How a decision was taken without Redis, while it was unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unshared {
    Fallback,
    FailOpen,
    FailClosed,
}

/// How a decision was taken without Redis, if it was.
fn unshared(source: Source) -> Option<Unshared> {
    match source {
        Source::Fallback => Some(Unshared::Fallback),
        Source::FailOpen => Some(Unshared::FailOpen),
        Source::FailClosed => Some(Unshared::FailClosed),
        _ => None,
    }
}

/// The metrics of one layer: one set of handles per policy, registered on first use.
#[derive(Debug)]
pub(crate) struct LayerMetrics {
    #[cfg(feature = "metrics")]
    policies: Box<[imp::PolicyMetrics]>,
}

impl LayerMetrics {
    /// The metrics of `policies`, each with the policies of its limits (`members`: a
    /// set's, by which its refusals are labelled; none for a limit that is not a set).
    pub(crate) fn new<'p>(policies: &[Policy], members: impl Fn(usize) -> &'p [Policy]) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (policies, members);
        Self {
            #[cfg(feature = "metrics")]
            policies: policies
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let limits = members(i).iter().map(|m| m.name().to_owned()).collect();
                    imp::PolicyMetrics::new(p.name(), limits)
                })
                .collect(),
        }
    }

    /// Records a decision of the policy at `index`; `shadow` for a shadow layer.
    #[inline]
    pub(crate) fn decision(&self, index: usize, decision: &Decision, shadow: bool) {
        let near = near_limit(decision);
        let fallback = unshared(decision.source);
        #[cfg(feature = "metrics")]
        if let Some(policy) = self.policies.get(index) {
            let by = decision.rejected_by.map(usize::from);
            policy.decision(decision.is_admitted(), shadow, near, fallback, by);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (index, shadow, near, fallback);
    }

    /// Records a request without a usable key.
    #[inline]
    pub(crate) fn missing_key(&self, index: usize) {
        #[cfg(feature = "metrics")]
        if let Some(policy) = self.policies.get(index) {
            policy.missing_key();
        }
        #[cfg(not(feature = "metrics"))]
        let _ = index;
    }
}

/// Registers the series of a new Redis backend with key prefix `prefix`: its fallback
/// gauge at `0` and its breaker switches at `0`, so that a dashboard's `increase()`
/// counts the first switch too (a counter that appears at 1 reads as no increase).
pub(crate) fn redis_backend_built(prefix: &str) {
    fallback_active(prefix, false);
    #[cfg(feature = "metrics")]
    for to in ["fallback", "recovering", "redis"] {
        metrics::counter!(REDIS_SWITCHES_TOTAL, "prefix" => prefix.to_owned(), "to" => to)
            .increment(0);
    }
}

/// Records whether the Redis backend with key prefix `prefix` answers from its fallback
/// (call on every switch: `true` when Redis is marked unreachable, `false` when the probe
/// reaches it again).
pub(crate) fn fallback_active(prefix: &str, active: bool) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(FALLBACK_ACTIVE, "prefix" => prefix.to_owned())
        .set(f64::from(u8::from(active)));
    #[cfg(not(feature = "metrics"))]
    let _ = (prefix, active);
}

/// Records one key dropped from the in-process state of the backend with key prefix
/// `prefix` (the counter is registered on the first eviction and kept in `counter`).
#[inline]
pub(crate) fn local_eviction(
    #[cfg(feature = "metrics")] counter: &std::sync::OnceLock<metrics::Counter>,
    prefix: &str,
) {
    #[cfg(feature = "metrics")]
    counter
        .get_or_init(|| metrics::counter!(LOCAL_EVICTIONS_TOTAL, "prefix" => prefix.to_owned()))
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = prefix;
}

/// The Redis metrics of one limiter: the duration histogram is registered on first use
/// and kept, so timing a check allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct RedisMetrics {
    #[cfg(feature = "metrics")]
    duration: std::sync::OnceLock<metrics::Histogram>,
}

impl RedisMetrics {
    /// Records the time of one Redis check of policy `policy`, successful or not.
    #[inline]
    pub(crate) fn duration(&self, policy: &str, elapsed: Duration) {
        #[cfg(feature = "metrics")]
        self.duration
            .get_or_init(
                || metrics::histogram!(REDIS_DURATION_SECONDS, "policy" => policy.to_owned()),
            )
            .record(elapsed.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = (policy, elapsed);
    }
}

/// Records a breaker transition of the Redis backend with key prefix `prefix`, to `to`:
/// `"redis"`, `"fallback"` or `"recovering"` (the backend names its states, so that
/// metrics never import the backend).
pub(crate) fn redis_switch(prefix: &str, to: &'static str) {
    fallback_active(prefix, to != "redis");
    #[cfg(feature = "metrics")]
    metrics::counter!(REDIS_SWITCHES_TOTAL, "prefix" => prefix.to_owned(), "to" => to).increment(1);
}

/// Adds `seconds` whole seconds to the time the Redis backend with key prefix `prefix`
/// spent away from Redis.
pub(crate) fn redis_away(prefix: &str, seconds: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!(REDIS_FALLBACK_SECONDS_TOTAL, "prefix" => prefix.to_owned())
        .increment(seconds);
    #[cfg(not(feature = "metrics"))]
    let _ = (prefix, seconds);
}

/// Records a settlement of `delta` units (above 0 charged, below 0 returned) under
/// policy `policy`.
pub(crate) fn settled(policy: &str, delta: i64) {
    #[cfg(feature = "metrics")]
    {
        let direction = if delta > 0 { "charged" } else { "returned" };
        metrics::counter!(SETTLED_UNITS_TOTAL, "policy" => policy.to_owned(), "direction" => direction)
            .increment(delta.unsigned_abs());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (policy, delta);
}

/// Records a failed Redis call (a check's, an operation's) of policy `policy`; `kind` is
/// `transport`, `server` or `key`.
pub(crate) fn redis_error(policy: &str, kind: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(REDIS_ERRORS_TOTAL, "policy" => policy.to_owned(), "kind" => kind)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (policy, kind);
}

#[cfg(feature = "metrics")]
mod imp {
    use std::sync::OnceLock;

    use metrics::{counter, Counter};

    use super::{Unshared, FALLBACK_DECISIONS_TOTAL, NEAR_LIMIT_TOTAL, REQUESTS_TOTAL};

    /// The handles of one policy, registered with the recorder current on first use.
    #[derive(Debug)]
    pub(super) struct PolicyMetrics {
        policy: String,
        /// A set's limits, in order (empty for a limit that is not a set).
        limits: Box<[String]>,
        handles: OnceLock<Handles>,
    }

    /// A refusal's counters, by the limit that refused: the policy's own (`limit` its
    /// name: a limit that is not a set, or a set's block), then each of a set's limits.
    #[derive(Debug)]
    struct Refusals {
        rejected: Box<[Counter]>,
        shadow_rejected: Box<[Counter]>,
    }

    #[derive(Debug)]
    struct Handles {
        admitted: Counter,
        refusals: Refusals,
        missing_key: Counter,
        near_limit: Counter,
        fallback: Counter,
        fail_open: Counter,
        fail_closed: Counter,
    }

    impl PolicyMetrics {
        pub(super) fn new(policy: &str, limits: Box<[String]>) -> Self {
            Self {
                policy: policy.to_owned(),
                limits,
                handles: OnceLock::new(),
            }
        }

        fn handles(&self) -> &Handles {
            self.handles.get_or_init(|| {
                let outcome = |outcome: &'static str| {
                    counter!(REQUESTS_TOTAL, "policy" => self.policy.clone(), "outcome" => outcome)
                };
                let source = |source: &'static str| {
                    counter!(
                        FALLBACK_DECISIONS_TOTAL,
                        "policy" => self.policy.clone(),
                        "source" => source
                    )
                };
                let limits = || std::iter::once(&self.policy).chain(self.limits.iter());
                let refused = |outcome: &'static str| -> Box<[Counter]> {
                    limits()
                        .map(|limit| {
                            counter!(
                                REQUESTS_TOTAL,
                                "policy" => self.policy.clone(),
                                "outcome" => outcome,
                                "limit" => limit.clone()
                            )
                        })
                        .collect()
                };
                Handles {
                    admitted: outcome("admitted"),
                    refusals: Refusals {
                        rejected: refused("rejected"),
                        shadow_rejected: refused("shadow_rejected"),
                    },
                    missing_key: outcome("missing_key"),
                    near_limit: counter!(NEAR_LIMIT_TOTAL, "policy" => self.policy.clone()),
                    fallback: source("fallback"),
                    fail_open: source("fail_open"),
                    fail_closed: source("fail_closed"),
                }
            })
        }

        pub(super) fn decision(
            &self,
            admitted: bool,
            shadow: bool,
            near: bool,
            fallback: Option<Unshared>,
            rejected_by: Option<usize>,
        ) {
            let h = self.handles();
            // The set's limit that refused (its own counter past the policy's), else the
            // policy's.
            let by = rejected_by.map_or(0, |i| i + 1);
            let refused = |counters: &[Counter]| {
                if let Some(counter) = counters.get(by).or(counters.first()) {
                    counter.increment(1);
                }
            };
            match (admitted, shadow) {
                (true, _) => h.admitted.increment(1),
                (false, false) => refused(&h.refusals.rejected),
                (false, true) => refused(&h.refusals.shadow_rejected),
            }
            if near {
                h.near_limit.increment(1);
            }
            match fallback {
                Some(Unshared::Fallback) => h.fallback.increment(1),
                Some(Unshared::FailOpen) => h.fail_open.increment(1),
                Some(Unshared::FailClosed) => h.fail_closed.increment(1),
                None => {}
            }
        }

        pub(super) fn missing_key(&self) {
            self.handles().missing_key.increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::State;

    fn decision(state: State, remaining: u64) -> Decision {
        Decision::new(state, 10, remaining, Duration::ZERO, Source::Redis)
    }

    #[test]
    fn near_limit_is_the_last_tenth_of_admitted_requests() {
        assert!(!near_limit(&decision(State::Allowed, 2)));
        assert!(near_limit(&decision(State::Allowed, 1)));
        assert!(near_limit(&decision(State::HitQuota, 0)));
        assert!(!near_limit(&decision(State::OverQuota, 0)));
    }

    #[test]
    fn only_redis_less_sources_are_fallbacks() {
        assert_eq!(unshared(Source::Redis), None);
        assert_eq!(unshared(Source::InProcess), None);
        assert_eq!(unshared(Source::DenyCache), None);
        assert_eq!(unshared(Source::Fallback), Some(Unshared::Fallback));
        assert_eq!(unshared(Source::FailOpen), Some(Unshared::FailOpen));
        assert_eq!(unshared(Source::FailClosed), Some(Unshared::FailClosed));
    }

    /// The table of the module docs names every metric the code records, with its kind.
    #[test]
    #[cfg(feature = "metrics")]
    fn the_table_names_every_metric_with_its_kind() {
        let docs = include_str!("guide/metrics.rs");
        for (name, kind) in [
            (REQUESTS_TOTAL, "counter"),
            (NEAR_LIMIT_TOTAL, "counter"),
            (FALLBACK_DECISIONS_TOTAL, "counter"),
            (FALLBACK_ACTIVE, "gauge"),
            (REDIS_ERRORS_TOTAL, "counter"),
            (REDIS_SWITCHES_TOTAL, "counter"),
            (REDIS_FALLBACK_SECONDS_TOTAL, "counter"),
            (REDIS_DURATION_SECONDS, "histogram"),
            (SETTLED_UNITS_TOTAL, "counter"),
            (LOCAL_EVICTIONS_TOTAL, "counter"),
        ] {
            let row = format!("//! | `{name}` | {kind} |");
            assert!(docs.contains(&row), "no row {row:?} in the metrics table");
        }
        let rows = docs
            .lines()
            .filter(|l| l.starts_with("//! | `ratelimit_"))
            .count();
        assert_eq!(
            rows, 10,
            "the table has a row for a metric the code does not record"
        );
    }
}
