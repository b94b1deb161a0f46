//! [`LayerBuilder`], which checks an algorithm's settings and the shared ones (key, cost,
//! rejection, missing key) when the layer is built, and [`Algorithm`], what a config
//! type implements to be built into a limiter.

use std::fmt;
use std::sync::Arc;

use super::{LimitLayer, MissingKey, Options, Shared};
use crate::backend::{Backend, FailurePolicy};
use crate::cost::Cost;
use crate::error::{validate_name, ConfigError};
use crate::key::{GlobalKey, KeyExtractor};
use crate::limiter::Limiter;
use crate::metrics::LayerMetrics;
use crate::response::{DefaultRejection, HeaderParts, OnRejection};

/// An algorithm's configuration, turned into a [`Limiter`] on a [`Backend`] when the
/// layer is built.
pub trait Algorithm {
    /// The limiter this configuration builds.
    type Limiter: Limiter;

    /// Checks the configuration and builds the limiter named `name` on `backend`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting that cannot work.
    fn build(self, backend: &Backend, name: &str) -> Result<Self::Limiter, ConfigError>;
}

/// Builds a [`LimitLayer`]: the algorithm's settings, then the key, cost, rejection
/// and missing-key handling shared by all algorithms.
///
/// Nothing is checked until [`build`](Self::build), which reports the first setting
/// that cannot work.
#[must_use = "a builder does nothing until `build` is called"]
pub struct LayerBuilder<A, K = GlobalKey, C = u32, R = DefaultRejection> {
    pub(crate) backend: Backend,
    pub(crate) algorithm: A,
    name: Option<String>,
    key: K,
    /// Whether [`key`](Self::key) was called: without it, [`build`](Self::build) fails.
    keyed: bool,
    cost: C,
    rejection: R,
    options: Options,
}

impl<A: fmt::Debug, K, C, R> fmt::Debug for LayerBuilder<A, K, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerBuilder")
            .field("algorithm", &self.algorithm)
            .field("name", &self.name)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl LimitLayer<()> {
    /// Starts building a layer of `config` on `backend`: a [`PeriodConfig`],
    /// [`TokenBucketConfig`], [`RollingConfig`], [`LimitSet`], [`Plans`](super::Plans),
    /// [`DynamicLimits`](crate::DynamicLimits) or any [`Algorithm`] of yours builds a
    /// [`LimitLayer`]; an [`InFlightConfig`](crate::InFlightConfig) builds an
    /// [`InFlightLimitLayer`](crate::InFlightLimitLayer). The builder then takes what
    /// every layer has: the name, the key, the cost, the rejection.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::GlobalKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let config = PeriodConfig::new(100, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(GlobalKey)
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    ///
    /// [`PeriodConfig`]: crate::PeriodConfig
    /// [`TokenBucketConfig`]: crate::TokenBucketConfig
    /// [`RollingConfig`]: crate::RollingConfig
    /// [`LimitSet`]: crate::LimitSet
    pub fn builder<A>(backend: &Backend, config: A) -> LayerBuilder<A> {
        LayerBuilder::new(backend, config)
    }
}

impl<A> LayerBuilder<A> {
    pub(crate) fn new(backend: &Backend, algorithm: A) -> Self {
        Self {
            backend: backend.clone(),
            algorithm,
            name: None,
            key: GlobalKey,
            keyed: false,
            cost: 1,
            rejection: DefaultRejection,
            options: Options::default(),
        }
    }
}

