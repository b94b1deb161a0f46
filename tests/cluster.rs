//! Every layer on a three-master Redis Cluster started by the harness.
#![cfg(feature = "cluster")]

mod support;

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::time::Duration;

use support::RedisCluster;
use tower_redis_ratelimit::deadpool_redis::{cluster, Runtime};
use tower_redis_ratelimit::RedisState;
use tower_redis_ratelimit::{Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;

/// Keys spread over many slots, with hash-tag braces and the empty key among them.
fn keys() -> Vec<String> {
    let mut keys: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
    keys.extend(
        ["", "{", "}", "{}", "}{", "{user-1}", "a{b}c", "{x}{y}"]
            .iter()
            .map(|k| k.to_string()),
    );
    keys
}

async fn admitted(limiter: &impl Limiter, key: &str, tries: usize) -> usize {
    let mut n = 0;
    for _ in 0..tries {
        let d = limiter.check(key.as_bytes(), ONE).await;
        assert!(
            matches!(d.source, Source::Redis | Source::DenyCache),
            "key {key:?}: {d:?}"
        );
        n += usize::from(d.is_admitted());
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_limits_exactly_with_keys_over_all_slots() {
    let cluster = RedisCluster::start(3);
    let pool = cluster::Config::from_urls(cluster.urls())
        .create_pool(Some(Runtime::Tokio1))
        .unwrap();
    let backend = support::backend_builder()
        .redis_cluster(pool)
        .build()
        .unwrap();
    let period =
        PeriodLimiter::new(&backend, "p", PeriodConfig::new(3, Duration::from_secs(60))).unwrap();
    let bucket = TokenBucketLimiter::new(
        &backend,
        "t",
        TokenBucketConfig::new(1, Duration::from_secs(60), 2),
    )
    .unwrap();
    let rolling = RollingWindowLimiter::new(
        &backend,
        "r",
        RollingConfig::new(4, 10, Duration::from_secs(6)),
    )
    .unwrap();
    for key in keys() {
        assert_eq!(admitted(&period, &key, 5).await, 3, "period, key {key:?}");
        assert_eq!(
            admitted(&bucket, &key, 4).await,
            2,
            "token bucket, key {key:?}"
        );
        assert_eq!(
            admitted(&rolling, &key, 6).await,
            4,
            "rolling window, key {key:?}"
        );
    }
    // The keys really are spread over the three masters.
    for node in 0..3 {
        let size: u64 = cluster.cmd(node, &["DBSIZE"]).parse().unwrap();
        assert!(size > 0, "node {node} holds no key");
    }
    // The hash tag is the limited key: the three limits of one key share its slot.
    let mut nodes_of_tag: HashMap<String, (HashSet<usize>, usize)> = HashMap::new();
    for node in 0..3 {
        for redis_key in cluster.cmd(node, &["KEYS", "*"]).lines() {
            let open = redis_key.find('{').expect("a hash tag");
            let len = redis_key[open..].find('}').expect("a closed hash tag");
            let tag = &redis_key[open + 1..open + len];
            assert!(tag.starts_with("v1:") && !tag.contains('{'), "{redis_key}");
            let entry = nodes_of_tag.entry(tag.to_owned()).or_default();
            entry.0.insert(node);
            entry.1 += 1;
        }
    }
    assert_eq!(nodes_of_tag.len(), keys().len(), "one tag per limited key");
    for (tag, (nodes, count)) in nodes_of_tag {
        assert_eq!(nodes.len(), 1, "{tag} on nodes {nodes:?}");
        assert_eq!(count, 3, "{tag}: one key per algorithm");
    }
    assert_eq!(backend.redis_state(), Some(RedisState::Healthy));
}

#[tokio::test]
async fn noscript_on_a_cluster_is_handled() {
    let cluster = RedisCluster::start(3);
    let pool = cluster::Config::from_urls(cluster.urls())
        .create_pool(Some(Runtime::Tokio1))
        .unwrap();
    let backend = support::backend_builder()
        .redis_cluster(pool)
        .build()
        .unwrap();
    let limiter = PeriodLimiter::new(
        &backend,
        "p",
        PeriodConfig::new(100, Duration::from_secs(60)),
    )
    .unwrap();
    for key in keys() {
        assert_eq!(
            limiter.check(key.as_bytes(), ONE).await.source,
            Source::Redis
        );
    }
    for node in 0..3 {
        assert_eq!(cluster.cmd(node, &["SCRIPT", "FLUSH"]), "OK");
        // Where the server has Redis Functions (not Redis 6.2: the engine runs by
        // `EVALSHA` there, and `SCRIPT FLUSH` is the whole flush).
        if cluster.has_functions(node) {
            assert_eq!(cluster.cmd(node, &["FUNCTION", "FLUSH"]), "OK");
        }
    }
    for key in keys() {
        let d = limiter.check(key.as_bytes(), ONE).await;
        assert_eq!(d.source, Source::Redis, "key {key:?}");
        assert_eq!(d.remaining, 98);
    }
}

#[tokio::test]
async fn a_cluster_reached_by_urls_limits_on_every_node() {
    let cluster = RedisCluster::start(3);
    let backend = support::backend_builder()
        .redis_cluster_urls(cluster.urls())
        .build()
        .unwrap();
    let limiter =
        PeriodLimiter::new(&backend, "u", PeriodConfig::new(2, Duration::from_secs(60))).unwrap();
    for key in keys() {
        assert_eq!(admitted(&limiter, &key, 3).await, 2, "key {key:?}");
    }
    for node in 0..3 {
        let size: u64 = cluster.cmd(node, &["DBSIZE"]).parse().unwrap();
        assert!(size > 0, "node {node} holds no key");
    }
    assert_eq!(backend.redis_switches(), Some(0));
}

/// A set of limits on one key is one script call on the key's master: its keys share
/// the key's hash tag, whatever the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_of_limits_decides_in_one_slot() {
    use tower_redis_ratelimit::{LimitSet, SetLimiter};
    let cluster = RedisCluster::start(3);
    let pool = cluster::Config::from_urls(cluster.urls())
        .create_pool(Some(Runtime::Tokio1))
        .unwrap();
    let backend = support::backend_builder()
        .redis_cluster(pool)
        .build()
        .unwrap();
    let set = LimitSet::new()
        .limit(
            "burst",
            TokenBucketConfig::new(1, Duration::from_secs(60), 3),
        )
        .limit("daily", PeriodConfig::new(2, Duration::from_secs(86_400)))
        .limit("rolling", RollingConfig::new(4, 10, Duration::from_secs(6)));
    let limiter = SetLimiter::new(&backend, "set", set).unwrap();
    for key in keys() {
        assert_eq!(admitted(&limiter, &key, 4).await, 2, "key {key:?}");
    }
}

/// In-flight slots on a cluster: each key's set in its own slot, taken, renewed past
/// their lease and given back, through `FCALL` routed by the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_slots_on_keys_over_all_slots() {
    use tower_redis_ratelimit::in_flight::{InFlightConfig, InFlightLimiter};

    let cluster = RedisCluster::start(3);
    let pool = cluster::Config::from_urls(cluster.urls())
        .create_pool(Some(Runtime::Tokio1))
        .unwrap();
    let backend = support::backend_builder()
        .redis_cluster(pool)
        .call_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    backend.warm_up().await.unwrap();
    // (A lease of 1.5 s: renewals every 500 ms keep it however busy the machine.)
    let lease = Duration::from_millis(1_500);
    let limiter =
        InFlightLimiter::new(&backend, "jobs", InFlightConfig::new(2).slot_ttl(lease)).unwrap();
    let mut held = Vec::new();
    for key in keys() {
        for _ in 0..2 {
            let slot = limiter.acquire(key.as_bytes()).await.unwrap();
            assert_eq!(slot.decision().source, Source::Redis, "key {key:?}");
            held.push(slot);
        }
        let refused = limiter.acquire(key.as_bytes()).await.unwrap_err();
        assert_eq!(refused.source, Source::Redis, "key {key:?}");
    }
    // Past two leases, the renewal (one call per key, to the key's master) kept them.
    tokio::time::sleep(lease * 2).await;
    for key in keys() {
        assert_eq!(limiter.in_flight(key.as_bytes()).await, 2, "key {key:?}");
    }
    drop(held);
    for key in keys() {
        let start = std::time::Instant::now();
        while limiter.in_flight(key.as_bytes()).await != 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "key {key:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Rotating credentials on a cluster: every node's connection re-authenticates with the
/// provider's new user, and the old user's removal from every node fails no decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_credentials_reauthenticate_every_nodes_connection() {
    use std::sync::{Arc, Mutex};
    use tower_redis_ratelimit::Credentials;

    let cluster = RedisCluster::start(3);
    let add_user = |user: &str, password: &str| {
        for node in 0..3 {
            let reply = cluster.cmd(
                node,
                &[
                    "ACL",
                    "SETUSER",
                    user,
                    "on",
                    &format!(">{password}"),
                    "~*",
                    "&*",
                    "+@all",
                ],
            );
            assert_eq!(reply, "OK", "node {node}: {reply}");
        }
    };
    let users_on = |node: usize, user: &str| {
        let needle = format!(" user={user} ");
        cluster
            .cmd(node, &["CLIENT", "LIST"])
            .lines()
            .filter(|line| line.contains(&needle))
            .count()
    };
    add_user("app-blue", "blue-1");
    let current = Arc::new(Mutex::new(("app-blue", "blue-1")));
    let issued = Arc::clone(&current);
    let backend = support::backend_builder()
        .redis_cluster_urls(cluster.urls())
        .call_timeout(Duration::from_secs(2))
        .credentials(move || {
            let (user, password) = *issued.lock().unwrap();
            async move {
                Ok::<_, std::io::Error>(
                    Credentials::new(user, password).expires_in(Duration::from_millis(800)),
                )
            }
        })
        .build()
        .unwrap();
    let limiter = PeriodLimiter::new(
        &backend,
        "rotating",
        PeriodConfig::new(1_000_000, Duration::from_secs(60)),
    )
    .unwrap();
    let check_all = |limiter: PeriodLimiter| async move {
        for key in keys() {
            let d = limiter.check(key.as_bytes(), ONE).await;
            assert_eq!(d.source, Source::Redis, "key {key:?}: {d:?}");
        }
    };
    check_all(limiter.clone()).await;
    for node in 0..3 {
        assert!(
            users_on(node, "app-blue") > 0,
            "node {node}: no app-blue connection"
        );
    }

    add_user("app-green", "green-2");
    *current.lock().unwrap() = ("app-green", "green-2");
    let start = std::time::Instant::now();
    while (0..3).any(|node| users_on(node, "app-blue") > 0) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "connections still on app-blue"
        );
        check_all(limiter.clone()).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for node in 0..3 {
        assert_eq!(cluster.cmd(node, &["ACL", "DELUSER", "app-blue"]), "1");
    }
    for _ in 0..5 {
        check_all(limiter.clone()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(backend.redis_switches(), Some(0));
}
