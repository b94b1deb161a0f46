//! The rolling-window limiter against a real `redis-server` started by the harness.

mod support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use support::{RedisServer, Reply, ServerClock};
use tokio::time::Instant;
use tower_redis_ratelimit::RedisState;
use tower_redis_ratelimit::{Backend, Limiter, Source, State};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const MS: Duration = Duration::from_millis(1);

fn cost(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

fn limiter(backend: &Backend, config: RollingConfig) -> RollingWindowLimiter {
    RollingWindowLimiter::new(backend, "test", config).expect("valid config")
}

async fn states(limiter: &RollingWindowLimiter, key: &str, n: usize) -> Vec<State> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(limiter.check(key.as_bytes(), ONE).await.state);
    }
    out
}

/// 2027-01-15T08:00:00Z in Unix milliseconds: where the tests on a frozen server clock
/// start, on the grid of every interval they use (1 s, 500, 50, 30 and 20 ms).
const T_MS: u64 = 1_800_000_000_000;

/// Freezes the server's wall clock at `ms` Unix milliseconds (see [`ServerClock`]).
fn freeze_ms(clock: &ServerClock, ms: u64) {
    clock.freeze_at(i64::try_from(ms * 1_000).expect("fits"));
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).expect("fits")
}

fn redis_now_ms(redis: &RedisServer) -> u64 {
    let time = redis.cmd(&["TIME"]);
    let mut parts = time.lines();
    let secs: u64 = parts.next().unwrap().parse().unwrap();
    let micros: u64 = parts.next().unwrap().parse().unwrap();
    secs * 1_000 + micros / 1_000
}

/// The hash of `key`: (bucket index, count) pairs (without the key's skew, field `s`).
fn buckets_of(redis: &RedisServer, key: &str) -> Vec<(u64, u64)> {
    let reply = redis.cmd_reply(&["HGETALL", &format!("ratelimit:{{v1:{key}}}:rolling:test")]);
    let Reply::Array(items) = reply else {
        panic!("HGETALL answered {reply}");
    };
    items
        .chunks(2)
        .filter(|pair| pair[0].render() != "s")
        .map(|pair| {
            let number = |r: &Reply| r.render().parse().unwrap();
            (number(&pair[0]), number(&pair[1]))
        })
        .collect()
}

/// How many buckets `key`'s time runs ahead of the server's (the field `s`; 0 if none).
fn skew_of(redis: &RedisServer, key: &str) -> i64 {
    redis
        .cmd(&["HGET", &format!("ratelimit:{{v1:{key}}}:rolling:test"), "s"])
        .parse()
        .unwrap_or(0)
}

fn pttl(redis: &RedisServer, key: &str) -> i64 {
    redis
        .cmd(&["PTTL", &format!("ratelimit:{{v1:{key}}}:rolling:test")])
        .parse()
        .unwrap()
}

#[tokio::test]
async fn admits_exactly_the_limit_within_a_window() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        RollingConfig::new(5, 10, Duration::from_secs(6)),
    );
    use State::*;
    assert_eq!(
        states(&limiter, "k", 7).await,
        [Allowed, Allowed, Allowed, Allowed, HitQuota, OverQuota, OverQuota]
    );
    // Redis refused the key until its oldest bucket expires: the deny cache answers now.
    let over = limiter.check(b"k", ONE).await;
    assert_eq!((over.state, over.source), (OverQuota, Source::DenyCache));
    assert_eq!((over.limit, over.remaining), (5, 0));
    let retry = over.retry_after.expect("over quota has a retry-after");
    assert!(
        retry > Duration::from_secs(53) && retry <= Duration::from_secs(60),
        "{retry:?}"
    );
    assert!(over.reset >= retry && over.reset <= Duration::from_secs(60));
    // Another key is unaffected.
    assert_eq!(limiter.check(b"other", ONE).await.remaining, 4);
}

