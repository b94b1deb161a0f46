//! The fixed-window limiter against a real `redis-server` started by the harness.

mod support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use support::RedisServer;
use tower_redis_ratelimit::RedisState;
use tower_redis_ratelimit::{Backend, Limiter, Source, State};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter, UtcOffset};

const ONE: NonZeroU32 = NonZeroU32::MIN;

fn limiter(backend: &Backend, config: PeriodConfig) -> PeriodLimiter {
    PeriodLimiter::new(backend, "test", config).expect("valid config")
}

async fn states(limiter: &PeriodLimiter, key: &str, n: usize) -> Vec<State> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(limiter.check(key.as_bytes(), ONE).await.state);
    }
    out
}

#[tokio::test]
async fn quota_five_gives_four_allowed_one_hit_quota_then_over_quota() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let limiter = limiter(&backend, PeriodConfig::new(5, Duration::from_secs(60)));
    use State::*;
    assert_eq!(
        states(&limiter, "phone", 7).await,
        [Allowed, Allowed, Allowed, Allowed, HitQuota, OverQuota, OverQuota]
    );
    // Redis refused the key until the window ends: the deny cache answers now.
    let over = limiter.check(b"phone", ONE).await;
    assert_eq!(over.source, Source::DenyCache);
    assert_eq!(over.state, OverQuota);
    assert_eq!(over.remaining, 0);
    let retry = over.retry_after.expect("over quota has a retry-after");
    assert!(retry > Duration::from_secs(58) && retry <= Duration::from_secs(60));
    // The state lives in Redis: one key, holding the admitted count, with an expiry.
    assert_eq!(redis.cmd(&["GET", "ratelimit:{v1:phone}:period:test"]), "5");
    let pttl: i64 = redis
        .cmd(&["PTTL", "ratelimit:{v1:phone}:period:test"])
        .parse()
        .unwrap();
    assert!(pttl > 58_000 && pttl <= 60_000, "pttl {pttl}");
    // Another key is unaffected.
    assert_eq!(limiter.check(b"other", ONE).await.state, Allowed);
}

#[tokio::test]
async fn quota_one_is_hit_quota_at_once() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        PeriodConfig::new(1, Duration::from_secs(10)),
    );
    assert_eq!(
        states(&limiter, "k", 3).await,
        [State::HitQuota, State::OverQuota, State::OverQuota]
    );
}

#[tokio::test]
async fn window_resets_after_expiry_with_sub_second_periods() {
    let redis = RedisServer::start();
    // (900 ms, still under a second: the four checks below must fall in one window, and
    // a busy CI machine took longer than the 150 ms this was.)
    let period = Duration::from_millis(900);
    let limiter = limiter(&redis.backend(), PeriodConfig::new(2, period));
    assert_eq!(
        states(&limiter, "k", 3).await,
        [State::Allowed, State::HitQuota, State::OverQuota]
    );
    let over = limiter.check(b"k", ONE).await;
    let wait = over.retry_after.unwrap();
    assert!(wait <= period, "{wait:?}");
    tokio::time::sleep(wait + Duration::from_millis(20)).await;
    let fresh = limiter.check(b"k", ONE).await;
    assert_eq!(fresh.state, State::Allowed);
    assert_eq!(fresh.remaining, 1);
}

