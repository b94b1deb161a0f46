//! Settling after the response (`Limiter::settle`, `LayerBuilder::settle` with a
//! `Usage`): down and up for each algorithm and a set on Redis, in process and in the
//! fallback; debt refuses until it is paid off, with the right `Retry-After`; two
//! instances sharing Redis spend exactly what their requests used; a shadow layer, a
//! huge settlement and per-plan limits. What a body's bytes, trailer or end settle to is
//! `tests/settle_body.rs`.

mod support;

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::ops::RangeInclusive;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::BodyExt;
use support::settle::{backend, source, standing, until_remaining, Host, MINUTE, SEC};
use support::RedisServer;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::key::GlobalKey;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::limit::Usage;
use tower_redis_ratelimit::LimitLayer;
use tower_redis_ratelimit::{Backend, Limiter, State};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

fn n(cost: u32) -> NonZeroU32 {
    NonZeroU32::new(cost).unwrap()
}

/// 4 spent, settled down by 2 then up by 9: 11 of 10, the key owes one unit until a
/// time within `paid_off`, and a check is refused meanwhile.
async fn down_and_up(limiter: &dyn Limiter, host: Host, paid_off: RangeInclusive<Duration>) {
    let what = format!("{:?} on {host:?}", limiter.policy().name());
    let checked = limiter.check(b"k", n(4)).await;
    assert!(checked.is_admitted(), "{what}: {checked:?}");
    assert_eq!(checked.source, source(host), "{what}");
    let down = limiter.settle(b"k", -2).expect("built-in").await;
    assert_eq!(
        (down.state, down.remaining, down.source),
        (State::Allowed, 8, source(host)),
        "{what}: {down:?}"
    );
    assert_eq!(standing(limiter, b"k").await.remaining, 8, "{what}");
    let up = limiter.settle(b"k", 9).expect("built-in").await;
    assert_eq!(
        (up.state, up.remaining),
        (State::OverQuota, 0),
        "{what}: {up:?}"
    );
    let retry = up
        .retry_after
        .expect("a key in debt says when it is paid off");
    assert!(
        paid_off.contains(&retry),
        "{what}: paid off in {retry:?}, expected within {paid_off:?}"
    );
    let refused = limiter.check(b"k", n(1)).await;
    assert_eq!(refused.state, State::OverQuota, "{what}: {refused:?}");
    // Another key owes nothing.
    assert!(limiter.check(b"other", n(10)).await.is_admitted(), "{what}");
}

#[tokio::test]
async fn settle_down_and_up_for_each_algorithm_and_a_set() {
    let redis = RedisServer::start();
    for host in [Host::InProcess, Host::Redis, Host::Fallback] {
        let backend = backend(host, &redis);
        let name = |algorithm: &str| format!("{algorithm}-{host:?}").to_lowercase();
        let period =
            PeriodLimiter::new(&backend, &name("period"), PeriodConfig::new(10, MINUTE)).unwrap();
        down_and_up(&period, host, MINUTE - 2 * SEC..=MINUTE).await;
        // 1 token every 10 s: one token owed is paid off in 10 s (less the time the
        // test took, a second at most however busy the machine).
        let bucket = TokenBucketLimiter::new(
            &backend,
            &name("bucket"),
            TokenBucketConfig::new(10, Duration::from_secs(100), 10),
        )
        .unwrap();
        down_and_up(&bucket, host, 9 * SEC..=10 * SEC).await;
        let rolling = RollingWindowLimiter::new(
            &backend,
            &name("rolling"),
            RollingConfig::new(10, 10, Duration::from_secs(6)),
        )
        .unwrap();
        // The oldest bucket (6 s, on Unix time) expires within 54 to 60 s.
        down_and_up(&rolling, host, MINUTE - 7 * SEC..=MINUTE).await;
        // Requests and tokens: the settlement reaches the tokens only.
        let set = LimitSet::new()
            .requests("rpm", PeriodConfig::new(20, MINUTE))
            .limit("tpm", PeriodConfig::new(10, MINUTE));
        let set = SetLimiter::new(&backend, &name("set"), set).unwrap();
        down_and_up(&set, host, MINUTE - 2 * SEC..=MINUTE).await;
    }
}

