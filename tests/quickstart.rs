//! The quickstart's own routes, served as the example serves them, in-process and on a
//! real `redis-server`.

mod support;

#[path = "../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

use std::time::Duration;

use http::{header, StatusCode};
use support::http::Served;
use support::RedisServer;
use tokio::time::Instant;
use tower_redis_ratelimit::Backend;

/// Each route admits exactly what it advertises per key, then answers 429 with
/// `Retry-After` and `RateLimit` `r=0`; another key is unaffected.
async fn advertised_limits(backend: Backend) {
    let served = Served::start(quickstart::app(&backend).unwrap()).await;
    let routes = [
        ("/period", quickstart::PERIOD_QUOTA),
        ("/token", quickstart::TOKEN_BURST),
        ("/rolling", quickstart::ROLLING_LIMIT),
    ];
    for (route, limit) in routes {
        let me = [("x-api-key", "me")];
        for i in 0..limit {
            let (response, body) = served.get(route, &me).await;
            assert_eq!(
                response.status(),
                StatusCode::OK,
                "{route} request {i}: {body}"
            );
        }
        let (response, body) = served.get(route, &me).await;
        assert_eq!(
            response.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{route}: {body}"
        );
        let retry: u64 = response.headers()[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry >= 1, "{route}");
        let ratelimit = response.headers()["ratelimit"].to_str().unwrap();
        assert!(ratelimit.contains(";r=0;"), "{route}: {ratelimit}");
        let (response, _) = served.get(route, &[("x-api-key", "you")]).await;
        assert_eq!(response.status(), StatusCode::OK, "{route}: another key");
        // Without the header, the client IP is the key.
        let (response, _) = served.get(route, &[]).await;
        assert_eq!(response.status(), StatusCode::OK, "{route}: by IP");
    }
}

#[tokio::test]
async fn in_process() {
    advertised_limits(Backend::in_process()).await;
}

#[tokio::test]
async fn on_redis() {
    let redis = RedisServer::start();
    advertised_limits(
        support::backend_builder()
            .redis(redis.pool())
            .prefix("quickstart")
            .build()
            .unwrap(),
    )
    .await;
    let keys = redis.cmd(&["KEYS", "quickstart:{v1:hdr:x-api-key:me}:*"]);
    let mut keys: Vec<_> = keys.lines().collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "quickstart:{v1:hdr:x-api-key:me}:period:period",
            "quickstart:{v1:hdr:x-api-key:me}:rolling:rolling",
            "quickstart:{v1:hdr:x-api-key:me}:token:token"
        ],
        "the state lives in redis"
    );
}

#[tokio::test]
async fn two_processes_sharing_redis_admit_the_quota_once() {
    let redis = RedisServer::start();
    let one = Served::start(quickstart::app(&redis.backend()).unwrap()).await;
    let two = Served::start(quickstart::app(&redis.backend()).unwrap()).await;
    for (route, limit) in [
        ("/period", quickstart::PERIOD_QUOTA),
        ("/token", quickstart::TOKEN_BURST),
        ("/rolling", quickstart::ROLLING_LIMIT),
    ] {
        let mut ok = 0;
        for i in 0..limit * 2 {
            let served = if i % 2 == 0 { &one } else { &two };
            let (response, _) = served.get(route, &[("x-api-key", "shared")]).await;
            ok += u64::from(response.status() == StatusCode::OK);
        }
        assert_eq!(ok, limit, "{route}");
    }
}

#[tokio::test]
async fn keeps_answering_when_redis_dies_and_returns_to_it() {
    let mut redis = RedisServer::start();
    // As the example builds it from REDIS_URL.
    let backend = support::backend_builder()
        .redis_url(redis.url())
        .prefix("quickstart")
        .build()
        .unwrap();
    let served = Served::start(quickstart::app(&backend).unwrap()).await;
    let key = [("x-api-key", "k")];
    assert_eq!(served.get("/period", &key).await.0.status(), StatusCode::OK);
    redis.kill();
    for route in ["/period", "/token", "/rolling"] {
        for _ in 0..8 {
            let started = Instant::now();
            let (response, body) = served.get(route, &key).await;
            let status = response.status();
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{route}: {status} {body}"
            );
            // (A hang has no bound; 2 s leaves room for a busy machine.)
            assert!(started.elapsed() < Duration::from_secs(2), "{route} hung");
        }
    }
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        served.get("/token", &[("x-api-key", "after")]).await;
        if redis.cmd(&["EXISTS", "quickstart:{v1:hdr:x-api-key:after}:token:token"]) == "1" {
            break;
        }
        assert!(Instant::now() < deadline, "state never returned to redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
