//! Leases (`TokenBucketConfig::lease`) against a real `redis-server`: checks answered
//! in process from leased tokens cut the Redis calls, leases shrink to exact near the
//! limit, and two instances never admit more than the documented bound.

mod support;

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use support::RedisServer;
use tower_redis_ratelimit::LimitLayer;
use tower_redis_ratelimit::{Limiter, Source, State};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const HOUR: Duration = Duration::from_secs(3_600);

#[tokio::test]
async fn leased_tokens_are_answered_without_a_round_trip() {
    let redis = RedisServer::start();
    let backend = redis.uncached_backend();
    let config = TokenBucketConfig::new(1_000, Duration::from_secs(1), 1_000)
        .lease(50, Duration::from_secs(5));
    let limiter = TokenBucketLimiter::new(&backend, "lease", config).unwrap();
    limiter.check(b"warm-up", ONE).await;
    let calls = redis.command_calls("evalsha");
    let mut leased = 0;
    for _ in 0..500 {
        let decision = limiter.check(b"k", ONE).await;
        assert!(decision.is_admitted(), "{decision:?}");
        leased += usize::from(decision.source == Source::Lease);
    }
    let used = redis.command_calls("evalsha") - calls;
    assert!(used <= 12, "{used} calls for 500 checks");
    assert!(leased >= 480, "{leased} answered from leases");
}

/// Near the limit a lease shrinks to the cost: two instances taking leases of a
/// bucket of 10 that does not refill admit exactly 10 between them.
#[tokio::test]
async fn leases_are_exact_near_the_limit() {
    let redis = RedisServer::start();
    let config = TokenBucketConfig::new(1, HOUR, 10).lease(8, Duration::from_secs(30));
    let a = TokenBucketLimiter::new(&redis.uncached_backend(), "exact", config).unwrap();
    let b = TokenBucketLimiter::new(&redis.uncached_backend(), "exact", config).unwrap();
    let mut admitted = 0;
    for _ in 0..20 {
        for limiter in [&a, &b] {
            admitted += usize::from(limiter.check(b"k", ONE).await.is_admitted());
        }
    }
    assert_eq!(admitted, 10);
}

/// Two instances hammering one key with leases of 5 tokens (lifetime 200 ms) at 100
/// per second, burst 10: over the run they admit at most the limit plus one lease
/// each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_stay_within_the_bound() {
    let redis = RedisServer::start();
    let (size, lease) = (5, Duration::from_millis(200));
    let config = TokenBucketConfig::new(100, Duration::from_secs(1), 10).lease(size, lease);
    let instances = [
        TokenBucketLimiter::new(&redis.uncached_backend(), "bound", config).unwrap(),
        TokenBucketLimiter::new(&redis.uncached_backend(), "bound", config).unwrap(),
    ];
    let start = Instant::now();
    let mut tasks = Vec::new();
    for limiter in instances {
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            while start.elapsed() < Duration::from_secs(2) {
                admitted += u64::from(limiter.check(b"k", ONE).await.is_admitted());
                tokio::task::yield_now().await;
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 10 + (100.0 * elapsed).ceil() as u64 + 2 * size;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert!(admitted >= 150, "{admitted} admitted in {elapsed:.2} s");
}

/// Over the limit, a key with leases is refused from the deny cache, as without leases:
/// a flood of refused checks does not reach Redis.
#[tokio::test]
async fn refusals_use_the_deny_cache() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let config = TokenBucketConfig::new(1, HOUR, 5).lease(2, Duration::from_secs(30));
    let limiter = TokenBucketLimiter::new(&backend, "flood", config).unwrap();
    limiter.check(b"warm-up", ONE).await;
    let calls = redis.command_calls("evalsha");
    let mut admitted = 0;
    for _ in 0..200 {
        admitted += usize::from(limiter.check(b"k", ONE).await.is_admitted());
    }
    assert_eq!(admitted, 5);
    let used = redis.command_calls("evalsha") - calls;
    assert!(used <= 6, "{used} calls for 200 checks");
}

