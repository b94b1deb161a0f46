//! Shared in-flight limits on a real Redis: instances sharing one limit, slots held
//! until the body ends, given back on cancel and drop, leases that keep a long stream's
//! slot and give a killed process's slots back, and the failure policies.

mod support;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use support::proxy::FaultProxy;
use support::RedisServer;
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::in_flight::{InFlightConfig, InFlightLimiter};
use tower_redis_ratelimit::key::GlobalKey;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::LimitLayer;
use tower_redis_ratelimit::RedisState;
use tower_redis_ratelimit::{Backend, FailurePolicy, Source, State};
use tower_redis_ratelimit::{ShareRounding, TimeSource};

/// A backend of its own (its own connection, made before its first call) on `url`,
/// with generous deadlines: the renewals of these tests must not miss on a loaded
/// machine, and no call may fall back for want of a connection.
async fn backend(url: &str) -> Backend {
    let backend = support::backend_builder()
        .redis_url(url)
        .call_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    backend.warm_up().await.unwrap();
    backend
}

/// Polls `f` until it is true, for at most `within`.
async fn eventually<F: std::future::Future<Output = bool>>(
    within: Duration,
    mut f: impl FnMut() -> F,
) -> Duration {
    let start = Instant::now();
    loop {
        if f().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Three instances (three backends, each with its own connection) x 50 concurrent slow
/// requests, a limit of 10: the handlers never run more than 10 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_never_run_more_than_the_limit() {
    let redis = RedisServer::start();
    let backends = [
        backend(&redis.url()).await,
        backend(&redis.url()).await,
        backend(&redis.url()).await,
    ];
    three_times_fifty(&backends).await;
}

/// The same in process: three layers of one name on one backend share its slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_process_layers_of_one_name_never_run_more_than_the_limit() {
    let backend = Backend::in_process();
    three_times_fifty(&[backend.clone(), backend.clone(), backend]).await;
}

/// 50 concurrent slow requests to each of three layers of 10 slots named `export`, one
/// per backend, each request retrying until it is served once.
async fn three_times_fifty(backends: &[Backend; 3]) {
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let mut instances = Vec::new();
    for backend in backends {
        let layer = LimitLayer::builder(backend, InFlightConfig::new(10))
            .name("export")
            .key(GlobalKey)
            .build()
            .unwrap();
        let (running, most, served) = (running.clone(), most.clone(), served.clone());
        let svc =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(move |_req: Request<()>| {
                    let (running, most, served) = (running.clone(), most.clone(), served.clone());
                    async move {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        served.fetch_add(1, Ordering::SeqCst);
                        running.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
                    }
                }));
        instances.push(svc);
    }
    let refused = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for svc in &instances {
        for _ in 0..50 {
            let svc = svc.clone();
            let refused = refused.clone();
            tasks.spawn(async move {
                // Each request tries until it is served once (or gives up after 10 s).
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(10) {
                    let response = svc.clone().oneshot(Request::new(())).await.unwrap();
                    if response.status() == StatusCode::OK {
                        // The slot goes back when the body ends.
                        response.into_body().collect().await.unwrap();
                        return true;
                    }
                    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                    assert_eq!(response.headers()["retry-after"], "1");
                    refused.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                false
            });
        }
    }
    let mut done = 0;
    while let Some(served) = tasks.join_next().await {
        done += usize::from(served.unwrap());
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 10, "{most} requests ran at once");
    assert!(
        most >= 5,
        "only {most} ran at once: the limit was not exercised"
    );
    assert!(refused.load(Ordering::SeqCst) > 0, "nothing was refused");
    assert_eq!(done, 150, "every request was served in the end");
    assert_eq!(served.load(Ordering::SeqCst), 150);
    // Every slot was given back.
    let limiter = InFlightLimiter::new(&backends[0], "export", InFlightConfig::new(10)).unwrap();
    eventually(Duration::from_secs(5), || async {
        limiter.in_flight(b"global").await == 0
    })
    .await;
}

/// A body that yields what its sender sends, and ends when the sender is dropped.
struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

impl Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|data| data.map(|d| Ok(Frame::data(d))))
    }
}

type Streams = Arc<std::sync::Mutex<Vec<tokio::sync::mpsc::Sender<Bytes>>>>;

