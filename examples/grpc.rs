//! A tonic gRPC server with the standard health service (`grpc.health.v1.Health`, from
//! `tonic-health`, so no protoc is needed) behind a rate limit keyed by the `x-api-key`
//! metadata, or by the client's IP address without it. On Redis when `REDIS_URL` is set,
//! in-process otherwise.
//!
//! ```text
//! cargo run --example grpc --features grpc                                   # in-process
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example grpc --features grpc  # shared in Redis
//! ```
//!
//! Any standard health client works; with `grpc-health-probe`:
//!
//! ```text
//! for i in $(seq 7); do grpc-health-probe -addr 127.0.0.1:50051 -rpc-header x-api-key:demo; done
//! ```
//!
//! The first five calls within 30 seconds are `SERVING`; the next ones fail with
//! `ResourceExhausted` (gRPC status 8), whose details carry a `RetryInfo` with the time
//! left in the window and a `QuotaFailure` naming the policy. Another key is not
//! affected. `PORT` overrides the port (50051).

use std::net::SocketAddr;
use std::time::Duration;

use tonic::transport::server::TcpIncoming;
use tower_redis_ratelimit::key::{HeaderKey, PeerIp};
use tower_redis_ratelimit::{Backend, PeriodLimitLayer};

/// Calls per window and key: small enough to exhaust by hand.
pub const QUOTA: u64 = 5;
/// The window.
pub const PERIOD: Duration = Duration::from_secs(30);
/// The name of the limit, in the `ratelimit-policy` metadata and in the Redis keys.
pub const POLICY: &str = "grpc";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_redis_ratelimit=debug".into()),
        )
        .init();

    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("limits are kept in Redis at {url}");
            Backend::builder()
                .redis_url(url)
                .prefix("grpc-example")
                .build()?
        }
        Err(_) => {
            println!("REDIS_URL is not set: limits are kept in this process");
            Backend::in_process()
        }
    };
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse()?,
        Err(_) => 50051,
    };
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    println!(
        "serving grpc.health.v1.Health on {addr}: {QUOTA} calls per {}s per x-api-key\n\
         try: for i in $(seq 7); do grpc-health-probe -addr {addr} -rpc-header x-api-key:demo; done",
        PERIOD.as_secs()
    );
    serve(listener, &backend).await
}

/// Serves the health service on `listener`, limited on `backend`, until an error.
///
/// # Errors
///
/// An invalid limit configuration, or a transport error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    backend: &Backend,
) -> Result<(), Box<dyn std::error::Error>> {
    // gRPC metadata are HTTP/2 headers: `HeaderKey` reads `x-api-key` metadata.
    let limit = PeriodLimitLayer::builder(backend)
        .name(POLICY)
        .quota(QUOTA)
        .period(PERIOD)
        .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
        .build()?;
    // Reports SERVING for the whole server (service name "").
    let (_reporter, health) = tonic_health::server::health_reporter();
    tonic::transport::Server::builder()
        .layer(limit)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}
