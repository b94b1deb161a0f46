//! What a check touches on Redis: each limit's own key and nothing else, for keys that
//! are not blocked (a blocked key's limits are marked instead, see
//! `src/backend/decide/block.rs`), and every way a block is made or outlived keeps the
//! key refused on every instance.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use support::monitor::{monitor_words, Monitor};
use support::RedisServer;
use tower_redis_ratelimit::{Backend, Limiter, Source};
use tower_redis_ratelimit::{Calendar, PeriodConfig, PeriodLimiter, UtcOffset};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// A limiter of each algorithm and of sets (each algorithm first), by name.
fn limiters(backend: &Backend, large: bool, lockout: Option<Duration>) -> Vec<Box<dyn Limiter>> {
    let (n, n32) = if large {
        (1_000_000, 1_000_000)
    } else {
        (2, 2)
    };
    let lock = |config: PeriodConfig| match lockout {
        Some(d) => config.lockout(d),
        None => config,
    };
    let bucket = |config: TokenBucketConfig| match lockout {
        Some(d) => config.lockout(d),
        None => config,
    };
    let rolling = |config: RollingConfig| match lockout {
        Some(d) => config.lockout(d),
        None => config,
    };
    let set = |set: LimitSet| match lockout {
        Some(d) => set.lockout(d),
        None => set,
    };
    vec![
        Box::new(
            TokenBucketLimiter::new(
                backend,
                "bucket",
                bucket(TokenBucketConfig::new(n32, SEC, n32)),
            )
            .unwrap(),
        ),
        Box::new(
            PeriodLimiter::new(backend, "fixed", lock(PeriodConfig::new(n, 60 * SEC))).unwrap(),
        ),
        Box::new(
            PeriodLimiter::new(
                backend,
                "aligned",
                // (A day: a window that ends during a test starts again and reads the
                // block, as it should; a minute's did, once, in a fresh-clone run.)
                lock(PeriodConfig::new(n, 86_400 * SEC).align(UtcOffset::from_hours(2))),
            )
            .unwrap(),
        ),
        Box::new(
            PeriodLimiter::new(
                backend,
                "calendar",
                lock(PeriodConfig::calendar(n, Calendar::day("Europe/Paris"))),
            )
            .unwrap(),
        ),
        Box::new(
            RollingWindowLimiter::new(
                backend,
                "rolling",
                rolling(RollingConfig::new(n, 10, 100 * MS)),
            )
            .unwrap(),
        ),
        Box::new(
            SetLimiter::new(
                backend,
                "pair",
                set(LimitSet::new()
                    .requests("rpm", TokenBucketConfig::new(n32, SEC, n32))
                    .limit("tpm", PeriodConfig::new(n, 60 * SEC))),
            )
            .unwrap(),
        ),
        Box::new(
            SetLimiter::new(
                backend,
                "window-first",
                set(LimitSet::new()
                    .limit("daily", PeriodConfig::new(n, 60 * SEC))
                    .limit("rolling", RollingConfig::new(n, 10, 100 * MS))),
            )
            .unwrap(),
        ),
    ]
}