impl<A, K, C, R> LayerBuilder<A, K, C, R> {
    /// The policy's name (required): shown in the `RateLimit` headers and used as the
    /// namespace of its keys, so layers with the same name and algorithm on the same
    /// backend share their counters, across processes too. Non-empty, at most 128 bytes,
    /// no `{`, `}`, quotes, backslashes or control characters.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How requests are told apart (required): a [`KeyExtractor`](crate::key::KeyExtractor)
    /// such as [`PeerIp`](crate::key::PeerIp) or a header, or [`GlobalKey`] for one limit
    /// shared by every request. [`build`](Self::build) fails without it.
    pub fn key<K2>(self, key: K2) -> LayerBuilder<A, K2, C, R> {
        LayerBuilder {
            backend: self.backend,
            algorithm: self.algorithm,
            name: self.name,
            key,
            keyed: true,
            cost: self.cost,
            rejection: self.rejection,
            options: self.options,
        }
    }

    /// How many units a request costs (default: one).
    pub fn cost<C2>(self, cost: C2) -> LayerBuilder<A, K, C2, R> {
        LayerBuilder {
            backend: self.backend,
            algorithm: self.algorithm,
            name: self.name,
            key: self.key,
            keyed: self.keyed,
            cost,
            rejection: self.rejection,
            options: self.options,
        }
    }

    /// The response for rejected requests (default: [`DefaultRejection`], a plain 429).
    pub fn on_rejection<R2>(self, rejection: R2) -> LayerBuilder<A, K, C, R2> {
        LayerBuilder {
            backend: self.backend,
            algorithm: self.algorithm,
            name: self.name,
            key: self.key,
            keyed: self.keyed,
            cost: self.cost,
            rejection,
            options: self.options,
        }
    }

    /// Whether admitted requests carry their [`Decision`](crate::Decision) in the request
    /// extensions (default: yes). Turning it off saves an allocation per request when no
    /// handler reads it.
    pub fn decision_extension(mut self, enabled: bool) -> Self {
        self.options.decision_extension = enabled;
        self
    }

    /// Whether admitted responses carry `RateLimit` and `RateLimit-Policy` (default:
    /// yes). Rejections always carry them.
    pub fn admitted_headers(mut self, enabled: bool) -> Self {
        self.options.admitted_headers = enabled;
        self
    }

    /// Shadow mode (default: off): evaluate and record every request, never reject one.
    ///
    /// A request over the limit is counted as `shadow_rejected` in the
    /// [metrics](crate::guide::metrics), logged with an `info` [`tracing`] event, and served as
    /// if admitted; so is a request without a usable key, whatever
    /// [`on_missing_key`](Self::on_missing_key) says. Use it to try a new limit in
    /// production and see whom it would refuse before enforcing it.
    ///
    /// A shadow layer is invisible to clients and handlers: it adds no `RateLimit`
    /// headers (a limit that is not enforced must not make clients slow down) and puts
    /// no [`Decision`](crate::Decision) into the request extensions (the decision of an
    /// enforcing layer stays there). The check counts what an enforcing layer would
    /// count, in the same keys: shadow and enforcing layers with the same name and
    /// algorithm share their counters, so give a shadow layer a name of its own. A check
    /// that needs a Redis round trip runs in a task of its own, so the request is
    /// served without waiting for it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::GlobalKey, Backend, LimitLayer, TokenBucketConfig};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let config = TokenBucketConfig::new(50, Duration::from_secs(1), 10);
    /// let trial = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api-v2-trial")
    ///     .key(GlobalKey)
    ///     .shadow(true)
    ///     .build()?;
    /// # let _ = trial; Ok(()) }
    /// ```
    pub fn shadow(mut self, enabled: bool) -> Self {
        self.options.shadow = enabled;
        self
    }

