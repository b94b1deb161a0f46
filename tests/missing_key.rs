//! A request refused for a missing key (a forgotten `into_make_service_with_connect_info`,
//! an authentication layer inside the limit) is logged at WARN, at most once per period
//! per layer, naming the likely causes and the extractor that found nothing.

mod support;

use std::time::Duration;

use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use support::logs::capture;
use tower::ServiceExt;
use tower_redis_ratelimit::key::PeerIp;
use tower_redis_ratelimit::{Backend, MissingKey};
use tower_redis_ratelimit::{InFlightConfig, LimitLayer, PeriodConfig};

fn app(missing: MissingKey) -> Router {
    let limit = LimitLayer::builder(
        &Backend::in_process(),
        PeriodConfig::new(100, Duration::from_secs(60)),
    )
    .name("api")
    .key(PeerIp::new())
    .on_missing_key(missing)
    .build()
    .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(limit)
}

#[tokio::test]
async fn a_missing_key_is_a_warning_once_per_period_naming_the_causes() {
    let (logs, _guard) = capture(tracing::Level::WARN);
    // Served without `into_make_service_with_connect_info`: no peer address anywhere.
    let router = app(MissingKey::default());
    for _ in 0..200 {
        let response = router
            .clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
    let text = logs.text();
    assert_eq!(text.matches(" WARN ").count(), 1, "{text}");
    assert_eq!(text.matches("no rate-limit key").count(), 1, "{text}");
    for cause in [
        "into_make_service_with_connect_info",
        "authentication",
        "with_interceptor",
        "InterceptorLayer",
        "PeerIp",
        "policy=\"api\"",
    ] {
        assert!(text.contains(cause), "{cause} missing from: {text}");
    }

    // Another layer logs on its own.
    let other = app(MissingKey::default());
    let response = other
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(logs.text().matches(" WARN ").count(), 2, "{}", logs.text());
}

#[tokio::test]
async fn a_missing_key_the_layer_was_told_to_allow_is_no_warning() {
    let (logs, _guard) = capture(tracing::Level::WARN);
    let router = app(MissingKey::Allow);
    let response = router
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(logs.text(), "");
}

/// A client that forgot its credential is an ordinary client error, not an alarm
/// (issue 35, item 6): a request without the `authorization` header a `HeaderKey` reads
/// is answered `400` and logged at `debug` only (it was a `WARN` naming server
/// misconfigurations, paging someone for a client's mistake); an in-flight layer alike.
/// The server's own omission (no peer address, above) keeps its `WARN`.
#[tokio::test]
async fn a_client_without_its_credential_is_no_warning() {
    use tower_redis_ratelimit::key::HeaderKey;

    let (logs, _guard) = capture(tracing::Level::WARN);
    let backend = Backend::in_process();
    let limit = LimitLayer::builder(&backend, PeriodConfig::new(60, Duration::from_secs(60)))
        .name("llm.rpm")
        .key(HeaderKey::from_static("authorization"))
        .build()
        .unwrap();
    let exports = LimitLayer::builder(&backend, InFlightConfig::new(2))
        .name("exports")
        .key(HeaderKey::from_static("authorization"))
        .build()
        .unwrap();
    let routers = [
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(limit),
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(exports),
    ];
    for router in routers {
        let response = router
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
    assert_eq!(logs.text(), "");
}

/// The user chooses how a missing client credential is logged and answered (issue 35,
/// item 6): the event's level (`missing_key_log_level`), and the response, by the
/// rejection handler's `on_missing_key` (here `ProblemJson`, and a handler of the
/// user's own), the in-flight layer alike.
#[tokio::test]
async fn a_missing_credential_is_logged_and_answered_as_the_user_chose() {
    use bytes::Bytes;
    use http::request::Parts;
    use http::Response;
    use tower_redis_ratelimit::key::HeaderKey;
    use tower_redis_ratelimit::{OnRejection, Policy, ProblemJson, Rejection};

    struct Ours;
    impl OnRejection for Ours {
        fn on_rejection(&self, _: &Rejection<'_>) -> Response<Bytes> {
            Response::builder()
                .status(429)
                .body(Bytes::from_static(b"slow down"))
                .unwrap()
        }
        fn on_missing_key(
            &self,
            status: StatusCode,
            policy: &Policy,
            _: &Parts,
        ) -> Option<Response<Bytes>> {
            let body = format!(
                r#"{{"error":"send an API key","limit":"{}"}}"#,
                policy.name()
            );
            Some(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Bytes::from(body))
                    .unwrap(),
            )
        }
    }

    let (logs, _guard) = capture(tracing::Level::INFO);
    let backend = Backend::in_process();
    let limit = LimitLayer::builder(&backend, PeriodConfig::new(60, Duration::from_secs(60)))
        .name("llm.rpm")
        .key(HeaderKey::from_static("authorization"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .missing_key_log_level(tracing::Level::INFO)
        .on_rejection(ProblemJson)
        .build()
        .unwrap();
    let exports = LimitLayer::builder(&backend, InFlightConfig::new(2))
        .name("exports")
        .key(HeaderKey::from_static("authorization"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .missing_key_log_level(tracing::Level::INFO)
        .on_rejection(Ours)
        .build()
        .unwrap();
    let routers = [
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(limit),
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(exports),
    ];
    let mut bodies = Vec::new();
    for router in routers {
        let response = router
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        bodies.push((content_type, String::from_utf8(body.to_vec()).unwrap()));
    }
    assert_eq!(bodies[0].0, "application/problem+json");
    assert!(
        bodies[0].1.contains(r#""status":401"#) && bodies[0].1.contains(r#""policy":"llm.rpm""#),
        "{bodies:?}"
    );
    assert_eq!(
        bodies[1],
        (
            "application/json".to_owned(),
            r#"{"error":"send an API key","limit":"exports"}"#.to_owned()
        )
    );
    let text = logs.text();
    assert_eq!(text.matches(" INFO ").count(), 2, "{text}");
    assert_eq!(text.matches("rate-limit key missing").count(), 2, "{text}");
    assert!(!text.contains(" WARN "), "{text}");
}
