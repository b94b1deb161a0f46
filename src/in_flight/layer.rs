//! [`InFlightLimitLayer`] and its builder, service, response future and body: a slot of
//! the request's key is taken before the inner service is called, and given back when
//! the response body ends, fails or is dropped.

use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::host::{Acquire, Acquired};
use super::{InFlightConfig, InFlightLimiter, Slot};
use crate::backend::{Backend, FailurePolicy};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::key::{GlobalKey, KeyExtractor};
use crate::metrics::LayerMetrics;
use crate::response::{missing_key, DefaultRejection, OnRejection, Rejection};
use crate::service::{LayerBuilder, MissingKey, MissingKeyWarning};

/// A layer that allows at most N requests of one key in flight at once, across every
/// instance sharing the backend's Redis; see the [`in_flight`](super) module.
pub struct InFlightLimitLayer<K = GlobalKey, R = DefaultRejection> {
    shared: Arc<Shared<K, R>>,
}

struct Shared<K, R> {
    limiter: InFlightLimiter,
    key: K,
    rejection: R,
    options: crate::service::Options,
    metrics: LayerMetrics,
    missing_warning: MissingKeyWarning,
}

impl InFlightLimitLayer {
    /// Starts building an in-flight layer on `backend`.
    pub fn builder(backend: &Backend) -> InFlightLayerBuilder {
        InFlightLayerBuilder {
            inner: LayerBuilder::new(backend, InFlightConfig::default()),
        }
    }
}

impl<K, R> InFlightLimitLayer<K, R> {
    /// The limiter every service of this layer asks (a handle for
    /// [`in_flight`](InFlightLimiter::in_flight)).
    pub fn limiter(&self) -> &InFlightLimiter {
        &self.shared.limiter
    }
}

impl<K, R> Clone for InFlightLimitLayer<K, R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, R> fmt::Debug for InFlightLimitLayer<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimitLayer")
            .field("limiter", &self.shared.limiter)
            .field("shadow", &self.shared.options.shadow)
            .finish_non_exhaustive()
    }
}

impl<S, K, R> Layer<S> for InFlightLimitLayer<K, R> {
    type Service = InFlightService<S, K, R>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Builds an [`InFlightLimitLayer`]: the slots and lease, then the key, rejection and
/// failure settings every layer has. Nothing is checked until [`build`](Self::build).
#[must_use = "a builder does nothing until `build` is called"]
pub struct InFlightLayerBuilder<K = GlobalKey, R = DefaultRejection> {
    inner: LayerBuilder<InFlightConfig, K, crate::UnitCost, R>,
}

impl<K, R> fmt::Debug for InFlightLayerBuilder<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLayerBuilder")
            .field("config", &self.inner.algorithm)
            .finish_non_exhaustive()
    }
}

impl<K, R> InFlightLayerBuilder<K, R> {
    /// At most `slots` requests of one key in flight (required, at least 1).
    pub fn slots(mut self, slots: u64) -> Self {
        self.inner.algorithm.slots = slots;
        self
    }

