//! gRPC rejections (feature `grpc`): what the built-in rejections answer a gRPC call;
//! the wire format is in [the gRPC guide](crate::guide::grpc).

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Response, StatusCode};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::rejection::{ceil_secs, Rejection};
use crate::decision::{Decision, Policy, State};

/// Whether a request is a gRPC call: its `content-type` starts with `application/grpc`
/// (`application/grpc`, `application/grpc+proto`, `application/grpc-web`, ...).
#[must_use]
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A rejection as a gRPC status: `RESOURCE_EXHAUSTED`, trailers-only, with `RetryInfo`
/// and `QuotaFailure` details (the wire format is in [the gRPC guide](crate::guide::grpc)).
pub(crate) fn rejection(rejection: &Rejection<'_>) -> Response<Bytes> {
    status(rejection.policy, rejection.decision).into_http()
}

/// The gRPC status of `decision`, a refusal under `policy`: `RESOURCE_EXHAUSTED` with
/// `RetryInfo` and `QuotaFailure` details.
pub(crate) fn status(policy: &Policy, decision: &Decision) -> Status {
    let window = ceil_secs(policy.window()).max(1);
    let (message, retry) = match decision.state {
        State::ExceedsCapacity => (
            format!(
                "request cost exceeds the capacity of rate limit \"{}\"",
                policy.name()
            ),
            None,
        ),
        _ => (
            format!("rate limit \"{}\" exceeded", policy.name()),
            decision.retry_after,
        ),
    };
    let mut details = ErrorDetails::new();
    if let Some(retry) = retry {
        details.set_retry_info(Some(retry));
    }
    details.add_quota_failure_violation(
        policy.name(),
        format!("at most {} units per {window}s", policy.quota()),
    );
    Status::with_error_details(Code::ResourceExhausted, message, details)
}

/// A trailers-only gRPC status for a call without a usable key, mapped from the HTTP
/// status the layer would answer.
pub(crate) fn missing_key(status: StatusCode) -> Response<Bytes> {
    let code = match status {
        StatusCode::BAD_REQUEST => Code::InvalidArgument,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
        StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, "missing rate-limit key").into_http()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Method, Uri};

    use super::*;
    use crate::decision::{Decision, Policy, Source};

    fn reject(decision: &Decision) -> Response<Bytes> {
        let policy = Policy::new("api", 5, Duration::from_secs(60));
        let headers = HeaderMap::new();
        rejection(&Rejection {
            decision,
            policy: &policy,
            method: &Method::POST,
            uri: &Uri::from_static("/grpc.health.v1.Health/Check"),
            headers: &headers,
        })
    }

    #[test]
    fn trailers_only_resource_exhausted_with_details() {
        let d = Decision::new(
            State::OverQuota,
            5,
            0,
            Duration::from_secs(30),
            Source::InProcess,
        )
        .with_retry_after(Duration::from_millis(1_500));
        let response = reject(&d);
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.body().is_empty());
        assert!(is_grpc(response.headers()));
        let status = Status::from_header_map(response.headers()).unwrap();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), "rate limit \"api\" exceeded");
        let details = status.get_error_details();
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_millis(1_500))
        );
        let quota = details.quota_failure().unwrap();
        assert_eq!(quota.violations[0].subject, "api");
        assert_eq!(quota.violations[0].description, "at most 5 units per 60s");
    }

    #[test]
    fn no_retry_info_when_waiting_cannot_help() {
        let d = Decision::new(
            State::ExceedsCapacity,
            5,
            0,
            Duration::from_secs(60),
            Source::InProcess,
        );
        let status = Status::from_header_map(reject(&d).headers()).unwrap();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.get_details_retry_info().is_none());
        assert!(status.get_details_quota_failure().is_some());
    }

    #[test]
    fn missing_keys_map_to_grpc_codes() {
        let code = |s| {
            Status::from_header_map(missing_key(s).headers())
                .unwrap()
                .code()
        };
        assert_eq!(code(StatusCode::BAD_REQUEST), Code::InvalidArgument);
        assert_eq!(code(StatusCode::UNAUTHORIZED), Code::Unauthenticated);
        assert_eq!(code(StatusCode::IM_A_TEAPOT), Code::Unknown);
    }
}