fn backend(redis: &RedisServer, functions: bool) -> Backend {
    support::backend_builder()
        .redis(redis.pool())
        .deny_cache(0)
        .coalesce(false)
        .engine_functions(functions)
        // (A busy machine must not turn a slow call into the fallback's answer.)
        .call_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// The engine paths this server has: Redis Functions (when it has them) and `EVALSHA`.
fn paths(redis: &RedisServer) -> Vec<bool> {
    if redis.has_functions() {
        vec![true, false]
    } else {
        // (Not a skip: the test runs on the one path this server has.)
        eprintln!("{}: no Redis Functions, EVALSHA only", redis.version());
        vec![false]
    }
}

/// The engine's commands among MONITOR's `lines` (but the server's clock, `TIME`, read
/// once per call: no key), and those of them that named a block key.
fn engine_commands(lines: &[String]) -> (u64, Vec<String>) {
    let mut commands = 0;
    let mut blocks = Vec::new();
    for line in lines {
        let Some((client, words)) = monitor_words(line) else {
            continue;
        };
        let time = words
            .first()
            .is_some_and(|w| w.eq_ignore_ascii_case(b"TIME"));
        if !client.contains("lua") || time {
            continue;
        }
        commands += 1;
        if words.iter().any(|w| w.windows(8).any(|s| s == b"}:block:")) {
            blocks.push(line.clone());
        }
    }
    (commands, blocks)
}

/// Checks of keys never blocked read and write their limits' keys alone: no command
/// of the engine names a block key, on either engine path, for windows and buckets
/// that hold a count and for keys whose state has expired (a bucket that refills in a
/// millisecond holds nothing between checks). (A fixed window reads the block when its
/// window starts: the first check of each key here, before the record.)
#[tokio::test(flavor = "multi_thread")]
async fn a_check_reads_its_limits_keys_alone() {
    let redis = RedisServer::start();
    for functions in paths(&redis) {
        let backend = backend(&redis, functions);
        let limiters = limiters(&backend, true, None);
        let keys: Vec<Vec<u8>> = (0..20).map(|i| format!("k{i}").into_bytes()).collect();
        for limiter in &limiters {
            for key in &keys {
                assert!(limiter.check(key, ONE).await.is_admitted());
            }
        }
        let monitor = Monitor::start(redis.port());
        let _ = monitor.until(redis.port(), "reads-start");
        for _ in 0..3 {
            for limiter in &limiters {
                for key in &keys {
                    let decision = limiter.check(key, ONE).await;
                    assert!(decision.is_admitted(), "{decision:?}");
                    assert_eq!(decision.source, Source::Redis);
                }
            }
            tokio::time::sleep(5 * MS).await;
        }
        let lines = monitor.until(redis.port(), "reads-end");
        let (commands, blocks) = engine_commands(&lines);
        let checks = 3 * limiters.len() as u64 * keys.len() as u64;
        eprintln!("functions: {functions}: {commands} commands for {checks} checks");
        assert!(
            commands >= checks,
            "MONITOR saw {commands} commands of {checks} checks"
        );
        assert!(
            blocks.is_empty(),
            "functions: {functions}: {} of {commands} commands named a block key, such as {:?}",
            blocks.len(),
            &blocks[..blocks.len().min(5)]
        );
    }
}

/// Two instances (backends) on one Redis: a key blocked through one is refused by the
/// other, whatever the key held (a count, nothing, a state that expires during the
/// block, a window that ends during it), whatever is done to it while blocked
/// (refunds, settlements, a shorter block), on both engine paths; once the block has
/// ended the key is admitted again and its checks read its limits' keys alone. On a
/// frozen server clock, which the test moves.
#[tokio::test(flavor = "multi_thread")]
async fn a_block_holds_whatever_the_limits_keys_do() {
    // (On real time "fresh" had to be still blocked 400 ms after its block, past a dozen
    // calls and a 200 ms sleep: a busy CI machine could take longer. The blocks and the
    // limits' keys live on the server's clock, so they now last exactly the steps.)
    let (redis, clock) = RedisServer::start_with_clock();
    clock.freeze_now();
    for functions in paths(&redis) {
        let (a, b) = (backend(&redis, functions), backend(&redis, functions));
        let (a, b) = (limiters(&a, false, None), limiters(&b, false, None));
        for (a, b) in a.iter().zip(&b) {
            // A key with a count, and a key that never held anything.
            assert!(a.check(b"held", ONE).await.is_admitted());
            a.block(b"held", 400 * MS).unwrap().await;
            a.block(b"fresh", 400 * MS).unwrap().await;
            for key in [&b"held"[..], b"fresh"] {
                let refused = b.check(key, ONE).await;
                assert!(!refused.is_admitted(), "{refused:?}");
                assert_eq!(refused.source, Source::Redis);
                // Given back and settled while blocked: still blocked.
                b.refund(key, ONE).unwrap().await;
                if let Some(settled) = b.settle(key, -1) {
                    settled.await;
                }
                let refused = b.check(key, ONE).await;
                assert!(!refused.is_admitted(), "after a refund: {refused:?}");
            }
            // A shorter block replaces the longer one: the key is free at its end.
            a.block(b"held", 150 * MS).unwrap().await;
            clock.step(200 * MS);
            assert!(
                b.check(b"held", ONE).await.is_admitted(),
                "after the shorter block"
            );
            // The other key's block outlives what its limits held.
            let refused = b.check(b"fresh", ONE).await;
            assert!(!refused.is_admitted(), "{refused:?}");
            clock.step(250 * MS);
            let admitted = b.check(b"fresh", ONE).await;
            assert!(admitted.is_admitted(), "after the block: {admitted:?}");
        }
    }
}

/// Limits whose keys expire within 100 ms: a bucket that refills within a millisecond
/// (or 50 ms), a 50 ms window, a rolling window of 2 buckets of 25 ms.
fn short(backend: &Backend, lockout: Option<Duration>) -> Vec<Box<dyn Limiter>> {
    let (rate, burst) = if lockout.is_some() {
        (40, 2)
    } else {
        (1_000_000, 1_000_000)
    };
    let mut bucket = TokenBucketConfig::new(rate, SEC, burst);
    let mut period = PeriodConfig::new(2, 50 * MS);
    let mut rolling = RollingConfig::new(2, 2, 25 * MS);
    if let Some(d) = lockout {
        bucket = bucket.lockout(d);
        period = period.lockout(d);
        rolling = rolling.lockout(d);
    }
    vec![
        Box::new(TokenBucketLimiter::new(backend, "fast", bucket).unwrap()),
        Box::new(PeriodLimiter::new(backend, "short", period).unwrap()),
        Box::new(RollingWindowLimiter::new(backend, "short-rolling", rolling).unwrap()),
    ]
}

/// The limits' keys expire during the block, which still refuses the key on the other
/// instance until it ends. On a frozen server clock, which the test moves.
#[tokio::test(flavor = "multi_thread")]
async fn a_block_outlives_keys_that_expire_under_it() {
    // (On real time the third refused check, 300 ms in, had to come before the 400 ms
    // block ended: a busy CI machine could be later. The block and the keys' expiries
    // are the server's clock's, so they now last exactly the steps.)
    let (redis, clock) = RedisServer::start_with_clock();
    clock.freeze_now();
    for functions in paths(&redis) {
        let (a, b) = (backend(&redis, functions), backend(&redis, functions));
        for (a, b) in short(&a, None).iter().zip(&short(&b, None)) {
            assert!(a.check(b"k", ONE).await.is_admitted());
            a.block(b"k", 400 * MS).unwrap().await;
            for _ in 0..3 {
                clock.step(100 * MS);
                let refused = b.check(b"k", ONE).await;
                assert!(!refused.is_admitted(), "{refused:?}");
            }
            clock.step(150 * MS);
            assert!(b.check(b"k", ONE).await.is_admitted());
        }
    }
}

/// A lockout started on one instance refuses the key's checks on the other once its
/// limits would admit them again (their keys expired or refilled under it). On a frozen
/// server clock, which the test moves.
#[tokio::test(flavor = "multi_thread")]
async fn a_lockout_refuses_on_every_instance() {
    // (On real time the refusal had to come within 300 ms of the lockout's start for its
    // retry-after to be above 100 ms, and the last check came on the lockout's very end.
    // The lockout and the keys' expiries are the server's clock's: they now last exactly
    // the steps, and the last step goes 50 ms past the end.)
    let (redis, clock) = RedisServer::start_with_clock();
    clock.freeze_now();
    for functions in paths(&redis) {
        let (a, b) = (backend(&redis, functions), backend(&redis, functions));
        let lockout = Some(400 * MS);
        for (a, b) in short(&a, lockout).iter().zip(&short(&b, lockout)) {
            let key = b"locked";
            while a.check(key, ONE).await.is_admitted() {}
            clock.step(100 * MS);
            let refused = b.check(key, ONE).await;
            assert!(!refused.is_admitted(), "{refused:?}");
            assert!(refused.retry_after.unwrap() > 100 * MS, "{refused:?}");
            clock.step(350 * MS);
            assert!(b.check(key, ONE).await.is_admitted());
        }
    }
}

/// The commands of the engine MONITOR saw while `limiter` checked `keys` three times
/// each (after a first check of each, which starts windows), per check.
async fn commands_per_check(redis: &RedisServer, limiter: &dyn Limiter, keys: &[Vec<u8>]) -> f64 {
    for key in keys {
        assert!(limiter.check(key, ONE).await.is_admitted());
    }
    let monitor = Monitor::start(redis.port());
    let _ = monitor.until(redis.port(), "count-start");
    for _ in 0..3 {
        for key in keys {
            assert!(limiter.check(key, ONE).await.is_admitted());
        }
    }
    let lines = monitor.until(redis.port(), "count-end");
    let commands = lines
        .iter()
        .filter_map(|line| monitor_words(line))
        .filter(|(client, _)| client.contains("lua"))
        .count();
    commands as f64 / (3 * keys.len()) as f64
}

/// An atomic pair (a token bucket and a daily window) runs no more commands per check
/// than its two members' checks add up to, with large limits too (a 10^6 bucket and a
/// daily quota of 2^40 units, whose replies are too large to pack in one number).
#[tokio::test(flavor = "multi_thread")]
async fn an_atomic_pair_costs_its_members_commands() {
    let redis = RedisServer::start();
    for functions in paths(&redis) {
        let backend = backend(&redis, functions);
        let bucket = TokenBucketConfig::new(1_000_000, SEC, 1_000_000);
        let daily = PeriodConfig::new(1 << 40, 86_400 * SEC);
        let keys: Vec<Vec<u8>> = (0..20).map(|i| format!("k{i}").into_bytes()).collect();
        let token = TokenBucketLimiter::new(&backend, "token", bucket).unwrap();
        let window = PeriodLimiter::new(&backend, "daily", daily).unwrap();
        let pair = SetLimiter::new(
            &backend,
            "pair",
            LimitSet::new().limit("rpm", bucket).limit("tpd", daily),
        )
        .unwrap();
        let token = commands_per_check(&redis, &token, &keys).await;
        let window = commands_per_check(&redis, &window, &keys).await;
        let pair = commands_per_check(&redis, &pair, &keys).await;
        eprintln!("functions: {functions}: token {token}, window {window}, pair {pair}");
        assert!(
            pair <= token + window,
            "functions: {functions}: the pair ran {pair} commands per check, its members \
             {token} + {window}"
        );
    }
}

/// Concurrent checks of one hot key, coalesced into shared calls, read its limit's key
/// once per call and never name its block, for every algorithm (a fixed window, an
/// aligned one, a calendar window, a rolling window), on both engine paths: the fast
/// path of the checks together (before, a coalesced call ran the general engine:
/// `GET`, `PTTL` of the block, `SET` for a token bucket; MONITOR saw 23 commands but
/// the clock's in 9 calls). A token bucket's call is one `GET` and one `SET`.
#[tokio::test(flavor = "multi_thread")]
async fn a_coalesced_call_reads_its_limits_key_alone() {
    let redis = RedisServer::start();
    for functions in paths(&redis) {
        let backend = support::backend_builder()
            .redis(redis.pool())
            .deny_cache(0)
            .engine_functions(functions)
            .call_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        // The limits of one algorithm each (the sets after them run the general engine).
        let names = ["bucket", "fixed", "aligned", "calendar", "rolling"];
        for (name, limiter) in names.into_iter().zip(limiters(&backend, true, None)) {
            let what = format!("{name}, functions: {functions}");
            assert!(limiter.check(b"k", ONE).await.is_admitted(), "{what}");
            let monitor = Monitor::start(redis.port());
            let _ = monitor.until(redis.port(), "hot-start");
            let calls = redis.command_calls("evalsha");
            let rounds = 5;
            for _ in 0..rounds {
                // Each check takes its turn when made: the first leads, the others
                // queue and go together in the call after its.
                let checks: Vec<_> = (0..8).map(|_| limiter.check(b"k", ONE)).collect();
                for check in checks {
                    let decision = check.await;
                    assert!(decision.is_admitted(), "{what}: {decision:?}");
                    assert_eq!(decision.source, Source::Redis, "{what}: {decision:?}");
                }
            }
            let calls = redis.command_calls("evalsha") - calls;
            let lines = monitor.until(redis.port(), "hot-end");
            let (commands, blocks) = engine_commands(&lines);
            eprintln!("{what}: {commands} commands in {calls} calls");
            assert!(
                calls <= 2 * rounds,
                "{what}: {calls} calls for {rounds} rounds of 8 checks"
            );
            assert!(
                blocks.is_empty(),
                "{what}: {} commands named the block key, such as {:?}",
                blocks.len(),
                &blocks[..blocks.len().min(3)]
            );
            if name == "bucket" {
                assert_eq!(commands, 2 * calls, "{what}: GET and SET per call");
            }
        }
    }
}

/// Settlements of keys never blocked (a layer's after each response, counting usage)
/// read and write their limit's key alone, for every algorithm, on both engine paths:
/// charges (above the estimate) and refunds (below it), each one call of at most two
/// commands (a token bucket: `GET`, then `SET` or `DEL` when it changed; a window:
/// `INCRBY` and `PTTL`; a rolling window: `HGETALL` and `HINCRBY` or `HDEL`, and the
/// key's expiry when a bucket starts); a set's, its members' (a member counting
/// requests, a token bucket, read alone: `GET`). Before, the general engine settled:
/// every call read the key's block (`PTTL`), and a refund read the limit's key twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_settlement_reads_its_limits_key_alone() {
    let redis = RedisServer::start();
    let estimate = NonZeroU32::new(10).unwrap();
    let deltas = [5, -3, 2, -4];
    for functions in paths(&redis) {
        let backend = backend(&redis, functions);
        let keys: Vec<Vec<u8>> = (0..10).map(|i| format!("s{i}").into_bytes()).collect();
        let names = [
            "bucket",
            "fixed",
            "aligned",
            "calendar",
            "rolling",
            "pair",
            "window-first",
        ];
        let mut all = limiters(&backend, true, None);
        // The rolling window's buckets of 10 s here, not 100 ms: a bucket that starts
        // during the settlements sets its key's expiry once more, and on a loaded machine
        // the 40 settlements under MONITOR spanned enough 100 ms buckets to pass the
        // bound by one command (101 for 40, in a fresh-clone run on Valkey 9.1).
        all[4] = Box::new(
            RollingWindowLimiter::new(
                &backend,
                "rolling",
                RollingConfig::new(1_000_000, 10, 10 * SEC),
            )
            .unwrap(),
        );
        for (name, limiter) in names.into_iter().zip(all) {
            let what = format!("{name}, functions: {functions}");
            for key in &keys {
                assert!(limiter.check(key, estimate).await.is_admitted(), "{what}");
            }
            let monitor = Monitor::start(redis.port());
            let _ = monitor.until(redis.port(), "settle-start");
            for key in &keys {
                for delta in deltas {
                    let settled = limiter.settle(key, delta).expect("built-in").await;
                    assert!(settled.is_admitted(), "{what}: {settled:?}");
                    assert_eq!(settled.source, Source::Redis, "{what}: {settled:?}");
                }
            }
            let lines = monitor.until(redis.port(), "settle-end");
            let (commands, blocks) = engine_commands(&lines);
            let settlements = (keys.len() * deltas.len()) as u64;
            eprintln!("{what}: {commands} commands for {settlements} settlements");
            assert!(
                blocks.is_empty(),
                "{what}: {} commands named the block key, such as {:?}",
                blocks.len(),
                &blocks[..blocks.len().min(3)]
            );
            // (A rolling window sets its key's expiry when a bucket starts: a few more.)
            let most = match name {
                "rolling" => 5,
                // GET of the requests' bucket, INCRBY and PTTL of the tokens' window.
                "pair" => 6,
                "window-first" => 9,
                _ => 4,
            };
            assert!(
                2 * commands <= most * settlements,
                "{what}: {commands} commands for {settlements} settlements"
            );
        }
    }
}

