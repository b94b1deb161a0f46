//! The response future of [`InFlightLimit`](super::InFlightLimit): the request's slot
//! goes with the response body ([`ResponseBody`](crate::limit::ResponseBody)) until it ends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::host::{Acquire, Acquired};
use super::{Guard, Slot};
use crate::limit::ResponseBody;

/// How a request is decided once the round trip for its slot answered: the service's
/// shared settings, without their type parameters (so that the future need not name them).
pub(super) trait Decide: Send + Sync + 'static {
    #[allow(clippy::result_large_err)]
    fn decide(
        &self,
        req: &mut http::request::Parts,
        acquired: Acquired,
    ) -> Result<Option<Slot>, Response<Bytes>>;
}

pin_project! {
    /// The response future of [`InFlightLimit`](super::InFlightLimit): waits for the slot when it needs a
    /// round trip, then runs the inner service (the slot goes with its body) or yields
    /// the rejection.
    pub struct ResponseFuture<S, B>
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
            // The request's head and body, apart since the service split them.
            request: Option<(http::request::Parts, B)>,
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

impl<S: Service<Request<B>>, B> ResponseFuture<S, B> {
    /// Waits for `acquire`, then acts on it with `decide`: the request (`parts` and
    /// `body`) to `service`, or the rejection.
    pub(super) fn acquire(
        acquire: Acquire,
        parts: http::request::Parts,
        body: B,
        service: S,
        decide: Arc<dyn Decide>,
    ) -> Self {
        Self {
            state: FutureState::Acquire {
                acquire,
                request: Some((parts, body)),
                service: Some(service),
                decide,
            },
        }
    }

    pub(super) fn inner(future: S::Future, guard: Option<Guard>) -> Self {
        Self {
            state: FutureState::Inner { future, guard },
        }
    }

    pub(super) fn done(response: Response<Bytes>) -> Self {
        Self {
            state: FutureState::Done {
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
                StateProj::Acquire {
                    acquire,
                    request,
                    service,
                    decide,
                } => {
                    let acquired = ready!(Pin::new(acquire).poll(cx));
                    let (mut parts, body) = request.take().expect("polled after completion");
                    match decide.decide(&mut parts, acquired) {
                        Ok(slot) => {
                            let mut service = service.take().expect("polled after completion");
                            let future = service.call(Request::from_parts(parts, body));
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
                    return Poll::Ready(
                        Ok(response.map(|body| ResponseBody::holding(body, guard))),
                    );
                }
                StateProj::Done { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(ResponseBody::rejection)));
                }
            }
        }
    }
}

impl<S: Service<Request<B>>, B> fmt::Debug for ResponseFuture<S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            FutureState::Acquire { .. } => "acquire",
            FutureState::Inner { .. } => "inner",
            FutureState::Done { .. } => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
