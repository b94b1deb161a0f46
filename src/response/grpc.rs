//! gRPC rejections (feature `grpc`); the docs are on [`GrpcRejection`].

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Response, StatusCode};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::rejection::{ceil_secs, OnRejection, Rejection};
use crate::decision::State;

/// Whether a request is a gRPC call: its `content-type` starts with `application/grpc`
/// (`application/grpc`, `application/grpc+proto`, `application/grpc-web`, ...).
#[must_use]
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// gRPC: the same layers on a tonic server, refusing calls the gRPC way (feature `grpc`).
///
/// A gRPC call is an HTTP/2 request whose `content-type` starts with `application/grpc`,
/// so every layer of this crate wraps a tonic server as it wraps an axum router:
/// `tonic::transport::Server::builder().layer(limit).add_service(..)`. Keys come from the
/// call's metadata, which is its HTTP/2 headers: [`HeaderKey`](crate::key::HeaderKey)
/// reads `x-api-key` metadata as it reads an `x-api-key` header.
///
/// With this feature, the built-in rejections ([`DefaultRejection`](crate::DefaultRejection)
/// and [`ProblemJson`](crate::ProblemJson)) answer gRPC calls with [`GrpcRejection`]
/// instead of an HTTP 429, which a gRPC client could only report as a transport error:
///
/// - HTTP 200, *trailers-only* (the status travels in the response headers, with no
///   body), `content-type: application/grpc`;
/// - `grpc-status: 8` (`RESOURCE_EXHAUSTED`) and a `grpc-message`;
/// - `grpc-status-details-bin`: a `google.rpc.Status` carrying a `google.rpc.RetryInfo`
///   with the retry delay (omitted when waiting cannot help, see
///   [`State::ExceedsCapacity`]) and a `google.rpc.QuotaFailure` naming the policy;
/// - the `RateLimit-Policy`, `RateLimit` and `Retry-After` headers, as extra metadata.
///
/// A call without a usable key gets the gRPC code matching the layer's
/// [`MissingKey::Reject`](crate::MissingKey::Reject) status (`400` becomes
/// `INVALID_ARGUMENT`, `401` `UNAUTHENTICATED`, `403` `PERMISSION_DENIED`, `429`
/// `RESOURCE_EXHAUSTED`, `503` `UNAVAILABLE`, anything else `UNKNOWN`). Admitted calls
/// carry `RateLimit-Policy` and `RateLimit` as initial metadata.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = PeriodConfig::new(100, Duration::from_secs(60));
/// let limit = LimitLayer::builder(&Backend::in_process(), config)
///     .name("grpc")
///     .key(HeaderKey::from_static("x-api-key"))
///     .build()?;
/// let (_reporter, health) = tonic_health::server::health_reporter();
/// let router = tonic::transport::Server::builder()
///     .layer(limit)
///     .add_service(health);
/// // router.serve("127.0.0.1:50051".parse()?).await?;
/// # let _ = router; Ok(()) }
/// ```
///
/// A client reads the details with `tonic_types::StatusExt`:
///
/// ```
/// use std::time::Duration;
/// use tonic_types::StatusExt;
///
/// fn backoff(status: &tonic::Status) -> Option<Duration> {
///     if status.code() != tonic::Code::ResourceExhausted {
///         return None;
///     }
///     status.get_details_retry_info()?.retry_delay
/// }
/// # let _ = backoff;
/// ```
///
/// A rejection as a gRPC status: `RESOURCE_EXHAUSTED`, trailers-only, with `RetryInfo`
/// and `QuotaFailure` details.
///
/// The built-in rejections use it for gRPC calls already; use it directly on a layer
/// that only serves gRPC, or inside your own [`OnRejection`] for gRPC calls.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{
///     key::GlobalKey, Backend, GrpcRejection, LimitLayer, TokenBucketConfig,
/// };
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let config = TokenBucketConfig::new(50, Duration::from_secs(1), 10);
/// let limit = LimitLayer::builder(&Backend::in_process(), config)
///     .name("rpc")
///     .key(GlobalKey)
///     .on_rejection(GrpcRejection)
///     .build()?;
/// # let _ = limit; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcRejection;

impl OnRejection for GrpcRejection {
    fn on_rejection(&self, rejection: &Rejection<'_>) -> Response<Bytes> {
        let policy = rejection.policy;
        let decision = rejection.decision;
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
        Status::with_error_details(Code::ResourceExhausted, message, details).into_http()
    }
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
        GrpcRejection.on_rejection(&Rejection {
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
