//! The one trait every algorithm implements, and the future it returns.

use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::blocked::{Blocked, Listing};
use crate::decision::{Decision, Policy};
use crate::error::AdminError;

/// A rate-limit algorithm bound to a backend: the one thing the generic
/// [`Limit`](crate::Limit) service asks.
///
/// The three built-in limiters ([`PeriodLimiter`](crate::PeriodLimiter),
/// [`TokenBucketLimiter`](crate::TokenBucketLimiter),
/// [`RollingWindowLimiter`](crate::RollingWindowLimiter)) implement it; so can
/// your own. A check never fails: trouble with a shared store is the limiter's to handle
/// (the built-in ones answer from their in-process state), so the service always gets a
/// [`Decision`].
pub trait Limiter: Send + Sync + 'static {
    /// What this limiter enforces; shown in the `RateLimit-Policy` header.
    fn policy(&self) -> &Policy;

    /// Counts `cost` units against `key` and says whether they fit.
    ///
    /// A key is any bytes (a [`Key`](crate::key::Key) dereferences to them); different
    /// bytes are always different keys.
    ///
    /// In-process checks answer at once with [`DecisionFuture::ready`]; checks that need a round
    /// trip return [`DecisionFuture::pending`].
    fn check(&self, key: &[u8], cost: NonZeroU32) -> DecisionFuture;

    /// Every policy this limiter can apply, for limiters that choose one per request
    /// (such as [`PlanLimiter`](crate::limit::PlanLimiter), one policy per plan).
    ///
    /// The default is [`policy`](Self::policy) alone. The first policy is the default
    /// one, which [`policy`](Self::policy) returns and [`check`](Self::check) applies.
    // Plumbing for plans and dynamic limits (a limiter that chooses a policy per
    // request); hidden: a limiter of your own needs none of it.
    #[doc(hidden)]
    fn policies(&self) -> &[Policy] {
        std::slice::from_ref(self.policy())
    }

    /// The index in [`policies`](Self::policies) of the policy that applies to a
    /// request, from its head (method, URI, headers, extensions). Only asked when there
    /// is more than one policy; the default is `0`.
    // Plumbing for plans and dynamic limits (a limiter that chooses a policy per
    // request); hidden: a limiter of your own needs none of it.
    #[doc(hidden)]
    fn select(&self, request: &http::request::Parts) -> usize {
        let _ = request;
        0
    }

    /// Counts `cost` units against `key` under the policy at `index` in
    /// [`policies`](Self::policies). The default ignores `index` and calls
    /// [`check`](Self::check).
    // Plumbing for plans and dynamic limits (a limiter that chooses a policy per
    // request); hidden: a limiter of your own needs none of it.
    #[doc(hidden)]
    fn check_policy(&self, index: usize, key: &[u8], cost: NonZeroU32) -> DecisionFuture {
        let _ = index;
        self.check(key, cost)
    }

    /// [`check_policy`](Self::check_policy) for a request of a priority class that may
    /// use `priority` (a fraction from 0 to 1) of the limit: admitted when the cost and
    /// what the class leaves to others fit, spending the cost (see
    /// [`LayerBuilder::priority`](crate::LayerBuilder::priority)). The built-in limiters
    /// decide it in one atomic step, on Redis and in process; the default ignores
    /// `priority`, as a limiter that has no classes.
    // Plumbing for priority classes (a layer's `priority`); hidden: a limiter of your own
    // needs none of it.
    #[doc(hidden)]
    fn check_priority(
        &self,
        index: usize,
        key: &[u8],
        cost: NonZeroU32,
        priority: f64,
    ) -> DecisionFuture {
        let _ = priority;
        self.check_policy(index, key, cost)
    }

    /// Whether [`check_priority`](Self::check_priority) decides priority classes (the
    /// built-in limiters do; the default, `false`, makes a layer with classes fail to
    /// build rather than ignore them).
    // Plumbing for priority classes; hidden: a limiter of your own needs none of it.
    #[doc(hidden)]
    fn decides_priority(&self) -> bool {
        false
    }

    /// What [`check`](Self::check) of `cost` would answer now, spending nothing. `None`
    /// when this limiter cannot tell (the default); the built-in limiters can, in one
    /// round trip on Redis.
    fn peek(&self, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        let _ = (key, cost);
        None
    }

    /// What a check of `cost` under the policy at `index` in
    /// [`policies`](Self::policies) would answer now, spending nothing. The default
    /// ignores `index` and calls [`peek`](Self::peek).
    // Plumbing for plans and dynamic limits (a limiter that chooses a policy per
    // request); hidden: a limiter of your own needs none of it.
    #[doc(hidden)]
    fn peek_policy(&self, index: usize, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        let _ = index;
        self.peek(key, cost)
    }

    /// Gives `cost` units back to `key` (a request that turned out not to count), and
    /// says where the key stands then. `None` when this limiter cannot (the default).
    ///
    /// A fixed window gets the units back in its current window; a token bucket gets
    /// the tokens back (never beyond full); a rolling window takes them off its newest
    /// buckets. A refund never admits more than the limit: at most what was spent comes
    /// back.
    fn refund(&self, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        let _ = (key, cost);
        None
    }

    /// Gives `cost` units back to `key` under the policy at `index` in
    /// [`policies`](Self::policies) (the one [`check_policy`](Self::check_policy) spent
    /// them under): what counting by outcome calls. The default ignores `index` and calls
    /// [`refund`](Self::refund).
    // Plumbing for plans and dynamic limits (a limiter that chooses a policy per
    // request); hidden: a limiter of your own needs none of it.
    #[doc(hidden)]
    fn refund_policy(&self, index: usize, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        let _ = index;
        self.refund(key, cost)
    }

    /// Settles a request on `key` to what it really cost, `delta` units more (above 0)
    /// or fewer (below 0) than it spent when it was checked, in one call; says where
    /// the key stands then. `None` when this limiter cannot (the default).
    ///
    /// Fewer: the difference goes back, as [`refund`](Self::refund). More: the extra
    /// is spent whatever the limit says, even past it: the key then *owes* units (its
    /// debt), and its checks are refused, with a `retry_after` saying when the debt is
    /// paid off, until then. A token bucket's debt is its TAT beyond `now + burst`
    /// intervals (the refill pays it off); a fixed window's, its count above the quota
    /// (the window's end clears it: the next window starts afresh); a rolling window's,
    /// its sum above the limit (paid off as the oldest buckets expire). Where the key
    /// stands is a check of no cost: refused while it owes. A `delta` beyond
    /// `u32::MAX` either way counts as `u32::MAX` (a cost's largest). See the guide's
    /// [Limits on usage](crate::guide::usage#limits-on-usage).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{Backend, Limiter, PeriodConfig, PeriodLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let tokens = PeriodLimiter::new(
    ///     &Backend::in_process(),
    ///     "tokens",
    ///     PeriodConfig::new(1_000, Duration::from_secs(60)),
    /// )?;
    /// // An estimate of 300 tokens, then the response said 1 100.
    /// assert!(tokens.check(b"alice", NonZeroU32::new(300).unwrap()).await.is_admitted());
    /// let owed = tokens.settle(b"alice", 800).unwrap().await;
    /// assert!(!owed.is_admitted(), "100 tokens over: refused until the minute ends");
    /// # Ok(()) }
    /// ```
    fn settle(&self, key: &[u8], delta: i64) -> Option<DecisionFuture> {
        let _ = (key, delta);
        None
    }

    /// Settles `key` by `delta` under the policy at `index` in
    /// [`policies`](Self::policies) (the one [`check_policy`](Self::check_policy) spent
    /// the units under): what a layer that settles after the response calls. The
    /// default ignores `index` and calls [`settle`](Self::settle).
    // Plumbing for plans and dynamic limits (a limiter that chooses a policy per
    // request); hidden: a limiter of your own needs none of it.
    #[doc(hidden)]
    fn settle_policy(&self, index: usize, key: &[u8], delta: i64) -> Option<DecisionFuture> {
        let _ = index;
        self.settle(key, delta)
    }

    /// Forgets `key` (an administrator lifting a limit): its count starts afresh and a
    /// [block](Self::block) is lifted (to lift a block alone, keeping the count:
    /// [`unblock`](Self::unblock)). Says where it
    /// stands then; `None` when this limiter cannot (the default).
    ///
    /// On a Redis backend the change reaches every instance sharing the store at once:
    /// within about one Redis round trip of it (its message on the backends' change
    /// subscription), an instance's deny cache stops refusing the key and its lease of
    /// the key ends; while an instance's subscription is down (or the backend was built
    /// on a pool of yours without a
    /// [`subscription_url`](crate::BackendBuilder::subscription_url)), within the backend's
    /// [`deny_cache_max_age`](crate::BackendBuilder::deny_cache_max_age) (1 s by
    /// default) and, for a lease, its lifetime. See
    /// [Changes on every instance](crate::guide::operations#changes-on-every-instance).
    ///
    /// `key` is the key a layer counts, tag and all (`hdr:x-api-key:trap`,
    /// `ext:user:carol`, `ip:203.0.113.7`, `fn:trap` for a closure: see the
    /// [table of tags](crate::key#tags)), not the client's value (`trap`): any bytes are
    /// a key, so `reset(b"trap")` forgets the key `trap`, which no layer with a tagged
    /// extractor counts, and answers that it is fully available while the client stays
    /// limited. To act on what you know, the client's value, go through the layer:
    /// [`LimitLayer::reset_value`](crate::LimitLayer::reset_value) (and `peek_value`,
    /// `block_value`, `refund_value`) resolve it with the layer's own extractor
    /// ([`KeyExtractor::keys_for`](crate::key::KeyExtractor::keys_for)), and refuse a
    /// value the layer never counts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, Limiter, PeriodConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(60, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     .build()?;
    /// layer.block_value("trap", Duration::from_secs(3_600)).await?;
    /// // By the key: the key the layer counts the API key `trap` under.
    /// let key = &layer.keys_for("trap")?[0];
    /// assert_eq!(key, "hdr:x-api-key:trap");
    /// assert!(layer.limiter().reset(key).expect("built-in").await.is_admitted());
    /// // Or by the value, in one call.
    /// layer.reset_value("trap").await?;
    /// # Ok(()) }
    /// ```
    fn reset(&self, key: &[u8]) -> Option<DecisionFuture> {
        let _ = key;
        None
    }

    /// Refuses `key` for `duration` (at least one millisecond), whatever its limit says,
    /// spending nothing, on every instance sharing the store; a later block replaces it
    /// and [`reset`](Self::reset) lifts it. Says where the key stands then. `None` when
    /// this limiter cannot (the default). `key` is the key a layer counts, not the
    /// client's value: see [`reset`](Self::reset), and
    /// [`LimitLayer::block_value`](crate::LimitLayer::block_value) to block by value.
    ///
    /// On a Redis backend a block (or a later, shorter one that replaces it) reaches
    /// every instance sharing the store at once: within about one Redis round trip of
    /// it (its message on the backends' change subscription), an instance's deny cache
    /// forgets what it cached of the key and its lease of the key ends; while an
    /// instance's subscription is down (or the backend was built on a pool of yours
    /// without a [`subscription_url`](crate::BackendBuilder::subscription_url)), within
    /// the backend's
    /// [`deny_cache_max_age`](crate::BackendBuilder::deny_cache_max_age) (1 s by
    /// default) and, for a lease, its lifetime. See
    /// [Changes on every instance](crate::guide::operations#changes-on-every-instance).
    fn block(&self, key: &[u8], duration: std::time::Duration) -> Option<DecisionFuture> {
        let _ = (key, duration);
        None
    }

    /// Lifts `key`'s [block](Self::block) or lockout, keeping what its limit has
    /// counted (a [`reset`](Self::reset) forgets both): the next check is decided on
    /// the count as it stood. Says where the key stands then; `None` when this limiter
    /// cannot (the default). It reaches every instance sharing the store as a block
    /// does. `key` is the key a layer counts, not the client's value: see
    /// [`LimitLayer::unblock_value`](crate::LimitLayer::unblock_value) to unblock by
    /// value.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{Backend, Limiter, PeriodConfig, PeriodLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(10, Duration::from_secs(60));
    /// let limiter = PeriodLimiter::new(&Backend::in_process(), "api", config)?;
    /// limiter.check(b"carol", NonZeroU32::MIN).await;
    /// limiter.block(b"carol", Duration::from_secs(60)).expect("built-in").await;
    /// let after = limiter.unblock(b"carol").expect("built-in").await;
    /// // Admitted again, the one request still counted.
    /// assert!(after.is_admitted());
    /// assert_eq!(after.remaining, 9);
    /// # Ok(()) }
    /// ```
    fn unblock(&self, key: &[u8]) -> Option<DecisionFuture> {
        let _ = key;
        None
    }

    /// The keys this limiter refuses now because of a [block](Self::block) or a lockout,
    /// soonest end first, at most `max` of them: each with the limit's name, the key
    /// and when its block ends. `None` when this limiter cannot list them (the default).
    /// The future fails with an [`AdminError::Listing`] when the store of the list did
    /// not answer; a limiter of your own answers a list it holds with
    /// `Box::pin(std::future::ready(Ok(list)))`.
    ///
    /// A listing reads a small list of the blocks kept beside them, never the keyspace:
    /// on Redis, a sorted set per limit (`<prefix>:blocked:<algorithm>:<name>`, see
    /// [Redis keys](crate::guide::deployments#redis-keys)) read with one `ZRANGEBYSCORE` of at
    /// most `max` entries, whatever the number of keys the limit counts; in process, a
    /// registry of the blocked keys themselves. The block's own key stays the truth: the
    /// list is advisory. A block or a reset made through a handle is listed (or gone)
    /// when its answer comes; a lockout is listed moments after the refusal that started
    /// it (written in the background, never on a check's way). See
    /// [Listing what is blocked](crate::guide::operations#listing-what-is-blocked).
    ///
    /// The keys are the keys the limit counts, tag and all; a layer's
    /// [`LimitLayer::blocked`](crate::LimitLayer::blocked) also names the client's
    /// value each was made from.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{Backend, Limiter, PeriodConfig, PeriodLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let minute = Duration::from_secs(60);
    /// let login = PeriodLimiter::new(
    ///     &Backend::in_process(),
    ///     "login",
    ///     PeriodConfig::new(1, minute).lockout(15 * minute),
    /// )?;
    /// login.check(b"alice", NonZeroU32::MIN).await;
    /// login.check(b"alice", NonZeroU32::MIN).await; // refused: locked out
    /// login.block(b"mallory", 60 * minute).expect("built-in").await;
    /// let blocked = login.blocked(10).expect("built-in").await?;
    /// let keys: Vec<_> = blocked.iter().map(|b| (b.limit.as_str(), &b.key[..])).collect();
    /// assert_eq!(keys, [("login", &b"alice"[..]), ("login", &b"mallory"[..])]);
    /// # Ok(()) }
    /// ```
    #[allow(clippy::type_complexity)] // a boxed future, named in full
    fn blocked(
        &self,
        max: usize,
    ) -> Option<Pin<Box<dyn Future<Output = Result<Vec<Blocked>, AdminError>> + Send>>> {
        let _ = max;
        None
    }

    /// Takes `cost` units at the earliest time they fit, if that is at most `max_wait`
    /// away: one call, however many callers share the limit, and the caller waits the
    /// admitted decision's `retry_after` (if any) before using them. A refused decision
    /// took nothing; its `retry_after` says when the cost would fit. Give unused units
    /// back with [`refund`](Self::refund). `None` when this limiter cannot reserve ahead
    /// (the default; of the built-in limiters, token buckets can).
    fn reserve(
        &self,
        key: &[u8],
        cost: NonZeroU32,
        max_wait: std::time::Duration,
    ) -> Option<DecisionFuture> {
        let _ = (key, cost, max_wait);
        None
    }

    /// Not part of the API: where `key` stands under each limit decided together under
    /// the policy at `index` (a [set](crate::LimitSet)'s members, else the policy
    /// itself) for a check of `cost`, spending nothing, in one round trip: what a
    /// caller's usage route answers. The default peeks the policy
    /// ([`peek_policy`](Self::peek_policy)); `None` when this limiter cannot peek.
    #[doc(hidden)]
    fn peek_limits(
        &self,
        index: usize,
        key: &[u8],
        cost: NonZeroU32,
    ) -> Option<futures_util::future::BoxFuture<'static, Vec<(Policy, Decision)>>> {
        let policy = self.policies().get(index).unwrap_or(self.policy()).clone();
        let peek = self.peek_policy(index, key, cost)?;
        Some(Box::pin(async move { vec![(policy, peek.await)] }))
    }

    /// Not part of the API: the policies of the limits decided together under the
    /// policy at `index` in [`policies`](Self::policies) (a [set](crate::LimitSet)'s
    /// members, in order, which a set's refusal names by index, for its metrics);
    /// empty for a limiter that is not a set (the default).
    #[doc(hidden)]
    fn members(&self, index: usize) -> &[Policy] {
        let _ = index;
        &[]
    }

    /// Not part of the API: a policy whose quota also bounds the cost of one request,
    /// beside [`policies`](Self::policies) (a [set](crate::LimitSet)'s smallest member, whose
    /// quota is below the set's policy's), so that a layer's builder refuses a
    /// fixed cost (a `u32`) no request could ever pay. `None` by default;
    /// limiters that wrap others (plans, `Arc`) answer for what they wrap.
    #[doc(hidden)]
    fn bounding_policy(&self) -> Option<&Policy> {
        None
    }
}

