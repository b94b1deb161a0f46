//! The HTTP answers: `429` as plain text ([`DefaultRejection`]) or problem+json
//! ([`ProblemJson`]), and the answer to a request without a key; gRPC calls are handed to
//! the `grpc` answers when that feature is on.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{HeaderMap, Response, StatusCode};

use super::rejection::{ceil_secs, OnRejection, Rejection};
use crate::decision::{Policy, State};

/// The default rejection: `429 Too Many Requests` with a one-line `text/plain` body.
///
/// A request whose cost can never fit (see [`State::ExceedsCapacity`]) gets the same
/// status with a body that says so, and no `Retry-After`. With the `grpc` feature, a
/// gRPC call gets a gRPC status instead (see [the gRPC guide](crate::guide::grpc)).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRejection;

impl OnRejection for DefaultRejection {
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<Bytes> {
        #[cfg(feature = "grpc")]
        if super::grpc::is_grpc(rejection.headers) {
            return super::grpc::rejection(rejection);
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
/// With the `grpc` feature, a gRPC call gets a gRPC status instead (see
/// [the gRPC guide](crate::guide::grpc)).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

impl OnRejection for ProblemJson {
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<Bytes> {
        #[cfg(feature = "grpc")]
        if super::grpc::is_grpc(rejection.headers) {
            return super::grpc::rejection(rejection);
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
        problem(StatusCode::TOO_MANY_REQUESTS, body.freeze())
    }

    /// A missing key as `application/problem+json` with the layer's status.
    fn on_missing_key(
        &self,
        status: StatusCode,
        policy: &Policy,
        request: &http::request::Parts,
    ) -> Option<Response<Bytes>> {
        #[cfg(feature = "grpc")]
        if super::grpc::is_grpc(&request.headers) {
            return Some(super::grpc::missing_key(status));
        }
        #[cfg(not(feature = "grpc"))]
        let _ = request;
        let mut body = BytesMut::with_capacity(160);
        body.put_slice(br#"{"type":"about:blank","title":"Missing Rate-Limit Key","status":"#);
        body.put_slice(itoa::Buffer::new().format(status.as_u16()).as_bytes());
        body.put_slice(br#","detail":"the request carries nothing to limit it by","policy":""#);
        body.put_slice(policy.name().as_bytes());
        body.put_slice(b"\"}\n");
        Some(problem(status, body.freeze()))
    }
}

/// An `application/problem+json` response.
fn problem(status: StatusCode, body: Bytes) -> Response<Bytes> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
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
    if super::grpc::is_grpc(headers) {
        return super::grpc::missing_key(status);
    }
    #[cfg(not(feature = "grpc"))]
    let _ = headers;
    plain(status, "missing rate-limit key\n")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Method, Uri};

    use super::*;
    use crate::decision::{Decision, Source};

    #[test]
    fn problem_json_body() {
        let policy = Policy::new("api", 5, Duration::from_secs(1));
        let wait = Duration::from_millis(900);
        let d =
            Decision::new(State::OverQuota, 5, 0, wait, Source::InProcess).with_retry_after(wait);
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
