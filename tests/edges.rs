//! Limits at the edges of real services, through the `tenants` example: per user, per
//! plan and per merchant, exports limited in flight, the reports pair and stacked burst
//! and daily limits; and the metrics recorded. Stacked limits and shadow mode on a plain
//! tower stack are `tests/stacked.rs`.

mod support;

#[path = "../examples/tenants.rs"]
#[allow(dead_code, unreachable_pub)]
mod tenants;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use http::{header, Method, Request, Response, StatusCode};
use support::http::value;
use support::http::{RATELIMIT, RATELIMIT_POLICY};
use support::RedisServer;
use tower::ServiceExt;
use tower_redis_ratelimit::Backend;
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

// ---------------------------------------------------------------------------
// The `tenants` example: per user, per plan, per merchant
// ---------------------------------------------------------------------------

async fn send(
    app: &Router,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> (Response<()>, String) {
    let mut req = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    support::http::read(response).await
}

const FREE: (&str, &str) = ("authorization", "Bearer free-token");
const PAID: (&str, &str) = ("authorization", "Bearer paid-token");

async fn per_user_and_per_plan(backend: Backend) {
    let app = tenants::app(&backend).unwrap();
    let (response, _) = send(&app, Method::GET, "/profile", &[]).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // The free user: 10 per minute, under the policy of the free plan.
    for remaining in (0..10).rev() {
        let (response, body) = send(&app, Method::GET, "/profile", &[FREE]).await;
        assert_eq!(response.status(), StatusCode::OK, "{body}");
        assert!(body.starts_with("user-free: "), "{body}");
        // Only the enforced policy is advertised: the shadow trial adds nothing.
        assert_eq!(
            value(response.headers(), &RATELIMIT_POLICY),
            "\"profile.free\";q=10;w=60"
        );
        assert!(value(response.headers(), &RATELIMIT)
            .starts_with(&format!("\"profile.free\";r={remaining};t=")));
    }
    let (response, _) = send(&app, Method::GET, "/profile", &[FREE]).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(value(response.headers(), &RATELIMIT).starts_with("\"profile.free\";r=0;t="));

    // The paid user, through the same layer: the paid plan's limit and policy.
    for _ in 0..11 {
        let (response, _) = send(&app, Method::GET, "/profile", &[PAID]).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let (response, body) = send(&app, Method::GET, "/profile", &[PAID]).await;
    assert_eq!(body, "user-paid: Allowed, 988 of 1000 left\n");
    assert_eq!(
        value(response.headers(), &RATELIMIT_POLICY),
        "\"profile.paid\";q=1000;w=60"
    );
}

#[tokio::test]
async fn per_user_and_per_plan_limits_in_process() {
    per_user_and_per_plan(Backend::in_process()).await;
}

#[tokio::test]
async fn per_user_and_per_plan_limits_on_redis() {
    let redis = RedisServer::start();
    per_user_and_per_plan(redis.backend()).await;
    // Each plan counts in a namespace of its own.
    assert_eq!(
        redis.cmd(&["GET", "ratelimit:{v1:ext::user-free}:period:profile.free"]),
        "10"
    );
    assert_eq!(
        redis.cmd(&["GET", "ratelimit:{v1:ext::user-paid}:period:profile.paid"]),
        "12"
    );
}

/// The `tenants` example's admin router: behind its own token (not a user's), the
/// reports pair of a merchant blocked, listed under the set's name with the merchant
/// id, lifted; on two instances of one Redis.
#[tokio::test]
async fn an_operator_blocks_lists_and_lifts_a_merchant() {
    let redis = RedisServer::start();
    let instance = || {
        let backend = support::backend_builder()
            .redis_url(redis.url())
            .prefix("tenants")
            // (Not the default 100 ms: a busy machine must not turn a call, the first
            // one connecting, into the failure policy's answer.)
            .call_timeout(support::CALL_TIMEOUT)
            .build()
            .unwrap();
        tenants::app_with_admin(&backend, "s3cret").unwrap()
    };
    let (one, other) = (instance(), instance());
    let reports = [FREE, ("x-merchant-id", "m1")];
    assert_eq!(
        send(&one, Method::GET, "/reports", &reports)
            .await
            .0
            .status(),
        StatusCode::OK
    );
    let status = |app: &Router, method: Method, path: &str, token: &str| {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        let app = app.clone();
        async move {
            let (response, body) = support::http::read(app.oneshot(req).await.unwrap()).await;
            (response.status(), body)
        }
    };

    // A user's token is not the admin token.
    let blocked = "/admin/ratelimit/blocked";
    let (code, _) = status(&other, Method::GET, blocked, "free-token").await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);

    let block = "/admin/ratelimit/reports/m1/block?seconds=60";
    let (code, body) = status(&one, Method::POST, block, "s3cret").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        send(&other, Method::GET, "/reports", &reports)
            .await
            .0
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let (code, body) = status(&other, Method::GET, blocked, "s3cret").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let entries = listed["blocked"].as_array().expect("a list");
    assert_eq!(entries.len(), 1, "{body}");
    assert_eq!(entries[0]["limit"], "reports", "{body}");
    assert_eq!(entries[0]["key"], "hdr:x-merchant-id:m1", "{body}");
    assert_eq!(entries[0]["value"], "m1", "{body}");

    let (code, body) = status(
        &other,
        Method::POST,
        "/admin/ratelimit/reports/m1/reset",
        "s3cret",
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (_, body) = status(&one, Method::GET, blocked, "s3cret").await;
    assert_eq!(body, r#"{"blocked":[]}"#);
    let start = Instant::now();
    while send(&one, Method::GET, "/reports", &reports)
        .await
        .0
        .status()
        != StatusCode::OK
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "still refused after the reset"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET /export?ms=N` of the `tenants` example, for merchant `m` through `app`: the
/// response as soon as it starts (its body still streaming).
async fn start_export(app: &Router, ms: Option<u64>, m: &str) -> Response<axum::body::Body> {
    let path = ms.map_or("/export".to_owned(), |ms| format!("/export?ms={ms}"));
    let req = Request::get(path)
        .header(FREE.0, FREE.1)
        .header("x-merchant-id", m)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap()
}

/// How long the two exports of [`exports_in_flight`] run, in ms: well past a lease of the
/// Redis test and the wait after it.
const EXPORT_MS: u64 = 2_000;

/// The lease of the Redis test: renewed every 300 ms, so a renewal may come 600 ms late
/// before a slot runs out (at 300 ms, renewed every 100 ms, a busy CI machine's renewal
/// was once 200 ms late).
const REDIS_LEASE: Duration = Duration::from_millis(900);

/// At most 2 exports of one merchant in flight across `apps` (instances sharing a
/// backend or a Redis): a slot is held until the export's last row is sent.
async fn exports_in_flight(apps: [Router; 2]) {
    let started = Instant::now();
    let first = start_export(&apps[0], Some(EXPORT_MS), "m-1").await;
    let second = start_export(&apps[1], Some(EXPORT_MS), "m-1").await;
    // Both slots are taken (their leases start) by now.
    let taken = Instant::now();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);
    for app in &apps {
        let (response, _) = support::http::read(start_export(app, Some(0), "m-1").await).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(value(response.headers(), &header::RETRY_AFTER), "1");
    }
    // Another merchant has slots of its own.
    let (response, body) = support::http::read(start_export(&apps[0], Some(0), "m-2").await).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body, "done\n");
    // Past a lease of the Redis test from when the slots were taken (leases that were
    // not renewed have run out), the exports still hold their slots.
    tokio::time::sleep_until((taken + REDIS_LEASE + Duration::from_millis(300)).into()).await;
    let (response, _) = support::http::read(start_export(&apps[1], Some(0), "m-1").await).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    // The exports stream their rows for their whole time.
    let (_, rows) = support::http::read(first).await;
    assert!(
        rows.starts_with("row 0\nrow 1\n") && rows.ends_with("done\n"),
        "{rows}"
    );
    let (_, _) = support::http::read(second).await;
    assert!(started.elapsed() >= Duration::from_millis(EXPORT_MS));
    // Both slots come back once the bodies end.
    let start = Instant::now();
    loop {
        let (response, _) = support::http::read(start_export(&apps[1], Some(0), "m-1").await).await;
        if response.status() == StatusCode::OK {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the slots never came back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn exports_are_limited_in_flight_in_process() {
    let backend = Backend::in_process();
    let lease = Duration::from_secs(10);
    let apps = [
        tenants::app_with_export_lease(&backend, lease).unwrap(),
        tenants::app_with_export_lease(&backend, lease).unwrap(),
    ];
    exports_in_flight(apps).await;
    // Without `ms`, an export works for one second.
    let started = Instant::now();
    let (response, body) =
        support::http::read(start_export(&tenants::app(&backend).unwrap(), None, "m-3").await)
            .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        started.elapsed() >= Duration::from_millis(1_000),
        "{:?}",
        started.elapsed()
    );
    assert!(
        body.contains("row 9\n") && body.ends_with("done\n"),
        "{body}"
    );
    assert!(tenants::app_with_export_lease(&backend, Duration::ZERO).is_err());
}

/// Two instances on one Redis, each with its own connection, and a lease (900 ms)
/// shorter than the exports (2 s): the renewal keeps their slots.
#[tokio::test]
async fn exports_are_limited_in_flight_across_instances_on_redis() {
    let redis = RedisServer::start();
    let mut apps = Vec::new();
    for _ in 0..2 {
        let backend = support::backend_builder()
            .redis_url(redis.url())
            .prefix("tenants")
            // (A busy machine must not turn a slow call into the failure policy's answer.)
            .call_timeout(support::CALL_TIMEOUT)
            .build()
            .unwrap();
        // Connected first: no export may fall back for want of a connection.
        backend.warm_up().await.unwrap();
        apps.push(tenants::app_with_export_lease(&backend, REDIS_LEASE).unwrap());
    }
    exports_in_flight(apps.try_into().unwrap()).await;
}

#[tokio::test]
async fn per_merchant_limits_key_on_the_merchant_header() {
    let app = tenants::app(&Backend::in_process()).unwrap();
    let m1 = [FREE, ("x-merchant-id", "m-1")];
    for _ in 0..20 {
        let (response, _) = send(&app, Method::POST, "/payments", &m1).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let (response, _) = send(&app, Method::POST, "/payments", &m1).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another merchant of the same user is not affected.
    let (response, _) = send(
        &app,
        Method::POST,
        "/payments",
        &[PAID, ("x-merchant-id", "m-2")],
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let (response, _) = send(&app, Method::POST, "/payments", &[FREE]).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST, "no merchant id");
}

/// `GET /reports`: an atomic pair (2 per second, 10 per day) per merchant, the only limit
/// of its route: one script call per request, both limits in the headers, burst first.
/// On the server's clock frozen: the burst gives nothing back between the requests.
#[tokio::test]
async fn the_reports_pair_is_one_script_call_per_request() {
    let (redis, clock) = RedisServer::start_with_clock();
    // (On real time the third request had to come within 500 ms of the first, before a
    // token came back; the pair decides on the server's clock, which now stands still.)
    clock.freeze_now();
    let backend = redis.uncached_backend();
    let app = tenants::app(&backend).unwrap();
    let merchant = [FREE, ("x-merchant-id", "m-7")];
    // The first request loads the script.
    send(
        &app,
        Method::GET,
        "/reports",
        &[FREE, ("x-merchant-id", "warm")],
    )
    .await;
    let before = redis.command_calls("evalsha");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let (response, _) = send(&app, Method::GET, "/reports", &merchant).await;
        statuses.push(response.status().as_u16());
        assert_eq!(
            value(response.headers(), &RATELIMIT_POLICY),
            "\"reports.burst\";q=2;w=1, \"reports.daily\";q=10;w=86400"
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(
        redis.command_calls("evalsha") - before,
        3,
        "one call per request"
    );
    assert_eq!(
        redis.cmd(&[
            "GET",
            "ratelimit:{v1:hdr:x-merchant-id:m-7}:set:7:reports:period:daily"
        ]),
        "2",
        "the refused request did not use daily quota"
    );
}

#[tokio::test]
async fn stacked_burst_and_daily_in_the_example() {
    let redis = RedisServer::start();
    let app = tenants::app(&redis.backend()).unwrap();
    for remaining in [2, 1, 0] {
        let (response, _) = send(&app, Method::GET, "/search", &[FREE]).await;
        assert_eq!(response.status(), StatusCode::OK);
        // One header line per field, listing both policies, the outer (burst) first.
        assert_eq!(
            response.headers().get_all(&RATELIMIT_POLICY).iter().count(),
            1
        );
        assert_eq!(
            value(response.headers(), &RATELIMIT_POLICY),
            "\"search-burst\";q=3;w=3, \"search-daily\";q=100;w=86400"
        );
        let ratelimit = value(response.headers(), &RATELIMIT);
        assert!(
            ratelimit.starts_with(&format!("\"search-burst\";r={remaining};t=")),
            "{ratelimit}"
        );
        assert!(
            ratelimit.contains(&format!(", \"search-daily\";r={};t=", 97 + remaining)),
            "{ratelimit}"
        );
    }
    let (response, _) = send(&app, Method::GET, "/search", &[FREE]).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        value(response.headers(), &RATELIMIT_POLICY),
        "\"search-burst\";q=3;w=3",
        "a request refused by the outer layer never reaches the inner one"
    );
    assert_eq!(
        redis.cmd(&["GET", "ratelimit:{v1:ext::user-free}:period:search-daily"]),
        "3",
        "the refused request did not use daily quota"
    );
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

#[cfg(feature = "metrics")]
mod metrics_recorded {
    use std::collections::BTreeMap;
    use std::sync::atomic::Ordering;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use tower_redis_ratelimit::deadpool_redis;
    use tower_redis_ratelimit::key::HeaderKey;
    // The names of the table in the `metrics` module docs.
    const FALLBACK_DECISIONS_TOTAL: &str = "ratelimit_fallback_decisions_total";
    const NEAR_LIMIT_TOTAL: &str = "ratelimit_near_limit_total";
    const REQUESTS_TOTAL: &str = "ratelimit_requests_total";

    use super::*;
    use crate::support::stack::{counting, keyed, shadow_layer, stack};

    /// Every counter of a snapshot, as `name{label=value,...}` -> count.
    fn counters(snapshotter: &Snapshotter) -> BTreeMap<String, u64> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let DebugValue::Counter(count) = value else {
                    return None;
                };
                let key = key.key();
                let mut labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                Some((format!("{}{{{}}}", key.name(), labels.join(",")), count))
            })
            .collect()
    }

    /// The key of `ratelimit_requests_total` of `policy` and `outcome`, as [`counters`]
    /// writes it (a refusal labelled by its limit too: the policy's own here).
    fn requests_key(policy: &str, outcome: &str) -> String {
        if outcome.ends_with("rejected") {
            format!("{REQUESTS_TOTAL}{{limit={policy},outcome={outcome},policy={policy}}}")
        } else {
            format!("{REQUESTS_TOTAL}{{outcome={outcome},policy={policy}}}")
        }
    }

    fn get(counters: &BTreeMap<String, u64>, key: &str) -> u64 {
        counters
            .get(key)
            .copied()
            .unwrap_or_else(|| panic!("no {key} in {counters:#?}"))
    }

    /// Enforcing, shadow and per-plan layers, each counted under its policy name; the
    /// recorder is local to this test's thread (the runtime is single-threaded).
    #[tokio::test]
    async fn requests_are_counted_by_policy_and_outcome() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _guard = metrics::set_default_local_recorder(&recorder);

        let backend = Backend::in_process();
        let enforcing =
            LimitLayer::builder(&backend, PeriodConfig::new(10, Duration::from_secs(60)))
                .name("api")
                .key(HeaderKey::from_static("x-key"))
                .build()
                .unwrap();
        let (_, svc) = stack(shadow_layer(&backend, 3), enforcing);
        for _ in 0..12 {
            svc.clone().oneshot(keyed("a")).await.unwrap();
        }
        // No key: served by the shadow layer, refused by the enforcing one.
        let response = svc
            .clone()
            .oneshot(Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);

        // The example's per-plan layer: one label per plan.
        let app = tenants::app(&backend).unwrap();
        send(&app, Method::GET, "/profile", &[FREE]).await;
        send(&app, Method::GET, "/profile", &[PAID]).await;
        send(&app, Method::GET, "/profile", &[PAID]).await;

        let c = counters(&snapshotter);
        let requests = |policy: &str, outcome: &str| get(&c, &requests_key(policy, outcome));
        assert_eq!(requests("api", "admitted"), 10);
        assert_eq!(requests("api", "rejected"), 2);
        assert_eq!(requests("api", "missing_key"), 1);
        assert_eq!(requests("shadow", "admitted"), 3);
        assert_eq!(requests("shadow", "shadow_rejected"), 9);
        assert_eq!(requests("shadow", "missing_key"), 1);
        assert_eq!(requests("shadow", "rejected"), 0);
        // At most 10 % left: the 9th (1 left) and 10th (none left) of `api`.
        assert_eq!(get(&c, &format!("{NEAR_LIMIT_TOTAL}{{policy=api}}")), 2);
        assert_eq!(requests("profile.free", "admitted"), 1);
        assert_eq!(requests("profile.paid", "admitted"), 2);
        assert_eq!(requests("trial", "admitted"), 3);
        assert_eq!(
            get(
                &c,
                &format!("{FALLBACK_DECISIONS_TOTAL}{{policy=api,source=fallback}}")
            ),
            0
        );
    }

    /// Decisions taken while Redis is unreachable are counted as fallback decisions.
    #[tokio::test]
    async fn fallback_decisions_are_counted() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _guard = metrics::set_default_local_recorder(&recorder);

        // Nothing listens on this port: every Redis call fails at once.
        let port = support::free_port();
        let pool = deadpool_redis::Config::from_url(format!("redis://127.0.0.1:{port}"))
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        let layer = LimitLayer::builder(
            &Backend::redis(pool),
            PeriodConfig::new(2, Duration::from_secs(60)),
        )
        .name("down")
        .key(HeaderKey::from_static("x-key"))
        .build()
        .unwrap();
        let (calls, svc) = counting(layer);
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(svc.clone().oneshot(keyed("a")).await.unwrap().status());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS
            ]
        );
        let c = counters(&snapshotter);
        assert_eq!(
            get(
                &c,
                &format!("{FALLBACK_DECISIONS_TOTAL}{{policy=down,source=fallback}}")
            ),
            3
        );
        assert_eq!(get(&c, &requests_key("down", "rejected")), 1);
    }

    /// The in-flight layer of `GET /export` counts its requests as every layer does.
    #[tokio::test]
    async fn in_flight_requests_are_counted() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _guard = metrics::set_default_local_recorder(&recorder);

        let app = tenants::app(&Backend::in_process()).unwrap();
        let first = start_export(&app, Some(10_000), "m").await;
        let second = start_export(&app, Some(10_000), "m").await;
        let refused = start_export(&app, Some(0), "m").await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let (response, _) = send(&app, Method::GET, "/export", &[FREE]).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        drop((first, second));

        let c = counters(&snapshotter);
        let requests = |outcome: &str| get(&c, &requests_key("export", outcome));
        assert_eq!(requests("admitted"), 2);
        assert_eq!(requests("rejected"), 1);
        assert_eq!(requests("missing_key"), 1);
        // The second took the last slot.
        assert_eq!(get(&c, &format!("{NEAR_LIMIT_TOTAL}{{policy=export}}")), 1);
    }
}
