//! Priority classes sharing one limit (issue 54, item 3: `LayerBuilder::priority`):
//! critical, standard and sheddable traffic spend from one limit; sheddable is refused
//! from 60% of it, standard from 85%, critical only at the last unit, in the same atomic
//! decision, in process and on Redis across two instances; the headers tell each class
//! its own remaining; a class's refusal is neither cached nor a lockout; the fallback
//! applies the classes to the limits in force.

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use support::RedisServer;
use tower::ServiceExt;
use tower_redis_ratelimit::key::{HeaderKey, TaggedKey};
use tower_redis_ratelimit::limit::Plans;
use tower_redis_ratelimit::{
    Backend, DynamicLimits, FailurePolicy, LimitLayer, LimitSet, PeriodConfig,
};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLayer};

/// The class a request names in `x-priority`: critical 1.0, sheddable 0.6, else 0.85.
fn class(parts: &http::request::Parts) -> f64 {
    match parts.headers.get("x-priority").map(|v| v.as_bytes()) {
        Some(b"critical") => 1.0,
        Some(b"sheddable") => 0.6,
        _ => 0.85,
    }
}

/// An app limited to 100 a minute per tenant, by class.
fn app(backend: &Backend, config: PeriodConfig) -> Router {
    let layer = LimitLayer::builder(backend, config)
        .name("api")
        .key(HeaderKey::from_static("x-tenant"))
        .priority(class)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// A request of `class` for tenant `t1`: its status and its `RateLimit` header.
async fn call(app: &Router, class: &str) -> (StatusCode, String) {
    let request = Request::get("/")
        .header("x-tenant", "t1")
        .header("x-priority", class)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let header = response
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (response.status(), header)
}

/// The `r=` of a `RateLimit` value.
fn remaining(header: &str) -> u64 {
    let r = header.split(';').find_map(|item| item.strip_prefix("r="));
    r.unwrap_or_else(|| panic!("no r= in {header:?}"))
        .parse()
        .unwrap()
}

/// Sends requests of `class` through `apps` in turn until one is refused: the number
/// admitted, and the remaining each admitted one was told, in order.
async fn until_refused(apps: &[&Router], class: &str) -> (usize, Vec<u64>) {
    let mut told = Vec::new();
    for i in 0..1_000 {
        let (status, header) = call(apps[i % apps.len()], class).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(remaining(&header), 0, "a refusal leaves its class nothing");
            return (told.len(), told);
        }
        assert_eq!(status, StatusCode::OK);
        told.push(remaining(&header));
    }
    panic!("never refused");
}