    /// Lets a request that would be refused wait its turn, for at most `max` in all,
    /// instead of a `429` (nginx's `limit_req` without `nodelay`): a refused request
    /// whose `Retry-After` falls within `max` of its arrival sleeps until then and is
    /// checked again, and so on until it is admitted (and then served as any other) or
    /// its next turn would fall past `max` (then refused as without waiting). A waiting
    /// request holds nothing: it spends only when it is admitted, so a client that goes
    /// away while it waits (its connection closed: the response future dropped) has
    /// spent nothing, and the limit holds exactly across instances as for any check.
    /// Waiters are not queued in order: each retries at its own `Retry-After`. At most
    /// 64 requests of one key wait at once in one process; more are refused at once.
    /// Needs a tokio runtime (the waits are tokio timers; without one, no request
    /// waits); a shadow layer never waits. While Redis is unreachable the waits follow
    /// the fallback's decisions as checks do. Off by default; `max` of zero turns it
    /// off.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::PeerIp, Backend, LimitLayer, PeriodConfig};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// // 10 a second per address; a burst beyond that waits up to 2 s for its turn.
    /// let layer = LimitLayer::builder(&Backend::in_process(), PeriodConfig::new(10, Duration::from_secs(1)))
    ///     .name("api")
    ///     .key(PeerIp::new())
    ///     .wait(Duration::from_secs(2))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn wait(mut self, max: std::time::Duration) -> Self {
        self.options.wait = (!max.is_zero()).then_some(max);
        self
    }

    /// Priority classes sharing one limit: `priority` gives, from a request's head, the
    /// fraction of the limit (0 to 1) its class may use. A request is admitted when its
    /// cost fits within that fraction of the limit, counted on the one state every class
    /// spends from, and spends only its cost. With critical traffic at 1.0, standard at
    /// 0.85 and sheddable at 0.6, sheddable requests are refused once 60% of the limit is
    /// used, standard ones from 85%, and critical ones only at the last unit.
    ///
    /// It is decided in the same atomic step as any check: one engine call on Redis,
    /// one step under the key's lock in process; a [set](crate::LimitSet) holds back
    /// that fraction of each of its limits, in the same call. The `RateLimit` header and
    /// the [`Decision`](crate::Decision)'s `remaining` tell each class what remains for
    /// it; `RateLimit-Policy` states the limit itself. A fraction is of whole units,
    /// rounded down (0.6 of 7 is 4); below 0 (or NaN) counts as 0, which refuses every
    /// request, and above 1 as 1, a check as without classes. A cost above a class's part
    /// of the limit can never be admitted (`ExceedsCapacity`).
    ///
    /// A check of a class below 1 takes no shortcut that could answer for another
    /// class: no coalescing and no token-bucket lease (its checks still go in batches,
    /// each with its class's part), and its refusal is neither kept in the deny cache
    /// nor starts a [lockout](crate::PeriodConfig::lockout), since the limit is not used
    /// up; a refusal
    /// the deny cache holds is the limit's own and refuses every class. While Redis is
    /// unreachable the fallback applies each class's fraction to the limits in force
    /// (this instance's share of them). A request of class 1 is checked as any other.
    /// The built-in limiters (their sets, plans and dynamic limits included) decide
    /// classes; a layer with `priority` over a limiter of your own, or an in-flight layer,
    /// fails to build.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// // 1000 calls a minute per tenant, by the class the gateway sets.
    /// let config = PeriodConfig::new(1_000, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-tenant"))
    ///     .priority(|parts| match parts.headers.get("x-priority").map(|v| v.as_bytes()) {
    ///         Some(b"critical") => 1.0,
    ///         Some(b"sheddable") => 0.6,
    ///         _ => 0.85,
    ///     })
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn priority(
        mut self,
        priority: impl Fn(&http::request::Parts) -> f64 + Send + Sync + 'static,
    ) -> Self {
        self.options.priority = Some(super::Classes(std::sync::Arc::new(priority)));
        self
    }

    /// Counts only the requests whose response says so (only failed logins, only
    /// successful exports): each admitted request still reserves its units when it is
    /// checked, so concurrent requests never overshoot the limit, and gets them back
    /// when its response does not count. Needs a limiter that can refund (the built-in
    /// ones and sets); see [`CountIf`](crate::limit::CountIf).
    pub fn count_if(mut self, count_if: crate::limit::CountIf) -> Self {
        self.options.count_if = Some(count_if);
        self
    }

    /// Settles each admitted request to what it really cost, read from its response by
    /// `usage`, when the response body ends (see [`Usage`](crate::limit::Usage) and
    /// the guide's [Limits on usage](crate::guide::usage#limits-on-usage)).
    ///
    /// The check spends the request's [cost](Self::cost) as an estimate; at the end of
    /// the body, one call settles the difference: less gives units back, more spends
    /// them past the limit (the key then owes them, and is refused until they are paid
    /// off: `Retry-After` says when). A body cut short (a client gone, an error, a
    /// panic) settles what it produced; a request whose actual cost cannot be read
    /// keeps its estimate. Needs a limiter that can settle (the built-in ones, sets,
    /// plans). A [shadow](Self::shadow) layer settles what its checks admitted, as it
    /// counts them; with [`count_if`](Self::count_if), a response that does not count
    /// is refunded instead.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::{HeaderName, Request};
    /// use tower_redis_ratelimit::{
    ///     key::HeaderKey, limit::Usage, Backend, LimitLayer, TokenBucketConfig,
    /// };
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// // 1000 rows a minute: 100 reserved per query, settled to `x-rows`.
    /// let config = TokenBucketConfig::new(1_000, Duration::from_secs(60), 1_000);
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("rows")
    ///     .key(HeaderKey::from_static("x-tenant"))
    ///     .cost(|_: &http::request::Parts| 100)
    ///     .settle(Usage::header(HeaderName::from_static("x-rows")))
    ///     .build()?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn settle(mut self, usage: crate::limit::Usage) -> Self {
        self.options.usage = Some(usage);
        self
    }

    /// Lets requests for which `predicate` says yes through without checking or counting
    /// them: no key is extracted, nothing is spent, and the response carries no
    /// rate-limit headers. For CORS preflights, health checks, internal callers and
    /// allowlisted clients (an API key in a set of yours). Called again, it adds a
    /// predicate: a request any of them exempts is exempt. The predicate sees the
    /// request's head (method, URI, headers, extensions: axum's `ConnectInfo` for the
    /// peer address) and runs on every request: keep it cheap and non-blocking.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let config = PeriodConfig::new(100, Duration::from_secs(60));
    /// let limit = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     // CORS preflights and the health check are not counted.
    ///     .exempt(|req| req.method == http::Method::OPTIONS || req.uri.path() == "/healthz")
    ///     // Nor is our own batch job.
    ///     .exempt(|req| req.headers.get("x-api-key").is_some_and(|key| key == "batch-job"))
    ///     .build()?;
    /// # let _ = limit; Ok(()) }
    /// ```
    pub fn exempt(
        mut self,
        predicate: impl Fn(&http::request::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.options.exempt = self.options.exempt.or(predicate);
        self
    }

    /// What to do when no key can be extracted (default: reject with 400). The response
    /// of a rejection is the rejection handler's
    /// [`on_missing_key`](crate::OnRejection::on_missing_key).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.options.missing_key = missing_key;
        self
    }

    /// The level of the [`tracing`] event for a request without a usable key that is an
    /// ordinary client error (a credential its client did not send:
    /// [`KeyOrigin::Client`](crate::key::KeyOrigin::Client)), or that the layer lets
    /// through or limits under another key (default: `DEBUG`; every one is also counted
    /// in the `missing_key` [metric](crate::guide::metrics)). A key the server should have
    /// provided is a misconfiguration, and keeps its rate-limited `WARN`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let config = PeriodConfig::new(100, Duration::from_secs(60));
    /// let limit = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     // Clients without an API key show up in the service's INFO logs.
    ///     .missing_key_log_level(tracing::Level::INFO)
    ///     .build()?;
    /// # let _ = limit; Ok(()) }
    /// ```
    pub fn missing_key_log_level(mut self, level: tracing::Level) -> Self {
        self.options.missing_key_level = level;
        self
    }

    /// The longest key accepted, in bytes, its [tag](crate::key#tags) included (default:
    /// 256). A longer key, such as an oversized header, is treated as a missing key
    /// instead of being stored.
    pub fn max_key_len(mut self, max_key_len: usize) -> Self {
        self.options.max_key_len = max_key_len;
        self
    }

    /// What this layer answers while Redis is unreachable (default: the backend's, which
    /// defaults to [`FailurePolicy::Fallback`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        let mut failover = self.backend.failover();
        failover.policy = policy;
        self.backend = self.backend.with_failover(failover);
        self
    }

    /// The fraction of this layer's limit that the in-process fallback applies while
    /// Redis is unreachable; see [`BackendBuilder::fallback_share`](crate::BackendBuilder::fallback_share).
    pub fn fallback_share(mut self, share: f64) -> Self {
        let mut failover = self.backend.failover();
        failover.share = share;
        self.backend = self.backend.with_failover(failover);
        self
    }

    /// How this layer's fallback share is rounded below one unit (default: the
    /// backend's); see [`BackendBuilder::fallback_rounding`](crate::BackendBuilder::fallback_rounding).
    pub fn fallback_rounding(mut self, rounding: crate::backend::ShareRounding) -> Self {
        let mut failover = self.backend.failover();
        failover.rounding = rounding;
        self.backend = self.backend.with_failover(failover);
        self
    }
}

