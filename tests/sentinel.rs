//! Redis Sentinel: a master, a replica and three sentinels started by the harness; the
//! test kills the master under traffic and the backend follows the new one.
#![cfg(feature = "sentinel")]

mod support;

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{service_fn, ServiceBuilder, ServiceExt};

use support::sentinel::{SentinelGroup, MASTER_NAME};
use tokio::time::Instant;
use tower_redis_ratelimit::key::GlobalKey;
use tower_redis_ratelimit::LimitLayer;
use tower_redis_ratelimit::RedisState;
use tower_redis_ratelimit::{Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const PROBE: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_follows_a_failover_with_the_replicated_counts() {
    let mut group = SentinelGroup::start();
    let backend = support::backend_builder()
        .redis_sentinel(MASTER_NAME, group.urls())
        .probe_interval(PROBE)
        .recovery(Duration::from_millis(200))
        .build()
        .unwrap();
    backend.warm_up().await.unwrap();
    let limiter = PeriodLimiter::new(
        &backend,
        "s",
        PeriodConfig::new(100, Duration::from_secs(60)),
    )
    .unwrap();
    // A layer on the same backend, to see what HTTP clients get meanwhile.
    let layer = LimitLayer::builder(
        &backend,
        PeriodConfig::new(1_000_000, Duration::from_secs(60)),
    )
    .name("http")
    .key(GlobalKey)
    .build()
    .unwrap();
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(()))
        }));
    for _ in 0..10 {
        assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    }
    // Replicated before the master dies: the new master has these counts.
    assert_eq!(group.master.cmd(&["WAIT", "1", "2000"]), "1");
    let old = group.master.port();
    group.master.kill();
    // Under traffic: the failure policy answers until the new master does; no 5xx.
    let start = Instant::now();
    let mut during = Vec::new();
    let mut failed_over = None;
    let decision = loop {
        let status = service
            .clone()
            .oneshot(Request::new(()))
            .await
            .unwrap()
            .status();
        assert_eq!(status, StatusCode::OK);
        if failed_over.is_none() && group.master_port() != old {
            failed_over = Some(start.elapsed());
        }
        let d = limiter.check(b"k", ONE).await;
        if d.source == Source::Redis {
            break d;
        }
        during.push(d.source);
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never back on redis: {during:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let back = start.elapsed();
    assert!(during.iter().all(|s| *s == Source::Fallback), "{during:?}");
    // `master_port` asks the first sentinel, which may learn of the failover a moment
    // after the one the backend asked (seen once on a loaded machine).
    let mut new = group.master_port();
    let asked = std::time::Instant::now();
    while new == old && asked.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        new = group.master_port();
    }
    assert_ne!(new, old, "the sentinels promoted the replica");
    assert_eq!(new, group.replica.port());
    // Back on Redis within a probe interval of the sentinels naming the new master (plus
    // the recovery's first share of checks, and a margin for a loaded machine).
    let failed_over = failed_over.unwrap_or(back);
    assert!(
        back <= failed_over + PROBE + Duration::from_secs(2),
        "failover seen after {failed_over:?}, back on redis after {back:?}"
    );
    // The count went on from the replicated state: ten before, this one now.
    assert_eq!(decision.remaining, 100 - 11, "{decision:?}");
    // Then every check goes to the new master again.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(backend.redis_state(), Some(RedisState::Healthy));
    assert_eq!(limiter.check(b"k", ONE).await.remaining, 100 - 12);
}

/// A Sentinel backend from configuration (feature `serde`): the master's name and the
/// sentinels' URLs from the file; checks go to the master.
#[cfg(feature = "serde")]
#[tokio::test]
async fn a_sentinel_backend_from_configuration() {
    let group = SentinelGroup::start();
    let urls: Vec<String> = group.urls().iter().map(|u| format!("{u:?}")).collect();
    let text = format!(
        "prefix = \"from-config\"\n\
         sentinel = {{ master_name = \"{MASTER_NAME}\", urls = [{}] }}\n",
        urls.join(", ")
    );
    let config: tower_redis_ratelimit::BackendConfig = toml::from_str(&text).unwrap();
    let backend = config.build().unwrap();
    backend.warm_up().await.unwrap();
    let limiter =
        PeriodLimiter::new(&backend, "s", PeriodConfig::new(2, Duration::from_secs(60))).unwrap();
    let decisions = [
        limiter.check(b"k", ONE).await,
        limiter.check(b"k", ONE).await,
        limiter.check(b"k", ONE).await,
    ];
    assert!(decisions[..2]
        .iter()
        .all(|d| d.is_admitted() && d.source == Source::Redis));
    assert!(!decisions[2].is_admitted());
    let keys = group.master.cmd(&["KEYS", "from-config:*"]);
    assert!(keys.contains(":period:s"), "{keys}");
    // The change subscription is on the master the sentinels name.
    let channel = "from-config:changes";
    assert_eq!(
        support::channel_subscribers(&group.master, channel, 1).await,
        1
    );
}
