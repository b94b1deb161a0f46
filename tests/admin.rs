//! Admin actions by the client's value (issue 35, item 1): an administrator knows the
//! API key `trap`, not the key `fn:trap` or `hdr:x-api-key:trap` a layer counts it
//! under. `reset(b"trap")` used to answer `Allowed` on an empty key of its own while the
//! client stayed blocked; the layer's `reset_value` resolves the value through the
//! layer's own extractor.

mod support;

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use support::http::Served;
use support::RedisServer;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::key::{ExtensionKey, HeaderKey, Key, KeyExtractor, KeyForError, PeerIp};
use tower_redis_ratelimit::limit::{ExtensionPlan, Plans};
use tower_redis_ratelimit::AdminError;
use tower_redis_ratelimit::DynamicLimits;
use tower_redis_ratelimit::PeriodConfig;
use tower_redis_ratelimit::{Backend, Limiter, State};
use tower_redis_ratelimit::{InFlightConfig, LimitLayer, LimitSet};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const MINUTE: Duration = Duration::from_secs(60);

/// The extractor: the API key in `x-api-key`, read by a closure (`fn:` keys).
fn api_key(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get("x-api-key")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

fn request(api_key: &str) -> Request<String> {
    Request::get("/")
        .header("x-api-key", api_key)
        .body(String::new())
        .unwrap()
}

async fn ok(_: Request<String>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::from("ok")))
}

/// The issue's own failure, then its cure: a block by the extractor's key, a reset by
/// the client's value that answers `Allowed` (on the empty key `trap`) while the client
/// still gets 429; the layer's `reset_value(b"trap")` finds `fn:trap` and lifts it.
async fn reset_by_value_lifts_the_block(backend: &Backend) {
    let layer = LimitLayer::builder(backend, PeriodConfig::new(60, MINUTE))
        .name("api")
        .key(api_key)
        .build()
        .unwrap();
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(ok));
    let status = |key: &'static str| {
        let service = service.clone();
        async move { service.oneshot(request(key)).await.unwrap().status() }
    };
    assert_eq!(status("trap").await, StatusCode::OK);

    // The admin blocks by the key the layer counts (the only way before).
    let blocked = layer.limiter().block(b"fn:trap", MINUTE).unwrap().await;
    assert!(!blocked.is_admitted());
    assert_eq!(status("trap").await, StatusCode::TOO_MANY_REQUESTS);

    // The issue: a reset by the value acts on another, empty key and looks like success.
    let wrong = layer.limiter().reset(b"trap").unwrap().await;
    assert_eq!((wrong.state, wrong.remaining), (State::Allowed, 60));
    assert_eq!(status("trap").await, StatusCode::TOO_MANY_REQUESTS);

    // By value, through the layer's own extractor: the key it counts, and the block lifts.
    let keys = layer.keys_for("trap").unwrap();
    assert_eq!(keys, [Key::from("fn:trap")]);
    let reset = layer.reset_value("trap").await.unwrap();
    assert_eq!(reset.len(), 1);
    assert_eq!(reset[0].0, "fn:trap");
    assert!(reset[0].1.is_admitted());
    assert_eq!(status("trap").await, StatusCode::OK);

    // Block by value: refused; peek by value says so; a reset by value lifts it again.
    let block = layer.block_value("trap", MINUTE).await.unwrap();
    assert!(!block[0].1.is_admitted());
    assert_eq!(status("trap").await, StatusCode::TOO_MANY_REQUESTS);
    let peek = layer.peek_value("trap", ONE).await.unwrap();
    assert!(!peek[0].1.is_admitted(), "peek sees the block");
    assert_eq!(
        status("other").await,
        StatusCode::OK,
        "only `trap` is blocked"
    );
    layer.reset_value("trap").await.unwrap();
    assert_eq!(status("trap").await, StatusCode::OK);

    // Refund by value gives the one request since the reset back to the key the layer
    // counted: all 60 left again.
    let refunded = layer.refund_value("trap", ONE).await.unwrap();
    assert_eq!(refunded[0].0, "fn:trap");
    assert_eq!(refunded[0].1.remaining, 60);
}

#[tokio::test]
async fn reset_by_value_lifts_the_block_in_process() {
    reset_by_value_lifts_the_block(&Backend::in_process()).await;
}

