//! A cached dynamic limit allocates no more per check than the plain limiter: the
//! allocations are counted around in-process checks on a single-threaded runtime.

use std::alloc::System;
use std::num::NonZeroU32;
use std::time::Duration;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tower_redis_ratelimit::limit::Algorithm;
use tower_redis_ratelimit::DynamicLimits;
use tower_redis_ratelimit::PeriodConfig;
use tower_redis_ratelimit::{Backend, Limiter};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The allocations over 1000 checks of `key`: the fewest of three rounds, since the
/// counter is process-wide and the test harness's other threads may allocate during one
/// (a check that allocates does so in every round).
async fn count<L: Limiter>(limiter: &L, key: &[u8]) -> usize {
    let mut fewest = usize::MAX;
    for _ in 0..3 {
        let region = Region::new(GLOBAL);
        for _ in 0..1_000 {
            let decision = limiter.check(key, NonZeroU32::MIN).await;
            assert!(decision.is_admitted());
        }
        fewest = fewest.min(region.change().allocations);
    }
    fewest
}

#[tokio::test(flavor = "current_thread")]
async fn a_cached_limit_allocates_no_more_than_a_fixed_one() {
    let backend = Backend::in_process();
    let config = PeriodConfig::new(1_000_000, Duration::from_secs(3_600));
    let plain = config.build(&backend, "plain").unwrap();
    let source = |key: tower_redis_ratelimit::key::TaggedKey<'_>| {
        let vip = key.value() == b"vip";
        async move { Ok::<_, std::io::Error>(vip.then_some(2_000_000)) }
    };
    let dynamic = DynamicLimits::new(config, source)
        .ttl(Duration::from_secs(3_600))
        .build(&backend, "dynamic")
        .unwrap();
    // Warm up: the first check of each key stores its state and looks its limit up.
    for key in [&b"vip"[..], b"default"] {
        plain.check(key, NonZeroU32::MIN).await;
        dynamic.check(key, NonZeroU32::MIN).await;
    }
    tokio::task::yield_now().await;
    assert_eq!(
        dynamic.check(b"vip", NonZeroU32::MIN).await.limit,
        2_000_000
    );
    let fixed = count(&plain, b"vip").await;
    let from_source = count(&dynamic, b"vip").await;
    let default = count(&dynamic, b"default").await;
    eprintln!(
        "allocations per 1000 checks: fixed {fixed}, source limit {from_source}, default {default}"
    );
    assert!(from_source <= fixed, "{from_source} > {fixed}");
    assert!(default <= fixed, "{default} > {fixed}");
}
