//! What a rejection handler sees ([`Rejection`]) and the trait it implements
//! ([`OnRejection`]).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, Uri};

use crate::decision::{Decision, Policy};

/// A rejected request, as seen by an [`OnRejection`] handler.
#[derive(Debug)]
#[non_exhaustive]
pub struct Rejection<'a> {
    /// The decision that rejected the request.
    pub decision: &'a Decision,
    /// The policy that was exceeded.
    pub policy: &'a Policy,
    /// The request's method.
    pub method: &'a Method,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's headers (for content negotiation).
    pub headers: &'a HeaderMap,
}

/// Builds the response for a rejected request.
///
/// Implemented for closures `Fn(&Rejection<'_>) -> Response<Bytes>`. The service adds the
/// rate-limit headers afterwards, so a handler only decides status and body.
///
/// ```
/// use bytes::Bytes;
/// use http::{Response, StatusCode};
/// use tower_redis_ratelimit::response::Rejection;
///
/// let json = |r: &Rejection<'_>| {
///     let body = format!(r#"{{"error":"slow down","policy":"{}"}}"#, r.policy.name());
///     Response::builder()
///         .status(StatusCode::TOO_MANY_REQUESTS)
///         .header("content-type", "application/json")
///         .body(Bytes::from(body))
///         .unwrap()
/// };
/// # fn takes<R: tower_redis_ratelimit::response::OnRejection>(_: R) {}
/// # takes(json);
/// ```
pub trait OnRejection: Send + Sync + 'static {
    /// The response sent instead of calling the inner service.
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<Bytes>;
}

impl<F> OnRejection for F
where
    F: Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
{
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<Bytes> {
        self(rejection)
    }
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
