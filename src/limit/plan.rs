//! Per-plan limits in one layer: one limiter per plan, and a selector that picks the
//! plan of each request.

use std::fmt;
use std::marker::PhantomData;
use std::num::NonZeroU32;

use http::request::Parts;

use super::builder::Algorithm;
use crate::backend::Backend;
use crate::blocked::Listing;
use crate::decision::Policy;
use crate::error::{validate_name, ConfigError};
use crate::limiter::{DecisionFuture, Limiter};

/// Picks the plan of a request from its head (method, URI, headers, extensions).
///
/// Implemented for closures `Fn(&http::request::Parts) -> Option<P>`; [`ExtensionPlan`]
/// reads the plan an authentication layer put into the request extensions. `None`, or a
/// plan with no limit configured, selects the default plan (the first one given to
/// [`Plans::plan`]).
///
/// ```
/// use http::request::Parts;
///
/// // The plan from a header set by the API gateway.
/// let by_header = |parts: &Parts| {
///     match parts.headers.get("x-plan")?.as_bytes() {
///         b"paid" => Some("paid"),
///         _ => Some("free"),
///     }
/// };
/// # fn takes<S: tower_redis_ratelimit::limit::SelectPlan<&'static str>>(_: S) {}
/// # takes(by_header);
/// ```
pub trait SelectPlan<P>: Send + Sync + 'static {
    /// The plan of the request, if it has one.
    fn select(&self, request: &Parts) -> Option<P>;
}

impl<P, F> SelectPlan<P> for F
where
    F: Fn(&Parts) -> Option<P> + Send + Sync + 'static,
{
    fn select(&self, request: &Parts) -> Option<P> {
        self(request)
    }
}

/// The plan a previous layer (typically authentication) put into the request
/// extensions, as a value of type `P`.
///
/// ```
/// use tower_redis_ratelimit::limit::{ExtensionPlan, SelectPlan};
///
/// #[derive(Clone, Copy, Debug, PartialEq)]
/// enum Plan { Free, Paid }
///
/// let (mut parts, ()) = http::Request::new(()).into_parts();
/// parts.extensions.insert(Plan::Paid);
/// assert_eq!(ExtensionPlan::<Plan>::new().select(&parts), Some(Plan::Paid));
/// ```
pub struct ExtensionPlan<P> {
    _plan: PhantomData<fn() -> P>,
}

impl<P> ExtensionPlan<P> {
    /// Creates the selector.
    #[must_use]
    pub const fn new() -> Self {
        Self { _plan: PhantomData }
    }
}

impl<P> Default for ExtensionPlan<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> Clone for ExtensionPlan<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P> Copy for ExtensionPlan<P> {}

impl<P> fmt::Debug for ExtensionPlan<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionPlan<{}>", std::any::type_name::<P>())
    }
}

impl<P> SelectPlan<P> for ExtensionPlan<P>
where
    P: Clone + Send + Sync + 'static,
{
    fn select(&self, request: &Parts) -> Option<P> {
        request.extensions.get::<P>().cloned()
    }
}

/// Limits chosen per request, without one layer per plan: one configuration of
/// algorithm `A` per plan `P`, and a selector `S` that picks each request's plan.
///
/// Build the layer with [`LimitLayer::builder`](super::LimitLayer::builder). Plan `name`
/// of layer `api` is the policy `api.name`: that is the name in the `RateLimit`
/// headers, the metrics label and the namespace of its keys (so each plan counts
/// apart: a user who upgrades starts afresh). Each request is checked against its
/// plan's limit only and its response carries that plan's policy. Requests without a
/// plan, or with a plan that has no limit here, fall under the first plan given.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{
///     LimitLayer, key::ExtensionKey, limit::{ExtensionPlan, Plans}, Backend, PeriodConfig,
/// };
///
/// /// Put into the request extensions by the authentication layer.
/// #[derive(Clone, Copy, Debug, PartialEq)]
/// enum Plan { Free, Paid }
/// #[derive(Clone, Debug)]
/// struct UserId(u64);
/// impl std::fmt::Display for UserId {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "{}", self.0)
///     }
/// }
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let minute = Duration::from_secs(60);
/// let plans = Plans::new(ExtensionPlan::<Plan>::new())
///     .plan(Plan::Free, "free", PeriodConfig::new(10, minute))
///     .plan(Plan::Paid, "paid", PeriodConfig::new(1_000, minute));
/// let layer = LimitLayer::builder(&Backend::in_process(), plans)
///     .name("api")
///     .key(ExtensionKey::<UserId>::new())
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
#[must_use = "plans do nothing until a layer is built with them"]
pub struct Plans<A, P, S> {
    selector: S,
    plans: Vec<(P, String, A)>,
}

