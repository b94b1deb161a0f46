//! The response future of [`Limit`](super::Limit): it waits for the limiter's
//! decision when the check needs a round trip, then calls the inner service or answers
//! with the rejection, and adds the rate-limit headers to what comes back.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{Respond, ResponseBody, Settle};
use crate::limiter::DecisionFuture;
use crate::response::Ready;
use crate::Decision;

pin_project! {
    /// The response future of [`Limit`](super::Limit): waits for the limiter when
    /// it needs a round trip, then runs the inner service or yields the rejection.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        // Only a check that waits for a store needs the layer's shared parts: a decision
        // known at once is acted on in `call`, which builds the headers right there.
        Check {
            check: DecisionFuture,
            request: Option<Request<B>>,
            service: Option<S>,
            respond: Arc<dyn Respond>,
            policy: usize,
            settle: Option<Settle>,
            // A layer that waits: when the request's wait ends at the latest (set at its
            // first refusal), and its place among its key's waiters.
            deadline: Option<tokio::time::Instant>,
            place: Option<Place>,
        },
        // A refused request waiting for its turn (a layer that waits), then checked
        // again; it holds nothing meanwhile.
        Wait {
            sleep: Pin<Box<tokio::time::Sleep>>,
            deadline: tokio::time::Instant,
            request: Option<Request<B>>,
            service: Option<S>,
            respond: Arc<dyn Respond>,
            policy: usize,
            settle: Option<Settle>,
            place: Place,
        },
        Inner {
            #[pin]
            future: S::Future,
            headers: Option<Ready>,
            // Only when the layer settles after the response (counting by outcome, usage):
            // what settles the request's units.
            settle: Option<(Arc<dyn Respond>, Settle)>,
        },
        Done {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(super) fn check(
        check: DecisionFuture,
        request: Request<B>,
        service: S,
        settle: Option<Settle>,
        policy: usize,
        respond: Arc<dyn Respond>,
    ) -> Self {
        Self {
            state: State::Check {
                check,
                request: Some(request),
                service: Some(service),
                respond,
                policy,
                settle,
                deadline: None,
                place: None,
            },
        }
    }

    /// The inner service's future; `headers` go onto its response, and `settle` (counting
    /// by outcome) decides on it whether the request counts.
    pub(super) fn inner(
        future: S::Future,
        headers: Option<Ready>,
        settle: Option<(Arc<dyn Respond>, Settle)>,
    ) -> Self {
        Self {
            state: State::Inner {
                future,
                headers,
                settle,
            },
        }
    }

    /// What a decision does to its request, the one place that says it (for a decision
    /// known in `call` and one awaited here): the decision is recorded; a shadow layer
    /// serves the request and settles only what its check admitted; an admitted
    /// request carries the decision in its extensions and gets the rate-limit headers;
    /// a refused one is answered with the rejection, the inner service untouched.
    /// `shared` hands out the layer's parts for settling after the response (called
    /// only when there is something to settle).
    pub(super) fn decided<R: Respond + ?Sized>(
        service: &mut S,
        mut request: Request<B>,
        decision: Decision,
        policy: usize,
        respond: &R,
        settle: Option<Settle>,
        shared: impl FnOnce() -> Arc<dyn Respond>,
    ) -> Self {
        respond.record(policy, &decision);
        if respond.is_shadow() {
            let settle = settle
                .filter(|_| decision.is_admitted())
                .map(|s| (shared(), s));
            Self::inner(service.call(request), None, settle)
        } else if decision.is_admitted() {
            let headers = respond.admitted_headers(policy, &decision);
            respond.admit(request.extensions_mut(), decision);
            let settle = settle.map(|s| (shared(), s));
            Self::inner(service.call(request), headers, settle)
        } else {
            let (parts, _body) = request.into_parts();
            Self::done(respond.reject(policy, &parts, &decision))
        }
    }

    pub(super) fn done(response: Response<Bytes>) -> Self {
        Self {
            state: State::Done {
                response: Some(response),
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Check {
                    check,
                    request,
                    service,
                    respond,
                    policy,
                    settle,
                    deadline,
                    place,
                } => {
                    let decision = ready!(Pin::new(check).poll(cx));
                    // Refused, in a layer that waits: its turn, if it comes in time and
                    // the key has a place to wait.
                    let waits = turn(&decision, &**respond, deadline).and_then(|turn| {
                        let place = match place.take() {
                            Some(place) => place,
                            None => Place::of(respond, request)?,
                        };
                        Some((turn, place))
                    });
                    if let Some(((turn, deadline), place)) = waits {
                        let next = State::Wait {
                            sleep: Box::pin(tokio::time::sleep_until(turn)),
                            deadline,
                            request: request.take(),
                            service: service.take(),
                            respond: Arc::clone(respond),
                            policy: *policy,
                            settle: settle.take(),
                            place,
                        };
                        this.state.set(next);
                        continue;
                    }
                    let request = request.take().expect("polled after completion");
                    let mut service = service.take().expect("polled after completion");
                    let next = Self::decided(
                        &mut service,
                        request,
                        decision,
                        *policy,
                        &**respond,
                        settle.take(),
                        || Arc::clone(respond),
                    );
                    this.state.set(next.state);
                }
                StateProj::Wait {
                    sleep,
                    deadline,
                    request,
                    service,
                    respond,
                    policy,
                    settle,
                    place,
                } => {
                    ready!(sleep.as_mut().poll(cx));
                    let (parts, body) = request
                        .take()
                        .expect("polled after completion")
                        .into_parts();
                    let check = respond.recheck(*policy, &parts);
                    let request = Request::from_parts(parts, body);
                    let next = match check {
                        Some(check) => State::Check {
                            check,
                            request: Some(request),
                            service: service.take(),
                            respond: Arc::clone(respond),
                            policy: *policy,
                            settle: settle.take(),
                            deadline: Some(*deadline),
                            place: Some(place.moved()),
                        },
                        // (No key now: the request is served as its first check said
                        // it would not be: never; refused by the layer's rejection.)
                        None => {
                            let (parts, _body) = request.into_parts();
                            let refused = crate::Decision::new(
                                crate::State::OverQuota,
                                0,
                                0,
                                std::time::Duration::ZERO,
                                crate::Source::InProcess,
                            );
                            State::Done {
                                response: Some(respond.reject(*policy, &parts, &refused)),
                            }
                        }
                    };
                    this.state.set(next);
                }
                StateProj::Inner {
                    future,
                    headers,
                    settle,
                } => {
                    let result = ready!(future.poll(cx));
                    let meter = settle.take().and_then(|(respond, settle)| match &result {
                        Ok(response) => {
                            respond.settle(response.status(), response.headers(), settle)
                        }
                        Err(_) => respond.settle(
                            http::StatusCode::INTERNAL_SERVER_ERROR,
                            &http::HeaderMap::new(),
                            settle,
                        ),
                    });
                    let mut response = result?;
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(|body| ResponseBody::inner(body, meter))));
                }
                StateProj::Done { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(ResponseBody::rejection)));
                }
            }
        }
    }
}

