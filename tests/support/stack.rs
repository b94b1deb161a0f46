//! Limit layers on a plain tower stack, keyed on `x-key`, around a service that counts
//! its calls: shared by `tests/stacked.rs` and the metrics tests of `tests/edges.rs`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tower::{service_fn, Service, ServiceBuilder};
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::limit::ResponseBody;
use tower_redis_ratelimit::{Backend, Decision, PeriodLimitLayer};
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

pub(crate) type Svc = tower::util::BoxCloneService<
    Request<String>,
    Response<ResponseBody<ResponseBody<String>>>,
    Infallible,
>;

/// `outer` then `inner` around a service that counts its calls and reports whether it
/// saw a `Decision` in the request extensions.
pub(crate) fn stack(
    outer: PeriodLimitLayer<HeaderKey>,
    inner: PeriodLimitLayer<HeaderKey>,
) -> (Arc<AtomicUsize>, Svc) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service(service_fn(move |req: Request<String>| {
            counter.fetch_add(1, Ordering::SeqCst);
            let saw = req.extensions().get::<Decision>().is_some();
            async move { Ok::<_, Infallible>(Response::new(format!("decision: {saw}"))) }
        }));
    (calls, tower::util::BoxCloneService::new(svc))
}

pub(crate) fn keyed(key: &str) -> Request<String> {
    Request::get("/")
        .header("x-key", key)
        .body(String::new())
        .unwrap()
}

pub(crate) fn shadow_layer(backend: &Backend, quota: u64) -> PeriodLimitLayer<HeaderKey> {
    LimitLayer::builder(backend, PeriodConfig::new(quota, Duration::from_secs(60)))
        .name("shadow")
        .key(HeaderKey::from_static("x-key"))
        .shadow(true)
        .build()
        .unwrap()
}

pub(crate) fn counting(
    layer: PeriodLimitLayer<HeaderKey>,
) -> (
    Arc<AtomicUsize>,
    impl Service<Request<String>, Response = Response<ResponseBody<String>>, Error = Infallible> + Clone,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(move |req: Request<String>| {
                counter.fetch_add(1, Ordering::SeqCst);
                let saw = req.extensions().get::<Decision>().is_some();
                async move { Ok::<_, Infallible>(Response::new(format!("decision: {saw}"))) }
            }));
    (calls, svc)
}