#[tokio::test]
async fn reset_by_value_lifts_the_block_on_redis() {
    let redis = RedisServer::start();
    reset_by_value_lifts_the_block(&redis.uncached_backend()).await;
    // With the deny cache on (the default): the reset clears this instance's cache too.
    let cached = redis.backend();
    reset_by_value_lifts_the_block(&cached).await;
}

/// A value no branch of the layer's extractor could produce is an error, never a
/// silent success on another key; an `or` acts on every branch that can, and says so.
#[tokio::test]
async fn or_layers_act_on_every_branch_and_refuse_impossible_values() {
    let backend = Backend::in_process();
    let layer = LimitLayer::builder(&backend, PeriodConfig::new(5, MINUTE))
        .name("api")
        .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
        .build()
        .unwrap();
    // An address: the header branch could carry it too, and the IP branch counts it.
    let keys = layer.keys_for("203.0.113.7").unwrap();
    assert_eq!(
        keys,
        [
            Key::from("hdr:x-api-key:203.0.113.7"),
            Key::from("ip:203.0.113.7")
        ]
    );
    let blocked = layer.block_value("203.0.113.7", MINUTE).await.unwrap();
    assert_eq!(blocked.len(), 2);
    assert!(blocked.iter().all(|(_, decision)| !decision.is_admitted()));
    // An API key: only the header branch can produce it.
    assert_eq!(
        layer.keys_for("trap").unwrap(),
        [Key::from("hdr:x-api-key:trap")]
    );
    // Bytes no header can carry, and no address: no branch could ever count it.
    let err = layer.reset_value("a\nb").await.unwrap_err();
    assert!(
        matches!(err, AdminError::Key(KeyForError::NoBranch(_))),
        "{err:?}"
    );
    assert!(err.to_string().contains("no branch"), "{err}");
}

