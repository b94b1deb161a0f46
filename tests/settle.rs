//! Settling after the response (`Limiter::settle`, `LayerBuilder::settle` with a
//! `Usage`): down and up for each algorithm and a set on Redis, in process and in the
//! fallback; debt refuses until it is paid off, with the right `Retry-After`; a streamed
//! body settles exactly, and a client gone mid-stream settles what was sent; two
//! instances sharing Redis spend exactly what their requests used.

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::num::NonZeroU32;
use std::ops::RangeInclusive;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use support::RedisServer;
use tokio::task::JoinSet;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::period::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::rolling::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::service::Usage;
use tower_redis_ratelimit::set::{LimitSet, SetLimiter};
use tower_redis_ratelimit::token_bucket::{TokenBucketConfig, TokenBucketLimiter};
use tower_redis_ratelimit::{
    Backend, Decision, Limiter, PeriodLimitLayer, Source, State, TokenBucketLayer,
};

const SEC: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);

fn n(cost: u32) -> NonZeroU32 {
    NonZeroU32::new(cost).unwrap()
}

/// Where a test's limits are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    InProcess,
    Redis,
    /// A Redis backend whose server does not answer: the in-process fallback.
    Fallback,
}

fn backend(host: Host, redis: &RedisServer) -> Backend {
    match host {
        Host::InProcess => Backend::in_process(),
        Host::Redis => redis.uncached_backend(),
        Host::Fallback => Backend::builder()
            .redis_url(format!("redis://127.0.0.1:{}", support::free_port()))
            .call_timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    }
}

fn source(host: Host) -> Source {
    match host {
        Host::InProcess => Source::InProcess,
        Host::Redis => Source::Redis,
        Host::Fallback => Source::Fallback,
    }
}

/// Where `key` stands: a settlement of nothing.
async fn standing(limiter: &dyn Limiter, key: &[u8]) -> Decision {
    limiter.settle(key, 0).expect("built-in").await
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
        // 1 token a second: one token owed is paid off in a second.
        let bucket = TokenBucketLimiter::new(
            &backend,
            &name("bucket"),
            TokenBucketConfig::new(10, Duration::from_secs(10), 10),
        )
        .unwrap();
        down_and_up(&bucket, host, Duration::from_millis(500)..=SEC).await;
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

/// A body that yields `chunks` chunks of `size` bytes, one every `every`, counting what
/// it yielded.
struct Slow {
    chunks: u32,
    size: usize,
    every: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    yielded: Arc<AtomicU64>,
}

impl Body for Slow {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.chunks == 0 {
            return Poll::Ready(None);
        }
        let every = self.every;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
        std::task::ready!(sleep.as_mut().poll(cx));
        self.sleep = None;
        self.chunks -= 1;
        self.yielded.fetch_add(self.size as u64, Ordering::SeqCst);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; self.size])))))
    }
}

/// Polls `limiter`'s standing on `key` until `expected` units are left (the settlement
/// runs in the background on Redis).
async fn until_remaining(limiter: &dyn Limiter, key: &[u8], expected: u64) {
    let mut last = None;
    for _ in 0..500 {
        let d = standing(limiter, key).await;
        if d.remaining == expected {
            return;
        }
        last = Some(d);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never {expected} left: {last:?}");
}

#[tokio::test]
async fn a_streamed_body_settles_to_its_bytes_exactly() {
    let redis = RedisServer::start();
    for host in [Host::InProcess, Host::Redis] {
        let backend = backend(host, &redis);
        let name = format!("egress-{host:?}").to_lowercase();
        let layer = PeriodLimitLayer::builder(&backend)
            .name(&name)
            .quota(100_000)
            .period(MINUTE)
            .key(HeaderKey::from_static("x-tenant"))
            .cost(|_: &Request<()>| 1_000)
            .settle(Usage::bytes())
            .build()
            .unwrap();
        let limiter = layer.limiter().clone();
        let yielded = Arc::new(AtomicU64::new(0));
        let made = Arc::clone(&yielded);
        let mut service =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(move |_req: Request<()>| {
                    let body = Slow {
                        chunks: 7,
                        size: 333,
                        every: Duration::from_millis(1),
                        sleep: None,
                        yielded: Arc::clone(&made),
                    };
                    async move { Ok::<_, Infallible>(Response::new(body)) }
                }));
        let request = Request::get("/").header("x-tenant", "t1").body(()).unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // Reserved 1000 while the body streams.
        let key = b"hdr:x-tenant:t1";
        assert_eq!(standing(&limiter, key).await.remaining, 99_000);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 7 * 333);
        assert_eq!(yielded.load(Ordering::SeqCst), 7 * 333);
        until_remaining(&limiter, key, 100_000 - 7 * 333).await;

        // Dropped after two chunks: settles the two.
        let request = Request::get("/").header("x-tenant", "t2").body(()).unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        let mut body = response.into_body();
        for _ in 0..2 {
            body.frame().await.unwrap().unwrap();
        }
        drop(body);
        until_remaining(&limiter, b"hdr:x-tenant:t2", 100_000 - 2 * 333).await;
    }
}

