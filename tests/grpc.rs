//! gRPC end to end: the `grpc` example (a tonic health server behind a limit keyed by
//! the client an authentication interceptor found in the `x-api-key` metadata) on a loopback port, driven by a real tonic client, with the
//! limit in-process and in a real `redis-server`.
#![cfg(feature = "grpc")]

mod support;

#[path = "../examples/grpc.rs"]
#[allow(dead_code, unreachable_pub)]
mod example;

use std::net::SocketAddr;
use std::time::Duration;

use support::http::{RATELIMIT, RATELIMIT_POLICY};
use support::RedisServer;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::{Backend, MissingKey};
use tower_redis_ratelimit::{LimitLayer, TokenBucketConfig};

/// Starts the example's server on a free loopback port.
async fn start_example(backend: Backend) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        example::serve(listener, &backend).await.unwrap();
    });
    addr
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

fn check(api_key: Option<&'static str>) -> Request<HealthCheckRequest> {
    let mut request = Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(key) = api_key {
        request
            .metadata_mut()
            .insert("x-api-key", MetadataValue::from_static(key));
    }
    request
}

fn metadata<'a>(metadata: &'a tonic::metadata::MetadataMap, name: &str) -> &'a str {
    metadata
        .get(name)
        .unwrap_or_else(|| panic!("no {name} metadata"))
        .to_str()
        .unwrap()
}

/// The quota's worth of calls succeed with the rate-limit metadata, the next one is
/// `RESOURCE_EXHAUSTED` with `RetryInfo` and `QuotaFailure`, another key is fine.
async fn quota_then_resource_exhausted(backend: Backend) {
    let addr = start_example(backend).await;
    let mut health = client(addr).await;
    for remaining in (0..example::QUOTA).rev() {
        let response = health.check(check(Some("alice"))).await.unwrap();
        assert_eq!(response.get_ref().status(), ServingStatus::Serving);
        assert_eq!(
            metadata(response.metadata(), RATELIMIT_POLICY.as_str()),
            "\"grpc\";q=5;w=30"
        );
        assert!(
            metadata(response.metadata(), RATELIMIT.as_str())
                .starts_with(&format!("\"grpc\";r={remaining};t=")),
            "{:?}",
            response.metadata()
        );
    }
    let status: Status = health.check(check(Some("alice"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "rate limit \"grpc\" exceeded");
    let delay = status
        .get_details_retry_info()
        .expect("RetryInfo in grpc-status-details-bin")
        .retry_delay
        .expect("a retry delay");
    assert!(
        delay > Duration::ZERO && delay <= example::PERIOD,
        "{delay:?}"
    );
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "grpc");
    // The HTTP rate-limit headers come along as metadata of the status.
    assert!(metadata(status.metadata(), RATELIMIT.as_str()).starts_with("\"grpc\";r=0;t="));
    let retry: u64 = metadata(status.metadata(), "retry-after").parse().unwrap();
    assert!((1..=30).contains(&retry), "{retry}");

    // Another key, and a call without one (keyed by the peer address), are unaffected.
    let ok = health.check(check(Some("bob"))).await.unwrap();
    assert_eq!(ok.get_ref().status(), ServingStatus::Serving);
    let ok = health.check(check(None)).await.unwrap();
    assert!(metadata(ok.metadata(), RATELIMIT.as_str()).starts_with("\"grpc\";r=4;t="));
}

#[tokio::test]
async fn example_in_process_quota_then_resource_exhausted() {
    quota_then_resource_exhausted(Backend::in_process()).await;
}

#[tokio::test]
async fn example_on_redis_quota_then_resource_exhausted() {
    let redis = RedisServer::start();
    quota_then_resource_exhausted(redis.backend()).await;
    assert_eq!(
        redis.cmd(&["GET", "ratelimit:{v1:ext:client:alice}:period:grpc"]),
        "5",
        "the count lives in redis, and the refused call was not counted"
    );
}

/// Any layer works on a tonic server; a call without a key gets the gRPC code of the
/// missing-key status, and the inner service is not reached.
#[tokio::test]
async fn token_bucket_on_tonic_and_missing_key_as_grpc_status() {
    let limit = LimitLayer::builder(
        &Backend::in_process(),
        TokenBucketConfig::new(1, Duration::from_secs(3_600), 2),
    )
    .name("bucket")
    .key(HeaderKey::from_static("x-api-key"))
    .on_missing_key(MissingKey::Reject(http::StatusCode::UNAUTHORIZED))
    .build()
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, service) = tonic_health::server::health_reporter();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(limit)
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let mut health = client(addr).await;
    let status = health.check(check(None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(status.message(), "missing rate-limit key");
    for _ in 0..2 {
        health.check(check(Some("k"))).await.unwrap();
    }
    let status = health.check(check(Some("k"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let delay = status
        .get_details_retry_info()
        .unwrap()
        .retry_delay
        .unwrap();
    // One token per hour: the next one is about an hour away.
    assert!(delay > Duration::from_secs(3_500), "{delay:?}");
}
