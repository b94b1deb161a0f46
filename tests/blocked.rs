//! Listing what is blocked (issue 35, item 1): an operator sees which keys a limit
//! refuses now because of a block or a lockout (limit, key, until), on Redis and in
//! process, and a listing reads a small list kept beside the blocks, never the keyspace.

mod support;

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

use support::RedisServer;
use tower_redis_ratelimit::key::{ExtensionKey, HeaderKey, KeyExtractor, PeerIp, TaggedKey};
use tower_redis_ratelimit::limit::{ExtensionPlan, Plans};
use tower_redis_ratelimit::AdminError;
use tower_redis_ratelimit::DynamicLimits;
use tower_redis_ratelimit::LimitLayer;
use tower_redis_ratelimit::TokenBucketConfig;
use tower_redis_ratelimit::{Backend, Blocked, Limiter};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const MINUTE: Duration = Duration::from_secs(60);

/// A backend on `redis` from its URL (as a service builds one).
fn redis_backend(redis: &RedisServer) -> Backend {
    support::backend_builder()
        .redis_url(redis.url())
        .build()
        .unwrap()
}

/// The `(limit, key)` of each entry, in order.
fn named(listed: &[Blocked]) -> Vec<(String, String)> {
    listed
        .iter()
        .map(|b| {
            (
                b.limit.clone(),
                String::from_utf8_lossy(&b.key).into_owned(),
            )
        })
        .collect()
}

fn pair(limit: &str, key: &str) -> (String, String) {
    (limit.to_owned(), key.to_owned())
}

/// Whether `until` is `after` from now, give or take two seconds.
fn ends_in(until: SystemTime, after: Duration) -> bool {
    let expected = SystemTime::now() + after;
    let gap = match until.duration_since(expected) {
        Ok(later) => later,
        Err(earlier) => earlier.duration(),
    };
    gap < Duration::from_secs(2)
}

async fn list(limiter: &impl Limiter, max: usize) -> Vec<Blocked> {
    limiter
        .blocked(max)
        .expect("a built-in limiter lists")
        .await
        .expect("the list answers")
}