/// One request over HTTP whose response streams `chunks` chunks; the client reads
/// `read` of them, then goes away.
#[tokio::test]
async fn a_client_gone_mid_stream_settles_what_was_sent() {
    use axum::body::Body as AxumBody;
    use axum::routing::get;
    use axum::Router;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let redis = RedisServer::start();
    let backend = redis.uncached_backend();
    let layer = PeriodLimitLayer::builder(&backend)
        .name("stream")
        .quota(1_000_000)
        .period(MINUTE)
        .key(HeaderKey::from_static("x-tenant"))
        .cost(|_: &Request<AxumBody>| 10_000)
        .settle(Usage::bytes())
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let yielded = Arc::new(AtomicU64::new(0));
    let made = Arc::clone(&yielded);
    let handler = move || {
        let body = Slow {
            chunks: 200,
            size: 100,
            every: Duration::from_millis(20),
            sleep: None,
            yielded: Arc::clone(&made),
        };
        async move { AxumBody::new(body) }
    };
    let app = Router::new().route("/", get(handler).layer(layer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let client = Client::builder(TokioExecutor::new()).build_http::<http_body_util::Empty<Bytes>>();
    let request = Request::get(format!("http://{addr}/"))
        .header("x-tenant", "gone")
        .body(http_body_util::Empty::new())
        .unwrap();
    let response = client.request(request).await.unwrap();
    let mut body = response.into_body();
    let mut read = 0;
    while read < 500 {
        let frame = body.frame().await.unwrap().unwrap();
        read += frame.into_data().map_or(0, |d| d.len());
    }
    drop(body);
    drop(client);
    // The server notices on its next write; what it produced by then is settled.
    let key = b"hdr:x-tenant:gone";
    let mut last = None;
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let d = standing(&limiter, key).await;
        let produced = yielded.load(Ordering::SeqCst);
        if d.remaining == 1_000_000 - produced && produced < 200 * 100 {
            // Stable: the stream has stopped.
            tokio::time::sleep(Duration::from_millis(100)).await;
            if yielded.load(Ordering::SeqCst) == produced {
                assert!(produced >= 500, "{produced}");
                return;
            }
        }
        last = Some((d, produced));
    }
    panic!("not settled to what was sent: {last:?}");
}

#[tokio::test]
async fn debt_refuses_until_paid_off_with_its_retry_after() {
    let redis = RedisServer::start();
    let backend = redis.uncached_backend();
    // 10 tokens a second, burst 10; 2 reserved per request, settled to `x-used`.
    let layer = TokenBucketLayer::builder(&backend)
        .name("tokens")
        .rate(10, Duration::from_secs(1))
        .burst(10)
        .key(HeaderKey::from_static("x-user"))
        .cost(|_: &Request<u32>| 2)
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
    let response = service.ready().await.unwrap().call(call(35)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    // The settlement lands in the background.
    let mut owed = standing(&limiter, b"hdr:x-user:u").await;
    for _ in 0..200 {
        if owed.state == State::OverQuota {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        owed = standing(&limiter, b"hdr:x-user:u").await;
    }
    assert_eq!(owed.state, State::OverQuota, "{owed:?}");
    let retry = owed.retry_after.unwrap();
    assert!(
        retry > Duration::from_millis(2_000) && retry <= Duration::from_millis(2_500),
        "{retry:?}"
    );
    let refused = service.ready().await.unwrap().call(call(1)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "3");
    // Not paid off a second before: still refused.
    tokio::time::sleep(retry.saturating_sub(Duration::from_secs(1))).await;
    let refused = service.ready().await.unwrap().call(call(1)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // The debt's last second, and one token (0.1 s) for the cost of 1.
    assert_eq!(refused.headers()["retry-after"], "2");
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
        let layer = PeriodLimitLayer::builder(&redis.uncached_backend())
            .name("shared")
            .quota(QUOTA)
            .period(Duration::from_secs(600))
            .key(HeaderKey::from_static("x-user"))
            .cost(|_: &Request<()>| ESTIMATE)
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

/// Uploads settle to the bytes the handler read: a chunked one (no `Content-Length`,
/// estimated at 1) and one that says its length (estimated at it).
#[tokio::test]
async fn uploads_settle_to_the_bytes_read() {
    use axum::routing::post;
    use axum::Router;
    use http::header::CONTENT_LENGTH;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower_redis_ratelimit::service::CountRequestBytes;
    use tower_redis_ratelimit::HeaderCost;

    let redis = RedisServer::start();
    let uploads = PeriodLimitLayer::builder(&redis.uncached_backend())
        .name("uploads")
        .quota(10_000)
        .period(MINUTE)
        .key(HeaderKey::from_static("x-tenant"))
        .cost(HeaderCost::new(CONTENT_LENGTH, 1))
        .settle(Usage::request_bytes())
        .build()
        .unwrap();
    let limiter = uploads.limiter().clone();
    let app = Router::new()
        .route(
            "/upload",
            post(|body: Bytes| async move { body.len().to_string() }),
        )
        .layer(CountRequestBytes)
        .layer(uploads);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let url = format!("http://{addr}/upload");
    let key = b"hdr:x-tenant:t";

    // Chunked: 5 000 bytes, estimated at 1.
    let chunked = Client::builder(TokioExecutor::new()).build_http::<Slow>();
    let body = Slow {
        chunks: 10,
        size: 500,
        every: Duration::from_millis(1),
        sleep: None,
        yielded: Arc::new(AtomicU64::new(0)),
    };
    let request = Request::post(&url)
        .header("x-tenant", "t")
        .body(body)
        .unwrap();
    let response = chunked.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let read = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&read[..], b"5000");
    until_remaining(&limiter, key, 5_000).await;

    // 2 000 bytes with their length: estimated and settled at 2 000.
    let sized = Client::builder(TokioExecutor::new()).build_http::<http_body_util::Full<Bytes>>();
    let request = Request::post(&url)
        .header("x-tenant", "t")
        .body(http_body_util::Full::new(Bytes::from(vec![b'y'; 2_000])))
        .unwrap();
    let response = sized.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    until_remaining(&limiter, key, 3_000).await;

    // 4 000 more do not fit the 3 000 left: refused before a byte is read.
    let request = Request::post(&url)
        .header("x-tenant", "t")
        .body(http_body_util::Full::new(Bytes::from(vec![b'z'; 4_000])))
        .unwrap();
    let response = sized.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(standing(&limiter, key).await.remaining, 3_000);
}

/// A body of `data` chunks, then `trailers` if any.
struct Framed {
    frames: std::collections::VecDeque<Frame<Bytes>>,
}

impl Body for Framed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.frames.pop_front().map(Ok))
    }
}

/// A trailer, and a closure that sees the body's last bytes only.
#[tokio::test]
async fn trailers_and_the_end_of_the_body() {
    let backend = Backend::in_process();
    let body = |chunks: &[&'static str], trailer: Option<&'static str>| {
        let mut frames: std::collections::VecDeque<_> = chunks
            .iter()
            .map(|c| Frame::data(Bytes::from_static(c.as_bytes())))
            .collect();
        if let Some(value) = trailer {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-units", value.parse().unwrap());
            frames.push_back(Frame::trailers(trailers));
        }
        Framed { frames }
    };
    for (name, usage, chunks, trailer, left) in [
        (
            "trailer",
            Usage::trailer(HeaderName::from_static("x-units")),
            &["ab", "cd"][..],
            Some("7"),
            93,
        ),
        // No trailer (the body ended first): the estimate of 10 stays.
        (
            "no-trailer",
            Usage::trailer(HeaderName::from_static("x-units")),
            &["ab"][..],
            None,
            90,
        ),
        // The closure sees the last 2 bytes of "1234" "56" "78": "78".
        (
            "tail",
            Usage::body(2, |finished| {
                assert!(finished.is_complete());
                assert_eq!(finished.bytes(), 8);
                std::str::from_utf8(finished.body()).ok()?.parse().ok()
            }),
            &["1234", "56", "78"][..],
            None,
            22,
        ),
    ] {
        let layer = PeriodLimitLayer::builder(&backend)
            .name(name)
            .quota(100)
            .period(MINUTE)
            .cost(|_: &Request<()>| 10)
            .settle(usage)
            .build()
            .unwrap();
        let limiter = layer.limiter().clone();
        let chunks = chunks.to_vec();
        let mut service =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(move |_req: Request<()>| {
                    let framed = body(&chunks, trailer);
                    async move { Ok::<_, Infallible>(Response::new(framed)) }
                }));
        let response = service
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        response.into_body().collect().await.unwrap();
        assert_eq!(
            standing(&limiter, b"global").await.remaining,
            left,
            "{name}"
        );
    }
}

/// A shadow layer counts what an enforcing one would, so it settles what its checks
/// admitted: in process (decided at once) and on Redis (its check in a task of its own,
/// the settlement waiting for it).
#[tokio::test]
async fn a_shadow_layer_settles_what_it_admitted() {
    let redis = RedisServer::start();
    for host in [Host::InProcess, Host::Redis] {
        let layer = PeriodLimitLayer::builder(&backend(host, &redis))
            .name(format!("shadow-{host:?}").to_lowercase())
            .quota(1_000)
            .period(MINUTE)
            .cost(|_: &Request<()>| 100)
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

/// A body that yields `before` chunks of 10 bytes, then panics.
struct Panicking {
    before: u32,
}

impl Body for Panicking {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        assert!(self.before > 0, "the body fails mid-stream");
        self.before -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&[b'p'; 10])))))
    }
}