impl<A: Algorithm, K, C, R> LayerBuilder<A, K, C, R> {
    /// Checks every setting and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a missing or invalid name, a missing [key](Self::key), a
    /// zero maximum key length, a
    /// fixed cost (a `u32`) above the capacity of a policy (a fixed window's
    /// quota, a token bucket's burst, a rolling window's limit, a set's smallest member;
    /// on Redis with the [`Fallback`](FailurePolicy::Fallback) policy, also that capacity
    /// times the fallback share), [`priority`](Self::priority) on a limiter that has no
    /// classes (one of your own), or any setting of the algorithm that cannot work.
    pub fn build(self) -> Result<LimitLayer<A::Limiter, K, C, R>, ConfigError>
    where
        K: KeyExtractor,
        C: Cost,
        R: OnRejection,
    {
        let Checked {
            backend,
            algorithm,
            name,
            key,
            keyed,
            cost,
            rejection,
            options,
        } = self.checked()?;
        let limiter = algorithm.build(&backend, &name)?;
        let policies = limiter.policies();
        if policies.is_empty() {
            return Err(ConfigError::Missing { setting: "policy" });
        }
        // Custom limiters and plans name their own policies: they go into headers too.
        for policy in policies {
            validate_name("policy name", policy.name())?;
        }
        // A set's members are decided together under the set's one policy: its smallest
        // member bounds a request's cost (for a set wrapped in plans too).
        let bound = limiter.bounding_policy();
        check_fixed_cost(&cost, policies.iter().chain(bound), &backend)?;
        if options.priority.is_some() && !limiter.decides_priority() {
            return Err(ConfigError::Conflict {
                reason: "this limiter has no priority classes: `priority` needs a built-in \
                         limiter (or plans and dynamic limits of them)",
            });
        }
        require_key(keyed)?;
        let headers = policies.iter().map(HeaderParts::new).collect();
        let metrics = LayerMetrics::new(policies, |index| limiter.members(index));
        let offenders = policies.iter().map(|_| Default::default()).collect();
        Ok(LimitLayer {
            shared: Arc::new(Shared {
                name,
                limiter,
                key,
                cost,
                rejection,
                headers,
                options,
                metrics,
                offenders,
                waiters: Default::default(),
                missing_warning: super::MissingKeyWarning::new(std::any::type_name::<K>()),
            }),
        })
    }
}