impl<L: Limiter + ?Sized> Limiter for std::sync::Arc<L> {
    fn policy(&self) -> &Policy {
        (**self).policy()
    }

    fn check(&self, key: &[u8], cost: NonZeroU32) -> DecisionFuture {
        (**self).check(key, cost)
    }

    fn policies(&self) -> &[Policy] {
        (**self).policies()
    }

    fn select(&self, request: &http::request::Parts) -> usize {
        (**self).select(request)
    }

    fn check_policy(&self, index: usize, key: &[u8], cost: NonZeroU32) -> DecisionFuture {
        (**self).check_policy(index, key, cost)
    }

    fn check_priority(
        &self,
        index: usize,
        key: &[u8],
        cost: NonZeroU32,
        priority: f64,
    ) -> DecisionFuture {
        (**self).check_priority(index, key, cost, priority)
    }

    fn decides_priority(&self) -> bool {
        (**self).decides_priority()
    }

    fn peek(&self, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        (**self).peek(key, cost)
    }

    fn peek_policy(&self, index: usize, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        (**self).peek_policy(index, key, cost)
    }

    fn members(&self, index: usize) -> &[Policy] {
        (**self).members(index)
    }

    fn peek_limits(
        &self,
        index: usize,
        key: &[u8],
        cost: NonZeroU32,
    ) -> Option<futures_util::future::BoxFuture<'static, Vec<(Policy, Decision)>>> {
        (**self).peek_limits(index, key, cost)
    }

    fn refund(&self, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        (**self).refund(key, cost)
    }

    fn bounding_policy(&self) -> Option<&Policy> {
        (**self).bounding_policy()
    }

    fn refund_policy(&self, index: usize, key: &[u8], cost: NonZeroU32) -> Option<DecisionFuture> {
        (**self).refund_policy(index, key, cost)
    }

    fn settle(&self, key: &[u8], delta: i64) -> Option<DecisionFuture> {
        (**self).settle(key, delta)
    }

    fn settle_policy(&self, index: usize, key: &[u8], delta: i64) -> Option<DecisionFuture> {
        (**self).settle_policy(index, key, delta)
    }

    fn reset(&self, key: &[u8]) -> Option<DecisionFuture> {
        (**self).reset(key)
    }

    fn block(&self, key: &[u8], duration: std::time::Duration) -> Option<DecisionFuture> {
        (**self).block(key, duration)
    }

    fn unblock(&self, key: &[u8]) -> Option<DecisionFuture> {
        (**self).unblock(key)
    }

    fn blocked(&self, max: usize) -> Option<Listing> {
        (**self).blocked(max)
    }

    fn reserve(
        &self,
        key: &[u8],
        cost: NonZeroU32,
        max_wait: std::time::Duration,
    ) -> Option<DecisionFuture> {
        (**self).reserve(key, cost, max_wait)
    }
}

