//! Sets of limits decided all or nothing, against a real `redis-server` (and a Redis
//! Cluster): one script call per decision, a refusal by any limit leaves every limit's
//! stored state untouched, concurrent checks never admit more than each limit allows,
//! and every limit is listed in the headers.

mod support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use support::http::Served;
use support::RedisServer;
use tokio::task::JoinSet;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::PeriodConfig;
use tower_redis_ratelimit::RollingConfig;
use tower_redis_ratelimit::{LimitConfig, LimitSet, SetLimiter};

/// The most limits in one set (documented on `SetLimiter::new`).
const MAX_LIMITS: usize = 8;
use tower_redis_ratelimit::LimitLayer;
use tower_redis_ratelimit::TokenBucketConfig;
use tower_redis_ratelimit::{Backend, ConfigError, Limiter, Source};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const SEC: Duration = Duration::from_secs(1);
const DAY: Duration = Duration::from_secs(86_400);

/// 2 per second (token bucket, burst 2) and 3 per day (fixed window).
fn burst_and_daily() -> LimitSet {
    LimitSet::new()
        .limit("burst", TokenBucketConfig::new(2, SEC, 2))
        .limit("daily", PeriodConfig::new(3, DAY))
}

#[tokio::test]
async fn one_script_call_per_decision_and_a_refusal_spends_nothing() {
    let redis = RedisServer::start();
    let backend = redis.uncached_backend();
    backend.warm_up().await.unwrap();
    let set = LimitSet::new()
        .limit("burst", PeriodConfig::new(2, 60 * SEC))
        .limit("daily", PeriodConfig::new(3, DAY));
    let limiter = SetLimiter::new(&backend, "reports", set).unwrap();
    // The first call loads the script (`NOSCRIPT`, then `EVALSHA` again).
    limiter.check(b"warm-up", ONE).await;
    let before = redis.command_calls("evalsha");
    let mut admitted = 0;
    for _ in 0..5 {
        let decision = limiter.check(b"m1", ONE).await;
        assert_eq!(decision.source, Source::Redis, "{decision:?}");
        admitted += usize::from(decision.is_admitted());
    }
    assert_eq!(admitted, 2, "the burst admits two a minute");
    assert_eq!(
        redis.command_calls("evalsha") - before,
        5,
        "one call per decision"
    );
    // The three refusals by the burst did not touch the daily count.
    let burst = "ratelimit:{v1:m1}:set:7:reports:period:burst";
    let daily = "ratelimit:{v1:m1}:set:7:reports:period:daily";
    assert_eq!(redis.cmd(&["GET", burst]), "2");
    assert_eq!(redis.cmd(&["GET", daily]), "2");
    // A refusal by the daily limit leaves the burst as it was.
    redis.cmd(&["SET", burst, "0", "PX", "60000"]);
    redis.cmd(&["SET", daily, "3", "PX", "60000"]);
    let refused = limiter.check(b"m1", ONE).await;
    assert!(!refused.is_admitted(), "{refused:?}");
    assert_eq!(redis.cmd(&["GET", burst]), "0");
    assert_eq!(redis.cmd(&["GET", daily]), "3");
}

/// 50 concurrent checks of one key, twice, on Redis and in process: no limit of the set
/// ever admits more than it allows, and only admitted requests are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_never_admit_more_than_each_limit() {
    let redis = RedisServer::start();
    for backend in [redis.uncached_backend(), Backend::in_process()] {
        // First round: the rolling window (5 a second) is the tighter limit. Second
        // round, a second later: the fixed window (7 a day) has 2 left, if and only if
        // the first round's 45 refusals were not counted.
        let set = LimitSet::new()
            .limit("daily", PeriodConfig::new(7, DAY))
            .limit(
                "rolling",
                RollingConfig::new(5, 10, Duration::from_millis(100)),
            );
        let limiter = Arc::new(SetLimiter::new(&backend, "c", set).unwrap());
        let mut rounds = Vec::new();
        for round in 0..2 {
            if round == 1 {
                tokio::time::sleep(Duration::from_millis(1_100)).await;
            }
            let mut tasks = JoinSet::new();
            for _ in 0..50 {
                let limiter = Arc::clone(&limiter);
                tasks.spawn(async move { limiter.check(b"k", ONE).await });
            }
            let mut admitted = 0;
            while let Some(decision) = tasks.join_next().await {
                admitted += usize::from(decision.unwrap().is_admitted());
            }
            rounds.push(admitted);
        }
        assert_eq!(rounds, [5, 2], "{backend:?}");
    }
}

