//! Hostile keys (issue 12): no two (prefix, algorithm, limiter, key) tuples share a Redis
//! key, extractor branches never share a key space, byte keys never collapse, and IPv6
//! clients are limited per /64 behind a trusted proxy. Every test runs on a real
//! `redis-server` started by the harness.

mod support;

#[path = "../examples/quickstart.rs"]
#[allow(dead_code)]
mod quickstart;

use std::num::NonZeroU32;
use std::time::Duration;

use axum::{routing::get, Router};
use http::StatusCode;
use support::http::Served;
use support::RedisServer;
use tower_redis_ratelimit::key::{ForwardedIp, HeaderKey};
use tower_redis_ratelimit::LimitLayer;
use tower_redis_ratelimit::{Backend, Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;

/// A backend on `redis` with `prefix` and no deny cache (every check reaches Redis).
fn backend(redis: &RedisServer, prefix: &str) -> Backend {
    support::backend_builder()
        .redis(redis.pool())
        .call_timeout(support::CALL_TIMEOUT)
        .prefix(prefix)
        .deny_cache(0)
        .build()
        .unwrap()
}

/// One limiter of each algorithm named `name` on `backend`, each admitting one unit.
fn one_of_each(backend: &Backend, name: &str) -> Vec<Box<dyn Limiter>> {
    let minute = Duration::from_secs(60);
    vec![
        Box::new(PeriodLimiter::new(backend, name, PeriodConfig::new(1, minute)).unwrap()),
        Box::new(
            TokenBucketLimiter::new(backend, name, TokenBucketConfig::new(1, minute, 1)).unwrap(),
        ),
        Box::new(
            RollingWindowLimiter::new(backend, name, RollingConfig::new(1, 6, minute / 6)).unwrap(),
        ),
    ]
}

/// Whether one unit on `key` is admitted, asserting that Redis answered.
async fn admits(limiter: &dyn Limiter, key: &[u8]) -> bool {
    let decision = limiter.check(key, ONE).await;
    assert_eq!(decision.source, Source::Redis, "key {key:?}: {decision:?}");
    decision.is_admitted()
}

/// Pairs of (prefix, limiter name, key) that the old layout `<prefix>:<kind>:<name>:<key>`
/// mapped to one Redis key, with hash-tag braces and bytes that are not UTF-8 in the
/// keys (prefixes and names with `{` or `}` are refused when they are built).
fn colliding_tuples() -> Vec<[(&'static str, &'static str, &'static [u8]); 2]> {
    vec![
        // Limiter `sms` key `daily:X` against limiter `sms:daily` key `X`.
        [("app", "sms", b"daily:X"), ("app", "sms:daily", b"X")],
        [("app", "a", b"b:{c}"), ("app", "a:b", b"{c}")],
        [("app", "a", b"b:}{"), ("app", "a:b", b"}{")],
        // The escape of `{` is not `{`.
        [("app", "a", b"%7B"), ("app", "a", b"{")],
        [("app", "a", b"b:\xff"), ("app", "a:b", b"\xff")],
        // Across prefixes: `a` + `b` + `period:c:k` against `a:period:b` + `c` + `k`.
        [("a", "b", b"period:c:k"), ("a:period:b", "c", b"k")],
        [("a", "b", b"token:c:k"), ("a:token:b", "c", b"k")],
        [("a", "b", b"rolling:c:k"), ("a:rolling:b", "c", b"k")],
    ]
}

/// Prefixes and names with hash-tag braces are refused when they are built (they would
/// end the hash tag early); keys may hold any bytes.
#[test]
fn braces_in_prefixes_and_names_are_refused_when_built() {
    for prefix in ["{app}", "a{", "}"] {
        let built = support::backend_builder().prefix(prefix).build();
        assert!(built.is_err(), "prefix {prefix:?}");
    }
    let backend = Backend::in_process();
    let minute = Duration::from_secs(60);
    for name in ["{sms}", "a}", "{"] {
        assert!(PeriodLimiter::new(&backend, name, PeriodConfig::new(1, minute)).is_err());
        let config = TokenBucketConfig::new(1, minute, 1);
        assert!(TokenBucketLimiter::new(&backend, name, config).is_err());
        let config = RollingConfig::new(1, 6, minute / 6);
        assert!(RollingWindowLimiter::new(&backend, name, config).is_err());
    }
}

#[tokio::test]
async fn limiters_never_share_a_redis_key_whatever_their_names_and_keys() {
    let redis = RedisServer::start();
    for (i, [first, second]) in colliding_tuples().into_iter().enumerate() {
        // Each pair on fresh state: a database per pair would do too.
        redis.cmd(&["FLUSHALL"]);
        let (prefix, name, key) = first;
        let limiters = one_of_each(&backend(&redis, prefix), name);
        for limiter in &limiters {
            assert!(admits(&**limiter, key).await, "pair {i}: first use");
            assert!(!admits(&**limiter, key).await, "pair {i}: the limit holds");
        }
        let (prefix, name, key) = second;
        let others = one_of_each(&backend(&redis, prefix), name);
        for (limiter, other) in limiters.iter().zip(&others) {
            assert!(
                admits(&**other, key).await,
                "pair {i}: {second:?} shares the quota of {first:?} ({:?})",
                limiter.policy()
            );
        }
    }
}

/// The Redis key is the documented layout, `<prefix>:{v1:<escaped key>}:<algorithm>:<name>`.
#[tokio::test]
async fn redis_keys_follow_the_documented_layout() {
    let redis = RedisServer::start();
    let backend = backend(&redis, "app");
    for limiter in one_of_each(&backend, "sms:daily") {
        assert!(admits(&*limiter, b"hdr:x-api-key:{k}%1").await);
    }
    let mut keys: Vec<String> = redis.cmd(&["KEYS", "*"]).lines().map(Into::into).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "app:{v1:hdr:x-api-key:%7Bk%7D%251}:period:sms:daily",
            "app:{v1:hdr:x-api-key:%7Bk%7D%251}:rolling:sms:daily",
            "app:{v1:hdr:x-api-key:%7Bk%7D%251}:token:sms:daily",
        ]
    );
}

