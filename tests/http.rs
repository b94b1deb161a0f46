//! End to end: an axum server on a loopback port, driven by a real HTTP client, with the
//! limit in-process and in a real `redis-server`.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::{routing::get, Extension, Router};
use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::BodyExt;
use support::http::Served;
use support::http::{RATELIMIT, RATELIMIT_POLICY};
use support::RedisServer;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::key::{ForwardedIp, GlobalKey, HeaderKey, KeyExtractor, PeerIp};
use tower_redis_ratelimit::Rejection;
use tower_redis_ratelimit::{Backend, ConfigError, Decision, MissingKey, ProblemJson, State};
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

fn header_str<'a>(response: &'a Response<()>, name: &http::HeaderName) -> &'a str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

async fn report(Extension(decision): Extension<Decision>) -> String {
    format!("{:?} {}", decision.state, decision.remaining)
}

fn app(backend: &Backend, quota: u64) -> Router {
    let layer = LimitLayer::builder(backend, PeriodConfig::new(quota, Duration::from_secs(60)))
        .name("period")
        .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
        .build()
        .unwrap();
    Router::new().route("/period", get(report).layer(layer))
}

async fn quota_then_429(backend: Backend) {
    let served = Served::start(app(&backend, 3)).await;
    let alice = [("x-api-key", "alice")];
    for remaining in [2, 1, 0] {
        let (response, body) = served.get("/period", &alice).await;
        assert_eq!(response.status(), StatusCode::OK);
        let state = if remaining == 0 {
            "HitQuota"
        } else {
            "Allowed"
        };
        assert_eq!(body, format!("{state} {remaining}"));
        assert_eq!(
            header_str(&response, &RATELIMIT_POLICY),
            "\"period\";q=3;w=60"
        );
        assert!(
            header_str(&response, &RATELIMIT).starts_with(&format!("\"period\";r={remaining};t="))
        );
    }
    let (response, body) = served.get("/period", &alice).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body, "too many requests\n");
    let retry: u64 = header_str(&response, &header::RETRY_AFTER).parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(header_str(&response, &RATELIMIT).starts_with("\"period\";r=0;t="));
    // Another key is unaffected; a request without the header is keyed by its IP.
    let (response, _) = served.get("/period", &[("x-api-key", "bob")]).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (response, body) = served.get("/period", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body, "Allowed 2");
}

#[tokio::test]
async fn in_process_quota_then_429() {
    quota_then_429(Backend::in_process()).await;
}

#[tokio::test]
async fn redis_quota_then_429() {
    let redis = RedisServer::start();
    quota_then_429(redis.backend()).await;
    assert_eq!(
        redis.cmd(&["GET", "ratelimit:{v1:hdr:x-api-key:alice}:period:period"]),
        "3",
        "the state lives in redis"
    );
}

#[tokio::test]
async fn two_servers_sharing_redis_admit_the_quota_once() {
    let redis = RedisServer::start();
    let one = Served::start(app(&redis.backend(), 4)).await;
    let two = Served::start(app(&redis.backend(), 4)).await;
    let mut ok = 0;
    for i in 0..10 {
        let served = if i % 2 == 0 { &one } else { &two };
        let (response, _) = served.get("/period", &[("x-api-key", "k")]).await;
        ok += usize::from(response.status() == StatusCode::OK);
    }
    assert_eq!(ok, 4);
}

#[tokio::test]
async fn spoofed_forwarded_header_from_untrusted_peer_is_ignored() {
    let layer = LimitLayer::builder(
        &Backend::in_process(),
        PeriodConfig::new(2, Duration::from_secs(60)),
    )
    .name("ip")
    // Only 10.0.0.0/8 proxies are trusted; the test client connects from 127.0.0.1.
    .key(ForwardedIp::from_strs(["10.0.0.0/8"]).unwrap())
    .build()
    .unwrap();
    let served = Served::start(Router::new().route("/", get(|| async { "ok" }).layer(layer))).await;
    let mut statuses = Vec::new();
    for i in 0..4 {
        let spoof = format!("198.51.100.{i}");
        let (response, _) = served
            .get(
                "/",
                &[
                    ("x-forwarded-for", &spoof),
                    ("forwarded", &format!("for={spoof}")),
                ],
            )
            .await;
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "every spoofed address must count against the real peer"
    );
}

