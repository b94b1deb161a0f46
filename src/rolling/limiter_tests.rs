//! Tests of the rolling-window limiter, in process.

use super::*;
use crate::limiter::Limiter;
use crate::{LimitLayer, RollingConfig};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const MS: Duration = Duration::from_millis(1);

fn cost(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

fn build(config: RollingConfig) -> Result<RollingWindowLimiter, ConfigError> {
    RollingWindowLimiter::new(&Backend::in_process(), "t", config)
}

/// `limit` per 10 buckets of 100 ms.
fn limiter(limit: u64) -> RollingWindowLimiter {
    build(RollingConfig::new(limit, 10, 100 * MS)).unwrap()
}

fn now_us(limiter: &RollingWindowLimiter) -> u64 {
    limiter.store.remote.backend().clock().now_us()
}

/// Advances the paused clock to the next multiple of `step_us` in Unix time (a
/// bucket or window edge) and returns the time there.
async fn align(limiter: &RollingWindowLimiter, step_us: u64) -> u64 {
    let into = now_us(limiter) % step_us;
    if into != 0 {
        tokio::time::advance(Duration::from_micros(step_us - into)).await;
    }
    now_us(limiter)
}

#[test]
fn invalid_configurations() {
    let ms = Duration::from_millis(1);
    let cases = [
        (
            RollingConfig::new(0, 10, ms),
            ConfigError::Zero { setting: "limit" },
        ),
        (
            RollingConfig::new(1, 0, ms),
            ConfigError::Zero { setting: "buckets" },
        ),
        (
            RollingConfig::new(1, 10, Duration::ZERO),
            ConfigError::ZeroDuration {
                setting: "interval",
            },
        ),
        (
            RollingConfig::new(1, 10, Duration::from_micros(999)),
            ConfigError::ZeroDuration {
                setting: "interval",
            },
        ),
        (
            RollingConfig::new(1, MAX_BUCKETS + 1, ms),
            ConfigError::TooLarge {
                setting: "buckets",
                max: u64::from(MAX_BUCKETS),
            },
        ),
        (
            RollingConfig::new(1, 10, Duration::from_secs(367 * 86_400)),
            ConfigError::TooLong {
                setting: "interval",
            },
        ),
        (
            RollingConfig::new(1, 1, Duration::MAX),
            ConfigError::TooLong {
                setting: "interval",
            },
        ),
        (
            RollingConfig::default(),
            ConfigError::Zero { setting: "limit" },
        ),
    ];
    for (config, error) in cases {
        assert_eq!(build(config).unwrap_err(), error, "{config:?}");
    }
    assert!(matches!(
        RollingWindowLimiter::new(&Backend::in_process(), "", RollingConfig::new(1, 1, ms)),
        Err(ConfigError::InvalidName { .. })
    ));
    assert!(matches!(
        RollingWindowLimiter::new(&Backend::in_process(), "{x}", RollingConfig::new(1, 1, ms)),
        Err(ConfigError::InvalidName { .. })
    ));
    // A key must fit in the in-process state.
    let small = Backend::builder().max_local_keys(10).build().unwrap();
    assert!(matches!(
        RollingWindowLimiter::new(&small, "t", RollingConfig::new(1, MAX_BUCKETS, ms)),
        Err(ConfigError::Conflict { .. })
    ));
    assert!(RollingWindowLimiter::new(&small, "t", RollingConfig::new(1, 80, ms)).is_ok());
    // The edges that are accepted.
    assert!(build(RollingConfig::new(1, MAX_BUCKETS, ms)).is_ok());
    assert!(build(RollingConfig::new(1, 10, Duration::from_secs(365 * 86_400))).is_ok());
}

#[test]
fn builder_sets_the_policy() {
    let layer = LimitLayer::builder(
        &Backend::in_process(),
        RollingConfig::new(7, 4, Duration::from_micros(250_900)),
    )
    .name("api")
    .key(crate::key::GlobalKey)
    .build()
    .unwrap();
    let policy = layer.limiter().policy();
    assert_eq!(policy.name(), "api");
    assert_eq!(policy.quota(), 7);
    // Sub-millisecond parts of the interval are ignored: 4 × 250 ms.
    assert_eq!(policy.window(), Duration::from_secs(1));
    assert_eq!(
        layer.limiter().store.remote.redis_key(b"k"),
        b"ratelimit:{v1:k}:rolling:api"
    );
    let missing = LimitLayer::builder(
        &Backend::in_process(),
        RollingConfig::new(7, 0, Duration::from_secs(1)),
    )
    .name("api")
    .build()
    .unwrap_err();
    assert_eq!(missing, ConfigError::Zero { setting: "buckets" });
}

#[tokio::test(start_paused = true)]
async fn admits_exactly_the_limit_within_a_window() {
    let limiter = limiter(5);
    let mut states = Vec::new();
    for _ in 0..7 {
        states.push(limiter.check(b"k", ONE).await.state);
        tokio::time::advance(10 * MS).await;
    }
    use State::*;
    assert_eq!(
        states,
        [Allowed, Allowed, Allowed, Allowed, HitQuota, OverQuota, OverQuota]
    );
    let over = limiter.check(b"k", ONE).await;
    assert_eq!(over.source, Source::InProcess);
    assert_eq!(over.limit, 5);
    assert_eq!(over.remaining, 0);
    assert!(over.retry_after.unwrap() <= Duration::from_secs(1));
    // Another key is unaffected.
    assert_eq!(limiter.check(b"other", ONE).await.remaining, 4);
}

#[tokio::test(start_paused = true)]
async fn buckets_expire_one_at_a_time() {
    let limiter = limiter(4);
    let t0 = align(&limiter, 100_000).await;
    // Two units in bucket 0, two in bucket 3.
    limiter.check(b"k", cost(2)).await;
    tokio::time::advance(300 * MS).await;
    let d = limiter.check(b"k", cost(2)).await;
    assert_eq!(d.state, State::HitQuota);
    // Every unit expires when bucket 3 does, 1.3 s after t0.
    assert_eq!(d.reset, Duration::from_millis(1_000));
    // Until bucket 0 ends (1 s after t0), nothing fits.
    tokio::time::advance(Duration::from_micros(
        1_000_000 - 1 - (now_us(&limiter) - t0),
    ))
    .await;
    let over = limiter.check(b"k", ONE).await;
    assert_eq!(over.state, State::OverQuota);
    assert_eq!(over.retry_after, Some(Duration::from_micros(1)));
    assert_eq!(over.reset, Duration::from_micros(300_001));
    // Then bucket 0's two units are free, but not bucket 3's.
    tokio::time::advance(Duration::from_micros(1)).await;
    assert_eq!(limiter.check(b"k", ONE).await.state, State::Allowed);
    assert_eq!(limiter.check(b"k", ONE).await.state, State::HitQuota);
    assert_eq!(limiter.check(b"k", ONE).await.state, State::OverQuota);
    // A whole window after the last admission, everything is free again.
    tokio::time::advance(Duration::from_secs(1)).await;
    let d = limiter.check(b"k", cost(4)).await;
    assert_eq!(d.state, State::HitQuota);
}

#[tokio::test(start_paused = true)]
async fn weighted_costs() {
    let limiter = limiter(10);
    let d = limiter.check(b"k", cost(6)).await;
    assert_eq!((d.state, d.remaining), (State::Allowed, 4));
    // Too much for what is left: rejected, and not counted.
    let over = limiter.check(b"k", cost(5)).await;
    assert_eq!((over.state, over.remaining), (State::OverQuota, 4));
    let d = limiter.check(b"k", cost(4)).await;
    assert_eq!((d.state, d.remaining), (State::HitQuota, 0));
    // More than the whole limit can never pass, and says so without a retry-after.
    let never = limiter.check(b"fresh", cost(11)).await;
    assert_eq!(never.state, State::ExceedsCapacity);
    assert_eq!(never.retry_after, None);
    assert_eq!(never.reset, Duration::from_secs(1));
    assert_eq!(
        limiter.check(b"fresh", cost(10)).await.state,
        State::HitQuota
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_exact() {
    let limiter = limiter(10);
    // Each cost waits for a different bucket to expire.
    for units in [1, 3, 4, 6, 9, 10] {
        let key = format!("k{units}");
        // Units spread over several buckets, at odd times within them.
        for (wait_ms, u) in [(0, 3), (130, 2), (170, 4), (260, 1)] {
            tokio::time::advance(wait_ms * MS).await;
            assert!(limiter.check(key.as_bytes(), cost(u)).await.is_admitted());
        }
        tokio::time::advance(20 * MS).await;
        let over = limiter.check(key.as_bytes(), cost(units)).await;
        assert_eq!(over.state, State::OverQuota, "cost {units}");
        let retry = over.retry_after.unwrap();
        assert!(retry > Duration::ZERO && retry <= Duration::from_secs(1));
        assert!(retry <= over.reset);
        tokio::time::advance(retry - Duration::from_micros(1)).await;
        let early = limiter.check(key.as_bytes(), cost(units)).await;
        assert_eq!(early.state, State::OverQuota, "cost {units}, just before");
        assert_eq!(early.retry_after, Some(Duration::from_micros(1)));
        tokio::time::advance(Duration::from_micros(1)).await;
        let d = limiter.check(key.as_bytes(), cost(units)).await;
        assert!(d.is_admitted(), "cost {units}, after retry-after: {d:?}");
    }
}

const WINDOW_US: u64 = 1_000_000;
const INTERVAL_US: u64 = 100_000;

/// Sends a burst of `limit` unit requests spread over the last `spread_ms` before a
/// window edge, then unit probes every `probe_ms` for two windows from `phase_us`
/// after the edge. Returns the admission times (µs since the start of the window).
async fn straddle(
    limiter: &RollingWindowLimiter,
    key: &str,
    limit: u64,
    spread_ms: u64,
    probe_ms: u64,
    phase_us: u64,
) -> Vec<u64> {
    let t0 = align(limiter, WINDOW_US).await;
    let burst_start = WINDOW_US - spread_ms * 1_000;
    let burst = (0..limit).map(|i| burst_start + i * spread_ms * 1_000 / limit);
    let probes = (0..)
        .map(|i| WINDOW_US + phase_us + i * probe_ms * 1_000)
        .take_while(|&at| at < 3 * WINDOW_US);
    let mut admitted = Vec::new();
    for (i, at) in burst.chain(probes).enumerate() {
        tokio::time::advance(Duration::from_micros(t0 + at - now_us(limiter))).await;
        let d = limiter.check(key.as_bytes(), ONE).await;
        if (i as u64) < limit {
            assert!(d.is_admitted(), "the burst fits");
        }
        if d.is_admitted() {
            admitted.push(at);
        }
    }
    admitted
}

/// The rolling window's guarantees on a list of admission times (µs, one per unit).
fn assert_rolling_bounds(admitted: &[u64], limit: usize, buckets: u64, interval_us: u64) {
    let window_us = buckets * interval_us;
    let count = |from: u64, to_excl: u64| {
        admitted
            .iter()
            .filter(|&&t| t >= from && t < to_excl)
            .count()
    };
    for &s in admitted {
        // Any span of buckets - 1 intervals (closed) holds at most the limit.
        let short = count(s, s + (buckets - 1) * interval_us + 1);
        assert!(
            short <= limit,
            "{short} admitted within (B-1) intervals from {s}"
        );
        // Any window-long span: at most the limit plus its first interval (the error
        // is at most one bucket).
        let long = count(s, s + window_us);
        let first = count(s, s + interval_us);
        assert!(
            long <= limit + first,
            "{long} admitted in the window from {s} ({first} in its first interval)"
        );
    }
    // Any `buckets` consecutive buckets hold at most the limit.
    let last = admitted.iter().max().copied().unwrap_or(0);
    for k in 0..=last / interval_us {
        let aligned = count(k * interval_us, (k + buckets) * interval_us);
        assert!(
            aligned <= limit,
            "{aligned} admitted in buckets {k}..+{buckets}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn straddling_a_window_edge_does_not_double_the_limit() {
    let limit = 10;
    let limiter = limiter(limit);
    let mut scenario = 0;
    for spread_ms in [1, 100, 250, 500] {
        for probe_ms in [1, 7, 10, 33] {
            for phase_us in [0, 1, 40_000, 99_999] {
                scenario += 1;
                let key = format!("s{scenario}");
                let admitted = straddle(&limiter, &key, limit, spread_ms, probe_ms, phase_us).await;
                // A fixed window would admit `limit` more right after the edge; here
                // nothing is admitted until the burst's first bucket has expired.
                let burst_start = WINDOW_US - spread_ms * 1_000;
                let first_free = (burst_start / INTERVAL_US) * INTERVAL_US + WINDOW_US;
                let early = admitted
                    .iter()
                    .filter(|&&t| t >= WINDOW_US && t < first_free)
                    .count();
                assert_eq!(early, 0, "scenario {scenario}: {admitted:?}");
                // Probing for two windows admits again once the burst's buckets end.
                assert!(admitted.len() > 10, "scenario {scenario}: {admitted:?}");
                assert_rolling_bounds(&admitted, 10, 10, INTERVAL_US);
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_sweep_of_probes_never_beats_the_bounds() {
    // Many keys probed at different rates and phases, some with weighted costs.
    let limiter = build(RollingConfig::new(6, 4, 50 * MS)).unwrap();
    let t0 = align(&limiter, 200_000).await;
    let mut admitted: Vec<Vec<u64>> = vec![Vec::new(); 12];
    for step in 0..2_000u64 {
        let at = now_us(&limiter) - t0;
        for (k, times) in admitted.iter_mut().enumerate() {
            let k = k as u64;
            // Key k asks every (k % 5 + 1) ms with cost k % 3 + 1.
            if (step + k) % (k % 5 + 1) == 0 {
                let c = (k % 3 + 1) as u32;
                if limiter
                    .check(format!("key{k}").as_bytes(), cost(c))
                    .await
                    .is_admitted()
                {
                    times.extend(std::iter::repeat_n(at, c as usize));
                }
            }
        }
        tokio::time::advance(MS).await;
    }
    for times in &admitted {
        assert!(times.len() >= 6 * 5, "{}", times.len());
        assert_rolling_bounds(times, 6, 4, 50_000);
    }
}

#[tokio::test(start_paused = true)]
async fn fallback_source_is_reported() {
    let limiter = limiter(1);
    let d = limiter.store.local(b"k", 1, Source::Fallback, true);
    assert_eq!(d.source, Source::Fallback);
    assert_eq!(d.state, State::HitQuota);
}

#[tokio::test(start_paused = true)]
async fn the_fallback_applies_its_share_of_the_limit() {
    let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let backend = Backend::builder()
        .redis(pool)
        .fallback_share(0.25)
        .build()
        .unwrap();
    let limiter =
        RollingWindowLimiter::new(&backend, "t", RollingConfig::new(10, 10, 100 * MS)).unwrap();
    assert_eq!(limiter.policy().quota(), 10);
    let store = &limiter.store;
    let first = store.local(b"k", 1, Source::Fallback, true);
    assert_eq!(
        (first.state, first.limit, first.remaining),
        (State::Allowed, 2, 1)
    );
    assert_eq!(
        store.local(b"k", 1, Source::Fallback, true).state,
        State::HitQuota
    );
    let over = store.local(b"k", 1, Source::Fallback, true);
    assert_eq!(
        (over.state, over.source),
        (State::OverQuota, Source::Fallback)
    );
    // A cost within the limit but above the fallback's share waits for a window.
    let big = store.local(b"other", 3, Source::Fallback, true);
    assert_eq!(big.state, State::OverQuota);
    assert_eq!(big.retry_after, Some(Duration::from_secs(1)));
}

#[test]
fn redis_replies_are_read() {
    let limiter = limiter(10);
    let store = &limiter.store;
    let d = store.decide(&[1, 10, 0, 950], ONE).unwrap();
    assert_eq!(
        (d.state, d.remaining, d.source),
        (State::HitQuota, 0, Source::Redis)
    );
    assert_eq!(d.reset, Duration::from_millis(950));
    let d = store.decide(&[1, 3, 0, 950], ONE).unwrap();
    assert_eq!((d.state, d.remaining), (State::Allowed, 7));
    let d = store.decide(&[0, 9, 120, 990], cost(2)).unwrap();
    assert_eq!((d.state, d.remaining), (State::OverQuota, 1));
    assert_eq!(d.retry_after, Some(Duration::from_millis(120)));
    assert!(store.decide(&[1, 2, 3], ONE).is_none());
    assert!(store.decide(&[2, 2, 3, 4], ONE).is_none());
    assert!(store.decide(&[1, -2, 3, 4], ONE).is_none());
}
