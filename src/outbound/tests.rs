//! In-process tests on tokio's paused clock: the wait, its bounds, the queue order,
//! cancellation, and the layer.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::{service_fn, ServiceBuilder, ServiceExt};

use super::*;
use crate::decision::{Decision, Policy, Source, State};
use crate::limiter::{DecisionFuture, Limiter};
use crate::token_bucket::{TokenBucketConfig, TokenBucketLimiter};
use crate::Backend;

const ONE: NonZeroU32 = NonZeroU32::MIN;
const MS: Duration = Duration::from_millis(1);

fn cost(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// A token bucket of `burst`, refilled one token per `every`, in-process.
fn bucket(every: Duration, burst: u64) -> TokenBucketLimiter {
    TokenBucketLimiter::new(
        &Backend::in_process(),
        "out",
        TokenBucketConfig::new(1, every, burst),
    )
    .unwrap()
}

/// Counts the checks that reach the limiter it wraps.
#[derive(Debug)]
struct Counted<L> {
    inner: L,
    checks: AtomicU32,
}

impl<L: Limiter> Limiter for Counted<L> {
    fn policy(&self) -> &Policy {
        self.inner.policy()
    }

    fn check(&self, key: &[u8], cost: NonZeroU32) -> DecisionFuture {
        self.checks.fetch_add(1, Ordering::Relaxed);
        self.inner.check(key, cost)
    }
}

fn counted(limiter: TokenBucketLimiter) -> Arc<Counted<TokenBucketLimiter>> {
    Arc::new(Counted {
        inner: limiter,
        checks: AtomicU32::new(0),
    })
}

#[tokio::test(start_paused = true)]
async fn waits_for_the_retry_after_then_admits() {
    let waiter = Waiter::new(bucket(Duration::from_secs(1), 1));
    let start = Instant::now();
    let first = waiter.acquire(b"k", ONE, Duration::from_secs(5)).await;
    assert_eq!(first.unwrap().state, State::HitQuota);
    assert_eq!(start.elapsed(), Duration::ZERO);
    let second = waiter.acquire(b"k", ONE, Duration::from_secs(5)).await;
    assert!(second.unwrap().is_admitted());
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(1) && waited <= Duration::from_secs(1) + 2 * MS);
    // Another key has its own limit.
    let other = waiter.acquire(b"other", ONE, Duration::ZERO).await;
    assert!(other.unwrap().is_admitted());
    assert_eq!(waiter.queued_keys(), 0);
}

#[tokio::test(start_paused = true)]
async fn fails_at_once_when_the_next_admission_is_beyond_the_max_wait() {
    let waiter = Waiter::new(bucket(Duration::from_secs(10), 1));
    waiter.acquire(b"k", ONE, Duration::ZERO).await.unwrap();
    let start = Instant::now();
    let error = waiter
        .acquire(b"k", ONE, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO, "no sleeping in vain");
    let WaitError::TimedOut { max_wait, decision } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*max_wait, Duration::from_secs(2));
    let retry = decision.as_ref().unwrap().retry_after.unwrap();
    assert!(retry > Duration::from_secs(9), "{retry:?}");
    assert_eq!(error.decision().unwrap().state, State::OverQuota);
}

#[tokio::test(start_paused = true)]
async fn a_cost_above_the_burst_never_waits() {
    let waiter = Waiter::new(bucket(Duration::from_secs(1), 3));
    let error = waiter
        .acquire(b"k", cost(4), Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(
        matches!(error, WaitError::ExceedsCapacity { .. }),
        "{error:?}"
    );
    assert_eq!(waiter.queued_keys(), 0);
}

/// Waiters on one key are admitted in the order they came, a costly one included: the
/// cheap ones behind it do not overtake it.
#[tokio::test(start_paused = true)]
async fn waiters_on_one_key_go_first_in_first_out() {
    let waiter = Waiter::new(bucket(Duration::from_millis(100), 3));
    waiter.acquire(b"k", cost(3), Duration::ZERO).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, n) in [3, 1, 1, 2, 1].into_iter().enumerate() {
        let (waiter, order) = (waiter.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let decision = waiter.acquire(b"k", cost(n), Duration::from_secs(10)).await;
            assert!(decision.unwrap().is_admitted());
            order.lock().unwrap().push(i);
        }));
        // Let it take its place in the queue before the next one comes.
        tokio::task::yield_now().await;
    }
    assert_eq!(waiter.queued_keys(), 1);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
    assert_eq!(waiter.queued_keys(), 0);
}

