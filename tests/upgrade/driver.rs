//! The traffic of the two-version test (`tests/upgrade.rs`, run by `scripts/two-versions`):
//! this one file is built against this version of the crate and against the previous
//! one (copied into a worktree of it as an example), so it uses only API both have.
//!
//! It checks four limits (a fixed window, a token bucket, a rolling window and a set of
//! a token bucket and a fixed window) on `KEYS` keys named `<KEY_PREFIX><n>`, with costs
//! 1 to 3, from `TASKS` tasks, for `DURATION_MS`, or until it has admitted `STOP_AT`
//! units on every key of every limit; then prints one line per limit and key:
//! `admitted <limit> <key> <units> <decisions> <not from redis>`.
//!
//! Environment: `REDIS_URL` (required), `TIME_SOURCE` (`server`, the default, or
//! `caller`), `KEY_PREFIX` (default `k`), `KEYS` (default 4), `TASKS` (default 8),
//! `DURATION_MS` (default 2000), `STOP_AT` (default: no stop).

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tower_redis_ratelimit::{Backend, Limiter, Source, State};
// The previous version (tests/upgrade/BASE) kept each algorithm and the backend in a
// module of its own; scripts/two-versions builds the driver against it with
// `--cfg upgrade_base`.
#[cfg(upgrade_base)]
use tower_redis_ratelimit::{
    backend::TimeSource,
    period::{PeriodConfig, PeriodLimiter},
    rolling::{RollingConfig, RollingWindowLimiter},
    set::{LimitSet, SetLimiter},
    token_bucket::{TokenBucketConfig, TokenBucketLimiter},
};
#[cfg(not(upgrade_base))]
use tower_redis_ratelimit::{
    LimitSet, PeriodConfig, PeriodLimiter, RollingConfig, RollingWindowLimiter, SetLimiter,
    TimeSource, TokenBucketConfig, TokenBucketLimiter,
};

const HOUR: Duration = Duration::from_secs(3600);

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Units admitted, decisions, decisions not from Redis: per (limit, key).
type Tally = Arc<Mutex<BTreeMap<(String, String), (u64, u64, u64)>>>;

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").expect("REDIS_URL");
    let time = match std::env::var("TIME_SOURCE").as_deref() {
        Ok("caller") => TimeSource::Caller,
        _ => TimeSource::Server,
    };
    let prefix: String = env("KEY_PREFIX", "k".to_owned());
    let keys: u32 = env("KEYS", 4);
    let tasks: u32 = env("TASKS", 8);
    let duration = Duration::from_millis(env("DURATION_MS", 2000));
    let stop_at: u64 = env("STOP_AT", u64::MAX);

    let backend = Backend::builder()
        .redis_url(url)
        .prefix("upgrade")
        .time_source(time)
        // A loaded CI machine runs two of these and a redis-server on two cores.
        .call_timeout(Duration::from_secs(2))
        .build()
        .expect("a valid backend");
    let limiters: Vec<(&str, Arc<dyn Limiter>)> = vec![
        (
            "period",
            Arc::new(PeriodLimiter::new(&backend, "period", PeriodConfig::new(50, HOUR)).unwrap()),
        ),
        (
            "token",
            Arc::new(
                TokenBucketLimiter::new(&backend, "token", TokenBucketConfig::new(1, HOUR, 50))
                    .unwrap(),
            ),
        ),
        (
            "rolling",
            Arc::new(
                RollingWindowLimiter::new(
                    &backend,
                    "rolling",
                    RollingConfig::new(50, 60, Duration::from_secs(60)),
                )
                .unwrap(),
            ),
        ),
        (
            "set",
            Arc::new(
                SetLimiter::new(
                    &backend,
                    "set",
                    LimitSet::new()
                        .limit("burst", TokenBucketConfig::new(1, HOUR, 30))
                        .limit("hourly", PeriodConfig::new(40, HOUR)),
                )
                .unwrap(),
            ),
        ),
    ];
    let tally: Tally = Arc::default();
    let start = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let limiters = limiters.clone();
        let tally = Arc::clone(&tally);
        let prefix = prefix.clone();
        handles.push(tokio::spawn(async move {
            let mut n = u64::from(task);
            while start.elapsed() < duration {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let (name, limiter) = &limiters[(n >> 33) as usize % limiters.len()];
                let key = format!("{prefix}{}", (n >> 40) as u32 % keys);
                let slot = (name.to_string(), key.clone());
                {
                    let tally = tally.lock().unwrap();
                    if tally.get(&slot).is_some_and(|t| t.0 >= stop_at) {
                        let done = tally.values().filter(|t| t.0 >= stop_at).count();
                        if done == limiters.len() * keys as usize {
                            return;
                        }
                        continue;
                    }
                }
                let cost = 1 + (n >> 50) as u32 % 3;
                let decision = limiter
                    .check(key.as_bytes(), NonZeroU32::new(cost).unwrap())
                    .await;
                let admitted = matches!(decision.state, State::Allowed | State::HitQuota);
                {
                    let mut tally = tally.lock().unwrap();
                    let entry = tally.entry(slot).or_default();
                    if admitted {
                        entry.0 += u64::from(cost);
                    }
                    entry.1 += 1;
                    if decision.source != Source::Redis && decision.source != Source::DenyCache {
                        entry.2 += 1;
                    }
                }
                if !admitted {
                    // Refused (mostly from the deny cache): leave the CPU to the others.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    for ((name, key), (units, decisions, other)) in tally.lock().unwrap().iter() {
        println!("admitted {name} {key} {units} {decisions} {other}");
    }
}
