//! The windows the `calendar` example prints, through the function it calls
//! (`Calendar::window_on`, the limiter's own code).

use std::time::{SystemTime, UNIX_EPOCH};

use tower_redis_ratelimit::{Calendar, Weekday};

const HOUR: u64 = 3_600;

fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// `start` and `end` as Unix seconds, and the length in hours.
fn window(calendar: &Calendar, (y, m, d): (i16, i8, i8)) -> (u64, u64, u64) {
    let window = calendar.window_on(y, m, d).expect("a window");
    let (start, end) = (unix(window.start), unix(window.end));
    (start, end, (end - start) / HOUR)
}

#[test]
fn a_new_york_day_when_the_clocks_go_forward_lasts_23_hours() {
    let (start, end, hours) = window(&Calendar::day("America/New_York"), (2026, 3, 8));
    // 2026-03-08T05:00:00Z (midnight EST) to 2026-03-09T04:00:00Z (midnight EDT).
    assert_eq!((start, end, hours), (1_772_946_000, 1_773_028_800, 23));
    let (_, _, hours) = window(&Calendar::day("America/New_York"), (2026, 11, 1));
    assert_eq!(hours, 25);
}

#[test]
fn february_2028_in_shanghai_lasts_29_days() {
    let (start, _, hours) = window(&Calendar::month("Asia/Shanghai"), (2028, 2, 10));
    // 2028-02-01T00:00:00+08:00.
    assert_eq!(start, 1_832_947_200);
    assert_eq!(hours, 29 * 24);
}

#[test]
fn a_berlin_week_holds_its_date() {
    let calendar = Calendar::week("Europe/Berlin", Weekday::Monday);
    let (start, end, hours) = window(&calendar, (2026, 10, 25));
    // Monday 2026-10-19T00:00:00+02:00 to Monday 2026-10-26T00:00:00+01:00.
    assert_eq!((start, end), (1_792_360_800, 1_792_969_200));
    assert_eq!(hours, 7 * 24 + 1);
    let sunday = Calendar::week("Europe/Berlin", Weekday::Sunday);
    let (start, _, _) = window(&sunday, (2026, 10, 25));
    // Sunday 2026-10-25T00:00:00+02:00 (the clocks go back at 03:00).
    assert_eq!(start, 1_792_879_200);
}

#[test]
fn bad_input_is_named() {
    let error = Calendar::day("Europe/Atlantis")
        .window_on(2026, 1, 1)
        .unwrap_err();
    assert!(error.to_string().contains("Europe/Atlantis"), "{error}");
    assert!(Calendar::day("UTC").window_on(2026, 2, 30).is_err());
}