/// An expired lease's unused tokens go back to the bucket in the same call that takes
/// the next lease (one round trip, and the new lease already counts them).
#[tokio::test]
async fn an_expired_lease_is_given_back_by_the_call_that_takes_the_next() {
    let redis = RedisServer::start();
    let config = TokenBucketConfig::new(1, HOUR, 100).lease(20, Duration::from_millis(50));
    let limiter = TokenBucketLimiter::new(&redis.uncached_backend(), "expiry", config).unwrap();
    // A lease of 20: this check spends one, 19 stay leased; Redis holds 80.
    let first = limiter.check(b"k", ONE).await;
    assert_eq!(
        (first.source, first.remaining),
        (Source::Redis, 99),
        "{first:?}"
    );
    tokio::time::sleep(Duration::from_millis(80)).await;
    let calls = redis.command_calls("evalsha");
    // The 19 go back (Redis: 99), then a new lease of 20 (Redis: 79, 19 leased).
    let next = limiter.check(b"k", ONE).await;
    assert_eq!(
        (next.source, next.remaining),
        (Source::Redis, 98),
        "{next:?}"
    );
    // Anything sent in the background has landed by now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(redis.command_calls("evalsha") - calls, 1);
}

/// A lease and a lockout on one token bucket conflict: a check answered from a lease
/// never reaches Redis, and a refusal of the check that takes a lease never locked the
/// key out (the engine's lease call has no room for the lockout), so the lockout was
/// silently ignored on Redis. The combination is refused when the limiter (or layer) is
/// built, on any backend.
#[test]
fn a_lease_and_a_lockout_conflict() {
    use tower_redis_ratelimit::{Backend, ConfigError};
    let config = TokenBucketConfig::new(1, Duration::from_secs(1), 2)
        .lease(1, Duration::from_secs(30))
        .lockout(Duration::from_secs(60));
    for backend in [
        Backend::in_process(),
        support::backend_builder()
            .redis_url("redis://127.0.0.1:1")
            .build()
            .unwrap(),
    ] {
        let limiter = TokenBucketLimiter::new(&backend, "both", config);
        assert!(
            matches!(limiter, Err(ConfigError::Conflict { .. })),
            "{:?}",
            limiter.err()
        );
        let layer = LimitLayer::builder(
            &backend,
            TokenBucketConfig::new(1, Duration::from_secs(1), 2)
                .lease(1, Duration::from_secs(30))
                .lockout(Duration::from_secs(60)),
        )
        .name("both")
        .build();
        assert!(matches!(layer, Err(ConfigError::Conflict { .. })));
    }
}

/// The handles with a lease held (issue 22). A bucket of 10 that does not refill
/// (1 per hour), leases of up to 4 for 30 s: the first check takes 4 tokens (Redis
/// keeps 6; 3 stay leased), the second is answered from the lease (2 left).
fn held(name: &str, redis: &RedisServer) -> (TokenBucketLimiter, TokenBucketLimiter) {
    let config = TokenBucketConfig::new(1, HOUR, 10).lease(4, Duration::from_secs(30));
    let a = TokenBucketLimiter::new(&redis.uncached_backend(), name, config).unwrap();
    let b = TokenBucketLimiter::new(&redis.uncached_backend(), name, config).unwrap();
    (a, b)
}

/// Takes a lease on `limiter` and spends one of its tokens: 2 tokens stay leased.
async fn take_lease(limiter: &TokenBucketLimiter) {
    let first = limiter.check(b"k", ONE).await;
    assert_eq!(
        (first.source, first.remaining),
        (Source::Redis, 9),
        "{first:?}"
    );
    let second = limiter.check(b"k", ONE).await;
    assert_eq!(
        (second.source, second.remaining),
        (Source::Lease, 2),
        "{second:?}"
    );
}

/// How many of `n` checks of `limiter` are admitted.
async fn admitted(limiter: &TokenBucketLimiter, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += usize::from(limiter.check(b"k", ONE).await.is_admitted());
    }
    admitted
}

