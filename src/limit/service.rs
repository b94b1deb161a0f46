//! [`Limit`]: extracts the key and cost of a request and asks the limiter; an
//! in-process decision is answered at once, one that needs Redis is awaited in the
//! response future. `poll_ready` only delegates to the inner service.

use std::fmt;
use std::mem;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::counted::{RequestBytes, RequestBytesSlot};
use super::future::ResponseFuture;
use super::{MissingKey, Respond, ResponseBody, Settle, Shared, Usage};
use crate::cost::Cost;
use crate::key::KeyExtractor;
use crate::limiter::{DecisionFuture, Limiter};
use crate::response::{missing_key, OnRejection};

/// Rate-limits requests to an inner service; built by
/// [`LimitLayer`](super::LimitLayer).
///
/// Readiness is the inner service's: a limit is never enforced by refusing readiness.
/// Each request's key and cost are read in `call`, the limiter is asked, and then either
/// the inner service is called (with the [`Decision`](crate::Decision) in the request extensions and the
/// rate-limit headers on its response) or the rejection is answered without touching it.
/// A [shadow](super::LayerBuilder::shadow) layer always calls the inner service, and
/// only records its decisions.
pub struct Limit<S, L, K, C, R> {
    inner: S,
    shared: Arc<Shared<L, K, C, R>>,
}

impl<S, L, K, C, R> Limit<S, L, K, C, R> {
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

impl<S: Clone, L, K, C, R> Clone for Limit<S, L, K, C, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, L: Limiter, K, C, R> fmt::Debug for Limit<S, L, K, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("inner", &self.inner)
            .field("policy", self.shared.limiter.policy())
            .finish_non_exhaustive()
    }
}

impl<S, L, K, C, R, ReqBody, ResBody> Service<Request<ReqBody>> for Limit<S, L, K, C, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    L: Limiter,
    K: KeyExtractor,
    C: Cost,
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
        // The head apart from the body, once (a move, no copy): the exemption, the cost,
        // the plan and the key read it in place; the request is whole again before the
        // inner service sees it.
        let (mut parts, body) = req.into_parts();
        // An exempt request is neither checked nor counted, and carries no headers.
        if shared.options.exempt.test(&parts) {
            return ResponseFuture::inner(
                self.inner.call(Request::from_parts(parts, body)),
                None,
                None,
            );
        }
        let Some(cost) = NonZeroU32::new(shared.cost.cost(&parts)) else {
            return ResponseFuture::inner(
                self.inner.call(Request::from_parts(parts, body)),
                None,
                None,
            );
        };
        let policy = if shared.headers.len() > 1 {
            select(&shared.limiter, shared.headers.len(), &parts)
        } else {
            0
        };
        let mut settle = None;
        let mut check: DecisionFuture = match shared.key.extract(&parts) {
            Some(key) if key.len() <= shared.options.max_key_len => {
                if shared.settles() {
                    settle = Some(Settle {
                        key: (*key).into(),
                        cost,
                        policy,
                        admitted: None,
                        request_bytes: None,
                    });
                }
                shared.check(policy, &key, cost, &parts)
            }
            key => {
                let too_long = key.is_some();
                shared.missing_key(policy, too_long, shared.key.origin());
                shared.metrics.missing_key(policy);
                match &shared.options.missing_key {
                    MissingKey::Reject(status) if !shared.options.shadow => {
                        let response = shared
                            .rejection
                            .on_missing_key(*status, &shared.limiter.policies()[policy], &parts)
                            .unwrap_or_else(|| missing_key(*status, &parts.headers));
                        return ResponseFuture::done(response);
                    }
                    MissingKey::Reject(_) | MissingKey::Allow => {
                        return ResponseFuture::inner(
                            self.inner.call(Request::from_parts(parts, body)),
                            None,
                            None,
                        );
                    }
                    MissingKey::Key(key) => shared.check(policy, key.as_bytes(), cost, &parts),
                }
            }
        };
        if let Some(settle) = &mut settle {
            if shared
                .options
                .usage
                .as_ref()
                .is_some_and(Usage::counts_request)
            {
                // The request body's bytes, counted by `CountRequestBytesLayer` inside.
                let bytes = Arc::new(RequestBytes::default());
                parts
                    .extensions
                    .insert(RequestBytesSlot(Arc::clone(&bytes)));
                settle.request_bytes = Some(bytes);
            }
        }
        let req = Request::from_parts(parts, body);
        if let Some(decision) = check.take_ready() {
            if super::future::turn(&decision, &**shared, &None).is_some() {
                // Refused, and the layer waits: the future waits for its turn.
                check = DecisionFuture::ready(decision);
            } else {
                // Known at once: the headers are built here, and the decision moves into the
                // request, so the future holds no reference to the layer.
                return ResponseFuture::decided(
                    &mut self.inner,
                    req,
                    decision,
                    policy,
                    &**shared,
                    settle,
                    || Arc::clone(shared) as Arc<dyn Respond>,
                );
            }
        }
        if shared.options.shadow {
            // Never make a request wait for a limit that is not enforced: the round trip
            // runs (and is recorded) in a task of its own when there is a runtime.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let respond: Arc<dyn Respond> = shared.clone();
                // Settling waits for the check: only what it admitted is settled.
                let (admitted, settle) = match settle {
                    Some(mut settle) => {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        settle.admitted = Some(rx);
                        (Some(tx), Some((Arc::clone(&respond), settle)))
                    }
                    None => (None, None),
                };
                // (In the request's span: the decision's fields are recorded on it.)
                let task = async move {
                    let decision = check.await;
                    respond.record(policy, &decision);
                    if let Some(admitted) = admitted {
                        let _ = admitted.send(decision.is_admitted());
                    }
                };
                runtime.spawn(tracing::Instrument::instrument(
                    task,
                    tracing::Span::current(),
                ));
                return ResponseFuture::inner(self.inner.call(req), None, settle);
            }
        }
        // The check needs a round trip: hand the ready inner service to the future and
        // keep a fresh clone here (the `mem::replace` idiom from tower's docs).
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        ResponseFuture::check(check, req, inner, settle, policy, shared.clone())
    }
}

/// The index of the policy that applies to the request whose head is `parts` among
/// `count` (more than one), asked of the limiter.
fn select<L: Limiter>(limiter: &L, count: usize, parts: &http::request::Parts) -> usize {
    let index = limiter.select(parts);
    if index < count {
        index
    } else {
        0
    }
}