/// The engine packs an admit's reply into one number when its values fit (`fast.lua`);
/// limits whose counts and times do not fit (a quota of 2^40 over a year, the largest
/// burst refilled over a year) get the table instead, one limit or a set, and decide as
/// the in-process host does.
#[tokio::test]
async fn replies_too_large_to_pack_decide_alike() {
    let redis = RedisServer::start();
    let year = 365 * DAY;
    let huge = PeriodConfig::new(1 << 40, year);
    let bucket = TokenBucketConfig::new(u32::MAX.into(), year, u32::MAX.into());
    let mut answers = Vec::new();
    for backend in [redis.uncached_backend(), Backend::in_process()] {
        let single = tower_redis_ratelimit::PeriodLimiter::new(&backend, "huge", huge).unwrap();
        let set = LimitSet::new().limit("huge", huge).limit("bucket", bucket);
        let set = SetLimiter::new(&backend, "pair", set).unwrap();
        let mut seen = Vec::new();
        for cost in [1, 5, 1_000_000] {
            let cost = NonZeroU32::new(cost).unwrap();
            for decision in [single.check(b"k", cost).await, set.check(b"k", cost).await] {
                assert_ne!(decision.source, Source::Fallback, "{decision:?}");
                seen.push((decision.state, decision.remaining, decision.reset));
            }
        }
        answers.push(seen);
    }
    for (i, (redis, local)) in answers[0].iter().zip(&answers[1]).enumerate() {
        assert_eq!(redis.0, local.0, "{answers:?}");
        if i % 2 == 0 {
            assert_eq!(redis.1, local.1, "{answers:?}");
        } else {
            // The set's bucket refills 136 tokens a second, and the hosts read their
            // clocks a moment apart (7 tokens: 50 ms on a busy machine).
            assert!(redis.1.abs_diff(local.1) <= 7, "{answers:?}");
        }
        // (The hosts read their clocks a moment apart.)
        assert!(redis.2.abs_diff(local.2) < 2 * SEC, "{answers:?}");
    }
    assert_eq!(answers[0][4].1, (1 << 40) - 1_000_006, "{answers:?}");
}

/// Every limit of a set is in `RateLimit-Policy` and `RateLimit`, in order, on admitted
/// and refused responses; `Retry-After` is the longest wait among the refusing limits.
#[tokio::test]
async fn every_limit_is_listed_in_the_headers() {
    let redis = RedisServer::start();
    for backend in [redis.uncached_backend(), Backend::in_process()] {
        let layer = LimitLayer::builder(
            &backend,
            LimitSet::new()
                .limit("burst", TokenBucketConfig::new(2, 10 * SEC, 2))
                .limit("daily", PeriodConfig::new(3, DAY)),
        )
        .name("reports")
        // (A token every 5 s: the three requests' seconds are the same however
        // busy the machine.)
        .key(HeaderKey::from_static("x-merchant-id"))
        .build()
        .unwrap();
        let app = Router::new().route("/reports", get(|| async { "report" }).layer(layer));
        let server = Served::start(app).await;
        let merchant = [("x-merchant-id", "m1")];
        let (first, _) = server.get("/reports", &merchant).await;
        assert_eq!(first.status(), 200);
        assert_eq!(
            first.headers()["ratelimit-policy"],
            "\"reports.burst\";q=2;w=10, \"reports.daily\";q=3;w=86400"
        );
        assert_eq!(
            first.headers()["ratelimit"],
            "\"reports.burst\";r=1;t=5, \"reports.daily\";r=2;t=86400"
        );
        let (second, _) = server.get("/reports", &merchant).await;
        assert_eq!(second.status(), 200);
        let (refused, _) = server.get("/reports", &merchant).await;
        assert_eq!(refused.status(), 429, "{backend:?}");
        assert_eq!(refused.headers()["retry-after"], "5");
        assert_eq!(
            refused.headers()["ratelimit"],
            "\"reports.burst\";r=0;t=10, \"reports.daily\";r=1;t=86400"
        );
    }
}

