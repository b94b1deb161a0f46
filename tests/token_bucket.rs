//! The token bucket, with the same behaviour tests run against a real `redis-server`
//! (real time) and in-process (tokio's paused clock).

mod support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use support::RedisServer;
use tokio::time::Instant;
use tower_redis_ratelimit::{Backend, Limiter, Source, State};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;

fn cost(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

fn bucket(backend: &Backend, rate: u64, period: Duration, burst: u64) -> TokenBucketLimiter {
    TokenBucketLimiter::new(backend, "tb", TokenBucketConfig::new(rate, period, burst)).unwrap()
}

/// Runs one behaviour against Redis and in-process.
macro_rules! both {
    ($name:ident, $body:ident) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn redis() {
                let redis = RedisServer::start();
                $body(redis.backend(), Source::Redis).await;
            }

            #[tokio::test(start_paused = true)]
            async fn in_process() {
                $body(Backend::in_process(), Source::InProcess).await;
            }
        }
    };
}

async fn full_burst_then_rejection(backend: Backend, source: Source) {
    let limiter = bucket(&backend, 1, Duration::from_secs(60), 5);
    for left in (0..5).rev() {
        let d = limiter.check(b"k", ONE).await;
        assert_eq!(d.source, source);
        assert!(d.is_admitted());
        assert_eq!(d.remaining, left);
        let want = if left == 0 {
            State::HitQuota
        } else {
            State::Allowed
        };
        assert_eq!(d.state, want);
    }
    let over = limiter.check(b"k", ONE).await;
    assert_eq!(over.state, State::OverQuota);
    assert_eq!(over.remaining, 0);
    let retry = over.retry_after.unwrap();
    // The next token drips in one emission interval (60 s) after the first was taken.
    assert!(
        retry > Duration::from_secs(55) && retry <= Duration::from_secs(60),
        "{retry:?}"
    );
    // A different key has its own full bucket.
    assert_eq!(limiter.check(b"other", ONE).await.remaining, 4);
}
both!(full_burst, full_burst_then_rejection);

async fn refill_at_the_configured_rate(backend: Backend, _source: Source) {
    // 40 per second, burst 40: over a span S between the first and the last check, as
    // the bucket's clock saw them, the admitted count is 40 + 40 * S (within one). The
    // burst holds a second's refill, so a stall of the test under a second loses no
    // token to a full bucket.
    let limiter = bucket(&backend, 40, Duration::from_secs(1), 40);
    // The connection and the engine's load are paid before the span starts.
    limiter.check(b"warm-up", ONE).await;
    // The bucket's clock (Redis's) reads each check's time somewhere between its
    // sending and its reply: the span lies between `shortest` and `longest`.
    let first_sent = Instant::now();
    let mut admitted = u64::from(limiter.check(b"k", ONE).await.is_admitted());
    let first_replied = Instant::now();
    let (mut last_sent, mut last_replied) = (first_sent, first_replied);
    while first_sent.elapsed() < Duration::from_millis(1_200) {
        tokio::time::sleep(Duration::from_millis(2)).await;
        last_sent = Instant::now();
        admitted += u64::from(limiter.check(b"k", ONE).await.is_admitted());
        last_replied = Instant::now();
    }
    let shortest = last_sent
        .saturating_duration_since(first_replied)
        .as_secs_f64();
    let longest = last_replied.duration_since(first_sent).as_secs_f64();
    let (low, high) = (40.0 + 40.0 * shortest, 40.0 + 40.0 * longest);
    assert!(
        admitted as f64 >= low.floor() - 1.0 && admitted as f64 <= high.ceil() + 1.0,
        "admitted {admitted}, expected {low:.1}..={high:.1} (spans {shortest:.3}..{longest:.3} s)"
    );
}
both!(refill, refill_at_the_configured_rate);

async fn weighted_costs(backend: Backend, _source: Source) {
    let limiter = bucket(&backend, 1, Duration::from_secs(60), 10);
    assert_eq!(limiter.check(b"k", cost(7)).await.remaining, 3);
    let over = limiter.check(b"k", cost(4)).await;
    assert_eq!(over.state, State::OverQuota);
    assert_eq!(over.remaining, 3, "a refused request takes nothing");
    assert_eq!(limiter.check(b"k", cost(3)).await.state, State::HitQuota);
    // More than the burst can never pass: refused as such, with no retry-after.
    let never = limiter.check(b"fresh", cost(11)).await;
    assert_eq!(never.state, State::ExceedsCapacity);
    assert_eq!(never.retry_after, None);
    assert_eq!(
        limiter.check(b"fresh", cost(10)).await.state,
        State::HitQuota
    );
}
both!(weighted, weighted_costs);

