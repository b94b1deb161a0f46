//! The `login` example: only failed logins count, five failures lock the user out for
//! 15 minutes (the right password included), successes never spend, and two processes
//! on one Redis share the lockout; an operator sees who is locked out through the admin
//! router and unlocks them by name.

#[path = "../examples/login.rs"]
#[allow(dead_code)]
mod login;
mod support;

use axum::body::{to_bytes, Body};
use axum::http::{Request, StatusCode};
use axum::Router;
use support::RedisServer;
use tower::ServiceExt;
use tower_redis_ratelimit::Backend;

async fn post(app: &Router, body: &str) -> (StatusCode, Option<u64>) {
    let request = Request::post("/login")
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (response.status(), retry)
}

const RIGHT: &str = r#"{"user": "alice", "password": "wonderland"}"#;
const WRONG: &str = r#"{"user": "alice", "password": "guess"}"#;

async fn five_failures_lock_the_user_out(one: &Router, other: &Router) {
    // Successes never spend the quota.
    for _ in 0..10 {
        assert_eq!(post(one, RIGHT).await.0, StatusCode::OK);
    }
    for _ in 0..5 {
        assert_eq!(post(one, WRONG).await.0, StatusCode::UNAUTHORIZED);
    }
    // Locked: the right password too, on the other process too, for 15 minutes.
    let (status, retry) = post(other, RIGHT).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let retry = retry.expect("a Retry-After");
    assert!((899..=900).contains(&retry), "{retry}");
    assert_eq!(post(one, RIGHT).await.0, StatusCode::TOO_MANY_REQUESTS);
    // Another user is not affected.
    let bob = r#"{"user": "bob", "password": "x"}"#;
    assert_eq!(post(other, bob).await.0, StatusCode::UNAUTHORIZED);
    // Not a login form.
    assert_eq!(post(one, "{").await.0, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn in_process() {
    let app = login::app(&Backend::in_process()).unwrap();
    five_failures_lock_the_user_out(&app, &app).await;
}

#[tokio::test]
async fn two_processes_on_one_redis_share_the_lockout() {
    let redis = RedisServer::start();
    // Two backends on one Redis: two processes' worth of state.
    let one = login::app(&redis.uncached_backend()).unwrap();
    let other = login::app(&redis.uncached_backend()).unwrap();
    five_failures_lock_the_user_out(&one, &other).await;
}

/// An admin request: `(status, JSON body)`.
async fn admin(
    app: &Router,
    method: &str,
    uri: &str,
    token: &str,
) -> (StatusCode, serde_json::Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = to_bytes(response.into_body(), 64 * 1024).await.unwrap();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&body).into()));
    (status, json)
}

/// Locked out through one process, listed and unlocked through the other's admin
/// router, admitted again on the first; the admin endpoints answer only the token.
async fn an_operator_unlocks_a_user(one: &Router, other: &Router) {
    for _ in 0..5 {
        assert_eq!(post(one, WRONG).await.0, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(post(one, RIGHT).await.0, StatusCode::TOO_MANY_REQUESTS);

    let blocked = "/admin/ratelimit/blocked";
    assert_eq!(
        admin(other, "GET", blocked, "guess").await.0,
        StatusCode::UNAUTHORIZED
    );
    // Listed moments after the refusal that locked the user out (on Redis, written in
    // the background).
    let start = std::time::Instant::now();
    let listed = loop {
        let (status, listed) = admin(other, "GET", blocked, "s3cret").await;
        assert_eq!(status, StatusCode::OK, "{listed}");
        if listed["blocked"]
            .as_array()
            .is_some_and(|list| !list.is_empty())
        {
            break listed;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "{listed}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let entry = &listed["blocked"][0];
    assert_eq!(entry["limit"], "login", "{listed}");
    assert_eq!(entry["value"], "alice", "{listed}");
    let remaining = entry["remaining_ms"].as_u64().expect("a wait");
    assert!(remaining > 890_000 && remaining <= 900_000, "{listed}");

    let reset = "/admin/ratelimit/login/alice/reset";
    let (status, body) = admin(other, "POST", reset, "s3cret").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        admin(other, "GET", blocked, "s3cret").await.1["blocked"],
        serde_json::json!([])
    );
    assert_eq!(post(one, RIGHT).await.0, StatusCode::OK);
}

#[tokio::test]
async fn an_operator_unlocks_a_user_in_process() {
    let app = login::app_with_admin(&Backend::in_process(), "s3cret").unwrap();
    an_operator_unlocks_a_user(&app, &app).await;
}

#[tokio::test]
async fn an_operator_unlocks_a_user_on_another_process() {
    let redis = RedisServer::start();
    let one = login::app_with_admin(&redis.uncached_backend(), "s3cret").unwrap();
    let other = login::app_with_admin(&redis.uncached_backend(), "s3cret").unwrap();
    an_operator_unlocks_a_user(&one, &other).await;
}
