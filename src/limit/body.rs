//! The response body of a rate-limited service: the inner body (metered when the layer
//! settles after the response), or a rejection's.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::usage::Meter;

pin_project! {
    /// The body of a response from [`Limit`](crate::Limit): the inner service's
    /// body when the request was admitted, the rejection's body otherwise.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            // Only when the layer settles after the response: what settles it at the end.
            meter: Option<Box<Meter>>,
        },
        Rejection {
            data: Option<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, meter: Option<Box<Meter>>) -> Self {
        Self {
            kind: Kind::Inner { body, meter },
        }
    }

    pub(crate) fn rejection(data: Bytes) -> Self {
        Self {
            kind: Kind::Rejection {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

/// An empty body of the inner type, as a response made outside the limit needs one
/// (tower-http's `CorsLayer` answers a preflight with `Default::default()`): it settles
/// nothing.
impl<B: Default> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::inner(B::default(), None)
    }
}

impl<B> Body for ResponseBody<B>
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
            KindProj::Inner { mut body, meter } => {
                let polled = body.as_mut().poll_frame(cx);
                if let Some(meter) = meter {
                    match &polled {
                        Poll::Ready(Some(Ok(frame))) => {
                            if let Some(data) = frame.data_ref() {
                                meter.data(data);
                            } else if let Some(trailers) = frame.trailers_ref() {
                                meter.trailers(trailers);
                            }
                            // A body that says it has ended may not be polled again.
                            if body.is_end_stream() {
                                meter.finish(true);
                            }
                        }
                        Poll::Ready(Some(Err(_))) => meter.finish(false),
                        Poll::Ready(None) => meter.finish(true),
                        Poll::Pending => {}
                    }
                }
                polled
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