#[tokio::test]
async fn aligned_windows_end_on_the_zone_boundary() {
    let (redis, clock) = RedisServer::start_with_clock();
    let backend = redis.backend();
    let day = Duration::from_secs(86_400);
    let limiter = PeriodLimiter::new(
        &backend,
        "daily",
        PeriodConfig::new(5, day).align(UtcOffset::from_hours(8)),
    )
    .unwrap();
    let first = limiter.check(b"phone", ONE).await;
    // The key expires at an absolute deadline: midnight in UTC+8.
    let expires = expire_time_ms(&redis, "ratelimit:{v1:phone}:period:daily");
    let deadline_ms = expires
        .clone()
        .find(|ms| (ms + 8 * 3_600_000) % 86_400_000 == 0)
        .unwrap_or_else(|| panic!("no midnight in UTC+8 in {expires:?}"));
    let now_ms = redis_now_ms(&redis);
    let expected = Duration::from_millis(u64::try_from(deadline_ms - now_ms).unwrap());
    let diff = first.reset.abs_diff(expected);
    assert!(
        diff < Duration::from_secs(2),
        "{:?} vs {expected:?}",
        first.reset
    );

    // A short aligned period: windows end on multiples of 2 s, shifted by the offset
    // (so on odd seconds). The server's clock is frozen on the next even second, in the
    // middle of a window: on real time the key could expire between the check and its
    // `PTTL` (now and then on a busy machine).
    let mid_window_ms = (redis_now_ms(&redis) / 2_000 + 1) * 2_000;
    clock.freeze_at(mid_window_ms * 1_000);
    let short = PeriodLimiter::new(
        &backend,
        "short",
        PeriodConfig::new(3, Duration::from_secs(2)).align(UtcOffset::from_seconds(1)),
    )
    .unwrap();
    short.check(b"k", ONE).await;
    let expires = expire_time_ms(&redis, "ratelimit:{v1:k}:period:short");
    assert!(
        expires.clone().any(|ms| (ms + 1_000) % 2_000 == 0),
        "no end of a 2 s window shifted by 1 s in {expires:?}"
    );
}

/// When a key expires (ms since the Unix epoch) as the server says, within the
/// milliseconds of three round trips: its `PTTL` between two `TIME`s, each its own
/// command, so the server's clock for the `PTTL` lies between the two readings. Redis 6.2
/// has no `PEXPIRETIME`.
fn expire_time_ms(redis: &RedisServer, key: &str) -> std::ops::RangeInclusive<i64> {
    let before = redis_now_ms(redis);
    let ttl: i64 = redis.cmd(&["PTTL", key]).parse().unwrap();
    let after = redis_now_ms(redis);
    assert!(ttl >= 0, "{key}: PTTL {ttl}");
    before + ttl..=after + ttl
}

fn redis_now_ms(redis: &RedisServer) -> i64 {
    let time = redis.cmd(&["TIME"]);
    let mut parts = time.lines();
    let secs: i64 = parts.next().unwrap().parse().unwrap();
    let micros: i64 = parts.next().unwrap().parse().unwrap();
    secs * 1_000 + micros / 1_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_one_key_admit_exactly_the_quota() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let limiter = Arc::new(limiter(
        &backend,
        PeriodConfig::new(25, Duration::from_secs(60)),
    ));
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.check(b"hot", ONE).await })
        })
        .collect();
    let mut admitted = 0;
    let mut hit_quota = 0;
    for task in tasks {
        let decision = task.await.unwrap();
        assert!(
            matches!(decision.source, Source::Redis | Source::DenyCache),
            "{decision:?}"
        );
        admitted += usize::from(decision.is_admitted());
        hit_quota += usize::from(decision.state == State::HitQuota);
    }
    assert_eq!(admitted, 25);
    assert_eq!(hit_quota, 1);
}

#[tokio::test]
async fn two_instances_sharing_redis_admit_the_quota_once() {
    let redis = RedisServer::start();
    // Two processes' worth of state: separate pools, backends and limiters.
    let a = limiter(
        &redis.backend(),
        PeriodConfig::new(4, Duration::from_secs(60)),
    );
    let b = limiter(
        &redis.backend(),
        PeriodConfig::new(4, Duration::from_secs(60)),
    );
    let mut admitted = 0;
    for i in 0..10 {
        let instance = if i % 2 == 0 { &a } else { &b };
        admitted += usize::from(instance.check(b"shared", ONE).await.is_admitted());
    }
    assert_eq!(admitted, 4);
}

#[tokio::test]
async fn weighted_costs_and_costs_beyond_the_quota() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        PeriodConfig::new(10, Duration::from_secs(60)),
    );
    let cost = |n| NonZeroU32::new(n).unwrap();
    assert_eq!(limiter.check(b"k", cost(6)).await.remaining, 4);
    // Too much for what is left: rejected, and not counted.
    let over = limiter.check(b"k", cost(5)).await;
    assert_eq!(over.state, State::OverQuota);
    assert_eq!(over.remaining, 4);
    assert_eq!(limiter.check(b"k", cost(4)).await.state, State::HitQuota);
    // More than the whole quota can never pass, and says so without a retry-after.
    let never = limiter.check(b"fresh", cost(11)).await;
    assert_eq!(never.state, State::ExceedsCapacity);
    assert_eq!(never.retry_after, None);
}

