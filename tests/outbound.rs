//! Outbound waits against a real `redis-server`: two instances (two backends on one
//! server, so one limit) never exceed it; the maximum wait holds; a dropped waiter
//! spends nothing and leaves no task; Redis down follows the failure policy; the
//! `outbound` example's upstream and two clients end to end.

mod support;

#[path = "../examples/outbound.rs"]
#[allow(dead_code)]
mod example;

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::RedisServer;
use tokio::time::Instant;
use tower_redis_ratelimit::outbound::{WaitError, Waiter};
use tower_redis_ratelimit::{Backend, FailurePolicy, Limiter, Source};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const SEC: Duration = Duration::from_secs(1);
/// Room for a loaded machine in upper bounds of elapsed time.
const MARGIN: Duration = Duration::from_secs(3);

/// A Redis backend on `redis` without the deny cache (every check runs the script),
/// with a call timeout long enough that a loaded machine does not hand checks to the
/// fallback.
fn backend(redis: &RedisServer) -> Backend {
    support::backend_builder()
        .redis(redis.pool())
        .deny_cache(0)
        .call_timeout(2 * SEC)
        .build()
        .unwrap()
}

/// A token bucket named `name` on `backend`: `rate` per second, `burst`.
fn bucket(backend: &Backend, name: &str, rate: u64, burst: u64) -> Waiter<TokenBucketLimiter> {
    let config = TokenBucketConfig::new(rate, SEC, burst);
    Waiter::new(TokenBucketLimiter::new(backend, name, config).unwrap())
}

