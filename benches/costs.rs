//! What the in-process limiters cost in heap allocations per request and in bytes per
//! key, counted exactly (a counting global allocator), next to `tower_governor` /
//! `governor` with the same quota. No network and no timing: the figures do not depend
//! on the load of the machine.
//!
//! ```text
//! cargo bench --bench costs            # 100 000 keys
//! cargo bench --bench costs -- 1000000 # a million keys
//! # instructions per request, exactly: the instructions of 10 000 requests on one
//! # route (callgrind's "Collected"), divided by 10 000
//! valgrind --tool=callgrind --toggle-collect=costs::measured \
//!     "$(scripts/harness costs)" run /token/in-process 10000
//! # the same cycling through 1000 keys
//! valgrind --tool=callgrind --toggle-collect=costs::measured \
//!     "$(scripts/harness costs)" run /token/in-process 10000 1000
//! # the lease route (a token bucket with leases of 50 tokens for 60 s) on a running
//! # redis-server: with as many keys as requests, every measured check is answered from
//! # its key's lease (the warm-up took one lease per key)
//! REDIS_URL=redis://127.0.0.1:PORT valgrind --tool=callgrind --toggle-collect=costs::measured \
//!     "$(scripts/harness costs)" run /token/redis-lease 10000 10000
//! ```
//!
//! 1. **Per request**: the routes of the `loadtest` harness (`/unlimited`,
//!    `/token/in-process` with headers and `Decision` extension, the same without,
//!    `/governor`, `/governor/headers`, and with `REDIS_URL` `/token/redis-lease`) in
//!    one axum `Router`, each called 10 000 times
//!    with `oneshot` on one key, as hyper would call it (the request carries a
//!    `ConnectInfo`); allocations and bytes allocated per request, the response
//!    included, and the difference to `/unlimited`.
//! 2. **Per key**: that many distinct keys (`key-00000000`, ..., tagged
//!    `hdr:x-api-key:` for the crate as its `HeaderKey` does) checked
//!    once each through `TokenBucketLimiter::check` on `Backend::in_process()`, and the
//!    same count of `String` keys through a keyed `governor::RateLimiter` (DashMap, what
//!    `tower_governor` uses), and of `HeaderValue` keys copied out of the request (what
//!    the `loadtest` harness's `tower_governor` key extractor stores): the heap bytes
//!    still held afterwards, per key. The bytes of the keys themselves are counted when
//!    the limiter keeps them (governor stores each key; the crate stores a 128-bit hash).

