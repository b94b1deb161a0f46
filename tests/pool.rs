//! The pool path has every property (issue 51): a backend on a `deadpool_redis::Pool`
//! of the user's, built with `TCP_NODELAY` and given the pool's URL for its change
//! subscription, has `TCP_NODELAY` on every socket to Redis and hears the resets and
//! blocks of other instances as a backend built from a URL does.
//!
//! `TCP_NODELAY` is read from the redis crate's settings, not from the sockets (see
//! [`pool_nodelay`]).

mod support;

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use support::RedisServer;
use tower_redis_ratelimit::deadpool_redis::{self, redis, Runtime};
use tower_redis_ratelimit::{Backend, Decision, Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const HOUR: Duration = Duration::from_secs(3_600);
/// The deny cache's max age: without the subscription, a refusal cached by A stays
/// for this long, far longer than the test waits.
const MAX_AGE: Duration = Duration::from_secs(30);
/// How long a test waits for a change to show on A: far under [`MAX_AGE`].
const PATIENCE: Duration = Duration::from_secs(5);

/// A pool built as `BackendBuilder::redis` shows: `TCP_NODELAY` on its connections.
fn nodelay_pool(url: &str) -> deadpool_redis::Pool {
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .unwrap()
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    deadpool_redis::Pool::builder(deadpool_redis::Manager::new(info).unwrap())
        .runtime(Runtime::Tokio1)
        .build()
        .unwrap()
}

/// An instance on a pool of its own, subscribed through the pool's URL.
fn instance(redis: &RedisServer) -> Backend {
    support::backend_builder()
        .redis(nodelay_pool(&redis.url()))
        .subscription_url(redis.url())
        .call_timeout(support::CALL_TIMEOUT)
        .deny_cache_max_age(MAX_AGE)
        .build()
        .unwrap()
}

/// Whether the connections of `pool` have `TCP_NODELAY`, as the redis crate's settings
/// of the pool's client say (its `Debug`: deadpool-redis keeps the client private).
/// A check on the sockets themselves needs `getsockopt` on a raw descriptor, which
/// `unsafe_code = "forbid"` (every target of the package) rules out, and neither
/// `CLIENT LIST` nor `ss` shows the option.
fn pool_nodelay(pool: &deadpool_redis::Pool) -> bool {
    let manager = format!("{:?}", pool.manager());
    assert!(manager.contains("nodelay: "), "{manager}");
    manager.contains("nodelay: true")
}

#[tokio::test]
async fn a_pool_backend_has_tcp_nodelay_and_its_subscription() {
    let redis = RedisServer::start();
    let pool = nodelay_pool(&redis.url());
    assert!(pool_nodelay(&pool));
    let backend = support::backend_builder()
        .redis(pool.clone())
        .subscription_url(redis.url())
        .build()
        .unwrap();
    let limiter = PeriodLimiter::new(&backend, "api", PeriodConfig::new(10, HOUR)).unwrap();
    let decision = limiter.check(b"k", ONE).await;
    assert_eq!(decision.source, Source::Redis, "{decision:?}");
    // The backend's check connection came out of the pool (its settings), and the
    // subscription was made after it (from the URL, with `TCP_NODELAY`: a unit test
    // of `connect.rs` reads it back).
    assert_eq!(
        support::channel_subscribers(&redis, "ratelimit:changes", 1).await,
        1
    );
}

/// What `BackendBuilder::redis` documents the backend cannot change: a pool made by
/// `deadpool_redis::Config` has `TCP_NODELAY` off, and without a subscription URL a
/// backend on a pool has no subscription.
#[tokio::test]
async fn a_pool_from_deadpool_config_keeps_its_own_socket_settings() {
    let redis = RedisServer::start();
    let pool = redis.pool();
    assert!(!pool_nodelay(&pool));
    let backend = Backend::redis(pool);
    let limiter = PeriodLimiter::new(&backend, "api", PeriodConfig::new(10, HOUR)).unwrap();
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        redis
            .cmd(&["PUBSUB", "NUMSUB", "ratelimit:changes"])
            .lines()
            .last(),
        Some("0")
    );
}

#[tokio::test]
async fn a_reset_on_one_pool_backend_reaches_another_before_the_max_age() {
    let redis = RedisServer::start();
    let config = PeriodConfig::new(2, HOUR);
    let a = PeriodLimiter::new(&instance(&redis), "api", config).unwrap();
    let b = PeriodLimiter::new(&instance(&redis), "api", config).unwrap();
    for _ in 0..2 {
        assert!(a.check(b"k", ONE).await.is_admitted());
    }
    // A answers the next checks from its deny cache.
    assert!(!a.check(b"k", ONE).await.is_admitted());
    let cached = a.check(b"k", ONE).await;
    assert_eq!(cached.source, Source::DenyCache, "{cached:?}");
    assert!(support::channel_subscribers(&redis, "ratelimit:changes", 1).await >= 1);
    assert!(b.reset(b"k").unwrap().await.is_admitted());
    let start = Instant::now();
    let admitted = loop {
        let decision: Decision = a.check(b"k", ONE).await;
        if decision.is_admitted() {
            break decision;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "A still refuses {PATIENCE:?} after B's reset: {decision:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(admitted.source, Source::Redis, "{admitted:?}");
}

#[test]
fn a_subscription_url_needs_a_pool() {
    let error = Backend::builder()
        .redis_url("redis://127.0.0.1:1")
        .subscription_url("redis://127.0.0.1:1")
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("subscription_url"), "{error}");
    let error = Backend::builder()
        .subscription_url("redis://127.0.0.1:1")
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("pool"), "{error}");
    let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
        .create_pool(Some(Runtime::Tokio1))
        .unwrap();
    let error = Backend::builder()
        .redis(pool)
        .subscription_url("http://127.0.0.1:1")
        .build()
        .unwrap_err();
    assert!(
        matches!(
            error,
            tower_redis_ratelimit::ConfigError::InvalidRedisUrl { .. }
        ),
        "{error:?}"
    );
}
