//! Prints the calendar window that holds a date, computed by the code the limiter runs
//! ([`Calendar::window_on`]), so that anyone can check a zone's rules:
//!
//! ```text
//! cargo run --example calendar -- day America/New_York 2026-03-08          # 23 hours
//! cargo run --example calendar -- month Asia/Shanghai 2028-02-10           # 29 days
//! cargo run --example calendar -- week Europe/Berlin 2026-10-25 monday     # 7 days and an hour
//! ```
//!
//! Times print as RFC 3339 in UTC. The zone's rules come from the system's time zone
//! database, or the copy built into the crate where the system has none.

use std::time::SystemTime;

use tower_redis_ratelimit::{Calendar, Weekday};

const USAGE: &str = "usage: calendar day|week|month ZONE YYYY-MM-DD [FIRST-WEEKDAY]";

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The error's message (an unknown zone names it), not its `Debug` form.
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [unit, zone, date, rest @ ..] = args.as_slice() else {
        return Err(USAGE.into());
    };
    let calendar = match (unit.as_str(), rest) {
        ("day", []) => Calendar::day(zone),
        ("month", []) => Calendar::month(zone),
        ("week", []) => Calendar::week(zone, Weekday::Monday),
        ("week", [first]) => Calendar::week(zone, first.parse()?),
        _ => return Err(USAGE.into()),
    };
    let (year, month, day) = parse_date(date).ok_or(USAGE)?;
    let window = calendar.window_on(year, month, day)?;
    let length = window.end.duration_since(window.start)?;
    println!("{unit} in {zone} holding {date}");
    println!("start:  {}", rfc3339(window.start)?);
    println!("end:    {}", rfc3339(window.end)?);
    let hours = length.as_secs_f64() / 3_600.0;
    if unit == "day" {
        println!("length: {hours} hours");
    } else {
        // Whole days, and the hours a DST change adds or takes (a 169-hour week).
        let days = length.as_secs() / 86_400;
        let rest = (length.as_secs() % 86_400) as f64 / 3_600.0;
        match rest {
            0.0 => println!("length: {days} days ({hours} hours)"),
            rest if rest > 12.0 => {
                let short = 24.0 - rest;
                println!("length: {} days - {short} h ({hours} hours)", days + 1);
            }
            rest => println!("length: {days} days + {rest} h ({hours} hours)"),
        }
    }
    Ok(())
}

/// `YYYY-MM-DD`.
fn parse_date(text: &str) -> Option<(i16, i8, i8)> {
    let mut parts = text.splitn(3, '-');
    let year = parts.next()?.parse().ok()?;
    let month = parts.next()?.parse().ok()?;
    let day = parts.next()?.parse().ok()?;
    Some((year, month, day))
}

/// A time as RFC 3339 in UTC (`2026-03-08T05:00:00Z`).
fn rfc3339(time: SystemTime) -> Result<String, Box<dyn std::error::Error>> {
    Ok(jiff::Timestamp::try_from(time)?.to_string())
}