#[tokio::test]
async fn keys_that_differ_only_in_bytes_that_are_not_utf8_are_apart() {
    let redis = RedisServer::start();
    let backend = backend(&redis, "bytes");
    let keys: [&[u8]; 5] = [b"\xff", b"\xfe", b"\xef\xbf\xbd", b"\xc3", b"\xc3\x28"];
    for limiter in one_of_each(&backend, "l") {
        for key in keys {
            assert!(admits(&*limiter, key).await, "{key:?}: first use");
            assert!(!admits(&*limiter, key).await, "{key:?}: the limit holds");
        }
    }
}

/// A number from `INFO stats` (`total_error_replies`).
fn stat(redis: &RedisServer, name: &str) -> u64 {
    let info = redis.cmd(&["INFO", "stats"]);
    info.lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in INFO stats"))
        .parse()
        .unwrap()
}

/// How a test server is started: what it stands for, its arguments, and the ACL rules of
/// the backend's user (its default user when `None`).
type Variant = (&'static str, Vec<String>, Option<&'static [&'static str]>);

/// A server without Redis Functions the backend may use: as built (Redis before 7), or,
/// on a server that has them, with `FUNCTION` and `FCALL` renamed away or denied to the
/// backend's user (as some managed services do), or `FUNCTION` alone denied. The
/// connection learns it when it is made, before any check is sent: byte keys that are not
/// UTF-8 are decided by Redis from the first check, and no check meets a refusal (the
/// server sends no more error replies than the connection's own setup) or pays a second
/// call (one `EVALSHA` per check).
#[tokio::test]
async fn a_server_without_functions_decides_byte_keys_from_the_first_check() {
    let server = RedisServer::start();
    let version = server.version();
    let variants: Vec<Variant> = if server.has_functions() {
        let renamed = ["FUNCTION", "FCALL"]
            .iter()
            .flat_map(|command| ["--rename-command", command, ""])
            .map(String::from)
            .collect();
        vec![
            ("FUNCTION and FCALL renamed away", renamed, None),
            (
                "FUNCTION and FCALL denied",
                Vec::new(),
                Some(&["-function", "-fcall"]),
            ),
            ("FUNCTION denied", Vec::new(), Some(&["-function"])),
        ]
    } else {
        eprintln!("{version} has no Redis Functions: the server runs as built");
        vec![("as built", Vec::new(), None)]
    };
    drop(server);
    let keys: [&[u8]; 3] = [b"\xff", b"\xc3\x28", b"\xfe"];
    for (what, args, rules) in variants {
        let redis = RedisServer::start_with(args);
        let url = match rules {
            Some(rules) => {
                let mut acl = vec![
                    "ACL", "SETUSER", "limiter", "on", ">secret", "~*", "&*", "+@all",
                ];
                acl.extend_from_slice(rules);
                assert_eq!(redis.cmd(&acl), "OK", "{what}");
                format!("redis://limiter:secret@127.0.0.1:{}", redis.port())
            }
            None => redis.url(),
        };
        let backend = |prefix: &str| {
            support::backend_builder()
                .redis_url(url.clone())
                .prefix(prefix)
                .deny_cache(0)
                .call_timeout(support::CALL_TIMEOUT)
                .build()
                .unwrap()
        };
        // What a connection's setup costs in error replies (the refused `FUNCTION LOAD`;
        // a client's `CLIENT SETINFO` on a server before 7.2).
        // (Counted once the backend's change subscription, made in the background after
        // its first connection, is up: its connection's setup counts too.)
        let before = stat(&redis, "total_error_replies");
        let setup = backend("setup");
        setup.warm_up().await.unwrap();
        assert_eq!(support::subscribed_clients(&redis, 1).await, 1, "{what}");
        let setup_errors = stat(&redis, "total_error_replies") - before;

        let before = (
            stat(&redis, "total_error_replies"),
            redis.command_calls("evalsha"),
        );
        let backend = backend("bytes");
        let mut checks = 0;
        for limiter in one_of_each(&backend, "l") {
            for key in keys {
                assert!(admits(&*limiter, key).await, "{what}: {key:?}: first use");
                assert!(
                    !admits(&*limiter, key).await,
                    "{what}: {key:?}: the limit holds"
                );
                checks += 2;
            }
        }
        assert_eq!(support::subscribed_clients(&redis, 2).await, 2, "{what}");
        assert_eq!(
            stat(&redis, "total_error_replies") - before.0,
            setup_errors,
            "{what}: no check met a refusal"
        );
        drop(setup);
        assert_eq!(
            redis.command_calls("evalsha") - before.1,
            checks,
            "{what}: one call per check"
        );
        assert_eq!(redis.command_calls("fcall"), 0, "{what}");
    }
}

/// A server that loads the library but refuses `FCALL` (renamed away while `FUNCTION`
/// is not): the first refusal moves the backend to `EVALSHA` for good, that check
/// answered by Redis all the same.
#[tokio::test]
async fn a_server_that_refuses_fcall_alone_is_served_by_evalsha_after_one_refusal() {
    let server = RedisServer::start();
    if !server.has_functions() {
        support::skip(format!(
            "{} has no Redis Functions (COMMAND INFO knows no FUNCTION, FCALL): no FCALL to refuse alone",
            server.version()
        ));
        return;
    }
    drop(server);
    let redis =
        RedisServer::start_with(["--rename-command", "FCALL", ""].map(String::from).to_vec());
    let backend = backend(&redis, "fcall");
    let limiters = one_of_each(&backend, "l");
    // The refusal repeats the call's first key: a UTF-8 one.
    assert!(admits(&*limiters[0], b"first").await);
    let before = stat(&redis, "total_error_replies");
    for limiter in &limiters {
        assert!(admits(&**limiter, b"\xff").await);
        assert!(!admits(&**limiter, b"\xff").await);
    }
    assert_eq!(stat(&redis, "total_error_replies"), before);
}

/// While Redis fails, the fallback counts each key under the same bytes whether the
/// check failed on its way to Redis (the key is read back from the Redis key) or went
/// straight to the fallback, and keeps keys apart as Redis does.
#[tokio::test]
async fn the_fallback_keeps_byte_keys_apart_and_whole() {
    let mut redis = RedisServer::start();
    let backend = backend(&redis, "app");
    let minute = Duration::from_secs(60);
    let limiter = PeriodLimiter::new(&backend, "l", PeriodConfig::new(2, minute)).unwrap();
    assert_eq!(limiter.check(b"warm", ONE).await.source, Source::Redis);
    redis.kill();
    let keys: [&[u8]; 4] = [b"a{%7B}\xff", b"a%7B%7B}\xff", b"a{{}\xff", b""];
    for key in keys {
        let mut admitted = 0;
        for _ in 0..3 {
            let decision = limiter.check(key, ONE).await;
            assert_ne!(decision.source, Source::Redis, "{key:?}");
            admitted += usize::from(decision.is_admitted());
        }
        assert_eq!(admitted, 2, "{key:?}: the fallback's limit, once per key");
    }
}

// ---------------------------------------------------------------------------
// Over HTTP
// ---------------------------------------------------------------------------

/// The quickstart's key (`x-api-key`, else the client IP): an API key that looks like an
/// IP address does not spend that IP's quota, nor the other way round.
#[tokio::test]
async fn an_api_key_that_spells_an_ip_does_not_spend_that_ips_quota() {
    let redis = RedisServer::start();
    let served = Served::start(quickstart::app(&redis.backend()).unwrap()).await;
    let routes = [
        ("/period", quickstart::PERIOD_QUOTA),
        ("/token", quickstart::TOKEN_BURST),
        ("/rolling", quickstart::ROLLING_LIMIT),
    ];
    let spoof = [("x-api-key", "127.0.0.1")];
    for (route, limit) in routes {
        for _ in 0..limit {
            assert_eq!(served.get(route, &spoof).await.0.status(), StatusCode::OK);
        }
        assert_eq!(
            served.get(route, &spoof).await.0.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{route}: the API key's own limit holds"
        );
        // The client at 127.0.0.1 without a key still has its whole quota.
        for i in 0..limit {
            let (response, body) = served.get(route, &[]).await;
            assert_eq!(
                response.status(),
                StatusCode::OK,
                "{route}: request {i} by IP was refused: {body}"
            );
        }
        assert_eq!(
            served.get(route, &[]).await.0.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{route}: the IP's own limit holds"
        );
    }
}

/// A per-header limit of one request each.
fn per_header(backend: &Backend) -> Router {
    let limit = LimitLayer::builder(backend, PeriodConfig::new(1, Duration::from_secs(60)))
        .name("hdr")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(limit)
}

#[tokio::test]
async fn header_keys_that_are_not_utf8_stay_distinct() {
    let redis = RedisServer::start();
    for backend in [Backend::in_process(), redis.backend()] {
        let served = Served::start(per_header(&backend)).await;
        let values: [&[u8]; 4] = [b"\xff", b"\xfe", b"k\x80", b"k\x81"];
        for value in values {
            let header = [("x-api-key", value)];
            let (response, body) = served.get_bytes("/", &header).await;
            assert_eq!(response.status(), StatusCode::OK, "{value:?}: {body}");
            let (response, _) = served.get_bytes("/", &header).await;
            assert_eq!(
                response.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "{value:?}: the limit holds"
            );
        }
    }
}

/// A per-client limit of two requests behind a trusted proxy at 127.0.0.1, with
/// `ForwardedIp`'s default IPv6 grouping.
fn behind_proxy(backend: &Backend) -> Router {
    let limit = LimitLayer::builder(backend, PeriodConfig::new(2, Duration::from_secs(60)))
        .name("client")
        .key(ForwardedIp::from_strs(["127.0.0.1"]).unwrap())
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(limit)
}

#[tokio::test]
async fn ipv6_clients_behind_a_trusted_proxy_share_one_quota_per_64() {
    let redis = RedisServer::start();
    for backend in [Backend::in_process(), redis.backend()] {
        let served = Served::start(behind_proxy(&backend)).await;
        let xff = |client: &'static str| [("x-forwarded-for", client)];
        // Three addresses of one /64: two requests between them, then 429.
        for client in ["2001:db8:1:2::1", "[2001:db8:1:2::2]:4711"] {
            let (response, body) = served.get("/", &xff(client)).await;
            assert_eq!(response.status(), StatusCode::OK, "{client}: {body}");
        }
        let (response, _) = served.get("/", &xff("2001:db8:1:2:ffff:ffff:ffff:3")).await;
        assert_eq!(
            response.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "a third address of the same /64 shares its quota"
        );
        // Another /64 has its own quota.
        let (response, body) = served.get("/", &xff("2001:db8:1:3::1")).await;
        assert_eq!(response.status(), StatusCode::OK, "another /64: {body}");
        // An IPv4-mapped address is the IPv4 client.
        for _ in 0..2 {
            let (response, _) = served.get("/", &xff("::ffff:203.0.113.7")).await;
            assert_eq!(response.status(), StatusCode::OK);
        }
        let (response, _) = served.get("/", &xff("203.0.113.7")).await;
        assert_eq!(
            response.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "::ffff:203.0.113.7 is 203.0.113.7"
        );
    }
}
