//! The one generic rate-limit service every layer builds: extract a key, ask the
//! limiter, then call the inner service or answer the rejection.
//!
//! [`RateLimitLayer`] is built by a [`LayerBuilder`] (`PeriodLimitLayer::builder`,
//! `TokenBucketLayer::builder`, `RollingWindowLayer::builder`) and wraps services in
//! [`RateLimit`], whose future is [`ResponseFuture`]. `poll_ready` only delegates: the
//! limit is decided per request, in the future, never by refusing readiness.

mod body;
mod future;
mod layer;
#[allow(clippy::module_inception)]
mod service;

use std::borrow::Cow;

use bytes::Bytes;
use http::{Response, StatusCode};

use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::response::{HeaderParts, OnRejection, Rejection};

pub use self::body::ResponseBody;
pub use self::future::ResponseFuture;
pub use self::layer::{Algorithm, LayerBuilder, RateLimitLayer};
pub use self::service::RateLimit;

/// What happens to a request whose key cannot be extracted (or is longer than
/// [`LayerBuilder::max_key_len`]).
///
/// The default is [`MissingKey::Reject`] with `400 Bad Request`: a request that cannot be
/// told apart from others is neither limited by accident against someone else's key nor
/// let through unlimited.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with this status (and a short text body) without calling the inner service.
    Reject(StatusCode),
    /// Let the request through without limiting it.
    Allow,
    /// Limit the request under this key instead (all such requests share it).
    Key(Cow<'static, str>),
}

impl Default for MissingKey {
    fn default() -> Self {
        Self::Reject(StatusCode::BAD_REQUEST)
    }
}

/// Everything the service and its futures share, built once per layer.
pub(crate) struct Shared<L, K, C, R> {
    pub(crate) limiter: L,
    pub(crate) key: K,
    pub(crate) cost: C,
    pub(crate) rejection: R,
    pub(crate) headers: HeaderParts,
    pub(crate) admitted_headers: bool,
    pub(crate) missing_key: MissingKey,
    pub(crate) max_key_len: usize,
}

/// The part of [`Shared`] a response future needs, without its type parameters.
pub(crate) trait Respond: Send + Sync + 'static {
    /// The full rejection response (handler's response plus headers).
    fn reject(
        &self,
        method: &http::Method,
        uri: &http::Uri,
        headers: &http::HeaderMap,
        decision: &Decision,
    ) -> Response<Bytes>;
    /// Adds the rate-limit headers to an admitted response.
    fn decorate(&self, headers: &mut http::HeaderMap, decision: &Decision);
}

impl<L, K, C, R> Respond for Shared<L, K, C, R>
where
    L: Limiter,
    K: Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: OnRejection,
{
    fn reject(
        &self,
        method: &http::Method,
        uri: &http::Uri,
        headers: &http::HeaderMap,
        decision: &Decision,
    ) -> Response<Bytes> {
        let mut response = self.rejection.on_rejection(&Rejection {
            decision,
            policy: self.limiter.policy(),
            method,
            uri,
            headers,
        });
        self.headers.apply(response.headers_mut(), decision);
        response
    }

    fn decorate(&self, headers: &mut http::HeaderMap, decision: &Decision) {
        if self.admitted_headers {
            self.headers.apply(headers, decision);
        }
    }
}