/// A body that panics mid-stream settles what it produced: the task polling it unwinds,
/// dropping it.
#[tokio::test]
async fn a_panicking_body_settles_what_it_produced() {
    let layer = PeriodLimitLayer::builder(&Backend::in_process())
        .name("panics")
        .quota(1_000)
        .period(MINUTE)
        .cost(|_: &Request<()>| 100)
        .settle(Usage::bytes())
        .build()
        .unwrap();
    let limiter = layer.limiter().clone();
    let mut service =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|_req: Request<()>| async move {
                Ok::<_, Infallible>(Response::new(Panicking { before: 3 }))
            }));
    let response = service
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap();
    let polled = tokio::spawn(async move { response.into_body().collect().await.map(|_| ()) });
    assert!(polled.await.unwrap_err().is_panic());
    // 3 chunks of 10 bytes went out before the panic.
    until_remaining(&limiter, b"global", 970).await;
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
    use tower_redis_ratelimit::{ExtensionPlan, LayerBuilder, Plans};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Plan {
        Free,
        Paid,
    }
    let plans = Plans::new(ExtensionPlan::<Plan>::new())
        .plan(Plan::Free, "free", PeriodConfig::new(100, MINUTE))
        .plan(Plan::Paid, "paid", PeriodConfig::new(1_000, MINUTE));
    let layer = LayerBuilder::new(&Backend::in_process(), plans)
        .name("plans")
        .cost(|_: &Request<()>| 50)
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
