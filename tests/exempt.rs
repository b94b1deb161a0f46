//! Exemptions (issue 35, item 8): a request a layer's `exempt` predicate lets through is
//! neither checked nor counted and carries no rate-limit headers; CORS preflights and
//! health checks never use up a client's limit, and an exempt request takes no in-flight
//! slot.

use std::time::Duration;

use axum::{body::Body, routing::get, Router};
use http::{Method, Request, StatusCode};
use tower::ServiceExt;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::Backend;
use tower_redis_ratelimit::{InFlightConfig, LimitLayer, PeriodConfig};

fn request(method: Method, path: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("x-api-key", "k1")
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn exempt_requests_are_neither_counted_nor_labelled() {
    let limit = LimitLayer::builder(
        &Backend::in_process(),
        PeriodConfig::new(1, Duration::from_secs(60)),
    )
    .name("api")
    .key(HeaderKey::from_static("x-api-key"))
    .exempt(|req| req.method == Method::OPTIONS)
    .exempt(|req| req.uri.path() == "/healthz")
    .build()
    .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|| async { "ok" }).options(|| async { "preflight" }),
        )
        .route("/healthz", get(|| async { "up" }))
        .layer(limit);
    for (method, path) in [(Method::OPTIONS, "/"), (Method::GET, "/healthz")] {
        for _ in 0..3 {
            let response = app
                .clone()
                .oneshot(request(method.clone(), path))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{method} {path}");
            assert!(
                response.headers().get("ratelimit").is_none(),
                "{method} {path}"
            );
            assert!(response.headers().get("ratelimit-policy").is_none());
        }
    }
    // The client's one request of the minute is still there, then used up.
    let first = app
        .clone()
        .oneshot(request(Method::GET, "/"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["ratelimit"], "\"api\";r=0;t=60");
    let second = app.oneshot(request(Method::GET, "/")).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn an_exempt_request_takes_no_in_flight_slot() {
    let backend = Backend::in_process();
    let exports = LimitLayer::builder(&backend, InFlightConfig::new(1))
        .name("exports")
        .key(HeaderKey::from_static("x-api-key"))
        .exempt(|req| req.uri.path() == "/healthz")
        .build()
        .unwrap();
    let limiter = exports.limiter().clone();
    let app = Router::new()
        .route("/healthz", get(|| async { "up" }))
        .layer(exports);
    let response = app.oneshot(request(Method::GET, "/healthz")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("ratelimit").is_none());
    // Held across the body: none was taken.
    assert_eq!(limiter.in_flight(b"hdr:x-api-key:k1").await, 0);
    drop(response);
}
