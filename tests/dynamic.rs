//! Limits from the user's own store ([`DynamicLimits`]) against a real `redis-server`:
//! a changed quota applies within the TTL under traffic, failing and hanging sources
//! follow the failure policy, the cache stays bounded, and each key is looked up once
//! per TTL however many requests come at once.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{header, Request, Response, StatusCode};
use support::http::RATELIMIT_POLICY;
use support::RedisServer;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::key::{ExtensionKey, HeaderKey, KeyExtractor, TaggedKey};
use tower_redis_ratelimit::limit::Algorithm;
use tower_redis_ratelimit::PeriodConfig;
use tower_redis_ratelimit::{Backend, LimitLayer, Limiter, Source, State};
use tower_redis_ratelimit::{DynamicLimits, LimitSource, OnSourceError};

const OK: u8 = 0;
const FAIL: u8 = 1;
const HANG: u8 = 2;

/// The user's "database": merchant limits, a switch to make it fail or hang, and a
/// count of lookups.
#[derive(Default)]
struct Db {
    limits: Mutex<HashMap<Vec<u8>, u64>>,
    mode: AtomicU8,
    calls: AtomicUsize,
    delay: Mutex<Duration>,
}

impl Db {
    /// The merchant's limit, under its id alone: the source gets the header's value.
    fn set(&self, merchant: &str, limit: u64) {
        let key = merchant.as_bytes().to_vec();
        self.limits.lock().unwrap().insert(key, limit);
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

fn source(db: &Arc<Db>) -> impl LimitSource {
    let db = db.clone();
    move |key: TaggedKey<'_>| {
        let db = db.clone();
        let key = key.value().to_vec();
        async move {
            db.calls.fetch_add(1, Ordering::SeqCst);
            let delay = *db.delay.lock().unwrap();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            match db.mode.load(Ordering::SeqCst) {
                FAIL => Err(BoxError::from("database unreachable")),
                HANG => std::future::pending().await,
                _ => Ok(db.limits.lock().unwrap().get(&key).copied()),
            }
        }
    }
}

fn limits(db: &Arc<Db>) -> DynamicLimits<PeriodConfig, impl LimitSource> {
    DynamicLimits::new(PeriodConfig::new(100, Duration::from_secs(60)), source(db))
}

type Svc = tower::util::BoxCloneService<Request<String>, Response<String>, Infallible>;

fn service<S: LimitSource>(backend: &Backend, limits: DynamicLimits<PeriodConfig, S>) -> Svc {
    let layer = LimitLayer::builder(backend, limits)
        .name("pay")
        .key(HeaderKey::from_static("x-merchant"))
        .build()
        .expect("valid layer");
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::from("paid")))
        }))
        .map_response(|r| r.map(|_| String::new()));
    tower::util::BoxCloneService::new(svc)
}

fn pay(svc: &Svc, merchant: &str) -> impl std::future::Future<Output = (StatusCode, String)> {
    let req = Request::post("/pay")
        .header("x-merchant", merchant)
        .body(String::new())
        .unwrap();
    let svc = svc.clone();
    async move { check_response(svc.oneshot(req).await.unwrap()) }
}

fn check_response(response: Response<String>) -> (StatusCode, String) {
    let policy = response
        .headers()
        .get(RATELIMIT_POLICY)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        assert!(response.headers().contains_key(header::RETRY_AFTER));
    }
    (response.status(), policy)
}