/// A layer of one slot per `x-merchant-id` (lease `lease`) over a service whose
/// response bodies stream until the test drops their senders (kept in the returned
/// list, in order).
fn streaming(
    backend: &Backend,
    lease: Duration,
) -> (
    impl Service<
            Request<()>,
            Response = Response<impl Body<Data = Bytes, Error = Infallible> + Unpin>,
            Error = Infallible,
        > + Clone,
    Streams,
) {
    let senders: Streams = Arc::default();
    let layer = LimitLayer::builder(backend, InFlightConfig::new(1).slot_ttl(lease))
        .name("stream")
        .key(HeaderKey::from_static("x-merchant-id"))
        .build()
        .unwrap();
    let held = senders.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |_req: Request<()>| {
            let (tx, rx) = tokio::sync::mpsc::channel(16);
            held.lock().unwrap().push(tx);
            async move { Ok::<_, Infallible>(Response::new(Channel(rx))) }
        }));
    (svc, senders)
}

fn merchant(id: &str) -> Request<()> {
    Request::builder()
        .header("x-merchant-id", id)
        .body(())
        .unwrap()
}

/// A stream three leases long keeps its slot: the renewal extends its lease while it
/// runs, so no other request of the key gets in; once it ends, the next one does.
#[tokio::test]
async fn a_stream_longer_than_the_lease_keeps_its_slot() {
    let redis = RedisServer::start();
    // (1.5 s, renewed every 500 ms: a renewal may come a second late before the slot runs
    // out. At 600 ms, renewed every 200 ms, a busy CI machine could be 400 ms late.)
    let lease = Duration::from_millis(1_500);
    let (svc, senders) = streaming(&backend(&redis.url()).await, lease);
    let response = svc.clone().oneshot(merchant("m1")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let stream = senders.lock().unwrap()[0].clone();
    let start = Instant::now();
    while start.elapsed() < lease * 3 {
        stream.send(Bytes::from_static(b"row\n")).await.unwrap();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "row\n");
        let other = svc.clone().oneshot(merchant("m1")).await.unwrap();
        assert_eq!(
            other.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "a second request got in {:?} into a stream of lease {lease:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Another key was never held up.
    let response = svc.clone().oneshot(merchant("m2")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);
    // The stream ends: its slot goes back (one round trip in the background).
    senders.lock().unwrap().clear();
    drop(stream);
    assert!(body.frame().await.is_none());
    eventually(Duration::from_secs(5), || async {
        svc.clone().oneshot(merchant("m1")).await.unwrap().status() == StatusCode::OK
    })
    .await;
}

/// The slot is held until the body ends, not until the response arrives: a response
/// whose body is still streaming keeps the key full.
#[tokio::test]
async fn the_slot_is_held_until_the_body_ends() {
    let redis = RedisServer::start();
    let (svc, senders) = streaming(&backend(&redis.url()).await, Duration::from_secs(10));
    let first = svc.clone().oneshot(merchant("m")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // Time for a slot given back with the response (the mistake this test catches) to
    // reach Redis.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = svc.clone().oneshot(merchant("m")).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.headers()["retry-after"], "1");
    let mut body = first.into_body();
    senders.lock().unwrap().clear();
    assert!(body.frame().await.is_none());
    eventually(Duration::from_secs(5), || async {
        svc.clone().oneshot(merchant("m")).await.unwrap().status() == StatusCode::OK
    })
    .await;
}

/// A body dropped unread, a request cancelled while its handler runs, and a handler
/// that fails all give their slot back at once (not after the lease).
#[tokio::test]
async fn cancel_and_drop_give_the_slot_back() {
    let redis = RedisServer::start();
    let backend = backend(&redis.url()).await;
    let lease = Duration::from_secs(30);
    let limiter =
        InFlightLimiter::new(&backend, "cancel", InFlightConfig::new(1).slot_ttl(lease)).unwrap();
    let layer = LimitLayer::builder(&backend, InFlightConfig::new(1).slot_ttl(lease))
        .name("cancel")
        .key(HeaderKey::from_static("x-merchant-id"))
        .build()
        .unwrap();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<()>| async move {
                match req.uri().path() {
                    "/hang" => std::future::pending::<()>().await,
                    "/fail" => return Err("handler failed"),
                    _ => {}
                }
                Ok(Response::new(Full::new(Bytes::from_static(b"body"))))
            }));
    let request = |path: &str| {
        Request::builder()
            .uri(path)
            .header("x-merchant-id", "m")
            .body(())
            .unwrap()
    };
    let free = || async { limiter.in_flight(b"hdr:x-merchant-id:m").await == 0 };

    // The body dropped unread.
    let response = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(limiter.in_flight(b"hdr:x-merchant-id:m").await, 1);
    drop(response);
    eventually(Duration::from_secs(5), free).await;

    // The request cancelled while the handler runs.
    let hanging = tokio::spawn(svc.clone().oneshot(request("/hang")));
    eventually(Duration::from_secs(5), || async {
        limiter.in_flight(b"hdr:x-merchant-id:m").await == 1
    })
    .await;
    hanging.abort();
    eventually(Duration::from_secs(5), free).await;

    // The handler fails.
    assert!(svc.clone().oneshot(request("/fail")).await.is_err());
    eventually(Duration::from_secs(5), free).await;
    let response = svc.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// The environment variables of the child process of `a_killed_process_slots_come_back`.
const CHILD_URL: &str = "IN_FLIGHT_CHILD_REDIS_URL";
const CHILD_LEASE_MS: &str = "IN_FLIGHT_CHILD_LEASE_MS";

/// Not a test of its own: the process that `a_killed_process_slots_come_back` starts
/// (this test binary again), which takes both slots of a key, says so, and holds them
/// (renewing their leases) until it is killed.
#[tokio::test]
#[ignore = "a helper process, started by a_killed_process_slots_come_back"]
async fn in_flight_child_holds_slots() {
    let url = std::env::var(CHILD_URL).expect("started by a_killed_process_slots_come_back");
    let lease_ms: u64 = std::env::var(CHILD_LEASE_MS).unwrap().parse().unwrap();
    let config = InFlightConfig::new(2).slot_ttl(Duration::from_millis(lease_ms));
    let limiter = InFlightLimiter::new(&backend(&url).await, "jobs", config).unwrap();
    let _one = limiter.acquire(b"k").await.unwrap();
    let _two = limiter.acquire(b"k").await.unwrap();
    println!("HOLDING");
    std::future::pending::<()>().await;
}

/// `kill -9` of a process holding slots: they stay taken while it lives (its renewal
/// keeps them past their first lease), and come back within one lease of its death,
/// with no sweeper.
#[tokio::test]
async fn a_killed_process_slots_come_back_within_one_lease() {
    use std::io::BufRead;

    let redis = RedisServer::start();
    let lease = Duration::from_millis(1_500);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "in_flight_child_holds_slots",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_URL, redis.url())
        .env(CHILD_LEASE_MS, lease.as_millis().to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let holding = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .any(|line| line.is_ok_and(|line| line.contains("HOLDING")))
    });
    let holding = tokio::time::timeout(Duration::from_secs(60), holding).await;
    if !matches!(holding, Ok(Ok(true))) {
        let _ = child.kill();
        panic!("the child process never held its slots");
    }
    let config = InFlightConfig::new(2).slot_ttl(lease);
    let limiter = InFlightLimiter::new(&backend(&redis.url()).await, "jobs", config).unwrap();
    assert_eq!(limiter.in_flight(b"k").await, 2);
    // Two leases later the living child still holds both (it renews them).
    tokio::time::sleep(lease * 2).await;
    let refused = limiter.acquire(b"k").await.unwrap_err();
    assert_eq!(refused.state, State::OverQuota);
    assert_eq!(refused.source, Source::Redis);

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed = Instant::now();
    assert!(
        limiter.acquire(b"k").await.is_err(),
        "given back before its lease ran out"
    );
    let slot = loop {
        match limiter.acquire(b"k").await {
            Ok(slot) => break slot,
            Err(_) => {
                assert!(
                    killed.elapsed() < lease + Duration::from_secs(1),
                    "not given back within one lease"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(slot.decision().source, Source::Redis);
    assert_eq!(
        limiter.in_flight(b"k").await,
        1,
        "both of the child's slots expired"
    );
}

/// While Redis cannot be reached: the fallback takes slots in process, each instance
/// its share; fail-open admits without a slot; fail-closed refuses. Once Redis is
/// back, slots are taken there again.
#[tokio::test]
async fn while_redis_is_out_the_failure_policy_decides() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let backend = support::backend_builder()
        .redis_url(proxy.url())
        .call_timeout(Duration::from_millis(500))
        .probe_interval(Duration::from_millis(100))
        .recovery(Duration::from_millis(100))
        .build()
        .unwrap();
    let limiter = |policy: FailurePolicy| {
        let layer = LimitLayer::builder(&backend, InFlightConfig::new(4))
            .name("out")
            .key(GlobalKey)
            .fallback_share(0.5)
            .failure_policy(policy)
            .build()
            .unwrap();
        layer.limiter().clone()
    };
    // Connected before the first slot, which must go to Redis.
    backend.warm_up().await.unwrap();
    let fallback = limiter(FailurePolicy::Fallback);
    let open = limiter(FailurePolicy::FailOpen);
    let closed = limiter(FailurePolicy::FailClosed);
    let on_redis = fallback.acquire(b"k").await.unwrap();
    assert_eq!(on_redis.decision().source, Source::Redis);

    // Connections reset, new ones refused.
    proxy.refuse(true);
    proxy.reset_connections();
    // Each instance takes its share of the 4 slots: 2.
    let one = fallback.acquire(b"k").await.unwrap();
    assert_eq!(one.decision().source, Source::Fallback);
    assert_eq!(one.decision().limit, 2);
    let two = fallback.acquire(b"k").await.unwrap();
    let refused = fallback.acquire(b"k").await.unwrap_err();
    assert_eq!(refused.source, Source::Fallback);
    assert_eq!(refused.retry_after, Some(Duration::from_secs(1)));
    let admitted = open.acquire(b"k").await.unwrap();
    assert_eq!(admitted.decision().source, Source::FailOpen);
    let refused = closed.acquire(b"k").await.unwrap_err();
    assert_eq!(refused.source, Source::FailClosed);
    // A slot of the fallback goes back in process.
    drop(one);
    let again = fallback.acquire(b"k").await.unwrap();
    assert_eq!(again.decision().source, Source::Fallback);
    drop((two, again, admitted));

    proxy.refuse(false);
    eventually(Duration::from_secs(10), || async {
        backend.redis_state() == Some(RedisState::Healthy)
    })
    .await;
    // Back on Redis, where the slot taken before the outage is still held.
    let back = fallback.acquire(b"k").await.unwrap();
    assert_eq!(back.decision().source, Source::Redis);
    assert_eq!(fallback.in_flight(b"k").await, 2);
    drop((back, on_redis));
}

/// One table of steps, run on Redis and in process: the same decisions on both hosts.
#[tokio::test]
async fn the_two_hosts_decide_alike() {
    let redis = RedisServer::start();
    let mut runs = Vec::new();
    // (Not the default call timeout of 100 ms: a busy machine must not turn a slow call
    // into the failure policy's answer.)
    let evalsha = support::backend_builder()
        .redis_url(redis.url())
        .engine_functions(false)
        .call_timeout(support::CALL_TIMEOUT)
        .build()
        .unwrap();
    let caller_time = support::backend_builder()
        .redis_url(redis.url())
        .prefix("caller")
        .time_source(TimeSource::Caller)
        .call_timeout(support::CALL_TIMEOUT)
        .build()
        .unwrap();
    evalsha.warm_up().await.unwrap();
    caller_time.warm_up().await.unwrap();
    // Redis Functions, EVALSHA, the caller's clock, and in process.
    for backend in [
        backend(&redis.url()).await,
        evalsha,
        caller_time,
        Backend::in_process(),
    ] {
        let limiter = InFlightLimiter::new(&backend, "table", InFlightConfig::new(3)).unwrap();
        let mut held = Vec::new();
        let mut seen = Vec::new();
        // (acquire: true, release the oldest: false)
        for step in [
            true, true, true, true, false, true, true, false, false, true,
        ] {
            if step {
                match limiter.acquire(b"k").await {
                    Ok(slot) => {
                        let d = slot.decision();
                        seen.push((true, d.state, d.limit, d.remaining, d.retry_after));
                        held.push(slot);
                    }
                    Err(d) => seen.push((false, d.state, d.limit, d.remaining, d.retry_after)),
                }
            } else {
                drop(held.remove(0));
                // A release on Redis is sent in the background.
                let expected = held.len() as u64;
                eventually(Duration::from_secs(5), || async {
                    limiter.in_flight(b"k").await == expected
                })
                .await;
            }
        }
        // The slots still held go back before the next run, which shares their key on
        // Redis (the first two backends: one prefix).
        drop(held);
        eventually(Duration::from_secs(5), || async {
            limiter.in_flight(b"k").await == 0
        })
        .await;
        runs.push(seen);
    }
    let one = Some(Duration::from_secs(1));
    assert_eq!(
        runs[0],
        [
            (true, State::Allowed, 3, 2, None),
            (true, State::Allowed, 3, 1, None),
            (true, State::HitQuota, 3, 0, None),
            (false, State::OverQuota, 3, 0, one),
            (true, State::HitQuota, 3, 0, None),
            (false, State::OverQuota, 3, 0, one),
            (true, State::Allowed, 3, 1, None),
        ]
    );
    for run in &runs[1..] {
        assert_eq!(&runs[0], run);
    }
    // Both paths ran: the library was loaded (where the server has Redis Functions and
    // the default path is not forced to `EVALSHA`), and the script by SHA.
    if redis.runs_functions() {
        assert!(redis.command_calls("fcall") > 0);
    } else {
        eprintln!(
            "{}: the first backend ran by EVALSHA too (no Redis Functions, or \
             TOWER_REDIS_RATELIMIT_EVALSHA set)",
            redis.version()
        );
    }
    assert!(redis.command_calls("evalsha") > redis.command_calls("fcall"));
}

/// A shadow layer serves every request, and holds a slot for each admitted one as an
/// enforcing layer would.
#[tokio::test]
async fn a_shadow_layer_serves_everything_and_holds_slots() {
    let redis = RedisServer::start();
    for backend in [backend(&redis.url()).await, Backend::in_process()] {
        let layer = LimitLayer::builder(&backend, InFlightConfig::new(1))
            .name("shadow")
            .key(GlobalKey)
            .shadow(true)
            .build()
            .unwrap();
        let limiter = layer.limiter().clone();
        let svc =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(|_req: Request<()>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                }));
        let first = svc.clone().oneshot(Request::new(())).await.unwrap();
        eventually(Duration::from_secs(5), || async {
            limiter.in_flight(b"global").await == 1
        })
        .await;
        let second = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(
            second.status(),
            StatusCode::OK,
            "a shadow layer refuses nothing"
        );
        assert!(second.headers().get("retry-after").is_none());
        drop((first, second));
        eventually(Duration::from_secs(5), || async {
            limiter.in_flight(b"global").await == 0
        })
        .await;
    }
}

/// The renewal is batched: one call per key every third of a lease, whatever the number
/// of slots held on it.
#[tokio::test]
async fn renewal_is_one_call_per_key_whatever_the_slots() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(600);
    let config = InFlightConfig::new(5).slot_ttl(lease);
    let limiter = InFlightLimiter::new(&backend(&redis.url()).await, "batch", config).unwrap();
    let mut slots = Vec::new();
    for key in [b"a", b"b"] {
        for _ in 0..5 {
            slots.push(limiter.acquire(key).await.unwrap());
        }
    }
    let counting = Instant::now();
    let before = redis.command_calls("evalsha");
    tokio::time::sleep(lease * 3).await;
    let calls = redis.command_calls("evalsha") - before;
    // (The most renewals from the time that really passed, not from the sleep asked for,
    // and one more for a renewal sent just before the count began: a busy machine
    // oversleeps, and 16 calls in two leases, as this was, left it 400 ms. Three leases,
    // not two, leave the least, 3 renewals of each key, 1.2 s of delays.)
    let ticks = counting.elapsed().as_millis() / (lease / 3).as_millis() + 2;
    let most = 2 * u64::try_from(ticks).unwrap();
    // Three leases: about 9 renewals of each key (18 calls), where renewing each slot
    // would make 90.
    assert!(
        (6..=most).contains(&calls),
        "{calls} calls to renew 10 slots on 2 keys (at most {most})"
    );
    assert_eq!(limiter.in_flight(b"a").await, 5);
    drop(slots);
}

