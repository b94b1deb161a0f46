//! What clients see: the rejection response and the `RateLimit` headers.
//!
//! Rejections are `429 Too Many Requests` by default ([`DefaultRejection`]); swap in
//! [`ProblemJson`] or any closure that turns a [`Rejection`] into a response. With the
//! `grpc` feature both built-in rejections answer gRPC calls with a gRPC status instead
//! (see the `grpc` module). Whatever the response, the service adds `Retry-After`
//! (when waiting helps) and the IETF draft headers
//! `RateLimit-Policy: "name";q=<quota>;w=<seconds>` and
//! `RateLimit: "name";r=<remaining>;t=<seconds>`.
//!
//! # Stacked limits
//!
//! When several layers limit one request, each adds its policy to the same two headers,
//! which then hold one list item per policy, outermost layer first:
//!
//! ```text
//! RateLimit-Policy: "burst";q=10;w=1, "daily";q=1000;w=86400
//! RateLimit: "burst";r=9;t=1, "daily";r=998;t=51840
//! ```
//!
//! A request refused by an outer layer never reaches the inner ones, so its headers
//! list the outer policies only; `Retry-After` holds the longest wait of the refusing
//! policies. See [the guide](crate::guide#stacked-limits) for which limit to put
//! outermost.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Response, StatusCode, Uri};

use crate::decision::{Decision, Policy, State};

/// The `RateLimit` header (IETF draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The `RateLimit-Policy` header (IETF draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

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

/// The default rejection: `429 Too Many Requests` with a one-line `text/plain` body.
///
/// A request whose cost can never fit (see [`State::ExceedsCapacity`]) gets the same
/// status with a body that says so, and no `Retry-After`. With the `grpc` feature, a
/// gRPC call gets `grpc::GrpcRejection` instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRejection;

impl OnRejection for DefaultRejection {
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<Bytes> {
        #[cfg(feature = "grpc")]
        if crate::grpc::is_grpc(rejection.headers) {
            return crate::grpc::GrpcRejection.on_rejection(rejection);
        }
        let body: &'static str = match rejection.decision.state {
            State::ExceedsCapacity => "request cost exceeds the rate limit's capacity\n",
            _ => "too many requests\n",
        };
        plain(StatusCode::TOO_MANY_REQUESTS, body)
    }
}

/// A rejection as RFC 9457 `application/problem+json`, status 429.
///
/// With the `grpc` feature, a gRPC call gets `grpc::GrpcRejection` instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