    /// How long a slot on Redis outlives the process holding it (default 10 s); see
    /// [`InFlightConfig::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.inner.algorithm.lease = lease;
        self
    }

    /// The `Retry-After` of a refusal (default 1 s); see
    /// [`InFlightConfig::retry_after`].
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.inner.algorithm.retry_after = retry_after;
        self
    }

    /// The limit's name (required); see [`LayerBuilder::name`].
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.inner = self.inner.name(name);
        self
    }

    /// How requests are told apart (default: one [`GlobalKey`] for all requests).
    pub fn key<K2>(self, key: K2) -> InFlightLayerBuilder<K2, R> {
        InFlightLayerBuilder {
            inner: self.inner.key(key),
        }
    }

    /// The response for refused requests (default: [`DefaultRejection`], a plain 429).
    /// The layer adds `Retry-After`.
    pub fn on_rejection<R2>(self, rejection: R2) -> InFlightLayerBuilder<K, R2> {
        InFlightLayerBuilder {
            inner: self.inner.on_rejection(rejection),
        }
    }

    /// Whether admitted requests carry their [`Decision`] in the request extensions
    /// (default: yes).
    pub fn decision_extension(mut self, enabled: bool) -> Self {
        self.inner = self.inner.decision_extension(enabled);
        self
    }

    /// Shadow mode (default: off): take and hold slots, record refusals, refuse nothing;
    /// see [`LayerBuilder::shadow`].
    pub fn shadow(mut self, enabled: bool) -> Self {
        self.inner = self.inner.shadow(enabled);
        self
    }

    /// What to do when no key can be extracted (default: reject with 400).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.inner = self.inner.on_missing_key(missing_key);
        self
    }

    /// The longest key accepted, in bytes (default: 256).
    pub fn max_key_len(mut self, max_key_len: usize) -> Self {
        self.inner = self.inner.max_key_len(max_key_len);
        self
    }

    /// What this layer answers while Redis is unreachable (default: the backend's).
    pub fn on_redis_failure(mut self, policy: FailurePolicy) -> Self {
        self.inner = self.inner.on_redis_failure(policy);
        self
    }

    /// The fraction of the slots each instance takes in the in-process fallback while
    /// Redis is unreachable (at least one slot); see
    /// [`BackendBuilder::fallback_share`](crate::BackendBuilder::fallback_share).
    pub fn fallback_share(mut self, share: f64) -> Self {
        self.inner = self.inner.fallback_share(share);
        self
    }

    /// Checks every setting and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a missing or invalid name, zero slots, a zero lease or
    /// `retry_after`, a zero maximum key length, or invalid failure settings.
    pub fn build(self) -> Result<InFlightLimitLayer<K, R>, ConfigError>
    where
        K: Send + Sync + 'static,
        R: OnRejection,
    {
        let checked = self.inner.checked()?;
        let limiter = InFlightLimiter::new(&checked.backend, &checked.name, checked.algorithm)?;
        let metrics = LayerMetrics::new(std::slice::from_ref(limiter.policy()));
        Ok(InFlightLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                key: checked.key,
                rejection: checked.rejection,
                options: checked.options,
                metrics,
                missing_warning: MissingKeyWarning::new(std::any::type_name::<K>()),
            }),
        })
    }
}

/// Holds at most N requests of one key in flight; built by [`InFlightLimitLayer`].
/// Readiness is the inner service's.
pub struct InFlightService<S, K, R> {
    inner: S,
    shared: Arc<Shared<K, R>>,
}

impl<S, K, R> InFlightService<S, K, R> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, R> Clone for InFlightService<S, K, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, K, R> fmt::Debug for InFlightService<S, K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightService")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, K, R, ReqBody, ResBody> Service<Request<ReqBody>> for InFlightService<S, K, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<ReqBody>,
    R: OnRejection,
{
    type Response = Response<InFlightBody<ResBody>>;
    type Error = S::Error;
    type Future = InFlightFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let shadow = shared.options.shadow;
        let mut acquire = match shared.key.extract(&req) {
            Some(key) if key.len() <= shared.options.max_key_len => {
                shared.limiter.acquire_raw(&key)
            }
            key => {
                shared.missing_key(key.is_some());
                match &shared.options.missing_key {
                    MissingKey::Reject(status) if !shadow => {
                        return InFlightFuture::done(missing_key(*status, req.headers()));
                    }
                    MissingKey::Reject(_) | MissingKey::Allow => {
                        return InFlightFuture::inner(self.inner.call(req), None);
                    }
                    MissingKey::Key(key) => shared.limiter.acquire_raw(key.as_bytes()),
                }
            }
        };
        if shadow {
            return InFlightFuture::inner(self.inner.call(req), shared.shadow(acquire));
        }
        if let Some(acquired) = acquire.take_ready() {
            let (req, decided) = decide_on(&**shared, req, acquired);
            return match decided {
                Ok(slot) => InFlightFuture::inner(self.inner.call(req), slot.map(Guard::Slot)),
                Err(response) => InFlightFuture::done(response),
            };
        }
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        InFlightFuture {
            state: FutureState::Acquire {
                acquire,
                request: Some(req),
                service: Some(inner),
                decide: Arc::clone(shared) as Arc<dyn Decide>,
            },
        }
    }
}

