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
//!
//! Other deployments, from the environment:
//! - TLS and ACL users (`--features tls`): `REDIS_URL=rediss://user:password@host:port`,
//!   with `REDIS_CA_FILE` (a PEM file of CA certificates) when the server's certificate
//!   is not signed by a system authority;
//! - Redis Sentinel (`--features sentinel`): `REDIS_SENTINELS=host:port,host:port` and
//!   `REDIS_MASTER_NAME`, with `REDIS_PASSWORD` (and `REDIS_USERNAME`) for the master.
//!
//! Credentials never reach the output: URLs are printed without them.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Extension, Router};
use tower_redis_ratelimit::key::{HeaderKey, KeyExtractorExt, PeerIp};
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

/// The backend the environment asks for (see the module docs).
fn backend() -> Result<Backend, Box<dyn std::error::Error>> {
    let builder = Backend::builder().prefix("quickstart");
    if let Ok(sentinels) = std::env::var("REDIS_SENTINELS") {
        let master = std::env::var("REDIS_MASTER_NAME").unwrap_or_else(|_| "mymaster".into());
        println!(
            "limits are kept in the Redis master {master:?} named by the sentinels at {sentinels}"
        );
        return sentinel(builder, &master, &sentinels);
    }
    let Ok(url) = std::env::var("REDIS_URL") else {
        println!("REDIS_URL is not set: limits are kept in this process");
        return Ok(Backend::in_process());
    };
    println!("limits are kept in Redis at {}", without_credentials(&url));
    let builder = builder.redis_url(url);
    match std::env::var("REDIS_CA_FILE") {
        Ok(file) => with_ca(builder, &file),
        Err(_) => Ok(builder.build()?),
    }
}

#[cfg(feature = "sentinel")]
fn sentinel(
    builder: tower_redis_ratelimit::BackendBuilder,
    master: &str,
    sentinels: &str,
) -> Result<Backend, Box<dyn std::error::Error>> {
    let scheme = if std::env::var("REDIS_CA_FILE").is_ok() {
        "rediss"
    } else {
        "redis"
    };
    let urls: Vec<String> = sentinels
        .split(',')
        .map(|addr| format!("{scheme}://{}", addr.trim()))
        .collect();
    let mut builder = builder.redis_sentinel(master, urls);
    if let Ok(password) = std::env::var("REDIS_PASSWORD") {
        let user = std::env::var("REDIS_USERNAME").unwrap_or_else(|_| "default".into());
        builder = builder.sentinel_master_auth(user, password);
    }
    match std::env::var("REDIS_CA_FILE") {
        Ok(file) => with_ca(builder, &file),
        Err(_) => Ok(builder.build()?),
    }
}

#[cfg(not(feature = "sentinel"))]
fn sentinel(
    _: tower_redis_ratelimit::BackendBuilder,
    _: &str,
    _: &str,
) -> Result<Backend, Box<dyn std::error::Error>> {
    Err("REDIS_SENTINELS needs the `sentinel` feature: cargo run --example quickstart --features sentinel".into())
}

#[cfg(feature = "tls")]
fn with_ca(
    builder: tower_redis_ratelimit::BackendBuilder,
    file: &str,
) -> Result<Backend, Box<dyn std::error::Error>> {
    let pem = std::fs::read(file).map_err(|error| format!("REDIS_CA_FILE {file}: {error}"))?;
    Ok(builder.tls_ca_pem(pem).build()?)
}

#[cfg(not(feature = "tls"))]
fn with_ca(
    _: tower_redis_ratelimit::BackendBuilder,
    _: &str,
) -> Result<Backend, Box<dyn std::error::Error>> {
    Err(
        "REDIS_CA_FILE needs the `tls` feature: cargo run --example quickstart --features tls"
            .into(),
    )
}

/// `url` without its user and password: `rediss://alice:secret@host` becomes
/// `rediss://***@host`.
fn without_credentials(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_redis_ratelimit=info".into()),
        )
        .init();

    let backend = backend()?;
    if let Err(error) = backend.probe_redis().await {
        tracing::warn!(%error, "starting with redis unreachable: limits are kept in this process until it answers");
    }

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