#[tokio::test]
async fn script_flush_mid_traffic_is_invisible() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        PeriodConfig::new(3, Duration::from_secs(60)),
    );
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    redis.flush_scripts();
    let d = limiter.check(b"k", ONE).await;
    assert_eq!(
        d.source,
        Source::Redis,
        "NOSCRIPT must reload, not fall back"
    );
    assert_eq!(d.remaining, 1);
}

#[tokio::test]
async fn a_counter_without_expiry_starts_a_new_window() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        PeriodConfig::new(3, Duration::from_secs(60)),
    );
    // Someone wrote the key without an expiry: it must not lock the key out forever.
    redis.cmd(&["SET", "ratelimit:{v1:k}:period:test", "99"]);
    let d = limiter.check(b"k", ONE).await;
    assert_eq!(d.state, State::Allowed);
    assert_eq!(d.remaining, 2);
    let pttl: i64 = redis
        .cmd(&["PTTL", "ratelimit:{v1:k}:period:test"])
        .parse()
        .unwrap();
    assert!(pttl > 0);
}

#[tokio::test]
async fn unreachable_redis_is_answered_by_the_fallback() {
    let mut redis = RedisServer::start();
    let pool = redis.pool();
    let backend = support::backend_builder()
        .redis(pool)
        // (A killed server refuses at once: the deadline is not what is tested, and the
        // checks before the kill and after the restart, which connect and load the engine,
        // must not miss it on a busy machine.)
        .call_timeout(support::CALL_TIMEOUT)
        .probe_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let limiter = limiter(&backend, PeriodConfig::new(2, Duration::from_secs(60)));
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    redis.kill();
    let d = limiter.check(b"k", ONE).await;
    assert_eq!(d.source, Source::Fallback);
    // One failed call is answered by the fallback; it takes more to open the breaker.
    assert_eq!(backend.redis_state(), Some(RedisState::Healthy));
    let d = limiter.check(b"k", ONE).await;
    assert_eq!(d.source, Source::Fallback);
    assert_eq!(d.state, State::HitQuota);
    assert_eq!(limiter.check(b"k", ONE).await.state, State::OverQuota);
    redis.restart();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while backend.redis_state() != Some(RedisState::Healthy) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "probe never recovered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
}

#[tokio::test]
async fn a_flood_on_a_refused_key_is_answered_by_the_deny_cache() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        PeriodConfig::new(3, Duration::from_secs(60)),
    );
    let mut admitted = 0;
    for _ in 0..1_000 {
        admitted += usize::from(limiter.check(b"hot", ONE).await.is_admitted());
    }
    assert_eq!(admitted, 3);
    // Three admitted, one refusal from Redis, then the cache until the window ends (the
    // script is loaded with the connection, so no EVALSHA meets NOSCRIPT).
    assert_eq!(redis.command_calls("evalsha"), 4);
    // Bigger costs are refused by the cache too; other keys still ask Redis.
    let d = limiter.check(b"hot", NonZeroU32::new(2).unwrap()).await;
    assert_eq!(d.source, Source::DenyCache);
    assert_eq!(limiter.check(b"cold", ONE).await.source, Source::Redis);
}

#[tokio::test]
async fn without_the_deny_cache_every_check_asks_redis() {
    let redis = RedisServer::start();
    let backend = redis.uncached_backend();
    let limiter = limiter(&backend, PeriodConfig::new(1, Duration::from_secs(60)));
    for _ in 0..10 {
        assert_eq!(limiter.check(b"hot", ONE).await.source, Source::Redis);
    }
    assert_eq!(
        redis.command_calls("evalsha"),
        10,
        "the script was loaded with the connection"
    );
}

#[tokio::test]
async fn refusals_of_larger_costs_are_not_cached() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        PeriodConfig::new(5, Duration::from_secs(60)),
    );
    assert!(limiter
        .check(b"k", NonZeroU32::new(4).unwrap())
        .await
        .is_admitted());
    // Cost 2 does not fit, but cost 1 still does: that refusal must not be cached.
    let refused = limiter.check(b"k", NonZeroU32::new(2).unwrap()).await;
    assert_eq!(refused.state, State::OverQuota);
    let one = limiter.check(b"k", ONE).await;
    assert_eq!(one.state, State::HitQuota);
    assert_eq!(one.source, Source::Redis);
}

