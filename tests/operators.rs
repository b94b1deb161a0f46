//! What operators see (issue 55's trial findings), each on the hosts it concerns: an
//! unblock that keeps the counts (in process, on Redis, on a cluster, and reaching a
//! second instance at once); admin by value on a plan layer, under the layer's own
//! name, answering each plan and refusing a refund that does not name one; a block of
//! a plan layer listed once; `RateLimit-Policy` that states the fallback's share; a
//! set's refusals labelled by the limit that refused them.
#![cfg(feature = "admin")]

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::routing::get;
use axum::Router;
use deadpool_redis::{cluster, Runtime};
use http::{Request, StatusCode};
use serde_json::Value;
use support::RedisCluster;
use support::RedisServer;
use tower::ServiceExt;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::limit::Plans;
use tower_redis_ratelimit::{deadpool_redis, AdminRouter, Backend, Limiter, SetLimiter};
use tower_redis_ratelimit::{LimitLayer, LimitSet, PeriodConfig, PeriodLimiter, Source};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const DAY: Duration = Duration::from_secs(86_400);
const MINUTE: Duration = Duration::from_secs(60);

/// Ten checks, a block, a refused check, an unblock: the next check is decided on the
/// count as it stood (9 989 of 10 000 left, not a fresh 9 999), and nothing is listed.
async fn unblock_keeps_the_count(limiter: &dyn Limiter, what: &str) {
    let key = b"k_abuser";
    for _ in 0..10 {
        assert!(limiter.check(key, ONE).await.is_admitted(), "{what}");
    }
    let before = limiter.peek(key, ONE).unwrap().await.remaining;
    let blocked = limiter.block(key, DAY).unwrap().await;
    assert!(!blocked.is_admitted(), "{what}: {blocked:?}");
    assert!(!limiter.check(key, ONE).await.is_admitted(), "{what}");
    assert_eq!(
        limiter.blocked(10).unwrap().await.unwrap().len(),
        1,
        "{what}"
    );

    let lifted = limiter.unblock(key).unwrap().await;
    assert!(lifted.is_admitted(), "{what}: {lifted:?}");
    assert_eq!(lifted.retry_after, None, "{what}: {lifted:?}");
    let after = limiter.check(key, ONE).await;
    assert!(after.is_admitted(), "{what}: {after:?}");
    // What a check would have left before the block is what it leaves now.
    assert_eq!(after.remaining, before, "{what}: {after:?}");
    assert!(
        limiter.blocked(10).unwrap().await.unwrap().is_empty(),
        "{what}"
    );
    // Unblocking a key that is not blocked changes nothing.
    let again = limiter.unblock(key).unwrap().await;
    assert_eq!(again.remaining, before, "{what}: {again:?}");
}

/// Every algorithm and a set on `backend`.
async fn every_algorithm_keeps_its_count(backend: &Backend, host: &str) {
    let period = PeriodLimiter::new(backend, "daily", PeriodConfig::new(10_000, DAY)).unwrap();
    let bucket =
        TokenBucketLimiter::new(backend, "bucket", TokenBucketConfig::new(1, MINUTE, 10_000))
            .unwrap();
    let rolling =
        RollingWindowLimiter::new(backend, "rolling", RollingConfig::new(10_000, 24, DAY)).unwrap();
    let set = LimitSet::new()
        .limit("minute", PeriodConfig::new(600, MINUTE))
        .limit("day", PeriodConfig::new(10_000, DAY));
    let set = SetLimiter::new(backend, "set", set).unwrap();
    unblock_keeps_the_count(&period, &format!("{host}: period")).await;
    unblock_keeps_the_count(&bucket, &format!("{host}: token bucket")).await;
    unblock_keeps_the_count(&rolling, &format!("{host}: rolling")).await;
    unblock_keeps_the_count(&set, &format!("{host}: set")).await;
}

#[tokio::test]
async fn unblock_keeps_the_counts_in_process() {
    every_algorithm_keeps_its_count(&Backend::in_process(), "in process").await;
}