impl<A, P, S> Plans<A, P, S> {
    /// No plans yet, chosen per request by `selector`.
    pub fn new(selector: S) -> Self {
        Self {
            selector,
            plans: Vec::new(),
        }
    }

    /// Adds plan `plan`, named `name` (a policy name: non-empty, no `{`, `}`, quotes,
    /// backslashes or control characters), limited by `config`. The first plan is the
    /// default.
    pub fn plan(mut self, plan: P, name: impl Into<String>, config: A) -> Self {
        self.plans.push((plan, name.into(), config));
        self
    }
}

impl<A: fmt::Debug, P: fmt::Debug, S> fmt::Debug for Plans<A, P, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for (plan, name, config) in &self.plans {
            list.entry(&(plan, name, config));
        }
        list.finish()
    }
}

impl<A, P, S> Algorithm for Plans<A, P, S>
where
    A: Algorithm,
    P: PartialEq + Send + Sync + 'static,
    S: SelectPlan<P>,
{
    type Limiter = PlanLimiter<A::Limiter, P, S>;

    fn build(self, backend: &Backend, name: &str) -> Result<Self::Limiter, ConfigError> {
        if self.plans.is_empty() {
            return Err(ConfigError::Missing { setting: "plan" });
        }
        for (i, (plan, plan_name, _)) in self.plans.iter().enumerate() {
            validate_name("plan", plan_name)?;
            let earlier = &self.plans[..i];
            if earlier.iter().any(|(_, n, _)| n == plan_name) {
                return Err(ConfigError::Conflict {
                    reason: "two plans have the same name",
                });
            }
            if earlier.iter().any(|(p, _, _)| p == plan) {
                return Err(ConfigError::Conflict {
                    reason: "a plan was given twice",
                });
            }
        }
        let mut plans = Vec::with_capacity(self.plans.len());
        let mut policies = Vec::with_capacity(self.plans.len());
        for (plan, plan_name, config) in self.plans {
            let limiter = config.build(backend, &format!("{name}.{plan_name}"))?;
            policies.push(limiter.policy().clone());
            plans.push((plan, limiter));
        }
        Ok(PlanLimiter {
            plans: plans.into_boxed_slice(),
            policies: policies.into_boxed_slice(),
            selector: self.selector,
        })
    }
}

/// The [`Limiter`] of a [`Plans`] layer: one limiter per plan, and the selector.
pub struct PlanLimiter<L, P, S> {
    plans: Box<[(P, L)]>,
    policies: Box<[Policy]>,
    selector: S,
}

impl<L, P: PartialEq, S> PlanLimiter<L, P, S> {
    /// The limiter of `plan`, if it has one (for instance to read a count back).
    pub fn plan(&self, plan: &P) -> Option<&L> {
        self.plans.iter().find(|(p, _)| p == plan).map(|(_, l)| l)
    }
}

impl<L, P: fmt::Debug, S> fmt::Debug for PlanLimiter<L, P, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for ((plan, _), policy) in self.plans.iter().zip(self.policies.iter()) {
            map.entry(plan, policy);
        }
        map.finish()
    }
}