#[test]
fn invalid_sets_fail_when_built() {
    let backend = Backend::in_process();
    let build = |set: LimitSet| SetLimiter::new(&backend, "s", set).map(|_| ());
    assert!(matches!(
        build(LimitSet::new()),
        Err(ConfigError::Missing {
            setting: "limit",
            ..
        })
    ));
    assert!(matches!(
        build(
            LimitSet::new()
                .limit("a", PeriodConfig::new(1, SEC))
                .limit("a", PeriodConfig::new(2, SEC))
        ),
        Err(ConfigError::Conflict { .. })
    ));
    let mut many = LimitSet::new();
    for i in 0..=MAX_LIMITS {
        many = many.limit(format!("l{i}"), PeriodConfig::new(1, SEC));
    }
    assert!(matches!(build(many), Err(ConfigError::TooLarge { .. })));
    assert!(matches!(
        build(LimitSet::new().limit("a", PeriodConfig::new(0, SEC))),
        Err(ConfigError::Zero {
            setting: "quota",
            ..
        })
    ));
    assert!(matches!(
        build(LimitSet::new().limit("{a}", PeriodConfig::new(1, SEC))),
        Err(ConfigError::InvalidName { .. })
    ));
    assert!(build(burst_and_daily()).is_ok());
}

/// A blocked set says so for every limit (issue 35, item 3): its `429` lists each limit
/// with `r=0` and a reset no sooner than the block's end (`t=30` for the full rpm
/// bucket, the tpm window's own end for the minute), beside `Retry-After: 30`; before,
/// each limit said where it stood (`"llm.rpm";r=60;t=0, "llm.tpm";r=20000;t=60`), units
/// the block would not give. On Redis (the refusal from the engine, then the same from
/// the deny cache) and in process.
#[tokio::test]
async fn a_blocked_set_says_no_limit_has_units_left() {
    let redis = RedisServer::start();
    let minute = Duration::from_secs(60);
    let cached = redis.backend();
    for backend in [cached, Backend::in_process()] {
        let layer = LimitLayer::builder(
            &backend,
            LimitSet::new()
                .limit("rpm", TokenBucketConfig::new(60, minute, 60))
                .limit("tpm", PeriodConfig::new(20_000, minute)),
        )
        .name("llm")
        .key(HeaderKey::from_static("x-api-key"))
        .build()
        .unwrap();
        let blocked = layer
            .limiter()
            .block(b"hdr:x-api-key:trap", Duration::from_secs(30));
        blocked.expect("sets can be blocked").await;
        let app = Router::new().route("/v1/chat", get(|| async { "ok" }).layer(layer));
        let server = Served::start(app).await;
        let client = [("x-api-key", "trap")];
        for _ in 0..2 {
            let (refused, _) = server.get("/v1/chat", &client).await;
            assert_eq!(refused.status(), 429, "{backend:?}");
            assert_eq!(refused.headers()["retry-after"], "30", "{backend:?}");
            assert_eq!(
                refused.headers()["ratelimit"],
                "\"llm.rpm\";r=0;t=30, \"llm.tpm\";r=0;t=60",
                "{backend:?}"
            );
        }
    }
}

/// An admin sees every limit of a set, not the one decision the set's check would give
/// (issue 35, item 7): after a request of 500 tokens, a peek of one more says the rpm
/// bucket would have 58 left and the tpm window 19 499, on Redis and in process; the
/// set's own peek says the rpm limit's (the least left). Blocked, every limit says it
/// has nothing left.
#[tokio::test]
async fn an_admin_sees_where_the_key_stands_under_every_limit() {
    let redis = RedisServer::start();
    let minute = Duration::from_secs(60);
    for backend in [redis.uncached_backend(), Backend::in_process()] {
        let set = LimitSet::new()
            .requests("rpm", TokenBucketConfig::new(60, minute, 60))
            .limit("tpm", PeriodConfig::new(20_000, minute));
        let llm = SetLimiter::new(&backend, "llm", set).unwrap();
        let tokens = NonZeroU32::new(500).unwrap();
        assert!(llm.check(b"key-1", tokens).await.is_admitted());
        let each = llm.peek_limits(b"key-1", ONE).await;
        let left: Vec<_> = each.iter().map(|(p, d)| (p.name(), d.remaining)).collect();
        // (What a check of one more would leave.)
        assert_eq!(left, [("llm.rpm", 58), ("llm.tpm", 19_499)], "{backend:?}");
        let peek = llm.peek(b"key-1", ONE).unwrap().await;
        assert_eq!((peek.limit, peek.remaining), (60, 58), "{backend:?}");
        llm.block(b"key-1", Duration::from_secs(30)).unwrap().await;
        let each = llm.peek_limits(b"key-1", ONE).await;
        assert!(
            each.iter()
                .all(|(_, d)| d.remaining == 0 && !d.is_admitted()),
            "{backend:?}: {each:?}"
        );
    }
}

