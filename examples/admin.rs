//! An API limited per `x-api-key`, with the admin router mounted behind a bearer token:
//! block a client by its API key, see where it stands, lift the block.
//!
//! ```text
//! ADMIN_TOKEN=s3cret cargo run --example admin --features admin
//! REDIS_URL=redis://127.0.0.1:6379 ADMIN_TOKEN=s3cret cargo run --example admin --features admin
//! ```
//!
//! Then (the server prints these lines with its port):
//!
//! ```text
//! curl -i -H 'x-api-key: trap' http://127.0.0.1:3001/
//! curl -X POST -H 'authorization: Bearer s3cret' 'http://127.0.0.1:3001/admin/ratelimit/api/trap/block?seconds=3600'
//! curl -H 'authorization: Bearer s3cret' http://127.0.0.1:3001/admin/ratelimit/api/trap
//! curl -X POST -H 'authorization: Bearer s3cret' http://127.0.0.1:3001/admin/ratelimit/api/trap/reset
//! ```
//!
//! With `REDIS_URL`, start it twice (`PORT=3002` for the second): a block or a reset made
//! through one instance holds on the other. `ADMIN_TOKEN` is required; it is never
//! printed.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::{routing::get, Router};
use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor, PeerIp};
use tower_redis_ratelimit::AdminRouter;
use tower_redis_ratelimit::Backend;
use tower_redis_ratelimit::{LimitLayer, TokenBucketConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(token) = std::env::var("ADMIN_TOKEN") else {
        eprintln!("set ADMIN_TOKEN: the admin endpoints answer only requests that carry it");
        std::process::exit(2);
    };
    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => {
            let backend = Backend::builder()
                .prefix("admin-example")
                .redis_url(url)
                .build()?;
            if let Err(error) = backend.warm_up().await {
                eprintln!("redis: {error} (answering in process until it is up)");
            }
            backend
        }
        Err(_) => Backend::in_process(),
    };
    let api = LimitLayer::builder(
        &backend,
        TokenBucketConfig::new(5, Duration::from_secs(1), 10),
    )
    .name("api")
    .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
    .build()?;

    // The admin router behind the service's own authentication (here a bearer token),
    // outside the limit: an operator is never rate-limited out of lifting a block.
    let expected = format!("Bearer {token}");
    let admin = AdminRouter::new()
        .limit(&api)
        .into_router()
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let allowed = request
                .headers()
                .get("authorization")
                .is_some_and(|value| value.as_bytes() == expected.as_bytes());
            async move {
                if allowed {
                    next.run(request).await
                } else {
                    Response::builder()
                        .status(StatusCode::UNAUTHORIZED)
                        .body(axum::body::Body::from("admin token required\n"))
                        .expect("a valid response")
                }
            }
        }));
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(api)
        .nest("/admin/ratelimit", admin);

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3001);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let base = format!("http://127.0.0.1:{port}");
    println!("listening on {base}; try:");
    println!("  curl -i -H 'x-api-key: trap' {base}/");
    println!("  curl -X POST -H \"authorization: Bearer $ADMIN_TOKEN\" '{base}/admin/ratelimit/api/trap/block?seconds=3600'");
    println!("  curl -H \"authorization: Bearer $ADMIN_TOKEN\" {base}/admin/ratelimit/api/trap");
    println!("  curl -X POST -H \"authorization: Bearer $ADMIN_TOKEN\" {base}/admin/ratelimit/api/trap/reset");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
