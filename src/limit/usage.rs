//! Settling after the response: a layer option ([`Usage`]) that reads what an admitted
//! request really cost from its response (a header, a trailer, the body's bytes, a
//! closure over the finished body) and settles the limit to it, once the response body
//! ends.
//!
//! The check spends an estimate when the request arrives (the layer's
//! [cost](super::LayerBuilder::cost)), so concurrent requests never overshoot by more
//! than their own underestimates. When the body ends (its last frame, an error, or the
//! body dropped: a client that went away, a panic), a [`Meter`] settles to the actual
//! cost with one call (a [`Limiter::settle`](crate::Limiter::settle) of its policy), in the
//! background: less than the estimate gives the difference back, more spends the extra
//! past the limit (the key owes it, and is refused until it is paid off). A request
//! whose actual cost cannot be read keeps its estimate: never free, never charged twice.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use tokio::sync::oneshot;

use super::outcome::Settle;

/// How an admitted request's actual cost is read from its response, to settle the
/// limit to it when the response body ends; see [`LayerBuilder::settle`] and the
/// guide's [Limits on usage](crate::guide::usage#limits-on-usage).
///
/// The actual cost is in the limit's units (tokens, bytes, rows...). When it cannot be
/// read (a missing or invalid header, a client gone before the trailers, a closure
/// that answers `None`), the request keeps what its check spent.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{key::HeaderKey, limit::Usage, Backend, LimitLayer, PeriodConfig};
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// // 10 MB of responses per minute per tenant.
/// let config = PeriodConfig::new(10_000_000, Duration::from_secs(60));
/// let layer = LimitLayer::builder(&Backend::in_process(), config)
///     .name("egress")
///     .key(HeaderKey::from_static("x-tenant"))
///     .settle(Usage::bytes())
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
///
/// [`LayerBuilder::settle`]: super::LayerBuilder::settle
#[derive(Clone)]
pub struct Usage(Arc<Read>);

enum Read {
    Header(HeaderName),
    Trailer(HeaderName),
    Bytes,
    RequestBytes,
    Body { keep: usize, read: Box<ReadBody> },
}

type ReadBody = dyn Fn(&Finished<'_>) -> Option<u64> + Send + Sync;

impl Usage {
    /// The actual cost is the response header `name` (a whole number), read when the
    /// response starts; settled when its body ends.
    #[must_use]
    pub fn header(name: HeaderName) -> Self {
        Self(Arc::new(Read::Header(name)))
    }

    /// The actual cost is the response trailer `name` (a whole number), read when the
    /// body ends. A body that ends without it (a client gone first) keeps the estimate.
    #[must_use]
    pub fn trailer(name: HeaderName) -> Self {
        Self(Arc::new(Read::Trailer(name)))
    }

    /// The actual cost is the response body's bytes, counted as they stream: a body cut
    /// short (a client gone, an error) settles to the bytes it produced.
    #[must_use]
    pub fn bytes() -> Self {
        Self(Arc::new(Read::Bytes))
    }

    /// The actual cost is the request body's bytes that the handler read, counted by a
    /// [`CountRequestBytesLayer`](super::CountRequestBytesLayer) layer inside the limit (without
    /// one, the estimate is kept); settled when the response body ends. Pair it with
    /// the estimate [`HeaderCost::new(CONTENT_LENGTH, ..)`](crate::HeaderCost).
    #[must_use]
    pub fn request_bytes() -> Self {
        Self(Arc::new(Read::RequestBytes))
    }

    /// Whether the request's bytes are counted for it.
    pub(crate) fn counts_request(&self) -> bool {
        matches!(&*self.0, Read::RequestBytes)
    }

    /// The actual cost is what `read` says of the finished body, of which it sees the
    /// last `keep` bytes (all of a shorter one), its length and whether it ended
    /// normally ([`Finished`]). `None` keeps the estimate.
    ///
    /// `keep` bounds the memory a response holds for this: the body streams to the
    /// client as it comes, and only its last `keep` bytes are copied aside for `read`.
    /// Make it large enough for the part `read` needs (an OpenAI-style JSON answer puts
    /// `usage` at its end; a streamed answer, in its last event).
    ///
    /// ```
    /// use tower_redis_ratelimit::limit::Usage;
    ///
    /// // The `"total_tokens":N` of a JSON body (a real one would parse it), read from
    /// // the body's last 64 KiB.
    /// const KEEP: usize = 64 * 1024;
    /// let usage = Usage::body(KEEP, |body| {
    ///     let text = std::str::from_utf8(body.body()).ok()?;
    ///     let at = text.rfind("\"total_tokens\":")? + "\"total_tokens\":".len();
    ///     let digits: String = text[at..].chars().take_while(char::is_ascii_digit).collect();
    ///     digits.parse().ok()
    /// });
    /// # let _ = usage;
    /// ```
    #[must_use]
    pub fn body(
        keep: usize,
        read: impl Fn(&Finished<'_>) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        Self(Arc::new(Read::Body {
            keep,
            read: Box::new(read),
        }))
    }

    /// The body bytes a meter keeps.
    fn keep(&self) -> usize {
        match &*self.0 {
            Read::Body { keep, .. } => *keep,
            _ => 0,
        }
    }
}