/// A block ends this process's lease of the key: refused at once and for the block's
/// duration, here and on another instance; the lease's unused tokens go back to the
/// bucket, so after the block exactly the rest of the burst is admitted.
#[tokio::test]
async fn a_block_ends_the_lease_held() {
    let redis = RedisServer::start();
    let (a, b) = held("block", &redis);
    take_lease(&a).await;
    let block = Duration::from_secs(2);
    let blocked_at = Instant::now();
    a.block(b"k", block).unwrap().await;
    // (The block ends at most `block` after its call returned.)
    let returned = Instant::now();
    for limiter in [&a, &b] {
        let refused = limiter.check(b"k", ONE).await;
        assert!(!refused.is_admitted(), "{refused:?}");
        assert!(refused.retry_after > Some(Duration::ZERO), "{refused:?}");
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(admitted(&a, 5).await, 0);
    assert_eq!(admitted(&b, 5).await, 0);
    assert!(
        blocked_at.elapsed() < block,
        "too slow to see the block running"
    );
    tokio::time::sleep((block + Duration::from_millis(500)).saturating_sub(returned.elapsed()))
        .await;
    // 2 admitted before the block, Redis holds 6 and the lease's 2 came back: 8 more.
    assert_eq!(admitted(&a, 20).await, 8);
}

/// A block while another instance holds a lease: that instance answers its lease's
/// tokens (at most the lease size, within its lifetime: the documented bound), then
/// refuses for the block's duration; the blocking instance refuses at once.
#[tokio::test]
async fn a_block_on_another_instance_bounds_its_lease() {
    let redis = RedisServer::start();
    let (a, b) = held("block-other", &redis);
    take_lease(&b).await;
    a.block(b"k", Duration::from_secs(60)).unwrap().await;
    assert_eq!(admitted(&a, 5).await, 0);
    let from_lease = admitted(&b, 5).await;
    assert!(from_lease <= 2, "{from_lease} admitted from a lease of 2");
    assert_eq!(admitted(&b, 5).await, 0);
    assert_eq!(admitted(&a, 5).await, 0);
}

/// A reset ends this process's lease of the key: the key starts afresh, and no more
/// than a full burst is admitted after it, counting what the lease would have answered.
#[tokio::test]
async fn a_reset_ends_the_lease_held() {
    let redis = RedisServer::start();
    let (a, _) = held("reset", &redis);
    take_lease(&a).await;
    let fresh = a.reset(b"k").unwrap().await;
    assert_eq!(
        (fresh.state, fresh.remaining),
        (State::Allowed, 10),
        "{fresh:?}"
    );
    assert_eq!(admitted(&a, 20).await, 10);
}

/// A refund with a lease held goes to the shared bucket on Redis and says where that
/// bucket stands; the lease is left as it is (its tokens are still answered): the key
/// admits the burst plus what was refunded, exactly.
#[tokio::test]
async fn a_refund_with_a_lease_held_goes_to_the_bucket() {
    let redis = RedisServer::start();
    let (a, _) = held("refund", &redis);
    take_lease(&a).await;
    let refunded = a.refund(b"k", ONE).unwrap().await;
    assert_eq!(
        (refunded.source, refunded.remaining),
        (Source::Redis, 7),
        "{refunded:?}"
    );
    let next = a.check(b"k", ONE).await;
    assert_eq!(
        (next.source, next.remaining),
        (Source::Lease, 1),
        "{next:?}"
    );
    // 2 admitted before the refund, 1 after: 11 in all, the burst plus the refund.
    assert_eq!(admitted(&a, 20).await, 8);
}

/// A peek says what a check would answer: from this process's lease when it covers
/// the cost (spending nothing), even when the shared bucket on Redis is empty; from
/// Redis otherwise.
#[tokio::test]
async fn a_peek_with_a_lease_held_answers_as_a_check_would() {
    let redis = RedisServer::start();
    let (a, b) = held("peek", &redis);
    take_lease(&a).await;
    // The other instance empties the shared bucket: its 6 tokens.
    assert_eq!(admitted(&b, 10).await, 6);
    for _ in 0..3 {
        let peek = a.peek(b"k", ONE).unwrap().await;
        assert_eq!(
            (peek.state, peek.remaining, peek.source),
            (State::Allowed, 1, Source::Lease),
            "{peek:?}"
        );
    }
    let two = NonZeroU32::new(2).unwrap();
    let peek = a.peek(b"k", two).unwrap().await;
    assert_eq!(
        (peek.state, peek.remaining),
        (State::HitQuota, 0),
        "{peek:?}"
    );
    let three = NonZeroU32::new(3).unwrap();
    let beyond = a.peek(b"k", three).unwrap().await;
    assert!(!beyond.is_admitted(), "{beyond:?}");
    assert!(!a.check(b"k", three).await.is_admitted());
    let check = a.check(b"k", two).await;
    assert_eq!(
        (check.state, check.source),
        (State::HitQuota, Source::Lease),
        "{check:?}"
    );
    let empty = a.peek(b"k", ONE).unwrap().await;
    assert_eq!(empty.state, State::OverQuota, "{empty:?}");
}
