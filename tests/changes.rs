//! Changes at once, everywhere (issue 35, item 2): a reset, a block, an unblock or a
//! raised limit made on one instance reaches another instance's deny cache and leases
//! as soon as the change's message arrives, not after the deny cache's max age.
//!
//! Two backends ("instances") share one real `redis-server`; the deny cache's max age
//! is 30 s, so that without propagation every test below fails. Each polls instance A
//! in a bounded loop (well under the max age) until the change shows: no timed
//! assertion on latency (`benches/propagation.rs` measures it).

mod support;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::RedisServer;
use tower_redis_ratelimit::key::TaggedKey;
use tower_redis_ratelimit::limit::Algorithm;
use tower_redis_ratelimit::DynamicLimits;
use tower_redis_ratelimit::{Backend, Decision, Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const HOUR: Duration = Duration::from_secs(3_600);
/// The deny cache's max age of both instances: without propagation, a refusal cached
/// by A stays for this long.
const MAX_AGE: Duration = Duration::from_secs(30);
/// How long a test waits for a change to show on A: far under [`MAX_AGE`].
const PATIENCE: Duration = Duration::from_secs(5);
/// The pause between two polls of A.
const POLL: Duration = Duration::from_millis(20);

/// An instance on `url` whose deny cache answers a refusal for up to [`MAX_AGE`].
fn instance(url: &str, max_age: Duration) -> Backend {
    support::backend_builder()
        .redis_url(url)
        .deny_cache_max_age(max_age)
        .build()
        .unwrap()
}

/// Waits (at most 2 s) until `n` connections are subscribed to the backends' change
/// channel: a subscription is made in the background after an instance's first
/// connection. (Not asserted: without propagation there is none, and the test fails on
/// what A answers.)
async fn wait_subscribers(redis: &RedisServer, n: i64) -> i64 {
    support::channel_subscribers(redis, "ratelimit:changes", n).await
}

/// Checks `key` on `limiter` until `done` says yes or [`PATIENCE`] is over: the
/// decision that said yes, or the last one with the error.
async fn poll_until(
    limiter: &impl Limiter,
    key: &[u8],
    done: impl Fn(&Decision) -> bool,
) -> Result<Decision, Decision> {
    let start = Instant::now();
    loop {
        let decision = limiter.check(key, ONE).await;
        if done(&decision) {
            return Ok(decision);
        }
        if start.elapsed() > PATIENCE {
            return Err(decision);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Fills A's deny cache with a refusal of `key`: the next check is answered by it.
async fn refused_from_cache(a: &impl Limiter, key: &[u8]) {
    let decision = a.check(key, ONE).await;
    assert!(!decision.is_admitted(), "{decision:?}");
    let decision = a.check(key, ONE).await;
    assert!(!decision.is_admitted(), "{decision:?}");
    assert_eq!(decision.source, Source::DenyCache, "{decision:?}");
}

#[tokio::test]
async fn a_reset_on_one_instance_reaches_the_others_deny_cache() {
    let redis = RedisServer::start();
    let config = PeriodConfig::new(2, HOUR);
    let a = PeriodLimiter::new(&instance(&redis.url(), MAX_AGE), "api", config).unwrap();
    let b = PeriodLimiter::new(&instance(&redis.url(), MAX_AGE), "api", config).unwrap();
    for _ in 0..2 {
        assert!(a.check(b"k", ONE).await.is_admitted());
    }
    refused_from_cache(&a, b"k").await;
    wait_subscribers(&redis, 1).await;
    let reset = b.reset(b"k").unwrap().await;
    assert!(reset.is_admitted(), "{reset:?}");
    let admitted = poll_until(&a, b"k", Decision::is_admitted).await;
    let admitted = admitted
        .unwrap_or_else(|last| panic!("A still refuses {PATIENCE:?} after B's reset: {last:?}"));
    assert_eq!(admitted.source, Source::Redis, "{admitted:?}");
}

#[tokio::test]
async fn an_unblock_on_one_instance_reaches_the_others_deny_cache() {
    let redis = RedisServer::start();
    let config = PeriodConfig::new(100, HOUR);
    let a = PeriodLimiter::new(&instance(&redis.url(), MAX_AGE), "api", config).unwrap();
    let b = PeriodLimiter::new(&instance(&redis.url(), MAX_AGE), "api", config).unwrap();
    assert!(a.check(b"k", ONE).await.is_admitted());
    wait_subscribers(&redis, 1).await;
    let blocked = b.block(b"k", HOUR).unwrap().await;
    assert!(!blocked.is_admitted(), "{blocked:?}");
    // A learns the block from Redis (or from the message, then Redis), then answers it
    // from its deny cache.
    let refused = poll_until(&a, b"k", |d| d.source == Source::DenyCache).await;
    refused.unwrap_or_else(|last| panic!("A never cached the block: {last:?}"));
    // Lifting the block is a reset (there is no separate unblock).
    assert!(b.reset(b"k").unwrap().await.is_admitted());
    let admitted = poll_until(&a, b"k", Decision::is_admitted).await;
    admitted.unwrap_or_else(|last| {
        panic!("A still refuses {PATIENCE:?} after B lifted the block: {last:?}")
    });
}

#[tokio::test]
async fn a_shorter_block_replaces_a_longer_one_cached_on_another_instance() {
    let redis = RedisServer::start();
    let config = PeriodConfig::new(100, HOUR);
    let a = PeriodLimiter::new(&instance(&redis.url(), MAX_AGE), "api", config).unwrap();
    let b = PeriodLimiter::new(&instance(&redis.url(), MAX_AGE), "api", config).unwrap();
    assert!(a.check(b"k", ONE).await.is_admitted());
    wait_subscribers(&redis, 1).await;
    assert!(!b.block(b"k", HOUR).unwrap().await.is_admitted());
    let refused = poll_until(&a, b"k", |d| d.source == Source::DenyCache).await;
    let refused = refused.unwrap_or_else(|last| panic!("A never cached the block: {last:?}"));
    assert!(refused.retry_after > Some(MAX_AGE), "{refused:?}");
    // A shorter block replaces it on Redis; A's answers follow.
    let short = Duration::from_millis(500);
    assert!(!b.block(b"k", short).unwrap().await.is_admitted());
    let shorter = poll_until(&a, b"k", |d| d.retry_after <= Some(short)).await;
    shorter.unwrap_or_else(|last| {
        panic!("A still answers the longer block {PATIENCE:?} after B's shorter one: {last:?}")
    });
    let admitted = poll_until(&a, b"k", Decision::is_admitted).await;
    admitted.unwrap_or_else(|last| panic!("A still refuses after the short block: {last:?}"));
}

/// A raised limit (from `DynamicLimits`' source) reaches A's deny cache when A applies
/// it: a refusal cached under the old limit is not answered under the new one.
#[tokio::test]
async fn a_raised_dynamic_limit_is_not_refused_from_the_deny_cache() {
    let redis = RedisServer::start();
    let limit = Arc::new(AtomicU64::new(2));
    let dynamic = |backend: &Backend| {
        let limit = Arc::clone(&limit);
        let source = move |_: TaggedKey<'_>| {
            let limit = limit.load(Ordering::SeqCst);
            async move { Ok::<_, std::io::Error>(Some(limit)) }
        };
        DynamicLimits::new(PeriodConfig::new(1, HOUR), source)
            .ttl(Duration::from_millis(100))
            .build(backend, "api")
            .unwrap()
    };
    let a = dynamic(&instance(&redis.url(), MAX_AGE));
    let b = dynamic(&instance(&redis.url(), MAX_AGE));
    // The first check of a key waits for its lookup: limit 2.
    for _ in 0..2 {
        assert!(a.check(b"k", ONE).await.is_admitted());
    }
    refused_from_cache(&a, b"k").await;
    limit.store(10, Ordering::SeqCst);
    let admitted = poll_until(&a, b"k", Decision::is_admitted).await;
    let admitted = admitted.unwrap_or_else(|last| {
        panic!("A still refuses {PATIENCE:?} after the limit was raised: {last:?}")
    });
    assert_eq!(admitted.limit, 10, "{admitted:?}");
    let on_b = b.check(b"k", ONE).await;
    assert!(on_b.is_admitted() && on_b.limit == 10, "{on_b:?}");
}

/// A's lease of a key ends when B blocks the key: A stops answering from it as soon as
/// the message arrives (without propagation it admits until the lease is used up or
/// expires).
#[tokio::test]
async fn a_block_on_one_instance_ends_the_others_lease() {
    let redis = RedisServer::start();
    let config = TokenBucketConfig::new(1, HOUR, 10_000).lease(1_000, Duration::from_secs(60));
    let a = TokenBucketLimiter::new(&instance(&redis.url(), MAX_AGE), "api", config).unwrap();
    let b = TokenBucketLimiter::new(&instance(&redis.url(), MAX_AGE), "api", config).unwrap();
    assert!(a.check(b"k", ONE).await.is_admitted());
    let leased = a.check(b"k", ONE).await;
    assert_eq!(leased.source, Source::Lease, "{leased:?}");
    wait_subscribers(&redis, 1).await;
    assert!(!b.block(b"k", HOUR).unwrap().await.is_admitted());
    // At most PATIENCE / POLL (about 250) checks: far fewer than the lease's 1 000.
    let refused = poll_until(&a, b"k", |d| !d.is_admitted()).await;
    let refused = refused.unwrap_or_else(|last| {
        panic!("A still answers from its lease {PATIENCE:?} after B's block: {last:?}")
    });
    assert_ne!(refused.source, Source::Lease, "{refused:?}");
    // Lifted: A takes a new lease from Redis.
    assert!(b.reset(b"k").unwrap().await.is_admitted());
    let admitted = poll_until(&a, b"k", Decision::is_admitted).await;
    admitted.unwrap_or_else(|last| panic!("A still refuses after the reset: {last:?}"));
}

/// While A's subscription is down (its connection killed, and the fault proxy refusing
/// a new one; A's checks go on over the connection it has), a reset on B reaches A
/// within the deny cache's max age, as before.
#[tokio::test]
async fn without_the_subscription_the_max_age_bounds_a_change() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let max_age = Duration::from_secs(2);
    let config = PeriodConfig::new(2, HOUR);
    let a = PeriodLimiter::new(&instance(&proxy.url(), max_age), "api", config).unwrap();
    for _ in 0..2 {
        assert!(a.check(b"k", ONE).await.is_admitted());
    }
    assert_eq!(wait_subscribers(&redis, 1).await, 1, "A subscribed");
    // Cut A's subscription: no new connection through the proxy, the subscribed one
    // killed (A's check connection stays).
    proxy.refuse(true);
    let list = redis.cmd(&["CLIENT", "LIST"]);
    for line in list.lines().filter(|line| line.contains(" sub=1 ")) {
        let id = line
            .split_whitespace()
            .next()
            .unwrap()
            .trim_start_matches("id=");
        redis.cmd(&["CLIENT", "KILL", "ID", id]);
    }
    assert_eq!(
        wait_subscribers(&redis, 0).await,
        0,
        "the subscription is cut"
    );
    let cached_at = Instant::now();
    let refused = a.check(b"k", ONE).await;
    assert!(!refused.is_admitted() && refused.source == Source::Redis);
    let b = PeriodLimiter::new(&instance(&redis.url(), max_age), "api", config).unwrap();
    assert!(b.reset(b"k").unwrap().await.is_admitted());
    // No message reaches A: its deny cache answers...
    let still = a.check(b"k", ONE).await;
    assert!(
        cached_at.elapsed() >= max_age || still.source == Source::DenyCache,
        "{still:?}"
    );
    // ...until its max age, and not longer.
    let admitted = poll_until(&a, b"k", Decision::is_admitted).await;
    let admitted = admitted.unwrap_or_else(|last| panic!("A still refuses: {last:?}"));
    let took = cached_at.elapsed();
    // (With 2 s of room for a busy machine: far below the refusal's own hour.)
    assert!(
        took <= max_age + Duration::from_secs(2),
        "admitted {took:?} after the refusal was cached (max age {max_age:?}): {admitted:?}"
    );
    assert_eq!(
        admitted.source,
        Source::Redis,
        "A's checks went on: {admitted:?}"
    );
}

#[cfg(feature = "cluster")]
#[tokio::test]
async fn a_reset_reaches_the_other_instance_on_a_cluster() {
    let cluster = support::RedisCluster::start(3);
    let instance = || {
        support::backend_builder()
            .redis_cluster_urls(cluster.urls())
            .deny_cache_max_age(MAX_AGE)
            .build()
            .unwrap()
    };
    let config = PeriodConfig::new(2, HOUR);
    let a = PeriodLimiter::new(&instance(), "api", config).unwrap();
    let b = PeriodLimiter::new(&instance(), "api", config).unwrap();
    for key in [b"k1".as_slice(), b"k2", b"k3"] {
        for _ in 0..2 {
            assert!(a.check(key, ONE).await.is_admitted());
        }
        refused_from_cache(&a, key).await;
    }
    // A subscribes on one node: PUBLISH on any node reaches it over the cluster bus.
    let start = Instant::now();
    let numsub = |i: usize| {
        let reply = cluster.cmd(i, &["PUBSUB", "NUMSUB", "ratelimit:changes"]);
        let n: i64 = reply
            .split_whitespace()
            .last()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        n
    };
    while (0..3).map(numsub).sum::<i64>() < 1 && start.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Keys over several slots (and so nodes): each reset reaches A.
    for key in [b"k1".as_slice(), b"k2", b"k3"] {
        assert!(b.reset(key).unwrap().await.is_admitted());
        let admitted = poll_until(&a, key, Decision::is_admitted).await;
        admitted.unwrap_or_else(|last| {
            panic!("A still refuses {PATIENCE:?} after B's reset on the cluster: {last:?}")
        });
    }
}
