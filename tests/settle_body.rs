//! Settling to what a body carried (`Usage::bytes`, `Usage::request_bytes`,
//! `Usage::trailer`, `Usage::body`): a streamed body settles exactly, and a client gone
//! mid-stream settles what was sent; uploads settle to the bytes the handler read; a
//! trailer and the body's last bytes; a body that panics mid-stream settles what it
//! produced.

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use support::settle::{backend, standing, until_remaining, Host, MINUTE};
use support::RedisServer;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::key::GlobalKey;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::limit::Usage;
use tower_redis_ratelimit::Backend;
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

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

#[tokio::test]
async fn a_streamed_body_settles_to_its_bytes_exactly() {
    let redis = RedisServer::start();
    for host in [Host::InProcess, Host::Redis] {
        let backend = backend(host, &redis);
        let name = format!("egress-{host:?}").to_lowercase();
        let layer = LimitLayer::builder(&backend, PeriodConfig::new(100_000, MINUTE))
            .name(&name)
            .key(HeaderKey::from_static("x-tenant"))
            .cost(|_: &http::request::Parts| 1_000)
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
    let layer = LimitLayer::builder(&backend, PeriodConfig::new(1_000_000, MINUTE))
        .name("stream")
        .key(HeaderKey::from_static("x-tenant"))
        .cost(|_: &http::request::Parts| 10_000)
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

/// Uploads settle to the bytes the handler read: a chunked one (no `Content-Length`,
/// estimated at 1) and one that says its length (estimated at it).
#[tokio::test]
async fn uploads_settle_to_the_bytes_read() {
    use axum::routing::post;
    use axum::Router;
    use http::header::CONTENT_LENGTH;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower_redis_ratelimit::limit::CountRequestBytesLayer;
    use tower_redis_ratelimit::HeaderCost;

    let redis = RedisServer::start();
    let uploads = LimitLayer::builder(&redis.uncached_backend(), PeriodConfig::new(10_000, MINUTE))
        .name("uploads")
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
        .layer(CountRequestBytesLayer)
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
        let layer = LimitLayer::builder(&backend, PeriodConfig::new(100, MINUTE))
            .name(name)
            .key(GlobalKey)
            .cost(|_: &http::request::Parts| 10)
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
    let layer = LimitLayer::builder(&Backend::in_process(), PeriodConfig::new(1_000, MINUTE))
        .name("panics")
        .key(GlobalKey)
        .cost(|_: &http::request::Parts| 100)
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