/// The waiter behind a head that reserved the next token: its own slot lies beyond its
/// maximum wait, so it gives up at once, with the refusal that says so.
#[tokio::test(start_paused = true)]
async fn the_deadline_holds_in_the_queue() {
    let waiter = Waiter::new(bucket(Duration::from_secs(1), 1));
    waiter.acquire(b"k", ONE, Duration::ZERO).await.unwrap();
    let head = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire(b"k", ONE, Duration::from_secs(5)).await }
    });
    tokio::task::yield_now().await;
    let start = Instant::now();
    let error = waiter
        .acquire(b"k", ONE, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(
        matches!(
            error,
            WaitError::TimedOut {
                decision: Some(_),
                ..
            }
        ),
        "{error:?}"
    );
    assert!(head.await.unwrap().is_ok());
}

/// A thousand waiters on one key: the limiter is asked about once per admission.
#[tokio::test(start_paused = true)]
async fn one_check_per_admission_in_one_process() {
    let limiter = counted(bucket(Duration::from_millis(10), 1));
    let waiter = Waiter::new(Arc::clone(&limiter));
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                waiter
                    .acquire(b"k", ONE, Duration::from_secs(60))
                    .await
                    .is_ok()
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += u32::from(task.await.unwrap());
    }
    assert_eq!(admitted, 1000);
    let checks = limiter.checks.load(Ordering::Relaxed);
    assert!(checks <= admitted + admitted / 20, "{checks} checks");
}

/// Dropping a waiting future counts nothing against the limit, removes its queue, and
/// leaves no task behind.
#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_spends_nothing() {
    let limiter = counted(bucket(Duration::from_secs(1), 2));
    let waiter = Waiter::new(Arc::clone(&limiter));
    waiter.acquire(b"k", cost(2), Duration::ZERO).await.unwrap();
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let waiting = waiter.acquire(b"k", ONE, Duration::from_secs(30));
    assert!(tokio::time::timeout(Duration::from_millis(300), waiting)
        .await
        .is_err());
    assert_eq!(waiter.queued_keys(), 0);
    let checks = limiter.checks.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        limiter.checks.load(Ordering::Relaxed),
        checks,
        "nobody checks"
    );
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        tasks
    );
    // The bucket refilled fully: the dropped waiter took nothing.
    let full = waiter.acquire(b"k", cost(2), Duration::ZERO).await;
    assert!(full.unwrap().is_admitted());
}

/// A limiter that refuses with no time to retry, or fails closed.
#[derive(Debug)]
struct Refusing(Policy, Source);

impl Limiter for Refusing {
    fn policy(&self) -> &Policy {
        &self.0
    }

    fn check(&self, _key: &[u8], _cost: NonZeroU32) -> DecisionFuture {
        let decision = Decision::new(State::OverQuota, 1, 0, Duration::ZERO, self.1);
        DecisionFuture::ready(if self.1 == Source::FailClosed {
            decision.with_retry_after(Duration::from_millis(500))
        } else {
            decision
        })
    }
}

#[tokio::test(start_paused = true)]
async fn fail_closed_and_unknown_retry_do_not_wait() {
    let policy = Policy::new("r", 1, Duration::from_secs(1));
    let closed = Waiter::new(Refusing(policy.clone(), Source::FailClosed));
    let error = closed.acquire(b"k", ONE, Duration::from_secs(9)).await;
    assert!(
        matches!(error, Err(WaitError::Unavailable { .. })),
        "{error:?}"
    );
    let never = Waiter::new(Refusing(policy, Source::InProcess));
    let error = never.acquire(b"k", ONE, Duration::from_secs(9)).await;
    assert!(matches!(error, Err(WaitError::Refused { .. })), "{error:?}");
}

/// A request to send: its key in `x-key` (none when empty), its cost in `x-cost`.
fn outgoing(key: &str, cost: u32) -> http::Request<()> {
    let mut req = http::Request::builder().header("x-cost", cost);
    if !key.is_empty() {
        req = req.header("x-key", key);
    }
    req.body(()).unwrap()
}