impl<L, P, S> Limiter for PlanLimiter<L, P, S>
where
    L: Limiter,
    P: PartialEq + Send + Sync + 'static,
    S: SelectPlan<P>,
{
    /// The default (first) plan's policy.
    fn policy(&self) -> &Policy {
        &self.policies[0]
    }

    /// Checks under the default (first) plan.
    fn check(&self, key: &[u8], cost: NonZeroU32) -> DecisionFuture {
        self.plans[0].1.check(key, cost)
    }

    fn policies(&self) -> &[Policy] {
        &self.policies
    }

    fn select(&self, request: &Parts) -> usize {
        self.selector
            .select(request)
            .and_then(|plan| self.plans.iter().position(|(p, _)| *p == plan))
            .unwrap_or(0)
    }

    fn check_policy(&self, index: usize, key: &[u8], cost: NonZeroU32) -> DecisionFuture {
        self.limiter(index).check(key, cost)
    }

    fn check_priority(
        &self,
        index: usize,
        key: &[u8],
        cost: NonZeroU32,
        priority: f64,
    ) -> DecisionFuture {
        self.limiter(index).check_priority(0, key, cost, priority)
    }

    fn decides_priority(&self) -> bool {
        self.plans
            .iter()
            .all(|(_, limiter)| limiter.decides_priority())
    }

    /// What a check under the default (first) plan would answer; a plan's own limiter
    /// ([`plan`](PlanLimiter::plan)) peeks under that plan.
    fn peek(&self, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        self.plans[0].1.peek(key, cost)
    }

    fn peek_policy(&self, index: usize, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        self.limiter(index).peek(key, cost)
    }

    fn members(&self, index: usize) -> &[Policy] {
        self.limiter(index).members(0)
    }

    fn peek_limits(
        &self,
        index: usize,
        key: &[u8],
        cost: NonZeroU32,
    ) -> Option<futures_util::future::BoxFuture<'static, Vec<(Policy, crate::Decision)>>> {
        self.limiter(index).peek_limits(0, key, cost)
    }

    /// Gives units back under the default (first) plan; counting by outcome gives them
    /// back under the plan that spent them ([`refund_policy`](Limiter::refund_policy)).
    fn refund(&self, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        self.plans[0].1.refund(key, cost)
    }

    fn refund_policy(&self, index: usize, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        self.limiter(index).refund(key, cost)
    }

    /// Settles under the default (first) plan; a layer that settles after the response
    /// settles under the plan that spent the units
    /// ([`settle_policy`](Limiter::settle_policy)).
    fn settle(&self, key: &[u8], delta: i64) -> Option<DecisionFuture> {
        self.plans[0].1.settle(key, delta)
    }

    fn settle_policy(&self, index: usize, key: &[u8], delta: i64) -> Option<DecisionFuture> {
        self.limiter(index).settle(key, delta)
    }

    /// The smallest bound of any plan's limiter (a plan that is a set: its smallest
    /// member).
    fn bounding_policy(&self) -> Option<&Policy> {
        self.plans
            .iter()
            .filter_map(|(_, limiter)| limiter.bounding_policy())
            .min_by_key(|policy| policy.quota())
    }

    /// Forgets `key` under every plan (a key's plan may change), and says where it
    /// stands under the default one.
    fn reset(&self, key: &[u8]) -> Option<DecisionFuture> {
        every_plan(self.plans.iter().map(|(_, limiter)| limiter.reset(key)))
    }

    /// Refuses `key` under every plan for `duration`, and says where it stands under
    /// the default one.
    fn block(&self, key: &[u8], duration: std::time::Duration) -> Option<DecisionFuture> {
        every_plan(
            self.plans
                .iter()
                .map(|(_, limiter)| limiter.block(key, duration)),
        )
    }

    /// Lifts `key`'s block under every plan, keeping its counts, and says where it
    /// stands under the default one.
    fn unblock(&self, key: &[u8]) -> Option<DecisionFuture> {
        every_plan(self.plans.iter().map(|(_, limiter)| limiter.unblock(key)))
    }

    /// The keys blocked under any plan, soonest end first, at most `max`: a key once
    /// (a [`block`](Limiter::block) is written under every plan), with the latest end
    /// of its plans' blocks and the policy of the plan that holds it longest.
    fn blocked(&self, max: usize) -> Option<Listing> {
        let listings: Vec<Listing> = self
            .plans
            .iter()
            .filter_map(|(_, limiter)| limiter.blocked(max))
            .collect();
        (!listings.is_empty()).then(|| crate::blocked::merged(listings, max))
    }

    /// Reserves under the default (first) plan.
    fn reserve(
        &self,
        key: &[u8],
        cost: NonZeroU32,
        max_wait: std::time::Duration,
    ) -> Option<DecisionFuture> {
        self.plans[0].1.reserve(key, cost, max_wait)
    }
}

impl<L, P, S> PlanLimiter<L, P, S> {
    /// The limiter of the policy at `index` (the default plan's past the end).
    fn limiter(&self, index: usize) -> &L {
        &self.plans.get(index).unwrap_or(&self.plans[0]).1
    }
}