/// Sheddable gets 60 of 100, standard 25 more, critical the last 15; each admitted
/// request is told its own class's remaining; a lower class's refusal never refuses a
/// higher one (the deny cache keeps none of them); once critical has used the last unit
/// every class is refused.
async fn classes_on(apps: &[&Router]) {
    let (shed, told) = until_refused(apps, "sheddable").await;
    assert_eq!(shed, 60);
    assert_eq!(told, (0..60).rev().collect::<Vec<u64>>());
    // Refused again, and a standard request right after is admitted all the same.
    assert_eq!(
        call(apps[0], "sheddable").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (standard, told) = until_refused(apps, "standard").await;
    assert_eq!(standard, 25);
    assert_eq!(told, (0..25).rev().collect::<Vec<u64>>());
    let (critical, told) = until_refused(apps, "critical").await;
    assert_eq!(critical, 15);
    assert_eq!(told, (0..15).rev().collect::<Vec<u64>>());
    for class in ["critical", "standard", "sheddable"] {
        let (status, header) = call(apps[1 % apps.len()], class).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{class}");
        assert_eq!(remaining(&header), 0);
    }
}

#[tokio::test]
async fn classes_share_one_limit_in_process() {
    let backend = Backend::in_process();
    let app = app(&backend, PeriodConfig::new(100, Duration::from_secs(60)));
    classes_on(&[&app]).await;
}

#[tokio::test]
async fn classes_share_one_limit_across_two_instances_on_redis() {
    let redis = RedisServer::start();
    let backend = || {
        support::backend_builder()
            .redis_url(redis.url())
            .build()
            .unwrap()
    };
    let config = PeriodConfig::new(100, Duration::from_secs(60));
    let (one, two) = (app(&backend(), config), app(&backend(), config));
    classes_on(&[&one, &two]).await;
    // One counter on Redis, spent by every class: 100 units, each request one.
    let count = redis.cmd(&["GET", "ratelimit:{v1:hdr:x-tenant:t1}:period:api"]);
    assert_eq!(count.trim(), "100");
}

/// A lockout punishes a limit used up, not a class held back: sheddable refusals lock
/// nothing, so critical goes on; critical's own refusal then locks the tenant out.
#[tokio::test]
async fn a_class_refusal_is_no_lockout() {
    let redis = RedisServer::start();
    for backend in [
        Backend::in_process(),
        support::backend_builder()
            .redis_url(redis.url())
            .build()
            .unwrap(),
    ] {
        let config =
            PeriodConfig::new(10, Duration::from_secs(60)).lockout(Duration::from_secs(600));
        let app = app(&backend, config);
        for _ in 0..6 {
            assert_eq!(call(&app, "sheddable").await.0, StatusCode::OK);
        }
        for _ in 0..3 {
            assert_eq!(
                call(&app, "sheddable").await.0,
                StatusCode::TOO_MANY_REQUESTS
            );
        }
        for _ in 0..4 {
            assert_eq!(call(&app, "critical").await.0, StatusCode::OK);
        }
        assert_eq!(
            call(&app, "critical").await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        // Now locked out: the refusal says so for the lockout's length.
        let request = Request::get("/")
            .header("x-tenant", "t1")
            .header("x-priority", "critical")
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let retry: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry > 500, "locked out for the lockout: {retry} s");
    }
}

/// A set holds each class back on each of its limits, in one call: with 10 a minute
/// and a bucket of 20, sheddable gets 6 (60% of the window), and the headers list both
/// limits' remaining for the class.
#[tokio::test]
async fn a_set_holds_each_limit_back() {
    let redis = RedisServer::start();
    for backend in [
        Backend::in_process(),
        support::backend_builder()
            .redis_url(redis.url())
            .build()
            .unwrap(),
    ] {
        let set = LimitSet::new()
            .limit("minute", PeriodConfig::new(10, Duration::from_secs(60)))
            .limit(
                "burst",
                TokenBucketConfig::new(1, Duration::from_secs(3_600), 20),
            );
        let layer = LimitLayer::builder(&backend, set)
            .name("api")
            .key(HeaderKey::from_static("x-tenant"))
            .priority(class)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let (shed, _) = until_refused(&[&app], "sheddable").await;
        assert_eq!(shed, 6);
        let (status, header) = call(&app, "critical").await;
        assert_eq!(status, StatusCode::OK);
        // 7 spent: 3 left of the window, 13 of the bucket, for critical.
        assert!(
            header.contains("r=3;") && header.contains("r=13;"),
            "{header}"
        );
        let (_, header) = call(&app, "sheddable").await;
        assert!(header.contains("r=0;"), "{header}");
    }
}

/// A token bucket with leases: a class below 1 goes to Redis itself (a lease would spend
/// for every class), and is held back as any check.
#[tokio::test]
async fn a_leased_bucket_holds_classes_back_on_redis() {
    let redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis_url(redis.url())
        .build()
        .unwrap();
    let config =
        TokenBucketConfig::new(1, Duration::from_secs(3_600), 50).lease(10, Duration::from_secs(5));
    let layer: TokenBucketLayer<HeaderKey> = LimitLayer::builder(&backend, config)
        .name("api")
        .key(HeaderKey::from_static("x-tenant"))
        .priority(class)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (shed, _) = until_refused(&[&app], "sheddable").await;
    assert_eq!(shed, 30);
    let (standard, _) = until_refused(&[&app], "standard").await;
    assert_eq!(standard, 12);
    // Critical takes the last 8 through leases (a lease holds what is left).
    let (critical, _) = until_refused(&[&app], "critical").await;
    assert_eq!(critical, 8);
}

/// While Redis does not answer, the fallback applies each class to the limit in force
/// (this instance's share: all of it, as one instance).
#[tokio::test]
async fn the_fallback_applies_the_classes() {
    let backend = support::backend_builder()
        .redis_url("redis://127.0.0.1:1")
        .failure_policy(FailurePolicy::Fallback)
        .build()
        .unwrap();
    let app = app(&backend, PeriodConfig::new(100, Duration::from_secs(60)));
    let (shed, _) = until_refused(&[&app], "sheddable").await;
    assert_eq!(shed, 60);
    let (critical, _) = until_refused(&[&app], "critical").await;
    assert_eq!(critical, 40);
}

/// A layer of plans and one of limits from a store apply the classes to the limit that
/// applies to the request: its plan's, or the store's for its key.
#[tokio::test]
async fn classes_apply_under_plans_and_dynamic_limits() {
    let minute = Duration::from_secs(60);
    let plans = Plans::new(|parts: &http::request::Parts| {
        parts
            .headers
            .get("x-plan")
            .and_then(|v| v.to_str().ok().map(str::to_owned))
    })
    .plan("free".to_owned(), "free", PeriodConfig::new(10, minute))
    .plan("pro".to_owned(), "pro", PeriodConfig::new(100, minute));
    let layer = LimitLayer::builder(&Backend::in_process(), plans)
        .name("api")
        .key(HeaderKey::from_static("x-tenant"))
        .priority(class)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let sheddable_pro = || {
        Request::get("/")
            .header("x-tenant", "t1")
            .header("x-plan", "pro")
            .header("x-priority", "sheddable")
            .body(Body::empty())
            .unwrap()
    };
    let mut admitted = 0;
    while app.clone().oneshot(sheddable_pro()).await.unwrap().status() == StatusCode::OK {
        admitted += 1;
    }
    assert_eq!(admitted, 60, "60% of the pro plan's 100");

    // The store says 20 for t1: sheddable gets 12.
    let source = |key: TaggedKey<'_>| {
        let tenant = key.value().to_vec();
        async move { Ok::<_, std::io::Error>((tenant == b"t1").then_some(20)) }
    };
    let limits = DynamicLimits::new(PeriodConfig::new(100, minute), source);
    let layer = LimitLayer::builder(&Backend::in_process(), limits)
        .name("dynamic")
        .key(HeaderKey::from_static("x-tenant"))
        .priority(class)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (shed, _) = until_refused(&[&app], "sheddable").await;
    assert_eq!(shed, 12);
}