async fn rate_100_burst_10(backend: Backend, source: Source) {
    // go-zero's ttl = floor(2 * 10 / 100) = 0 broke every call with these settings.
    let limiter = bucket(&backend, 100, Duration::from_secs(1), 10);
    let mut admitted = 0;
    let start = Instant::now();
    for _ in 0..15 {
        let d = limiter.check(b"k", ONE).await;
        if d.is_admitted() || source == Source::InProcess {
            assert_eq!(d.source, source, "no call may fall back");
        } else {
            assert!(
                matches!(d.source, Source::Redis | Source::DenyCache),
                "{d:?}"
            );
        }
        admitted += u32::from(d.is_admitted());
    }
    // The burst, plus one token per 10 ms the checks took (within one).
    let refilled = u32::try_from(start.elapsed().as_millis() / 10).unwrap_or(u32::MAX);
    assert!(
        (10..=11_u32.saturating_add(refilled)).contains(&admitted),
        "{admitted} in {:?}",
        start.elapsed()
    );
    let over = limiter.check(b"k", ONE).await;
    let retry = over.retry_after.expect("refused");
    assert!(retry <= Duration::from_millis(10), "{retry:?}");
    tokio::time::sleep(retry).await;
    assert!(limiter.check(b"k", ONE).await.is_admitted());
}
both!(fast_rate_small_burst, rate_100_burst_10);

async fn rates_below_one_per_second(backend: Backend, _source: Source) {
    // Two tokens every three seconds: one per 1.5 s.
    let limiter = bucket(&backend, 2, Duration::from_secs(3), 1);
    let start = Instant::now();
    assert_eq!(limiter.check(b"k", ONE).await.state, State::HitQuota);
    let over = limiter.check(b"k", ONE).await;
    let refused_at = Instant::now();
    let retry = over.retry_after.unwrap();
    // 1.5 s after the first check, less the time between the two.
    let took = refused_at.duration_since(start);
    assert!(
        retry + took + Duration::from_millis(1) >= Duration::from_millis(1_500)
            && retry <= Duration::from_millis(1_500),
        "{retry:?} ({took:?} between the checks)"
    );
    tokio::time::sleep_until(refused_at + retry - Duration::from_millis(600)).await;
    assert!(!limiter.check(b"k", ONE).await.is_admitted(), "not yet");
    tokio::time::sleep_until(refused_at + retry + Duration::from_millis(10)).await;
    assert!(
        limiter.check(b"k", ONE).await.is_admitted(),
        "exactly on time"
    );
}
both!(slow_rate, rates_below_one_per_second);

async fn retry_after_is_exact(backend: Backend, _source: Source) {
    let limiter = bucket(&backend, 10, Duration::from_secs(1), 3);
    let start = Instant::now();
    for _ in 0..3 {
        assert!(limiter.check(b"k", ONE).await.is_admitted());
    }
    // Two tokens: 200 ms minus what already dripped in since the first check.
    let over = limiter.check(b"k", cost(2)).await;
    let took = start.elapsed();
    let retry = over.retry_after.unwrap();
    assert!(
        retry + took + Duration::from_millis(1) >= Duration::from_millis(200)
            && retry <= Duration::from_millis(200),
        "{retry:?} ({took:?} since the first check)"
    );
    tokio::time::sleep(retry + Duration::from_millis(2)).await;
    assert!(limiter.check(b"k", cost(2)).await.is_admitted());
}
both!(retry_after, retry_after_is_exact);

#[tokio::test]
async fn two_clients_sharing_redis_see_one_bucket() {
    let redis = RedisServer::start();
    let a = bucket(&redis.backend(), 1, Duration::from_secs(60), 6);
    let b = bucket(&redis.backend(), 1, Duration::from_secs(60), 6);
    let mut admitted = 0;
    for i in 0..12 {
        let limiter = if i % 2 == 0 { &a } else { &b };
        admitted += u32::from(limiter.check(b"shared", ONE).await.is_admitted());
    }
    assert_eq!(admitted, 6);
    // One key per bucket, expiring when the bucket would be full again.
    assert_eq!(
        redis.cmd(&["KEYS", "ratelimit:*:token:*"]),
        "ratelimit:{v1:shared}:token:tb"
    );
    let pttl: i64 = redis
        .cmd(&["PTTL", "ratelimit:{v1:shared}:token:tb"])
        .parse()
        .unwrap();
    assert!(pttl > 300_000 && pttl <= 360_000, "{pttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_refilled_is_taken_once_across_instances() {
    let redis = RedisServer::start();
    let a = Arc::new(bucket(&redis.backend(), 2, Duration::from_secs(1), 2));
    let b = Arc::new(bucket(&redis.backend(), 2, Duration::from_secs(1), 2));
    assert!(a.check(b"k", cost(2)).await.is_admitted());
    // Wait for exactly one token (500 ms), then both instances race for it many times over.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let limiter = if i % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            tokio::spawn(async move { limiter.check(b"k", ONE).await.is_admitted() })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += u32::from(task.await.unwrap());
    }
    // One token, plus at most one more if the race spans another 500 ms.
    assert!((1..=2).contains(&admitted), "{admitted}");
}