/// Sends a request every 20 ms until `done` holds for its answer; returns how long
/// that took.
async fn until(svc: &Svc, merchant: &str, done: impl Fn(StatusCode, &str) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let (status, policy) = pay(svc, merchant).await;
        assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR);
        if done(status, &policy) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never: {status} {policy}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_changed_quota_applies_within_the_ttl_under_traffic() {
    let redis = RedisServer::start();
    // No deny cache: a raised quota applies even to a key Redis just refused.
    let backend = support::backend_builder()
        .redis(redis.pool())
        .call_timeout(support::CALL_TIMEOUT)
        .deny_cache(0)
        .build()
        .unwrap();
    let db = Arc::new(Db::default());
    db.set("acme", 3);
    let ttl = Duration::from_millis(300);
    let svc = service(&backend, limits(&db).ttl(ttl));
    let start = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let (status, policy) = pay(&svc, "acme").await;
        assert_eq!(policy, "\"pay\";q=3;w=60");
        statuses.push(status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    // Another merchant has the default limit.
    assert_eq!(
        pay(&svc, "other").await,
        (StatusCode::OK, "\"pay\";q=100;w=60".into())
    );

    // The merchant upgrades: admitted again within the TTL (plus one lookup), with
    // the count carried over in Redis.
    db.set("acme", 10);
    let took = until(&svc, "acme", |s, p| {
        s == StatusCode::OK && p == "\"pay\";q=10;w=60"
    })
    .await;
    // (Its bound: the TTL, with room for a busy machine.)
    assert!(took <= ttl + Duration::from_secs(2), "took {took:?}");
    // 4 of 10 used: 6 more, then refused.
    let mut admitted = 0;
    while pay(&svc, "acme").await.0 == StatusCode::OK {
        admitted += 1;
    }
    assert_eq!(admitted, 6);

    // Downgraded below the count: refused within the TTL.
    db.set("acme", 5);
    let took = until(&svc, "acme", |s, p| {
        s == StatusCode::TOO_MANY_REQUESTS && p == "\"pay\";q=5;w=60"
    })
    .await;
    // (Its bound: the TTL, with room for a busy machine.)
    assert!(took <= ttl + Duration::from_secs(2), "took {took:?}");
    // Looked up about once per TTL per merchant, not once per request.
    let ttls = (start.elapsed().as_millis() / ttl.as_millis()) as usize;
    assert!(
        db.calls() <= 2 * (ttls + 2),
        "{} lookups over {ttls} TTLs",
        db.calls()
    );
}

#[tokio::test]
async fn a_failing_source_follows_each_policy() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    for (policy, known, unknown) in [
        (OnSourceError::LastKnown, Some("q=5"), Some("q=100")),
        (OnSourceError::Limit(50), Some("q=50"), Some("q=50")),
        (OnSourceError::Refuse, None, None),
    ] {
        let db = Arc::new(Db::default());
        let svc = service(
            &backend,
            limits(&db)
                .ttl(Duration::from_millis(100))
                .error_ttl(Duration::from_millis(50))
                .on_error(policy),
        );
        let name = format!("{policy:?}");
        let acme = format!("acme-{name}");
        db.set(&acme, 5);
        assert_eq!(pay(&svc, &acme).await.1, "\"pay\";q=5;w=60");
        db.mode.store(FAIL, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(150)).await;
        // The stale answer serves one request while the failing lookup runs.
        pay(&svc, &acme).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        for (merchant, expected) in [(acme.clone(), known), (format!("new-{name}"), unknown)] {
            let (status, header) = pay(&svc, &merchant).await;
            match expected {
                Some(q) => {
                    assert_eq!(status, StatusCode::OK, "{name} {merchant}");
                    assert_eq!(header, format!("\"pay\";{q};w=60"), "{name} {merchant}");
                }
                None => assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{name} {merchant}"),
            }
        }
        // The source recovers: its answer applies again after the error TTL.
        db.mode.store(OK, Ordering::SeqCst);
        until(&svc, &acme, |_, p| p == "\"pay\";q=5;w=60").await;
    }
}

#[tokio::test]
async fn a_hanging_source_times_out_into_the_policy() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    for (policy, expected) in [
        (OnSourceError::LastKnown, StatusCode::OK),
        (OnSourceError::Limit(7), StatusCode::OK),
        (OnSourceError::Refuse, StatusCode::TOO_MANY_REQUESTS),
    ] {
        let db = Arc::new(Db::default());
        db.mode.store(HANG, Ordering::SeqCst);
        let svc = service(
            &backend,
            limits(&db)
                .lookup_timeout(Duration::from_millis(100))
                .on_error(policy),
        );
        let merchant = format!("hang-{policy:?}");
        let (status, header) = pay(&svc, &merchant).await;
        assert_eq!(status, expected, "{policy:?}");
        match policy {
            OnSourceError::Limit(_) => assert_eq!(header, "\"pay\";q=7;w=60"),
            _ => assert_eq!(header, "\"pay\";q=100;w=60"),
        }
        // Concurrent requests during the hang all get an answer, none a 500.
        let many: Vec<_> = (0..20)
            .map(|i| {
                let svc = svc.clone();
                tokio::spawn(async move { pay(&svc, &format!("hang-many-{i}")).await.0 })
            })
            .collect();
        for task in many {
            assert_eq!(task.await.unwrap(), expected);
        }
    }
}

#[tokio::test]
async fn the_cache_holds_at_most_max_keys() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let db = Arc::new(Db::default());
    let limiter = limits(&db).max_keys(64).build(&backend, "pay").unwrap();
    for i in 0..1_000 {
        let key = format!("hdr:x-merchant:m{i}");
        let decision = limiter.check(key.as_bytes(), NonZeroU32::MIN).await;
        assert_eq!(decision.state, State::Allowed);
        assert_eq!(decision.source, Source::Redis);
        assert!(
            limiter.cached_keys() <= 64,
            "{} keys",
            limiter.cached_keys()
        );
    }
}