/// What a lockout listed in the background needs on Redis: a moment.
async fn listed_soon(limiter: &impl Limiter, key: &str) -> Vec<Blocked> {
    let start = std::time::Instant::now();
    loop {
        let listed = list(limiter, 100).await;
        if listed.iter().any(|b| b.key == key) {
            return listed;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{key} not listed 5 s after its lockout: {:?}",
            named(&listed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A block is listed with its limit and its end, a lockout too, a reset takes either
/// off the list, an ended block is not listed, and each limit lists its own.
async fn blocks_lockouts_resets_and_ends(backend: &Backend) {
    let api = PeriodLimiter::new(backend, "api", PeriodConfig::new(10, MINUTE)).unwrap();
    let other = PeriodLimiter::new(backend, "other", PeriodConfig::new(10, MINUTE)).unwrap();
    let login = PeriodLimiter::new(
        backend,
        "login",
        PeriodConfig::new(1, MINUTE).lockout(15 * MINUTE),
    )
    .unwrap();
    assert!(list(&api, 100).await.is_empty());

    // Blocked: listed at once, with the limit's name and the block's end.
    api.block(b"hdr:x-api-key:trap", 60 * MINUTE).unwrap().await;
    api.block(b"ip:203.0.113.7", 10 * MINUTE).unwrap().await;
    other.block(b"fn:elsewhere", MINUTE).unwrap().await;
    let listed = list(&api, 100).await;
    assert_eq!(
        named(&listed),
        [
            pair("api", "ip:203.0.113.7"),
            pair("api", "hdr:x-api-key:trap")
        ],
        "soonest end first, this limit's only"
    );
    assert!(ends_in(listed[0].until, 10 * MINUTE), "{listed:?}");
    assert!(ends_in(listed[1].until, 60 * MINUTE), "{listed:?}");
    assert_eq!(listed[0].value, None, "a limiter alone names no value");
    // Keys can be secrets: never in a `Debug`, of the entries or of the limiter.
    for shown in [format!("{listed:?}"), format!("{api:?}")] {
        assert!(
            !shown.contains("trap") && !shown.contains("203.0"),
            "{shown}"
        );
    }
    assert_eq!(
        named(&list(&other, 100).await),
        [pair("other", "fn:elsewhere")]
    );
    // At most `max`.
    assert_eq!(named(&list(&api, 1).await), [pair("api", "ip:203.0.113.7")]);
    assert!(list(&api, 0).await.is_empty());

    // Locked out by a refusal: listed (on Redis, moments after the refusal).
    assert!(login.check(b"alice", ONE).await.is_admitted());
    assert!(!login.check(b"alice", ONE).await.is_admitted());
    let listed = listed_soon(&login, "alice").await;
    assert_eq!(named(&listed), [pair("login", "alice")]);
    assert!(ends_in(listed[0].until, 15 * MINUTE), "{listed:?}");
    // Refusals while it runs list it once: still one entry, the same end.
    assert!(!login.check(b"alice", ONE).await.is_admitted());
    assert_eq!(list(&login, 100).await, listed);

    // A reset lifts a block and a lockout: off the list.
    api.reset(b"hdr:x-api-key:trap").unwrap().await;
    assert_eq!(
        named(&list(&api, 100).await),
        [pair("api", "ip:203.0.113.7")]
    );
    login.reset(b"alice").unwrap().await;
    assert!(list(&login, 100).await.is_empty());

    // An ended block is not listed. (A block of 1 s: still running when listed, however
    // busy the machine.)
    other
        .block(b"fn:brief", Duration::from_secs(1))
        .unwrap()
        .await;
    assert_eq!(
        named(&list(&other, 100).await),
        [pair("other", "fn:brief"), pair("other", "fn:elsewhere")]
    );
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(
        named(&list(&other, 100).await),
        [pair("other", "fn:elsewhere")]
    );
}

#[tokio::test]
async fn in_process() {
    blocks_lockouts_resets_and_ends(&Backend::in_process()).await;
}

#[tokio::test]
async fn on_redis() {
    let redis = RedisServer::start();
    blocks_lockouts_resets_and_ends(&redis_backend(&redis)).await;
    // The list on Redis: one sorted set per limit, whose writes drop the ended entries.
    assert_eq!(redis.cmd(&["TYPE", "ratelimit:blocked:period:api"]), "zset");
    assert_eq!(redis.cmd(&["ZCARD", "ratelimit:blocked:period:other"]), "2");
    let other = PeriodLimiter::new(
        &redis_backend(&redis),
        "other",
        PeriodConfig::new(10, MINUTE),
    )
    .unwrap();
    other.block(b"fn:later", MINUTE).unwrap().await;
    assert_eq!(
        redis.cmd(&["ZRANGE", "ratelimit:blocked:period:other", "0", "-1"]),
        "fn:elsewhere\nfn:later",
        "the ended `fn:brief` was dropped by the next write"
    );
}

/// Two instances: two backends on one Redis. A block through one, a lockout through
/// the other: both listed by either; a reset through one, gone for both.
#[tokio::test]
async fn a_second_instance_lists_the_first_ones_blocks() {
    let redis = RedisServer::start();
    let config = PeriodConfig::new(1, MINUTE).lockout(5 * MINUTE);
    let a = PeriodLimiter::new(&redis_backend(&redis), "login", config).unwrap();
    let b = PeriodLimiter::new(&redis.uncached_backend(), "login", config).unwrap();
    a.block(b"mallory", 60 * MINUTE).unwrap().await;
    assert_eq!(named(&list(&b, 100).await), [pair("login", "mallory")]);
    assert!(b.check(b"bob", ONE).await.is_admitted());
    assert!(!b.check(b"bob", ONE).await.is_admitted());
    listed_soon(&a, "bob").await;
    assert_eq!(
        named(&list(&a, 100).await),
        [pair("login", "bob"), pair("login", "mallory")]
    );
    b.reset(b"mallory").unwrap().await;
    assert_eq!(named(&list(&a, 100).await), [pair("login", "bob")]);
}

/// The cost of a listing does not grow with the keyspace: thousands of limited keys
/// (and the blocks of another limit) beside three blocks, and a listing is one
/// `ZRANGEBYSCORE` that reads at most `max` entries; never a `SCAN` or a `KEYS`.
#[tokio::test]
async fn a_listing_reads_the_list_alone() {
    let redis = RedisServer::start();
    let backend = redis_backend(&redis);
    let api = PeriodLimiter::new(&backend, "api", PeriodConfig::new(10, MINUTE)).unwrap();
    let other = PeriodLimiter::new(&backend, "other", PeriodConfig::new(10, MINUTE)).unwrap();
    for i in 0..2_000 {
        let decision = api.check(format!("user-{i}").as_bytes(), ONE).await;
        assert!(decision.is_admitted(), "{decision:?}");
    }
    for i in 0..50 {
        other
            .block(format!("o-{i}").as_bytes(), MINUTE)
            .unwrap()
            .await;
    }
    for key in ["user-1", "user-2", "user-3"] {
        api.block(key.as_bytes(), MINUTE).unwrap().await;
    }
    let keys: usize = redis.cmd(&["DBSIZE"]).parse().unwrap();
    assert!(keys > 2_000, "{keys} keys");

    assert_eq!(redis.cmd(&["CONFIG", "RESETSTAT"]), "OK");
    assert_eq!(list(&api, 2).await.len(), 2);
    assert_eq!(list(&api, 100).await.len(), 3);
    let stats = redis.cmd(&["INFO", "commandstats"]);
    for never in ["cmdstat_scan:", "cmdstat_keys:", "cmdstat_zscan:"] {
        assert!(!stats.contains(never), "{never} in:\n{stats}");
    }
    assert_eq!(redis.command_calls("zrangebyscore"), 2, "{stats}");
    let commands: Vec<&str> = stats
        .lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| line.split(':').next())
        // (The change subscription's `PING` every second; the test's own commands.)
        .filter(|command| !matches!(*command, "config|resetstat" | "config" | "info" | "ping"))
        .collect();
    assert_eq!(commands, ["zrangebyscore"], "{stats}");
}

/// A listing while Redis does not answer is an error, never a panic or a guess.
#[tokio::test]
async fn a_listing_without_redis_is_an_error() {
    let backend = support::backend_builder()
        .redis_url("redis://127.0.0.1:1")
        .build()
        .unwrap();
    let api = PeriodLimiter::new(&backend, "api", PeriodConfig::new(10, MINUTE)).unwrap();
    let error = api.blocked(10).unwrap().await.unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("the blocked keys could not be listed: "),
        "{error}"
    );
    let layer = LimitLayer::builder(&backend, PeriodConfig::new(10, MINUTE))
        .name("api")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
    let error = layer.blocked(10).await.unwrap_err();
    assert!(matches!(error, AdminError::Listing(_)), "{error:?}");
}

/// A list that another program wrote under its key: a listing says what Redis said (or
/// reads the ends it can), a block still blocks; never a panic.
#[tokio::test]
async fn a_damaged_list_is_an_error_never_a_panic() {
    let redis = RedisServer::start();
    let backend = redis_backend(&redis);
    let junk = PeriodLimiter::new(&backend, "junk", PeriodConfig::new(10, MINUTE)).unwrap();
    assert_eq!(
        redis.cmd(&["SET", "ratelimit:blocked:period:junk", "x"]),
        "OK"
    );
    let error = junk.blocked(10).unwrap().await.unwrap_err();
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
    // The block holds though its list cannot be written.
    let blocked = junk.block(b"k", MINUTE).unwrap().await;
    assert!(!blocked.is_admitted(), "{blocked:?}");
    assert!(!junk.check(b"k", ONE).await.is_admitted());

    let odd = PeriodLimiter::new(&backend, "odd", PeriodConfig::new(10, MINUTE)).unwrap();
    let list_key = "ratelimit:blocked:period:odd";
    assert_eq!(redis.cmd(&["ZADD", list_key, "1e300", "far"]), "1");
    assert_eq!(redis.cmd(&["ZADD", list_key, "inf", "farther"]), "1");
    // (A far end is listed where the platform's time holds it; `inf` is no time.)
    let listed = list(&odd, 10).await;
    assert!(listed.iter().all(|b| b.key == "far"), "{listed:?}");
}

#[derive(Clone, Debug)]
struct UserId(&'static str);

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Plan {
    Free,
    Paid,
}

/// Through a layer: each blocked key with the client's value its extractor names, for
/// every extractor and every kind of limit (a set, plans, a dynamic limit).
async fn values_sets_plans_and_dynamic_limits(backend: &Backend) {
    let api = LimitLayer::builder(backend, PeriodConfig::new(10, MINUTE))
        .name("api")
        .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
        .build()
        .unwrap();
    api.block_value("trap", MINUTE).await.unwrap();
    api.block_value("a:b", 2 * MINUTE).await.unwrap();
    api.limiter()
        .block(b"ip:198.51.100.1", 3 * MINUTE)
        .unwrap()
        .await;
    api.limiter()
        .block(b"ip:2001:db8:1:2::/64", 4 * MINUTE)
        .unwrap()
        .await;
    api.limiter().block(b"fn:other", 5 * MINUTE).unwrap().await;
    let listed = api.blocked(100).await.unwrap();
    let values: Vec<(String, Option<String>)> = listed
        .iter()
        .map(|b| {
            let text = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
            (text(&b.key), b.value.as_deref().map(text))
        })
        .collect();
    assert_eq!(
        values,
        [
            ("hdr:x-api-key:trap".into(), Some("trap".into())),
            ("hdr:x-api-key:a:b".into(), Some("a:b".into())),
            ("ip:198.51.100.1".into(), Some("198.51.100.1".into())),
            // An IPv6 client's /64: named by the network (any address in it names it too).
            (
                "ip:2001:db8:1:2::/64".into(),
                Some("2001:db8:1:2::/64".into())
            ),
            // A key this layer never counts: no value names it.
            ("fn:other".into(), None),
        ]
    );

    let user = || ExtensionKey::<UserId>::new().tag("user");
    let set = LimitLayer::builder(
        backend,
        LimitSet::new()
            .requests("rpm", PeriodConfig::new(60, MINUTE))
            .limit("tpm", PeriodConfig::new(20_000, MINUTE)),
    )
    .name("llm")
    .key(user())
    .build()
    .unwrap();
    set.block_value("carol", MINUTE).await.unwrap();
    let listed = set.blocked(100).await.unwrap();
    assert_eq!(named(&listed), [pair("llm", "ext:user:carol")]);
    assert_eq!(listed[0].value.as_ref().unwrap(), "carol");

    let plans = Plans::new(ExtensionPlan::<Plan>::new())
        .plan(Plan::Free, "free", PeriodConfig::new(10, MINUTE))
        .plan(Plan::Paid, "paid", PeriodConfig::new(100, MINUTE));
    let per_plan = LimitLayer::builder(backend, plans)
        .name("profile")
        .key(user())
        .build()
        .unwrap();
    per_plan.block_value("dave", MINUTE).await.unwrap();
    // Written under every plan, listed once (under the plan whose block ends last).
    let listed = per_plan.blocked(100).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key, "ext:user:dave");
    assert!(listed[0].limit.starts_with("profile."), "{listed:?}");
    assert_eq!(per_plan.blocked(1).await.unwrap().len(), 1);

    let source = |_: TaggedKey<'_>| async { Ok::<_, Infallible>(Some(3)) };
    let dynamic = LimitLayer::builder(
        backend,
        DynamicLimits::new(PeriodConfig::new(10, MINUTE), source),
    )
    .name("dyn")
    .key(user())
    .build()
    .unwrap();
    dynamic.block_value("erin", MINUTE).await.unwrap();
    let listed = dynamic.blocked(100).await.unwrap();
    assert_eq!(named(&listed), [pair("dyn", "ext:user:erin")]);
    dynamic.reset_value("erin").await.unwrap();
    assert!(dynamic.blocked(100).await.unwrap().is_empty());

    // A set built as a limiter lists under its own name too.
    let pair_set = SetLimiter::new(
        backend,
        "pair",
        LimitSet::new()
            .limit(
                "burst",
                TokenBucketConfig::new(2, Duration::from_secs(1), 2),
            )
            .limit("daily", PeriodConfig::new(10, 24 * 60 * MINUTE)),
    )
    .unwrap();
    pair_set.block(b"m1", MINUTE).unwrap().await;
    assert_eq!(named(&list(&pair_set, 10).await), [pair("pair", "m1")]);
}

#[tokio::test]
async fn through_layers_in_process() {
    values_sets_plans_and_dynamic_limits(&Backend::in_process()).await;
}

#[tokio::test]
async fn through_layers_on_redis() {
    let redis = RedisServer::start();
    values_sets_plans_and_dynamic_limits(&redis_backend(&redis)).await;
}

/// On Redis Cluster each list is a key of its own, outside every hash tag (a slot of
/// its own): the blocks of keys in every slot are listed, by a second instance too.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cluster() {
    let cluster = support::RedisCluster::start(3);
    let backend = || {
        support::backend_builder()
            .redis_cluster_urls(cluster.urls())
            .build()
            .unwrap()
    };
    let config = PeriodConfig::new(1, MINUTE).lockout(5 * MINUTE);
    let a = PeriodLimiter::new(&backend(), "login", config).unwrap();
    let b = PeriodLimiter::new(&backend(), "login", config).unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("user-{i}")).collect();
    for key in &keys {
        a.block(key.as_bytes(), 60 * MINUTE).unwrap().await;
    }
    assert!(b.check(b"bob", ONE).await.is_admitted());
    assert!(!b.check(b"bob", ONE).await.is_admitted());
    listed_soon(&a, "bob").await;
    let mut listed: Vec<String> = list(&b, 100)
        .await
        .iter()
        .map(|b| String::from_utf8_lossy(&b.key).into_owned())
        .collect();
    listed.sort();
    let mut expected = keys.clone();
    expected.push("bob".to_owned());
    expected.sort();
    assert_eq!(listed, expected);
    a.reset(b"user-3").unwrap().await;
    assert_eq!(list(&b, 100).await.len(), 20);
}
