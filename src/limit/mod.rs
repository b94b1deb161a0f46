//! The one generic rate-limit service every layer builds: extract a key, ask the
//! limiter, then call the inner service or answer the rejection.
//!
//! [`LimitLayer`] is built by a [`LayerBuilder`] (from [`LimitLayer::builder`] and an
//! algorithm's config) and wraps services in
//! [`Limit`], whose future is [`ResponseFuture`]. `poll_ready` only delegates: the
//! limit is decided per request, in the future, never by refusing readiness.
//!
//! [`Plans`] chooses one of several limits per request (a free and a paid plan) inside
//! one layer; [`LayerBuilder::shadow`] evaluates a limit without enforcing it.

mod admin;
mod body;
mod builder;
mod counted;
mod future;
mod layer;
mod outcome;
mod plan;
#[allow(clippy::module_inception)]
mod service;
mod stream;
mod usage;
mod warn;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};

use crate::decision::{Decision, Decisions};
use crate::key::{KeyExtractor, KeyOrigin};
use crate::limiter::{DecisionFuture, Limiter};
use crate::metrics::LayerMetrics;
use crate::response::{HeaderParts, OnRejection, Ready, Rejection};

pub use self::body::ResponseBody;
pub(crate) use self::builder::require_key;
pub use self::builder::{Algorithm, LayerBuilder};
pub use self::counted::{CountRequestBytes, CountRequestBytesLayer, CountedBody};
pub use self::future::ResponseFuture;
pub use self::layer::LimitLayer;
pub use self::outcome::CountIf;
use self::outcome::Settle;
pub use self::plan::{ExtensionPlan, PlanLimiter, Plans, SelectPlan};
pub use self::service::Limit;
pub use self::stream::{Refused, StreamLimit};
pub use self::usage::{Finished, Usage};
use self::usage::{Meter, SettleUsage};
pub(crate) use self::warn::MissingKeyWarning;

/// What happens to a request whose key cannot be extracted (or is longer than
/// [`LayerBuilder::max_key_len`]).
///
/// The default is [`MissingKey::Reject`] with `400 Bad Request`: a request that cannot be
/// told apart from others is neither limited by accident against someone else's key nor
/// let through unlimited.
///
/// A request refused for a key its client did not send (a header: [`KeyOrigin::Client`])
/// is an ordinary client error: counted in the `missing_key` metric and logged at
/// `debug` (or the level of [`LayerBuilder::missing_key_log_level`]), and answered by the
/// rejection handler's [`on_missing_key`](crate::OnRejection::on_missing_key)
/// (a short text by default; `application/problem+json` with
/// [`ProblemJson`](crate::ProblemJson)). A request refused for a key the server should have provided
/// ([`KeyOrigin::Server`]: a misconfiguration) is logged with a `warn` [`tracing`] event, at
/// most once per 10 s per layer (with how many were refused
/// meanwhile without a line of their own), naming the key extractor and the usual
/// causes: an axum server started without
/// `into_make_service_with_connect_info::<SocketAddr>()` (no peer address for
/// [`PeerIp`](crate::key::PeerIp)), or an authentication layer (or a tonic interceptor
/// added with `with_interceptor`) that runs inside the limit instead of before it, so the
/// request extensions do not yet hold what [`ExtensionKey`](crate::key::ExtensionKey)
/// reads. Each one is also counted in the [metrics](crate::guide::metrics).
///
/// With the `serde` feature it reads as a rule file writes it: `"allow"`,
/// `{ reject = 400 }` (an HTTP error status) or `{ key = "anonymous" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(
        try_from = "crate::config::MissingKeyFile",
        into = "crate::config::MissingKeyFile"
    )
)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with this status (and a short text body; for a gRPC call with the `grpc`
    /// feature, the matching gRPC status) without calling the inner service.
    Reject(StatusCode),
    /// Let the request through without limiting it.
    Allow,
    /// Limit the request under this key instead (all such requests share it). The key
    /// is used as it is, untagged: a constant without `:` (`anonymous`) never equals a
    /// key of a built-in extractor, which all start with a tag (see
    /// [`key`](crate::key#tags)).
    Key(Cow<'static, str>),
}

impl Default for MissingKey {
    fn default() -> Self {
        Self::Reject(StatusCode::BAD_REQUEST)
    }
}

/// Everything the service and its futures share, built once per layer.
pub(crate) struct Shared<L, K, C, R> {
    /// The layer's name (the builder's [`name`](LayerBuilder::name)), for the admin
    /// feature.
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) name: String,
    pub(crate) limiter: L,
    pub(crate) key: K,
    pub(crate) cost: C,
    pub(crate) rejection: R,
    /// One per policy of the limiter, in the order of [`Limiter::policies`].
    pub(crate) headers: Box<[HeaderParts]>,
    pub(crate) options: Options,
    pub(crate) metrics: LayerMetrics,
    /// The requests waiting for their turn in this process, by key (a layer that
    /// waits: [`LayerBuilder::wait`]).
    pub(crate) waiters: std::sync::Mutex<std::collections::HashMap<Box<[u8]>, u32>>,
    /// The keys each policy refused most lately (see [`LimitLayer::denied`]).
    pub(crate) offenders: Box<[crate::denied::Offenders]>,
    /// Rate-limits the warning about requests refused for a missing key.
    pub(crate) missing_warning: MissingKeyWarning,
}