use std::alloc::System;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request};
use axum::Router;
use governor::{Quota, RateLimiter};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower::ServiceExt;
use tower_redis_ratelimit::{Backend, Limiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[path = "support/routes.rs"]
mod routes;

use routes::API_KEY;

const RATE: u64 = 1_000_000;
const REQUESTS: usize = 10_000;

/// A request to `route` with the key `k1`. The header value is static, so cloning it
/// (as tower_governor's key extractor does) allocates nothing, as with hyper, whose
/// header values share the connection's read buffer.
fn request(route: &str) -> Request<Body> {
    request_with(route, HeaderValue::from_static("k1"))
}

/// A request to `route` with the key `key`.
fn request_with(route: &str, key: HeaderValue) -> Request<Body> {
    let mut req = Request::get(route)
        .header(API_KEY, key)
        .body(Body::empty())
        .expect("a valid request");
    let peer: SocketAddr = ([127, 0, 0, 1], 50_000).into();
    req.extensions_mut().insert(ConnectInfo(peer));
    req
}

/// Allocations and bytes allocated per request on `route` (the request built outside
/// the counted region; the response dropped inside it).
/// Sends `request` (a warm-up), which must succeed.
async fn answers_ok(app: &Router, request: Request<Body>, route: &str) {
    let response = app.clone().oneshot(request).await.expect("infallible");
    assert!(
        response.status().is_success(),
        "{route}: {}",
        response.status()
    );
}

async fn per_request(app: &Router, route: &str) -> (f64, f64) {
    // Warm up: the key's state, lazily built parts.
    for _ in 0..100 {
        answers_ok(app, request(route), route).await;
    }
    let mut requests: Vec<_> = (0..REQUESTS).map(|_| request(route)).collect();
    let region = Region::new(GLOBAL);
    for req in requests.drain(..) {
        let response = app.clone().oneshot(req).await.expect("infallible");
        drop(response);
    }
    let stats = region.change();
    (
        stats.allocations as f64 / REQUESTS as f64,
        stats.bytes_allocated as f64 / REQUESTS as f64,
    )
}

/// Heap bytes still held after `fill` ran, per key.
fn held_per_key(keys: usize, fill: impl FnOnce()) -> f64 {
    let region = Region::new(GLOBAL);
    fill();
    let stats = region.change();
    (stats.bytes_allocated as f64 - stats.bytes_deallocated as f64) / keys as f64
}

/// The route of a token bucket with leases (on Redis: only with `REDIS_URL`).
const LEASE_ROUTE: &str = "/token/redis-lease";

/// The layer of [`LEASE_ROUTE`]: the in-process routes' token bucket on the Redis at
/// `url`, with leases of 50 tokens for 60 s (long enough for a run under valgrind).
fn lease(
    url: &str,
) -> tower_redis_ratelimit::LimitLayer<
    tower_redis_ratelimit::TokenBucketLimiter,
    tower_redis_ratelimit::key::HeaderKey,
> {
    let mut config = tower_redis_ratelimit::deadpool_redis::Config::from_url(url);
    let timeout = Some(std::time::Duration::from_millis(100));
    let mut pool = tower_redis_ratelimit::deadpool_redis::PoolConfig::default();
    (
        pool.timeouts.wait,
        pool.timeouts.create,
        pool.timeouts.recycle,
    ) = (timeout, timeout, timeout);
    config.pool = Some(pool);
    let pool = config
        .create_pool(Some(tower_redis_ratelimit::deadpool_redis::Runtime::Tokio1))
        .expect("a Redis pool");
    let backend = Backend::builder()
        .redis(pool)
        .prefix("costs")
        .build()
        .expect("a Redis backend");
    let config = TokenBucketConfig::new(RATE, Duration::from_secs(1), RATE)
        .lease(50, Duration::from_secs(60));
    tower_redis_ratelimit::LimitLayer::builder(&backend, config)
        .name("costs-lease")
        .key(tower_redis_ratelimit::key::HeaderKey::from_static(API_KEY))
        .build()
        .expect("a valid layer")
}

/// `costs run ROUTE N [KEYS]`: only N requests on ROUTE (cycling through KEYS keys,
/// default 1), for an instruction count of [`measured`] alone
/// (`valgrind --tool=callgrind --toggle-collect=costs::measured`).
fn run(route: &str, n: usize, keys: usize) {
    // The key values, each cloned once so that later clones only count references (as
    // hyper's header values, which share the connection's read buffer).
    let keys: Vec<HeaderValue> = (1..=keys.max(1))
        .map(|i| HeaderValue::from_str(&format!("k{i}")).expect("a valid value"))
        .collect();
    let promoted: Vec<HeaderValue> = keys.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let app = rt.block_on(async {
        let mut app = routes::router(&Backend::in_process(), RATE).expect("valid routes");
        if route == LEASE_ROUTE {
            let url = std::env::var("REDIS_URL").expect("REDIS_URL for the lease route");
            app = app.route(
                LEASE_ROUTE,
                axum::routing::get(routes::ok).layer(lease(&url)),
            );
        }
        // Warm up: every key's state, lazily built parts.
        for key in keys.iter().cycle().take(100.max(keys.len())) {
            answers_ok(&app, request_with(route, key.clone()), route).await;
        }
        app
    });
    measured(&rt, &app, route, n, &keys);
    drop(promoted);
}

/// N requests on `route` (each built, sent, and its response dropped), cycling through
/// `keys`.
#[inline(never)]
fn measured(
    rt: &tokio::runtime::Runtime,
    app: &Router,
    route: &str,
    n: usize,
    keys: &[HeaderValue],
) {
    rt.block_on(async {
        for key in keys.iter().cycle().take(n) {
            let response = app
                .clone()
                .oneshot(request_with(route, key.clone()))
                .await
                .expect("infallible");
            drop(response);
        }
    });
}

/// `costs sizes`: the bytes of what a request moves around (a decision, a check, the
/// response future of a `Limit` around an axum route).
fn sizes() {
    use std::mem::size_of;
    type Future = tower_redis_ratelimit::limit::ResponseFuture<axum::routing::Route, Body>;
    println!("| type | bytes |");
    println!("|---|---:|");
    println!(
        "| `Decision` | {} |",
        size_of::<tower_redis_ratelimit::Decision>()
    );
    println!(
        "| `DecisionFuture` | {} |",
        size_of::<tower_redis_ratelimit::DecisionFuture>()
    );
    println!(
        "| `ResponseFuture<Route, Body>` | {} |",
        size_of::<Future>()
    );
    println!(
        "| `RouteFuture` (axum's, inside it) | {} |",
        size_of::<axum::routing::future::RouteFuture<std::convert::Infallible>>()
    );
    println!("| `Request<Body>` | {} |", size_of::<Request<Body>>());
}

fn main() {
    let args: Vec<String> = std::env::args().filter(|arg| arg != "--bench").collect();
    if args.get(1).map(String::as_str) == Some("sizes") {
        return sizes();
    }
    if args.get(1).map(String::as_str) == Some("run") {
        let route = args.get(2).expect("costs run ROUTE N");
        let n = args
            .get(3)
            .and_then(|n| n.parse().ok())
            .expect("costs run ROUTE N");
        let keys = args.get(4).and_then(|n| n.parse().ok()).unwrap_or(1);
        return run(route, n, keys);
    }
    let keys: usize = std::env::args()
        .filter(|arg| arg != "--bench")
        .nth(1)
        .map(|n| n.parse().expect("the key count is a whole number"))
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");

    println!("## Per request (one key, {REQUESTS} requests through an axum Router, no network)\n");
    println!("| route | allocations / request | bytes allocated / request | allocations over `/unlimited` |");
    println!("|---|---:|---:|---:|");
    rt.block_on(async {
        let backend = Backend::in_process();
        let mut app = routes::router(&backend, RATE).expect("valid routes");
        let mut rows = vec![
            "/unlimited",
            "/token/in-process",
            "/token/in-process/no-headers",
            "/governor",
            "/governor/headers",
        ];
        // With REDIS_URL, the lease route too (one key: a round trip every 50 requests).
        if let Ok(url) = std::env::var("REDIS_URL") {
            app = app.route(
                LEASE_ROUTE,
                axum::routing::get(routes::ok).layer(lease(&url)),
            );
            rows.push(LEASE_ROUTE);
        }
        let (base, _) = per_request(&app, "/unlimited").await;
        for route in rows {
            let (allocations, bytes) = per_request(&app, route).await;
            println!(
                "| `{route}` | {allocations:.2} | {bytes:.0} | {:+.2} |",
                allocations - base
            );
        }
    });

    println!("\n## Per key ({keys} distinct keys, each checked once; heap bytes held after)\n");
    println!("| store | bytes per key |");
    println!("|---|---:|");
    let names: Vec<String> = (0..keys).map(|i| format!("key-{i:08}")).collect();
    rt.block_on(async {
        // The crate's keys as `HeaderKey` builds them (on the stack; nothing kept).
        let tagged: Vec<Vec<u8>> = names
            .iter()
            .map(|name| format!("hdr:{API_KEY}:{name}").into_bytes())
            .collect();
        let config = TokenBucketConfig::new(RATE, Duration::from_secs(1), RATE);
        // The store sizes its tables for `max_local_keys` when it is built: that is
        // counted too.
        let region = Region::new(GLOBAL);
        // A bound twice the keys: none of them is evicted.
        let backend = Backend::builder()
            .max_local_keys(2 * keys as u64)
            .build()
            .expect("an in-process backend");
        let limiter = TokenBucketLimiter::new(&backend, "loadtest", config).expect("valid");
        let built = region.change();
        for key in &tagged {
            assert!(limiter.check(key, NonZeroU32::MIN).await.is_admitted());
        }
        let stats = region.change();
        let held = |s: stats_alloc::Stats| s.bytes_allocated as f64 - s.bytes_deallocated as f64;
        let bytes = held(stats) / keys as f64;
        println!(
            "| tower-redis-ratelimit token bucket (`Backend::in_process()`, `max_local_keys` {}; {:.1} MiB of it when built) | {bytes:.0} |",
            2 * keys,
            held(built) / 1_048_576.0
        );
        drop(limiter);
    });
    let quota = Quota::with_period(Duration::from_micros(1))
        .expect("not zero")
        .allow_burst(NonZeroU32::new(RATE as u32).expect("not zero"));
    {
        let governor = RateLimiter::<String, _, _>::dashmap(quota);
        // governor clones each new key into its map.
        let bytes = held_per_key(keys, || {
            for key in &names {
                assert!(governor.check_key(key).is_ok());
            }
        });
        println!("| governor 0.10 keyed (DashMap), `String` keys | {bytes:.0} |");
    }
    {
        let governor = RateLimiter::<HeaderValue, _, _>::dashmap(quota);
        let bytes = held_per_key(keys, || {
            for name in &names {
                let key = HeaderValue::from_str(name).expect("a valid header value");
                assert!(governor.check_key(&key).is_ok());
            }
        });
        println!(
            "| governor 0.10 keyed (DashMap), `HeaderValue` keys (tower_governor's) | {bytes:.0} |"
        );
    }
}
