//! The admin router (feature `admin`, issue 35 item 1): an operator blocks a client by
//! the API key it sends, sees it listed and where it stands, lifts the block, and the
//! client is admitted again; on Redis, through a second instance's router. A value the layer never
//! counts is an error, never a success on another key.
#![cfg(feature = "admin")]

mod support;

use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use serde_json::Value;
use support::RedisServer;
use tower::ServiceExt;
use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor, PeerIp};
use tower_redis_ratelimit::AdminRouter;
use tower_redis_ratelimit::{Backend, Limiter};
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

/// One instance: the app limited per API key, or per address without one, and its
/// admin router (a real service would put its own authentication in front).
fn instance(backend: &Backend) -> Router {
    let api = LimitLayer::builder(backend, PeriodConfig::new(5, Duration::from_secs(600)))
        .name("api")
        .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
        .build()
        .unwrap();
    let admin = AdminRouter::new().limit(&api).into_router();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(api)
        .nest("/admin", admin)
}

async fn call(app: &Router, method: &str, uri: &str, api_key: Option<&str>) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(key) = api_key {
        request = request.header("x-api-key", key);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = to_bytes(response.into_body(), 64 * 1024).await.unwrap();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_blocks_lists_and_lifts_a_client_by_its_api_key() {
    let redis = RedisServer::start();
    // Refusals cached for up to 30 s: the client is admitted again on the other instance
    // at once only because the reset reaches its deny cache (the change subscription).
    let backend = || {
        support::backend_builder()
            .redis_url(redis.url())
            .deny_cache_max_age(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let a = instance(&backend());
    let b = instance(&backend());

    let (status, limits) = call(&a, "GET", "/admin", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(limits["limits"][0]["name"], "api", "{limits}");

    let first = call(&a, "GET", "/", Some("trap")).await;
    assert_eq!(first.0, StatusCode::OK, "{first:?}");
    // Blocked by its API key on instance A, for an hour.
    let (status, blocked) = call(&a, "POST", "/admin/api/trap/block?seconds=3600", None).await;
    assert_eq!(status, StatusCode::OK, "{blocked}");
    assert_eq!(blocked["keys"][0]["key"], "hdr:x-api-key:trap", "{blocked}");
    assert_eq!(blocked["keys"][0]["admitted"], false, "{blocked}");
    assert_eq!(
        call(&b, "GET", "/", Some("trap")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Listed as blocked, seen from B: the limit, the key and the client's value.
    let (status, listed) = call(&b, "GET", "/admin/blocked", None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let entries = listed["blocked"].as_array().expect("a list");
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["limit"], "api", "{listed}");
    assert_eq!(entries[0]["policy"], "api", "{listed}");
    assert_eq!(entries[0]["key"], "hdr:x-api-key:trap", "{listed}");
    assert_eq!(entries[0]["value"], "trap", "{listed}");
    let remaining = entries[0]["remaining_ms"].as_u64().expect("a wait");
    assert!(remaining > 3_500_000 && remaining <= 3_600_000, "{listed}");
    let until = entries[0]["until_ms"].as_u64().expect("an end");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(until.abs_diff(now_ms + remaining) < 2_000, "{listed}");

    // Where it stands, seen from B: refused for about an hour.
    let (status, standing) = call(&b, "GET", "/admin/api/trap", None).await;
    assert_eq!(status, StatusCode::OK, "{standing}");
    let retry = standing["keys"][0]["retry_after_ms"]
        .as_u64()
        .expect("a wait");
    assert!(retry > 3_500_000 && retry <= 3_600_000, "{standing}");
    assert_eq!(standing["keys"][0]["source"], "Redis", "{standing}");

    // B has cached its refusal; both instances subscribed to the changes.
    assert_eq!(
        call(&b, "GET", "/", Some("trap")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        support::channel_subscribers(&redis, "ratelimit:changes", 2).await,
        2
    );

    // Lifted through A: the client is admitted again on B, well within the max age.
    let (status, lifted) = call(&a, "POST", "/admin/api/trap/reset", None).await;
    assert_eq!(status, StatusCode::OK, "{lifted}");
    assert_eq!(lifted["keys"][0]["remaining"], 5, "{lifted}");
    let start = std::time::Instant::now();
    while call(&b, "GET", "/", Some("trap")).await.0 != StatusCode::OK {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "B still refuses 5 s after the reset through A"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Off the list, seen from either.
    let (status, listed) = call(&b, "GET", "/admin/blocked?limit=api", None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["blocked"], serde_json::json!([]), "{listed}");

    // A refund by value: the request just admitted given back.
    let (status, refunded) = call(&a, "POST", "/admin/api/trap/refund?units=1", None).await;
    assert_eq!(status, StatusCode::OK, "{refunded}");
    assert_eq!(refunded["keys"][0]["remaining"], 5, "{refunded}");
}

#[tokio::test]
async fn wrong_values_limits_and_numbers_are_errors() {
    let app = instance(&Backend::in_process());
    // An address is counted under both branches of the `.or`.
    let (status, both) = call(&app, "GET", "/admin/api/203.0.113.7", None).await;
    assert_eq!(status, StatusCode::OK, "{both}");
    assert_eq!(both["keys"].as_array().map(Vec::len), Some(2), "{both}");

    for (method, uri, expected, says) in [
        (
            "GET",
            "/admin/nope/trap",
            StatusCode::NOT_FOUND,
            "no limit named `nope`",
        ),
        (
            "POST",
            "/admin/api/trap/block",
            StatusCode::BAD_REQUEST,
            "seconds",
        ),
        (
            "POST",
            "/admin/api/trap/block?seconds=x",
            StatusCode::BAD_REQUEST,
            "whole number",
        ),
        (
            "POST",
            "/admin/api/trap/refund?units=0",
            StatusCode::BAD_REQUEST,
            "between 1",
        ),
        (
            "GET",
            "/admin/api/trap?cost=-1",
            StatusCode::BAD_REQUEST,
            "whole number",
        ),
        (
            "GET",
            "/admin/blocked?limit=nope",
            StatusCode::NOT_FOUND,
            "no limit named `nope`",
        ),
        (
            "GET",
            "/admin/blocked?max=0",
            StatusCode::BAD_REQUEST,
            "between 1 and 1000",
        ),
        (
            "GET",
            "/admin/blocked?max=1001",
            StatusCode::BAD_REQUEST,
            "between 1 and 1000",
        ),
        (
            "GET",
            "/admin/blocked?max=many",
            StatusCode::BAD_REQUEST,
            "whole number",
        ),
    ] {
        let (status, body) = call(&app, method, uri, None).await;
        assert_eq!(status, expected, "{method} {uri}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{method} {uri}: {body}");
    }

    // A per-address layer given an API key: an error, nothing reset.
    let backend = Backend::in_process();
    let per_ip = LimitLayer::builder(&backend, PeriodConfig::new(5, Duration::from_secs(60)))
        .name("per-ip")
        .key(PeerIp::new())
        .build()
        .unwrap();
    let admin: Router = AdminRouter::new().limit(&per_ip).into_router();
    let (status, body) = call(&admin, "POST", "/per-ip/trap/reset", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not an IP address"),
        "{body}"
    );
}

/// `GET /blocked` over every limit mounted, or the one named: soonest end first, at
/// most `max`, each entry named by the limit to give the other endpoints and by the
/// client's value.
#[tokio::test]
async fn the_blocked_keys_of_every_limit_listed() {
    let backend = Backend::in_process();
    let api = LimitLayer::builder(&backend, PeriodConfig::new(5, Duration::from_secs(600)))
        .name("api")
        .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
        .build()
        .unwrap();
    let login = LimitLayer::builder(
        &backend,
        PeriodConfig::new(1, Duration::from_secs(600)).lockout(Duration::from_secs(900)),
    )
    .name("login")
    .key(HeaderKey::from_static("x-user"))
    .build()
    .unwrap();
    let admin: Router = AdminRouter::new().limit(&api).limit(&login).into_router();
    let (status, listed) = call(&admin, "GET", "/blocked", None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["blocked"], serde_json::json!([]), "{listed}");

    let (status, body) = call(&admin, "POST", "/api/trap/block?seconds=3600", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(&admin, "POST", "/api/203.0.113.7/block?seconds=60", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A lockout: the second login of `alice` refused.
    for _ in 0..2 {
        login
            .limiter()
            .check(b"hdr:x-user:alice", std::num::NonZeroU32::MIN)
            .await;
    }

    let (status, listed) = call(&admin, "GET", "/blocked", None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let seen: Vec<(String, String, String)> = listed["blocked"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|entry| {
            let text = |field: &str| entry[field].as_str().unwrap_or("null").to_owned();
            (text("limit"), text("key"), text("value"))
        })
        .collect();
    let expected = [
        ("api", "hdr:x-api-key:203.0.113.7", "203.0.113.7"),
        ("api", "ip:203.0.113.7", "203.0.113.7"),
        ("login", "hdr:x-user:alice", "alice"),
        ("api", "hdr:x-api-key:trap", "trap"),
    ];
    let expected: Vec<(String, String, String)> = expected
        .iter()
        .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
        .collect();
    assert_eq!(seen, expected, "{listed}");

    let (status, listed) = call(&admin, "GET", "/blocked?limit=login", None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(
        listed["blocked"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let (status, listed) = call(&admin, "GET", "/blocked?max=2", None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(
        listed["blocked"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );

    // The listed value lifts the lockout.
    let (status, body) = call(&admin, "POST", "/login/alice/reset", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, listed) = call(&admin, "GET", "/blocked?limit=login", None).await;
    assert_eq!(listed["blocked"], serde_json::json!([]), "{listed}");
}
