//! The response body of a rate-limited service: the inner body, or a rejection's.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a response from [`LimitService`](crate::LimitService): the inner service's
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
        },
        Rejection {
            data: Option<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
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
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Rejection { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Rejection { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Rejection { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