impl<K: Send + Sync + 'static, R: OnRejection> Shared<K, R> {
    /// Acts on an acquisition: the slot to hold (none when the failure policy admits
    /// without one), with the decision in the request's extensions; or the rejection.
    // Moved once per request; a box would cost an allocation per refusal.
    #[allow(clippy::result_large_err)]
    fn decide(
        &self,
        req: &mut http::request::Parts,
        (decision, held): Acquired,
    ) -> Result<Option<Slot>, Response<Bytes>> {
        self.metrics.decision(0, &decision, false);
        let slots = Arc::clone(self.limiter.slots());
        if !decision.is_admitted() {
            tracing::debug!(
                policy = self.limiter.policy().name(),
                retry_after = ?decision.retry_after,
                source = ?decision.source,
                "request refused by the in-flight limit"
            );
            return Err(self.reject(req, &decision));
        }
        if self.options.decision_extension {
            admit(&mut req.extensions, decision.clone());
        }
        Ok(Slot::from_acquired(slots, (decision, held)).ok())
    }

    fn reject(&self, req: &http::request::Parts, decision: &Decision) -> Response<Bytes> {
        let mut response = self.rejection.on_rejection(&Rejection {
            decision,
            policy: self.limiter.policy(),
            method: &req.method,
            uri: &req.uri,
            headers: &req.headers,
        });
        if let Some(retry) = decision.retry_after {
            let secs = (retry.as_secs() + u64::from(retry.subsec_nanos() > 0)).max(1);
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
        response
    }

    /// A shadow layer's slot: taken in a task of its own, held until the body ends
    /// (the guard's sender dropped), and only recorded.
    fn shadow(self: &Arc<Self>, mut acquire: Acquire) -> Option<Guard> {
        let (done, ended) = tokio::sync::oneshot::channel::<()>();
        let slots = Arc::clone(self.limiter.slots());
        if let Some(acquired) = acquire.take_ready() {
            self.record_shadow(&acquired.0);
            let slot = Slot::from_acquired(slots, acquired).ok()?;
            return Some(Guard::Slot(slot));
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let this = Arc::clone(self);
        runtime.spawn(async move {
            let acquired = acquire.await;
            this.record_shadow(&acquired.0);
            let slot = Slot::from_acquired(slots, acquired);
            let _ = ended.await;
            drop(slot);
        });
        Some(Guard::Shadow(done))
    }

    fn record_shadow(&self, decision: &Decision) {
        self.metrics.decision(0, decision, true);
        if !decision.is_admitted() {
            tracing::info!(
                policy = self.limiter.policy().name(),
                source = ?decision.source,
                "shadow mode: every in-flight slot taken, request served anyway"
            );
        }
    }

    fn missing_key(&self, too_long: bool) {
        self.metrics.missing_key(0);
        let refused = matches!(self.options.missing_key, MissingKey::Reject(_));
        if !refused {
            return;
        }
        if let Some(suppressed) = self.missing_warning.due() {
            tracing::warn!(
                policy = self.limiter.policy().name(),
                extractor = self.missing_warning.extractor(),
                too_long,
                suppressed,
                "no usable in-flight key: the key extractor found nothing in the request \
                 (or a key longer than `max_key_len`)"
            );
        }
    }
}

/// Puts an admitted request's decision into its extensions; stacked layers also list
/// every decision (see [`Decisions`](crate::Decisions)).
fn admit(extensions: &mut http::Extensions, decision: Decision) {
    if let Some(outer) = extensions.insert(decision) {
        let Some(decision) = extensions.get::<Decision>().cloned() else {
            return;
        };
        match extensions.get_mut::<crate::Decisions>() {
            Some(all) => all.0.push(decision),
            None => {
                extensions.insert(crate::Decisions(vec![outer, decision]));
            }
        }
    }
}

/// The part of [`Shared`] the future needs once a round trip answered, without its
/// type parameters.
trait Decide: Send + Sync + 'static {
    #[allow(clippy::result_large_err)]
    fn decide(
        &self,
        req: &mut http::request::Parts,
        acquired: Acquired,
    ) -> Result<Option<Slot>, Response<Bytes>>;
}

