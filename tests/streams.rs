//! Limits where requests are not the unit (issue 54): the messages of long-lived
//! connections checked with [`LimitLayer::stream`], per user across connections, over
//! real WebSocket, SSE and gRPC connections, in process and on Redis; streams limited
//! with `StreamLimit::limit` (a refused item dropped, delayed or ending the stream);
//! and counted in the layer's metrics.

mod support;

#[path = "../examples/websocket.rs"]
#[allow(dead_code, unreachable_pub)]
mod websocket;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::response::sse::{Event, Sse};
use axum::routing::get;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use http::request::Parts;
use http::{HeaderValue, StatusCode};
use support::http::Served;
use support::RedisServer;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::limit::Refused;
use tower_redis_ratelimit::{Backend, LimitLayer, PeriodConfig};

/// A window no test outlives: nothing refills while one runs.
const WINDOW: Duration = Duration::from_secs(60);

/// A client's WebSocket connection.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Sends one more message on `socket` once its user's limit is spent: refused, on a
/// connection that stayed open; then closes it.
async fn refused_again(mut socket: Socket) {
    socket.send(Message::Text("again".into())).await.unwrap();
    let reply = socket.next().await.unwrap().unwrap();
    assert!(
        reply.to_text().unwrap().contains("rate_limited"),
        "{reply:?}"
    );
    socket.close(None).await.unwrap();
}

/// Serves `app` on a free loopback port.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Opens a WebSocket to the example at `addr` as `user`: by the `x-user` header, or
/// by the `user` query parameter.
async fn connect(addr: SocketAddr, user: &str, by_header: bool) -> Socket {
    let url = if by_header {
        format!("ws://{addr}/ws")
    } else {
        format!("ws://{addr}/ws?user={user}")
    };
    let mut request = url.into_client_request().unwrap();
    if by_header {
        request
            .headers_mut()
            .insert("x-user", HeaderValue::from_str(user).unwrap());
    }
    let (socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    socket
}

/// Sends `count` messages quickly on one connection of `user`, then reads their
/// replies: (echoed, refused, the connection, still open).
async fn chat(
    addr: SocketAddr,
    user: &str,
    by_header: bool,
    count: usize,
) -> (usize, usize, Socket) {
    let mut socket = connect(addr, user, by_header).await;
    for i in 0..count {
        socket
            .send(Message::Text(format!("{user} {i}").into()))
            .await
            .unwrap();
    }
    let (mut echoed, mut refused) = (0, 0);
    for _ in 0..count {
        let reply = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("a reply in time")
            .expect("the connection is open")
            .unwrap();
        let Message::Text(text) = reply else {
            panic!("a text reply, not {reply:?}");
        };
        if text.starts_with(user) {
            echoed += 1;
        } else {
            let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(reply["error"], "rate_limited", "{text}");
            let retry_after_ms = reply["retry_after_ms"].as_u64().unwrap();
            assert!(
                retry_after_ms > 0 && retry_after_ms <= 60_000,
                "{retry_after_ms}"
            );
            refused += 1;
        }
    }
    (echoed, refused, socket)
}

/// Five connections of alice (three by header, two by query), four messages each:
/// five echoed in all, fifteen refused; bob's five are all echoed.
async fn five_tabs_share_one_limit(backend: Backend) {
    let app = websocket::app_with(
        &backend,
        PeriodConfig::new(websocket::MESSAGES_PER_SECOND, WINDOW),
    )
    .unwrap();
    let addr = serve(app).await;

    // No user: no connection.
    let refused = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED)
        }
        other => panic!("a refused upgrade, not {other:?}"),
    }

    let tabs = (0..5).map(|tab| chat(addr, "alice", tab < 3, 4));
    let replies = futures_util::future::join_all(tabs).await;
    let counts: Vec<(usize, usize)> = replies.iter().map(|r| (r.0, r.1)).collect();
    let echoed: usize = counts.iter().map(|r| r.0).sum();
    let refused: usize = counts.iter().map(|r| r.1).sum();
    assert_eq!((echoed, refused), (5, 15), "{counts:?}");
    // Every connection stayed open through its refusals.
    for (_, _, socket) in replies {
        refused_again(socket).await;
    }

    // Another user has a limit of their own.
    let (echoed, refused, socket) = chat(addr, "bob", false, 5).await;
    assert_eq!((echoed, refused), (5, 0));
    refused_again(socket).await;
}

