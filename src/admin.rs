//! The admin router (feature `admin`); its docs are on [`AdminRouter`].

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::future::BoxFuture;
use http::request::Parts;
use serde_json::{json, Map, Value};

use crate::blocked::Blocked;
use crate::decision::Decision;
use crate::decision::Policy;
use crate::denied::Denied;
use crate::error::AdminError;
use crate::key::{Key, KeyExtractor};
use crate::limit::LimitLayer;
use crate::limiter::Limiter;
use crate::response::HeaderParts;

/// The answer of an admin action: each key's decision, under the policy named, and the
/// policies it acted under.
type Answered = Result<(Vec<(Key<'static>, String, Decision)>, Vec<String>), AdminError>;

/// An admin action on a client's value.
#[derive(Debug, Clone)]
enum Action {
    Peek(NonZeroU32),
    Reset,
    Block(Duration),
    Unblock,
    /// The units, and the policy named (`?policy=`).
    Refund(NonZeroU32, Option<String>),
}

/// The answer of a listing of blocked keys.
type Listed = Result<Vec<Blocked>, AdminError>;

/// The default of `GET /blocked`'s `max`.
const DEFAULT_LISTED: u64 = 100;
/// The largest `max` of `GET /blocked`.
const MAX_LISTED: u64 = 1_000;

/// One layer, its types erased.
trait Limit: Send + Sync {
    fn policies(&self) -> Vec<String>;
    fn act(&self, value: String, action: Action) -> Pin<Box<dyn Future<Output = Answered> + Send>>;
    fn blocked(&self, max: usize) -> Pin<Box<dyn Future<Output = Listed> + Send>>;
    fn denied(&self, max: usize) -> Vec<Denied>;
    /// Where the request's own key stands under each of the layer's limits (the policy
    /// the request selects: a set's members), spending nothing; `None` without a key.
    fn usage(&self, request: &Parts) -> Option<BoxFuture<'static, Vec<(Policy, Decision)>>>;
}

impl<L, K, C, R> Limit for LimitLayer<L, K, C, R>
where
    L: Limiter,
    K: KeyExtractor,
    C: Send + Sync + 'static,
    R: Send + Sync + 'static,
{
    fn policies(&self) -> Vec<String> {
        self.policy_names()
    }

    fn act(&self, value: String, action: Action) -> Pin<Box<dyn Future<Output = Answered> + Send>> {
        let layer = self.clone();
        Box::pin(async move {
            let policies = layer.policy_names();
            let default = policies[0].clone();
            let under = |answers: Vec<(Key<'static>, Decision)>, policy: &str| {
                let named = answers.into_iter();
                let named = named.map(|(key, decision)| (key, policy.to_owned(), decision));
                named.collect::<Vec<_>>()
            };
            let value = value.as_bytes();
            let (answers, touched) = match action {
                Action::Peek(cost) => {
                    let mut answers = Vec::new();
                    for (index, policy) in policies.iter().enumerate() {
                        let answered = layer.peek_value_at(index, value, cost).await?;
                        answers.extend(under(answered, policy));
                    }
                    (answers, policies)
                }
                Action::Refund(units, policy) => {
                    let named = match policy {
                        Some(policy) => policy,
                        None if policies.len() == 1 => default,
                        None => {
                            return Err(AdminError::Policy {
                                given: None,
                                policies,
                            })
                        }
                    };
                    let answered = layer.refund_value_in(&named, value, units).await?;
                    (under(answered, &named), vec![named])
                }
                Action::Reset => (under(layer.reset_value(value).await?, &default), policies),
                Action::Block(duration) => {
                    let answered = layer.block_value(value, duration).await?;
                    (under(answered, &default), policies)
                }
                Action::Unblock => {
                    let answered = layer.unblock_value(value).await?;
                    (under(answered, &default), policies)
                }
            };
            Ok((answers, touched))
        })
    }

    fn blocked(&self, max: usize) -> Pin<Box<dyn Future<Output = Listed> + Send>> {
        let layer = self.clone();
        Box::pin(async move { layer.blocked(max).await })
    }

    fn denied(&self, max: usize) -> Vec<Denied> {
        LimitLayer::denied(self, max)
    }

    fn usage(&self, request: &Parts) -> Option<BoxFuture<'static, Vec<(Policy, Decision)>>> {
        let key = self.key_of(request)?;
        let limiter = self.limiter();
        let policy = if limiter.policies().len() > 1 {
            limiter.select(request)
        } else {
            0
        };
        limiter.peek_limits(policy, &key, NonZeroU32::MIN)
    }
}

/// An admin surface to mount (feature `admin`): an axum [`Router`] with JSON endpoints
/// that peek, reset, block, unblock and refund a client by the value its requests carry (an API
/// key, a user id, an address), on every layer added to it, through each layer's own
/// extractor ([`LimitLayer::peek_value`] and the others), and list what is blocked
/// ([`LimitLayer::blocked`]).
///
/// It has no authentication of its own: mount it behind yours.
///
/// | method and path | does |
/// |---|---|
/// | `GET /` | the limits: `{"limits":[{"name":…,"policies":[…]}]}` |
/// | `GET /{limit}/{value}?cost=N` | where the client stands: what a check of `cost` (default 1) would answer, spending nothing |
/// | `POST /{limit}/{value}/reset` | forgets the client's count and lifts its block |
/// | `POST /{limit}/{value}/block?seconds=N` | refuses the client for `N` seconds, whatever its limit says |
/// | `POST /{limit}/{value}/unblock` | lifts the client's block, keeping its count |
/// | `POST /{limit}/{value}/refund?units=N&policy=P` | gives `N` units back (default 1) under policy `P` (needed when the layer has several: a [`Plans`](crate::limit::Plans) layer's `api.pro`) |
/// | `GET /blocked?limit=NAME&max=N` | what is blocked now (by a block or a lockout), over every limit or the one named, soonest end first, at most `N` (default 100, at most 1000) |
/// | `GET /denied?limit=NAME&max=N` | the keys refused most in the last 5 to 10 minutes, by this instance, over every limit or the one named, most first, at most `N` (default 100, at most 1000) |
///
/// A layer is named by its builder's [`name`](crate::LayerBuilder::name) (a
/// [`Plans`](crate::limit::Plans) layer `api`, whatever the plan of a value). Each
/// answer is `{"limit":…,"value":…,"policies":[…],"keys":[…]}`: `policies` the policies
/// acted under (every plan of a plan layer: a key's plan is not known from its value;
/// the one named for a refund), `keys` one entry per key the layer counts the value
/// under (an `.or` of extractors may count it under two), each with `key`, `policy`,
/// `state`, `admitted`, `limit`, `remaining`, `reset_ms`, `retry_after_ms` and
/// `source`. A peek answers under each policy (a plan layer: one entry per key per
/// plan, each `policy` its plan's); a reset, block or unblock acts under each and
/// answers under the first. A value the layer never counts is `400` with
/// `{"error":…}` (a wrong value never looks like a success on another key), as is a
/// refund without `policy` on a layer of several, or a `policy` the layer does not
/// have; an unknown limit `404`; an action the layer's limiter cannot take `501`.
///
/// `GET /blocked` answers `{"blocked":[…]}`, one entry per blocked key, each with
/// `limit` (the name to give the other endpoints), `policy` (the limit that refuses the
/// key: a plan's `api.free`), `key`, `value` (the client's value, to give `POST
/// /{limit}/{value}/reset`; `null` when the layer's extractor cannot name it), `until_ms`
/// (Unix milliseconds) and `remaining_ms`. It reads the small list of blocked keys each
/// limit keeps (see [`Limiter::blocked`]), never the keyspace; on Redis that list may lag
/// a block by a moment (see [Listing what is
/// blocked](crate::guide::operations#listing-what-is-blocked)), and a Redis that does not
/// answer is `503`.
///
/// `GET /denied` answers `{"denied":[…]}`, the keys this instance refused most lately
/// ([`LimitLayer::denied`]), most first, each with `limit`, `policy`, `key`, `value` (as
/// in `/blocked`), `count` (refusals counted, an upper bound), `error` (how far `count`
/// may be above the truth) and `since_ms` (how long the counting has run).
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use tower_redis_ratelimit::{
///     key::HeaderKey, AdminRouter, Backend, LimitLayer, TokenBucketConfig,
/// };
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let backend = Backend::in_process();
/// let config = TokenBucketConfig::new(10, Duration::from_secs(1), 20);
/// let api = LimitLayer::builder(&backend, config)
///     .name("api")
///     .key(HeaderKey::from_static("x-api-key"))
///     .build()?;
/// let admin = AdminRouter::new().limit(&api).into_router();
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(api)
///     // Behind your own authentication, outside the limit.
///     .nest("/admin/ratelimit", admin);
/// # let _ = app; Ok(()) }
/// ```
///
/// Add layers with [`limit`](Self::limit), then mount
/// [`into_router`](Self::into_router) behind your authentication.
#[derive(Default)]
pub struct AdminRouter {
    limits: BTreeMap<String, Arc<dyn Limit>>,
}

impl std::fmt::Debug for AdminRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminRouter")
            .field("limits", &self.limits.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl AdminRouter {
    /// An admin surface without limits yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `layer`, under its name (the builder's
    /// [`name`](crate::LayerBuilder::name); a later layer of the same name replaces an
    /// earlier one).
    #[must_use]
    pub fn limit<L, K, C, R>(mut self, layer: &LimitLayer<L, K, C, R>) -> Self
    where
        L: Limiter,
        K: KeyExtractor,
        C: Send + Sync + 'static,
        R: Send + Sync + 'static,
    {
        self.limits
            .insert(layer.name().to_owned(), Arc::new(layer.clone()));
        self
    }

    /// The caller's usage route (feature `admin`), for your customers behind your own
    /// authentication: `GET /` answers where the request's own key stands under every
    /// limit of every layer added here, as GitHub's `GET /rate_limit` does, from the
    /// numbers the limits enforce, spending nothing (and never limited itself: mount it
    /// outside the layers). Each layer finds the key with its own extractor and picks
    /// the request's plan as its requests do; a set answers each of its limits.
    ///
    /// It answers `{"limits":[{name, algorithm, limit, used, remaining, reset_s,
    /// window_s}]}` (`remaining` what is left now, `used` the rest of `limit`; `reset_s`
    /// when the limit is fully available again, in seconds rounded up) and the same
    /// `RateLimit-Policy` and `RateLimit` headers the layers send, one item per limit. A
    /// layer that finds no key in the request is left out. All the layers' peeks are
    /// sent together: one Redis call per layer (a set's or a plan's is one), pipelined
    /// on the backend's connection.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{routing::get, Router};
    /// use tower_redis_ratelimit::{key::HeaderKey, AdminRouter, Backend, LimitLayer, PeriodConfig};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let config = PeriodConfig::new(5_000, Duration::from_secs(3_600));
    /// let api = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     .build()?;
    /// let limits = AdminRouter::new().limit(&api);
    /// let app: Router = Router::new()
    ///     .route("/search", get(|| async { "results" }))
    ///     .layer(api)
    ///     // Outside the limit: asking is free.
    ///     .nest("/rate_limit", limits.usage_router());
    /// # let _ = app; Ok(()) }
    /// ```
    pub fn usage_router<S: Clone + Send + Sync + 'static>(&self) -> Router<S> {
        let limits: Limits = Arc::new(self.limits.clone());
        Router::new().route("/", get(usage)).with_state(limits)
    }

    /// The axum router of the endpoints (see [`AdminRouter`]).
    pub fn into_router<S: Clone + Send + Sync + 'static>(self) -> Router<S> {
        let limits = Arc::new(self.limits);
        Router::new()
            .route("/", get(list))
            .route("/blocked", get(blocked))
            .route("/denied", get(denied))
            .route("/{limit}/{value}", get(peek))
            .route("/{limit}/{value}/reset", post(reset))
            .route("/{limit}/{value}/block", post(block))
            .route("/{limit}/{value}/unblock", post(unblock))
            .route("/{limit}/{value}/refund", post(refund))
            .with_state(limits)
    }
}

type Limits = Arc<BTreeMap<String, Arc<dyn Limit>>>;

async fn list(State(limits): State<Limits>) -> Response {
    let limits: Vec<Value> = limits
        .iter()
        .map(|(name, limit)| json!({ "name": name, "policies": limit.policies() }))
        .collect();
    (StatusCode::OK, axum::Json(json!({ "limits": limits }))).into_response()
}

async fn blocked(State(limits): State<Limits>, RawQuery(query): RawQuery) -> Response {
    let Chosen {
        max,
        limits: chosen,
        named,
    } = match listing(&limits, query.as_deref()) {
        Ok(chosen) => chosen,
        Err((status, message)) => return error(status, &message),
    };
    let listings = chosen.iter().map(|(_, limit)| limit.blocked(max));
    let listed = futures_util::future::join_all(listings).await;
    let mut entries = Vec::new();
    for ((name, _), listed) in chosen.into_iter().zip(listed) {
        match listed {
            Ok(listed) => entries.extend(listed.into_iter().map(|entry| (name, entry))),
            // A limiter of your own that cannot list: left out of a listing of all.
            Err(AdminError::Unsupported { .. }) if !named => {}
            Err(failure @ AdminError::Unsupported { .. }) => {
                return error(StatusCode::NOT_IMPLEMENTED, &failure.to_string())
            }
            Err(failure) => return error(StatusCode::SERVICE_UNAVAILABLE, &failure.to_string()),
        }
    }
    entries.sort_by(|(a_name, a), (b_name, b)| {
        (a.until, a_name, a.key.as_bytes()).cmp(&(b.until, b_name, b.key.as_bytes()))
    });
    entries.truncate(max);
    let now = SystemTime::now();
    let blocked: Vec<Value> = entries
        .iter()
        .map(|(name, entry)| {
            let mut listed = listed_key(name, &entry.limit, &entry.key, entry.value.as_deref());
            let until = entry.until.duration_since(UNIX_EPOCH).unwrap_or_default();
            let remaining = entry.until.duration_since(now).unwrap_or_default();
            listed.insert("until_ms".into(), millis(until).into());
            listed.insert("remaining_ms".into(), millis(remaining).into());
            Value::Object(listed)
        })
        .collect();
    (StatusCode::OK, axum::Json(json!({ "blocked": blocked }))).into_response()
}

/// What a listing's query asks for.
struct Chosen<'l> {
    /// `max` (default [`DEFAULT_LISTED`], at most [`MAX_LISTED`]).
    max: usize,
    /// The limit named by `limit`, or every one.
    limits: Vec<(&'l String, &'l Arc<dyn Limit>)>,
    /// Whether `limit` named one.
    named: bool,
}

