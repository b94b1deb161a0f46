//! In-process checks of dynamic limits on each algorithm, on tokio's paused clock.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backend::Backend;
use crate::decision::{Source, State};
use crate::limiter::Limiter;

const ONE: NonZeroU32 = NonZeroU32::MIN;

/// A source answering `limit` for every key but `default`, counting its calls.
fn source(limit: &Arc<AtomicU64>, calls: &Arc<AtomicUsize>) -> impl LimitSource {
    let (limit, calls) = (limit.clone(), calls.clone());
    move |key: crate::key::TaggedKey<'_>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let answer = (key.value() != b"default").then(|| limit.load(Ordering::SeqCst));
        async move { Ok::<_, BoxError>(answer) }
    }
}

async fn states<L: Limiter + ?Sized>(limiter: &L, key: &[u8], n: usize) -> Vec<State> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(limiter.check(key, ONE).await.state);
    }
    out
}

#[tokio::test(start_paused = true)]
async fn each_algorithm_takes_the_source_limit() {
    let backend = Backend::in_process();
    let limit = Arc::new(AtomicU64::new(2));
    let calls = Arc::new(AtomicUsize::new(0));
    let minute = Duration::from_secs(60);
    use State::*;

    let period = DynamicLimits::new(PeriodConfig::new(5, minute), source(&limit, &calls))
        .build(&backend, "p")
        .unwrap();
    assert_eq!(
        states(&period, b"k", 3).await,
        [Allowed, HitQuota, OverQuota]
    );
    let d = period.check(b"default", ONE).await;
    assert_eq!(
        (d.limit, d.source, d.policy_header),
        (5, Source::InProcess, None)
    );
    let d = period.check(b"k", ONE).await;
    assert_eq!(d.policy_header.unwrap(), "\"p\";q=2;w=60");

    let rolling = DynamicLimits::new(
        RollingConfig::new(5, 6, Duration::from_secs(10)),
        source(&limit, &calls),
    )
    .build(&backend, "r")
    .unwrap();
    assert_eq!(
        states(&rolling, b"k", 3).await,
        [Allowed, HitQuota, OverQuota]
    );

    // Burst 10 at 10 per second; the source's 2 is the burst, the rate 2 per second.
    let bucket = DynamicLimits::new(
        TokenBucketConfig::new(10, Duration::from_secs(1), 10),
        source(&limit, &calls),
    )
    .build(&backend, "t")
    .unwrap();
    assert_eq!(
        states(&bucket, b"k", 3).await,
        [Allowed, HitQuota, OverQuota]
    );
    tokio::time::advance(Duration::from_millis(500)).await;
    assert_eq!(states(&bucket, b"k", 2).await, [HitQuota, OverQuota]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "one lookup per key and limiter"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_limit_applies_after_the_ttl() {
    let backend = Backend::in_process();
    let limit = Arc::new(AtomicU64::new(2));
    let calls = Arc::new(AtomicUsize::new(0));
    let limiter = DynamicLimits::new(
        PeriodConfig::new(5, Duration::from_secs(3_600)),
        source(&limit, &calls),
    )
    .ttl(Duration::from_secs(10))
    .build(&backend, "p")
    .unwrap();
    assert_eq!(limiter.check(b"k", ONE).await.limit, 2);
    limit.store(7, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(limiter.check(b"k", ONE).await.limit, 2, "fresh for the TTL");
    tokio::time::advance(Duration::from_secs(1)).await;
    // Stale: served once more while the refresh runs.
    assert_eq!(limiter.check(b"k", ONE).await.limit, 2);
    tokio::task::yield_now().await;
    assert_eq!(limiter.check(b"k", ONE).await.limit, 7);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // An invalid answer is a failed lookup: the last known limit stays.
    limit.store(0, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(10)).await;
    limiter.check(b"k", ONE).await;
    tokio::task::yield_now().await;
    assert_eq!(limiter.check(b"k", ONE).await.limit, 7);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_source_follows_the_failure_policy() {
    let backend = Backend::in_process();
    let panicking = |_: crate::key::TaggedKey<'_>| async {
        if true {
            panic!("the source panicked (expected by this test)");
        }
        Ok::<_, BoxError>(Some(1))
    };
    let minute = Duration::from_secs(60);
    let last_known = DynamicLimits::new(PeriodConfig::new(5, minute), panicking)
        .build(&backend, "a")
        .unwrap();
    let d = last_known.check(b"k", ONE).await;
    assert_eq!((d.state, d.limit), (State::Allowed, 5));
    let refuse = DynamicLimits::new(PeriodConfig::new(5, minute), panicking)
        .on_error(OnSourceError::Refuse)
        .error_ttl(Duration::from_millis(300))
        .build(&backend, "b")
        .unwrap();
    let d = refuse.check(b"k", ONE).await;
    assert_eq!((d.state, d.source), (State::OverQuota, Source::FailClosed));
    assert_eq!(d.retry_after, Some(Duration::from_millis(300)));
}

/// A key's count carries over when its limit changes, in process as on Redis (one
/// state per key and name, whatever the limit): 3 spent under a limit of 5; once the
/// source says 4 (the first check after the TTL still applies 5 and looks the new
/// limit up: a fourth unit), a fifth is refused; a limit raised to 6 admits what is
/// left under it, not a fresh limit's 6.
#[tokio::test(start_paused = true)]
async fn a_keys_count_carries_over_when_its_limit_changes() {
    let backend = Backend::in_process();
    let limit = Arc::new(AtomicU64::new(5));
    let calls = Arc::new(AtomicUsize::new(0));
    let minute = Duration::from_secs(60);
    let ttl = Duration::from_secs(1);
    use State::*;

    let period = DynamicLimits::new(PeriodConfig::new(10, minute), source(&limit, &calls))
        .ttl(ttl)
        .build(&backend, "p")
        .unwrap();
    let rolling = DynamicLimits::new(
        RollingConfig::new(10, 6, Duration::from_secs(10)),
        source(&limit, &calls),
    )
    .ttl(ttl)
    .build(&backend, "r")
    .unwrap();
    // (An hour to refill: nothing refills during the test.)
    let hour = Duration::from_secs(3_600);
    let token = DynamicLimits::new(TokenBucketConfig::new(10, hour, 10), source(&limit, &calls))
        .ttl(ttl)
        .build(&backend, "t")
        .unwrap();
    // Under a limit raised to 6: the windows count 4 and admit two more; the bucket
    // keeps a time (when it is full again), read at the new rate and burst: one more.
    let raised = [Allowed, HitQuota, OverQuota];
    let limiters: [(&str, &dyn Limiter, [State; 3]); 3] = [
        ("period", &period, raised),
        ("rolling", &rolling, raised),
        ("token", &token, [HitQuota, OverQuota, OverQuota]),
    ];
    // Lets the lookups the checks started finish.
    let looked_up = || tokio::time::sleep(Duration::from_millis(1));
    for (name, limiter, after_raise) in limiters {
        limit.store(5, Ordering::SeqCst);
        limiter.check(b"k", ONE).await;
        looked_up().await;
        assert_eq!(states(limiter, b"k", 2).await, [Allowed, Allowed], "{name}");
        limit.store(4, Ordering::SeqCst);
        tokio::time::advance(ttl * 2).await;
        assert_eq!(states(limiter, b"k", 1).await, [Allowed], "{name}");
        looked_up().await;
        let d = limiter.check(b"k", ONE).await;
        assert_eq!((d.state, d.limit), (OverQuota, 4), "{name}: {d:?}");
        limit.store(6, Ordering::SeqCst);
        tokio::time::advance(ttl * 2).await;
        limiter.check(b"k", ONE).await;
        looked_up().await;
        assert_eq!(states(limiter, b"k", 3).await, after_raise, "{name}");
    }
}
