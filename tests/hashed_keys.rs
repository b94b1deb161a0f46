//! Hashed keys on a real Redis (issue 55): after traffic, blocks, a lockout and a
//! listing, no key of the keyspace and no member of a list of blocked keys holds a byte
//! sequence the client sent (its credential, its address, the header's name), and admin
//! by value still blocks and lifts the client.

mod support;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use support::RedisServer;
use tower_redis_ratelimit::deadpool_redis::redis;
use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor, PeerIp};
use tower_redis_ratelimit::{LimitLayer, LimitSet, Limiter, PeriodConfig, TokenBucketConfig};

const CREDENTIAL: &str = "Bearer sk_live_51Hx9";
const ADDRESS: &str = "203.0.113.77";

/// Every key of the keyspace, by `SCAN`, and every member of its sorted sets.
async fn keyspace(redis: &RedisServer) -> Vec<Vec<u8>> {
    let mut conn = redis.pool().get().await.unwrap();
    let mut cursor = 0u64;
    let mut keys: Vec<Vec<u8>> = Vec::new();
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut all = keys.clone();
    for key in &keys {
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if kind == "zset" {
            let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .unwrap();
            all.extend(members);
        }
    }
    all
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn request(credential: Option<&str>, peer: &str) -> http::request::Parts {
    let mut builder = http::Request::builder();
    if let Some(credential) = credential {
        builder = builder.header("authorization", credential);
    }
    let (mut parts, ()) = builder.body(()).unwrap().into_parts();
    parts
        .extensions
        .insert(format!("{peer}:443").parse::<SocketAddr>().unwrap());
    parts
}

#[tokio::test]
async fn redis_holds_none_of_the_clients_bytes_and_admin_by_value_still_works() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let key = HeaderKey::from_static("authorization")
        .or(PeerIp::new())
        .hashed("test secret, 32 random bytes in production");
    // A set with a lockout (its block key and list), and a plain limit.
    let set = LimitSet::new()
        .limit(
            "burst",
            TokenBucketConfig::new(1, Duration::from_secs(60), 3),
        )
        .limit("day", PeriodConfig::new(100, Duration::from_secs(86_400)))
        .lockout(Duration::from_secs(60));
    let layer = LimitLayer::builder(&backend, set)
        .name("api")
        .key(key.clone())
        .build()
        .unwrap();
    let plain = LimitLayer::builder(&backend, PeriodConfig::new(5, Duration::from_secs(60)))
        .name("plain")
        .key(key.clone())
        .build()
        .unwrap();

    // Traffic by credential and by address, up to a refusal (and its lockout).
    for (credential, peer) in [(Some(CREDENTIAL), "198.51.100.1"), (None, ADDRESS)] {
        let parts = request(credential, peer);
        let k = key.extract(&parts).unwrap().into_owned();
        for _ in 0..4 {
            layer.limiter().check(&k, NonZeroU32::MIN).await;
            plain.limiter().check(&k, NonZeroU32::MIN).await;
        }
    }
    // Blocked by value (the credential as the client sends it), then listed.
    let blocked = plain
        .block_value(CREDENTIAL, Duration::from_secs(600))
        .await
        .unwrap();
    assert!(!blocked[0].1.is_admitted());
    let listed = plain.blocked(10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    // Only the hash is kept: the listing cannot name the value.
    assert_eq!(listed[0].value, None, "{listed:?}");
    assert!(listed[0].key.starts_with(b"h:"), "{listed:?}");
    // Give the lockout's listing (written in the background) a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!layer.blocked(10).await.unwrap().is_empty());

    let keys = keyspace(&redis).await;
    assert!(keys.len() >= 6, "{} keys", keys.len());
    for key in &keys {
        let shown = String::from_utf8_lossy(key);
        for secret in [
            CREDENTIAL,
            "sk_live",
            ADDRESS,
            "203.0.113",
            "authorization",
            "ip:",
            "hdr:",
        ] {
            assert!(
                !contains(key, secret),
                "{secret:?} in the Redis key {shown:?}"
            );
        }
    }

    // Lifted by value; the count kept (4 of 5 spent: one left).
    let lifted = plain.unblock_value(CREDENTIAL).await.unwrap();
    assert!(lifted[0].1.is_admitted(), "{lifted:?}");
    let parts = request(Some(CREDENTIAL), "198.51.100.1");
    let k = key.extract(&parts).unwrap().into_owned();
    let after = plain.limiter().check(&k, NonZeroU32::MIN).await;
    assert!(after.is_admitted(), "{after:?}");
    assert_eq!(after.remaining, 0);
    assert!(plain.blocked(10).await.unwrap().is_empty());
}