/// A set with a token bucket or a rolling window never reads its block when one of its
/// fixed windows starts: a blocked key's bucket or rolling window is marked for as long
/// as the block runs (a key that held nothing too), and the fast path of the set leaves
/// a marked member to the engine, so the window need not ask. Windows of 30 ms started
/// anew in every round, on both engine paths, window first or last. Before, each start
/// read the block (`PTTL`).
#[tokio::test(flavor = "multi_thread")]
async fn a_sets_window_starts_without_reading_the_block() {
    let redis = RedisServer::start();
    for functions in paths(&redis) {
        let backend = backend(&redis, functions);
        let bucket = TokenBucketConfig::new(1_000_000, SEC, 1_000_000);
        let short = PeriodConfig::new(1_000_000, 30 * MS);
        let rolling = RollingConfig::new(1_000_000, 10, 100 * MS);
        let sets = [
            LimitSet::new()
                .limit("bucket", bucket)
                .limit("window", short),
            LimitSet::new()
                .limit("window", short)
                .limit("rolling", rolling),
            LimitSet::new()
                .requests("requests", bucket)
                .limit("window", short)
                .limit("daily", PeriodConfig::new(1_000_000, 86_400 * SEC)),
        ];
        for (i, set) in sets.into_iter().enumerate() {
            let what = format!("set {i}, functions: {functions}");
            let limiter = SetLimiter::new(&backend, &format!("starts{i}"), set).unwrap();
            let keys: Vec<Vec<u8>> = (0..10).map(|k| format!("w{k}").into_bytes()).collect();
            let monitor = Monitor::start(redis.port());
            let _ = monitor.until(redis.port(), "starts-start");
            for _ in 0..3 {
                for key in &keys {
                    let decision = limiter.check(key, ONE).await;
                    assert!(decision.is_admitted(), "{what}: {decision:?}");
                    assert_eq!(decision.source, Source::Redis, "{what}");
                }
                // Every window ends: the next round starts them again.
                tokio::time::sleep(40 * MS).await;
            }
            let lines = monitor.until(redis.port(), "starts-end");
            let (commands, blocks) = engine_commands(&lines);
            eprintln!("{what}: {commands} commands for 30 checks");
            assert!(
                blocks.is_empty(),
                "{what}: {} commands named the block key, such as {:?}",
                blocks.len(),
                &blocks[..blocks.len().min(3)]
            );
        }
    }
}