/// What each member of a set has left, as its `RateLimit` item says (`"<set>.<name>";r=<left>`).
fn items_left(header: &str) -> Vec<(String, u64)> {
    header
        .split(", ")
        .map(|item| {
            let (name, rest) = item.split_once(';').expect("an item");
            let left = rest
                .split(';')
                .find_map(|p| p.strip_prefix("r="))
                .expect("r=")
                .parse()
                .expect("a number");
            (name.trim_matches('"').to_owned(), left)
        })
        .collect()
}

/// After a set's refusal, its `RateLimit` header states every member's standing as it
/// is (issue 35, item 3): each member's `r` is what that member has left, as a peek of
/// each member finds right after, on both hosts; with each algorithm the member that
/// refuses in one set and a member that would admit in another; and while the key is
/// blocked (nothing left anywhere). Refills are one unit per 10 s or slower, so nothing
/// drips in between the refusal and the peek.
#[tokio::test]
async fn after_a_refusal_every_members_standing_is_true() {
    let redis = RedisServer::start();
    let bucket = |n: u32| TokenBucketConfig::new(n.into(), SEC * (10 * n), n.into());
    let window = |n: u64| PeriodConfig::new(n, 60 * SEC);
    let rolling = |n: u64| RollingConfig::new(n, 4, 15 * SEC);
    // Each algorithm refuses first in one of the sets.
    let sets: [(&str, [(&str, LimitConfig); 3]); 3] = [
        (
            "b",
            [
                ("bucket", bucket(3).into()),
                ("window", window(5).into()),
                ("rolling", rolling(7).into()),
            ],
        ),
        (
            "w",
            [
                ("window", window(3).into()),
                ("rolling", rolling(5).into()),
                ("bucket", bucket(7).into()),
            ],
        ),
        (
            "r",
            [
                ("rolling", rolling(3).into()),
                ("bucket", bucket(5).into()),
                ("window", window(7).into()),
            ],
        ),
    ];
    for backend in [redis.uncached_backend(), Backend::in_process()] {
        for (name, members) in &sets {
            let mut set = LimitSet::new();
            for (member, limit) in members {
                set = set.limit(*member, *limit);
            }
            let layer = LimitLayer::builder(&backend, set.clone())
                .name(*name)
                .key(HeaderKey::from_static("x-key"))
                .build()
                .unwrap();
            let handle = SetLimiter::new(&backend, name, set).unwrap();
            let app = Router::new().route("/", get(|| async { "ok" }).layer(layer));
            let server = Served::start(app).await;
            let client = [("x-key", "m1")];
            let stored = b"hdr:x-key:m1";
            let mut refusals = 0;
            for step in 0..12 {
                if step == 9 {
                    handle.block(stored, 60 * SEC).unwrap().await;
                }
                let (response, _) = server.get("/", &client).await;
                if response.status() != 429 {
                    continue;
                }
                refusals += 1;
                let said = items_left(response.headers()["ratelimit"].to_str().unwrap());
                let peeked = handle.peek_limits(stored, ONE).await;
                assert_eq!(said.len(), peeked.len());
                // A peek of one unit says what each member has left after it when the
                // whole set admits it; when a member refuses (or the key is blocked),
                // the others say where they stand, spending nothing.
                let set_admits = peeked.iter().all(|(_, d)| d.is_admitted());
                for ((item, left), (policy, decision)) in said.iter().zip(&peeked) {
                    assert_eq!(item, policy.name(), "{backend:?}");
                    let truth = decision.remaining + u64::from(set_admits);
                    assert_eq!(
                        *left, truth,
                        "{backend:?} set {name}, step {step}: {item} said r={left}, a peek \
                         finds {decision:?}"
                    );
                }
            }
            assert_eq!(
                refusals, 9,
                "{backend:?} set {name}: 3 admitted, then refused"
            );
        }
    }
}
