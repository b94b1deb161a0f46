//! A name means one limit on one backend (issue 28): every limiter of one name and
//! algorithm shares its state in process as on Redis; blocks and resets reach other
//! instances' deny caches within the documented bound; a set refused from the deny cache
//! lists every limit; no name, set name or limit name reaches another limit's keys.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use support::http::Served;
use support::RedisServer;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::LimitLayer;
use tower_redis_ratelimit::{Backend, Limiter, Source, State};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const SEC: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3_600);
const DAY: Duration = Duration::from_secs(86_400);

/// Two limiters built with one name on one in-process backend, of every algorithm and
/// a set: what one spends, refunds, resets or blocks, the other sees.
#[tokio::test]
async fn limiters_of_one_name_share_their_state_in_process() {
    let backend = Backend::in_process();
    let pairs: Vec<(Box<dyn Limiter>, Box<dyn Limiter>)> = vec![
        (
            Box::new(PeriodLimiter::new(&backend, "n", PeriodConfig::new(3, MINUTE)).unwrap()),
            Box::new(PeriodLimiter::new(&backend, "n", PeriodConfig::new(3, MINUTE)).unwrap()),
        ),
        (
            Box::new(
                TokenBucketLimiter::new(&backend, "n", TokenBucketConfig::new(3, MINUTE, 3))
                    .unwrap(),
            ),
            Box::new(
                TokenBucketLimiter::new(&backend, "n", TokenBucketConfig::new(3, MINUTE, 3))
                    .unwrap(),
            ),
        ),
        (
            Box::new(
                RollingWindowLimiter::new(&backend, "n", RollingConfig::new(3, 6, 10 * SEC))
                    .unwrap(),
            ),
            Box::new(
                RollingWindowLimiter::new(&backend, "n", RollingConfig::new(3, 6, 10 * SEC))
                    .unwrap(),
            ),
        ),
        (
            Box::new(SetLimiter::new(&backend, "s", set()).unwrap()),
            Box::new(SetLimiter::new(&backend, "s", set()).unwrap()),
        ),
    ];
    for (i, (layer, handle)) in pairs.iter().enumerate() {
        let key = format!("k{i}");
        let key = key.as_bytes();
        for _ in 0..3 {
            assert!(layer.check(key, ONE).await.is_admitted());
        }
        let refused = layer.check(key, ONE).await;
        assert_eq!(refused.state, State::OverQuota, "#{i}");
        // The handle sees the layer's count.
        let peek = handle.peek(key, ONE).unwrap().await;
        assert_eq!(peek.state, State::OverQuota, "#{i}: {peek:?}");
        // Its refund reaches the layer.
        handle.refund(key, ONE).unwrap().await;
        assert!(layer.check(key, ONE).await.is_admitted(), "#{i}");
        // Its reset and its block too.
        handle.reset(key).unwrap().await;
        let fresh = layer.check(key, ONE).await;
        assert_eq!(fresh.remaining, 2, "#{i}: {fresh:?}");
        handle.block(key, MINUTE).unwrap().await;
        let blocked = layer.check(key, ONE).await;
        assert_eq!(blocked.state, State::OverQuota, "#{i}: {blocked:?}");
        assert!(blocked.retry_after.unwrap() > 50 * SEC, "#{i}: {blocked:?}");
        handle.reset(key).unwrap().await;
        assert!(layer.check(key, ONE).await.is_admitted(), "#{i}");
    }
    // Another name is another limit.
    let other = PeriodLimiter::new(&backend, "other", PeriodConfig::new(3, MINUTE)).unwrap();
    assert_eq!(other.check(b"k0", ONE).await.remaining, 2);
}

fn set() -> LimitSet {
    LimitSet::new()
        .limit("burst", PeriodConfig::new(3, MINUTE))
        .limit("daily", PeriodConfig::new(10, DAY))
}

/// Instance A blocks a key for a minute; instance B, refused by Redis, answers from its
/// deny cache. A's shorter block, then A's reset, reach B's answers within the deny
/// cache's max age (1 s), not after the first block's minute.
#[tokio::test]
async fn blocks_and_resets_reach_other_instances_deny_caches() {
    let redis = RedisServer::start();
    let a_backend = redis.backend();
    let b_backend = redis.backend();
    let config = PeriodConfig::new(100, MINUTE);
    let a = PeriodLimiter::new(&a_backend, "login", config).unwrap();
    let b = PeriodLimiter::new(&b_backend, "login", config).unwrap();

    for lift in ["shorter block", "reset"] {
        let key = lift.as_bytes();
        a.block(key, MINUTE).unwrap().await;
        let first = b.check(key, ONE).await;
        assert_eq!(first.source, Source::Redis, "{lift}: {first:?}");
        assert!(!first.is_admitted());
        let cached = b.check(key, ONE).await;
        assert_eq!(cached.source, Source::DenyCache, "{lift}: {cached:?}");
        assert!(cached.retry_after.unwrap() > 50 * SEC, "{lift}: {cached:?}");
        if lift == "reset" {
            a.reset(key).unwrap().await;
        } else {
            a.block(key, Duration::from_millis(100)).unwrap().await;
        }
        tokio::time::sleep(Duration::from_millis(1_300)).await;
        let after = b.check(key, ONE).await;
        assert!(after.is_admitted(), "{lift}: B still refuses: {after:?}");
        assert_eq!(after.source, Source::Redis);
    }
}

