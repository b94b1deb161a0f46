//! An axum server with three rate-limited routes, on Redis when `REDIS_URL` is set and in
//! process otherwise, limited per `x-api-key` header (or client IP without one); `PORT`
//! overrides the port (3000). TLS, ACL users and Sentinel: the guide's `deployments`.
//!
//! ```text
//! cargo run --example quickstart                                   # in process
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart  # shared in Redis
//! ```

use std::{net::SocketAddr, time::Duration};

use axum::{routing::get, Extension, Router};
use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor, PeerIp};
use tower_redis_ratelimit::{Backend, ConfigError, Decision};
use tower_redis_ratelimit::{LimitLayer, PeriodConfig, RollingConfig, TokenBucketConfig};

/// `/period`: 5 requests per 30 s window.
pub(crate) const PERIOD_QUOTA: u64 = 5;
/// `/token`: a burst of 3, then one token every 10 s.
pub(crate) const TOKEN_BURST: u64 = 3;
/// `/rolling`: at most 4 requests in any 20 s (10 buckets of 2 s).
pub(crate) const ROLLING_LIMIT: u64 = 4;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => Backend::builder()
            .redis_url(url)
            .prefix("quickstart")
            .build()?,
        Err(_) => Backend::in_process(),
    };
    if let Err(error) = backend.warm_up().await {
        tracing::warn!(%error, "redis unreachable: limits are kept in this process until it answers");
    }
    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |port| port.parse())?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    println!("serving /period, /token and /rolling on http://{addr}; try:");
    println!("  for i in $(seq 7); do curl -s -H 'x-api-key: demo' http://{addr}/period; done");
    let app = app(&backend)?.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}

/// The quickstart's routes, each limited per `x-api-key` header (client IP without one).
pub(crate) fn app(backend: &Backend) -> Result<Router, ConfigError> {
    let key = || HeaderKey::from_static("x-api-key").or(PeerIp::new());
    let second = Duration::from_secs(1);
    let period = PeriodConfig::new(PERIOD_QUOTA, 30 * second);
    let token = TokenBucketConfig::new(1, 10 * second, TOKEN_BURST);
    let rolling = RollingConfig::new(ROLLING_LIMIT, 10, 2 * second);
    let period = LimitLayer::builder(backend, period)
        .name("period")
        .key(key())
        .build()?;
    let token = LimitLayer::builder(backend, token)
        .name("token")
        .key(key())
        .build()?;
    let rolling = LimitLayer::builder(backend, rolling)
        .name("rolling")
        .key(key())
        .build()?;
    Ok(Router::new()
        .route("/period", get(report).layer(period))
        .route("/token", get(report).layer(token))
        .route("/rolling", get(report).layer(rolling)))
}

/// Tells the client where it stands, from the decision the limiter left in the request.
async fn report(Extension(decision): Extension<Decision>) -> String {
    let (state, left, limit) = (decision.state, decision.remaining, decision.limit);
    let reset = decision.reset.as_secs_f64();
    format!("{state:?}: {left} of {limit} left, window resets in {reset:.1}s\n")
}