/// The most requests of one key that wait for their turn at once in one process (a
/// layer that waits: [`LayerBuilder::wait`]); more are refused at once.
pub(crate) const MAX_WAITERS: u32 = 64;

/// The longest key accepted by default, in bytes.
const DEFAULT_MAX_KEY_LEN: usize = 256;

/// Which requests a layer lets through without checking or counting them: see
/// [`LayerBuilder::exempt`]. Any of its predicates saying yes exempts a request.
#[derive(Clone, Default)]
pub(crate) struct Exempt(Vec<Arc<Predicate>>);

/// One of [`Exempt`]'s predicates.
type Predicate = dyn Fn(&http::request::Parts) -> bool + Send + Sync;

impl Exempt {
    /// Adds a predicate.
    pub(crate) fn or(
        mut self,
        predicate: impl Fn(&http::request::Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.0.push(Arc::new(predicate));
        self
    }

    /// Whether the request whose head is `parts` is exempt.
    pub(crate) fn test(&self, parts: &http::request::Parts) -> bool {
        self.0.iter().any(|predicate| predicate(parts))
    }
}

impl std::fmt::Debug for Exempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Exempt({} predicates)", self.0.len())
    }
}

/// The fraction of the limit a request's class may use ([`LayerBuilder::priority`]).
#[derive(Clone)]
pub(crate) struct Classes(pub(crate) Arc<dyn Fn(&http::request::Parts) -> f64 + Send + Sync>);

impl std::fmt::Debug for Classes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Classes")
    }
}

/// The plain settings of a layer, shared by [`LayerBuilder`] and the service.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) exempt: Exempt,
    pub(crate) admitted_headers: bool,
    pub(crate) decision_extension: bool,
    pub(crate) shadow: bool,
    /// How long a refused request may wait for its turn ([`LayerBuilder::wait`]).
    pub(crate) wait: Option<std::time::Duration>,
    pub(crate) missing_key: MissingKey,
    /// The level of the event logged for a missing key that is no misconfiguration.
    pub(crate) missing_key_level: tracing::Level,
    pub(crate) max_key_len: usize,
    pub(crate) count_if: Option<CountIf>,
    pub(crate) usage: Option<Usage>,
    /// The priority classes ([`LayerBuilder::priority`]).
    pub(crate) priority: Option<Classes>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            exempt: Exempt::default(),
            admitted_headers: true,
            decision_extension: true,
            shadow: false,
            wait: None,
            missing_key: MissingKey::default(),
            missing_key_level: tracing::Level::DEBUG,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            count_if: None,
            usage: None,
            priority: None,
        }
    }
}

