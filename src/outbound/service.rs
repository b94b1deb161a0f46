//! [`Outbound`]: the client service that waits for the limit, and its future.

use std::fmt;
use std::future::Future;
use std::mem;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Request;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{OutboundError, WaitError, Waiter};
use crate::cost::Cost;
use crate::decision::Decision;
use crate::key::{GlobalKey, Key, KeyExtractor};
use crate::limiter::Limiter;

/// Waits for the limit before each call to an inner client service; built by
/// [`OutboundLayer`](super::OutboundLayer).
///
/// `poll_ready` is the inner service's. `call` reads the request's key and cost from its
/// head (a request without a key waits on [`GlobalKey`]'s key `global`), then
/// its future waits in the key's queue until the limit admits the cost (or fails with
/// [`OutboundError::Wait`] without calling the inner service), and then calls the
/// inner service (made ready again first, as `ServiceExt::oneshot` would). A request of
/// cost zero does not wait.
pub struct Outbound<S, L, K, C> {
    inner: S,
    waiter: Waiter<L>,
    key: Arc<K>,
    cost: Arc<C>,
    max_wait: Duration,
}

impl<S, L, K, C> Outbound<S, L, K, C> {
    /// The service of a layer's settings: its waiter, key, cost and longest wait.
    pub(super) fn new(
        inner: S,
        waiter: Waiter<L>,
        key: Arc<K>,
        cost: Arc<C>,
        max_wait: Duration,
    ) -> Self {
        Self {
            inner,
            waiter,
            key,
            cost,
            max_wait,
        }
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

    /// The waiter this service's calls queue on.
    pub fn waiter(&self) -> &Waiter<L> {
        &self.waiter
    }
}

impl<S: Clone, L, K, C> Clone for Outbound<S, L, K, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            waiter: self.waiter.clone(),
            key: Arc::clone(&self.key),
            cost: Arc::clone(&self.cost),
            max_wait: self.max_wait,
        }
    }
}

impl<S: fmt::Debug, L: Limiter, K, C> fmt::Debug for Outbound<S, L, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbound")
            .field("inner", &self.inner)
            .field("waiter", &self.waiter)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl<S, L, K, C, B> Service<Request<B>> for Outbound<S, L, K, C>
where
    S: Service<Request<B>> + Clone,
    L: Limiter,
    K: KeyExtractor,
    C: Cost,
{
    type Response = S::Response;
    type Error = OutboundError<S::Error>;
    type Future = ResponseFuture<S, Request<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(OutboundError::Inner)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The head apart from the body, once (a move, no copy), for the cost and the key.
        let (parts, body) = request.into_parts();
        let Some(cost) = NonZeroU32::new(self.cost.cost(&parts)) else {
            return ResponseFuture {
                state: State::Inner {
                    future: self.inner.call(Request::from_parts(parts, body)),
                },
            };
        };
        // The wait outlives the request's head: the key is owned (on the stack when short).
        let key = self
            .key
            .extract(&parts)
            .map_or(Key::borrowed(GlobalKey::KEY.as_bytes()), Key::into_owned);
        let request = Request::from_parts(parts, body);
        let waiter = self.waiter.clone();
        let max_wait = self.max_wait;
        let wait = Box::pin(async move { waiter.acquire(&key, cost, max_wait).await });
        // The service that was made ready goes with the request; this one stays.
        let clone = self.inner.clone();
        let service = mem::replace(&mut self.inner, clone);
        ResponseFuture {
            state: State::Wait {
                wait,
                request: Some(request),
                service: Some(service),
            },
        }
    }
}

type Wait = Pin<Box<dyn Future<Output = Result<Decision, WaitError>> + Send>>;

pin_project! {
    /// The response future of [`Outbound`]: the wait for the limit, then the inner
    /// service's call.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Wait {
            wait: Wait,
            request: Option<Req>,
            service: Option<S>,
        },
        Ready {
            request: Option<Req>,
            service: S,
        },
        Inner {
            #[pin]
            future: S::Future,
        },
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    type Output = Result<S::Response, OutboundError<S::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Wait {
                    wait,
                    request,
                    service,
                } => {
                    if let Err(error) = ready!(wait.as_mut().poll(cx)) {
                        return Poll::Ready(Err(OutboundError::Wait(error)));
                    }
                    let request = request.take();
                    let service = service.take().expect("polled after completion");
                    state.set(State::Ready { request, service });
                }
                StateProj::Ready { request, service } => {
                    ready!(service.poll_ready(cx)).map_err(OutboundError::Inner)?;
                    let request = request.take().expect("polled after completion");
                    let future = service.call(request);
                    state.set(State::Inner { future });
                }
                StateProj::Inner { future } => {
                    return future.poll(cx).map_err(OutboundError::Inner);
                }
            }
        }
    }
}

impl<S, Req> fmt::Debug for ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Wait { .. } => "Wait",
            State::Ready { .. } => "Ready",
            State::Inner { .. } => "Inner",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
