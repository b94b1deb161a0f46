//! Deploys without a pause: the previous version of the crate and this one share one
//! `redis-server` under traffic, as they do during a rolling deploy. Each reads the
//! other's states: the limits hold exactly (nothing admitted beyond them, nothing
//! refused below them) and every decision comes from Redis (no script error).
//!
//! The previous version's traffic comes from `tests/upgrade/driver.rs` built against it
//! (in a worktree of the commit in `tests/upgrade/BASE`): `scripts/two-versions` builds
//! both drivers and runs this test with their paths in `UPGRADE_OLD_DRIVER` and
//! `UPGRADE_NEW_DRIVER`; `scripts/test` runs it.

mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use support::RedisServer;

/// What each limit admits per key over the test (an hour-long window; refills of one
/// token per hour add nothing in seconds).
const LIMITS: [(&str, u64); 4] = [("period", 50), ("token", 50), ("rolling", 50), ("set", 30)];
const KEYS: u64 = 4;

fn driver(which: &str) -> String {
    let var = format!("UPGRADE_{which}_DRIVER");
    std::env::var(&var).unwrap_or_else(|_| {
        panic!("{var} is not set: run `scripts/two-versions`, which builds both versions' drivers")
    })
}

/// Runs the drivers in `runs` (one after the other within a group, groups in parallel)
/// and adds up what they admitted per (limit, key).
fn run(
    redis: &RedisServer,
    time: &str,
    prefix: &str,
    runs: &[&[(&str, Option<u64>)]],
) -> BTreeMap<(String, String), (u64, u64, u64)> {
    let groups: Vec<_> = runs
        .iter()
        .map(|group| {
            let group: Vec<(String, Option<u64>)> =
                group.iter().map(|(w, s)| (w.to_string(), *s)).collect();
            let url = redis.url();
            let (time, prefix) = (time.to_owned(), prefix.to_owned());
            std::thread::spawn(move || {
                let mut outputs = Vec::new();
                for (which, stop_at) in group {
                    let mut command = Command::new(driver(&which));
                    command
                        .env("REDIS_URL", &url)
                        .env("TIME_SOURCE", &time)
                        .env("KEY_PREFIX", &prefix)
                        .env("KEYS", KEYS.to_string())
                        .env("DURATION_MS", "2500")
                        .stdout(Stdio::piped());
                    if let Some(stop_at) = stop_at {
                        command.env("STOP_AT", stop_at.to_string());
                    }
                    let output = command.output().expect("the driver runs");
                    assert!(output.status.success(), "{which} driver failed: {output:?}");
                    outputs.push((which, String::from_utf8(output.stdout).unwrap()));
                }
                outputs
            })
        })
        .collect();
    let mut total = BTreeMap::new();
    for group in groups {
        for (which, output) in group.join().unwrap() {
            for line in output.lines() {
                let fields: Vec<&str> = line.split(' ').collect();
                assert_eq!(fields.len(), 6, "{which}: {line}");
                let entry: &mut (u64, u64, u64) = total
                    .entry((fields[1].to_owned(), fields[2].to_owned()))
                    .or_default();
                entry.0 += fields[3].parse::<u64>().unwrap();
                entry.1 += fields[4].parse::<u64>().unwrap();
                let other: u64 = fields[5].parse().unwrap();
                assert_eq!(other, 0, "{which}: decisions not from Redis: {line}");
                entry.2 += other;
            }
        }
    }
    total
}

/// Every limit admitted exactly its limit on every key.
fn assert_exact(what: &str, total: &BTreeMap<(String, String), (u64, u64, u64)>, prefix: &str) {
    for (limit, max) in LIMITS {
        for key in 0..KEYS {
            let key = format!("{prefix}{key}");
            let (units, decisions, _) = total
                .get(&(limit.to_owned(), key.clone()))
                .copied()
                .unwrap_or_default();
            assert_eq!(
                units, max,
                "{what}: {limit} on {key} admitted {units} units in {decisions} decisions; \
                 its limit is {max}"
            );
        }
    }
}

fn each_clock(time: &str) {
    let redis = RedisServer::start();
    // The old version first, stopping halfway: the new one must read its states.
    let total = run(&redis, time, "a", &[&[("OLD", Some(20)), ("NEW", None)]]);
    assert_exact("the new version after the old", &total, "a");
    // And the other way round: the old version must read the new one's states.
    let total = run(&redis, time, "b", &[&[("NEW", Some(20)), ("OLD", None)]]);
    assert_exact("the old version after the new", &total, "b");
    // Both at once on the same keys.
    let total = run(&redis, time, "c", &[&[("OLD", None)], &[("NEW", None)]]);
    assert_exact("both versions at once", &total, "c");
}

#[test]
#[ignore = "needs the previous version's driver: run `scripts/two-versions`"]
fn two_versions_share_one_redis_on_the_server_clock() {
    each_clock("server");
}

#[test]
#[ignore = "needs the previous version's driver: run `scripts/two-versions`"]
fn two_versions_share_one_redis_on_the_callers_clock() {
    each_clock("caller");
}
