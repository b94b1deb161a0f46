//! The response body of a limited service: the inner body (metered when the layer
//! settles after the response, holding the slot of an in-flight limit), or a
//! rejection's.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::usage::Meter;
use crate::in_flight::Guard;

pin_project! {
    /// The body of a response from [`Limit`](crate::Limit) or
    /// [`InFlightLimit`](crate::in_flight::InFlightLimit): the inner service's body when
    /// the request was admitted (an in-flight limit's slot is held until it ends, fails
    /// or is dropped), the rejection's body otherwise.
    pub struct ResponseBody<B> {
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
            end: End,
        },
        Rejection {
            data: Option<Bytes>,
        },
    }
}

/// What the inner body does when it ends.
enum End {
    Nothing,
    /// Settles the layer's usage (only when the layer settles after the response).
    Meter(Box<Meter>),
    /// Gives an in-flight limit's slot back (dropped at the end, on an error, or with
    /// the body): held only to be dropped.
    #[allow(dead_code)]
    Slot(Guard),
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, meter: Option<Box<Meter>>) -> Self {
        let end = meter.map_or(End::Nothing, End::Meter);
        Self {
            kind: Kind::Inner { body, end },
        }
    }

    /// The inner body, holding `guard` (an in-flight slot) until it ends.
    pub(crate) fn holding(body: B, guard: Option<Guard>) -> Self {
        let end = guard.map_or(End::Nothing, End::Slot);
        Self {
            kind: Kind::Inner { body, end },
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

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner {
                end: End::Nothing, ..
            } => "inner",
            Kind::Inner {
                end: End::Meter(_), ..
            } => "inner, metered",
            Kind::Inner {
                end: End::Slot(_), ..
            } => "inner, holding a slot",
            Kind::Rejection { .. } => "rejection",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

/// An empty body of the inner type, as a response made outside the limit needs one
/// (tower-http's `CorsLayer` answers a preflight with `Default::default()`): it settles
/// nothing and holds no slot.
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
            KindProj::Inner { mut body, end } => {
                let polled = body.as_mut().poll_frame(cx);
                match end {
                    End::Nothing => {}
                    End::Meter(meter) => match &polled {
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
                    },
                    // The end, or an error: the slot goes back now, not when the server
                    // drops the body.
                    End::Slot(_) => {
                        if let Poll::Ready(frame) = &polled {
                            if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
                                *end = End::Nothing;
                            }
                        }
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