/// A request's place among its key's waiters in this process, given back when it is
/// dropped (the request admitted, refused, or its client gone).
pub(super) struct Place {
    respond: Option<Arc<dyn Respond>>,
    key: Box<[u8]>,
}

impl Place {
    /// A place for the key of `request` (taken out and put back), if one is free.
    fn of<B>(respond: &Arc<dyn Respond>, request: &mut Option<Request<B>>) -> Option<Self> {
        let (parts, body) = request.take()?.into_parts();
        let key = respond.enter(&parts);
        *request = Some(Request::from_parts(parts, body));
        Some(Self {
            respond: Some(Arc::clone(respond)),
            key: key?,
        })
    }

    /// Moves the place out (the one left behind gives back nothing).
    fn moved(&mut self) -> Self {
        Self {
            respond: self.respond.take(),
            key: std::mem::take(&mut self.key),
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(respond) = self.respond.take() {
            respond.leave(&self.key);
        }
    }
}

/// When a refused `decision` is checked again in a layer that waits: at its
/// `Retry-After`, if that falls within the request's wait (`deadline`, or the layer's
/// longest wait from now at a first refusal); with that deadline.
pub(super) fn turn(
    decision: &Decision,
    respond: &dyn Respond,
    deadline: &Option<tokio::time::Instant>,
) -> Option<(tokio::time::Instant, tokio::time::Instant)> {
    if decision.is_admitted() {
        return None;
    }
    let wait = respond.wait()?;
    let retry = decision.retry_after?;
    // The waits are tokio timers: without a runtime, no wait.
    tokio::runtime::Handle::try_current().ok()?;
    let now = tokio::time::Instant::now();
    let deadline = deadline.unwrap_or(now + wait);
    // (At least a millisecond: a wait never spins.)
    let turn = now.checked_add(retry.max(std::time::Duration::from_millis(1)))?;
    (turn <= deadline).then_some((turn, deadline))
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Check { .. } => "check",
            State::Wait { .. } => "wait",
            State::Inner { .. } => "inner",
            State::Done { .. } => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