/// Refuses a fixed cost that no policy of the layer could ever admit: every request
/// would get a `429` that no wait can cure. Costs computed per request (closures) are
/// unknown here; a request whose cost is above the capacity is refused as
/// [`State::ExceedsCapacity`](crate::State::ExceedsCapacity).
fn check_fixed_cost<'p, C: Cost>(
    cost: &C,
    policies: impl Iterator<Item = &'p crate::decision::Policy>,
    backend: &Backend,
) -> Result<(), ConfigError> {
    let Some(cost) = cost.fixed() else {
        return Ok(());
    };
    let Some(smallest) = policies.min_by_key(|policy| policy.quota()) else {
        return Ok(());
    };
    let above = |capacity: u64, fallback: bool| ConfigError::CostAboveCapacity {
        policy: smallest.name().to_owned(),
        cost,
        capacity,
        fallback,
    };
    if u64::from(cost) > smallest.quota() {
        return Err(above(smallest.quota(), false));
    }
    // What the in-process fallback of a Redis backend applies (the whole limit without
    // Redis).
    let local = backend.local_limit(smallest.quota());
    // (A share rounded to nothing refuses in the fallback by the layer's own choice.)
    if backend.failover().policy == FailurePolicy::Fallback && local > 0 && u64::from(cost) > local
    {
        return Err(above(local, true));
    }
    Ok(())
}

