//! Lockouts and blocks against a real `redis-server`: kept in Redis, so a key locked out
//! through one instance is refused by every other one, and lifted for all by a reset.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use support::RedisServer;
use tower_redis_ratelimit::key::GlobalKey;
use tower_redis_ratelimit::TokenBucketConfig;
use tower_redis_ratelimit::{LimitLayer, RollingConfig};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{Limiter, Source, State};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_lockout_is_shared_by_every_instance() {
    let redis = RedisServer::start();
    // Two instances: two backends on one Redis, the same limiter name.
    let config = PeriodConfig::new(2, MINUTE).lockout(15 * MINUTE);
    let a = PeriodLimiter::new(&redis.uncached_backend(), "login", config).unwrap();
    let b = PeriodLimiter::new(&redis.uncached_backend(), "login", config).unwrap();
    assert!(a.check(b"alice", ONE).await.is_admitted());
    assert!(b.check(b"alice", ONE).await.is_admitted());
    let refused = a.check(b"alice", ONE).await;
    assert_eq!(refused.state, State::OverQuota);
    let retry = refused.retry_after.unwrap();
    assert!(retry > 14 * MINUTE && retry <= 15 * MINUTE, "{retry:?}");
    // The other instance sees the lock, from Redis.
    let other = b.check(b"alice", ONE).await;
    assert_eq!(other.source, Source::Redis);
    assert!(other.retry_after.unwrap() > 14 * MINUTE, "{other:?}");
    assert!(
        redis
            .cmd(&["PTTL", "ratelimit:{v1:alice}:block:period:login"])
            .parse::<i64>()
            .unwrap()
            > 0
    );
    // Another key is not locked.
    assert!(b.check(b"bob", ONE).await.is_admitted());
    // A reset through either instance lifts it for both.
    let lifted = b.reset(b"alice").unwrap().await;
    assert!(lifted.is_admitted(), "{lifted:?}");
    assert!(a.check(b"alice", ONE).await.is_admitted());
}

#[tokio::test]
async fn a_block_refuses_every_limit_of_a_set_on_every_instance() {
    let redis = RedisServer::start();
    let set = || {
        LimitSet::new()
            .limit(
                "burst",
                TokenBucketConfig::new(10, Duration::from_secs(1), 10),
            )
            .limit("daily", PeriodConfig::new(100, 24 * 60 * MINUTE))
    };
    let a = SetLimiter::new(&redis.uncached_backend(), "api", set()).unwrap();
    let b = SetLimiter::new(&redis.uncached_backend(), "api", set()).unwrap();
    assert!(a.check(b"m1", ONE).await.is_admitted());
    let blocked = a.block(b"m1", 10 * MINUTE).unwrap().await;
    assert!(!blocked.is_admitted());
    let refused = b.check(b"m1", ONE).await;
    assert_eq!(refused.state, State::OverQuota);
    assert!(refused.retry_after.unwrap() > 9 * MINUTE, "{refused:?}");
    // Nothing was spent while blocked: the daily count is still 1 (marked while the key
    // is blocked: 2^52 more, which the engine reads back; see `src/period/period.lua`).
    let daily: u64 = redis
        .cmd(&["GET", "ratelimit:{v1:m1}:set:3:api:period:daily"])
        .parse()
        .unwrap();
    assert_eq!(daily - (1 << 52), 1);
    let peek = b.peek(b"m2", ONE).unwrap().await;
    assert!(peek.is_admitted(), "another key is free: {peek:?}");
}

/// Every layer builder has the settings of its algorithm's config: a lockout on each,
/// leases on the token bucket (not with a lockout: see tests/lease.rs). In process, a
/// key refused once is locked out. Tokio's clock is paused, so the in-process limits see
/// no time pass between the first two checks however slow the machine is.
#[tokio::test(start_paused = true)]
async fn the_layer_builders_have_lockout_and_lease() {
    use tower_redis_ratelimit::Backend;
    let backend = Backend::in_process();
    let period = LimitLayer::builder(
        &backend,
        PeriodConfig::new(1, Duration::from_millis(50)).lockout(MINUTE),
    )
    .name("p")
    .key(GlobalKey)
    .build()
    .unwrap();
    let bucket = LimitLayer::builder(
        &backend,
        TokenBucketConfig::new(1_000, Duration::from_secs(1), 1).lockout(MINUTE),
    )
    .name("t")
    .key(GlobalKey)
    .build()
    .unwrap();
    let leased = LimitLayer::builder(
        &backend,
        TokenBucketConfig::new(1_000, Duration::from_secs(1), 1)
            .lease(1, Duration::from_millis(100)),
    )
    .name("leased")
    .key(GlobalKey)
    .build();
    assert!(leased.is_ok());
    let rolling = LimitLayer::builder(
        &backend,
        RollingConfig::new(1, 1, Duration::from_millis(50)).lockout(MINUTE),
    )
    .name("r")
    .key(GlobalKey)
    .build()
    .unwrap();
    let set = LimitLayer::builder(
        &backend,
        LimitSet::new()
            .limit("burst", PeriodConfig::new(1, Duration::from_millis(50)))
            .lockout(MINUTE),
    )
    .name("s")
    .key(GlobalKey)
    .build()
    .unwrap();
    let checks: [&dyn Limiter; 4] = [
        period.limiter(),
        bucket.limiter(),
        rolling.limiter(),
        set.limiter(),
    ];
    for limiter in checks {
        assert!(limiter.check(b"k", ONE).await.is_admitted());
        assert!(!limiter.check(b"k", ONE).await.is_admitted());
        // Long after every window ended (and the bucket refilled), still locked out.
        tokio::time::sleep(Duration::from_millis(120)).await;
        let locked = limiter.check(b"k", ONE).await;
        assert!(!locked.is_admitted(), "{:?}: {locked:?}", limiter.policy());
        assert!(locked.retry_after.unwrap() > 50 * Duration::from_secs(1));
    }
}
