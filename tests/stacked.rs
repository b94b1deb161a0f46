//! Limit layers stacked on a plain tower stack: a request the outer (burst) layer
//! refuses spends nothing of the inner (daily) one, and an inner refusal lists every
//! policy and the longest wait; shadow mode serves everything, adds no headers, counts
//! like enforcement on Redis, and stays invisible stacked on an enforcing layer.

mod support;

use std::num::NonZeroU32;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use support::http::value;
use support::http::{RATELIMIT, RATELIMIT_POLICY};
use support::stack::{counting, keyed, shadow_layer, stack};
use support::RedisServer;
use tower::ServiceExt;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::{Backend, Limiter, PeriodLimitLayer, State};
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

// ---------------------------------------------------------------------------
// Stacked limits on a plain tower stack
// ---------------------------------------------------------------------------

fn burst_and_daily(
    backend: &Backend,
    burst: u64,
    daily: u64,
) -> (PeriodLimitLayer<HeaderKey>, PeriodLimitLayer<HeaderKey>) {
    let layer = |name: &str, quota: u64, period: u64| {
        LimitLayer::builder(
            backend,
            PeriodConfig::new(quota, Duration::from_secs(period)),
        )
        .name(name)
        .key(HeaderKey::from_static("x-key"))
        .build()
        .unwrap()
    };
    (layer("burst", burst, 10), layer("daily", daily, 86_400))
}

/// A request the outer (burst) layer refuses leaves the inner (daily) count unchanged,
/// read back through the daily limiter itself.
#[tokio::test]
async fn a_burst_rejection_does_not_burn_daily_quota_in_process() {
    let backend = Backend::in_process();
    let (burst, daily) = burst_and_daily(&backend, 2, 5);
    let (calls, svc) = stack(burst, daily.clone());
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(svc.clone().oneshot(keyed("alice")).await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // Exactly 3 of 5 daily units are left: 3 fit, and they are the last ones.
    let left = daily
        .limiter()
        .check(b"hdr:x-key:alice", NonZeroU32::new(3).unwrap())
        .await;
    assert_eq!(left.state, State::HitQuota);
}

#[tokio::test]
async fn a_burst_rejection_does_not_burn_daily_quota_on_redis() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let (burst, daily) = burst_and_daily(&backend, 2, 5);
    let (calls, svc) = stack(burst, daily);
    for _ in 0..4 {
        svc.clone().oneshot(keyed("alice")).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        redis.cmd(&["GET", "ratelimit:{v1:hdr:x-key:alice}:period:burst"]),
        "2"
    );
    assert_eq!(
        redis.cmd(&["GET", "ratelimit:{v1:hdr:x-key:alice}:period:daily"]),
        "2"
    );
}

/// When the inner (daily) layer refuses, the response lists both policies and the
/// longest wait; the outer layer's unit was spent (documented: put the short limit
/// outermost, whose units come back soon).
#[tokio::test]
async fn an_inner_rejection_lists_every_policy_and_the_longest_wait() {
    let backend = Backend::in_process();
    let (burst, daily) = burst_and_daily(&backend, 10, 1);
    let (calls, svc) = stack(burst.clone(), daily);
    let ok = svc.clone().oneshot(keyed("bob")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let body = ok.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"decision: true");
    let refused = svc.oneshot(keyed("bob")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let headers = refused.headers();
    assert_eq!(
        value(headers, &RATELIMIT_POLICY),
        "\"burst\";q=10;w=10, \"daily\";q=1;w=86400"
    );
    assert!(value(headers, &RATELIMIT).starts_with("\"burst\";r=8;t="));
    let retry: u64 = value(headers, &header::RETRY_AFTER).parse().unwrap();
    assert!(retry > 80_000, "the daily wait, not the burst's: {retry}");
    let spent = burst
        .limiter()
        .check(b"hdr:x-key:bob", NonZeroU32::new(8).unwrap())
        .await;
    assert_eq!(spent.state, State::HitQuota, "two burst units were spent");
}

// ---------------------------------------------------------------------------
// Shadow mode
// ---------------------------------------------------------------------------

#[tokio::test]
async fn shadow_mode_serves_everything_and_adds_no_headers() {
    let (calls, svc) = counting(shadow_layer(&Backend::in_process(), 1));
    for _ in 0..3 {
        let response = svc.clone().oneshot(keyed("a")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get(RATELIMIT).is_none());
        assert!(response.headers().get(RATELIMIT_POLICY).is_none());
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &body[..],
            b"decision: false",
            "a shadow layer leaves no decision"
        );
    }
    // Even without a key (an enforcing layer would answer 400).
    let response = svc.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn shadow_mode_on_redis_counts_like_enforcement_without_waiting() {
    let redis = RedisServer::start();
    let (calls, svc) = counting(shadow_layer(&redis.backend(), 2));
    for _ in 0..4 {
        let response = svc.clone().oneshot(keyed("a")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get(RATELIMIT).is_none());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    // The checks run in tasks of their own; they count what enforcement would count.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let count = redis.cmd(&["GET", "ratelimit:{v1:hdr:x-key:a}:period:shadow"]);
        if count == "2" {
            break;
        }
        assert!(Instant::now() < deadline, "count stuck at {count:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_shadow_layer_stacked_on_an_enforcing_one_stays_invisible() {
    let backend = Backend::in_process();
    let enforcing = LimitLayer::builder(&backend, PeriodConfig::new(2, Duration::from_secs(60)))
        .name("enforced")
        .key(HeaderKey::from_static("x-key"))
        .build()
        .unwrap();
    let (calls, svc) = stack(shadow_layer(&backend, 1), enforcing);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let response = svc.clone().oneshot(keyed("a")).await.unwrap();
        statuses.push(response.status());
        assert!(value(response.headers(), &RATELIMIT_POLICY).starts_with("\"enforced\";"));
        assert!(!value(response.headers(), &RATELIMIT_POLICY).contains("shadow"));
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