/// Refuses a layer built without [`key`](LayerBuilder::key): one limit shared by every
/// request is a choice to spell (`.key(GlobalKey)`), never a default.
pub(crate) fn require_key(keyed: bool) -> Result<(), ConfigError> {
    if keyed {
        Ok(())
    } else {
        Err(ConfigError::Missing { setting: "key" })
    }
}

/// Refuses a [`max_key_len`](LayerBuilder::max_key_len) shorter than every key the
/// extractor can make (`global`, or `hdr:<name>:` and one byte): every request would be
/// refused as having no key.
fn check_key_fits<K: KeyExtractor>(key: &K, max_key_len: usize) -> Result<(), ConfigError> {
    let Some(shortest) = key.shortest_key() else {
        return Ok(());
    };
    if max_key_len < shortest {
        return Err(ConfigError::Conflict {
            reason: "`max_key_len` is shorter than any key the key extractor makes, so every \
                     request would be refused as having no key",
        });
    }
    Ok(())
}

/// A builder's shared settings, checked: what [`build`](LayerBuilder::build) makes a
/// [`LimitLayer`] of, and the [in-flight](crate::in_flight) layer its own.
pub(crate) struct Checked<A, K, C, R> {
    pub(crate) backend: Backend,
    pub(crate) algorithm: A,
    pub(crate) name: String,
    pub(crate) key: K,
    /// Whether the key was given; see [`require_key`].
    pub(crate) keyed: bool,
    pub(crate) cost: C,
    pub(crate) rejection: R,
    pub(crate) options: Options,
}

impl<A, K: KeyExtractor, C, R> LayerBuilder<A, K, C, R> {
    /// Checks the settings every layer shares (name, failure settings, key length, the
    /// missing-key fallback), as [`build`](Self::build) does.
    pub(crate) fn checked(self) -> Result<Checked<A, K, C, R>, ConfigError> {
        let name = self.name.ok_or(ConfigError::Missing { setting: "name" })?;
        self.backend.failover().validate()?;
        validate_name("name", &name)?;
        if self.options.max_key_len == 0 {
            return Err(ConfigError::Zero {
                setting: "max_key_len",
            });
        }
        if let MissingKey::Key(key) = &self.options.missing_key {
            if key.len() > self.options.max_key_len {
                return Err(ConfigError::Conflict {
                    reason: "the missing-key fallback key is longer than `max_key_len`",
                });
            }
        }
        check_key_fits(&self.key, self.options.max_key_len)?;
        Ok(Checked {
            backend: self.backend,
            algorithm: self.algorithm,
            name,
            key: self.key,
            keyed: self.keyed,
            cost: self.cost,
            rejection: self.rejection,
            options: self.options,
        })
    }
}