/// Plans, sets, dynamic limits and in-flight layers resolve values the same way.
#[tokio::test]
async fn every_layer_kind_acts_by_value() {
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Plan {
        Free,
        Paid,
    }
    #[derive(Clone, Debug)]
    struct User(&'static str);
    impl std::fmt::Display for User {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    let backend = Backend::in_process();
    let user = ExtensionKey::<User>::new().tag("user");

    let plans = Plans::new(ExtensionPlan::<Plan>::new())
        .plan(Plan::Free, "free", PeriodConfig::new(2, MINUTE))
        .plan(Plan::Paid, "paid", PeriodConfig::new(5, MINUTE));
    let plan_layer = LimitLayer::builder(&backend, plans)
        .name("plans")
        .key(user)
        .build()
        .unwrap();
    assert_eq!(
        plan_layer.keys_for("carol").unwrap(),
        [Key::from("ext:user:carol")]
    );
    plan_layer.block_value("carol", MINUTE).await.unwrap();
    let paid = plan_layer.limiter().plan(&Plan::Paid).unwrap();
    assert!(
        !paid.check(b"ext:user:carol", ONE).await.is_admitted(),
        "every plan"
    );
    plan_layer.reset_value("carol").await.unwrap();
    assert!(paid.check(b"ext:user:carol", ONE).await.is_admitted());

    let set_layer = LimitLayer::builder(
        &backend,
        LimitSet::new()
            .requests("rpm", PeriodConfig::new(60, MINUTE))
            .limit("tpm", PeriodConfig::new(20_000, MINUTE)),
    )
    .name("llm")
    .key(user)
    .build()
    .unwrap();
    set_layer.block_value("carol", MINUTE).await.unwrap();
    assert!(!set_layer
        .limiter()
        .check(b"ext:user:carol", ONE)
        .await
        .is_admitted());
    set_layer.reset_value("carol").await.unwrap();
    assert!(set_layer
        .limiter()
        .check(b"ext:user:carol", ONE)
        .await
        .is_admitted());

    let source =
        |_: tower_redis_ratelimit::key::TaggedKey<'_>| async { Ok::<_, Infallible>(Some(3)) };
    let dynamic_layer = LimitLayer::builder(
        &backend,
        DynamicLimits::new(PeriodConfig::new(10, MINUTE), source),
    )
    .name("dyn")
    .key(user)
    .build()
    .unwrap();
    for _ in 0..3 {
        dynamic_layer.limiter().check(b"ext:user:carol", ONE).await;
    }
    let peek = dynamic_layer.peek_value("carol", ONE).await.unwrap();
    assert_eq!(peek[0].1.state, State::OverQuota, "{peek:?}");
    dynamic_layer.reset_value("carol").await.unwrap();
    assert!(dynamic_layer
        .limiter()
        .check(b"ext:user:carol", ONE)
        .await
        .is_admitted());

    let exports = LimitLayer::builder(&backend, InFlightConfig::new(2))
        .name("export")
        .key(HeaderKey::from_static("x-merchant-id"))
        .build()
        .unwrap();
    let slot = exports
        .limiter()
        .acquire(b"hdr:x-merchant-id:acme")
        .await
        .unwrap();
    assert_eq!(
        exports.keys_for("acme").unwrap(),
        [Key::from("hdr:x-merchant-id:acme")]
    );
    let held = exports.in_flight_value("acme").await.unwrap();
    assert_eq!(held, [(Key::from("hdr:x-merchant-id:acme"), 1)]);
    drop(slot);
    assert!(matches!(
        exports.in_flight_value("").await,
        Err(KeyForError::Unreachable { .. })
    ));
}

/// A custom extractor that does not say which key a value has: an error naming it.
#[tokio::test]
async fn a_custom_extractor_cannot_say() {
    #[derive(Clone, Debug)]
    struct Tenant;
    impl KeyExtractor for Tenant {
        fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
            parts
                .uri
                .host()
                .map(|host| Key::concat(&[b"tenant:", host.as_bytes()]))
        }
    }
    let layer = LimitLayer::builder(&Backend::in_process(), PeriodConfig::new(5, MINUTE))
        .name("tenants")
        .key(Tenant)
        .build()
        .unwrap();
    let err = layer.reset_value("acme").await.unwrap_err();
    assert!(matches!(
        err,
        AdminError::Key(KeyForError::Unsupported { .. })
    ));
    assert!(err.to_string().contains("Tenant"), "{err}");
}

/// End to end through axum on a real socket: block the client by its address, 429;
/// reset by that address, the next request is admitted. In process and on Redis.
async fn axum_block_then_reset_by_address(backend: &Backend) {
    let layer = LimitLayer::builder(backend, PeriodConfig::new(100, MINUTE))
        .name("per-ip")
        .key(PeerIp::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let served = Served::start(app).await;
    let client = "127.0.0.1";
    assert_eq!(served.get("/", &[]).await.0.status(), StatusCode::OK);

    let blocked = layer.block_value(client, MINUTE).await.unwrap();
    assert_eq!(blocked[0].0, "ip:127.0.0.1");
    assert_eq!(
        served.get("/", &[]).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // From a spawned task, as an admin handler runs: the futures are `Send`.
    let admin = layer.clone();
    tokio::spawn(async move { admin.reset_value(client).await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(served.get("/", &[]).await.0.status(), StatusCode::OK);

    // Not an address: `PeerIp` could never count it.
    let err = layer.reset_value("localhost").await.unwrap_err();
    assert!(matches!(
        err,
        AdminError::Key(KeyForError::Unreachable { .. })
    ));
}

#[tokio::test]
async fn axum_block_then_reset_by_address_in_process() {
    axum_block_then_reset_by_address(&Backend::in_process()).await;
}

#[tokio::test]
async fn axum_block_then_reset_by_address_on_redis() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    axum_block_then_reset_by_address(&backend).await;
}

/// A value whose key is longer than the layer's `max_key_len` is never counted (the
/// layer takes such a request as having no key): an error, not an action on that key.
#[tokio::test]
async fn a_key_too_long_for_the_layer_is_an_error() {
    let layer = LimitLayer::builder(&Backend::in_process(), PeriodConfig::new(5, MINUTE))
        .name("api")
        .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
        .max_key_len(20)
        .build()
        .unwrap();
    let long = "a-rather-long-api-key";
    let err = layer.block_value(long, MINUTE).await.unwrap_err();
    assert!(
        matches!(
            err,
            AdminError::Key(KeyForError::TooLong {
                max_key_len: 20,
                ..
            })
        ),
        "{err:?}"
    );
    // An `or`: the header's key is too long, the address's fits: only it is acted on.
    let keys = layer.keys_for("203.0.113.7").unwrap();
    assert_eq!(keys, [Key::from("ip:203.0.113.7")]);
}
