//! Testing an application that uses the limiter: the same layers on an in-process
//! backend, requests sent with `tower::ServiceExt::oneshot` (no socket, no Redis), and
//! tokio's paused clock to move past a window without waiting for it.
//!
//! ```text
//! cargo test --example testing
//! ```
//!
//! The in-process backend decides exactly as Redis does (the crate proves the two alike),
//! so a test of the application's limits needs no server. Keys that read the peer
//! address get it from `ConnectInfo`, which a test inserts itself; a header key needs
//! only the header.

use std::time::Duration;

use axum::{routing::get, Router};
use tower_redis_ratelimit::{key::HeaderKey, Backend, ConfigError};
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

/// The application: 2 requests per second per API key.
fn app(backend: &Backend) -> Result<Router, ConfigError> {
    let per_key = LimitLayer::builder(backend, PeriodConfig::new(2, Duration::from_secs(1)))
        .name("api")
        .key(HeaderKey::from_static("x-api-key"))
        .build()?;
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(per_key))
}

fn main() -> Result<(), ConfigError> {
    // Served for real by the other examples; this one is about its tests.
    let _ = app(&Backend::in_process())?;
    println!("run the tests: cargo test --example testing");
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;

    fn get(key: &str) -> Request<Body> {
        Request::get("/")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap()
    }

    // `start_paused`: in-process limits follow tokio's clock, so `advance` ends the
    // window at once and the test takes no real time.
    #[tokio::test(start_paused = true)]
    async fn the_third_request_in_a_second_is_refused_until_the_window_ends() {
        let app = app(&Backend::in_process()).unwrap();
        for _ in 0..2 {
            let response = app.clone().oneshot(get("k1")).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        }
        let refused = app.clone().oneshot(get("k1")).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.headers().contains_key("retry-after"));

        // Another key has its own limit.
        let other = app.clone().oneshot(get("k2")).await.unwrap();
        assert_eq!(other.status(), StatusCode::OK);

        tokio::time::advance(Duration::from_secs(1)).await;
        let again = app.oneshot(get("k1")).await.unwrap();
        assert_eq!(again.status(), StatusCode::OK);
    }

    // Every test builds its own backend: limits never leak from one test to another.
    #[tokio::test(start_paused = true)]
    async fn a_fresh_backend_starts_every_key_full() {
        let app = app(&Backend::in_process()).unwrap();
        let response = app.oneshot(get("k1")).await.unwrap();
        assert_eq!(response.headers()["ratelimit"], "\"api\";r=1;t=1");
    }
}