/// A listing's query read: `max` and `limit`, or the error to answer.
fn listing<'l>(
    limits: &'l Limits,
    query: Option<&str>,
) -> Result<Chosen<'l>, (StatusCode, String)> {
    let max = match number(query, "max") {
        Ok(None) => DEFAULT_LISTED,
        Ok(Some(max @ 1..=MAX_LISTED)) => max,
        Ok(Some(_)) => {
            let message = format!("`max` must be between 1 and {MAX_LISTED}");
            return Err((StatusCode::BAD_REQUEST, message));
        }
        Err(message) => return Err((StatusCode::BAD_REQUEST, message)),
    };
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let named = text(query, "limit");
    let chosen = match &named {
        Some(name) => match limits.get_key_value(name) {
            Some(found) => vec![found],
            None => return Err((StatusCode::NOT_FOUND, format!("no limit named `{name}`"))),
        },
        None => limits.iter().collect(),
    };
    Ok(Chosen {
        max,
        limits: chosen,
        named: named.is_some(),
    })
}

async fn denied(State(limits): State<Limits>, RawQuery(query): RawQuery) -> Response {
    let Chosen {
        max,
        limits: chosen,
        ..
    } = match listing(&limits, query.as_deref()) {
        Ok(chosen) => chosen,
        Err((status, message)) => return error(status, &message),
    };
    let mut entries: Vec<(&String, Denied)> = chosen
        .iter()
        .flat_map(|(name, limit)| {
            limit
                .denied(max)
                .into_iter()
                .map(move |entry| (*name, entry))
        })
        .collect();
    entries.sort_by(|(a_name, a), (b_name, b)| {
        (b.count, a_name, a.key.as_bytes()).cmp(&(a.count, b_name, b.key.as_bytes()))
    });
    entries.truncate(max);
    let denied: Vec<Value> = entries
        .iter()
        .map(|(name, entry)| {
            let mut listed = listed_key(name, &entry.limit, &entry.key, entry.value.as_deref());
            listed.insert("count".into(), entry.count.into());
            listed.insert("error".into(), entry.error.into());
            listed.insert("since_ms".into(), millis(entry.since).into());
            Value::Object(listed)
        })
        .collect();
    (StatusCode::OK, axum::Json(json!({ "denied": denied }))).into_response()
}