/// A stream limit keeps the class of the request that opened it.
#[tokio::test]
async fn a_stream_keeps_its_class() {
    let layer = LimitLayer::builder(
        &Backend::in_process(),
        PeriodConfig::new(10, Duration::from_secs(60)),
    )
    .name("messages")
    .key(HeaderKey::from_static("x-tenant"))
    .priority(class)
    .build()
    .unwrap();
    let (open, ()) = Request::get("/ws")
        .header("x-tenant", "t1")
        .header("x-priority", "sheddable")
        .body(())
        .unwrap()
        .into_parts();
    let stream = layer.stream(&open).unwrap();
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += usize::from(stream.check(std::num::NonZeroU32::MIN).await.is_admitted());
    }
    assert_eq!(admitted, 6);
}

/// A limiter of your own has no classes: a layer that names them fails to build rather
/// than ignore them.
#[test]
fn classes_on_a_limiter_of_your_own_do_not_build() {
    use tower_redis_ratelimit::limit::Algorithm;
    use tower_redis_ratelimit::{ConfigError, Limiter, PeriodLimiter, Policy};

    /// A built-in limiter wrapped in a limiter of your own.
    struct Wrapped(PeriodLimiter);
    impl Limiter for Wrapped {
        fn policy(&self) -> &Policy {
            self.0.policy()
        }
        fn check(
            &self,
            key: &[u8],
            cost: std::num::NonZeroU32,
        ) -> tower_redis_ratelimit::DecisionFuture {
            self.0.check(key, cost)
        }
    }
    struct Mine;
    impl Algorithm for Mine {
        type Limiter = Wrapped;
        fn build(self, backend: &Backend, name: &str) -> Result<Wrapped, ConfigError> {
            let config = PeriodConfig::new(10, Duration::from_secs(60));
            Ok(Wrapped(PeriodLimiter::new(backend, name, config)?))
        }
    }
    let backend = Backend::in_process();
    let mine = || {
        LimitLayer::builder(&backend, Mine)
            .name("mine")
            .key(HeaderKey::from_static("x-tenant"))
    };
    let error = mine().priority(class).build().unwrap_err();
    assert!(matches!(error, ConfigError::Conflict { .. }), "{error:?}");
    assert!(error.to_string().contains("priority"), "{error}");
    mine().build().unwrap();
}