impl<K: Send + Sync + 'static, R: OnRejection> Decide for Shared<K, R> {
    fn decide(
        &self,
        req: &mut http::request::Parts,
        acquired: Acquired,
    ) -> Result<Option<Slot>, Response<Bytes>> {
        Shared::decide(self, req, acquired)
    }
}

/// Acts on `acquired` for the request `req` (its head apart from its body, and back).
fn decide_on<B>(
    decide: &dyn Decide,
    req: Request<B>,
    acquired: Acquired,
) -> (Request<B>, Result<Option<Slot>, Response<Bytes>>) {
    let (mut parts, body) = req.into_parts();
    let decided = decide.decide(&mut parts, acquired);
    (Request::from_parts(parts, body), decided)
}

/// What a response holds until its body ends: a slot, or the sender whose drop tells a
/// shadow slot's task to give it back. Held only to be dropped.
#[allow(dead_code)]
enum Guard {
    Slot(Slot),
    Shadow(tokio::sync::oneshot::Sender<()>),
}

pin_project! {
    /// The response future of [`InFlightService`]: waits for the slot when it needs a
    /// round trip, then runs the inner service (the slot goes with its body) or yields
    /// the rejection.
    pub struct InFlightFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: FutureState<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum FutureState<S, B>
    where
        S: Service<Request<B>>,
    {
        Acquire {
            acquire: Acquire,
            request: Option<Request<B>>,
            service: Option<S>,
            decide: Arc<dyn Decide>,
        },
        Inner {
            #[pin]
            future: S::Future,
            guard: Option<Guard>,
        },
        Done {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S: Service<Request<B>>, B> InFlightFuture<S, B> {
    fn inner(future: S::Future, guard: Option<Guard>) -> Self {
        Self {
            state: FutureState::Inner { future, guard },
        }
    }

    fn done(response: Response<Bytes>) -> Self {
        Self {
            state: FutureState::Done {
                response: Some(response),
            },
        }
    }
}

impl<S, B, ResBody> Future for InFlightFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<InFlightBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquire {
                    acquire,
                    request,
                    service,
                    decide,
                } => {
                    let acquired = ready!(Pin::new(acquire).poll(cx));
                    let request = request.take().expect("polled after completion");
                    let (request, decided) = decide_on(&**decide, request, acquired);
                    match decided {
                        Ok(slot) => {
                            let mut service = service.take().expect("polled after completion");
                            let future = service.call(request);
                            this.state.set(FutureState::Inner {
                                future,
                                guard: slot.map(Guard::Slot),
                            });
                        }
                        Err(response) => this.state.set(FutureState::Done {
                            response: Some(response),
                        }),
                    }
                }
                StateProj::Inner { future, guard } => {
                    // An error drops the guard with the future: the slot is given back.
                    let response = ready!(future.poll(cx))?;
                    let guard = guard.take();
                    return Poll::Ready(Ok(response.map(|body| InFlightBody {
                        kind: Kind::Inner { body, guard },
                    })));
                }
                StateProj::Done { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(|data| InFlightBody {
                        kind: Kind::Rejection {
                            data: (!data.is_empty()).then_some(data),
                        },
                    })));
                }
            }
        }
    }
}

impl<S: Service<Request<B>>, B> fmt::Debug for InFlightFuture<S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            FutureState::Acquire { .. } => "acquire",
            FutureState::Inner { .. } => "inner",
            FutureState::Done { .. } => "done",
        };
        f.debug_struct("InFlightFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The body of a response from [`InFlightService`]: the inner body, holding the
    /// request's slot until it ends, fails or is dropped; or a rejection's body.
    pub struct InFlightBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            guard: Option<Guard>,
        },
        Rejection {
            data: Option<Bytes>,
        },
    }
}

impl<B> fmt::Debug for InFlightBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let holds = matches!(&self.kind, Kind::Inner { guard: Some(_), .. });
        f.debug_struct("InFlightBody")
            .field("holds_slot", &holds)
            .finish_non_exhaustive()
    }
}

impl<B> Body for InFlightBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { mut body, guard } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                // The end, or an error: the slot goes back now, not when the server
                // drops the body.
                if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
                    guard.take();
                }
                Poll::Ready(frame)
            }
            KindProj::Rejection { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Rejection { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Rejection { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
