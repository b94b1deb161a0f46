//! The rolling-window limiter against a real `redis-server` started by the harness.

mod support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use support::{RedisServer, Reply};
use tokio::time::Instant;
use tower_redis_ratelimit::rolling::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{Backend, Limiter, Source, State};

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
    let redis = RedisServer::start();
    let limiter = limiter(&redis.backend(), RollingConfig::new(1_000, 4, 20 * MS));
    let key = "ratelimit:{v1:k}:rolling:test";
    let start = Instant::now();
    let mut admitted = 0;
    while start.elapsed() < Duration::from_millis(250) {
        let d = limiter.check(b"k", ONE).await;
        assert_eq!(d.source, Source::Redis);
        admitted += 1;
        assert_eq!(d.state, State::Allowed);
        let buckets = buckets_of(&redis, "k");
        assert!(
            !buckets.is_empty() && buckets.len() <= 4,
            "{} fields: {buckets:?}",
            buckets.len()
        );
        // The fields are absolute bucket indices: Unix milliseconds / interval.
        let now_bucket = redis_now_ms(&redis) / 20;
        for &(index, _) in &buckets {
            // (A bucket may have ended between the check and this TIME.)
            assert!(index + 5 > now_bucket && index <= now_bucket, "{index}");
        }
        let sum: u64 = buckets.iter().map(|&(_, count)| count).sum();
        assert!(sum <= 1_000 - d.remaining, "{sum} vs {}", d.remaining);
        let ttl = pttl(&redis, "k");
        assert!(ttl > 0 && ttl <= 100, "pttl {ttl}");
        tokio::time::sleep(3 * MS).await;
    }
    assert!(admitted > 10);
    assert_eq!(redis.cmd(&["TYPE", key]), "hash");
    assert_eq!(redis.cmd(&["KEYS", "*"]), key);
    // Idle keys vanish: one window plus one interval after the last admission.
    tokio::time::sleep(110 * MS).await;
    assert_eq!(redis.cmd(&["EXISTS", key]), "0");
}