#[tokio::test]
async fn debt_refuses_until_paid_off_with_its_retry_after() {
    let redis = RedisServer::start();
    let backend = redis.uncached_backend();
    // 10 tokens a second, burst 10; 2 reserved per request, settled to `x-used`.
    let layer = LimitLayer::builder(
        &backend,
        TokenBucketConfig::new(10, Duration::from_secs(1), 10),
    )
    .name("tokens")
    .key(HeaderKey::from_static("x-user"))
    .cost(|_: &http::request::Parts| 2)
    .settle(Usage::header(HeaderName::from_static("x-used")))
    .build()
    .unwrap();
    let limiter = layer.limiter().clone();
    let mut service =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<u32>| async move {
                let used = *req.body();
                Ok::<_, Infallible>(
                    Response::builder()
                        .header("x-used", used.to_string())
                        .body(http_body_util::Full::new(Bytes::from_static(b"ok")))
                        .unwrap(),
                )
            }));
    let call = |used: u32| Request::get("/").header("x-user", "u").body(used).unwrap();
    // 35 used of 10: 25 owed beyond an empty bucket, paid off in 2.5 s.
    let start = Instant::now();
    let response = service.ready().await.unwrap().call(call(35)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    // The settlement lands in the background. (When the last standing was read:
    // between `asked` and `told`.)
    let (mut asked, mut owed, mut told);
    loop {
        asked = Instant::now();
        owed = standing(&limiter, b"hdr:x-user:u").await;
        told = Instant::now();
        if owed.state == State::OverQuota || told.duration_since(start) > Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(owed.state, State::OverQuota, "{owed:?}");
    let retry = owed.retry_after.unwrap();
    assert!(
        retry > Duration::from_millis(1_500) && retry <= Duration::from_millis(2_500),
        "{retry:?}"
    );
    // A request's Retry-After: the debt left when Redis decided it (some time between
    // the standing's `asked` and the request's reply), and one token (0.1 s) for each
    // unit of its cost of 2, in whole seconds rounded up.
    let retry_after = |sent: Instant, replied: Instant| {
        let at_most = (retry + Duration::from_millis(200)).saturating_sub(sent - told);
        let at_least = (retry + Duration::from_millis(200)).saturating_sub(replied - asked);
        at_least.as_secs_f64().ceil() as u64..=at_most.as_secs_f64().ceil() as u64
    };
    let seconds = |response: &Response<_>| -> u64 {
        response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let sent = Instant::now();
    let refused = service.ready().await.unwrap().call(call(1)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let expected = retry_after(sent, Instant::now());
    assert!(
        expected.contains(&seconds(&refused)),
        "{:?} not in {expected:?}",
        refused.headers()
    );
    // Not paid off a second before: still refused.
    tokio::time::sleep_until(told + retry.saturating_sub(Duration::from_secs(1))).await;
    let sent = Instant::now();
    let refused = service.ready().await.unwrap().call(call(1)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // The debt's last second, and one token (0.1 s) for the cost of 1.
    let expected = retry_after(sent, Instant::now());
    assert!(
        expected.contains(&seconds(&refused)),
        "{:?} not in {expected:?}",
        refused.headers()
    );
    // Paid off, and the 2 reserved fit once 2 tokens are back (0.2 s more).
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let admitted = service.ready().await.unwrap().call(call(2)).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
}

#[tokio::test]
async fn two_instances_spend_exactly_what_their_requests_used() {
    let redis = RedisServer::start();
    // Two instances: two backends on one Redis, each with its own layer.
    const QUOTA: u64 = 1_000;
    const ESTIMATE: u32 = 10;
    const USED: u32 = 30;
    const CONCURRENT: u64 = 20;
    let mut services = Vec::new();
    let mut limiter = None;
    for _ in 0..2 {
        let layer = LimitLayer::builder(
            &redis.uncached_backend(),
            PeriodConfig::new(QUOTA, Duration::from_secs(600)),
        )
        .name("shared")
        .key(HeaderKey::from_static("x-user"))
        .cost(|_: &http::request::Parts| ESTIMATE)
        .settle(Usage::header(HeaderName::from_static("x-used")))
        .build()
        .unwrap();
        limiter.get_or_insert_with(|| layer.limiter().clone());
        services.push(ServiceBuilder::new().layer(layer).service(service_fn(
            |_req: Request<()>| async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok::<_, Infallible>(
                    Response::builder()
                        .header("x-used", USED.to_string())
                        .body(http_body_util::Full::new(Bytes::from_static(b"ok")))
                        .unwrap(),
                )
            },
        )));
    }
    let limiter = limiter.unwrap();
    let mut tasks = JoinSet::new();
    for i in 0..(2 * CONCURRENT * 3) {
        let service = services[(i % 2) as usize].clone();
        tasks.spawn(async move {
            let request = Request::get("/").header("x-user", "u").body(()).unwrap();
            let response = service.oneshot(request).await.unwrap();
            let admitted = response.status() == StatusCode::OK;
            response.into_body().collect().await.unwrap();
            admitted
        });
    }
    let mut admitted = 0u64;
    while let Some(ok) = tasks.join_next().await {
        admitted += u64::from(ok.unwrap());
    }
    // Every admitted request is settled to what it used, once: the window holds
    // exactly that (background settlements landing first).
    let key = b"hdr:x-user:u";
    let used = admitted * u64::from(USED);
    let mut count = 0;
    for _ in 0..500 {
        let raw = redis.cmd(&["GET", "ratelimit:{v1:hdr:x-user:u}:period:shared"]);
        count = raw.trim().parse::<u64>().unwrap_or(0);
        if count == used {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(count, used, "{admitted} admitted");
    // The documented bound: the limit, plus the underestimates of the requests
    // admitted while it was being reached (at most every request in flight).
    assert!(
        used <= QUOTA + 2 * CONCURRENT * 3 * u64::from(USED - ESTIMATE),
        "{used}"
    );
    // Admission stopped at the limit: no estimate was admitted past it.
    assert!(admitted * u64::from(ESTIMATE) <= QUOTA, "{admitted}");
    let d = standing(&limiter, key).await;
    assert_eq!(d.state, State::OverQuota, "{d:?}");
}

/// A shadow layer counts what an enforcing one would, so it settles what its checks
/// admitted: in process (decided at once) and on Redis (its check in a task of its own,
/// the settlement waiting for it).
#[tokio::test]
async fn a_shadow_layer_settles_what_it_admitted() {
    let redis = RedisServer::start();
    for host in [Host::InProcess, Host::Redis] {
        let layer = LimitLayer::builder(&backend(host, &redis), PeriodConfig::new(1_000, MINUTE))
            .name(format!("shadow-{host:?}").to_lowercase())
            .key(GlobalKey)
            .cost(|_: &http::request::Parts| 100)
            .settle(Usage::bytes())
            .shadow(true)
            .build()
            .unwrap();
        let limiter = layer.limiter().clone();
        let mut service = ServiceBuilder::new().layer(layer).service(service_fn(
            |_req: Request<()>| async move {
                Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                    Bytes::from_static(&[b'x'; 30]),
                )))
            },
        ));
        let response = service
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        response.into_body().collect().await.unwrap();
        until_remaining(&limiter, b"global", 970).await;
    }
}

/// A settlement beyond a cost's largest counts as the largest, on Redis as in process:
/// an answer from the store, never an error.
#[tokio::test]
async fn a_huge_settlement_is_the_largest_cost() {
    let redis = RedisServer::start();
    for host in [Host::InProcess, Host::Redis] {
        let backend = backend(host, &redis);
        let name = format!("huge-{host:?}").to_lowercase();
        let bucket = TokenBucketLimiter::new(
            &backend,
            &name,
            TokenBucketConfig::new(10, Duration::from_secs(1), 10),
        )
        .unwrap();
        let owed = bucket.settle(b"k", i64::MAX).unwrap().await;
        assert_eq!((owed.state, owed.source), (State::OverQuota, source(host)));
        // u32::MAX tokens at 10 a second, less the burst.
        let retry = owed.retry_after.unwrap();
        let expected = Duration::from_millis(100) * (u32::MAX - 10);
        assert!(
            retry <= expected && retry + SEC > expected,
            "{host:?}: {retry:?}"
        );
        let back = bucket.settle(b"k", i64::MIN).unwrap().await;
        assert_eq!(
            (back.state, back.remaining),
            (State::Allowed, 10),
            "{host:?}"
        );
    }
}

/// Per-plan limits settle under the plan that spent the estimate.
#[tokio::test]
async fn a_plan_settles_under_its_own_limit() {
    use tower_redis_ratelimit::{ExtensionPlan, Plans};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Plan {
        Free,
        Paid,
    }
    let plans = Plans::new(ExtensionPlan::<Plan>::new())
        .plan(Plan::Free, "free", PeriodConfig::new(100, MINUTE))
        .plan(Plan::Paid, "paid", PeriodConfig::new(1_000, MINUTE));
    let layer = LimitLayer::builder(&Backend::in_process(), plans)
        .name("plans")
        .key(GlobalKey)
        .cost(|_: &http::request::Parts| 50)
        .settle(Usage::header(HeaderName::from_static("x-used")))
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let mut service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_req: Request<()>| async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .header("x-used", "80")
                    .body(http_body_util::Full::new(Bytes::new()))
                    .unwrap(),
            )
        }));
    let mut request = Request::new(());
    request.extensions_mut().insert(Plan::Paid);
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    response.into_body().collect().await.unwrap();
    let paid = limiter.plan(&Plan::Paid).unwrap();
    until_remaining(paid, b"global", 920).await;
    let free = limiter.plan(&Plan::Free).unwrap();
    assert_eq!(standing(free, b"global").await.remaining, 100);
}