/// A future of a [`Decision`]: the answer of [`Limiter::check`] and of every other
/// `Limiter` method (a peek, a refund, a settlement, a reset, a block, a reservation:
/// each answers where the key stands after it), which allocates only when it has to
/// wait for a store.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use tower_redis_ratelimit::{Backend, DecisionFuture, Limiter, PeriodConfig, PeriodLimiter};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let backend = Backend::in_process();
/// let limiter = PeriodLimiter::new(&backend, "login", PeriodConfig::new(5, Duration::from_secs(60)))?;
/// let check: DecisionFuture = limiter.check(b"alice", NonZeroU32::MIN);
/// assert!(check.await.is_admitted());
/// // An administrator lifting a limit gets the same kind of answer.
/// let reset: Option<DecisionFuture> = limiter.reset(b"alice");
/// assert_eq!(reset.unwrap().await.remaining, 5);
/// # Ok::<_, tower_redis_ratelimit::ConfigError>(())
/// # }).unwrap();
/// ```
#[must_use = "a decision's future does nothing unless awaited"]
pub struct DecisionFuture {
    inner: Inner,
    /// Set on the decision: the policy that applied, when chosen per request.
    policy_header: Option<http::HeaderValue>,
}

enum Inner {
    Ready(Option<Decision>),
    Pending(Pin<Box<dyn Future<Output = Decision> + Send + 'static>>),
}

impl DecisionFuture {
    /// A decision that is already known.
    pub fn ready(decision: Decision) -> Self {
        Self {
            inner: Inner::Ready(Some(decision)),
            policy_header: None,
        }
    }

