//! The tests of `local.rs`.

use super::*;
use crate::clock::ManualClock;
use crate::period::window::Window;

#[test]
fn a_state_is_three_words() {
    assert_eq!(std::mem::size_of::<Slot>(), 32);
    assert_eq!(std::mem::size_of::<Key>(), 16);
}

const MINUTE_US: u64 = 60_000_000;

/// One hit on `limiter`'s `key`, in a window of `period_us` with room for `quota`.
fn hit(store: &LocalStore, limiter: u64, key: u64, quota: u64, period_us: u64, now_us: u64) -> u64 {
    let schedule = crate::period::window::Schedule {
        period_us,
        offset_us: None,
        calendar: None,
    };
    store.update(
        store.key(limiter, &key.to_le_bytes()),
        Window::default,
        |w| w.hit(1, quota, schedule, now_us).count,
    )
}

/// Issue 53, item 5: a flood of new keys does not refill a key that is being
/// limited while the store holds keys back at their full limit. The limited key is
/// seen once (a client that stopped retrying), so it waits in the probation queue
/// the flood churns: before, the flood's first new key dropped it.
#[test]
fn a_flood_drops_the_keys_that_carry_nothing_before_a_limited_one() {
    let clock = ManualClock::new(1_000 * MINUTE_US);
    let store = LocalStore::new(100_000, "t", Clock::Manual(clock.clone()));
    let t0 = clock.now_us();
    // Keys of another limit, whose one-second windows then end: they fill the main
    // queue (where the first keys of a filling store go), so the next key waits in
    // the probation queue.
    for key in 0..200_000 {
        hit(&store, 2, key, 10, 1_000_000, t0);
    }
    // The limited key: its one hit spent its whole quota of 1 for an hour.
    assert_eq!(hit(&store, 1, 0, 1, 60 * MINUTE_US, t0), 1);
    clock.set_us(t0 + 2_000_000);
    let now = clock.now_us();
    // A flood of 80 000 new keys (fewer than the full keys held) of the hour's limit.
    for key in 1..=80_000 {
        hit(&store, 1, key, 1, 60 * MINUTE_US, now);
    }
    assert!(store.evictions() > 0, "the flood made room");
    let limited = store.key(1, &0u64.to_le_bytes());
    let kept = store.peek(limited, Window::default, |w| w.carries(now));
    assert!(
        kept,
        "the limited key was dropped: it would come back with its full limit"
    );
}

/// Passing over the flood's keys never trades the main queue's keys for them: a key
/// hit again and again keeps its state through a flood of keys that all carry
/// something.
#[test]
fn a_flood_of_limited_keys_leaves_the_main_queue_alone() {
    let clock = ManualClock::new(1_000 * MINUTE_US);
    let store = LocalStore::new(100_000, "t", Clock::Manual(clock.clone()));
    let now = clock.now_us();
    let hot = u64::MAX;
    for key in 0..300_000 {
        if key % 100 == 0 {
            let count = hit(&store, 2, hot, 1_000_000, 60 * MINUTE_US, now);
            assert_eq!(count, key / 100 + 1, "the hot key lost its count at {key}");
        }
        hit(&store, 1, key, 1, 60 * MINUTE_US, now);
    }
    assert!(store.evictions() >= 200_000, "{}", store.evictions());
}

/// When only keys that carry something are left, the next candidate goes: the
/// bound holds whatever the keys hold.
#[test]
fn the_bound_holds_when_every_key_is_limited() {
    let clock = ManualClock::new(1_000 * MINUTE_US);
    let store = LocalStore::new(100_000, "t", Clock::Manual(clock.clone()));
    let now = clock.now_us();
    for key in 0..500_000 {
        hit(&store, 1, key, 1, 60 * MINUTE_US, now);
    }
    assert!(store.len() <= 100_000, "{} keys", store.len());
    assert!(store.len() >= 50_000, "{} keys", store.len());
}

#[test]
fn the_bound_is_never_exceeded() {
    for max in [1, 10, 100, 1_000, 5_000, 100_001] {
        let store = LocalStore::new(max, "t", Clock::new());
        let limiter = 7;
        for i in 0..(max * 3) {
            store.update(store.key(limiter, &i.to_le_bytes()), Tat::default, |_| ());
        }
        assert!(store.len() as u64 <= max, "{} of {max}", store.len());
        assert!(store.len() as u64 >= max / 2, "{} of {max}", store.len());
    }
}