async fn usage(State(limits): State<Limits>, request: axum::extract::Request) -> Response {
    let (parts, _body) = request.into_parts();
    let peeks = limits.values().filter_map(|limit| limit.usage(&parts));
    // Started together: one Redis call per layer, pipelined.
    let answers = futures_util::future::join_all(peeks).await;
    let secs = crate::response::ceil_secs;
    let mut entries = Vec::new();
    let (mut policies, mut ratelimits) = (Vec::new(), Vec::<u8>::new());
    for (policy, decision) in answers.into_iter().flatten() {
        // A peek of one unit: an admitting limit says what that unit would leave.
        let remaining = if decision.is_admitted() {
            decision.remaining.saturating_add(1).min(decision.limit)
        } else {
            decision.remaining
        };
        let now = Decision {
            remaining,
            ..decision
        };
        let parts = HeaderParts::new(&policy);
        policies.push(parts.policy_for(&now));
        if !ratelimits.is_empty() {
            ratelimits.extend_from_slice(b", ");
        }
        parts.write_ratelimit_value(&now, &mut ratelimits);
        entries.push(json!({
            "name": policy.name(),
            "algorithm": policy.algorithm(),
            "limit": now.limit,
            "used": now.limit.saturating_sub(remaining),
            "remaining": remaining,
            "reset_s": secs(now.reset),
            "window_s": secs(policy.window()).max(1),
        }));
    }
    let mut response = (StatusCode::OK, axum::Json(json!({ "limits": entries }))).into_response();
    let headers = response.headers_mut();
    let joined = policies
        .iter()
        .map(|v| v.as_bytes())
        .collect::<Vec<_>>()
        .join(&b", "[..]);
    if let Ok(value) = http::HeaderValue::from_bytes(&joined) {
        if !joined.is_empty() {
            headers.insert(crate::response::RATELIMIT_POLICY, value);
        }
    }
    if let Ok(value) = http::HeaderValue::from_bytes(&ratelimits) {
        if !ratelimits.is_empty() {
            headers.insert(crate::response::RATELIMIT, value);
        }
    }
    response
}