/// A set's refusal answered from the deny cache lists every limit in `RateLimit-Policy`
/// and `RateLimit`, as Redis's refusal did (it used to list the set's bare name with
/// its first limit's quota and the refusing limit's reset).
#[tokio::test]
async fn a_set_refused_from_the_deny_cache_lists_every_limit() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let layer = LimitLayer::builder(
        &backend,
        LimitSet::new()
            .limit("burst", TokenBucketConfig::new(100, HOUR, 100))
            .limit("daily", PeriodConfig::new(2, DAY)),
    )
    .name("reports")
    // (A bucket that refills no token within the test: its `t` is the same to the
    // second from Redis and from the cache however slow the machine.)
    .key(HeaderKey::from_static("x-merchant-id"))
    .build()
    .unwrap();
    let app = Router::new().route("/reports", get(|| async { "report" }).layer(layer));
    let server = Served::start(app).await;
    let merchant = [("x-merchant-id", "m1")];
    for _ in 0..2 {
        let (admitted, _) = server.get("/reports", &merchant).await;
        assert_eq!(admitted.status(), 200);
    }
    let (by_redis, _) = server.get("/reports", &merchant).await;
    let (by_cache, _) = server.get("/reports", &merchant).await;
    for response in [&by_redis, &by_cache] {
        assert_eq!(response.status(), 429);
        assert_eq!(
            response.headers()["ratelimit-policy"],
            "\"reports.burst\";q=100;w=3600, \"reports.daily\";q=2;w=86400"
        );
    }
    let ratelimit = |r: &http::Response<()>| r.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(
        ratelimit(&by_redis).contains("\"reports.daily\";r=0;t=86400"),
        "{}",
        ratelimit(&by_redis)
    );
    assert_eq!(ratelimit(&by_cache), ratelimit(&by_redis));
    assert_eq!(
        by_cache.headers()["retry-after"],
        by_redis.headers()["retry-after"]
    );
}

/// A limiter named `n:block` used to write limiter `n`'s block key (`…:period:n:block`),
/// so `n` refused a key it had never seen for as long as the other's window.
#[tokio::test]
async fn a_name_ending_in_block_is_not_another_limiters_block() {
    let redis = RedisServer::start();
    let backend = redis.uncached_backend();
    let config = PeriodConfig::new(1, MINUTE);
    let tricky = PeriodLimiter::new(&backend, "n:block", config).unwrap();
    let n = PeriodLimiter::new(&backend, "n", config).unwrap();
    assert!(tricky.check(b"k", ONE).await.is_admitted());
    let decision = n.check(b"k", ONE).await;
    assert_eq!(decision.source, Source::Redis);
    assert!(decision.is_admitted(), "{decision:?}");
    // And the other way round: `n`'s lockout does not count for `n:block`.
    let locked = PeriodLimiter::new(&backend, "m", config.lockout(MINUTE)).unwrap();
    let m_block = PeriodLimiter::new(&backend, "m:block", config).unwrap();
    locked.check(b"k", ONE).await;
    assert!(!locked.check(b"k", ONE).await.is_admitted());
    assert!(m_block.check(b"k", ONE).await.is_admitted());
}

/// Set `x` with limit `y.z` and set `x.y` with limit `z` used to share the Redis key
/// `…:period:x.y.z`; so did a limiter named `x.y.z`.
#[tokio::test]
async fn set_limits_never_share_keys_across_sets() {
    let redis = RedisServer::start();
    for backend in [redis.uncached_backend(), Backend::in_process()] {
        let one = LimitSet::new().limit("y.z", PeriodConfig::new(1, MINUTE));
        let two = LimitSet::new().limit("z", PeriodConfig::new(1, MINUTE));
        let x = SetLimiter::new(&backend, "x", one).unwrap();
        let xy = SetLimiter::new(&backend, "x.y", two).unwrap();
        let xyz = PeriodLimiter::new(&backend, "x.y.z", PeriodConfig::new(1, MINUTE)).unwrap();
        assert!(x.check(b"k", ONE).await.is_admitted());
        assert!(xy.check(b"k", ONE).await.is_admitted(), "{backend:?}");
        assert!(xyz.check(b"k", ONE).await.is_admitted(), "{backend:?}");
        assert!(!x.check(b"k", ONE).await.is_admitted());
    }
}