#[tokio::test]
async fn the_key_is_one_hash_of_live_buckets_with_an_expiry() {
    // The server's clock is frozen and stepped by the test: each check's fields and
    // expiry are read at the very time the check ran (on real time, a 20 ms bucket could
    // end, and the key's 60-100 ms expiry run down, in the few commands between; and a
    // busy machine may not fit many checks in a fixed span).
    let (redis, clock) = RedisServer::start_with_clock();
    let limiter = limiter(&redis.backend(), RollingConfig::new(1_000, 4, 20 * MS));
    let key = "ratelimit:{v1:k}:rolling:test";
    // 40 checks 7 ms apart: 280 ms, 14 buckets, three and a half windows, at every
    // offset within a bucket.
    let mut now_ms = T_MS;
    for _ in 0..40 {
        freeze_ms(&clock, now_ms);
        let d = limiter.check(b"k", ONE).await;
        assert_eq!(d.source, Source::Redis);
        assert_eq!(d.state, State::Allowed);
        let buckets = buckets_of(&redis, "k");
        assert!(
            !buckets.is_empty() && buckets.len() <= 4,
            "{} fields: {buckets:?}",
            buckets.len()
        );
        // The fields are absolute bucket indices: Unix milliseconds / interval, of live
        // buckets only (the server's `TIME` is the check's).
        let now_bucket = redis_now_ms(&redis) / 20;
        assert_eq!(now_bucket, now_ms / 20);
        for &(index, _) in &buckets {
            assert!(
                index + 4 > now_bucket && index <= now_bucket,
                "{index} in bucket {now_bucket}"
            );
        }
        let sum: u64 = buckets.iter().map(|&(_, count)| count).sum();
        assert_eq!(sum, 1_000 - d.remaining, "{buckets:?}");
        let ttl = pttl(&redis, "k");
        assert!(ttl > 0 && ttl <= 100, "pttl {ttl}");
        now_ms += 7;
    }
    assert_eq!(redis.cmd(&["TYPE", key]), "hash");
    assert_eq!(redis.cmd(&["KEYS", "*"]), key);
    // Idle keys vanish: one window plus one interval after the last admission.
    let last_ms = now_ms - 7;
    freeze_ms(&clock, last_ms + 101);
    assert_eq!(redis.cmd(&["EXISTS", key]), "0");
}

#[tokio::test]
async fn buckets_expire_and_admit_again() {
    // The server's clock is frozen and set by the test: the expiry is checked 1 ms
    // either side of the time Redis names (on real time, a check had to reach Redis
    // within 15 ms of a sleep's end, which a busy machine misses).
    let (redis, clock) = RedisServer::start_with_clock();
    let limiter = limiter(
        &redis.uncached_backend(),
        RollingConfig::new(3, 10, 50 * MS),
    );
    // 10 ms into a bucket.
    let t = T_MS + 10;
    freeze_ms(&clock, t);
    assert_eq!(
        states(&limiter, "k", 4).await,
        [
            State::Allowed,
            State::Allowed,
            State::HitQuota,
            State::OverQuota
        ]
    );
    let over = limiter.check(b"k", ONE).await;
    let retry = over.retry_after.unwrap();
    // The bucket of the units counted at `t` stops counting a window after it starts.
    assert_eq!(retry, 490 * MS);
    // Shortly before the oldest bucket expires the request is still rejected ...
    freeze_ms(&clock, t + millis(retry) - 1);
    assert_eq!(limiter.check(b"k", ONE).await.state, State::OverQuota);
    // ... and once it has, admitted.
    freeze_ms(&clock, t + millis(retry));
    let d = limiter.check(b"k", ONE).await;
    assert!(d.is_admitted(), "{d:?}");
    // A whole window after that, the full limit is available again.
    freeze_ms(&clock, t + millis(retry) + millis(d.reset));
    assert_eq!(
        states(&limiter, "k", 4).await,
        [
            State::Allowed,
            State::Allowed,
            State::HitQuota,
            State::OverQuota
        ]
    );
}