#[tokio::test]
async fn one_lookup_per_key_per_ttl_under_concurrent_requests() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let db = Arc::new(Db::default());
    *db.delay.lock().unwrap() = Duration::from_millis(50);
    for m in 0..10 {
        db.set(&format!("m{m}"), 1_000);
    }
    // (Two seconds: the first two bursts fit in it however busy the machine.)
    let ttl = Duration::from_secs(2);
    let limiter = Arc::new(limits(&db).ttl(ttl).build(&backend, "pay").unwrap());
    let burst = |limiter: Arc<_>| async move {
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let limiter: Arc<tower_redis_ratelimit::DynamicLimiter<_, _>> =
                    Arc::clone(&limiter);
                tokio::spawn(async move {
                    let key = format!("hdr:x-merchant:m{}", i % 10);
                    limiter.check(key.as_bytes(), NonZeroU32::MIN).await
                })
            })
            .collect();
        for task in tasks {
            let decision = task.await.unwrap();
            assert!(decision.is_admitted());
            assert_eq!(decision.limit, 1_000);
        }
    };
    burst(limiter.clone()).await;
    assert_eq!(db.calls(), 10, "one lookup per key");
    burst(limiter.clone()).await;
    assert_eq!(db.calls(), 10, "fresh answers are not looked up again");
    tokio::time::sleep(ttl).await;
    // Stale: each key is refreshed once, in the background, while its requests use
    // the stale limit.
    burst(limiter.clone()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while db.calls() < 20 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // (And no more: a refresh a key started is not started again.)
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(db.calls(), 20, "one refresh per key");
}

#[test]
fn invalid_settings_fail_when_built() {
    use tower_redis_ratelimit::ConfigError;
    let db = Arc::new(Db::default());
    let backend = Backend::in_process();
    let err = |l: DynamicLimits<PeriodConfig, _>| l.build(&backend, "pay").unwrap_err();
    assert!(matches!(
        err(limits(&db).ttl(Duration::ZERO)),
        ConfigError::ZeroDuration { setting: "ttl", .. }
    ));
    assert!(matches!(
        err(limits(&db).max_keys(0)),
        ConfigError::Zero {
            setting: "max_keys",
            ..
        }
    ));
    assert!(matches!(
        err(limits(&db).lookup_timeout(Duration::ZERO)),
        ConfigError::ZeroDuration {
            setting: "lookup_timeout",
            ..
        }
    ));
    assert!(matches!(
        err(limits(&db)
            .ttl(Duration::from_secs(1))
            .error_ttl(Duration::from_secs(2))),
        ConfigError::Conflict { .. }
    ));
    assert!(matches!(
        err(limits(&db).on_error(OnSourceError::Limit(0))),
        ConfigError::Zero {
            setting: "on_error limit",
            ..
        }
    ));
    // The default configuration itself is checked too.
    let zero = DynamicLimits::new(PeriodConfig::new(0, Duration::from_secs(1)), source(&db));
    assert!(matches!(
        zero.build(&backend, "pay").unwrap_err(),
        ConfigError::Zero {
            setting: "quota",
            ..
        }
    ));
}

/// A source gets what the key extractor found, without the crate's tags: the header's
/// value, an extension's `Display`; the tag names the extractor.
#[tokio::test]
async fn the_source_gets_the_extractors_value_without_tags() {
    #[derive(Clone)]
    struct Merchant(&'static str);
    impl std::fmt::Display for Merchant {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let source = {
        let seen = seen.clone();
        move |key: TaggedKey<'_>| {
            seen.lock()
                .unwrap()
                .push((key.tag().to_vec(), key.value().to_vec()));
            let limit = (key.value() == b"acme").then_some(1);
            async move { Ok::<_, BoxError>(limit) }
        }
    };
    let layer = LimitLayer::builder(
        &Backend::in_process(),
        DynamicLimits::new(PeriodConfig::new(100, Duration::from_secs(60)), source),
    )
    .name("pay")
    .key(
        ExtensionKey::<Merchant>::new()
            .tag("merchant")
            .or(HeaderKey::from_static("x-merchant")),
    )
    .build()
    .unwrap();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|_req: Request<String>| async {
                Ok::<_, Infallible>(Response::new(String::new()))
            }));
    let call = |merchant: Option<&'static str>, header: Option<&'static str>| {
        let mut req = Request::post("/pay").body(String::new()).unwrap();
        if let Some(merchant) = merchant {
            req.extensions_mut().insert(Merchant(merchant));
        }
        if let Some(header) = header {
            req.headers_mut()
                .insert("x-merchant", header.parse().unwrap());
        }
        let svc = svc.clone();
        async move { svc.oneshot(req).await.unwrap().status() }
    };
    assert_eq!(call(Some("acme"), None).await, StatusCode::OK);
    // acme's limit from the source is 1.
    assert_eq!(
        call(Some("acme"), None).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(call(None, Some("globex")).await, StatusCode::OK);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (b"ext:merchant".to_vec(), b"acme".to_vec()),
            (b"hdr:x-merchant".to_vec(), b"globex".to_vec()),
        ]
    );
}