impl fmt::Debug for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            Read::Header(name) => f.debug_tuple("Usage::header").field(name).finish(),
            Read::Trailer(name) => f.debug_tuple("Usage::trailer").field(name).finish(),
            Read::Bytes => f.write_str("Usage::bytes"),
            Read::RequestBytes => f.write_str("Usage::request_bytes"),
            Read::Body { keep, .. } => f.debug_tuple("Usage::body").field(keep).finish(),
        }
    }
}

/// A finished response body, as [`Usage::body`]'s closure sees it.
#[derive(Debug)]
pub struct Finished<'a> {
    body: &'a [u8],
    bytes: u64,
    complete: bool,
    trailers: Option<&'a HeaderMap>,
}

impl<'a> Finished<'a> {
    /// The body's last bytes (all of it when it is no longer than the closure keeps).
    #[must_use]
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// How many bytes the body produced in all.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the body ended normally (its last frame): `false` when it was dropped
    /// first (a client gone, a panic) or failed.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The body's trailers, if it sent any.
    #[must_use]
    pub fn trailers(&self) -> Option<&'a HeaderMap> {
        self.trailers
    }
}

/// A whole number in a header value.
fn number(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// What a [`Meter`] needs of its layer, without the layer's type parameters.
pub(crate) trait SettleUsage: Send + Sync + 'static {
    /// Settles an admitted request by `delta` units (one call of the limiter, in the
    /// background when it needs a round trip).
    fn settle_usage(&self, settle: &Settle, delta: i64);
}

/// What a response body being metered keeps to settle its request when it ends (or is
/// dropped): one per admitted request of a layer that settles.
pub(crate) struct Meter {
    layer: Arc<dyn SettleUsage>,
    /// `None` once settled.
    settle: Option<Settle>,
    usage: Usage,
    /// The actual cost read from the response's head ([`Usage::header`]).
    head: Option<u64>,
    bytes: u64,
    /// The body's last bytes, for [`Usage::body`] (up to twice `keep`, cut on append).
    kept: Vec<u8>,
    trailers: Option<HeaderMap>,
    /// A shadow layer's check still in flight: whether it admitted, once known.
    admitted: Option<oneshot::Receiver<bool>>,
}

impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter")
            .field("usage", &self.usage)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Meter {
    /// A meter for the admitted request `settle`, whose response has `headers`.
    pub(crate) fn new(
        layer: Arc<dyn SettleUsage>,
        mut settle: Settle,
        usage: Usage,
        headers: &HeaderMap,
    ) -> Self {
        let admitted = settle.admitted.take();
        let head = match &*usage.0 {
            Read::Header(name) => number(headers, name),
            _ => None,
        };
        Self {
            layer,
            settle: Some(settle),
            usage,
            head,
            bytes: 0,
            kept: Vec::new(),
            trailers: None,
            admitted,
        }
    }

    /// A data frame went out.
    pub(crate) fn data(&mut self, data: &Bytes) {
        self.bytes = self.bytes.saturating_add(data.len() as u64);
        let keep = self.usage.keep();
        if keep == 0 {
            return;
        }
        self.kept.extend_from_slice(data);
        // Cut to the last `keep` bytes once twice that is kept (amortized: each byte is
        // moved at most once).
        if self.kept.len() > keep.saturating_mul(2) {
            let cut = self.kept.len() - keep;
            self.kept.drain(..cut);
        }
    }

    /// The trailers frame went out.
    pub(crate) fn trailers(&mut self, trailers: &HeaderMap) {
        if matches!(&*self.usage.0, Read::Trailer(_) | Read::Body { .. }) {
            self.trailers = Some(trailers.clone());
        }
    }

    /// The body ended (`complete`: its last frame; otherwise an error, or dropped
    /// first): settles once.
    pub(crate) fn finish(&mut self, complete: bool) {
        let Some(settle) = self.settle.take() else {
            return;
        };
        let actual = match &*self.usage.0 {
            Read::Header(_) => self.head,
            Read::Trailer(name) => self.trailers.as_ref().and_then(|t| number(t, name)),
            Read::Bytes => Some(self.bytes),
            Read::RequestBytes => settle.request_bytes.as_ref().and_then(|b| b.read()),
            Read::Body { keep, read } => {
                let from = self.kept.len().saturating_sub(*keep);
                read(&Finished {
                    body: &self.kept[from..],
                    bytes: self.bytes,
                    complete,
                    trailers: self.trailers.as_ref(),
                })
            }
        };
        let Some(actual) = actual else {
            return;
        };
        let delta = i64::try_from(actual)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::from(settle.cost.get()));
        let layer = Arc::clone(&self.layer);
        match self.admitted.take() {
            None => layer.settle_usage(&settle, delta),
            Some(admitted) => {
                // A shadow layer's check still in flight: settle only what it admitted.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        if admitted.await == Ok(true) {
                            layer.settle_usage(&settle, delta);
                        }
                    });
                }
            }
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        // Dropped before its end: a client gone mid-stream, a panic, a body never
        // polled. Settles what was produced.
        self.finish(false);
    }
}
