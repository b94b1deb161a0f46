use super::*;

fn build(rate: u64, period: Duration, burst: u64) -> Result<TokenBucketLimiter, ConfigError> {
    TokenBucketLimiter::new(
        &Backend::in_process(),
        "t",
        TokenBucketConfig::new(rate, period, burst),
    )
}

#[test]
fn invalid_configurations() {
    let sec = Duration::from_secs(1);
    assert_eq!(
        build(0, sec, 1).unwrap_err(),
        ConfigError::Zero { setting: "rate" }
    );
    assert_eq!(
        build(1, sec, 0).unwrap_err(),
        ConfigError::Zero { setting: "burst" }
    );
    assert_eq!(
        build(1, Duration::ZERO, 1).unwrap_err(),
        ConfigError::ZeroDuration { setting: "period" }
    );
    assert!(matches!(
        build(1, sec, u64::from(u32::MAX) + 1).unwrap_err(),
        ConfigError::TooLarge {
            setting: "burst",
            ..
        }
    ));
    assert!(matches!(
        build(2_000_000_000, sec, 1).unwrap_err(),
        ConfigError::Conflict { .. }
    ));
    assert!(matches!(
        build(1_000_001, sec, 1).unwrap_err(),
        ConfigError::Conflict { .. }
    ));
    assert!(build(1_000_000, sec, 1).is_ok());
    assert_eq!(
        build(1, Duration::from_secs(86_400 * 365), 20).unwrap_err(),
        ConfigError::TooLong { setting: "period" }
    );
}

#[test]
fn policy_advertises_burst_and_refill_time() {
    let limiter = build(100, Duration::from_secs(1), 10).unwrap();
    assert_eq!(limiter.policy().quota(), 10);
    assert_eq!(limiter.policy().window(), Duration::from_millis(100));
}

#[test]
fn local_keys_do_not_collide_for_similar_keys() {
    let limiter = build(1, Duration::from_secs(1), 1).unwrap();
    let a = limiter.store.local_key(b"user:1");
    let b = limiter.store.local_key(b"user:2");
    assert_ne!(a, b);
    assert_eq!(a, limiter.store.local_key(b"user:1"));
}

#[tokio::test(start_paused = true)]
async fn idle_buckets_are_dropped() {
    let limiter = build(10, Duration::from_secs(1), 5).unwrap();
    for i in 0..100 {
        let _ = limiter
            .check(format!("k{i}").as_bytes(), NonZeroU32::MIN)
            .await;
    }
    assert_eq!(limiter.store.buckets.len(), 100);
    tokio::time::advance(SWEEP_EVERY + Duration::from_secs(1)).await;
    // The clock is sampled once per SWEEP_SAMPLE checks.
    for _ in 0..SWEEP_SAMPLE {
        let _ = limiter.check(b"fresh", NonZeroU32::MIN).await;
    }
    // The sweep runs on tokio's blocking pool, off the request path: wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while limiter.store.buckets.len() > 1 {
        let len = limiter.store.buckets.len();
        assert!(std::time::Instant::now() < deadline, "{len} buckets left");
        std::thread::sleep(Duration::from_millis(1));
    }
}
