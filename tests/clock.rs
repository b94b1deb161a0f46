//! `TimeSource::Caller` against a real `redis-server`: no `TIME` call in any script, one
//! limit shared exactly by instances, and each algorithm's documented bound with two
//! instances whose clocks differ by `s` (moved with the hidden
//! `BackendBuilder::caller_clock_offset_us`). The server's own clock is set an hour off in
//! the skew tests: in caller mode it must not matter.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use support::RedisServer;
use tokio::time::Instant;
use tower_redis_ratelimit::{Backend, Decision, Limiter, Source};
use tower_redis_ratelimit::{ManualClock, TimeSource};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter, UtcOffset};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const HOUR_US: i64 = 3_600_000_000;

/// A backend on `redis` with `time`, the caller's clock moved by `offset_us`, no deny
/// cache (every check runs the script).
fn backend(redis: &RedisServer, time: TimeSource, offset_us: i64) -> Backend {
    support::backend_builder()
        .redis(redis.pool())
        .call_timeout(support::CALL_TIMEOUT)
        .time_source(time)
        .caller_clock_offset_us(offset_us)
        .deny_cache(0)
        .build()
        .unwrap()
}

/// One limiter of each algorithm on `backend` (named alike on every backend, so
/// limiters on two backends share their keys).
fn limiters(backend: &Backend) -> Vec<Box<dyn Limiter>> {
    let sec = Duration::from_secs(1);
    vec![
        Box::new(
            PeriodLimiter::new(
                backend,
                "period",
                PeriodConfig::new(5, 60 * sec).align(UtcOffset::UTC),
            )
            .unwrap(),
        ),
        Box::new(
            TokenBucketLimiter::new(backend, "token", TokenBucketConfig::new(1, 3_600 * sec, 5))
                .unwrap(),
        ),
        Box::new(
            RollingWindowLimiter::new(backend, "rolling", RollingConfig::new(5, 10, 6 * sec))
                .unwrap(),
        ),
    ]
}

async fn check(limiter: &dyn Limiter, key: &str) -> Decision {
    let decision = limiter.check(key.as_bytes(), ONE).await;
    assert_eq!(decision.source, Source::Redis, "{decision:?}");
    decision
}

#[tokio::test]
async fn caller_time_never_calls_time_server_time_does() {
    for (time, expect_time_calls) in [(TimeSource::Caller, false), (TimeSource::Server, true)] {
        let redis = RedisServer::start();
        let backend = backend(&redis, time, 0);
        assert_eq!(backend.time_source(), time);
        backend.warm_up().await.unwrap();
        for limiter in limiters(&backend) {
            for _ in 0..3 {
                check(&*limiter, "k").await;
            }
        }
        backend.warm_up().await.unwrap();
        assert!(redis.command_calls("evalsha") >= 9, "{time:?}");
        let calls = redis.command_calls("time");
        assert_eq!(calls > 0, expect_time_calls, "{time:?}: {calls} TIME calls");
    }
}

#[tokio::test]
async fn two_caller_backends_share_one_limit_exactly() {
    let redis = RedisServer::start();
    let a = limiters(&backend(&redis, TimeSource::Caller, 0));
    let b = limiters(&backend(&redis, TimeSource::Caller, 0));
    for (a, b) in a.iter().zip(&b) {
        let mut admitted = 0;
        for _ in 0..8 {
            admitted += u32::from(check(&**a, "shared").await.is_admitted());
            admitted += u32::from(check(&**b, "shared").await.is_admitted());
        }
        assert_eq!(admitted, 5, "{:?}", a.policy());
    }
}

/// Two backends in caller mode on one server whose own clock is an hour behind: `a`'s
/// clock `skew_us` ahead of `b`'s.
fn skewed(skew_us: i64) -> (RedisServer, Backend, Backend) {
    let (redis, clock) = RedisServer::start_with_clock();
    clock.set_offset_us(-HOUR_US);
    let a = backend(&redis, TimeSource::Caller, skew_us);
    let b = backend(&redis, TimeSource::Caller, 0);
    (redis, a, b)
}