/// A tower stack around a service that counts its calls.
fn counting_stack<L: tower_redis_ratelimit::Limiter>(
    layer: tower_redis_ratelimit::LimitLayer<L, HeaderKey>,
) -> (
    Arc<AtomicUsize>,
    impl tower::Service<
            Request<String>,
            Response = Response<tower_redis_ratelimit::limit::ResponseBody<String>>,
            Error = Infallible,
        > + Clone,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(move |_req: Request<String>| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(String::from("inner"))) }
            }));
    (calls, svc)
}

fn keyed(key: &str) -> Request<String> {
    Request::get("/")
        .header("x-key", key)
        .body(String::new())
        .unwrap()
}

#[tokio::test]
async fn the_inner_service_is_not_called_when_rejected() {
    let layer = LimitLayer::builder(
        &Backend::in_process(),
        PeriodConfig::new(2, Duration::from_secs(60)),
    )
    .name("p")
    .key(HeaderKey::from_static("x-key"))
    .build()
    .unwrap();
    let (calls, svc) = counting_stack(layer);
    for _ in 0..5 {
        svc.clone().oneshot(keyed("a")).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn redis_rejections_do_not_call_the_inner_service_either() {
    let redis = RedisServer::start();
    let layer = LimitLayer::builder(
        &redis.backend(),
        PeriodConfig::new(2, Duration::from_secs(60)),
    )
    .name("p")
    .key(HeaderKey::from_static("x-key"))
    .build()
    .unwrap();
    let (calls, svc) = counting_stack(layer);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(svc.clone().oneshot(keyed("a")).await.unwrap().status());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(statuses[3], StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_missing_key_is_rejected_by_default_and_never_reaches_the_service() {
    let layer = LimitLayer::builder(
        &Backend::in_process(),
        PeriodConfig::new(2, Duration::from_secs(60)),
    )
    .name("p")
    .key(HeaderKey::from_static("x-key"))
    .build()
    .unwrap();
    let (calls, svc) = counting_stack(layer);
    let response = svc
        .clone()
        .oneshot(Request::new(String::new()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // An oversized key counts as missing instead of being stored.
    let huge = "x".repeat(4_096);
    let response = svc.oneshot(keyed(&huge)).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn missing_key_policies_allow_or_share_a_key() {
    let base = || {
        LimitLayer::builder(
            &Backend::in_process(),
            PeriodConfig::new(1, Duration::from_secs(60)),
        )
        .name("p")
        .key(HeaderKey::from_static("x-key"))
    };
    let (calls, svc) = counting_stack(base().on_missing_key(MissingKey::Allow).build().unwrap());
    for _ in 0..3 {
        let response = svc
            .clone()
            .oneshot(Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get(RATELIMIT).is_none());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let shared = base()
        .on_missing_key(MissingKey::Key("anonymous".into()))
        .build()
        .unwrap();
    let (calls, svc) = counting_stack(shared);
    let first = svc
        .clone()
        .oneshot(Request::new(String::new()))
        .await
        .unwrap();
    let second = svc.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn custom_rejections_and_header_options() {
    let layer = LimitLayer::builder(
        &Backend::in_process(),
        PeriodConfig::new(1, Duration::from_secs(60)),
    )
    .name("p")
    .key(HeaderKey::from_static("x-key"))
    .on_rejection(ProblemJson)
    .admitted_headers(false)
    .decision_extension(false)
    .build()
    .unwrap();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<String>| async move {
                let has_decision = req.extensions().get::<Decision>().is_some();
                Ok::<_, Infallible>(Response::new(format!("decision: {has_decision}")))
            }));
    let ok = svc.clone().oneshot(keyed("a")).await.unwrap();
    assert!(ok.headers().get(RATELIMIT).is_none());
    let body = ok.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"decision: false");
    let rejected = svc.oneshot(keyed("a")).await.unwrap();
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        rejected.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    assert!(rejected.headers().get(RATELIMIT).is_some());
    assert!(rejected.headers().get(header::RETRY_AFTER).is_some());

    let teapot = |r: &Rejection<'_>| {
        assert_eq!(r.decision.state, State::OverQuota);
        let mut response = Response::new(Bytes::from_static(b"short and stout"));
        *response.status_mut() = StatusCode::IM_A_TEAPOT;
        response
    };
    let layer = LimitLayer::builder(
        &Backend::in_process(),
        PeriodConfig::new(1, Duration::from_secs(60)),
    )
    .name("p")
    .key(GlobalKey)
    .on_rejection(teapot)
    .build()
    .unwrap();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|_req: Request<String>| async {
                Ok::<_, Infallible>(Response::new(String::new()))
            }));
    svc.clone().oneshot(keyed("a")).await.unwrap();
    let response = svc.oneshot(keyed("a")).await.unwrap();
    assert_eq!(response.status(), StatusCode::IM_A_TEAPOT);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"short and stout");
}

#[test]
fn every_invalid_configuration_fails_when_built() {
    let backend = Backend::in_process();
    let layer = |config: PeriodConfig| {
        LimitLayer::builder(&backend, config)
            .name("p")
            .key(GlobalKey)
    };
    let second = PeriodConfig::new(1, Duration::from_secs(1));
    let valid = || layer(second);
    assert!(valid().build().is_ok());
    let cases: Vec<(Result<_, ConfigError>, &str)> = vec![
        (
            layer(PeriodConfig::new(0, Duration::from_secs(1))).build(),
            "`quota` must be greater than zero",
        ),
        (
            layer(PeriodConfig::new(1, Duration::ZERO)).build(),
            "`period` must be at least one millisecond",
        ),
        (
            valid().name("").build(),
            "invalid `name`: must not be empty",
        ),
        (
            LimitLayer::builder(&backend, second).build(),
            "`name` is required but was not set",
        ),
        (
            valid().max_key_len(0).build(),
            "`max_key_len` must be greater than zero",
        ),
        (
            layer(second.align(tower_redis_ratelimit::UtcOffset::from_hours(20))).build(),
            "`align` is too long",
        ),
        (
            layer(PeriodConfig::new(
                1,
                Duration::from_secs(400 * 86_400 * 365),
            ))
            .build(),
            "`period` is too long",
        ),
    ];
    for (result, message) in cases {
        assert_eq!(result.unwrap_err().to_string(), message);
    }
}

#[tokio::test]
async fn works_as_router_layer_and_route_layer() {
    let limit = || {
        LimitLayer::builder(
            &Backend::in_process(),
            PeriodConfig::new(1, Duration::from_secs(60)),
        )
        .name("p")
        .key(GlobalKey)
        .build()
        .unwrap()
    };
    let whole = Router::new()
        .route("/a", get(|| async { "a" }))
        .layer(limit());
    let routes = Router::new()
        .route("/b", get(|| async { "b" }))
        .route_layer(limit());
    // `layer` wraps the fallback too (unmatched paths count and are refused once the
    // quota is gone); `route_layer` leaves unmatched paths alone (404, never limited).
    let cases = [
        (whole, "/a", StatusCode::TOO_MANY_REQUESTS),
        (routes, "/b", StatusCode::NOT_FOUND),
    ];
    for (app, path, unmatched) in cases {
        let served = Served::start(app).await;
        assert_eq!(served.get(path, &[]).await.0.status(), StatusCode::OK);
        assert_eq!(
            served.get(path, &[]).await.0.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(served.get("/none", &[]).await.0.status(), unmatched);
    }
}

/// A limiter of our own: refuses the key `hdr:x-key:blocked` for a minute, admits
/// everything else.
struct DenyList(tower_redis_ratelimit::Policy);

impl tower_redis_ratelimit::Limiter for DenyList {
    fn policy(&self) -> &tower_redis_ratelimit::Policy {
        &self.0
    }

    fn check(
        &self,
        key: &[u8],
        _cost: std::num::NonZeroU32,
    ) -> tower_redis_ratelimit::DecisionFuture {
        use tower_redis_ratelimit::{DecisionFuture, Source};
        let minute = Duration::from_secs(60);
        DecisionFuture::ready(if key == b"hdr:x-key:blocked" {
            Decision::new(State::OverQuota, 1, 0, minute, Source::InProcess)
                .with_retry_after(minute)
        } else {
            Decision::new(State::Allowed, 1, 1, minute, Source::InProcess)
        })
    }
}

/// Builds a [`DenyList`] whose policy is the layer's name with a suffix appended.
struct DenyListConfig(&'static str);

impl tower_redis_ratelimit::limit::Algorithm for DenyListConfig {
    type Limiter = DenyList;

    fn build(self, _backend: &Backend, name: &str) -> Result<DenyList, ConfigError> {
        let name = format!("{name}{}", self.0);
        Ok(DenyList(tower_redis_ratelimit::Policy::new(
            name,
            1,
            Duration::from_secs(60),
        )))
    }
}

#[tokio::test]
async fn custom_limiters_plug_into_the_same_service() {
    let layer =
        tower_redis_ratelimit::LimitLayer::builder(&Backend::in_process(), DenyListConfig(""))
            .name("deny")
            .key(HeaderKey::from_static("x-key"))
            .build()
            .unwrap();
    let (calls, svc) = counting_stack(layer);
    let ok = svc.clone().oneshot(keyed("fine")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.headers()[RATELIMIT_POLICY], "\"deny\";q=1;w=60");
    let refused = svc.oneshot(keyed("blocked")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()[header::RETRY_AFTER], "60");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A policy name that cannot go into a header fails when the layer is built.
    let err =
        tower_redis_ratelimit::LimitLayer::builder(&Backend::in_process(), DenyListConfig("\"x"))
            .name("deny")
            .build()
            .unwrap_err();
    assert!(err.to_string().contains("policy name"), "{err}");
}

#[tokio::test]
async fn stacked_layers_list_every_decision_outermost_first() {
    let backend = Backend::in_process();
    let layer = |name: &str, quota: u64| {
        LimitLayer::builder(&backend, PeriodConfig::new(quota, Duration::from_secs(60)))
            .name(name)
            .key(GlobalKey)
            .build()
            .unwrap()
    };
    let svc = ServiceBuilder::new()
        .layer(layer("burst", 3))
        .layer(layer("daily", 100))
        .service(service_fn(|req: Request<String>| async move {
            let last = req.extensions().get::<Decision>().map(|d| d.limit);
            let all: Vec<u64> = req
                .extensions()
                .get::<tower_redis_ratelimit::Decisions>()
                .map(|all| all.iter().map(|d| d.limit).collect())
                .unwrap_or_default();
            Ok::<_, Infallible>(Response::new(format!("{last:?} {all:?}")))
        }));
    let response = svc.oneshot(Request::new(String::new())).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"Some(100) [3, 100]");

    // One layer: the decision alone, no list.
    let single = ServiceBuilder::new()
        .layer(layer("solo", 3))
        .service(service_fn(|req: Request<String>| async move {
            let listed = req
                .extensions()
                .get::<tower_redis_ratelimit::Decisions>()
                .is_some();
            Ok::<_, Infallible>(Response::new(format!("{listed}")))
        }));
    let response = single.oneshot(Request::new(String::new())).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"false");
}