/// Logs a request without a usable key that is no misconfiguration at `level` (the
/// layer's [`missing_key_log_level`](LayerBuilder::missing_key_log_level)).
pub(crate) fn log_missing_key(
    level: tracing::Level,
    policy: &str,
    too_long: bool,
    origin: KeyOrigin,
) {
    // (tracing's macros take a level known when compiled.)
    match level {
        tracing::Level::ERROR => {
            tracing::error!(policy, too_long, ?origin, "rate-limit key missing")
        }
        tracing::Level::WARN => tracing::warn!(policy, too_long, ?origin, "rate-limit key missing"),
        tracing::Level::INFO => tracing::info!(policy, too_long, ?origin, "rate-limit key missing"),
        tracing::Level::DEBUG => {
            tracing::debug!(policy, too_long, ?origin, "rate-limit key missing")
        }
        tracing::Level::TRACE => {
            tracing::trace!(policy, too_long, ?origin, "rate-limit key missing")
        }
    }
}

impl<L: Limiter, K, C, R> Shared<L, K, C, R> {
    /// Checks `cost` units of `key` under the policy at `policy` for the request whose
    /// head is `parts`: of its priority class, when the layer has classes.
    pub(crate) fn check(
        &self,
        policy: usize,
        key: &[u8],
        cost: std::num::NonZeroU32,
        parts: &http::request::Parts,
    ) -> DecisionFuture {
        match &self.options.priority {
            Some(classes) => self
                .limiter
                .check_priority(policy, key, cost, (classes.0)(parts)),
            None => self.limiter.check_policy(policy, key, cost),
        }
    }

    /// Logs a request without a usable key: at `warn`, rate-limited, when the layer
    /// refuses it and the server should have provided the key ([`KeyOrigin::Server`]:
    /// a misconfiguration); at `debug` when a client did not send it (an ordinary
    /// client error) or the layer was told to let it through or use another key.
    fn missing_key(&self, policy: usize, too_long: bool, origin: KeyOrigin) {
        let name = self.limiter.policies()[policy].name();
        let refused = matches!(self.options.missing_key, MissingKey::Reject(_));
        if !refused || origin == KeyOrigin::Client {
            log_missing_key(self.options.missing_key_level, name, too_long, origin);
            return;
        }
        let Some(suppressed) = self.missing_warning.due() else {
            return;
        };
        let extractor = self.missing_warning.extractor();
        // A shadow layer serves the request anyway, but says what it would do.
        let refused = !self.options.shadow;
        if too_long {
            tracing::warn!(
                policy = name,
                extractor,
                max_key_len = self.options.max_key_len,
                suppressed,
                refused,
                "rate-limit key too long: it is longer than `max_key_len`; raise \
                 it, or key on something shorter (later refusals for a missing key within \
                 the next 10 s are counted, not logged)"
            );
        } else {
            tracing::warn!(
                policy = name,
                extractor,
                suppressed,
                refused,
                "no rate-limit key: the key extractor found nothing in the request. \
                 Likely causes: an axum server started without \
                 `into_make_service_with_connect_info::<SocketAddr>()` (no peer address \
                 for PeerIp); an authentication layer that runs inside this limit \
                 instead of before it (a `.layer()` added after the limit's runs before \
                 it), so the request extensions do not hold the user yet; with tonic, an interceptor added \
                 with `with_interceptor(service, auth)`, which runs after every server \
                 layer (use `InterceptorLayer` before the limit). Later refusals within \
                 the next 10 s are counted, not logged"
            );
        }
    }
}