#[tokio::test]
async fn websocket_tabs_share_one_limit_in_process() {
    five_tabs_share_one_limit(Backend::in_process()).await;
}

#[tokio::test]
async fn websocket_tabs_share_one_limit_on_redis() {
    let redis = RedisServer::start();
    five_tabs_share_one_limit(redis.backend()).await;
}

// ---------------------------------------------------------------------------
// Server-sent events
// ---------------------------------------------------------------------------

/// Events each SSE connection sends.
const EVENTS: usize = 5;

/// `GET /events`: `EVENTS` events, each checked against the user's limit of 3 per
/// minute. An event over the limit is replaced by an `event: rate_limited` whose data
/// is the wait in milliseconds, and the stream goes on (it ends after `EVENTS`).
fn sse_app(backend: &Backend) -> Router {
    let events = LimitLayer::builder(backend, PeriodConfig::new(3, WINDOW))
        .name("sse.events")
        .key(HeaderKey::from_static("x-user"))
        .build()
        .unwrap();
    Router::new().route(
        "/events",
        get(move |request: Parts| {
            let limit = events.stream(&request).expect("a user");
            async move {
                let stream = futures_util::stream::iter(0..EVENTS).then(move |i| {
                    let limit = limit.clone();
                    async move {
                        let decision = limit.check(NonZeroU32::MIN).await;
                        let event = if decision.is_admitted() {
                            Event::default().data(format!("tick {i}"))
                        } else {
                            let wait = decision.retry_after.unwrap_or_default().as_millis();
                            Event::default()
                                .event("rate_limited")
                                .data(wait.to_string())
                        };
                        Ok::<_, Infallible>(event)
                    }
                });
                Sse::new(stream)
            }
        }),
    )
}

/// Two SSE connections of one user read at once: three data events in all, the
/// other seven replaced by `rate_limited`.
async fn sse_clients_share_one_limit(backend: Backend) {
    let served = Served::start(sse_app(&backend)).await;
    let user = [("x-user", "carol")];
    let ((first, a), (second, b)) =
        tokio::join!(served.get("/events", &user), served.get("/events", &user));
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);
    let count = |body: &str, line: &str| body.lines().filter(|l| l.starts_with(line)).count();
    let data = count(&a, "data: tick") + count(&b, "data: tick");
    let limited = count(&a, "event: rate_limited") + count(&b, "event: rate_limited");
    assert_eq!((data, limited), (3, 2 * EVENTS - 3), "{a}\n---\n{b}");
    // Another user has a limit of their own.
    let (_, dave) = served.get("/events", &[("x-user", "dave")]).await;
    assert_eq!(count(&dave, "data: tick"), 3, "{dave}");
}

#[tokio::test]
async fn sse_clients_share_one_limit_in_process() {
    sse_clients_share_one_limit(Backend::in_process()).await;
}

#[tokio::test]
async fn sse_clients_share_one_limit_on_redis() {
    let redis = RedisServer::start();
    sse_clients_share_one_limit(redis.backend()).await;
}