/// Concurrent checks of many keys by classes go in batches, each item with its own
/// keeps, decided exactly as one by one: 40 keys, 10 checks each at once, of a limit of
/// 10 per key, half the keys sheddable (exactly 6 of each key's 10) and half standard
/// (8), the classes mixed in the batches, in far fewer calls than checks; the same for a
/// set, whose items carry one keep per member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_classes_go_in_batches_and_stay_exact() {
    let redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis_url(redis.url())
        .call_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let window = tower_redis_ratelimit::PeriodLimiter::new(
        &backend,
        "window",
        PeriodConfig::new(10, Duration::from_secs(60)),
    )
    .unwrap();
    let set = tower_redis_ratelimit::SetLimiter::new(
        &backend,
        "set",
        LimitSet::new()
            .limit("minute", PeriodConfig::new(10, Duration::from_secs(60)))
            .limit(
                "hour",
                TokenBucketConfig::new(1, Duration::from_secs(3_600), 20),
            ),
    )
    .unwrap();
    let limiters: [std::sync::Arc<dyn tower_redis_ratelimit::Limiter>; 2] =
        [std::sync::Arc::new(window), std::sync::Arc::new(set)];
    for limiter in limiters {
        // A first call, so that the batcher knows the round trip.
        let _ = limiter.check(b"warm-up", std::num::NonZeroU32::MIN).await;
        let before = redis.command_calls("evalsha");
        let mut checks = tokio::task::JoinSet::new();
        for round in 0..10 {
            for key in 0..40 {
                let limiter = std::sync::Arc::clone(&limiter);
                checks.spawn(async move {
                    let key = format!("k{key}");
                    let class = if key.ends_with(['0', '2', '4', '6', '8']) {
                        0.6
                    } else {
                        0.85
                    };
                    let decision = limiter
                        .check_priority(0, key.as_bytes(), std::num::NonZeroU32::MIN, class)
                        .await;
                    assert_eq!(
                        decision.source,
                        tower_redis_ratelimit::Source::Redis,
                        "{round}"
                    );
                    (key, decision.is_admitted())
                });
            }
        }
        let mut admitted = std::collections::BTreeMap::<String, usize>::new();
        while let Some(result) = checks.join_next().await {
            let (key, yes) = result.unwrap();
            *admitted.entry(key).or_default() += usize::from(yes);
        }
        assert_eq!(admitted.len(), 40);
        for (key, n) in &admitted {
            let even = key.ends_with(['0', '2', '4', '6', '8']);
            assert_eq!(*n, if even { 6 } else { 8 }, "{key}: {admitted:?}");
        }
        let calls = redis.command_calls("evalsha") - before;
        assert!(
            calls < 400,
            "{calls} engine calls for 400 checks: none batched"
        );
    }
}