async fn peek(
    State(limits): State<Limits>,
    Path((limit, value)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    match units(query.as_deref(), "cost") {
        Ok(cost) => act(&limits, limit, value, Action::Peek(cost)).await,
        Err(message) => error(StatusCode::BAD_REQUEST, &message),
    }
}

async fn reset(
    State(limits): State<Limits>,
    Path((limit, value)): Path<(String, String)>,
) -> Response {
    act(&limits, limit, value, Action::Reset).await
}

async fn unblock(
    State(limits): State<Limits>,
    Path((limit, value)): Path<(String, String)>,
) -> Response {
    act(&limits, limit, value, Action::Unblock).await
}

async fn block(
    State(limits): State<Limits>,
    Path((limit, value)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    match number(query.as_deref(), "seconds") {
        Ok(Some(seconds)) if seconds > 0 => {
            let duration = Duration::from_secs(seconds);
            act(&limits, limit, value, Action::Block(duration)).await
        }
        Ok(_) => error(
            StatusCode::BAD_REQUEST,
            "a block needs `seconds`, a whole number above 0",
        ),
        Err(message) => error(StatusCode::BAD_REQUEST, &message),
    }
}

async fn refund(
    State(limits): State<Limits>,
    Path((limit, value)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let policy = text(query.as_deref(), "policy");
    match units(query.as_deref(), "units") {
        Ok(units) => act(&limits, limit, value, Action::Refund(units, policy)).await,
        Err(message) => error(StatusCode::BAD_REQUEST, &message),
    }
}

/// Runs `action` on `value` in the limit named `limit`.
async fn act(limits: &Limits, limit: String, value: String, action: Action) -> Response {
    let Some(found) = limits.get(&limit) else {
        return error(StatusCode::NOT_FOUND, &format!("no limit named `{limit}`"));
    };
    match found.act(value.clone(), action).await {
        Ok((decisions, policies)) => {
            let keys: Vec<Value> = decisions
                .iter()
                .map(|(key, policy, decision)| describe(key, policy, decision))
                .collect();
            let answer =
                json!({ "limit": limit, "value": value, "policies": policies, "keys": keys });
            (StatusCode::OK, axum::Json(answer)).into_response()
        }
        Err(failure @ (AdminError::Key(_) | AdminError::Policy { .. })) => {
            error(StatusCode::BAD_REQUEST, &failure.to_string())
        }
        Err(failure) => error(StatusCode::NOT_IMPLEMENTED, &failure.to_string()),
    }
}

/// A listed key (blocked, or among the most refused) as JSON: the layer that limits it,
/// its policy, the key and the client's value when known; each listing adds its own
/// fields.
fn listed_key(name: &str, policy: &str, key: &[u8], value: Option<&[u8]>) -> Map<String, Value> {
    let mut listed = Map::new();
    listed.insert("limit".into(), name.into());
    listed.insert("policy".into(), policy.into());
    listed.insert("key".into(), String::from_utf8_lossy(key).into());
    let value = value.map(|value| Value::from(String::from_utf8_lossy(value)));
    listed.insert("value".into(), value.unwrap_or(Value::Null));
    listed
}

/// A duration in whole milliseconds, as the JSON answers give them.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One key's decision as JSON.
fn describe(key: &Key<'_>, policy: &str, decision: &Decision) -> Value {
    json!({
        "key": String::from_utf8_lossy(key),
        "policy": policy,
        "state": format!("{:?}", decision.state),
        "admitted": decision.is_admitted(),
        "limit": decision.limit,
        "remaining": decision.remaining,
        "reset_ms": millis(decision.reset),
        "retry_after_ms": decision.retry_after.map(millis),
        "source": format!("{:?}", decision.source),
    })
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// The query parameter `name` as it was sent, if given.
fn raw<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find_map(|(key, value)| (key == name).then_some(value))
}

/// The query parameter `name` as text, percent-decoded (`+` a space), if given.
fn text(query: Option<&str>, name: &str) -> Option<String> {
    let sent = raw(query, name)?.as_bytes();
    let mut bytes = Vec::with_capacity(sent.len());
    let mut rest = sent;
    while let Some((&b, tail)) = rest.split_first() {
        let hex = |d: u8| char::from(d).to_digit(16);
        match (b, tail) {
            (b'%', [high, low, tail @ ..]) if hex(*high).is_some() && hex(*low).is_some() => {
                let value = hex(*high).unwrap_or(0) * 16 + hex(*low).unwrap_or(0);
                bytes.push(u8::try_from(value).unwrap_or(b'?'));
                rest = tail;
            }
            (b'+', _) => {
                bytes.push(b' ');
                rest = tail;
            }
            _ => {
                bytes.push(b);
                rest = tail;
            }
        }
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The query parameter `name` as a whole number, if given.
fn number(query: Option<&str>, name: &str) -> Result<Option<u64>, String> {
    let Some(text) = raw(query, name) else {
        return Ok(None);
    };
    text.parse()
        .map(Some)
        .map_err(|_| format!("`{name}` must be a whole number, not `{text}`"))
}

/// The query parameter `name` as units of at least 1 (default 1).
fn units(query: Option<&str>, name: &str) -> Result<NonZeroU32, String> {
    match number(query, name)? {
        None => Ok(NonZeroU32::MIN),
        Some(n) => u32::try_from(n)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(|| format!("`{name}` must be between 1 and {}", u32::MAX)),
    }
}