/// `GET /feed`: `ticks` data events, through `StreamLimit::limit` with `refused`
/// against the user's limit of 2 per `period`; a stream ended by the limit sends a last
/// `rate_limited` event with the wait in milliseconds.
fn limited_feed(backend: &Backend, period: Duration, ticks: usize, refused: Refused) -> Router {
    let feed = LimitLayer::builder(backend, PeriodConfig::new(2, period))
        .name("sse.feed")
        .key(HeaderKey::from_static("x-user"))
        .build()
        .unwrap();
    Router::new().route(
        "/feed",
        get(move |request: Parts| {
            let limit = feed.stream(&request).expect("a user");
            async move {
                let ticks = futures_util::stream::iter(0..ticks);
                let events = limit.limit(ticks, |_| 1, refused).map(|tick| {
                    Ok::<_, Infallible>(match tick {
                        Ok(i) => Event::default().data(format!("tick {i}")),
                        Err(refused) => {
                            let wait = refused.retry_after.unwrap_or_default().as_millis();
                            Event::default()
                                .event("rate_limited")
                                .data(wait.to_string())
                        }
                    })
                });
                Sse::new(events)
            }
        }),
    )
}

/// The three ways a limited stream treats a refused item, over real SSE connections:
/// dropped (2 of 6 ticks arrive, the stream ends as its source does), delayed (all 5
/// arrive, two per window: the last one no sooner than two windows after the first),
/// or ending the stream (2 ticks, then the refusal).
async fn a_limited_stream_drops_delays_or_ends(backend: Backend) {
    let ticks = |body: &str| body.lines().filter(|l| l.starts_with("data: tick")).count();
    let limited = |body: &str| body.lines().filter(|l| *l == "event: rate_limited").count();
    let served = Served::start(limited_feed(&backend, WINDOW, 6, Refused::Drop)).await;
    let (response, body) = served.get("/feed", &[("x-user", "ivan")]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!((ticks(&body), limited(&body)), (2, 0), "{body}");

    let window = Duration::from_millis(300);
    let served = Served::start(limited_feed(&backend, window, 5, Refused::Delay)).await;
    let started = std::time::Instant::now();
    let (_, body) = served.get("/feed", &[("x-user", "judy")]).await;
    assert_eq!((ticks(&body), limited(&body)), (5, 0), "{body}");
    // Two per window, from the first tick's: the fifth waits for the third window.
    assert!(
        started.elapsed() >= 2 * window - Duration::from_millis(20),
        "{body}"
    );

    let served = Served::start(limited_feed(&backend, WINDOW, 6, Refused::End)).await;
    let (_, body) = served.get("/feed", &[("x-user", "mallory")]).await;
    assert_eq!((ticks(&body), limited(&body)), (2, 1), "{body}");
    let wait: u64 = body
        .lines()
        .skip_while(|l| *l != "event: rate_limited")
        .find_map(|l| l.strip_prefix("data: "))
        .and_then(|ms| ms.parse().ok())
        .expect("the refusal's wait");
    assert!(wait > 50_000, "the window's end: {wait} ms");
}

#[tokio::test]
async fn a_limited_stream_drops_delays_or_ends_in_process() {
    a_limited_stream_drops_delays_or_ends(Backend::in_process()).await;
}

#[tokio::test]
async fn a_limited_stream_drops_delays_or_ends_on_redis() {
    let redis = RedisServer::start();
    a_limited_stream_drops_delays_or_ends(redis.backend()).await;
}

// ---------------------------------------------------------------------------
// The handle itself
// ---------------------------------------------------------------------------

fn head(user: Option<&str>) -> Parts {
    let mut request = http::Request::get("/ws");
    if let Some(user) = user {
        request = request.header("x-user", user);
    }
    request.body(()).unwrap().into_parts().0
}

#[tokio::test]
async fn a_request_without_a_key_has_no_stream_limit_unless_the_layer_names_one() {
    let backend = Backend::in_process();
    let layer = LimitLayer::builder(&backend, PeriodConfig::new(1, WINDOW))
        .name("keyed")
        .key(HeaderKey::from_static("x-user"))
        .build()
        .unwrap();
    assert!(layer.stream(&head(None)).is_none());
    assert_eq!(
        layer.stream(&head(Some("erin"))).unwrap().key(),
        b"hdr:x-user:erin"
    );
    let anonymous = LimitLayer::builder(&backend, PeriodConfig::new(1, WINDOW))
        .name("anonymous")
        .key(HeaderKey::from_static("x-user"))
        .on_missing_key(tower_redis_ratelimit::MissingKey::Key("anonymous".into()))
        .build()
        .unwrap();
    let limit = anonymous.stream(&head(None)).unwrap();
    assert_eq!(limit.key(), b"anonymous");
    assert!(limit.check(NonZeroU32::MIN).await.is_admitted());
    assert!(!limit.check(NonZeroU32::MIN).await.is_admitted());
}

#[cfg(feature = "metrics")]
mod metrics_recorded {
    use std::collections::BTreeMap;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    use super::*;

    const REQUESTS_TOTAL: &str = "ratelimit_requests_total";

    /// Every counter of a snapshot, as `name{label=value,...}` -> count.
    fn counters(snapshotter: &Snapshotter) -> BTreeMap<String, u64> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let DebugValue::Counter(count) = value else {
                    return None;
                };
                let key = key.key();
                let mut labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                Some((format!("{}{{{}}}", key.name(), labels.join(",")), count))
            })
            .collect()
    }

    /// A stream's checks are counted as requests of the layer's policy: admitted,
    /// rejected (labelled by the policy as its limit), and on a shadow layer
    /// `shadow_rejected` while the check answers admitted.
    #[tokio::test]
    async fn stream_checks_are_counted_under_the_layers_policy() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _guard = metrics::set_default_local_recorder(&recorder);

        let backend = Backend::in_process();
        let enforcing = LimitLayer::builder(&backend, PeriodConfig::new(3, WINDOW))
            .name("chat")
            .key(HeaderKey::from_static("x-user"))
            .build()
            .unwrap();
        let shadow = LimitLayer::builder(&backend, PeriodConfig::new(1, WINDOW))
            .name("chat.trial")
            .key(HeaderKey::from_static("x-user"))
            .shadow(true)
            .build()
            .unwrap();
        let (tab, other_tab) = (
            enforcing.stream(&head(Some("frank"))).unwrap(),
            enforcing.stream(&head(Some("frank"))).unwrap(),
        );
        let trial = shadow.stream(&head(Some("frank"))).unwrap();
        let mut admitted = 0;
        for limit in [&tab, &other_tab, &tab, &other_tab, &tab] {
            admitted += usize::from(limit.check(NonZeroU32::MIN).await.is_admitted());
            let decision = trial.check(NonZeroU32::MIN).await;
            assert!(decision.is_admitted() && decision.retry_after.is_none());
        }
        assert_eq!(admitted, 3);

        let c = counters(&snapshotter);
        let get = |key: String| {
            c.get(&key)
                .copied()
                .unwrap_or_else(|| panic!("no {key} in {c:#?}"))
        };
        assert_eq!(
            get(format!("{REQUESTS_TOTAL}{{outcome=admitted,policy=chat}}")),
            3
        );
        assert_eq!(
            get(format!(
                "{REQUESTS_TOTAL}{{limit=chat,outcome=rejected,policy=chat}}"
            )),
            2
        );
        assert_eq!(
            get(format!(
                "{REQUESTS_TOTAL}{{outcome=admitted,policy=chat.trial}}"
            )),
            1
        );
        assert_eq!(
            get(format!(
                "{REQUESTS_TOTAL}{{limit=chat.trial,outcome=shadow_rejected,policy=chat.trial}}"
            )),
            4
        );
    }
}

