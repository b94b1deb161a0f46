//! A tonic gRPC server with the standard health service (`grpc.health.v1.Health`, from
//! `tonic-health`, so no protoc is needed) behind a rate limit keyed by the client that
//! an authentication interceptor found in the `x-api-key` metadata, or by the client's
//! IP address without one. On Redis when `REDIS_URL` is set, in-process otherwise.
//!
//! Authentication goes *before* the limit: a tonic interceptor that puts the client into
//! the request extensions is added as a server layer (`InterceptorLayer`) ahead of the
//! limit, never with `with_interceptor(service, auth)`, which wraps only the service and
//! so runs after every server layer (the limit would find no client in any call, and
//! refuse them all with `INVALID_ARGUMENT` and a `warn` log line).
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

use tonic::service::InterceptorLayer;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Status};
use tower_redis_ratelimit::key::{ExtensionKey, KeyExtractor, PeerIp};
use tower_redis_ratelimit::Backend;
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

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

/// The client an authenticated call comes from, put into the request extensions by
/// [`authenticate`].
#[derive(Clone, Debug)]
pub struct Client(pub String);

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The authentication interceptor: a call with an `x-api-key` names its client (a real
/// service would look the key up and refuse unknown ones with `UNAUTHENTICATED`); a call
/// without one goes on anonymously, limited per address.
#[allow(clippy::result_large_err)]
pub fn authenticate(mut request: Request<()>) -> Result<Request<()>, Status> {
    let client = match request.metadata().get("x-api-key") {
        Some(key) => Some(Client(
            key.to_str()
                .map_err(|_| Status::unauthenticated("x-api-key is not ASCII"))?
                .to_owned(),
        )),
        None => None,
    };
    if let Some(client) = client {
        request.extensions_mut().insert(client);
    }
    Ok(request)
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
    // Keyed by the client authentication found (`ext:client:<key>`), else the address.
    // (Without authentication, `HeaderKey::from_static("x-api-key")` reads the metadata
    // directly: gRPC metadata are HTTP/2 headers.)
    let limit = LimitLayer::builder(backend, PeriodConfig::new(QUOTA, PERIOD))
        .name(POLICY)
        .key(
            ExtensionKey::<Client>::new()
                .tag("client")
                .or(PeerIp::new()),
        )
        .build()?;
    // Reports SERVING for the whole server (service name "").
    let (_reporter, health) = tonic_health::server::health_reporter();
    tonic::transport::Server::builder()
        // Server layers run in the order they are added: authentication first, so the
        // limit finds the client in the extensions.
        .layer(InterceptorLayer::new(authenticate))
        .layer(limit)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}