#[tokio::test]
async fn one_redis_command_per_decision() {
    let redis = RedisServer::start();
    let backend = redis.uncached_backend();
    let limiter = limiter(&backend, PeriodConfig::new(1_000, Duration::from_secs(60)));
    let calls = |name: &str| redis.command_calls(name);
    let pings_before = calls("ping");
    for i in 0..50 {
        limiter.check(format!("k{}", i % 5).as_bytes(), ONE).await;
    }
    // The engine is loaded once, with the connection, in one round trip: the library of
    // functions where the server has them (unless the EVALSHA path is forced), and its
    // script (while the backend's first connection does not know yet whether the server
    // has Functions, the script is sent beside the library, so that a server without
    // them needs no second round trip); then one FCALL or EVALSHA per check, and no PING
    // or UNWATCH from checking connections out of the pool.
    assert_eq!(calls("evalsha"), 50);
    assert_eq!(
        calls("function|load"),
        u64::from(redis.runs_functions()),
        "{}",
        redis.version()
    );
    assert_eq!(calls("script|load"), 1);
    assert_eq!(calls("ping"), pings_before);
    assert_eq!(calls("unwatch"), 0);
}

// ---------------------------------------------------------------------------
// Clock steps
// ---------------------------------------------------------------------------

const HOUR_US: i64 = 3_600_000_000;

/// The Redis server's clock steps back an hour: the count is kept (nothing more is
/// admitted) and the window ends within one period, not an hour and a period later; a
/// step forward at most ends the window early.
#[tokio::test]
async fn a_step_of_the_redis_clock_keeps_the_count_and_bounds_the_window() {
    let (redis, clock) = RedisServer::start_with_clock();
    let backend = redis.uncached_backend();
    let limiter = limiter(&backend, PeriodConfig::new(5, Duration::from_secs(10)));
    assert_eq!(
        states(&limiter, "k", 6).await.last(),
        Some(&State::OverQuota)
    );
    clock.step_us(-HOUR_US);
    for _ in 0..3 {
        let over = limiter.check(b"k", ONE).await;
        assert_eq!(over.state, State::OverQuota);
        assert!(
            over.reset <= Duration::from_secs(10),
            "reset {:?}",
            over.reset
        );
    }
    clock.step_us(2 * HOUR_US);
    let after = states(&limiter, "k", 6).await;
    assert_eq!(
        after.iter().filter(|s| s.is_admitted()).count(),
        5,
        "{after:?}"
    );
}

/// In-process, time is tokio's monotonic clock: a jump forward ends the window.
#[tokio::test(start_paused = true)]
async fn in_process_a_jump_forward_at_most_ends_the_window_early() {
    let limiter = limiter(
        &Backend::in_process(),
        PeriodConfig::new(5, Duration::from_secs(10)),
    );
    assert_eq!(
        states(&limiter, "k", 6).await.last(),
        Some(&State::OverQuota)
    );
    tokio::time::advance(Duration::from_secs(3_600)).await;
    let after = states(&limiter, "k", 6).await;
    assert_eq!(
        after.iter().filter(|s| s.is_admitted()).count(),
        5,
        "{after:?}"
    );
}

// ---------------------------------------------------------------------------
// Bounded in-process state
// ---------------------------------------------------------------------------

/// A flood of new keys through a full in-process state neither grows it past the bound
/// nor resets a key that is being limited (it is hit again and again, so it stays).
#[tokio::test(start_paused = true)]
async fn a_flood_of_new_keys_does_not_reset_a_limited_key() {
    let backend = support::backend_builder()
        .max_local_keys(1_000)
        .build()
        .unwrap();
    let limiter = limiter(&backend, PeriodConfig::new(5, Duration::from_secs(60)));
    assert_eq!(
        states(&limiter, "k", 6).await.last(),
        Some(&State::OverQuota)
    );
    for i in 0..20_000 {
        assert!(limiter
            .check(format!("flood-{i}").as_bytes(), ONE)
            .await
            .is_admitted());
        if i % 50 == 0 {
            assert_eq!(
                limiter.check(b"k", ONE).await.state,
                State::OverQuota,
                "{i}"
            );
        }
    }
}

