//! Request bodies as cost: [`CountRequestBytesLayer`] wraps each request's body in a
//! [`CountedBody`] that counts the bytes the handler reads, for a layer that settles to
//! them ([`Usage::request_bytes`](super::Usage::request_bytes)).
//!
//! A layer cannot change the body type its inner service gets, so the counting is a
//! layer of its own, placed inside the limit; the limit's service hands it the counter
//! in the request extensions.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Buf;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

/// The bytes of one request's body, counted by its [`CountedBody`]: put in the request
/// extensions by a limit that settles to them.
#[derive(Debug, Default)]
pub(crate) struct RequestBytes {
    bytes: AtomicU64,
    /// Whether a [`CountedBody`] counts them (without one, nothing is known).
    counted: AtomicBool,
}

impl RequestBytes {
    /// The bytes read so far; `None` when no [`CountRequestBytesLayer`] layer counts them.
    pub(crate) fn read(&self) -> Option<u64> {
        self.counted
            .load(Ordering::Acquire)
            .then(|| self.bytes.load(Ordering::Acquire))
    }
}

/// The extension that carries a request's [`RequestBytes`] to [`CountRequestBytesLayer`].
#[derive(Debug, Clone)]
pub(crate) struct RequestBytesSlot(pub(crate) Arc<RequestBytes>);

/// A tower [`Layer`] that counts the bytes of each request body its inner service reads,
/// for the limits outside it that settle to them
/// ([`Usage::request_bytes`](super::Usage::request_bytes)). Place it inside those limits
/// (a layer added after them, in axum's `.layer()` order, runs before them: add it
/// first). Requests no such limit admitted pass with their body counted for nobody.
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::post, Router};
/// use http::header::CONTENT_LENGTH;
/// use tower_redis_ratelimit::{
///     key::HeaderKey, limit::{CountRequestBytesLayer, Usage}, Backend, HeaderCost, LimitLayer,
///     PeriodConfig,
/// };
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// // 10 MB of uploads per minute per tenant, settled to the bytes read.
/// let config = PeriodConfig::new(10_000_000, Duration::from_secs(60));
/// let uploads = LimitLayer::builder(&Backend::in_process(), config)
///     .name("uploads")
///     .key(HeaderKey::from_static("x-tenant"))
///     .cost(HeaderCost::new(CONTENT_LENGTH, 1))
///     .settle(Usage::request_bytes())
///     .build()?;
/// let app: Router = Router::new()
///     .route("/upload", post(|body: String| async move { body.len().to_string() }))
///     .layer(CountRequestBytesLayer)
///     .layer(uploads);
/// # let _ = app; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct CountRequestBytesLayer;

impl<S> Layer<S> for CountRequestBytesLayer {
    type Service = CountRequestBytes<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountRequestBytes { inner }
    }
}

/// The service of [`CountRequestBytesLayer`]: hands its inner service the request with its
/// body in a [`CountedBody`].
#[derive(Debug, Clone)]
pub struct CountRequestBytes<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for CountRequestBytes<S>
where
    S: Service<Request<CountedBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let bytes = req
            .extensions()
            .get::<RequestBytesSlot>()
            .map(|slot| Arc::clone(&slot.0));
        if let Some(bytes) = &bytes {
            bytes.counted.store(true, Ordering::Release);
        }
        self.inner.call(req.map(|body| CountedBody { body, bytes }))
    }
}

pin_project! {
    /// A request body whose bytes are counted as the handler reads them, for a limit
    /// that settles to them; made by [`CountRequestBytesLayer`].
    #[derive(Debug)]
    pub struct CountedBody<B> {
        #[pin]
        body: B,
        bytes: Option<Arc<RequestBytes>>,
    }
}

impl<B: Body> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        if let (Some(bytes), Poll::Ready(Some(Ok(frame)))) = (this.bytes.as_ref(), &polled) {
            if let Some(data) = frame.data_ref() {
                bytes
                    .bytes
                    .fetch_add(data.remaining() as u64, Ordering::AcqRel);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
