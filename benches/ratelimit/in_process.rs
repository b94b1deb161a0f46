//! `in_process/*`: one check of each algorithm on `Backend::in_process()`, next to a
//! keyed `governor::RateLimiter` with the same quota called directly.
//!
//! - `in_process/allowed`: huge rates, so every check is admitted; `hot_key` checks one
//!   key again and again, `100k_keys` cycles through 100 000 keys whose state exists
//!   already (a lookup, not an insertion).
//! - `in_process/refused`: one hot key over its quota, so every check is refused.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use governor::{Quota, RateLimiter};
use tokio::runtime::Runtime;
use tower_redis_ratelimit::{Backend, Limiter, State};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
/// Tokens per second in the `allowed` groups: a token per microsecond, the most the
/// limiters accept.
const HUGE_RATE: u64 = 1_000_000;
/// The bucket of the `allowed` groups: far more than a benchmark loop can spend.
const HUGE_BURST: u32 = 1_000_000_000;
/// A fixed-window or rolling quota that is never reached.
const HUGE_QUOTA: u64 = 1 << 60;

/// The three limiters with a quota nothing reaches, and governor with the token bucket's.
struct Limiters {
    token: TokenBucketLimiter,
    period: PeriodLimiter,
    rolling: RollingWindowLimiter,
    governor: governor::DefaultKeyedRateLimiter<String>,
}

impl Limiters {
    fn allowing(backend: &Backend) -> Self {
        let rate = HUGE_RATE;
        let burst = NonZeroU32::new(HUGE_BURST).expect("not zero");
        Self {
            token: TokenBucketLimiter::new(
                backend,
                "bench",
                TokenBucketConfig::new(rate, Duration::from_secs(1), u64::from(HUGE_BURST)),
            )
            .expect("valid token bucket"),
            period: PeriodLimiter::new(
                backend,
                "bench",
                PeriodConfig::new(HUGE_QUOTA, Duration::from_secs(60)),
            )
            .expect("valid period"),
            rolling: RollingWindowLimiter::new(
                backend,
                "bench",
                RollingConfig::new(HUGE_QUOTA, 10, Duration::from_millis(100)),
            )
            .expect("valid rolling window"),
            governor: RateLimiter::dashmap(
                Quota::with_period(Duration::from_micros(1))
                    .expect("not zero")
                    .allow_burst(burst),
            ),
        }
    }

    /// One unit per hour: after the first check every check is refused.
    fn refusing(backend: &Backend) -> Self {
        let hour = Duration::from_secs(3_600);
        Self {
            token: TokenBucketLimiter::new(backend, "bench", TokenBucketConfig::new(1, hour, 1))
                .expect("valid token bucket"),
            period: PeriodLimiter::new(backend, "bench", PeriodConfig::new(1, hour))
                .expect("valid period"),
            rolling: RollingWindowLimiter::new(
                backend,
                "bench",
                RollingConfig::new(1, 60, Duration::from_secs(60)),
            )
            .expect("valid rolling window"),
            governor: RateLimiter::dashmap(Quota::with_period(hour).expect("not zero")),
        }
    }
}

/// Benches `limiter.check` over `keys`, one key per iteration in turn.
fn bench_limiter<L: Limiter>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    id: BenchmarkId,
    limiter: &L,
    keys: &[String],
) {
    group.bench_function(id, |b| {
        let mut i = 0;
        b.to_async(rt).iter(|| {
            i = (i + 1) % keys.len();
            limiter.check(keys[i].as_bytes(), ONE)
        });
    });
}

/// Benches `governor.check_key` over `keys` the same way (through the same async loop).
fn bench_governor(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    id: BenchmarkId,
    governor: &governor::DefaultKeyedRateLimiter<String>,
    keys: &[String],
) {
    group.bench_function(id, |b| {
        let mut i = 0;
        b.to_async(rt).iter(|| {
            i = (i + 1) % keys.len();
            std::future::ready(black_box(governor.check_key(&keys[i])).is_ok())
        });
    });
}

/// Checks every key once (so the measured checks find existing state) and asserts the
/// states the group expects.
fn warm(rt: &Runtime, limiters: &Limiters, keys: &[String], admitted: bool) {
    rt.block_on(async {
        for key in keys {
            for limiter in [
                &limiters.token as &dyn Limiter,
                &limiters.period,
                &limiters.rolling,
            ] {
                let state = limiter.check(key.as_bytes(), ONE).await.state;
                let ok = matches!(state, State::Allowed | State::HitQuota);
                assert!(ok || !admitted, "{key} was refused: {state:?}");
            }
            let _ = limiters.governor.check_key(key);
        }
        if !admitted {
            for limiter in [
                &limiters.token as &dyn Limiter,
                &limiters.period,
                &limiters.rolling,
            ] {
                let state = limiter.check(keys[0].as_bytes(), ONE).await.state;
                assert_eq!(state, State::OverQuota, "the refused group must refuse");
            }
            assert!(limiters.governor.check_key(&keys[0]).is_err());
        }
    });
}

fn bench_all(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    limiters: &Limiters,
    keys: &[String],
    label: &str,
) {
    bench_limiter(
        group,
        rt,
        BenchmarkId::new("token_bucket", label),
        &limiters.token,
        keys,
    );
    bench_governor(
        group,
        rt,
        BenchmarkId::new("governor", label),
        &limiters.governor,
        keys,
    );
    bench_limiter(
        group,
        rt,
        BenchmarkId::new("period", label),
        &limiters.period,
        keys,
    );
    bench_limiter(
        group,
        rt,
        BenchmarkId::new("rolling", label),
        &limiters.rolling,
        keys,
    );
}

pub(crate) fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // The backend's clock follows tokio's: create it inside the runtime.
    let backend = rt.block_on(async { Backend::in_process() });
    let hot = crate::keys(1);
    let many = crate::keys(crate::key_count(100_000));
    let many_label = if many.len() == 100_000 {
        "100k_keys".to_owned()
    } else {
        format!("{}_keys", many.len())
    };

    let mut group = c.benchmark_group("in_process/allowed");
    group.throughput(Throughput::Elements(1));
    let limiters = Limiters::allowing(&backend);
    warm(&rt, &limiters, &hot, true);
    bench_all(&mut group, &rt, &limiters, &hot, "hot_key");
    let limiters = Limiters::allowing(&backend);
    warm(&rt, &limiters, &many, true);
    bench_all(&mut group, &rt, &limiters, &many, &many_label);
    group.finish();

    let mut group = c.benchmark_group("in_process/refused");
    group.throughput(Throughput::Elements(1));
    let limiters = Limiters::refusing(&backend);
    warm(&rt, &limiters, &hot, false);
    bench_all(&mut group, &rt, &limiters, &hot, "hot_key");
    group.finish();
}