#[tokio::test]
async fn the_stored_time_never_moves_backwards() {
    let redis = RedisServer::start();
    let limiter = bucket(&redis.backend(), 1, Duration::from_secs(10), 3);
    for _ in 0..3 {
        limiter.check(b"k", ONE).await;
    }
    // The value is the TAT, then (when the TAT alone does not tell them) the key's
    // skew and the newest time it has seen.
    let tat = |value: String| -> f64 { value.split(' ').next().unwrap().parse().unwrap() };
    let before = tat(redis.cmd(&["GET", "ratelimit:{v1:k}:token:tb"]));
    // Refused requests leave the arrival time alone.
    for _ in 0..5 {
        assert!(!limiter.check(b"k", ONE).await.is_admitted());
    }
    let after = tat(redis.cmd(&["GET", "ratelimit:{v1:k}:token:tb"]));
    assert_eq!(before, after);
}

#[tokio::test]
async fn script_flush_is_invisible() {
    let redis = RedisServer::start();
    let limiter = bucket(&redis.backend(), 1, Duration::from_secs(10), 3);
    limiter.check(b"k", ONE).await;
    redis.flush_scripts();
    let d = limiter.check(b"k", ONE).await;
    assert_eq!(d.source, Source::Redis);
    assert_eq!(d.remaining, 1);
}

// ---------------------------------------------------------------------------
// Clock steps
// ---------------------------------------------------------------------------

const HOUR_US: i64 = 3_600_000_000;

/// The Redis server's clock steps back an hour: the bucket stays empty (nothing more is
/// admitted), and refills at the rate from there, instead of staying empty for the hour.
/// Then it steps forward: the bucket is at most full again early.
#[tokio::test]
async fn a_step_of_the_redis_clock_never_admits_more_and_never_blocks_for_the_step() {
    let (redis, clock) = RedisServer::start_with_clock();
    let backend = redis.uncached_backend();
    let limiter = bucket(&backend, 1, Duration::from_secs(60), 5);
    for _ in 0..5 {
        assert!(limiter.check(b"k", ONE).await.is_admitted());
    }
    clock.step_us(-HOUR_US);
    for _ in 0..5 {
        let over = limiter.check(b"k", ONE).await;
        assert_eq!(over.state, State::OverQuota);
        let retry = over.retry_after.unwrap();
        assert!(retry <= Duration::from_secs(60), "retry after {retry:?}");
        assert!(
            over.reset <= Duration::from_secs(300),
            "reset {:?}",
            over.reset
        );
    }
    clock.step_us(2 * HOUR_US);
    for _ in 0..5 {
        assert!(limiter.check(b"k", ONE).await.is_admitted());
    }
    assert_eq!(limiter.check(b"k", ONE).await.state, State::OverQuota);
}

/// In-process, time is tokio's monotonic clock: a jump forward refills, never beyond the
/// burst.
#[tokio::test(start_paused = true)]
async fn in_process_a_jump_forward_refills_at_most_the_burst() {
    let limiter = bucket(&Backend::in_process(), 1, Duration::from_secs(60), 5);
    for _ in 0..5 {
        assert!(limiter.check(b"k", ONE).await.is_admitted());
    }
    tokio::time::advance(Duration::from_secs(3_600)).await;
    for _ in 0..5 {
        assert!(limiter.check(b"k", ONE).await.is_admitted());
    }
    assert_eq!(limiter.check(b"k", ONE).await.state, State::OverQuota);
}

/// Times of more than 10^14 µs (a bucket that takes years to refill) reach the client
/// whole (Lua numbers are doubles; printed with `%.14g` they would lose digits).
async fn times_of_years_are_read_whole(backend: Backend, source: Source) {
    const DAY: Duration = Duration::from_secs(86_400);
    // One token a day, 1 800 of them: a full refill takes 1 800 days (1.6 * 10^14 µs).
    let limiter = bucket(&backend, 1, DAY, 1_800);
    let spent = limiter.check(b"k", cost(1_700)).await;
    assert_eq!(
        (spent.state, spent.remaining, spent.source),
        (State::Allowed, 100, source)
    );
    // Full again in 1 700 days (minus the moments the test took).
    assert!(
        spent.reset > DAY * 1_699 && spent.reset <= DAY * 1_700,
        "{spent:?}"
    );
    let refused = limiter.check(b"k", cost(150)).await;
    assert_eq!(refused.state, State::OverQuota, "{refused:?}");
    let retry = refused.retry_after.expect("a retry-after");
    assert!(retry > DAY * 49 && retry <= DAY * 50, "{refused:?}");
}
both!(times_of_years, times_of_years_are_read_whole);
