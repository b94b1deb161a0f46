//! The decision's fields on the caller's span (issue 55): a request span that declares
//! `rate_limit.decision`, `rate_limit.policy`, `rate_limit.rejected_by`,
//! `rate_limit.source` and `rate_limit.shadow` (tower-http's `TraceLayer`, as an app
//! makes it) gets them from the layer, captured here by a subscriber layer of the
//! test's own: for an admitted request, a set's refusal (the limit that refused), a
//! shadow layer's and one answered by the fallback while Redis is down.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::Request;
use support::RedisServer;
use tower::ServiceExt;
use tower_http::trace::TraceLayer;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::{LimitLayer, LimitSet, PeriodConfig, TokenBucketConfig};
use tracing::field::{Empty, Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Each closed span's `rate_limit.*` fields, in order.
#[derive(Clone, Default)]
struct Spans {
    open: Arc<Mutex<BTreeMap<u64, BTreeMap<String, String>>>>,
    closed: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.open.lock().unwrap().insert(id.into_u64(), fields);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(fields) = self.open.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(fields) = self.open.lock().unwrap().remove(&id.into_u64()) {
            self.closed.lock().unwrap().push(fields);
        }
    }
}

/// The app of one layer (`set`: the set, else a shadow limit of 1), inside a
/// `TraceLayer` whose request span declares the fields.
fn app(backend: &tower_redis_ratelimit::Backend, set: bool) -> Router {
    let trace = TraceLayer::new_for_http().make_span_with(|_: &Request<Body>| {
        tracing::info_span!(
            "request",
            rate_limit.decision = Empty,
            rate_limit.policy = Empty,
            rate_limit.rejected_by = Empty,
            rate_limit.source = Empty,
            rate_limit.shadow = Empty,
        )
    });
    let router = Router::new().route("/", get(|| async { "ok" }));
    let router = if set {
        let set = LimitSet::new()
            .limit(
                "burst",
                TokenBucketConfig::new(1, Duration::from_secs(60), 2),
            )
            .limit("day", PeriodConfig::new(100, Duration::from_secs(86_400)));
        router.layer(
            LimitLayer::builder(backend, set)
                .name("api")
                .key(HeaderKey::from_static("x-api-key"))
                .build()
                .unwrap(),
        )
    } else {
        router.layer(
            LimitLayer::builder(backend, PeriodConfig::new(1, Duration::from_secs(60)))
                .name("trial")
                .key(HeaderKey::from_static("x-api-key"))
                .shadow(true)
                .build()
                .unwrap(),
        )
    };
    router.layer(trace)
}

async fn send(app: &Router, key: &str) {
    let request = Request::get("/")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let _ = axum::body::to_bytes(response.into_body(), 1 << 16).await;
}

fn seen(spans: &Spans) -> Vec<[String; 5]> {
    let closed = spans.closed.lock().unwrap().clone();
    closed
        .iter()
        .map(|span| {
            ["decision", "policy", "rejected_by", "source", "shadow"].map(|name| {
                let value = span.get(&format!("rate_limit.{name}"));
                value.map_or("-".to_owned(), Clone::clone)
            })
        })
        .collect()
}

fn rows(rows: &[[&str; 5]]) -> Vec<[String; 5]> {
    rows.iter().map(|row| row.map(str::to_owned)).collect()
}

#[tokio::test]
async fn the_decision_is_recorded_on_the_callers_span() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis(redis.pool())
        .call_timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let app = app(&backend, true);
    // Two admitted, the third refused by the set's burst; then Redis is gone.
    for _ in 0..3 {
        send(&app, "k1").await;
    }
    redis.kill();
    send(&app, "k2").await;
    assert_eq!(
        seen(&spans),
        rows(&[
            ["admitted", "api", "-", "redis", "false"],
            ["admitted", "api", "-", "redis", "false"],
            ["rejected", "api", "api.burst", "redis", "false"],
            ["admitted", "api", "-", "fallback", "false"],
        ])
    );
}

#[tokio::test]
async fn a_shadow_layers_decision_says_so() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let app = app(&tower_redis_ratelimit::Backend::in_process(), false);
    send(&app, "k1").await;
    send(&app, "k1").await;
    assert_eq!(
        seen(&spans),
        rows(&[
            ["admitted", "trial", "-", "in_process", "true"],
            ["shadow_rejected", "trial", "trial", "in_process", "true"],
        ])
    );
}
