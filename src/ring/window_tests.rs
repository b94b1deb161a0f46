//! Tests of the statistics window.

use super::*;

const I: Duration = Duration::from_secs(1);

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

/// A window whose grid starts at the returned instant.
fn window(size: usize) -> (RollingWindow, Instant) {
    let base = Instant::now();
    (RollingWindow::new_at(nz(size), I, base).unwrap(), base)
}

fn sums_at(w: &RollingWindow, now: Instant) -> Vec<f64> {
    let mut sums = Vec::new();
    w.reduce_at(now, |b| sums.push(b.sum));
    sums
}

fn counts_at(w: &RollingWindow, now: Instant) -> Vec<u64> {
    let mut counts = Vec::new();
    w.reduce_at(now, |b| counts.push(b.count));
    counts
}

#[test]
fn is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RollingWindow>();
    assert_send_sync::<RollingWindowError>();
}

#[test]
fn zero_interval_is_an_error() {
    let err = RollingWindow::new(nz(3), Duration::ZERO).unwrap_err();
    assert_eq!(err, RollingWindowError::ZeroInterval);
    assert_eq!(
        err.to_string(),
        "rolling window interval must be greater than zero"
    );
}

#[test]
fn accessors() {
    let w = RollingWindow::new(nz(7), Duration::from_millis(250)).unwrap();
    assert_eq!(w.size(), 7);
    assert_eq!(w.interval(), Duration::from_millis(250));
    assert!(format!("{w:?}").contains("RollingWindow"));
}

#[test]
fn empty_window_visits_all_zero_buckets() {
    let (w, t0) = window(3);
    assert_eq!(sums_at(&w, t0), [0.0, 0.0, 0.0]);
    assert_eq!(counts_at(&w, t0), [0, 0, 0]);
}

/// The scenario from go-zero's documentation.
#[test]
fn documented_scenario() {
    let (w, t0) = window(3);
    w.add_at(t0, 1.0);
    let t1 = t0 + I;
    w.add_at(t1, 2.0);
    w.add_at(t1, 3.0);
    let t2 = t1 + I;
    for v in [4.0, 5.0, 6.0] {
        w.add_at(t2, v);
    }
    assert_eq!(sums_at(&w, t2), [1.0, 5.0, 15.0]);
    assert_eq!(counts_at(&w, t2), [1, 2, 3]);

    let t3 = t2 + I;
    w.add_at(t3, 7.0);
    assert_eq!(sums_at(&w, t3), [5.0, 15.0, 7.0]);
    assert_eq!(counts_at(&w, t3), [2, 3, 1]);

    // After a long pause everything has expired.
    let later = t3 + 3 * I;
    assert!(sums_at(&w, later).is_empty());
    let mut total = 0.0;
    w.reduce_at(later, |b| total += b.sum);
    assert_eq!(total, 0.0);
    let much_later = t3 + 100 * I;
    assert!(sums_at(&w, much_later).is_empty());
}

#[test]
fn documented_scenario_ignoring_current() {
    let base = Instant::now();
    let w = RollingWindow::new_at(nz(3), I, base)
        .unwrap()
        .ignore_current(true);
    w.add_at(base, 1.0);
    w.add_at(base + I, 2.0);
    w.add_at(base + I, 3.0);
    let t2 = base + 2 * I;
    for v in [4.0, 5.0, 6.0] {
        w.add_at(t2, v);
    }
    assert_eq!(sums_at(&w, t2), [1.0, 5.0]);
    // Later within the same interval: still the current bucket.
    assert_eq!(sums_at(&w, t2 + I / 2), [1.0, 5.0]);
    // Once time moves on, the newest bucket is complete and visited.
    assert_eq!(sums_at(&w, t2 + I), [5.0, 15.0]);
    assert_eq!(sums_at(&w, t2 + 2 * I), [15.0]);
    assert!(sums_at(&w, t2 + 3 * I).is_empty());

    w.add_at(t2 + I, 7.0);
    assert_eq!(sums_at(&w, t2 + I), [5.0, 15.0]);
    assert_eq!(counts_at(&w, t2 + I), [2, 3]);
}

#[test]
fn single_bucket_ignoring_current_visits_nothing_until_it_completes() {
    let base = Instant::now();
    let w = RollingWindow::new_at(nz(1), I, base)
        .unwrap()
        .ignore_current(true);
    w.add_at(base, 4.0);
    assert!(sums_at(&w, base).is_empty());
    // A single bucket of one interval: once complete it has also expired.
    assert!(sums_at(&w, base + I).is_empty());
}

