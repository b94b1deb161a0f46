//! A small axum server with rate-limited routes, on Redis when `REDIS_URL` is set and
//! in-process otherwise.
//!
//! ```text
//! cargo run --example quickstart                                   # in-process
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart  # shared in Redis
//! ```
//!
//! Each route is limited per `x-api-key` header, or per client IP when the header is
//! absent. `PORT` overrides the port (3000).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Extension, Router};
use tower_redis_ratelimit::key::{HeaderKey, PeerIp};
use tower_redis_ratelimit::{
    Backend, ConfigError, Decision, PeriodLimitLayer, RollingWindowLayer, TokenBucketLayer,
};

/// Requests per window on `/period`.
pub(crate) const PERIOD_QUOTA: u64 = 5;
/// The window of `/period`.
pub(crate) const PERIOD: Duration = Duration::from_secs(30);
/// The bucket of `/token`: a burst of 3, then one token every 10 seconds.
pub(crate) const TOKEN_BURST: u64 = 3;
/// How often `/token` gets a token back.
pub(crate) const TOKEN_EVERY: Duration = Duration::from_secs(10);
/// The window of `/rolling`: at most 4 requests in any 20 seconds (10 buckets of 2 s).
pub(crate) const ROLLING_LIMIT: u64 = 4;
/// The buckets of `/rolling`.
pub(crate) const ROLLING_BUCKETS: u32 = 10;
/// The bucket length of `/rolling`.
pub(crate) const ROLLING_INTERVAL: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_redis_ratelimit=info".into()),
        )
        .init();

    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("limits are kept in Redis at {url}");
            Backend::builder()
                .redis_url(url)
                .prefix("quickstart")
                .build()?
        }
        Err(_) => {
            println!("REDIS_URL is not set: limits are kept in this process");
            Backend::in_process()
        }
    };

    let app = app(&backend)?;

    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse()?,
        Err(_) => 3000,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!(
        "serving on http://{addr}\n  \
         GET /period  {PERIOD_QUOTA} requests per {}s (fixed window)\n  \
         GET /token   bursts of {TOKEN_BURST}, then 1 request per {}s (token bucket)\n  \
         GET /rolling {ROLLING_LIMIT} requests in any {}s (rolling window)\n\
         try: for i in $(seq 7); do curl -s -H 'x-api-key: demo' http://{addr}/period; done",
        PERIOD.as_secs(),
        TOKEN_EVERY.as_secs(),
        (ROLLING_INTERVAL * ROLLING_BUCKETS).as_secs(),
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// The quickstart's routes, each limited per `x-api-key` header (client IP without one).
pub(crate) fn app(backend: &Backend) -> Result<Router, ConfigError> {
    let key = || HeaderKey::from_static("x-api-key").or(PeerIp::new());
    let period = PeriodLimitLayer::builder(backend)
        .name("period")
        .quota(PERIOD_QUOTA)
        .period(PERIOD)
        .key(key())
        .build()?;

    let token = TokenBucketLayer::builder(backend)
        .name("token")
        .rate(1, TOKEN_EVERY)
        .burst(TOKEN_BURST)
        .key(key())
        .build()?;

    let rolling = RollingWindowLayer::builder(backend)
        .name("rolling")
        .limit(ROLLING_LIMIT)
        .buckets(ROLLING_BUCKETS)
        .interval(ROLLING_INTERVAL)
        .key(key())
        .build()?;

    Ok(Router::new()
        .route("/period", get(report).layer(period))
        .route("/token", get(report).layer(token))
        .route("/rolling", get(report).layer(rolling)))
}

/// Tells the client where it stands, from the decision the limiter left in the request.
async fn report(Extension(decision): Extension<Decision>) -> String {
    format!(
        "{:?}: {} of {} left, window resets in {:.1}s\n",
        decision.state,
        decision.remaining,
        decision.limit,
        decision.reset.as_secs_f64()
    )
}