#[tokio::test]
async fn buckets_expire_and_admit_again() {
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.uncached_backend(),
        RollingConfig::new(3, 10, 50 * MS),
    );
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
    assert!(retry <= Duration::from_millis(500), "{retry:?}");
    assert!(retry > Duration::from_millis(400), "{retry:?}");
    // Shortly before the oldest bucket expires the request is still rejected ...
    tokio::time::sleep(retry - 15 * MS).await;
    assert_eq!(limiter.check(b"k", ONE).await.state, State::OverQuota);
    // ... and once it has, admitted.
    tokio::time::sleep(20 * MS).await;
    let d = limiter.check(b"k", ONE).await;
    assert!(d.is_admitted(), "{d:?}");
    // A whole window after that, the full limit is available again.
    tokio::time::sleep(d.reset + 5 * MS).await;
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
    let redis = RedisServer::start();
    let limiter = limiter(
        &redis.uncached_backend(),
        RollingConfig::new(LIMIT as u64, 10, Duration::from_millis(INTERVAL_MS)),
    );
    // Warm up the connection and the script cache.
    limiter.check(b"warm-up", ONE).await;
    // Find the next window edge on the Redis server's clock (bucket edges are multiples
    // of the interval in Unix time, so window edges can be taken on multiples of it too),
    // as a local instant.
    let before = Instant::now();
    let now_ms = redis_now_ms(&redis);
    let mut to_edge = WINDOW_MS - now_ms % WINDOW_MS;
    if to_edge < 60 {
        to_edge += WINDOW_MS;
    }
    let edge = before + Duration::from_millis(to_edge);
    let at = |offset_ms: i64| {
        if offset_ms >= 0 {
            edge + Duration::from_millis(offset_ms.unsigned_abs())
        } else {
            edge - Duration::from_millis(offset_ms.unsigned_abs())
        }
    };

    // A fixed-window attack: the whole limit in the last 40 ms before the edge ...
    let mut admitted = Vec::new();
    for i in 0..LIMIT as i64 {
        tokio::time::sleep_until(at(-40 + i * 5)).await;
        let d = limiter.check(b"k", ONE).await;
        assert!(d.is_admitted(), "the burst fits: {d:?}");
        admitted.push(Instant::now());
    }
    // ... then probes every 5 ms for most of a window past the edge.
    let mut rejected_after_edge = 0;
    let mut offset = 0;
    while offset <= 520 {
        tokio::time::sleep_until(at(offset)).await;
        let d = limiter.check(b"k", ONE).await;
        assert_eq!(d.source, Source::Redis);
        let now = Instant::now();
        if d.is_admitted() {
            admitted.push(now);
        } else if now.duration_since(edge) < Duration::from_millis(380) {
            rejected_after_edge += 1;
        }
        offset += 5;
    }
    // A fixed window would have admitted the limit again right after the edge; here the
    // burst's bucket (ends 450 ms after the edge) keeps it out until then.
    let first_after = admitted[LIMIT..].first().copied();
    let first_after = first_after.expect("the burst's bucket expired and admitted again");
    assert!(
        first_after.duration_since(edge) > Duration::from_millis(380),
        "admitted {:?} after the edge",
        first_after.duration_since(edge)
    );
    assert!(rejected_after_edge >= 50, "{rejected_after_edge}");
    // Any span of (buckets - 1) intervals holds at most the limit; admission times are
    // local and late by up to one round trip, hence the margin.
    let span = Duration::from_millis(WINDOW_MS - INTERVAL_MS - 10);
    for (i, &start) in admitted.iter().enumerate() {
        let within = admitted[i..]
            .iter()
            .filter(|&&t| t.duration_since(start) <= span)
            .count();
        assert!(within <= LIMIT, "{within} admitted within {span:?}");
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
    let redis = RedisServer::start();
    let limiter = limiter(&redis.backend(), RollingConfig::new(4, 10, 30 * MS));
    // Two units now, two units at least one bucket later.
    limiter.check(b"k", cost(2)).await;
    tokio::time::sleep(70 * MS).await;
    assert_eq!(limiter.check(b"k", cost(2)).await.state, State::HitQuota);
    let small = limiter.check(b"k", cost(2)).await.retry_after.unwrap();
    let large = limiter.check(b"k", cost(3)).await.retry_after.unwrap();
    // A cost of 2 waits for the first bucket only, a cost of 3 for the second too.
    assert!(large >= small + 30 * MS, "{small:?} vs {large:?}");
    assert!(small <= 300 * MS && large <= 300 * MS);
    tokio::time::sleep(small + 2 * MS).await;
    assert_eq!(limiter.check(b"k", cost(3)).await.state, State::OverQuota);
    assert_eq!(limiter.check(b"k", cost(2)).await.state, State::HitQuota);
}

#[tokio::test]
async fn a_flood_on_a_refused_key_is_answered_by_the_deny_cache_until_a_bucket_frees() {
    let redis = RedisServer::start();
    let limiter = limiter(&redis.backend(), RollingConfig::new(3, 10, 30 * MS));
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
    let backend = Backend::builder()
        .redis(redis.pool())
        .call_timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let limiter = limiter(&backend, RollingConfig::new(2, 10, Duration::from_secs(6)));
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    redis.kill();
    let d = limiter.check(b"k", ONE).await;
    assert_eq!(d.source, Source::Fallback);
    // One failed call is answered by the fallback; it takes more to open the breaker.
    assert_eq!(backend.redis_healthy(), Some(true));
    let d = limiter.check(b"k", ONE).await;
    assert_eq!(d.source, Source::Fallback);
    assert_eq!(d.state, State::HitQuota);
    let over = limiter.check(b"k", ONE).await;
    assert_eq!(over.state, State::OverQuota);
    assert!(over.retry_after.unwrap() > Duration::from_secs(50));
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.redis_healthy() != Some(true) {
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
    // A 10 s window, so the test's own run time never expires a bucket.
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
