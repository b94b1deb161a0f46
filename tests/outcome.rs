//! Counting by outcome (`LayerBuilder::count_if`): only the responses that count spend
//! the limit, on Redis and in process; 50 concurrent requests never let more counted
//! responses through than the limit.

mod support;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use support::http::Served;
use support::RedisServer;
use tokio::task::JoinSet;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::limit::CountIf;
use tower_redis_ratelimit::PeriodConfig;
use tower_redis_ratelimit::PeriodLimiter;
use tower_redis_ratelimit::{Backend, LimitLayer, Limiter};

/// `GET /login`: 200 with `x-ok`, 401 without, after a short wait so that concurrent
/// requests overlap; counts the failures that reached it.
fn app(layer: LimitLayer<PeriodLimiter, HeaderKey>, failures: Arc<AtomicUsize>) -> Router {
    let handler = move |headers: HeaderMap| {
        let failures = Arc::clone(&failures);
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if headers.contains_key("x-ok") {
                StatusCode::OK
            } else {
                failures.fetch_add(1, Ordering::SeqCst);
                StatusCode::UNAUTHORIZED
            }
        }
    };
    Router::new().route("/login", get(handler).layer(layer))
}

fn layer(backend: &Backend, quota: u64) -> LimitLayer<PeriodLimiter, HeaderKey> {
    LimitLayer::builder(backend, PeriodConfig::new(quota, Duration::from_secs(600)))
        .name("login")
        .key(HeaderKey::from_static("x-user"))
        .count_if(CountIf::failures())
        .build()
        .unwrap()
}

/// Waits until every background refund for `user` has landed: its remaining quota is
/// `expected`.
async fn settled(layer: &LimitLayer<PeriodLimiter, HeaderKey>, user: &str, expected: u64) {
    let mut left = u64::MAX;
    for _ in 0..2_000 {
        // A peek says what a check of one unit would leave.
        // The layer's key: `HeaderKey` tags the header's value with its name.
        let key = format!("hdr:x-user:{user}");
        let peek = layer
            .limiter()
            .peek(key.as_bytes(), NonZeroU32::MIN)
            .unwrap()
            .await;
        left = if peek.is_admitted() {
            peek.remaining + 1
        } else {
            0
        };
        if left == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the refunds of {user} never landed: {left} left, {expected} expected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_failures_count() {
    let redis = RedisServer::start();
    for backend in [redis.uncached_backend(), Backend::in_process()] {
        let layer = layer(&backend, 3);
        let failures = Arc::new(AtomicUsize::new(0));
        let server = Served::start(app(layer.clone(), Arc::clone(&failures))).await;
        // Successes never spend the quota.
        for _ in 0..6 {
            let (response, _) = server
                .get("/login", &[("x-user", "alice"), ("x-ok", "1")])
                .await;
            assert_eq!(response.status(), 200, "{backend:?}");
            settled(&layer, "alice", 3).await;
        }
        // Three failures spend it; then even a success is refused.
        for _ in 0..3 {
            let (response, _) = server.get("/login", &[("x-user", "alice")]).await;
            assert_eq!(response.status(), 401);
        }
        let (response, _) = server
            .get("/login", &[("x-user", "alice"), ("x-ok", "1")])
            .await;
        assert_eq!(response.status(), 429);
        assert!(response.headers().contains_key("retry-after"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_never_let_more_failures_through_than_the_limit() {
    let redis = RedisServer::start();
    for backend in [redis.uncached_backend(), Backend::in_process()] {
        let layer = layer(&backend, 5);
        let failures = Arc::new(AtomicUsize::new(0));
        let server = Arc::new(Served::start(app(layer.clone(), Arc::clone(&failures))).await);
        let mut tasks = JoinSet::new();
        for i in 0..50 {
            let server = Arc::clone(&server);
            tasks.spawn(async move {
                let mut headers = vec![("x-user", "bob")];
                if i % 2 == 0 {
                    headers.push(("x-ok", "1"));
                }
                server.get("/login", &headers).await.0.status()
            });
        }
        let mut statuses = Vec::new();
        while let Some(status) = tasks.join_next().await {
            statuses.push(status.unwrap().as_u16());
        }
        let through = failures.load(Ordering::SeqCst);
        assert!(through <= 5, "{through} failures got through: {statuses:?}");
        assert_eq!(
            statuses.iter().filter(|&&s| s == 401).count(),
            through,
            "{backend:?}"
        );
        // Every admitted success was refunded: what is spent is the failures only.
        settled(&layer, "bob", 5 - through as u64).await;
    }
}
