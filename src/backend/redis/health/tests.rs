//! The breaker's judgement, its gradual return and the states it reports.

use super::*;

fn breaker() -> Breaker {
    Breaker::new(
        BreakerConfig::default(),
        Duration::from_millis(100),
        "test".into(),
    )
}

#[tokio::test(start_paused = true)]
async fn scattered_failures_do_not_open() {
    let b = breaker();
    // 10 % failures, evenly spread, for 10 s.
    for i in 0..4000 {
        let outcome = if i % 10 == 0 {
            Outcome::Failure
        } else {
            Outcome::Success
        };
        assert_eq!(b.record(outcome), None);
        tokio::time::advance(Duration::from_micros(2500)).await;
    }
    assert_eq!(b.state(), RedisState::Healthy);
    assert_eq!(b.switches(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_timeouts_behind_one_slow_reply_does_not_open() {
    let b = breaker();
    for _ in 0..400 {
        b.record(Outcome::Success);
        tokio::time::advance(Duration::from_millis(2)).await;
    }
    // 25 calls fail within 50 ms (head-of-line behind one held reply), then all is well.
    for _ in 0..25 {
        assert_eq!(b.record(Outcome::Failure), None);
        tokio::time::advance(Duration::from_millis(2)).await;
    }
    b.record(Outcome::Success);
    assert_eq!(b.state(), RedisState::Healthy);
}

#[tokio::test(start_paused = true)]
async fn a_high_failure_ratio_opens() {
    let b = breaker();
    for _ in 0..10 {
        b.record(Outcome::Success);
    }
    let mut trip = None;
    for _ in 0..20 {
        trip = trip.or(b.record(Outcome::Failure));
    }
    assert!(matches!(trip, Some(Trip::Ratio { .. })), "{trip:?}");
    assert_eq!(b.state(), RedisState::Fallback);
    assert_eq!(b.switches(), 1);
    assert!(!b.admit());
}

/// Three failures `gap` apart, with nothing answered between them: the third opens the
/// breaker as a streak.
async fn three_failures_apart_are_a_streak(gap: Duration) {
    let b = breaker();
    assert_eq!(b.record(Outcome::Failure), None);
    tokio::time::advance(gap).await;
    assert_eq!(b.record(Outcome::Failure), None);
    tokio::time::advance(gap).await;
    let trip = b.record(Outcome::Failure);
    assert!(
        matches!(trip, Some(Trip::Streak { failures: 3, .. })),
        "{trip:?}"
    );
    assert_eq!(b.state(), RedisState::Fallback);
}

#[tokio::test(start_paused = true)]
async fn few_calls_that_all_fail_open_after_the_streak_span() {
    three_failures_apart_are_a_streak(Duration::from_millis(150)).await;
}

#[tokio::test(start_paused = true)]
async fn failures_far_apart_with_nothing_answered_between_are_a_streak() {
    // A quiet service: a check every 5 s, and Redis answers none of them.
    three_failures_apart_are_a_streak(Duration::from_secs(5)).await;
}

#[tokio::test(start_paused = true)]
async fn a_success_ends_the_streak() {
    let b = breaker();
    for _ in 0..10 {
        assert_eq!(b.record(Outcome::Failure), None);
        assert!(b.failing());
        tokio::time::advance(Duration::from_millis(150)).await;
        assert_eq!(b.record(Outcome::Failure), None);
        tokio::time::advance(Duration::from_millis(150)).await;
        b.note(Outcome::Success);
        assert!(!b.failing());
    }
    assert_eq!(b.state(), RedisState::Healthy);
}

#[tokio::test(start_paused = true)]
async fn noted_failures_make_a_streak_but_never_a_ratio() {
    // Many checks giving up on one slow connection attempt at once: no ratio.
    let b = breaker();
    for _ in 0..100 {
        assert_eq!(b.note(Outcome::Failure), None);
    }
    b.record(Outcome::Success);
    assert_eq!(b.state(), RedisState::Healthy);
    // Over time they are a streak.
    b.note(Outcome::Failure);
    tokio::time::advance(Duration::from_millis(100)).await;
    b.note(Outcome::Failure);
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(matches!(
        b.note(Outcome::Failure),
        Some(Trip::Streak { failures: 3, .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn in_fallback_nothing_is_judged() {
    let b = breaker();
    b.force_open();
    for _ in 0..100 {
        assert_eq!(b.record(Outcome::Failure), None);
        assert_eq!(b.note(Outcome::Failure), None);
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    assert!(!b.failing());
    assert_eq!(b.switches(), 1);
}

#[tokio::test(start_paused = true)]
async fn recovery_sends_a_growing_share_then_closes() {
    let b = breaker();
    b.force_open();
    b.start_recovery();
    assert_eq!(b.state(), RedisState::Recovering);
    let first = (0..1000).filter(|_| b.admit()).count();
    assert!((50..=200).contains(&first), "{first}");
    tokio::time::advance(Duration::from_millis(500)).await;
    let half = (0..1000).filter(|_| b.admit()).count();
    assert!((450..=650).contains(&half), "{half}");
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(b.admit());
    assert_eq!(b.state(), RedisState::Healthy);
    assert_eq!(b.switches(), 1);
}

#[tokio::test(start_paused = true)]
async fn time_away_ends_with_the_recovery_however_late_it_is_noticed() {
    let b = breaker();
    tokio::time::advance(Duration::from_millis(1)).await;
    b.force_open();
    tokio::time::advance(Duration::from_secs(2)).await;
    b.start_recovery();
    // Nobody asks for an hour; the recovery (1 s) was over long before.
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(b.state(), RedisState::Healthy);
    let away = Duration::from_nanos(b.away_done_ns.load(Ordering::Acquire));
    assert_eq!(away, Duration::from_secs(3));
    assert_eq!(b.away_counted_s.load(Ordering::Acquire), 3);
}

#[test]
fn invalid_settings_are_refused() {
    let ok = BreakerConfig::default();
    assert!(ok.validate().is_ok());
    for bad in [
        BreakerConfig { min_calls: 0, ..ok },
        BreakerConfig {
            failure_ratio: 0.0,
            ..ok
        },
        BreakerConfig {
            failure_ratio: f64::NAN,
            ..ok
        },
        BreakerConfig {
            window: Duration::ZERO,
            ..ok
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}