#[tokio::test]
async fn unblock_keeps_the_counts_on_redis() {
    let redis = RedisServer::start();
    every_algorithm_keeps_its_count(&redis.backend(), "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unblock_keeps_the_counts_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let pool = cluster::Config::from_urls(cluster.urls())
        .create_pool(Some(Runtime::Tokio1))
        .unwrap();
    let backend = support::backend_builder()
        .redis_cluster(pool)
        .build()
        .unwrap();
    every_algorithm_keeps_its_count(&backend, "cluster").await;
}

/// The trial's app: per-plan limits by API key (`x-plan` names the plan), the admin
/// router beside it.
fn plan_app(backend: &Backend) -> Router {
    let plans =
        Plans::new(
            |parts: &http::request::Parts| match parts.headers.get("x-plan")?.as_bytes() {
                b"pro" => Some("pro"),
                _ => Some("free"),
            },
        )
        .plan("free", "free", PeriodConfig::new(60, MINUTE))
        .plan("pro", "pro", PeriodConfig::new(600, MINUTE));
    let api = LimitLayer::builder(backend, plans)
        .name("api")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
    let admin = AdminRouter::new().limit(&api).into_router();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(api)
        .nest("/admin", admin)
}

async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = to_bytes(response.into_body(), 64 * 1024).await.unwrap();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, headers, json)
}

const PRO: [(&str, &str); 2] = [("x-api-key", "k_pro1"), ("x-plan", "pro")];

/// The `r` of the response's `RateLimit`.
fn remaining(headers: &http::HeaderMap) -> u64 {
    let value = headers["ratelimit"].to_str().unwrap();
    let r = value.split(";r=").nth(1).expect("an r");
    r.split(';').next().unwrap().parse().unwrap()
}