/// Calls `b` (the caller behind) then `a` on one key every `tick` for `span`; the admission times (since
/// the start) and the decisions.
async fn alternate(
    a: &dyn Limiter,
    b: &dyn Limiter,
    tick: Duration,
    span: Duration,
) -> (Vec<Admitted>, Vec<Decision>) {
    let start = Instant::now();
    let mut next = start;
    let mut admitted = Vec::new();
    let mut decisions = Vec::new();
    while next - start < span {
        tokio::time::sleep_until(next).await;
        for limiter in [b, a] {
            let sent = start.elapsed();
            let d = check(limiter, "k").await;
            if d.is_admitted() {
                admitted.push(Admitted {
                    sent,
                    replied: start.elapsed(),
                });
            }
            decisions.push(d);
        }
        next += tick;
    }
    (admitted, decisions)
}

/// An admission: the script ran at some time between the check's sending and its reply
/// (a busy machine stretches that by more than any fixed slack).
#[derive(Debug, Clone, Copy)]
struct Admitted {
    sent: Duration,
    replied: Duration,
}

/// The most admissions that surely ran within one closed span of `len`: from one
/// admission on, those whose reply came at most `len` after it was sent.
fn most_within(admitted: &[Admitted], len: Duration) -> usize {
    admitted
        .iter()
        .enumerate()
        .map(|(i, from)| {
            admitted[i..]
                .iter()
                .filter(|a| a.replied <= from.sent + len)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Token bucket: over any span `L`, at most `burst + rate × (L + s)`. A caller behind
/// the last writer must not get a full bucket from the key's expiry: with the key kept
/// only until its writer sees the bucket full, the caller behind would be admitted once
/// more per tick (about twice the rate here).
#[tokio::test]
async fn token_bucket_skewed_callers_stay_within_rate_times_skew() {
    let skew = Duration::from_millis(100);
    let (_redis, a, b) = skewed(skew.as_micros() as i64);
    // 10 per second (100 ms per token), burst 1.
    let config = TokenBucketConfig::new(10, Duration::from_secs(1), 1);
    let a = TokenBucketLimiter::new(&a, "t", config).unwrap();
    let b = TokenBucketLimiter::new(&b, "t", config).unwrap();
    let (admitted, decisions) =
        alternate(&a, &b, Duration::from_millis(150), Duration::from_secs(3)).await;
    // The longest the admissions can have spanned (from the first's sending to the
    // last's reply).
    let span = admitted
        .last()
        .unwrap()
        .replied
        .saturating_sub(admitted[0].sent);
    let bound = 1 + ((span + skew).as_secs_f64() * 10.0).floor() as usize;
    assert!(
        admitted.len() <= bound,
        "{} admitted over {span:?}, bound {bound}: {admitted:?}",
        admitted.len()
    );
    // The one ahead alone gets the rate (one per 150 ms tick, fewer on a loaded machine).
    assert!(admitted.len() >= 5, "{admitted:?}");
    // A refusal waits at most one token plus the skew.
    for d in decisions.iter().filter(|d| !d.is_admitted()) {
        assert!(
            d.retry_after.unwrap() <= Duration::from_millis(100) + skew,
            "{d:?}"
        );
    }
}

/// Rolling window (10 buckets of 100 ms, limit 5): any span of `9 × 100 ms - s` holds at
/// most the limit, and a refusal waits at most a window plus `s`. Moving the buckets back
/// for the caller behind (what the server-time script does on a step of the server's
/// clock) would age them once per call of that caller: many times the limit.
#[tokio::test]
async fn rolling_skewed_callers_stay_within_the_window_minus_skew() {
    let skew = Duration::from_millis(400);
    let (_redis, a, b) = skewed(skew.as_micros() as i64);
    let config = RollingConfig::new(5, 10, Duration::from_millis(100));
    let a = RollingWindowLimiter::new(&a, "r", config).unwrap();
    let b = RollingWindowLimiter::new(&b, "r", config).unwrap();
    let (admitted, decisions) =
        alternate(&a, &b, Duration::from_millis(20), Duration::from_secs(3)).await;
    let short = Duration::from_millis(900) - skew;
    let most = most_within(&admitted, short);
    assert!(most <= 5, "{most} admitted within {short:?}: {admitted:?}");
    assert!(admitted.len() >= 6, "{admitted:?}");
    for d in decisions.iter().filter(|d| !d.is_admitted()) {
        let retry = d.retry_after.unwrap();
        assert!(retry <= Duration::from_secs(1) + skew, "{d:?}");
    }
}

/// Fixed window aligned to the clock (1 s, quota 3): each window lasts at most one
/// period, and a span of one period holds at most three quotas with two clocks (the
/// extra window is the one the caller behind opens just before its own view of the
/// edge). Unaligned windows do not read the clock at all: exactly the quota per window.
#[tokio::test]
async fn period_skewed_callers_stay_within_one_extra_window_per_clock() {
    let skew = Duration::from_millis(300);
    let (_redis, a, b) = skewed(skew.as_micros() as i64);
    let period = Duration::from_secs(1);
    let aligned = PeriodConfig::new(3, period).align(UtcOffset::UTC);
    let pa = PeriodLimiter::new(&a, "aligned", aligned).unwrap();
    let pb = PeriodLimiter::new(&b, "aligned", aligned).unwrap();
    let (admitted, decisions) =
        alternate(&pa, &pb, Duration::from_millis(20), Duration::from_secs(3)).await;
    let most = most_within(&admitted, period);
    assert!(
        most <= 3 * 3,
        "{most} admitted within {period:?}: {admitted:?}"
    );
    assert!(admitted.len() >= 6, "{admitted:?}");
    for d in &decisions {
        assert!(d.reset <= period, "{d:?}");
    }
    // Unaligned: the window is the key's time to live, counted by the server.
    let config = PeriodConfig::new(3, Duration::from_secs(60));
    let pa = PeriodLimiter::new(&a, "free", config).unwrap();
    let pb = PeriodLimiter::new(&b, "free", config).unwrap();
    let mut admitted = 0;
    for _ in 0..5 {
        admitted += u32::from(check(&pa, "k").await.is_admitted());
        admitted += u32::from(check(&pb, "k").await.is_admitted());
    }
    assert_eq!(admitted, 3);
}

// ---------------------------------------------------------------------------
// The server's clock steps back, then returns (issue 22)
// ---------------------------------------------------------------------------

/// 2027-01-15T08:00:00.250Z in microseconds: the Redis time `T` of the round trips below
/// (off the grid of 100 ms buckets and of whole seconds by a quarter second).
const T_US: i64 = 1_800_000_000_250_000;

/// Runs `limiter`'s checks of one key on a server frozen at `T_US`: `before` checks at
/// `T`, one check `back_us` before `T` (a step back of the clock), then `after` checks at
/// `T + return_us` (the clock back, slightly later). The admissions at each stage.
async fn back_and_return(
    limiter: &dyn Limiter,
    clock: &support::ServerClock,
    back_us: i64,
    return_us: i64,
) -> (usize, usize, usize) {
    let mut admitted = [0; 3];
    for (stage, at, checks) in [
        (0, T_US, 5),
        (1, T_US - back_us, 1),
        (2, T_US + return_us, 5),
    ] {
        clock.freeze_at(at);
        for _ in 0..checks {
            admitted[stage] += usize::from(check(limiter, "k").await.is_admitted());
        }
    }
    (admitted[0], admitted[1], admitted[2])
}

/// Token bucket 1 per second, burst 5: the burst at `T`, a refused check at `T - 10 s`,
/// and at `T + 0.5 s` only half a token has dripped back: nothing more is admitted.
/// Before the fix, 5 more were (the refused check saved the clamped arrival time in the
/// behind frame, which read as a full bucket on the clock's return).
#[tokio::test]
async fn token_bucket_a_step_back_and_return_admits_nothing_more() {
    let (redis, clock) = RedisServer::start_with_clock();
    let backend = backend(&redis, TimeSource::Server, 0);
    let limiter = TokenBucketLimiter::new(
        &backend,
        "t",
        TokenBucketConfig::new(1, Duration::from_secs(1), 5),
    )
    .unwrap();
    let admitted = back_and_return(&limiter, &clock, 10_000_000, 500_000).await;
    assert_eq!(admitted, (5, 0, 0));
    // The time the key had seen holds: one token a second from `T`, never more.
    clock.freeze_at(T_US + 1_000_000);
    assert!(check(&limiter, "k").await.is_admitted());
    assert!(!check(&limiter, "k").await.is_admitted());
}

/// Rolling window of 5 per 10 × 100 ms: 5 at `T`, a refused check at `T - 10 s`, and at
/// `T + 50 ms` the window still holds the 5 units. Before the fix, 5 more were admitted
/// (the refused check rewrote the buckets into the behind frame, expired on return).
#[tokio::test]
async fn rolling_a_step_back_and_return_admits_nothing_more() {
    let (redis, clock) = RedisServer::start_with_clock();
    let backend = backend(&redis, TimeSource::Server, 0);
    let config = RollingConfig::new(5, 10, Duration::from_millis(100));
    let limiter = RollingWindowLimiter::new(&backend, "r", config).unwrap();
    let admitted = back_and_return(&limiter, &clock, 10_000_000, 50_000).await;
    assert_eq!(admitted, (5, 0, 0));
    // The units counted at `T` expire one window after `T`.
    clock.freeze_at(T_US + 1_000_000);
    assert!(check(&limiter, "k").await.is_admitted());
}

/// Fixed window of 5 per 60 s (starting at the first request, and aligned to UTC): 5 at
/// `T`, a refused check at `T - 120 s`, and at `T + 50 ms` the window still holds its
/// count. Before the fix, 5 more were admitted (the refused check re-expired the key one
/// period from the behind time, so it had expired on the clock's return).
#[tokio::test]
async fn period_a_step_back_and_return_admits_nothing_more() {
    let (redis, clock) = RedisServer::start_with_clock();
    let backend = backend(&redis, TimeSource::Server, 0);
    let minute = Duration::from_secs(60);
    for (name, config) in [
        ("free", PeriodConfig::new(5, minute)),
        (
            "aligned",
            PeriodConfig::new(5, minute).align(UtcOffset::UTC),
        ),
    ] {
        let limiter = PeriodLimiter::new(&backend, name, config).unwrap();
        let admitted = back_and_return(&limiter, &clock, 120_000_000, 50_000).await;
        assert_eq!(admitted, (5, 0, 0), "{name}");
    }
}

/// With the callers' clocks, a rolling window's hash is kept a window and an interval
/// past its last admission on the server's clock, whatever that clock did before. 2 per
/// 250 ms (one bucket): the caller's clock at `T` (a bucket's start) while the server's
/// is 400 ms behind, one admitted (the hash then expires 100 ms after `T` on the
/// server's clock); the server's clock comes back, one more at `T + 1 ms`; at
/// `T + 101 ms` the bucket still holds both and refuses. Before the fix, the fast path
/// re-expired the hash only with a bucket's first unit, so the hash expired at
/// `T + 100 ms` and two more were admitted in that bucket. Found by the model-based test
/// (tests/model.rs: a step back of the server's clock, a check, the return, checks).
#[tokio::test]
async fn rolling_callers_clocks_keep_the_hash_past_every_admission() {
    let (redis, clock) = RedisServer::start_with_clock();
    let manual = ManualClock::new(u64::try_from(T_US).unwrap());
    let backend = support::backend_builder()
        .redis(redis.pool())
        .call_timeout(support::CALL_TIMEOUT)
        .time_source(TimeSource::Caller)
        .manual_clock(manual.clone())
        .deny_cache(0)
        .build()
        .unwrap();
    let config = RollingConfig::new(2, 1, Duration::from_millis(250));
    let limiter = RollingWindowLimiter::new(&backend, "r", config).unwrap();
    let at = |ms: i64, server_behind_ms: i64| {
        manual.set_us(u64::try_from(T_US + ms * 1_000).unwrap());
        clock.freeze_at(T_US + (ms - server_behind_ms) * 1_000);
    };
    at(0, 400);
    assert!(check(&limiter, "k").await.is_admitted());
    at(1, 0);
    assert!(check(&limiter, "k").await.is_admitted());
    at(101, 0);
    let refused = check(&limiter, "k").await;
    assert!(!refused.is_admitted(), "{refused:?}");
    assert_eq!(refused.retry_after, Some(Duration::from_millis(149)));
}