/// A rolling window's key is given its expiry when an even bucket starts, or an odd one
/// whose even predecessor it does not hold: an even bucket's expiry (a window and a
/// bucket past its start) covers the odd bucket after it. On a frozen server clock moved
/// one bucket a round, 8 rounds of 10 keys start 80 buckets: at most 5 `PEXPIRE` per key
/// (before, 8: one per bucket), on both engine paths, and the key never expires while a
/// bucket it holds still counts (its `PTTL` reaches past the newest bucket's window).
#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_window_sets_its_expiry_every_other_bucket() {
    let (redis, clock) = RedisServer::start_with_clock();
    const INTERVAL_MS: i64 = 100;
    const BUCKETS: i64 = 10;
    for functions in paths(&redis) {
        let backend = backend(&redis, functions);
        let name = format!("expiry-{functions}");
        let limiter =
            RollingWindowLimiter::new(&backend, &name, RollingConfig::new(1_000, 10, 100 * MS))
                .unwrap();
        let keys: Vec<Vec<u8>> = (0..10).map(|k| format!("e{k}").into_bytes()).collect();
        // A bucket's start, 40 ms into it for the first round.
        let t0 = 1_800_000_000_000_000 + 40_000 + i64::from(functions) * 10_000_000;
        let monitor = Monitor::start(redis.port());
        let _ = monitor.until(redis.port(), "expiry-start");
        let mut last_us = t0;
        for round in 0..8 {
            last_us = t0 + round * INTERVAL_MS * 1_000;
            clock.freeze_at(last_us);
            for key in &keys {
                let decision = limiter.check(key, ONE).await;
                assert!(decision.is_admitted(), "{decision:?}");
                assert_eq!(decision.source, Source::Redis);
            }
        }
        let lines = monitor.until(redis.port(), "expiry-end");
        let expiries = lines
            .iter()
            .filter_map(|line| monitor_words(line))
            .filter(|(client, words)| {
                client.contains("lua")
                    && words
                        .first()
                        .is_some_and(|w| w.eq_ignore_ascii_case(b"PEXPIRE"))
            })
            .count();
        eprintln!("functions: {functions}: {expiries} PEXPIRE for 80 buckets started");
        assert!(
            expiries <= 5 * keys.len(),
            "functions: {functions}: {expiries} PEXPIRE for 80 buckets started"
        );
        // The newest bucket counts until its window ends: the key lives that long.
        let newest = last_us / 1_000 / INTERVAL_MS;
        let counts_until_ms = (newest + BUCKETS) * INTERVAL_MS;
        let stored = redis.cmd(&["KEYS", "*e3*"]);
        let stored = stored
            .lines()
            .map(str::trim)
            .find(|key| key.contains(name.as_str()) && !key.contains(":block:"))
            .expect("the key")
            .to_owned();
        let ttl: i64 = redis.cmd(&["PTTL", &stored]).trim().parse().unwrap();
        assert!(
            last_us / 1_000 + ttl >= counts_until_ms,
            "functions: {functions}: expires in {ttl} ms, counts for {} ms",
            counts_until_ms - last_us / 1_000
        );
    }
    clock.set_offset_us(0);
}