#[test]
fn single_bucket() {
    let (w, t0) = window(1);
    w.add_at(t0, 1.0);
    w.add_at(t0 + I / 2, 2.0);
    assert_eq!(sums_at(&w, t0 + I / 2), [3.0]);
    assert!(sums_at(&w, t0 + I).is_empty());
    w.add_at(t0 + I, 5.0);
    assert_eq!(sums_at(&w, t0 + I), [5.0]);
    assert_eq!(counts_at(&w, t0 + I), [1]);
}

#[test]
fn partial_interval_adds_to_same_bucket() {
    let (w, t0) = window(3);
    w.add_at(t0, 1.0);
    w.add_at(t0 + I / 2, 1.0);
    w.add_at(t0 + I - Duration::from_nanos(1), 1.0);
    assert_eq!(sums_at(&w, t0 + I / 2), [0.0, 0.0, 3.0]);
    assert_eq!(counts_at(&w, t0 + I / 2), [0, 0, 3]);
    w.add_at(t0 + I, 1.0);
    assert_eq!(sums_at(&w, t0 + I), [0.0, 3.0, 1.0]);
}

#[test]
fn grid_stays_anchored_at_creation() {
    let (w, t0) = window(3);
    // 1.5 intervals in: the bucket starting at t0 + I.
    w.add_at(t0 + I * 3 / 2, 1.0);
    // 2.2 intervals in: only 0.7 intervals after the previous add, but
    // past the grid line at t0 + 2I, so a new bucket.
    w.add_at(t0 + I * 11 / 5, 2.0);
    assert_eq!(sums_at(&w, t0 + I * 11 / 5), [0.0, 1.0, 2.0]);
    // 2.9 intervals in: same bucket as the previous add.
    w.add_at(t0 + I * 29 / 10, 3.0);
    assert_eq!(sums_at(&w, t0 + I * 29 / 10), [0.0, 1.0, 5.0]);
    // After a long pause the grid is still anchored at t0.
    w.add_at(t0 + I * 100 + I / 2, 4.0);
    w.add_at(t0 + I * 101, 5.0);
    assert_eq!(sums_at(&w, t0 + I * 101), [0.0, 4.0, 5.0]);
}

#[test]
fn skipped_intervals_leave_empty_buckets() {
    let (w, t0) = window(4);
    w.add_at(t0, 1.0);
    w.add_at(t0 + 2 * I, 2.0);
    assert_eq!(sums_at(&w, t0 + 2 * I), [0.0, 1.0, 0.0, 2.0]);
    assert_eq!(counts_at(&w, t0 + 2 * I), [0, 1, 0, 1]);
}

#[test]
fn reduce_skips_expired_buckets_without_mutating() {
    let (w, t0) = window(3);
    w.add_at(t0, 1.0);
    w.add_at(t0 + I, 2.0);
    w.add_at(t0 + 2 * I, 3.0);
    assert_eq!(sums_at(&w, t0 + 2 * I), [1.0, 2.0, 3.0]);
    assert_eq!(sums_at(&w, t0 + 3 * I), [2.0, 3.0]);
    assert_eq!(sums_at(&w, t0 + 4 * I), [3.0]);
    assert!(sums_at(&w, t0 + 5 * I).is_empty());
    // Reading ahead did not change the window.
    assert_eq!(sums_at(&w, t0 + 2 * I), [1.0, 2.0, 3.0]);
}

#[test]
fn advance_of_exactly_size_intervals_clears_everything() {
    let (w, t0) = window(3);
    for (i, v) in [1.0, 2.0, 3.0].into_iter().enumerate() {
        w.add_at(t0 + I * i as u32, v);
    }
    let t2 = t0 + 2 * I;
    // One nanosecond short of `size` intervals: the newest bucket survives.
    let almost = t2 + 3 * I - Duration::from_nanos(1);
    assert_eq!(sums_at(&w, almost), [3.0]);
    // Exactly `size` intervals: nothing survives.
    assert!(sums_at(&w, t2 + 3 * I).is_empty());
    w.add_at(t2 + 3 * I, 10.0);
    assert_eq!(sums_at(&w, t2 + 3 * I), [0.0, 0.0, 10.0]);
    assert_eq!(counts_at(&w, t2 + 3 * I), [0, 0, 1]);
}

#[test]
fn huge_advance_does_not_overflow() {
    let base = Instant::now();
    let w = RollingWindow::new_at(nz(5), Duration::from_nanos(1), base).unwrap();
    w.add_at(base, 1.0);
    // About a century of one-nanosecond intervals.
    let later = base + Duration::from_secs(100 * 365 * 24 * 60 * 60);
    assert!(sums_at(&w, later).is_empty());
    w.add_at(later, 2.0);
    assert_eq!(sums_at(&w, later), [0.0, 0.0, 0.0, 0.0, 2.0]);
    w.add_at(later + Duration::from_nanos(1), 3.0);
    assert_eq!(
        sums_at(&w, later + Duration::from_nanos(1)),
        [0.0, 0.0, 0.0, 2.0, 3.0]
    );

    let (w, t0) = window(3);
    w.add_at(t0, 1.0);
    let later = t0 + Duration::from_secs(u32::MAX.into());
    w.add_at(later, 2.0);
    assert_eq!(sums_at(&w, later), [0.0, 0.0, 2.0]);
}