/// A limiter used from one runtime, then another (the first one gone, its renewal task
/// with it): the renewal starts again on the second.
#[test]
fn the_renewal_survives_its_first_runtime() {
    let redis = RedisServer::start();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    // (1.5 s, renewed every 500 ms: a renewal may come a second late before the slot runs
    // out. At 600 ms, renewed every 200 ms, a busy CI machine could be 400 ms late.)
    let lease = Duration::from_millis(1_500);
    let limiter = runtime().block_on(async {
        let backend = backend(&redis.url()).await;
        let limiter =
            InFlightLimiter::new(&backend, "runtimes", InFlightConfig::new(1).slot_ttl(lease))
                .unwrap();
        drop(limiter.acquire(b"k").await.unwrap());
        // The release goes in the background, on this runtime.
        eventually(Duration::from_secs(5), || async {
            limiter.in_flight(b"k").await == 0
        })
        .await;
        limiter
    });
    runtime().block_on(async {
        let slot = limiter.acquire(b"k").await.unwrap();
        tokio::time::sleep(lease * 2).await;
        assert!(
            limiter.acquire(b"k").await.is_err(),
            "the lease was not renewed"
        );
        drop(slot);
    });
}

/// Two export slots over three instances while Redis is down (issue 35, item 5): each
/// instance's share is two thirds of a slot. Rounded to at least one (the default) the
/// three run three exports at once, one above the limit, to stay available; rounded
/// within the limit none runs, each refusal says to come back after a probe interval,
/// and the fleet never runs more than the limit.
#[tokio::test]
async fn a_fallback_share_below_one_slot_rounds_as_the_layer_chose() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.kill();
    for (rounding, running) in [
        (ShareRounding::AtLeastOne, 3),
        (ShareRounding::WithinLimit, 0),
    ] {
        let mut held = Vec::new();
        for _ in 0..3 {
            let backend = support::backend_builder()
                .redis_url(&url)
                .fallback_share(1.0 / 3.0)
                .fallback_rounding(rounding)
                .build()
                .unwrap();
            let limiter = InFlightLimiter::new(&backend, "export", InFlightConfig::new(2)).unwrap();
            for _ in 0..2 {
                match limiter.acquire(b"merchant").await {
                    Ok(slot) => {
                        assert_eq!(slot.decision().source, Source::Fallback);
                        held.push(slot);
                    }
                    Err(refused) => {
                        assert_eq!(refused.source, Source::Fallback, "{refused:?}");
                        assert_eq!(refused.state, State::OverQuota, "{refused:?}");
                        assert!(refused.retry_after.is_some(), "{refused:?}");
                    }
                }
            }
        }
        assert_eq!(held.len(), running, "{rounding:?}");
    }
}