#[tokio::test]
async fn straddling_a_window_edge_does_not_double_the_limit() {
    const LIMIT: usize = 5;
    const WINDOW_MS: u64 = 500;
    const INTERVAL_MS: u64 = 50;
    // The server's clock is frozen and set to each request's time: admissions are
    // stamped with the very time Redis decided them (stamped with local times, a reply
    // late by a few tens of ms on a busy machine put a sixth admission in a span).
    let (redis, clock) = RedisServer::start_with_clock();
    let limiter = limiter(
        &redis.uncached_backend(),
        RollingConfig::new(LIMIT as u64, 10, Duration::from_millis(INTERVAL_MS)),
    );
    // A window edge on the server's clock (bucket edges are multiples of the interval in
    // Unix time, so window edges can be taken on multiples of it too); times below are
    // ms from it.
    let edge = T_MS;
    assert_eq!(edge % WINDOW_MS, 0);
    let at = |offset_ms: i64| edge.checked_add_signed(offset_ms).unwrap();

    // A fixed-window attack: the whole limit in the last 40 ms before the edge ...
    let mut admitted: Vec<i64> = Vec::new();
    for i in 0..LIMIT as i64 {
        let offset = -40 + i * 5;
        freeze_ms(&clock, at(offset));
        let d = limiter.check(b"k", ONE).await;
        assert!(d.is_admitted(), "the burst fits: {d:?}");
        admitted.push(offset);
    }
    // ... then probes every 5 ms for most of a window past the edge.
    let mut rejected_after_edge = 0;
    for offset in (0..=520).step_by(5) {
        freeze_ms(&clock, at(offset));
        let d = limiter.check(b"k", ONE).await;
        assert_eq!(d.source, Source::Redis);
        if d.is_admitted() {
            admitted.push(offset);
        } else if offset < 450 {
            rejected_after_edge += 1;
        }
    }
    // A fixed window would have admitted the limit again right after the edge; here the
    // burst's bucket (ends 450 ms after the edge) keeps it out until then.
    let first_after = admitted[LIMIT..].first().copied();
    let first_after = first_after.expect("the burst's bucket expired and admitted again");
    assert_eq!(first_after, 450, "admitted {first_after} ms after the edge");
    assert_eq!(rejected_after_edge, 90);
    // Any span of (buckets - 1) intervals holds at most the limit.
    let span = i64::try_from(WINDOW_MS - INTERVAL_MS).unwrap();
    for (i, &start) in admitted.iter().enumerate() {
        let within = admitted[i..].iter().filter(|&&t| t - start <= span).count();
        assert!(
            within <= LIMIT,
            "{within} admitted within {span} ms: {admitted:?}"
        );
    }
    assert!(admitted.len() <= 2 * LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_one_key_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let backend = redis.backend();
    let limiter = Arc::new(limiter(
        &backend,
        RollingConfig::new(25, 10, Duration::from_secs(6)),
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
    let sum: u64 = buckets_of(&redis, "hot").iter().map(|&(_, c)| c).sum();
    assert_eq!(sum, 25);
}

#[tokio::test]
async fn two_instances_sharing_redis_share_one_window() {
    let redis = RedisServer::start();
    // Two processes' worth of state: separate pools, backends and limiters.
    let config = RollingConfig::new(4, 10, Duration::from_secs(6));
    let a = limiter(&redis.backend(), config);
    let b = limiter(&redis.backend(), config);
    let mut admitted = 0;
    for i in 0..10 {
        let instance = if i % 2 == 0 { &a } else { &b };
        let d = instance.check(b"shared", ONE).await;
        assert!(
            matches!(d.source, Source::Redis | Source::DenyCache),
            "{d:?}"
        );
        admitted += usize::from(d.is_admitted());
    }
    assert_eq!(admitted, 4);
    assert_eq!(b.check(b"shared", ONE).await.state, State::OverQuota);
}

#[tokio::test]
async fn weighted_costs_and_costs_beyond_the_limit() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        RollingConfig::new(10, 10, Duration::from_secs(6)),
    );
    let d = limiter.check(b"k", cost(6)).await;
    assert_eq!((d.state, d.remaining), (State::Allowed, 4));
    // Too much for what is left: rejected, and not counted.
    let over = limiter.check(b"k", cost(5)).await;
    assert_eq!((over.state, over.remaining), (State::OverQuota, 4));
    assert!(over.retry_after.unwrap() > Duration::from_secs(50));
    let d = limiter.check(b"k", cost(4)).await;
    assert_eq!((d.state, d.remaining), (State::HitQuota, 0));
    let sum: u64 = buckets_of(&redis, "k").iter().map(|&(_, c)| c).sum();
    assert_eq!(sum, 10);
    // More than the whole limit can never pass, and says so without a retry-after.
    let never = limiter.check(b"fresh", cost(11)).await;
    assert_eq!(never.state, State::ExceedsCapacity);
    assert_eq!(never.retry_after, None);
    assert_eq!(never.source, Source::Redis);
    assert_eq!(
        redis.cmd(&["EXISTS", "ratelimit:{v1:fresh}:rolling:test"]),
        "0"
    );
}

#[tokio::test]
async fn retry_after_waits_for_the_buckets_that_free_enough() {
    // The server's clock is frozen and set by the test: the retry-afters are exact, and
    // the check once the first bucket has expired runs while the second still counts (on
    // real time, the two were read a round trip apart, and a sleep had 28 ms of room).
    let (redis, clock) = RedisServer::start_with_clock();
    let limiter = limiter(&redis.backend(), RollingConfig::new(4, 10, 30 * MS));
    // Two units now (5 ms into a bucket), two units at least one bucket later (70 ms on:
    // two buckets later, 15 ms into it).
    let t = T_MS + 5;
    freeze_ms(&clock, t);
    assert_eq!(limiter.check(b"k", cost(2)).await.state, State::Allowed);
    let later = t + 70;
    freeze_ms(&clock, later);
    assert_eq!(limiter.check(b"k", cost(2)).await.state, State::HitQuota);
    let small = limiter.check(b"k", cost(2)).await.retry_after.unwrap();
    let large = limiter.check(b"k", cost(3)).await.retry_after.unwrap();
    // A cost of 2 waits for the first bucket only (it ends a window after `T_MS`), a cost
    // of 3 for the second too (two buckets later).
    assert_eq!(small, Duration::from_millis(T_MS + 300 - later));
    assert_eq!(large, small + 60 * MS);
    freeze_ms(&clock, later + millis(small));
    assert_eq!(limiter.check(b"k", cost(3)).await.state, State::OverQuota);
    assert_eq!(limiter.check(b"k", cost(2)).await.state, State::HitQuota);
}

#[tokio::test]
async fn a_flood_on_a_refused_key_is_answered_by_the_deny_cache_until_a_bucket_frees() {
    let redis = RedisServer::start();
    // 100 ms buckets: Redis's refusal holds for at least 9 of them (and the cache answers
    // it for at most its max age, 1 s), so the flood and the checks after it fit with
    // room on a busy machine (30 ms buckets left them under 270 ms).
    let limiter = limiter(&redis.backend(), RollingConfig::new(3, 10, 100 * MS));
    let mut admitted = 0;
    let mut retry = None;
    for _ in 0..500 {
        let d = limiter.check(b"hot", ONE).await;
        admitted += usize::from(d.is_admitted());
        retry = retry.or(d.retry_after);
    }
    assert_eq!(admitted, 3);
    // Three admitted and one refusal from Redis (the script is loaded with the
    // connection); the cache answered the rest.
    assert_eq!(redis.command_calls("evalsha"), 4);
    assert_eq!(limiter.check(b"hot", ONE).await.source, Source::DenyCache);
    // The refusal lasts until the oldest bucket has expired, and no longer.
    tokio::time::sleep(retry.unwrap() + 2 * MS).await;
    let d = limiter.check(b"hot", ONE).await;
    assert_eq!(d.source, Source::Redis);
    assert!(d.is_admitted(), "{d:?}");
}

#[tokio::test]
async fn expired_and_foreign_fields_are_dropped() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        RollingConfig::new(3, 10, Duration::from_secs(6)),
    );
    let key = "ratelimit:{v1:k}:rolling:test";
    // An ancient bucket and garbage, without an expiry. (A bucket in the future is not
    // garbage: the server clock stepped back, see `a_step_back_of_the_redis_clock_*`.)
    redis.cmd(&["HSET", key, "1", "99", "junk", "x", "0", "5", "7", "-1"]);
    let d = limiter.check(b"k", ONE).await;
    assert_eq!((d.state, d.remaining), (State::Allowed, 2));
    let buckets = buckets_of(&redis, "k");
    assert_eq!(buckets.len(), 1, "{buckets:?}");
    assert_eq!(buckets[0].1, 1);
    let ttl = pttl(&redis, "k");
    assert!(ttl > 60_000 && ttl <= 66_000, "pttl {ttl}");
}