async fn admin_acts_on_the_plan_of_the_key(backend: &Backend) {
    let app = plan_app(backend);
    for _ in 0..6 {
        assert_eq!(call(&app, "GET", "/", &PRO).await.0, StatusCode::OK);
    }
    // The layer by its own name; its plans listed.
    let (status, _, limits) = call(&app, "GET", "/admin", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(limits["limits"][0]["name"], "api", "{limits}");
    assert_eq!(
        limits["limits"][0]["policies"],
        serde_json::json!(["api.free", "api.pro"]),
        "{limits}"
    );
    assert_eq!(
        call(&app, "GET", "/admin/api.free/k_pro1", &[]).await.0,
        StatusCode::NOT_FOUND
    );

    // A peek answers under each plan, each entry naming its plan.
    let (status, _, peek) = call(&app, "GET", "/admin/api/k_pro1", &[]).await;
    assert_eq!(status, StatusCode::OK, "{peek}");
    let keys = peek["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{peek}");
    assert_eq!(
        (&keys[0]["policy"], &keys[0]["limit"], &keys[0]["remaining"]),
        (&"api.free".into(), &60.into(), &59.into()),
        "{peek}"
    );
    assert_eq!(
        (&keys[1]["policy"], &keys[1]["limit"], &keys[1]["remaining"]),
        (&"api.pro".into(), &600.into(), &593.into()),
        "{peek}"
    );

    // A refund must name its plan: never a 200 on another limit.
    let (status, _, refused) = call(&app, "POST", "/admin/api/k_pro1/refund?units=1", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let message = refused["error"].as_str().unwrap();
    assert!(message.contains("api.free, api.pro"), "{message}");
    let (status, _, wrong) = call(
        &app,
        "POST",
        "/admin/api/k_pro1/refund?policy=api.gold",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{wrong}");
    let (status, _, refunded) = call(
        &app,
        "POST",
        "/admin/api/k_pro1/refund?units=1&policy=api.pro",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{refunded}");
    assert_eq!(
        refunded["policies"],
        serde_json::json!(["api.pro"]),
        "{refunded}"
    );
    assert_eq!(refunded["keys"][0]["policy"], "api.pro", "{refunded}");
    assert_eq!(refunded["keys"][0]["remaining"], 595, "{refunded}");
    // The next pro request sees the unit back.
    let (status, headers, _) = call(&app, "GET", "/", &PRO).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(remaining(&headers), 594);

    // A block is listed once, under the layer's name.
    let (status, _, blocked) = call(&app, "POST", "/admin/api/k_pro1/block?seconds=600", &[]).await;
    assert_eq!(status, StatusCode::OK, "{blocked}");
    assert_eq!(
        blocked["policies"],
        serde_json::json!(["api.free", "api.pro"]),
        "{blocked}"
    );
    assert_eq!(
        call(&app, "GET", "/", &PRO).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (status, _, listed) = call(&app, "GET", "/admin/blocked", &[]).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let entries = listed["blocked"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["limit"], "api", "{listed}");
    assert_eq!(entries[0]["value"], "k_pro1", "{listed}");

    // Lifted, the count kept under every plan.
    let (status, _, lifted) = call(&app, "POST", "/admin/api/k_pro1/unblock", &[]).await;
    assert_eq!(status, StatusCode::OK, "{lifted}");
    let (status, headers, _) = call(&app, "GET", "/", &PRO).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(remaining(&headers), 593);
    let (_, _, listed) = call(&app, "GET", "/admin/blocked", &[]).await;
    assert_eq!(listed["blocked"], serde_json::json!([]), "{listed}");
}

#[tokio::test]
async fn admin_acts_on_the_plan_of_the_key_in_process() {
    admin_acts_on_the_plan_of_the_key(&Backend::in_process()).await;
}

#[tokio::test]
async fn admin_acts_on_the_plan_of_the_key_on_redis() {
    let redis = RedisServer::start();
    admin_acts_on_the_plan_of_the_key(&redis.backend()).await;
}

/// Instance B caches its refusal of a blocked key for 30 s; an unblock on A reaches it
/// at once (the change subscription), and B goes on from the count as it stood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unblock_reaches_every_instance_at_once() {
    let redis = RedisServer::start();
    let backend = || {
        support::backend_builder()
            .redis_url(redis.url())
            .deny_cache_max_age(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (a, b) = (plan_app(&backend()), plan_app(&backend()));
    for _ in 0..3 {
        assert_eq!(call(&a, "GET", "/", &PRO).await.0, StatusCode::OK);
    }
    let (status, _, _) = call(&a, "POST", "/admin/api/k_pro1/block?seconds=600", &[]).await;
    assert_eq!(status, StatusCode::OK);
    for _ in 0..2 {
        assert_eq!(
            call(&b, "GET", "/", &PRO).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(
        support::channel_subscribers(&redis, "ratelimit:changes", 2).await,
        2
    );
    let (status, _, _) = call(&a, "POST", "/admin/api/k_pro1/unblock", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let started = std::time::Instant::now();
    loop {
        let (status, headers, _) = call(&b, "GET", "/", &PRO).await;
        if status == StatusCode::OK {
            // Three spent before the block, this one the fourth.
            assert_eq!(remaining(&headers), 596);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "B still refuses"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// During the fallback, `RateLimit-Policy` states the share in force for every limit
/// of a set (as the peek does), not the configured quota.
#[tokio::test]
async fn the_fallback_states_its_share_in_the_policy_header() {
    let mut redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis(redis.pool())
        .call_timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_secs(60))
        .fallback_share(0.5)
        .build()
        .unwrap();
    let set = LimitSet::new()
        .limit("minute", PeriodConfig::new(600, MINUTE))
        .limit("day", PeriodConfig::new(10_000, DAY));
    let single = LimitLayer::builder(&backend, PeriodConfig::new(600, MINUTE))
        .name("single")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
    let layer = LimitLayer::builder(&backend, set)
        .name("api")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone())
        .layer(single);
    let key = [("x-api-key", "k1")];
    let (_, headers, _) = call(&app, "GET", "/", &key).await;
    assert_eq!(
        headers["ratelimit-policy"],
        "\"single\";q=600;w=60, \"api.minute\";q=600;w=60, \"api.day\";q=10000;w=86400"
    );
    redis.kill();
    let (status, headers, _) = call(&app, "GET", "/", &key).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["ratelimit-policy"],
        "\"single\";q=300;w=60, \"api.minute\";q=300;w=60, \"api.day\";q=5000;w=86400"
    );
    let peek = layer.peek_value("k1", ONE).await.unwrap();
    assert_eq!((peek[0].1.source, peek[0].1.limit), (Source::Fallback, 300));
}

/// A set's refusals counted by the limit that refused; its Redis calls under the set's
/// name, as its requests are.
#[tokio::test]
async fn a_sets_refusals_are_labelled_by_the_limit_that_refused() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    let redis = RedisServer::start();
    // A burst of 2, one back every 100 ms, and 4 a day.
    let set = LimitSet::new()
        .limit(
            "burst",
            TokenBucketConfig::new(1, Duration::from_millis(100), 2),
        )
        .limit("day", PeriodConfig::new(4, DAY));
    let layer = LimitLayer::builder(&redis.backend(), set)
        .name("api")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let status = |key: &'static str| {
        let app = app.clone();
        async move { call(&app, "GET", "/", &[("x-api-key", key)]).await.0 }
    };
    // k1: two admitted, the third refused by the burst.
    for expected in [200, 200, 429] {
        assert_eq!(status("k1").await, expected);
    }
    // k2: four admitted over time, the fifth refused by the day.
    for expected in [200, 200, 200, 200, 429] {
        assert_eq!(status("k2").await, expected);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // k3: refused by the set's block.
    layer.block_value("k3", MINUTE).await.unwrap();
    assert_eq!(status("k3").await, 429);

    let mut counters = std::collections::BTreeMap::new();
    let mut histograms = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        match value {
            DebugValue::Counter(n) => {
                counters.insert(name, n);
            }
            DebugValue::Histogram(_) => histograms.push(name),
            DebugValue::Gauge(_) => {}
        }
    }
    let rejected = |limit: &str| {
        counters
            .get(&format!(
                "ratelimit_requests_total{{limit={limit},outcome=rejected,policy=api}}"
            ))
            .copied()
            .unwrap_or_else(|| panic!("no refusals by {limit}: {counters:#?}"))
    };
    assert_eq!(rejected("api.burst"), 1, "{counters:#?}");
    assert_eq!(rejected("api.day"), 1, "{counters:#?}");
    // The block: the set's own.
    assert_eq!(rejected("api"), 1, "{counters:#?}");
    assert_eq!(
        histograms,
        ["ratelimit_redis_duration_seconds{policy=api}"],
        "{histograms:?}"
    );
}

/// The keys refused most, by value, from the admin router (this instance's sketch).
#[tokio::test]
async fn the_keys_refused_most_are_listed_with_their_values() {
    let redis = RedisServer::start();
    let layer = LimitLayer::builder(&redis.backend(), PeriodConfig::new(2, MINUTE))
        .name("api")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
    let admin = AdminRouter::new().limit(&layer).into_router();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .nest("/admin", admin);
    for (key, times) in [("k1", 10), ("k2", 5), ("k3", 2)] {
        for _ in 0..times {
            call(&app, "GET", "/", &[("x-api-key", key)]).await;
        }
    }
    let (status, _, denied) = call(&app, "GET", "/admin/denied?max=2", &[]).await;
    assert_eq!(status, StatusCode::OK, "{denied}");
    let entries = denied["denied"].as_array().unwrap();
    let got: Vec<(&str, &str, u64, u64)> = entries
        .iter()
        .map(|e| {
            let text = |f: &str| e[f].as_str().unwrap();
            (
                text("key"),
                text("value"),
                e["count"].as_u64().unwrap(),
                e["error"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("hdr:x-api-key:k1", "k1", 8, 0),
            ("hdr:x-api-key:k2", "k2", 3, 0)
        ]
    );
    assert_eq!(entries[0]["limit"], "api");
    assert_eq!(
        call(&app, "GET", "/admin/denied?limit=nope", &[]).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&app, "GET", "/admin/denied?max=0", &[]).await.0,
        StatusCode::BAD_REQUEST
    );
}

/// The engine calls the server has run (either path, writing or read-only).
fn engine_calls(redis: &RedisServer) -> u64 {
    ["evalsha", "evalsha_ro", "fcall_ro"]
        .iter()
        .map(|command| redis.command_calls(command))
        .sum()
}

/// A caller's usage: a plan layer whose pro plan is a set, inside a per-key token bucket
/// (two stacked layers), answered from peeks of the limits that enforce, nothing spent,
/// one engine call per layer; the same numbers a peek of each limit gives.
#[tokio::test]
async fn the_usage_route_answers_what_the_limits_enforce() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let set = LimitSet::new()
        .limit("minute", PeriodConfig::new(600, MINUTE))
        .limit("day", PeriodConfig::new(10_000, DAY));
    let plans =
        Plans::new(
            |parts: &http::request::Parts| match parts.headers.get("x-plan")?.as_bytes() {
                b"pro" => Some("pro"),
                _ => Some("free"),
            },
        )
        .plan(
            "free",
            "free",
            LimitSet::new().limit("minute", PeriodConfig::new(60, MINUTE)),
        )
        .plan("pro", "pro", set);
    let api = LimitLayer::builder(&backend, plans)
        .name("api")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
    let burst = LimitLayer::builder(&backend, TokenBucketConfig::new(1, MINUTE, 20))
        .name("burst")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
    let limits = AdminRouter::new().limit(&api).limit(&burst);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(api.clone())
        .layer(burst.clone())
        .nest("/rate_limit", limits.usage_router());
    for _ in 0..5 {
        assert_eq!(call(&app, "GET", "/", &PRO).await.0, StatusCode::OK);
    }

    let before = engine_calls(&redis);
    let (status, headers, usage) = call(&app, "GET", "/rate_limit", &PRO).await;
    assert_eq!(status, StatusCode::OK, "{usage}");
    // One call per layer: the plan's set is one.
    assert_eq!(engine_calls(&redis) - before, 2);
    let rows: Vec<(String, String, u64, u64, u64, u64)> = usage["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let n = |f: &str| l[f].as_u64().unwrap();
            let name = l["name"].as_str().unwrap().to_owned();
            let algorithm = l["algorithm"].as_str().unwrap().to_owned();
            (
                name,
                algorithm,
                n("limit"),
                n("used"),
                n("remaining"),
                n("window_s"),
            )
        })
        .collect();
    let row = |name: &str, algorithm: &str, limit: u64, used: u64, window: u64| {
        (
            name.to_owned(),
            algorithm.to_owned(),
            limit,
            used,
            limit - used,
            window,
        )
    };
    assert_eq!(
        rows,
        [
            row("api.pro.minute", "fixed_window", 600, 5, 60),
            row("api.pro.day", "fixed_window", 10_000, 5, 86_400),
            row("burst", "token_bucket", 20, 5, 1_200),
        ],
        "{usage}"
    );
    // The same headers the layers send, one item per limit.
    assert_eq!(
        headers["ratelimit-policy"],
        "\"api.pro.minute\";q=600;w=60, \"api.pro.day\";q=10000;w=86400, \"burst\";q=20;w=1200"
    );
    let ratelimit = headers["ratelimit"].to_str().unwrap();
    assert!(
        ratelimit.starts_with("\"api.pro.minute\";r=595;t="),
        "{ratelimit}"
    );
    assert!(ratelimit.contains("\"burst\";r=15;t="), "{ratelimit}");
    // Nothing spent: what a peek of each limit says (a peek of one unit leaves one
    // fewer), before and after.
    let key = b"hdr:x-api-key:k_pro1";
    let pro = api.limiter().plan(&"pro").unwrap();
    let each = pro.peek_limits(key, NonZeroU32::MIN).await;
    let left: Vec<u64> = each.iter().map(|(_, d)| d.remaining + 1).collect();
    assert_eq!(left, [595, 9_995]);
    let bucket = burst.limiter().peek(key, NonZeroU32::MIN).unwrap().await;
    assert_eq!(bucket.remaining + 1, 15);
    let (_, _, again) = call(&app, "GET", "/rate_limit", &PRO).await;
    assert_eq!(again["limits"], usage["limits"]);
    // A free key: the free plan's limit.
    let (_, _, free) = call(&app, "GET", "/rate_limit", &[("x-api-key", "k_free")]).await;
    assert_eq!(free["limits"][0]["name"], "api.free.minute", "{free}");
    assert_eq!(free["limits"][0]["used"], 0, "{free}");
}

/// The usage of two stacked layers on one backend is one round trip: both layers' peeks
/// reach Redis before the first reply comes back (every reply held 200 ms by the proxy,
/// both are read from the server within the first 100 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_of_stacked_layers_is_one_round_trip() {
    let redis = RedisServer::start();
    let proxy = support::proxy::FaultProxy::start(redis.port());
    let backend = support::backend_builder()
        .redis(proxy.pool())
        .call_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let key = || HeaderKey::from_static("x-api-key");
    let minute = LimitLayer::builder(&backend, PeriodConfig::new(60, MINUTE))
        .name("minute")
        .key(key())
        .build()
        .unwrap();
    let day = LimitLayer::builder(&backend, PeriodConfig::new(1_000, DAY))
        .name("day")
        .key(key())
        .build()
        .unwrap();
    let limits = AdminRouter::new().limit(&minute).limit(&day);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(minute)
        .layer(day)
        .nest("/rate_limit", limits.usage_router());
    // The connection made and the engine loaded.
    backend.warm_up().await.unwrap();
    let (status, headers, _) = call(&app, "GET", "/", &PRO).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(remaining(&headers), 999, "{headers:?}");
    assert_eq!(
        call(&app, "GET", "/rate_limit", &PRO).await.0,
        StatusCode::OK
    );

    proxy.hold_replies(1.0, Duration::from_millis(200));
    let before = proxy.stats().replies;
    let asked = tokio::spawn({
        let app = app.clone();
        async move { call(&app, "GET", "/rate_limit", &PRO).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        proxy.stats().replies - before,
        2,
        "the second peek waited for the first"
    );
    let (status, _, usage) = asked.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{usage}");
    let used: Vec<u64> = usage["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["used"].as_u64().unwrap())
        .collect();
    assert_eq!(used, [1, 1], "{usage}");
}
