//! The limit among tower-http's layers: a trace span around everything, CORS outside the
//! limit (a browser's preflight is never counted, and a 429 still carries the CORS
//! headers the browser needs to read it), and the `RateLimit` headers exposed to
//! scripts.
//!
//! ```text
//! cargo run --example tower_http
//! curl -i -H 'origin: https://app.example' http://127.0.0.1:3000/
//! curl -i -X OPTIONS -H 'origin: https://app.example' -H 'access-control-request-method: GET' http://127.0.0.1:3000/
//! ```
//!
//! Order matters: `ServiceBuilder` runs its layers top to bottom for a request. The
//! trace is first, so a refused request is traced too; CORS answers preflights before
//! the limit sees them; the limit runs last, next to the routes.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, Method};
use axum::{routing::get, Router};
use tower::ServiceBuilder;
use tower_http::cors::CorsLayer;
use tower_http::trace::TraceLayer;
use tower_redis_ratelimit::{key::PeerIp, Backend};
use tower_redis_ratelimit::{LimitLayer, TokenBucketConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info,tower_http=debug".into()),
        )
        .init();
    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => Backend::builder().redis_url(url).build()?,
        Err(_) => Backend::in_process(),
    };
    let per_ip = LimitLayer::builder(
        &backend,
        TokenBucketConfig::new(5, Duration::from_secs(1), 10),
    )
    .name("api")
    .key(PeerIp::new())
    .build()?;
    let cors = CorsLayer::new()
        .allow_origin(HeaderValue::from_static("https://app.example"))
        .allow_methods([Method::GET])
        // Scripts in the page may read how much is left and when to retry.
        .expose_headers([
            HeaderName::from_static("ratelimit"),
            HeaderName::from_static("ratelimit-policy"),
            HeaderName::from_static("retry-after"),
        ]);

    let app = Router::new().route("/", get(|| async { "hello\n" })).layer(
        ServiceBuilder::new()
            .layer(TraceLayer::new_for_http())
            .layer(cors)
            .layer(per_ip),
    );
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
