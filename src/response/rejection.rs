//! What a rejection handler sees ([`Rejection`]) and the trait it implements
//! ([`OnRejection`]).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, Uri};

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

/// Builds the response for a rejected request: what clients see.
///
/// Rejections are `429 Too Many Requests` by default ([`DefaultRejection`](crate::DefaultRejection)); swap in
/// [`ProblemJson`](crate::ProblemJson) or any closure that turns a [`Rejection`] into a response. With the
/// `grpc` feature both built-in rejections answer gRPC calls with a gRPC status instead
/// (see [the gRPC guide](crate::guide::grpc)). Whatever the response, the service adds `Retry-After`
/// (when waiting helps) and the IETF draft headers
/// `RateLimit-Policy: "name";q=<quota>;w=<seconds>` and
/// `RateLimit: "name";r=<remaining>;t=<seconds>`.
///
/// # Stacked limits
///
/// When several layers limit one request, each adds its policy to the same two headers,
/// which then hold one list item per policy, outermost layer first:
///
/// ```text
/// RateLimit-Policy: "burst";q=10;w=1, "daily";q=1000;w=86400
/// RateLimit: "burst";r=9;t=1, "daily";r=998;t=51840
/// ```
///
/// A request refused by an outer layer never reaches the inner ones, so its headers
/// list the outer policies only; `Retry-After` holds the longest wait of the refusing
/// policies. See [the guide](crate::guide::stacking#stacked-limits) for which limit to put
/// outermost.
///
/// Implemented for closures `Fn(&Rejection<'_>) -> Response<Bytes>`. The service adds the
/// rate-limit headers afterwards, so a handler only decides status and body.
///
/// A request without a usable key that the layer refuses is answered by
/// [`on_missing_key`](Self::on_missing_key) when it returns a response, else by default
/// with a short `text/plain` body and the layer's status (a gRPC status for a gRPC call
/// with the `grpc` feature); implement it to answer in your API's own shape (as
/// [`ProblemJson`](crate::ProblemJson) does).
///
/// ```
/// use bytes::Bytes;
/// use http::{Response, StatusCode};
/// use tower_redis_ratelimit::Rejection;
///
/// let json = |r: &Rejection<'_>| {
///     let body = format!(r#"{{"error":"slow down","policy":"{}"}}"#, r.policy.name());
///     Response::builder()
///         .status(StatusCode::TOO_MANY_REQUESTS)
///         .header("content-type", "application/json")
///         .body(Bytes::from(body))
///         .unwrap()
/// };
/// # fn takes<R: tower_redis_ratelimit::OnRejection>(_: R) {}
/// # takes(json);
/// ```
pub trait OnRejection: Send + Sync + 'static {
    /// The response sent instead of calling the inner service.
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<Bytes>;

    /// The response to a request refused because no key could be taken from it (see
    /// [`MissingKey::Reject`](crate::MissingKey::Reject)): `status` is the layer's,
    /// `policy` the limit whose key is missing and `request` the request's head. No
    /// rate-limit headers are added (no limit was checked); `None` (the default) for the
    /// default answer.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::Response;
    /// use http::{request::Parts, StatusCode};
    /// use tower_redis_ratelimit::{OnRejection, Policy, Rejection};
    ///
    /// struct Json;
    ///
    /// impl OnRejection for Json {
    ///     fn on_rejection(&self, _: &Rejection<'_>) -> Response<Bytes> {
    ///         let body = Bytes::from_static(br#"{"error":"slow down"}"#);
    ///         Response::builder().status(429).body(body).unwrap()
    ///     }
    ///
    ///     fn on_missing_key(
    ///         &self,
    ///         status: StatusCode,
    ///         _policy: &Policy,
    ///         _request: &Parts,
    ///     ) -> Option<Response<Bytes>> {
    ///         let body = Bytes::from_static(br#"{"error":"send your API key"}"#);
    ///         Some(Response::builder().status(status).body(body).unwrap())
    ///     }
    /// }
    /// ```
    fn on_missing_key(
        &self,
        status: StatusCode,
        policy: &Policy,
        request: &http::request::Parts,
    ) -> Option<Response<Bytes>> {
        let _ = (status, policy, request);
        None
    }
}

impl<F> OnRejection for F
where
    F: Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
{
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<Bytes> {
        self(rejection)
    }
}

/// Whole seconds, rounded up (`u64::MAX` for the longest durations, which a lockout or
/// a block of `Duration::MAX` gives: found by the `ratelimit_headers` fuzz target).
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}
