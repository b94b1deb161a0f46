//! The `login` example: only failed logins count, five failures lock the user out for
//! 15 minutes (the right password included), successes never spend, and two processes
//! on one Redis share the lockout.

#[path = "../examples/login.rs"]
#[allow(dead_code)]
mod login;
mod support;

use axum::body::Body;
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