/// The most admissions in any one-second window starting at an admission.
fn max_per_second(times: &[Duration]) -> usize {
    let mut times = times.to_vec();
    times.sort();
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t < times[i] + SEC)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Two instances, four waiters each, all asking as fast as they can on one key for
/// 2.5 s: the admissions never exceed the shared limit, and the waiters get nearly all
/// of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_exceed_one_shared_limit() {
    let redis = RedisServer::start();
    let (rate, burst) = (8, 1);
    let instances = [
        bucket(&backend(&redis), "shared", rate, burst),
        bucket(&backend(&redis), "shared", rate, burst),
    ];
    let start = Instant::now();
    let run = Duration::from_millis(2500);
    let times = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for waiter in &instances {
        for _ in 0..4 {
            let (waiter, times) = (waiter.clone(), Arc::clone(&times));
            tasks.push(tokio::spawn(async move {
                while start.elapsed() < run {
                    let decision = waiter.acquire(b"upstream", ONE, 5 * SEC).await.unwrap();
                    assert_eq!(decision.source, Source::Redis);
                    times.lock().unwrap().push(start.elapsed());
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let times = times.lock().unwrap().clone();
    let admitted = times.len() as u64;
    let elapsed = start.elapsed();
    let per_second = max_per_second(&times);
    // The times are when the tasks woke, not when Redis decided: a wake-up late by a
    // slot (125 ms) on a busy machine moves an admission into the next second's count,
    // hence 2 of slack. Two instances that did not share the limit would reach 2 * 8.
    assert!(
        per_second as u64 <= rate + burst + 2,
        "{per_second} admissions within one second: {times:?}"
    );
    // Never more than the bucket allows over the whole run; and the limit is used.
    assert!(admitted <= burst + rate * elapsed.as_millis() as u64 / 1000 + 1);
    assert!(admitted >= rate * 2, "{admitted} admitted in {elapsed:?}");
    let calls = redis.command_calls("evalsha");
    println!(
        "{admitted} admitted, {calls} evalsha: {:.2} per admission",
        calls as f64 / admitted as f64
    );
    // A token bucket reserves: one call per admission, whatever the instances.
    assert!(
        calls as f64 <= admitted as f64 * 1.1 + 2.0,
        "{calls} calls for {admitted} admissions"
    );
    for waiter in &instances {
        assert_eq!(waiter.queued_keys(), 0);
    }
}

/// The maximum wait holds: at once when the next admission is beyond it, also for a
/// waiter whose slot comes after another's reservation.
#[tokio::test]
async fn the_maximum_wait_holds() {
    let redis = RedisServer::start();
    let backend = backend(&redis);
    // One token every two seconds.
    let waiter = Waiter::new(
        TokenBucketLimiter::new(&backend, "slow", TokenBucketConfig::new(1, 2 * SEC, 1)).unwrap(),
    );
    waiter.acquire(b"k", ONE, Duration::ZERO).await.unwrap();
    let max_wait = Duration::from_millis(500);
    let start = Instant::now();
    let error = waiter.acquire(b"k", ONE, max_wait).await.unwrap_err();
    assert!(start.elapsed() < max_wait + MARGIN);
    let WaitError::TimedOut { decision, .. } = &error else {
        panic!("{error:?}");
    };
    let retry = decision.as_ref().unwrap().retry_after.unwrap();
    assert!(retry > max_wait, "{retry:?}");

    // A head reserves the next token (within 3 s); the slot after it lies 4 s away, so
    // the one behind it gives up at once instead of waiting 500 ms in vain.
    let head = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(b"k", ONE, 3 * SEC).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    let error = waiter.acquire(b"k", ONE, max_wait).await.unwrap_err();
    assert!(start.elapsed() < MARGIN, "{:?}", start.elapsed());
    let WaitError::TimedOut { decision, .. } = &error else {
        panic!("{error:?}");
    };
    let retry = decision.as_ref().unwrap().retry_after.unwrap();
    assert!(retry > 3 * SEC, "{retry:?}");
    assert!(head.await.unwrap().unwrap().is_admitted());
    assert_eq!(waiter.queued_keys(), 0);
}

/// A waiter dropped while it waits for its reserved slot gives the slot back (one
/// refund), makes no further call, spends nothing of the limit and leaves no task or
/// queue behind.
#[tokio::test]
async fn a_dropped_waiter_spends_nothing_and_leaves_no_task() {
    let redis = RedisServer::start();
    let backend = backend(&redis);
    // Two tokens, one back per second.
    let waiter = bucket(&backend, "drop", 1, 2);
    let two = NonZeroU32::new(2).unwrap();
    waiter.acquire(b"k", two, Duration::ZERO).await.unwrap();
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let calls = redis.command_calls("evalsha");
    let waiting = waiter.acquire(b"k", ONE, 30 * SEC);
    assert!(tokio::time::timeout(Duration::from_millis(300), waiting)
        .await
        .is_err());
    assert_eq!(waiter.queued_keys(), 0);
    // Past the reserved time, and until the bucket is full.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(
        redis.command_calls("evalsha"),
        calls + 2,
        "one reservation, one refund, and nobody checks again"
    );
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        tasks
    );
    let full = waiter.limiter().check(b"k", two).await;
    assert!(
        full.is_admitted(),
        "the dropped waiter took nothing: {full:?}"
    );
}

/// Waiters on one key in one process are admitted in order, through Redis too. (Two
/// tokens a second: their turns are 500 ms apart or more, wider than a busy machine's
/// delays.)
#[tokio::test]
async fn first_in_first_out_on_redis() {
    let redis = RedisServer::start();
    let waiter = bucket(&backend(&redis), "fifo", 2, 3);
    let three = NonZeroU32::new(3).unwrap();
    waiter.acquire(b"k", three, Duration::ZERO).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, cost) in [3, 1, 1, 2].into_iter().enumerate() {
        let (waiter, order) = (waiter.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let cost = NonZeroU32::new(cost).unwrap();
            waiter.acquire(b"k", cost, 10 * SEC).await.unwrap();
            order.lock().unwrap().push(i);
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
}

/// A backend on `redis` with `policy` and short timeouts.
fn with_policy(redis: &RedisServer, policy: FailurePolicy) -> Backend {
    support::backend_builder()
        .redis(redis.pool())
        .deny_cache(0)
        .call_timeout(Duration::from_millis(200))
        .failure_policy(policy)
        .build()
        .unwrap()
}

/// With Redis gone, the failure policy decides: fail closed refuses at once (no wait
/// until the deadline), fail open admits, the fallback waits on the in-process state.
#[tokio::test]
async fn redis_down_follows_the_failure_policy() {
    let mut redis = RedisServer::start();
    let closed = bucket(
        &with_policy(&redis, FailurePolicy::FailClosed),
        "closed",
        1,
        1,
    );
    let open = bucket(&with_policy(&redis, FailurePolicy::FailOpen), "open", 1, 1);
    let fallback = bucket(
        &with_policy(&redis, FailurePolicy::Fallback),
        "fallback",
        2,
        1,
    );
    for waiter in [&closed, &open] {
        let decision = waiter.acquire(b"warm", ONE, SEC).await.unwrap();
        assert_eq!(decision.source, Source::Redis);
    }
    redis.kill();

    let max_wait = 10 * SEC;
    let start = Instant::now();
    let error = closed.acquire(b"k", ONE, max_wait).await.unwrap_err();
    assert!(matches!(error, WaitError::Unavailable { .. }), "{error:?}");
    assert_eq!(error.decision().unwrap().source, Source::FailClosed);
    assert!(start.elapsed() < max_wait / 2, "refused without waiting");

    for _ in 0..3 {
        let decision = open.acquire(b"k", ONE, Duration::ZERO).await.unwrap();
        assert_eq!(decision.source, Source::FailOpen);
    }

    // Two per second in-process: the second waits about half a second after the first.
    let start = Instant::now();
    let first = fallback.acquire(b"k", ONE, max_wait).await.unwrap();
    assert_eq!(first.source, Source::Fallback);
    let second = fallback.acquire(b"k", ONE, max_wait).await.unwrap();
    assert_eq!(second.source, Source::Fallback);
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
}

/// The example end to end: its upstream on a free port, two of its clients (two
/// backends on one Redis) sending at once; the upstream never sees more than the rate
/// plus the burst in any of its seconds, and every request gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_upstream_and_two_clients() {
    let redis = RedisServer::start();
    let arrivals = Arc::new(example::Arrivals::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = example::upstream(Arc::clone(&arrivals));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let settings = example::ClientSettings {
        upstream_url: format!("http://{addr}/charge"),
        requests: 12,
        rate: 10,
        burst: 1,
        max_wait: 30 * SEC,
    };
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let backend = backend(&redis);
            let settings = settings.clone();
            tokio::spawn(async move { example::client(&backend, &settings).await.unwrap() })
        })
        .collect();
    for client in clients {
        let summary = client.await.unwrap();
        assert_eq!(summary.succeeded, 12, "{summary:?}");
    }
    let per_second = arrivals.per_second();
    assert_eq!(per_second.iter().sum::<u64>(), 24, "{per_second:?}");
    // Counted when the requests arrive, after the clients woke and sent them: a request
    // late by a slot (100 ms) on a busy machine counts in the next second, hence 2 of
    // slack. Clients that did not share the limit would send 2 * 10.
    assert!(
        per_second
            .iter()
            .all(|n| *n <= settings.rate + settings.burst + 2),
        "{per_second:?}"
    );
    let json = arrivals.json();
    assert!(json.starts_with("{\"per_second\": ["), "{json}");
    assert!(json.contains("\"total\": 24"), "{json}");
}

#[test]
fn waiter_is_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Waiter<TokenBucketLimiter>>();
    check::<Waiter<Arc<dyn Limiter>>>();
}

/// The layer on a tonic channel: a generated gRPC client works through it, each call
/// waiting its turn (the key is the gRPC method's path).
#[tokio::test]
async fn a_tonic_channel_waits_its_turn() {
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::Endpoint;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tower_redis_ratelimit::outbound::OutboundLayer;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    // Ten calls per second, one at a time.
    let waiter = bucket(&Backend::in_process(), "grpc", 10, 1);
    let layer = OutboundLayer::new(waiter.clone(), 5 * SEC)
        .key(|req: &http::request::Parts| Some(req.uri.path().to_owned()));
    let mut client = HealthClient::new(tower::ServiceBuilder::new().layer(layer).service(channel));
    let start = Instant::now();
    for _ in 0..3 {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        client.check(request).await.unwrap();
    }
    assert!(
        start.elapsed() >= Duration::from_millis(190),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(waiter.queued_keys(), 0);
}