/// The commands the in-flight script runs (`MONITOR`-free: `INFO commandstats`).
fn slot_commands(redis: &RedisServer) -> u64 {
    [
        "zremrangebyscore",
        "zcard",
        "zadd",
        "zrem",
        "pttl",
        "pexpire",
    ]
    .iter()
    .map(|command| redis.command_calls(command))
    .sum()
}

/// A renewal costs Redis less than an acquire: it runs fewer commands (it counts nothing,
/// and sets the set's expiry only when less than a lease of it is left, to two leases).
#[tokio::test]
async fn a_renewal_runs_fewer_commands_than_an_acquire() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(600);
    let config = InFlightConfig::new(5).slot_ttl(lease);
    let limiter = InFlightLimiter::new(&backend(&redis.url()).await, "cost", config).unwrap();
    // Every call of the script drops the leases that ran out first: one
    // ZREMRANGEBYSCORE per call, whatever the path (FCALL or EVALSHA).
    let calls = || redis.command_calls("zremrangebyscore");
    // The script loaded (its release, sent in the background, done).
    drop(limiter.acquire(b"warm").await.unwrap());
    eventually(Duration::from_secs(5), || async {
        limiter.in_flight(b"warm").await == 0
    })
    .await;
    let (commands, made) = (slot_commands(&redis), calls());
    let slot = limiter.acquire(b"k").await.unwrap();
    let acquire = slot_commands(&redis) - commands;
    assert_eq!(calls() - made, 1);
    let (commands, made) = (slot_commands(&redis), calls());
    tokio::time::sleep(lease * 3).await;
    let (renewals, renewed) = (calls() - made, slot_commands(&redis) - commands);
    assert!(renewals >= 6, "{renewals} renewals in three leases");
    #[allow(clippy::cast_precision_loss)]
    let per_renewal = renewed as f64 / renewals as f64;
    eprintln!(
        "a renewal ran {per_renewal:.2} commands ({renewed} in {renewals}), an acquire {acquire}"
    );
    assert!(
        per_renewal < acquire as f64,
        "a renewal ran {per_renewal:.2} commands ({renewed} in {renewals}), an acquire {acquire}"
    );
    assert_eq!(limiter.in_flight(b"k").await, 1);
    drop(slot);
}
