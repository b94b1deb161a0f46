use std::fmt;
use std::mem;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::{MissingKey, Respond, ResponseBody, Shared};
use crate::cost::Cost;
use crate::decision::Decision;
use crate::key::KeyExtractor;
use crate::limiter::{Check, Limiter};
use crate::response::{plain, OnRejection};

/// Rate-limits requests to an inner service; built by
/// [`RateLimitLayer`](super::RateLimitLayer).
///
/// Readiness is the inner service's: a limit is never enforced by refusing readiness.
/// Each request's key and cost are read in `call`, the limiter is asked, and then either
/// the inner service is called (with the [`Decision`] in the request extensions and the
/// rate-limit headers on its response) or the rejection is answered without touching it.
pub struct RateLimit<S, L, K, C, R> {
    inner: S,
    shared: Arc<Shared<L, K, C, R>>,
}

impl<S, L, K, C, R> RateLimit<S, L, K, C, R> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<L, K, C, R>>) -> Self {
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

    /// The limiter this service asks.
    pub fn limiter(&self) -> &L {
        &self.shared.limiter
    }
}

impl<S: Clone, L, K, C, R> Clone for RateLimit<S, L, K, C, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, L: Limiter, K, C, R> fmt::Debug for RateLimit<S, L, K, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policy", self.shared.limiter.policy())
            .finish_non_exhaustive()
    }
}

impl<S, L, K, C, R, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, L, K, C, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    L: Limiter,
    K: KeyExtractor<ReqBody>,
    C: Cost<ReqBody>,
    R: OnRejection,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let Some(cost) = NonZeroU32::new(shared.cost.cost(&req)) else {
            return ResponseFuture::inner(self.inner.call(req), None, shared.clone());
        };
        let mut check: Check = match shared.key.extract(&req) {
            Some(key) if key.len() <= shared.max_key_len => shared.limiter.check(&key, cost),
            key => {
                tracing::debug!(
                    policy = shared.limiter.policy().name(),
                    too_long = key.is_some(),
                    "rate-limit key missing"
                );
                match &shared.missing_key {
                    MissingKey::Reject(status) => {
                        let response = plain(*status, "missing rate-limit key\n");
                        return ResponseFuture::done(response, shared.clone());
                    }
                    MissingKey::Allow => {
                        return ResponseFuture::inner(self.inner.call(req), None, shared.clone());
                    }
                    MissingKey::Key(key) => shared.limiter.check(key, cost),
                }
            }
        };
        if let Some(decision) = check.take_ready() {
            return if decision.is_admitted() {
                admit(&mut req, &decision);
                ResponseFuture::inner(self.inner.call(req), Some(decision), shared.clone())
            } else {
                let response = shared.reject(req.method(), req.uri(), req.headers(), &decision);
                ResponseFuture::done(response, shared.clone())
            };
        }
        // The check needs a round trip: hand the ready inner service to the future and
        // keep a fresh clone here (the `mem::replace` idiom from tower's docs).
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        ResponseFuture::check(check, req, inner, shared.clone())
    }
}

/// Prepares an admitted request for the inner service.
pub(super) fn admit<B>(req: &mut Request<B>, decision: &Decision) {
    req.extensions_mut().insert(decision.clone());
}