/// A gRPC server stream (`grpc.health.v1.Health/Watch`, implemented here): each
/// message of a call checked with the `StreamLimit` a tower layer before the service
/// made from the call's head and put into its extensions. Over the limit the stream
/// ends with `RESOURCE_EXHAUSTED`.
#[cfg(feature = "grpc")]
mod grpc {
    use std::pin::Pin;

    use futures_util::Stream;
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::Endpoint;
    use tonic::{Code, Request, Response, Status};
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::health_server::{Health, HealthServer};
    use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
    use tower_redis_ratelimit::StreamLimit;

    use super::*;

    /// Messages each `Watch` call sends (the limit is 3 per minute per user).
    const MESSAGES: usize = 5;

    struct Watched;

    type Watch = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

    #[tonic::async_trait]
    impl Health for Watched {
        async fn check(
            &self,
            _: Request<HealthCheckRequest>,
        ) -> Result<Response<HealthCheckResponse>, Status> {
            Err(Status::unimplemented("watch only"))
        }

        type WatchStream = Watch;

        async fn watch(
            &self,
            request: Request<HealthCheckRequest>,
        ) -> Result<Response<Watch>, Status> {
            let limit = request
                .extensions()
                .get::<StreamLimit>()
                .cloned()
                .ok_or_else(|| Status::unauthenticated("x-user is needed"))?;
            let serving = HealthCheckResponse {
                status: ServingStatus::Serving.into(),
            };
            let updates = futures_util::stream::repeat(serving).take(MESSAGES);
            // Each message checked; the first refused ends the call with the limit's
            // status.
            let messages = limit
                .clone()
                .limit(updates, |_| 1, Refused::End)
                .map(move |message| message.map_err(|refused| limit.status(&refused)));
            Ok(Response::new(Box::pin(messages) as Watch))
        }
    }