/// A token bucket whose interval is a whole number of µs (1 a second: 1 000 000 µs)
/// stores its TAT as its digits alone, on both engine paths and every server: the
/// fewest conversions for Redis before 7.2 (one, where the TAT with seven decimals took
/// two), what Redis 7.2+ and Valkey write for a whole number themselves, and what every
/// version reads back as the same double. Three checks leave the key 3 s to live, so a
/// slow machine still finds it (at 1 000 a second it lived 3 ms, and CI once read it
/// gone).
#[tokio::test(flavor = "multi_thread")]
async fn a_whole_tat_is_stored_as_its_digits() {
    let redis = RedisServer::start();
    for functions in paths(&redis) {
        let limiter = TokenBucketLimiter::new(
            &backend(&redis, functions),
            &format!("whole-{functions}"),
            TokenBucketConfig::new(1, SEC, 10),
        )
        .unwrap();
        for _ in 0..3 {
            let decision = limiter.check(b"k", ONE).await;
            assert_eq!(decision.source, Source::Redis, "{decision:?}");
        }
        let stored = redis.cmd(&["KEYS", &format!("*whole-{functions}*")]);
        let key = stored
            .lines()
            .next()
            .expect("the bucket's key")
            .trim()
            .to_owned();
        let value = redis.cmd(&["GET", &key]);
        let value = value.trim();
        assert!(
            !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()),
            "functions: {functions}: {key} holds {value:?}"
        );
    }
}