/// Every key dropped to make room is counted, by backend prefix.
#[cfg(feature = "metrics")]
#[tokio::test(start_paused = true)]
async fn evictions_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    const LOCAL_EVICTIONS_TOTAL: &str = "ratelimit_local_evictions_total";

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let backend = support::backend_builder()
        .prefix("flooded")
        .max_local_keys(100)
        .build()
        .unwrap();
    let limiter = limiter(&backend, PeriodConfig::new(5, Duration::from_secs(60)));
    for i in 0..1_000 {
        let _ = limiter.check(format!("k{i}").as_bytes(), ONE).await;
    }
    let evictions: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == LOCAL_EVICTIONS_TOTAL)
        .collect();
    assert_eq!(evictions.len(), 1, "{evictions:?}");
    let (key, _, _, value) = &evictions[0];
    let labels: Vec<String> = key
        .key()
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    assert_eq!(labels, ["prefix=flooded"]);
    let DebugValue::Counter(count) = value else {
        panic!("{value:?}");
    };
    assert!((900..=1_000).contains(count), "{count}");
}

/// Concurrent checks on one new key in-process (the first insert races) admit exactly
/// the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_process_concurrent_checks_on_a_new_key_admit_exactly_the_quota() {
    for round in 0..20 {
        let limiter = Arc::new(limiter(
            &Backend::in_process(),
            PeriodConfig::new(50, Duration::from_secs(60)),
        ));
        let key = format!("new-{round}");
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                let key = key.clone();
                tokio::spawn(async move {
                    let mut admitted = 0u32;
                    for _ in 0..40 {
                        admitted +=
                            u32::from(limiter.check(key.as_bytes(), ONE).await.is_admitted());
                    }
                    admitted
                })
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            admitted += task.await.unwrap();
        }
        assert_eq!(admitted, 50, "round {round}");
    }
}

/// The engine's two paths: Redis Functions where the server has them (Redis 7 and later:
/// `FUNCTION LOAD` once, then `FCALL`), `EVALSHA` when the backend is told so (the path
/// of servers without functions); both decide alike, and a flushed library is loaded
/// again.
#[tokio::test]
async fn the_engine_runs_as_functions_on_redis_7_and_by_evalsha_when_told() {
    let redis = RedisServer::start();
    let calls = |command: &str| {
        let prefix = format!("cmdstat_{command}:calls=");
        redis
            .cmd(&["INFO", "commandstats"])
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()).map(str::to_owned))
            .and_then(|rest| rest.split(',').next().map(str::to_owned))
            .map_or(0, |calls| calls.parse::<u64>().unwrap())
    };
    let version = redis.cmd(&["INFO", "server"]);
    let major: u32 = version
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    let config = PeriodConfig::new(3, Duration::from_secs(60));
    let functions = limiter(
        &support::backend_builder()
            .redis_url(redis.url())
            .engine_functions(true)
            .deny_cache(0)
            // Under load a first call (connecting, loading the library) may take longer
            // than the default 100 ms, and the fallback would answer it.
            .call_timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        config,
    );
    let evalsha = limiter(
        &support::backend_builder()
            .redis_url(redis.url())
            .engine_functions(false)
            .deny_cache(0)
            .call_timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        config,
    );
    // The first check connects (and loads the library), the next ones use it.
    assert!(functions.check(b"f", ONE).await.is_admitted());
    let (fcall, eval) = (calls("fcall"), calls("evalsha"));
    assert!(functions.check(b"f", ONE).await.is_admitted());
    let d = functions.check(b"f", ONE).await;
    assert_eq!((d.is_admitted(), d.remaining), (true, 0));
    assert!(!functions.check(b"f", ONE).await.is_admitted());
    if major >= 7 {
        assert_eq!(calls("fcall") - fcall, 3);
        assert_eq!(calls("evalsha"), eval);
    }
    // By EVALSHA, the same decisions.
    let fcall = calls("fcall");
    for remaining in [2, 1, 0] {
        let d = evalsha.check(b"e", ONE).await;
        assert_eq!((d.is_admitted(), d.remaining), (true, remaining));
    }
    assert!(!evalsha.check(b"e", ONE).await.is_admitted());
    assert_eq!(calls("fcall"), fcall);
    // A flushed library is loaded again by the next check.
    redis.flush_scripts();
    let d = functions.check(b"g", ONE).await;
    assert_eq!((d.source, d.remaining), (Source::Redis, 2));
    if major >= 7 {
        assert!(redis
            .cmd(&["FUNCTION", "LIST"])
            .contains("tower_redis_ratelimit_"));
    }
}