    async fn serve(backend: &Backend) -> SocketAddr {
        let messages = LimitLayer::builder(backend, PeriodConfig::new(3, WINDOW))
            .name("grpc.messages")
            .key(HeaderKey::from_static("x-user"))
            .build()
            .unwrap();
        // Once per call: the call's limit, from its head (gRPC metadata are headers).
        let streams = tower::util::MapRequestLayer::new(move |request: http::Request<_>| {
            let (mut parts, body) = request.into_parts();
            if let Some(limit) = messages.stream(&parts) {
                parts.extensions.insert(limit);
            }
            http::Request::from_parts(parts, body)
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .layer(streams)
                .add_service(HealthServer::new(Watched))
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        addr
    }

    /// One `Watch` call of `user`: the messages it got, and how it ended (a status
    /// ending it is the layer's: `RESOURCE_EXHAUSTED` with a retry and the policy).
    async fn watch(addr: SocketAddr, user: &str) -> (usize, Option<Code>) {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut request = Request::new(HealthCheckRequest::default());
        request
            .metadata_mut()
            .insert("x-user", user.parse().unwrap());
        let mut stream = HealthClient::new(channel)
            .watch(request)
            .await
            .unwrap()
            .into_inner();
        let mut received = 0;
        loop {
            match stream.message().await {
                Ok(Some(message)) => {
                    assert_eq!(message.status, i32::from(ServingStatus::Serving));
                    received += 1;
                }
                Ok(None) => return (received, None),
                Err(status) => {
                    let details = tonic_types::StatusExt::get_error_details(&status);
                    let retry = details.retry_info().and_then(|r| r.retry_delay);
                    assert!(retry.is_some_and(|r| r > Duration::ZERO), "{status:?}");
                    let quota = details.quota_failure().expect("QuotaFailure");
                    assert_eq!(quota.violations[0].subject, "grpc.messages");
                    return (received, Some(status.code()));
                }
            }
        }
    }

    /// Two calls of one user at once: three messages in all, both ended by the limit.
    async fn calls_share_one_limit(backend: Backend) {
        let addr = serve(&backend).await;
        let (a, b) = tokio::join!(watch(addr, "grace"), watch(addr, "grace"));
        assert_eq!(a.0 + b.0, 3, "{a:?} {b:?}");
        assert_eq!(
            (a.1, b.1),
            (Some(Code::ResourceExhausted), Some(Code::ResourceExhausted))
        );
        // Another user has a limit of their own.
        assert_eq!(
            watch(addr, "heidi").await,
            (3, Some(Code::ResourceExhausted))
        );
    }

    #[tokio::test]
    async fn grpc_streams_share_one_limit_in_process() {
        calls_share_one_limit(Backend::in_process()).await;
    }

    #[tokio::test]
    async fn grpc_streams_share_one_limit_on_redis() {
        let redis = RedisServer::start();
        calls_share_one_limit(redis.backend()).await;
    }
}