/// The `x-cost` of a request that was sent.
fn sent_cost(req: &http::Request<()>) -> u32 {
    req.headers()["x-cost"].to_str().unwrap().parse().unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_layer_waits_then_calls_with_key_and_cost_from_the_request() {
    let calls = Arc::new(AtomicU32::new(0));
    let inner = {
        let calls = Arc::clone(&calls);
        service_fn(move |req: http::Request<()>| {
            calls.fetch_add(1, Ordering::Relaxed);
            let cost = sent_cost(&req);
            async move { Ok::<_, std::io::Error>(cost) }
        })
    };
    let layer = OutboundLayer::new(
        Waiter::new(bucket(Duration::from_millis(100), 5)),
        Duration::from_millis(300),
    )
    .key(|parts: &http::request::Parts| parts.headers.get("x-key").map(|v| v.as_bytes().to_vec()))
    .cost(crate::HeaderCost::new(
        http::HeaderName::from_static("x-cost"),
        1,
    ));
    let client = ServiceBuilder::new().layer(layer).service(inner);
    let start = Instant::now();
    assert_eq!(client.clone().oneshot(outgoing("a", 5)).await.unwrap(), 5);
    // "b" has its own bucket; a free call never waits.
    assert_eq!(client.clone().oneshot(outgoing("b", 5)).await.unwrap(), 5);
    assert_eq!(client.clone().oneshot(outgoing("a", 0)).await.unwrap(), 0);
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Two tokens are back after 200 ms.
    assert_eq!(client.clone().oneshot(outgoing("a", 2)).await.unwrap(), 2);
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    // Beyond the maximum wait, and above the burst: not sent, and matchable.
    let error = client.clone().oneshot(outgoing("a", 5)).await.unwrap_err();
    assert!(
        matches!(error, OutboundError::Wait(WaitError::TimedOut { .. })),
        "{error:?}"
    );
    let error = client.clone().oneshot(outgoing("a", 6)).await.unwrap_err();
    assert!(matches!(
        error.wait_error(),
        Some(WaitError::ExceedsCapacity { .. })
    ));
    assert_eq!(
        calls.load(Ordering::Relaxed),
        4,
        "refused calls are not sent"
    );
}

/// A request its extractor finds no key in waits on `GlobalKey`'s key: the limit of a
/// layer keyed by `GlobalKey` (the default), never refused for want of a key.
#[tokio::test(start_paused = true)]
async fn a_request_without_a_key_waits_on_the_global_key() {
    let waiter = Waiter::new(bucket(Duration::from_millis(100), 5));
    let echo = || {
        service_fn(|req: http::Request<()>| async move { Ok::<_, std::io::Error>(sent_cost(&req)) })
    };
    let cost = || crate::HeaderCost::new(http::HeaderName::from_static("x-cost"), 1);
    let by_key = ServiceBuilder::new()
        .layer(
            OutboundLayer::new(waiter.clone(), Duration::from_secs(1))
                .key(crate::key::HeaderKey::from_static("x-key"))
                .cost(cost()),
        )
        .service(echo());
    let global = ServiceBuilder::new()
        .layer(OutboundLayer::new(waiter.clone(), Duration::from_secs(1)).cost(cost()))
        .service(echo());
    let start = Instant::now();
    // No `x-key`: the whole burst of the key `global`, at once.
    assert_eq!(by_key.clone().oneshot(outgoing("", 5)).await.unwrap(), 5);
    // A client's own key is another bucket: no wait.
    assert_eq!(by_key.clone().oneshot(outgoing("a", 5)).await.unwrap(), 5);
    assert_eq!(start.elapsed(), Duration::ZERO);
    // The `GlobalKey` layer shares the emptied bucket: it waits for a token.
    assert_eq!(global.clone().oneshot(outgoing("", 1)).await.unwrap(), 1);
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    let standing = waiter
        .limiter()
        .peek(crate::key::GlobalKey::KEY.as_bytes(), ONE)
        .expect("a token bucket peeks")
        .await;
    assert!(!standing.is_admitted(), "{standing:?}");
}

#[tokio::test(start_paused = true)]
async fn inner_errors_are_kept_apart_from_wait_errors() {
    let layer = OutboundLayer::new(
        Waiter::new(bucket(Duration::from_secs(1), 1)),
        Duration::ZERO,
    )
    .key(crate::key::GlobalKey)
    .cost(1);
    let client =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|_: http::Request<()>| async {
                Err::<(), _>(std::io::Error::other("upstream down"))
            }));
    let error = client
        .clone()
        .oneshot(http::Request::new(()))
        .await
        .unwrap_err();
    assert!(error.wait_error().is_none());
    let source = std::error::Error::source(&error).unwrap();
    assert_eq!(source.to_string(), "upstream down");
    assert_eq!(error.into_inner().unwrap().to_string(), "upstream down");
    let error = client.oneshot(http::Request::new(())).await.unwrap_err();
    assert!(matches!(error, OutboundError::Wait(_)), "{error:?}");
    assert!(error.to_string().contains("not sent"), "{error}");
}