#[tokio::test]
async fn script_flush_mid_traffic_is_invisible() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.backend(),
        RollingConfig::new(3, 10, Duration::from_secs(6)),
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
async fn unreachable_redis_is_answered_by_the_fallback() {
    let mut redis = RedisServer::start();
    let backend = support::backend_builder()
        .redis(redis.pool())
        // The harness's call timeout: the killed server refuses connections at once, so
        // the fallback never waits on it, and a busy machine never turns a check that
        // must reach Redis into the fallback's (200 ms left too little room).
        .call_timeout(support::CALL_TIMEOUT)
        .probe_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let limiter = limiter(&backend, RollingConfig::new(2, 10, Duration::from_secs(6)));
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    redis.kill();
    let d = limiter.check(b"k", ONE).await;
    assert_eq!(d.source, Source::Fallback);
    // One failed call is answered by the fallback; it takes more to open the breaker.
    assert_eq!(backend.redis_state(), Some(RedisState::Healthy));
    let d = limiter.check(b"k", ONE).await;
    assert_eq!(d.source, Source::Fallback);
    assert_eq!(d.state, State::HitQuota);
    let over = limiter.check(b"k", ONE).await;
    assert_eq!(over.state, State::OverQuota);
    assert!(over.retry_after.unwrap() > Duration::from_secs(50));
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.redis_state() != Some(RedisState::Healthy) {
        assert!(Instant::now() < deadline, "probe never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
}

// ---------------------------------------------------------------------------
// Clock steps
// ---------------------------------------------------------------------------

const HOUR_US: i64 = 3_600_000_000;

/// The Redis server's clock steps back an hour, twice, then by less than a window: a key
/// limited to 5 is admitted 5 times in all (before the fix, 15: the script dropped the
/// buckets "from the future"), and a refusal waits at most one window.
#[tokio::test]
async fn a_step_back_of_the_redis_clock_never_admits_more_than_the_limit() {
    let (redis, clock) = RedisServer::start_with_clock();
    // The clock is frozen (half a second into a 1 s bucket) and moved by the steps alone:
    // on real time, a second's edge passed between the admissions and the last step
    // moved the key's time, and so its skew, by a bucket.
    freeze_ms(&clock, T_MS + 500);
    let limiter = limiter(
        &redis.uncached_backend(),
        RollingConfig::new(5, 10, Duration::from_secs(1)),
    );
    let mut admitted = 0;
    for step_us in [0, -HOUR_US, -HOUR_US, -3_000_000] {
        clock.step_us(step_us);
        for _ in 0..5 {
            admitted += u32::from(limiter.check(b"k", ONE).await.is_admitted());
        }
    }
    assert_eq!(admitted, 5);
    let over = limiter.check(b"k", ONE).await;
    assert_eq!(over.state, State::OverQuota);
    assert_eq!(over.remaining, 0);
    let retry = over.retry_after.unwrap();
    assert!(retry <= Duration::from_secs(10), "{retry:?}");
    // The buckets stay in the key's time, which runs 2 h 3 s (in 1 s buckets) ahead of
    // the server's, and still expire: a window and a bucket after the key's time.
    let buckets = buckets_of(&redis, "k");
    assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 5, "{buckets:?}");
    let skew_ms = skew_of(&redis, "k") * 1_000;
    assert_eq!(skew_ms, 2 * HOUR_US / 1_000 + 3_000);
    let ttl = pttl(&redis, "k") - skew_ms;
    assert!(ttl > 0 && ttl <= 11_000, "pttl {ttl} beyond the skew");
}

/// A step forward at most expires the window early.
#[tokio::test]
async fn a_step_forward_of_the_redis_clock_at_most_expires_the_window_early() {
    let (redis, clock) = RedisServer::start_with_clock();
    let limiter = limiter(
        &redis.uncached_backend(),
        RollingConfig::new(5, 10, Duration::from_secs(1)),
    );
    assert_eq!(
        states(&limiter, "k", 6).await.last(),
        Some(&State::OverQuota)
    );
    clock.step_us(HOUR_US);
    let after = states(&limiter, "k", 6).await;
    assert_eq!(
        after.iter().filter(|s| s.is_admitted()).count(),
        5,
        "{after:?}"
    );
    // And back again: nothing admitted beyond the limit.
    clock.step_us(-HOUR_US);
    assert_eq!(states(&limiter, "k", 3).await, [State::OverQuota; 3]);
}

/// In-process, time is tokio's monotonic clock: it only ever moves forward, and a jump
/// forward (tokio's paused clock) at most expires the window early.
#[tokio::test(start_paused = true)]
async fn in_process_a_jump_forward_at_most_expires_the_window_early() {
    let limiter = limiter(
        &Backend::in_process(),
        RollingConfig::new(5, 10, Duration::from_secs(1)),
    );
    assert_eq!(
        states(&limiter, "k", 6).await.last(),
        Some(&State::OverQuota)
    );
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(states(&limiter, "k", 1).await, [State::OverQuota]);
    tokio::time::advance(Duration::from_secs(3_600)).await;
    let after = states(&limiter, "k", 6).await;
    assert_eq!(
        after.iter().filter(|s| s.is_admitted()).count(),
        5,
        "{after:?}"
    );
}