/// One answer for an operation run under every plan: the first plan's, once every
/// plan's has landed; `None` if the first plan's limiter cannot.
fn every_plan(checks: impl Iterator<Item = Option<DecisionFuture>>) -> Option<DecisionFuture> {
    let mut checks: Vec<DecisionFuture> = checks.collect::<Option<_>>()?;
    let mut first = checks.remove(0);
    let ready = first.take_ready();
    if checks.is_empty() {
        return Some(match ready {
            Some(decision) => DecisionFuture::ready(decision),
            None => first,
        });
    }
    Some(DecisionFuture::pending(async move {
        let decision = match ready {
            Some(decision) => decision,
            None => first.await,
        };
        for check in checks {
            check.await;
        }
        decision
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::decision::State;
    use crate::period::PeriodConfig;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Plan {
        Free,
        Paid,
        Gold,
    }

    fn plans() -> Plans<PeriodConfig, Plan, ExtensionPlan<Plan>> {
        let minute = Duration::from_secs(60);
        Plans::new(ExtensionPlan::new())
            .plan(Plan::Free, "free", PeriodConfig::new(2, minute))
            .plan(Plan::Paid, "paid", PeriodConfig::new(5, minute))
    }

    fn parts(plan: Option<Plan>) -> Parts {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        if let Some(plan) = plan {
            parts.extensions.insert(plan);
        }
        parts
    }

    #[tokio::test]
    async fn each_plan_has_its_policy_and_counter() {
        let limiter = plans().build(&Backend::in_process(), "api").unwrap();
        let names: Vec<_> = limiter.policies().iter().map(Policy::name).collect();
        assert_eq!(names, ["api.free", "api.paid"]);
        assert_eq!(limiter.policy().quota(), 2);
        assert_eq!(limiter.select(&parts(Some(Plan::Paid))), 1);
        assert_eq!(limiter.select(&parts(Some(Plan::Free))), 0);
        // No plan, or a plan without a limit: the default plan.
        assert_eq!(limiter.select(&parts(None)), 0);
        assert_eq!(limiter.select(&parts(Some(Plan::Gold))), 0);
        let one = NonZeroU32::MIN;
        assert_eq!(
            limiter.check_policy(0, b"u", one).await.state,
            State::Allowed
        );
        assert_eq!(
            limiter.check_policy(0, b"u", one).await.state,
            State::HitQuota
        );
        assert_eq!(
            limiter.check_policy(0, b"u", one).await.state,
            State::OverQuota
        );
        let paid = limiter.check_policy(1, b"u", one).await;
        assert_eq!(
            (paid.state, paid.limit, paid.remaining),
            (State::Allowed, 5, 4)
        );
        assert!(limiter.plan(&Plan::Paid).is_some());
        assert!(limiter.plan(&Plan::Gold).is_none());
    }

    #[test]
    fn invalid_plans_fail_when_built() {
        let backend = Backend::in_process();
        let minute = Duration::from_secs(60);
        let none: Plans<PeriodConfig, Plan, ExtensionPlan<Plan>> = Plans::new(ExtensionPlan::new());
        assert_eq!(
            none.build(&backend, "api").unwrap_err(),
            ConfigError::Missing { setting: "plan" }
        );
        let same_name = plans().plan(Plan::Gold, "paid", PeriodConfig::new(9, minute));
        assert!(matches!(
            same_name.build(&backend, "api"),
            Err(ConfigError::Conflict { .. })
        ));
        let same_plan = plans().plan(Plan::Free, "free2", PeriodConfig::new(9, minute));
        assert!(matches!(
            same_plan.build(&backend, "api"),
            Err(ConfigError::Conflict { .. })
        ));
        let bad_name = plans().plan(Plan::Gold, "{gold}", PeriodConfig::new(9, minute));
        assert!(matches!(
            bad_name.build(&backend, "api"),
            Err(ConfigError::InvalidName {
                setting: "plan",
                ..
            })
        ));
        let bad_config = plans().plan(Plan::Gold, "gold", PeriodConfig::new(0, minute));
        assert_eq!(
            bad_config.build(&backend, "api").unwrap_err(),
            ConfigError::Zero { setting: "quota" }
        );
    }
}
