//! `service/*`: one HTTP request through an axum `Router` (no network, no hyper), on the
//! routes of the `loadtest` harness: `unlimited` (no limiter), `token_bucket` (the
//! in-process `TokenBucketLayer` with its defaults: `RateLimit` / `RateLimit-Policy`
//! headers and the `Decision` extension), `token_bucket_no_headers` (both off),
//! `governor` (`tower_governor` 0.8, same quota and key) and `governor_headers` (with its
//! `x-ratelimit-*` headers), and `token/in-process/refused` and `governor/refused`,
//! which refuse every request after the key's first (the cost of a `429`: the crate's
//! carries `Retry-After` and the `RateLimit` headers, and is counted among the top
//! offenders). One key; each iteration builds the request
//! (with a `ConnectInfo`, as hyper's server adds it), calls the router and drops the
//! response, so the difference to `unlimited` is what the layer adds per request in the
//! server's own code (what the network and the client cost is left out).
//!
//! The routes run interleaved: every iteration of every bench sends one request to each
//! route in turn and times only its own; the mean time of every request of each route
//! over the whole group (the same moments for all) is printed on stderr at the end, with
//! its difference to `unlimited` and its ratio to `governor`. Compare those, not
//! criterion's figures, which are taken one bench after the other while the load of a
//! shared machine changes.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{Criterion, Throughput};
use http::{HeaderValue, Request};
use tower::ServiceExt;
use tower_redis_ratelimit::Backend;

#[path = "../support/routes.rs"]
mod routes;

use routes::API_KEY;

const RATE: u64 = 1_000_000;

/// A request to `route` with the key `k1`. The header value is static, so cloning it
/// (as tower_governor's key extractor does) allocates nothing, as with hyper, whose
/// header values share the connection's read buffer.
fn request(route: &str) -> Request<Body> {
    let mut req = Request::get(route)
        .header(API_KEY, HeaderValue::from_static("k1"))
        .body(Body::empty())
        .expect("a valid request");
    let peer: SocketAddr = ([127, 0, 0, 1], 50_000).into();
    req.extensions_mut().insert(ConnectInfo(peer));
    req
}

const ROUTES: [&str; 7] = [
    "unlimited",
    "token/in-process",
    "token/in-process/no-headers",
    "governor",
    "governor/headers",
    "token/in-process/refused",
    "governor/refused",
];

pub(crate) fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let app =
        rt.block_on(async { routes::router(&Backend::in_process(), RATE).expect("valid routes") });
    let paths: Vec<String> = ROUTES.iter().map(|route| format!("/{route}")).collect();
    // Per route: total time and requests, over every bench of the group.
    let totals = RefCell::new([(Duration::ZERO, 0u64); ROUTES.len()]);
    let mut group = c.benchmark_group("service");
    group.throughput(Throughput::Elements(1));
    for (me, route) in ROUTES.iter().enumerate() {
        group.bench_function(*route, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (app, paths, totals) = (&app, &paths, &totals);
                async move {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        for (k, path) in paths.iter().enumerate() {
                            let req = request(path);
                            let app = app.clone();
                            let start = Instant::now();
                            let response = app.oneshot(req).await.expect("infallible");
                            drop(response);
                            let took = start.elapsed();
                            let mut totals = totals.borrow_mut();
                            totals[k].0 += took;
                            totals[k].1 += 1;
                            if k == me {
                                timed += took;
                            }
                        }
                    }
                    timed
                }
            });
        });
    }
    group.finish();
    let totals = totals.into_inner();
    let mean = |(total, n): (Duration, u64)| total.as_secs_f64() * 1e9 / n.max(1) as f64;
    let (unlimited, governor) = (mean(totals[0]), mean(totals[3]));
    eprintln!("service/* interleaved, mean per request over the same moments:");
    for (route, total) in ROUTES.iter().zip(totals) {
        let ns = mean(total);
        eprintln!(
            "  {route:<24} {ns:>7.0} ns  (+{:>4.0} ns over unlimited, {:.2}x governor; {} requests)",
            ns - unlimited,
            ns / governor,
            total.1
        );
    }
}
