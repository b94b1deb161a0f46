//! [`InFlightLimit`]: takes a slot of the request's key (at once in process, in the
//! response future after a round trip), then calls the inner service with the slot
//! going along with the response body, or answers the rejection.

use std::fmt;
use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use super::future::{Decide, ResponseFuture};
use super::host::{Acquire, Acquired};
use super::Guard;
use super::{InFlightLimiter, Slot};
use crate::decision::Decision;
use crate::key::KeyExtractor;
use crate::key::KeyOrigin;
use crate::limit::ResponseBody;
use crate::limit::{MissingKey, MissingKeyWarning};
use crate::metrics::LayerMetrics;
use crate::response::{missing_key, OnRejection, Rejection};

/// Holds at most N requests of one key in flight; built by [`InFlightLimitLayer`](super::InFlightLimitLayer).
/// Readiness is the inner service's.
pub struct InFlightLimit<S, K, R> {
    inner: S,
    shared: Arc<Shared<K, R>>,
}

impl<S, K, R> InFlightLimit<S, K, R> {
    pub(super) fn new(inner: S, shared: Arc<Shared<K, R>>) -> Self {
        Self { inner, shared }
    }

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

impl<S: Clone, K, R> Clone for InFlightLimit<S, K, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, K, R> fmt::Debug for InFlightLimit<S, K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl<S, K, R, ReqBody, ResBody> Service<Request<ReqBody>> for InFlightLimit<S, K, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor,
    R: OnRejection,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        // The head apart from the body, once (a move, no copy): the exemption, the key
        // and the decision read it in place.
        let (mut parts, body) = req.into_parts();
        // An exempt request takes no slot and carries no headers.
        if shared.options.exempt.test(&parts) {
            return ResponseFuture::inner(self.inner.call(Request::from_parts(parts, body)), None);
        }
        let shadow = shared.options.shadow;
        let mut acquire = match shared.key.extract(&parts) {
            Some(key) if key.len() <= shared.options.max_key_len => {
                shared.limiter.acquire_raw(&key)
            }
            key => {
                shared.missing_key(key.is_some(), shared.key.origin());
                match &shared.options.missing_key {
                    MissingKey::Reject(status) if !shadow => {
                        let response = shared
                            .rejection
                            .on_missing_key(*status, shared.limiter.policy(), &parts)
                            .unwrap_or_else(|| missing_key(*status, &parts.headers));
                        return ResponseFuture::done(response);
                    }
                    MissingKey::Reject(_) | MissingKey::Allow => {
                        let req = Request::from_parts(parts, body);
                        return ResponseFuture::inner(self.inner.call(req), None);
                    }
                    MissingKey::Key(key) => shared.limiter.acquire_raw(key.as_bytes()),
                }
            }
        };
        if shadow {
            let guard = shared.shadow(acquire);
            return ResponseFuture::inner(self.inner.call(Request::from_parts(parts, body)), guard);
        }
        if let Some(acquired) = acquire.take_ready() {
            return match shared.decide(&mut parts, acquired) {
                Ok(slot) => ResponseFuture::inner(
                    self.inner.call(Request::from_parts(parts, body)),
                    slot.map(Guard::Slot),
                ),
                Err(response) => ResponseFuture::done(response),
            };
        }
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        ResponseFuture::acquire(
            acquire,
            parts,
            body,
            inner,
            Arc::clone(shared) as Arc<dyn Decide>,
        )
    }
}

/// Everything the services of one layer share (the layer's builder makes it).
pub(super) struct Shared<K, R> {
    pub(super) limiter: InFlightLimiter,
    pub(super) key: K,
    pub(super) rejection: R,
    pub(super) options: crate::limit::Options,
    pub(super) metrics: LayerMetrics,
    pub(super) missing_warning: MissingKeyWarning,
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
            let secs = crate::response::ceil_secs(retry).max(1);
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

    /// Counts a request without a usable key, and warns (at most once per interval)
    /// when the layer refuses it and the server should have provided the key (see
    /// [`KeyOrigin`]).
    fn missing_key(&self, too_long: bool, origin: KeyOrigin) {
        self.metrics.missing_key(0);
        let refused = matches!(self.options.missing_key, MissingKey::Reject(_));
        if !refused || origin == KeyOrigin::Client {
            crate::limit::log_missing_key(
                self.options.missing_key_level,
                self.limiter.policy().name(),
                too_long,
                origin,
            );
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

impl<K: Send + Sync + 'static, R: OnRejection> Decide for Shared<K, R> {
    fn decide(
        &self,
        req: &mut http::request::Parts,
        acquired: Acquired,
    ) -> Result<Option<Slot>, Response<Bytes>> {
        Shared::decide(self, req, acquired)
    }
}