#[test]
fn time_going_backwards_does_not_panic() {
    let (w, t0) = window(3);
    w.add_at(t0 + 2 * I, 1.0);
    // Earlier than the newest bucket's start: counted in the newest bucket.
    w.add_at(t0, 2.0);
    w.add_at(t0 + I, 3.0);
    assert_eq!(sums_at(&w, t0), [0.0, 0.0, 6.0]);
    assert_eq!(sums_at(&w, t0 + 2 * I), [0.0, 0.0, 6.0]);
    assert_eq!(counts_at(&w, t0 + 2 * I), [0, 0, 3]);
    // Also before the window was created.
    let before = t0.checked_sub(Duration::from_secs(10)).unwrap_or(t0);
    w.add_at(before, 4.0);
    assert_eq!(sums_at(&w, before), [0.0, 0.0, 10.0]);
}

#[test]
fn shared_between_threads() {
    let w = RollingWindow::new(nz(10), Duration::from_secs(3600)).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..1000 {
                    w.add(0.5);
                }
            });
        }
    });
    // The window may have crossed one grid line while the threads ran.
    assert_eq!(w.count(), 4000);
    assert_eq!(w.sum(), 2000.0);
}

#[test]
fn recovers_from_poisoned_lock() {
    let w = RollingWindow::new(nz(3), Duration::from_secs(3600)).unwrap();
    w.add(1.0);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        w.reduce(|_| panic!("boom"));
    }));
    assert!(caught.is_err());
    w.add(2.0);
    assert_eq!(w.count(), 2);
    assert_eq!(w.sum(), 3.0);
}

#[tokio::test(start_paused = true)]
async fn driven_by_paused_tokio_clock() {
    use tokio::time::advance;

    let w = RollingWindow::new(nz(3), I).unwrap();
    let ignoring = RollingWindow::new(nz(3), I).unwrap().ignore_current(true);
    let both = |v: f64| {
        w.add(v);
        ignoring.add(v);
    };

    both(1.0);
    advance(I).await;
    both(2.0);
    both(3.0);
    advance(I).await;
    for v in [4.0, 5.0, 6.0] {
        both(v);
    }
    let sums = |w: &RollingWindow| w.buckets().iter().map(|b| b.sum).collect::<Vec<_>>();
    assert_eq!(sums(&w), [1.0, 5.0, 15.0]);
    assert_eq!(sums(&ignoring), [1.0, 5.0]);
    assert_eq!(w.sum(), 21.0);
    assert_eq!(w.count(), 6);
    assert_eq!(ignoring.sum(), 6.0);
    assert_eq!(ignoring.count(), 3);

    // Less than an interval: still the same bucket.
    advance(I / 2).await;
    both(0.5);
    assert_eq!(sums(&w), [1.0, 5.0, 15.5]);

    // Crosses the grid line at 3 intervals after creation.
    advance(I / 2).await;
    both(7.0);
    assert_eq!(sums(&w), [5.0, 15.5, 7.0]);
    assert_eq!(sums(&ignoring), [5.0, 15.5]);

    advance(3 * I).await;
    assert!(w.buckets().is_empty());
    assert_eq!(w.sum(), 0.0);
    assert_eq!(w.count(), 0);
    assert!(ignoring.buckets().is_empty());

    both(8.0);
    assert_eq!(sums(&w), [0.0, 0.0, 8.0]);
    assert_eq!(ignoring.sum(), 0.0);
}

#[test]
fn the_documented_statistics() {
    // Ten buckets of 100 ms each: statistics over the last second.
    let size = NonZeroUsize::new(10).expect("non-zero");
    let window = RollingWindow::new(size, Duration::from_millis(100)).unwrap();

    // Record request outcomes: 1.0 for a failure, 0.0 for a success.
    window.add(1.0);
    window.add(0.0);
    window.add(0.0);
    window.add(1.0);

    assert_eq!(window.count(), 4);
    assert_eq!(window.sum(), 2.0);

    // Or aggregate the live buckets yourself, oldest first.
    let mut failures = 0.0;
    let mut total = 0;
    window.reduce(|bucket| {
        failures += bucket.sum;
        total += bucket.count;
    });
    assert_eq!(failures / total as f64, 0.5);
}
