//! Handles and counting by outcome with per-plan and dynamic limits (issues 22 and 28):
//! `count_if` gives units back under the plan or the limit that spent them; peek,
//! refund, reset and block of a `PlanLimiter` and a `DynamicLimiter` reach the keys'
//! state (they used to answer `None`, so these silently did nothing).

mod support;

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::RedisServer;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::limit::{CountIf, ExtensionPlan, Plans};
use tower_redis_ratelimit::DynamicLimits;
use tower_redis_ratelimit::PeriodConfig;
use tower_redis_ratelimit::{Backend, LimitLayer, Limiter, State};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const MINUTE: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Plan {
    Free,
    Paid,
}

/// Sends `n` requests for `user` on `plan`, answered `status`; the statuses seen.
async fn send<S, B>(service: &S, n: usize, plan: Plan, status: StatusCode) -> Vec<u16>
where
    S: tower::Service<Request<String>, Response = Response<B>, Error = Infallible> + Clone,
{
    let mut seen = Vec::new();
    for _ in 0..n {
        let mut request = Request::get("/")
            .header("x-user", "u1")
            .header("x-status", status.as_str())
            .body(String::new())
            .unwrap();
        request.extensions_mut().insert(plan);
        let response = service.clone().oneshot(request).await.unwrap();
        seen.push(response.status().as_u16());
        // A refund on Redis runs in the background: let it land before the next one.
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    seen
}

/// Answers the status in `x-status`.
async fn echo(request: Request<String>) -> Result<Response<String>, Infallible> {
    let status = request.headers()["x-status"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut response = Response::new(String::new());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    Ok(response)
}

/// Free: 2 a minute; paid: 5 a minute; by the `Plan` in the request's extensions.
fn plans() -> Plans<PeriodConfig, Plan, ExtensionPlan<Plan>> {
    Plans::new(ExtensionPlan::<Plan>::new())
        .plan(Plan::Free, "free", PeriodConfig::new(2, MINUTE))
        .plan(Plan::Paid, "paid", PeriodConfig::new(5, MINUTE))
}

fn backends(redis: &RedisServer) -> [Backend; 2] {
    [redis.uncached_backend(), Backend::in_process()]
}

/// Failed logins count, per plan: successes on the paid plan are given back under the
/// paid plan (they used to spend for good: 5 of 10 admitted).
#[tokio::test]
async fn count_if_gives_back_under_the_plan_that_spent() {
    let redis = RedisServer::start();
    for backend in backends(&redis) {
        let layer = LimitLayer::builder(&backend, plans())
            .name("login")
            .key(HeaderKey::from_static("x-user"))
            .count_if(CountIf::failures())
            .build()
            .unwrap();
        let service = ServiceBuilder::new().layer(layer).service(service_fn(echo));
        let ok = send(&service, 10, Plan::Paid, StatusCode::OK).await;
        assert_eq!(ok, [200; 10], "{backend:?}");
        let failed = send(&service, 6, Plan::Paid, StatusCode::UNAUTHORIZED).await;
        assert_eq!(failed, [401, 401, 401, 401, 401, 429], "{backend:?}");
        // The free plan counts apart.
        let free = send(&service, 3, Plan::Free, StatusCode::UNAUTHORIZED).await;
        assert_eq!(free, [401, 401, 429], "{backend:?}");
    }
}

/// The same with limits from a source: the key's limit is 3; successes are given back
/// (they used to spend: 3 of 10 admitted).
#[tokio::test]
async fn count_if_gives_back_under_a_dynamic_limit() {
    let redis = RedisServer::start();
    for backend in backends(&redis) {
        let limits = DynamicLimits::new(
            PeriodConfig::new(100, MINUTE),
            |_key: tower_redis_ratelimit::key::TaggedKey<'_>| async {
                Ok::<_, Infallible>(Some(3))
            },
        );
        let layer = LimitLayer::builder(&backend, limits)
            .name("pay")
            .key(HeaderKey::from_static("x-user"))
            .count_if(CountIf::failures())
            .build()
            .unwrap();
        let service = ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(echo));
        let limiter = layer.limiter();
        let ok = send(&service, 10, Plan::Free, StatusCode::OK).await;
        assert_eq!(ok, [200; 10], "{backend:?}");
        let failed = send(&service, 4, Plan::Free, StatusCode::BAD_REQUEST).await;
        assert_eq!(failed, [400, 400, 400, 429], "{backend:?}");

        // The handle answers under the key's own limit (3), and its reset and block
        // reach the layer's state.
        let key = b"hdr:x-user:u1";
        let peek = limiter.peek(key, ONE).unwrap().await;
        assert_eq!((peek.state, peek.limit), (State::OverQuota, 3), "{peek:?}");
        limiter.reset(key).unwrap().await;
        let fresh = limiter.peek(key, ONE).unwrap().await;
        assert_eq!(
            (fresh.state, fresh.remaining),
            (State::Allowed, 2),
            "{fresh:?}"
        );
        limiter.block(key, MINUTE).unwrap().await;
        let blocked = send(&service, 1, Plan::Free, StatusCode::BAD_REQUEST).await;
        assert_eq!(blocked, [429], "{backend:?}");
        limiter.reset(key).unwrap().await;
    }
}

/// A plan limiter's handle: block and reset reach the key under every plan; peek and
/// refund under the default (first) plan.
#[tokio::test]
async fn a_plan_limiters_handle_reaches_every_plan() {
    let redis = RedisServer::start();
    for backend in backends(&redis) {
        let layer = LimitLayer::builder(&backend, plans())
            .name("api")
            .key(HeaderKey::from_static("x-user"))
            .build()
            .unwrap();
        let service = ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(echo));
        let limiter = layer.limiter();
        let key = b"hdr:x-user:u1";
        assert_eq!(
            send(&service, 2, Plan::Free, StatusCode::OK).await,
            [200, 200]
        );
        let peek = limiter.peek(key, ONE).unwrap().await;
        assert_eq!(peek.state, State::OverQuota, "{backend:?}: {peek:?}");
        limiter.refund(key, ONE).unwrap().await;
        assert_eq!(
            send(&service, 2, Plan::Free, StatusCode::OK).await,
            [200, 429]
        );

        limiter.block(key, MINUTE).unwrap().await;
        for plan in [Plan::Free, Plan::Paid] {
            assert_eq!(
                send(&service, 1, plan, StatusCode::OK).await,
                [429],
                "{backend:?} {plan:?}"
            );
        }
        limiter.reset(key).unwrap().await;
        for plan in [Plan::Free, Plan::Paid] {
            assert_eq!(
                send(&service, 1, plan, StatusCode::OK).await,
                [200],
                "{backend:?} {plan:?}"
            );
        }
    }
}
