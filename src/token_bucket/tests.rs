//! Unit tests of the token bucket on the in-process host: configuration errors, GCRA
//! arithmetic and weighted costs, on tokio's paused clock.

use super::*;
use crate::limiter::Limiter;

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
    let buckets = &limiter.store.buckets;
    let a = buckets.key(b"user:1");
    assert_ne!(a, buckets.key(b"user:2"));
    assert_eq!(a, buckets.key(b"user:1"));
    let other = build(1, Duration::from_secs(1), 1).unwrap();
    assert_ne!(a, other.store.buckets.key(b"user:1"), "limiters apart");
}

#[tokio::test(start_paused = true)]
async fn in_process_buckets_are_bounded() {
    let backend = Backend::builder().max_local_keys(1_000).build().unwrap();
    let limiter = TokenBucketLimiter::new(
        &backend,
        "t",
        TokenBucketConfig::new(10, Duration::from_secs(1), 5),
    )
    .unwrap();
    // A throttled key, hit again and again while a flood of new keys goes by.
    for _ in 0..10 {
        let _ = limiter.check(b"hot", NonZeroU32::MIN).await;
    }
    for i in 0..10_000 {
        let _ = limiter
            .check(format!("k{i}").as_bytes(), NonZeroU32::MIN)
            .await;
        if i % 100 == 0 {
            let hot = limiter.check(b"hot", NonZeroU32::MIN).await;
            assert_eq!(hot.state, State::OverQuota, "the hot key kept its state");
        }
    }
    let store = limiter.store.buckets.store();
    assert!(store.len() <= 1_000, "{}", store.len());
    assert!(store.evictions() >= 9_000, "{}", store.evictions());
}
