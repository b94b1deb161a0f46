//! Waiting instead of a `429` (issue 54, item 2: `LayerBuilder::wait`): clients at twice
//! the rate, across two instances on one Redis, are each admitted in their turn and
//! never beyond the limit; a request whose turn is past the longest wait is refused at
//! once; a waiter whose client goes away spends nothing.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{to_bytes, Body};
use axum::routing::get;
use axum::{Extension, Router};
use http::{Request, StatusCode};
use support::RedisServer;
use tower::ServiceExt;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::{Backend, Decision, LimitLayer, Limiter, PeriodConfig, UtcOffset};

/// An instance: 5 a second per user, windows on the second, a wait of up to `wait`;
/// the handler answers the end of the window that admitted it (Unix ms, rounded to the
/// second).
fn instance(
    backend: &Backend,
    wait: Duration,
) -> (Router, tower_redis_ratelimit::PeriodLimitLayer<HeaderKey>) {
    instance_of(backend, wait, Duration::from_secs(1))
}

/// [`instance`] with windows of `period`.
fn instance_of(
    backend: &Backend,
    wait: Duration,
    period: Duration,
) -> (Router, tower_redis_ratelimit::PeriodLimitLayer<HeaderKey>) {
    // Aligned on the second (windows a handler can name) for windows of a second;
    // longer ones start at a key's first request.
    let config = PeriodConfig::new(5, period);
    let config = if period == Duration::from_secs(1) {
        config.align(UtcOffset::UTC)
    } else {
        config
    };
    let layer = LimitLayer::builder(backend, config)
        .name("api")
        .key(HeaderKey::from_static("x-user"))
        .wait(wait)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|Extension(decision): Extension<Decision>| async move {
                let end = SystemTime::now() + decision.reset;
                let ms = end.duration_since(UNIX_EPOCH).unwrap().as_millis();
                ((ms + 500) / 1_000 * 1_000).to_string()
            }),
        )
        .layer(layer.clone());
    (app, layer)
}

async fn get_as(app: &Router, user: &str) -> (StatusCode, String) {
    let request = Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = to_bytes(response.into_body(), 1 << 16).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_at_twice_the_rate_wait_their_turn_never_beyond_the_limit() {
    let redis = RedisServer::start();
    let backend = || {
        support::backend_builder()
            .redis_url(redis.url())
            .call_timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let (a, _) = instance(&backend(), Duration::from_secs(4));
    let (b, _) = instance(&backend(), Duration::from_secs(4));
    // 20 requests over 2 s (10 a second: twice the limit), half on each instance.
    let mut asked = Vec::new();
    for i in 0..20 {
        let app = if i % 2 == 0 { a.clone() } else { b.clone() };
        asked.push(tokio::spawn(async move { get_as(&app, "u").await }));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut windows = std::collections::BTreeMap::<String, u32>::new();
    for asked in asked {
        let (status, window) = asked.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{window}");
        *windows.entry(window).or_default() += 1;
    }
    // Every request admitted, none beyond 5 in any window, and some waited into a
    // window after the last one they arrived in.
    assert_eq!(windows.values().sum::<u32>(), 20, "{windows:?}");
    assert!(windows.values().all(|&n| n <= 5), "{windows:?}");
    assert!(windows.len() >= 4, "{windows:?}");
}

#[tokio::test]
async fn a_turn_past_the_longest_wait_is_refused_at_once() {
    let (app, _) = instance_of(
        &Backend::in_process(),
        Duration::from_millis(1),
        Duration::from_secs(30),
    );
    for _ in 0..5 {
        assert_eq!(get_as(&app, "u").await.0, StatusCode::OK);
    }
    // The next window is up to a second away: past a wait of 1 ms.
    let (status, _) = get_as(&app, "u").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

/// A request that waits for the next window, its client gone before its turn: the next
/// window finds nothing spent (a reservation would have spent it).
async fn a_waiter_that_goes_away_spends_nothing(backend: &Backend) {
    // Windows of 1.5 s from the key's first request.
    let (app, layer) = instance_of(
        backend,
        Duration::from_secs(3),
        Duration::from_millis(1_500),
    );
    let key = b"hdr:x-user:gone";
    for _ in 0..5 {
        assert_eq!(get_as(&app, "gone").await.0, StatusCode::OK);
    }
    let waiter = tokio::spawn({
        let app = app.clone();
        async move { get_as(&app, "gone").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "it waits");
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    // Into the next window, where the waiter's turn was.
    let reset = layer
        .limiter()
        .peek(key, std::num::NonZeroU32::MIN)
        .unwrap()
        .await
        .reset;
    tokio::time::sleep(reset + Duration::from_millis(300)).await;
    let now = layer
        .limiter()
        .peek(key, std::num::NonZeroU32::MIN)
        .unwrap()
        .await;
    assert!(now.is_admitted(), "{now:?}");
    assert_eq!(now.remaining, 4, "the window spent nothing: {now:?}");
}

#[tokio::test]
async fn a_waiter_that_goes_away_spends_nothing_in_process() {
    a_waiter_that_goes_away_spends_nothing(&Backend::in_process()).await;
}

#[tokio::test]
async fn a_waiter_that_goes_away_spends_nothing_on_redis() {
    let redis = RedisServer::start();
    a_waiter_that_goes_away_spends_nothing(&redis.backend()).await;
}

/// At most 64 requests of one key wait at once in one process: the next is refused at
/// once; a waiter gone gives its place back.
#[tokio::test]
async fn a_key_has_a_bounded_number_of_waiters() {
    // Windows of an hour, a wait of two: every waiter waits for as long as the test runs.
    let hour = Duration::from_secs(3_600);
    let (app, _) = instance_of(&Backend::in_process(), 2 * hour, hour);
    for _ in 0..5 {
        assert_eq!(get_as(&app, "many").await.0, StatusCode::OK);
    }
    let waiters: Vec<_> = (0..64)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { get_as(&app, "many").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "they all wait");
    // The 65th: no place left, refused at once (while the others still wait).
    let (status, _) = get_as(&app, "many").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(waiters.iter().all(|w| !w.is_finished()));
    // Another key waits as ever.
    for _ in 0..5 {
        assert_eq!(get_as(&app, "other").await.0, StatusCode::OK);
    }
    let other = tokio::spawn({
        let app = app.clone();
        async move { get_as(&app, "other").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!other.is_finished());
    other.abort();
    // Gone, their places are free again.
    for waiter in &waiters {
        waiter.abort();
    }
    for waiter in waiters {
        let _ = waiter.await;
    }
    let again = tokio::spawn({
        let app = app.clone();
        async move { get_as(&app, "many").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!again.is_finished(), "a place again");
    again.abort();
}