/// A server without Redis Functions (Redis before 7; on a server that has them,
/// `FUNCTION` and `FCALL` renamed away, so it answers "unknown command"): the engine
/// runs by `EVALSHA`, decisions as usual, none lost to the failure policy.
#[tokio::test]
async fn a_server_without_functions_runs_the_engine_by_evalsha() {
    let server = RedisServer::start();
    // (A server without them as built, Redis before 7, has nothing to rename.)
    let args = if server.has_functions() {
        ["FUNCTION", "FCALL"]
            .iter()
            .flat_map(|command| ["--rename-command", command, ""])
            .map(String::from)
            .collect()
    } else {
        eprintln!("{} has no Redis Functions: runs as built", server.version());
        Vec::new()
    };
    drop(server);
    let redis = RedisServer::start_with(args);
    assert!(redis.cmd(&["FCALL", "f", "0"]).contains("unknown command"));
    let limiter = limiter(
        &support::backend_builder()
            .redis_url(redis.url())
            .engine_functions(true)
            .deny_cache(0)
            // (Not the default 100 ms: a busy machine must not turn the first call, which
            // connects and finds no Functions, into the failure policy's answer.)
            .call_timeout(support::CALL_TIMEOUT)
            .build()
            .unwrap(),
        PeriodConfig::new(3, Duration::from_secs(60)),
    );
    for remaining in [2, 1, 0] {
        let d = limiter.check(b"k", ONE).await;
        assert_eq!((d.source, d.remaining), (Source::Redis, remaining));
    }
    let d = limiter.check(b"k", ONE).await;
    assert_eq!((d.source, d.is_admitted()), (Source::Redis, false));
    assert!(redis.command_calls("evalsha") >= 4);
}

/// A calendar window's key expires at the window's true end (`PXAT`, the absolute time
/// from the zone's rules), and concurrent checks of one key (coalesced into shared calls
/// while one is in flight: their costs follow the window's boundaries in the engine's
/// arguments) admit exactly the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_windows_expire_at_their_end_and_admit_the_quota() {
    use tower_redis_ratelimit::Calendar;
    let redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis(redis.pool())
        .call_timeout(Duration::from_secs(10))
        .build()
        .expect("backend");
    let calendar = Calendar::day("Asia/Kolkata");
    let limiter = Arc::new(limiter(&backend, PeriodConfig::calendar(25, calendar)));
    let tasks: Vec<_> = (0..300)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.check(b"hot", ONE).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let decision = task.await.unwrap();
        assert!(
            matches!(decision.source, Source::Redis | Source::DenyCache),
            "{decision:?}"
        );
        admitted += usize::from(decision.is_admitted());
    }
    assert_eq!(admitted, 25);
    let window = calendar
        .window_at(std::time::SystemTime::now())
        .expect("a window");
    let end_ms = window
        .end
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let expires = expire_time_ms(&redis, "ratelimit:{v1:hot}:period:test");
    assert!(
        expires.contains(&i64::try_from(end_ms).unwrap()),
        "the window's end, exactly: {end_ms} not in {expires:?}"
    );
}

/// Every instance after the first finds the engine's library already loaded: its
/// connection's `FUNCTION LOAD` must not be an error in `INFO commandstats`, which
/// monitoring shows as failed calls (issue 35, item 9). Three instances start on one
/// server; no call of any command failed.
#[tokio::test]
async fn instances_starting_on_one_server_leave_no_failed_call() {
    let redis = RedisServer::start();
    for _ in 0..3 {
        let backend = redis.uncached_backend();
        // Connected (the library loaded) with the connection's deadline, not a check's.
        backend.warm_up().await.unwrap();
        let limiter = limiter(&backend, PeriodConfig::new(1_000, Duration::from_secs(60)));
        assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    }
    let stats = redis.cmd(&["INFO", "commandstats"]);
    let failed: Vec<&str> = stats
        .lines()
        .filter(|line| {
            line.split(',')
                .find_map(|field| field.strip_prefix("failed_calls="))
                .is_some_and(|n| n != "0")
        })
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
}