/// The part of [`Shared`] a response future needs, without its type parameters. `policy`
/// is an index into the limiter's policies.
pub(crate) trait Respond: SettleUsage {
    /// The full rejection response (handler's response plus headers); the refused
    /// request's key is counted among the layer's [offenders](crate::LimitLayer::denied).
    fn reject(
        &self,
        policy: usize,
        request: &http::request::Parts,
        decision: &Decision,
    ) -> Response<Bytes>;
    /// The rate-limit headers of an admitted response, built before the inner service
    /// runs (`None` when the layer adds none to admitted responses).
    fn admitted_headers(&self, policy: usize, decision: &Decision) -> Option<Ready>;
    /// Records a decision in the metrics and the trace.
    fn record(&self, policy: usize, decision: &Decision);
    /// Whether the layer only observes (shadow mode).
    fn is_shadow(&self) -> bool;
    /// How long a refused request may wait for its turn, if the layer lets it
    /// ([`LayerBuilder::wait`]; never a shadow layer's).
    fn wait(&self) -> Option<std::time::Duration>;
    /// The request's check again, after a wait: its key, cost and policy as in `call`
    /// (`None` when it has no key now, or costs nothing).
    fn recheck(&self, policy: usize, request: &http::request::Parts) -> Option<DecisionFuture>;
    /// Takes one of the request's key's [`MAX_WAITERS`] places to wait in this process:
    /// its key, or `None` when they are all taken (the request is refused at once).
    fn enter(&self, request: &http::request::Parts) -> Option<Box<[u8]>>;
    /// Gives back the place `enter` took for `key`.
    fn leave(&self, key: &[u8]);
    /// Prepares an admitted request for the inner service: its [`Decision`] goes into
    /// the request extensions unless the layer was told not to.
    fn admit(&self, extensions: &mut http::Extensions, decision: Decision);
    /// Whether admitted requests are settled after their response: refunded by their
    /// outcome ([`CountIf`]), or settled to their usage ([`Usage`]).
    fn settles(&self) -> bool;
    /// After an admitted request's response: gives its units back if the response does
    /// not count; otherwise hands `settle` back, with a meter for the response body
    /// when the layer settles to usage.
    fn settle(
        self: Arc<Self>,
        status: http::StatusCode,
        headers: &http::HeaderMap,
        settle: Settle,
    ) -> Option<Box<Meter>>;
}