impl OnRejection for ProblemJson {
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<Bytes> {
        #[cfg(feature = "grpc")]
        if crate::grpc::is_grpc(rejection.headers) {
            return crate::grpc::GrpcRejection.on_rejection(rejection);
        }
        let (title, detail) = match rejection.decision.state {
            State::ExceedsCapacity => (
                "Request Too Costly",
                "the request costs more than the rate limit can ever admit",
            ),
            _ => ("Too Many Requests", "the rate limit is exhausted"),
        };
        let mut body = BytesMut::with_capacity(192);
        body.put_slice(br#"{"type":"about:blank","title":""#);
        body.put_slice(title.as_bytes());
        body.put_slice(br#"","status":429,"detail":""#);
        body.put_slice(detail.as_bytes());
        body.put_slice(br#"","policy":""#);
        // Policy names are checked when built: no quotes, backslashes or controls.
        body.put_slice(rejection.policy.name().as_bytes());
        body.put_slice(b"\"");
        if let Some(retry) = rejection.decision.retry_after {
            body.put_slice(b",\"retry_after\":");
            body.put_slice(itoa::Buffer::new().format(ceil_secs(retry)).as_bytes());
        }
        body.put_slice(b"}\n");
        let mut response = Response::new(body.freeze());
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

/// A short `text/plain` response.
pub(crate) fn plain(status: StatusCode, body: &'static str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from_static(body.as_bytes()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The answer to a request without a usable key: a short `text/plain` response with
/// `status`, or with the `grpc` feature the matching gRPC status for a gRPC call.
pub(crate) fn missing_key(status: StatusCode, headers: &HeaderMap) -> Response<Bytes> {
    #[cfg(feature = "grpc")]
    if crate::grpc::is_grpc(headers) {
        return crate::grpc::missing_key(status);
    }
    #[cfg(not(feature = "grpc"))]
    let _ = headers;
    plain(status, "missing rate-limit key\n")
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The `RateLimit-Policy` value of a policy; built once per layer.
pub(crate) fn policy_header(policy: &Policy) -> HeaderValue {
    let mut buf = itoa::Buffer::new();
    let mut v = String::with_capacity(policy.name().len() + 24);
    v.push('"');
    v.push_str(policy.name());
    v.push_str("\";q=");
    v.push_str(buf.format(policy.quota()));
    v.push_str(";w=");
    v.push_str(buf.format(ceil_secs(policy.window()).max(1)));
    HeaderValue::try_from(v).expect("policy names are checked when the layer is built")
}

/// Pre-built pieces of the per-response headers of one policy.
#[derive(Debug, Clone)]
pub(crate) struct HeaderParts {
    policy: HeaderValue,
    /// `"name";r=`
    ratelimit_prefix: Bytes,
}

impl HeaderParts {
    pub(crate) fn new(policy: &Policy) -> Self {
        let mut prefix = BytesMut::with_capacity(policy.name().len() + 5);
        prefix.put_u8(b'"');
        prefix.put_slice(policy.name().as_bytes());
        prefix.put_slice(b"\";r=");
        Self {
            policy: policy_header(policy),
            ratelimit_prefix: prefix.freeze(),
        }
    }

    /// Adds this policy to `RateLimit-Policy` and `RateLimit` (and `Retry-After` for a
    /// rejection that can be retried). Values already there (from inner layers, a
    /// handler, or a custom rejection) are kept: this policy goes first in the list, so
    /// stacked layers read outermost first.
    pub(crate) fn apply(&self, headers: &mut HeaderMap, decision: &Decision) {
        let mut num = itoa::Buffer::new();
        let mut v = BytesMut::with_capacity(self.ratelimit_prefix.len() + 24);
        v.put_slice(&self.ratelimit_prefix);
        v.put_slice(num.format(decision.remaining).as_bytes());
        v.put_slice(b";t=");
        v.put_slice(num.format(ceil_secs(decision.reset)).as_bytes());
        let policy = decision.policy_header.as_ref().unwrap_or(&self.policy);
        prepend(headers, RATELIMIT_POLICY, policy.clone());
        if let Ok(value) = HeaderValue::from_maybe_shared(v.freeze()) {
            prepend(headers, RATELIMIT, value);
        }
        if let Some(retry) = decision.retry_after {
            if !decision.is_admitted() {
                let secs = ceil_secs(retry).max(1);
                let new = HeaderValue::from(secs);
                // Stacked limits: the longest wait wins.
                let keep = headers
                    .get(header::RETRY_AFTER)
                    .and_then(|old| old.to_str().ok()?.parse::<u64>().ok())
                    .is_some_and(|old| old >= secs);
                if !keep {
                    headers.insert(header::RETRY_AFTER, new);
                }
            }
        }
    }
}

/// Puts `value` first in the list header `name`: one field line holding `value` and
/// then every value already there, comma-separated (one list, as RFC 9110 reads several
/// lines of a list header, but one line for clients that read only the first).
fn prepend(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
    match headers.entry(name) {
        header::Entry::Vacant(entry) => {
            entry.insert(value);
        }
        header::Entry::Occupied(mut entry) => {
            let len = entry.iter().map(|v| v.len() + 2).sum::<usize>();
            let mut joined = BytesMut::with_capacity(value.len() + len);
            joined.put_slice(value.as_bytes());
            for old in entry.iter() {
                joined.put_slice(b", ");
                joined.put_slice(old.as_bytes());
            }
            if let Ok(joined) = HeaderValue::from_maybe_shared(joined.freeze()) {
                entry.insert(joined);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Source;

    fn decision(state: State, remaining: u64, reset_ms: u64) -> Decision {
        Decision::new(
            state,
            5,
            remaining,
            Duration::from_millis(reset_ms),
            Source::InProcess,
        )
    }

    #[test]
    fn draft_ten_header_format() {
        let policy = Policy::new("sms", 5, Duration::from_secs(86_400));
        let parts = HeaderParts::new(&policy);
        let mut headers = HeaderMap::new();
        parts.apply(&mut headers, &decision(State::Allowed, 3, 1_500));
        assert_eq!(headers[RATELIMIT_POLICY], "\"sms\";q=5;w=86400");
        assert_eq!(headers[RATELIMIT], "\"sms\";r=3;t=2");
        assert!(headers.get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn retry_after_rounds_up_and_keeps_the_longest() {
        let policy = Policy::new("p", 5, Duration::from_millis(300));
        let parts = HeaderParts::new(&policy);
        assert_eq!(policy_header(&policy), "\"p\";q=5;w=1");
        let mut headers = HeaderMap::new();
        headers.insert(header::RETRY_AFTER, HeaderValue::from(7u64));
        let d = decision(State::OverQuota, 0, 200).with_retry_after(Duration::from_millis(200));
        parts.apply(&mut headers, &d);
        assert_eq!(headers[header::RETRY_AFTER], "7");
        let mut headers = HeaderMap::new();
        parts.apply(&mut headers, &d);
        assert_eq!(headers[header::RETRY_AFTER], "1");
        assert_eq!(headers[RATELIMIT], "\"p\";r=0;t=1");
    }

    #[test]
    fn stacked_policies_share_one_list_outermost_first() {
        let burst = HeaderParts::new(&Policy::new("burst", 10, Duration::from_secs(1)));
        let daily = HeaderParts::new(&Policy::new("daily", 1_000, Duration::from_secs(86_400)));
        let mut headers = HeaderMap::new();
        // The inner layer (daily) decorates first, then the outer one (burst).
        daily.apply(&mut headers, &decision(State::Allowed, 998, 51_840_000));
        burst.apply(&mut headers, &decision(State::Allowed, 9, 1_000));
        assert_eq!(headers.get_all(RATELIMIT_POLICY).iter().count(), 1);
        assert_eq!(
            headers[RATELIMIT_POLICY],
            "\"burst\";q=10;w=1, \"daily\";q=1000;w=86400"
        );
        assert_eq!(
            headers[RATELIMIT],
            "\"burst\";r=5;t=1, \"daily\";r=5;t=51840"
        );
    }

    #[test]
    fn problem_json_body() {
        let policy = Policy::new("api", 5, Duration::from_secs(1));
        let d = decision(State::OverQuota, 0, 900).with_retry_after(Duration::from_millis(900));
        let headers = HeaderMap::new();
        let r = Rejection {
            decision: &d,
            policy: &policy,
            method: &Method::GET,
            uri: &Uri::from_static("/"),
            headers: &headers,
        };
        let resp = ProblemJson.on_rejection(&r);
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        let body = std::str::from_utf8(resp.body()).unwrap();
        assert!(body.contains("\"retry_after\":1"), "{body}");
        assert!(body.contains("\"policy\":\"api\""), "{body}");
    }
}