    /// A decision that needs a round trip.
    pub fn pending(future: impl Future<Output = Decision> + Send + 'static) -> Self {
        Self {
            inner: Inner::Pending(Box::pin(future)),
            policy_header: None,
        }
    }

    /// Marks the decision with the `RateLimit-Policy` value of the limit that applied.
    pub(crate) fn with_policy_header(mut self, header: http::HeaderValue) -> Self {
        self.policy_header = Some(header);
        self
    }

    /// Takes the decision out if it was known at once.
    pub(crate) fn take_ready(&mut self) -> Option<Decision> {
        let decision = match &mut self.inner {
            Inner::Ready(decision) => decision.take(),
            Inner::Pending(_) => None,
        };
        decision.map(|d| mark(d, &mut self.policy_header))
    }
}

impl Future for DecisionFuture {
    type Output = Decision;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        let this = self.get_mut();
        let decision = match &mut this.inner {
            Inner::Ready(decision) => decision
                .take()
                .expect("`DecisionFuture` polled after completion"),
            Inner::Pending(future) => std::task::ready!(future.as_mut().poll(cx)),
        };
        Poll::Ready(mark(decision, &mut this.policy_header))
    }
}

fn mark(mut decision: Decision, header: &mut Option<http::HeaderValue>) -> Decision {
    if let Some(header) = header.take() {
        decision.policy_header = Some(header);
    }
    decision
}

impl fmt::Debug for DecisionFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Ready(decision) => f
                .debug_tuple("DecisionFuture::Ready")
                .field(decision)
                .finish(),
            Inner::Pending(_) => f.write_str("DecisionFuture::Pending"),
        }
    }
}