impl<L, K, C, R> Respond for Shared<L, K, C, R>
where
    L: Limiter,
    K: KeyExtractor,
    C: crate::cost::Cost,
    R: OnRejection,
{
    fn reject(
        &self,
        policy: usize,
        request: &http::request::Parts,
        decision: &Decision,
    ) -> Response<Bytes> {
        // (The key again, from the request: a refusal's slow path, so that an admitted
        // request never carries its key.)
        if let (Some(offenders), Some(key)) =
            (self.offenders.get(policy), self.key.extract(request))
        {
            offenders.add(&key, std::time::Instant::now());
        }
        let mut response = self.rejection.on_rejection(&Rejection {
            decision,
            policy: &self.limiter.policies()[policy],
            method: &request.method,
            uri: &request.uri,
            headers: &request.headers,
        });
        self.headers[policy].apply(response.headers_mut(), decision);
        response
    }

    fn admitted_headers(&self, policy: usize, decision: &Decision) -> Option<Ready> {
        self.options
            .admitted_headers
            .then(|| self.headers[policy].ready(decision))
    }

    fn record(&self, policy: usize, decision: &Decision) {
        self.metrics.decision(policy, decision, self.options.shadow);
        let name = self.limiter.policies()[policy].name();
        let shadow = self.options.shadow;
        let outcome = match (decision.is_admitted(), shadow) {
            (true, _) => "admitted",
            (false, false) => "rejected",
            (false, true) => "shadow_rejected",
        };
        // The limit that refused: a set's member, else the policy itself.
        let rejected_by = (!decision.is_admitted()).then(|| {
            let members = self.limiter.members(policy);
            decision
                .rejected_by
                .and_then(|i| members.get(usize::from(i)))
                .map_or(name, |member| member.name())
        });
        let source = decision.source.label();
        // The caller's span, where it declares the fields (see `guide::operations`).
        let span = tracing::Span::current();
        if !span.is_disabled() {
            span.record("rate_limit.decision", outcome);
            span.record("rate_limit.policy", name);
            span.record("rate_limit.source", source);
            span.record("rate_limit.shadow", shadow);
            if let Some(by) = rejected_by {
                span.record("rate_limit.rejected_by", by);
            }
        }
        if decision.is_admitted() {
            tracing::trace!(
                rate_limit.decision = outcome,
                rate_limit.policy = name,
                rate_limit.source = source,
                rate_limit.shadow = shadow,
                state = ?decision.state,
                remaining = decision.remaining,
                "request admitted"
            );
        } else if shadow {
            tracing::info!(
                rate_limit.decision = outcome,
                rate_limit.policy = name,
                rate_limit.rejected_by = rejected_by,
                rate_limit.source = source,
                rate_limit.shadow = shadow,
                state = ?decision.state,
                retry_after = ?decision.retry_after,
                "shadow mode: request over the limit, served anyway"
            );
        } else {
            tracing::debug!(
                rate_limit.decision = outcome,
                rate_limit.policy = name,
                rate_limit.rejected_by = rejected_by,
                rate_limit.source = source,
                rate_limit.shadow = shadow,
                state = ?decision.state,
                retry_after = ?decision.retry_after,
                "request rejected by the rate limit"
            );
        }
    }

    fn is_shadow(&self) -> bool {
        self.options.shadow
    }

    fn wait(&self) -> Option<std::time::Duration> {
        self.options.wait.filter(|_| !self.options.shadow)
    }

    fn enter(&self, request: &http::request::Parts) -> Option<Box<[u8]>> {
        let key = self.key.extract(request)?;
        let mut waiters = self
            .waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = waiters.entry(Box::from(&*key)).or_insert(0);
        if *count >= MAX_WAITERS {
            return None;
        }
        *count += 1;
        Some(Box::from(&*key))
    }

    fn leave(&self, key: &[u8]) {
        let mut waiters = self
            .waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = waiters.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                waiters.remove(key);
            }
        }
    }

    fn recheck(&self, policy: usize, request: &http::request::Parts) -> Option<DecisionFuture> {
        let cost = std::num::NonZeroU32::new(self.cost.cost(request))?;
        let key = self.key.extract(request)?;
        (key.len() <= self.options.max_key_len).then(|| self.check(policy, &key, cost, request))
    }

    fn admit(&self, extensions: &mut http::Extensions, decision: Decision) {
        if !self.options.decision_extension {
            return;
        }
        // A single layer stores its decision alone (moved, not copied); stacked layers
        // also list them all.
        if let Some(outer) = extensions.insert(decision) {
            let Some(decision) = extensions.get::<Decision>().cloned() else {
                return;
            };
            match extensions.get_mut::<Decisions>() {
                Some(all) => all.0.push(decision),
                None => {
                    extensions.insert(Decisions(vec![outer, decision]));
                }
            }
        }
    }

    fn settles(&self) -> bool {
        (self.options.count_if.is_some() && !self.options.shadow) || self.options.usage.is_some()
    }

    fn settle(
        self: Arc<Self>,
        status: http::StatusCode,
        headers: &http::HeaderMap,
        settle: Settle,
    ) -> Option<Box<Meter>> {
        match &self.options.count_if {
            Some(count_if) if !self.options.shadow && !count_if.counts(status, headers) => {
                let refund = self
                    .limiter
                    .refund_policy(settle.policy, &settle.key, settle.cost);
                in_background(refund);
                None
            }
            _ => {
                let usage = self.options.usage.clone()?;
                Some(Box::new(Meter::new(self, settle, usage, headers)))
            }
        }
    }
}

impl<L, K, C, R> SettleUsage for Shared<L, K, C, R>
where
    L: Limiter,
    K: Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: OnRejection,
{
    fn settle_usage(&self, settle: &Settle, delta: i64) {
        if delta == 0 {
            return;
        }
        crate::metrics::settled(self.limiter.policies()[settle.policy].name(), delta);
        in_background(
            self.limiter
                .settle_policy(settle.policy, &settle.key, delta),
        );
    }
}

/// Runs a check made after the response (a refund, a settlement): at once in process,
/// on Redis in the background (one round trip), so the response does not wait.
fn in_background(check: Option<crate::limiter::DecisionFuture>) {
    let Some(mut check) = check else {
        return;
    };
    if check.take_ready().is_some() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(check);
    }
}
