//! The crate's Lua is one dialect that every server runs alike: Redis and Valkey (Lua
//! 5.1), Dragonfly (Lua 5.4), Garnet, and cluster proxies that read a script's text
//! (Alibaba Cloud's, Tencent's). Checked on every text the crate sends to a server
//! (`lua_texts`, hidden: each script in both time versions, each library of Redis
//! Functions, the probe):
//!
//! - **Only what Lua 5.1 and 5.4 share**: `luacheck` with a standard library that is
//!   their intersection plus Redis's scripting API (`tests/lua/luacheckrc`): no
//!   `math.frexp`, no global `unpack`, no `table.unpack`.
//! - **Portable commands**: every command is one of a short list that every server has,
//!   every key a command touches is written `KEYS[..]` in the call itself, and `SET`
//!   takes no `PXAT`/`EXAT` (Garnet refuses them).
//! - **The same numbers in both dialects**: calls the crate really sends (recorded with
//!   `MONITOR` while limiters of every algorithm run on a real server) are run again by
//!   `lua5.1` and `lua5.4` (`tests/lua/driver.lua`, which answers the scripts' commands
//!   from a table and refuses a number that is not an integer in a command or a reply),
//!   and by a fresh `redis-server` whose clock is set to each call's time: the three give
//!   the same replies.
//!
//! `scripts/test` installs `luacheck`, `lua5.1` and `lua5.4` (Debian's `lua-check`,
//! `lua5.1`, `lua5.4`) with the servers.

mod support;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use support::monitor::{monitor_words, Monitor};
use support::{raw_cmd, RedisServer, Reply, ServerClock};
use tower_redis_ratelimit::in_flight::{InFlightConfig, InFlightLimiter};
use tower_redis_ratelimit::{lua_texts, Backend, Limiter};
use tower_redis_ratelimit::{Calendar, PeriodConfig, PeriodLimiter, UtcOffset};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{ManualClock, TimeSource};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

/// The commands the scripts may send: ones every server of the matrix, Dragonfly and
/// Garnet have, with the same meaning.
const PORTABLE: &[&str] = &[
    "GET",
    "MGET",
    "SET",
    "DEL",
    "INCRBY",
    "DECRBY",
    "PTTL",
    "PEXPIRE",
    "PEXPIREAT",
    "HGETALL",
    "HSET",
    "HDEL",
    "HINCRBY",
    "ZADD",
    "ZCARD",
    "ZREM",
    "ZREMRANGEBYSCORE",
    "TIME",
    // A channel, not a key (`<prefix>:changes`, src/backend/redis/changes.rs), by
    // `redis.pcall`: a server that refuses it in a script only loses the message.
    "PUBLISH",
];

/// `SET`'s options the scripts may use.
const SET_OPTIONS: &[&str] = &["'PX'", "'KEEPTTL'"];

/// A program the checks run, from `PATH`: a clear failure when it is missing.
fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed: scripts/test installs it (apt-get install lua-check \
                 lua5.1 lua5.4)"
            )
        })
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Writes `texts` as `<name>.lua` files in a fresh folder; their paths.
fn write_texts(kind: &str, texts: &[(String, String)]) -> (PathBuf, Vec<(String, PathBuf)>) {
    let dir = support::make_temp_dir(kind);
    let paths = texts
        .iter()
        .map(|(name, text)| {
            let path = dir.join(format!("{name}.lua"));
            std::fs::write(&path, text).expect("write a script");
            (name.clone(), path)
        })
        .collect();
    (dir, paths)
}

/// `luacheck` on `texts`: whether it passed, and what it said.
fn luacheck(texts: &[(String, String)]) -> (bool, String) {
    let (_dir, paths) = write_texts("luacheck", texts);
    let output = Command::new(tool("luacheck"))
        .arg("--config")
        .arg(repo().join("tests/lua/luacheckrc"))
        .args(["--formatter", "plain", "--codes", "--no-color"])
        .args(paths.iter().map(|(_, path)| path))
        .output()
        .expect("run luacheck");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

#[test]
fn every_script_uses_only_what_lua_5_1_and_5_4_share() {
    let texts = lua_texts();
    assert_eq!(texts.len(), 8, "{:?}", names(&texts));
    let (passed, said) = luacheck(&texts);
    assert!(passed, "luacheck:\n{said}");
}

/// Every library of Redis Functions loads on a server that has them: a library's
/// top level runs once when it loads, where Redis lets it read only part of what a call
/// may (no `_VERSION`, no `table` in Redis 7.0), and a library that fails to load sends
/// every call by `EVALSHA` instead, at a cost.
#[test]
fn every_library_loads_as_redis_functions() {
    let redis = RedisServer::start();
    if !redis.runs_functions() {
        eprintln!("{}: no Redis Functions to load", redis.version());
        return;
    }
    let texts = lua_texts();
    let libraries: Vec<_> = texts
        .iter()
        .filter(|(name, _)| name.ends_with(".library"))
        .collect();
    assert!(!libraries.is_empty(), "{:?}", names(&texts));
    for (name, text) in libraries {
        let loaded = redis.cmd(&["FUNCTION", "LOAD", "REPLACE", text]);
        assert!(
            loaded.starts_with("tower_redis_ratelimit_"),
            "{name}: {loaded}"
        );
    }
}

fn names(texts: &[(String, String)]) -> Vec<&str> {
    texts.iter().map(|(name, _)| name.as_str()).collect()
}

/// The arguments of every `redis.call(...)` and `redis.pcall(...)` in `lua`, as written
/// (split at the commas outside brackets and strings).
fn commands(lua: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for pattern in ["redis.call(", "redis.pcall("] {
        for (at, _) in lua.match_indices(pattern) {
            let rest = &lua[at + pattern.len()..];
            let mut args = vec![String::new()];
            let mut depth = 0_u32;
            let mut quote = None;
            for c in rest.chars() {
                match (quote, c) {
                    (Some(q), c) if c == q => quote = None,
                    (Some(_), _) => {}
                    (None, '\'' | '"') => quote = Some(c),
                    (None, '(' | '[' | '{') => depth += 1,
                    (None, ')') if depth == 0 => break,
                    (None, ')' | ']' | '}') => depth -= 1,
                    (None, ',') if depth == 0 => {
                        args.push(String::new());
                        continue;
                    }
                    _ => {}
                }
                args.last_mut().expect("an argument").push(c);
            }
            out.push(args.into_iter().map(|arg| arg.trim().to_owned()).collect());
        }
    }
    out
}

/// What is wrong with the commands of `lua`, one line each (nothing: portable).
fn command_faults(lua: &str) -> Vec<String> {
    let mut faults = Vec::new();
    for call in commands(lua) {
        let Some(name) = call[0]
            .strip_prefix('\'')
            .and_then(|name| name.strip_suffix('\''))
        else {
            faults.push(format!("{call:?}: the command is not written as a literal"));
            continue;
        };
        let name = name.to_ascii_uppercase();
        if !PORTABLE.contains(&name.as_str()) {
            faults.push(format!("{call:?}: {name} is not on the portable list"));
        }
        let keys = match name.as_str() {
            "TIME" | "PUBLISH" => &call[1..1],
            "MGET" | "DEL" => &call[1..],
            _ => &call[1..call.len().min(2)],
        };
        if !matches!(name.as_str(), "TIME" | "PUBLISH") && keys.is_empty() {
            faults.push(format!("{call:?}: no key"));
        }
        for key in keys {
            if !key.starts_with("KEYS[") {
                faults.push(format!("{call:?}: the key {key} is not written KEYS[..]"));
            }
        }
        if name == "SET" {
            for option in call.iter().skip(3).filter(|arg| arg.starts_with('\'')) {
                if !SET_OPTIONS.contains(&option.to_ascii_uppercase().as_str()) {
                    faults.push(format!("{call:?}: SET's option {option} is not portable"));
                }
            }
        }
    }
    faults
}

#[test]
fn every_command_is_portable_and_names_its_keys_as_keys() {
    let texts = lua_texts();
    let mut count = 0;
    for (name, text) in &texts {
        let faults = command_faults(text);
        assert!(faults.is_empty(), "{name}:\n{}", faults.join("\n"));
        count += commands(text).len();
    }
    assert!(count > 100, "the commands were read: {count}");
}

/// The checks fail on what is outside the dialect: shown on the engine's text with one
/// construct added each time.
#[test]
fn the_checks_refuse_what_is_outside_the_dialect() {
    let (name, engine) = lua_texts()
        .into_iter()
        .find(|(name, _)| name == "engine.server")
        .expect("the engine");
    let with = |line: &str| vec![(name.clone(), format!("{line}\n{engine}"))];

    // Lua 5.1 only (math.frexp, the global unpack), Lua 5.4 only (table.unpack, math.type).
    for (line, named) in [
        ("local _, bits = math.frexp(8)", "frexp"),
        ("local x = unpack({1})", "unpack"),
        ("local x = table.unpack({1})", "unpack"),
        ("local x = math.type(1)", "type"),
    ] {
        let (passed, said) = luacheck(&with(line));
        assert!(!passed, "luacheck passed {line}:\n{said}");
        assert!(said.contains(named), "{line}:\n{said}");
    }

    for (line, fault) in [
        (
            "redis.call('SET', KEYS[1], '1', 'PXAT', '1800000000000')",
            "SET's option 'PXAT'",
        ),
        ("local key = KEYS[1]\nredis.call('GET', key)", "the key key"),
        ("redis.call('MGET', KEYS[1], 'other')", "the key 'other'"),
        ("redis.call('GETEX', KEYS[1], 'PX', '5')", "GETEX is not on"),
    ] {
        let faults = command_faults(&format!("{line}\n{engine}")).join("\n");
        assert!(faults.contains(fault), "{line}: {faults}");
    }
}

// ---------------------------------------------------------------------------
// The same numbers in Lua 5.1, Lua 5.4 and Redis
// ---------------------------------------------------------------------------

/// 2027-01-15T08:00:00Z, in microseconds.
const T0_US: u64 = 1_800_000_000_000_000;
const SEC: Duration = Duration::from_secs(1);

/// A small deterministic generator (xorshift), so that a failure can be run again.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The limiters whose calls are recorded: every algorithm, with the shapes whose
/// arithmetic differs (a fractional interval, a large burst, aligned and calendar
/// windows, a lockout, sets with a member counting requests).
fn limiters(backend: &Backend) -> Vec<(Box<dyn Limiter>, bool)> {
    let bucket = |name: &str, config: TokenBucketConfig| -> (Box<dyn Limiter>, bool) {
        (
            Box::new(TokenBucketLimiter::new(backend, name, config).expect("valid")),
            true,
        )
    };
    let period = |name: &str, config: PeriodConfig| -> (Box<dyn Limiter>, bool) {
        (
            Box::new(PeriodLimiter::new(backend, name, config).expect("valid")),
            false,
        )
    };
    let set = |name: &str, set: LimitSet| -> (Box<dyn Limiter>, bool) {
        (
            Box::new(SetLimiter::new(backend, name, set).expect("valid")),
            false,
        )
    };
    vec![
        bucket("tb-3-per-2s", TokenBucketConfig::new(3, 2 * SEC, 5)),
        bucket(
            "tb-large",
            TokenBucketConfig::new(1_000_000, 60 * SEC, 1_000_000),
        ),
        bucket(
            "tb-lease",
            TokenBucketConfig::new(10, SEC, 10).lease(4, Duration::from_millis(300)),
        ),
        period("fixed", PeriodConfig::new(5, SEC)),
        period("lockout", PeriodConfig::new(2, SEC).lockout(2 * SEC)),
        period(
            "aligned",
            PeriodConfig::new(4, 3 * SEC).align(UtcOffset::from_hours(8)),
        ),
        period(
            "calendar",
            PeriodConfig::calendar(6, Calendar::day("America/New_York")),
        ),
        period("large", PeriodConfig::new(1_000_000_000, 86_400 * SEC)),
        (
            Box::new(
                RollingWindowLimiter::new(
                    backend,
                    "rolling",
                    RollingConfig::new(6, 10, Duration::from_millis(200)),
                )
                .expect("valid"),
            ),
            false,
        ),
        set(
            "set-requests-tokens",
            LimitSet::new()
                .requests("rpm", TokenBucketConfig::new(4, SEC, 4))
                .limit("tpm", PeriodConfig::new(20, SEC)),
        ),
        set(
            "set-three",
            LimitSet::new()
                .limit("burst", PeriodConfig::new(3, SEC))
                .limit("bucket", TokenBucketConfig::new(5, SEC, 3))
                .limit(
                    "rolling",
                    RollingConfig::new(8, 5, Duration::from_millis(400)),
                ),
        ),
    ]
}

/// One operation of limiter `limiter` (with reservations when `bucket`) on one of its
/// keys, chosen by `rng`.
async fn operate(rng: &mut Rng, limiter: &dyn Limiter, bucket: bool) {
    let key: &[u8] = if rng.below(3) == 0 { b"b" } else { b"a" };
    let cost = NonZeroU32::new(1 + u32::try_from(rng.below(4)).expect("small")).expect("> 0");
    let _ = match rng.below(20) {
        0..=10 => limiter.check(key, cost).await,
        11 | 12 => limiter.peek(key, cost).expect("built-in").await,
        13 => limiter.refund(key, cost).expect("built-in").await,
        14 => {
            let delta = i64::try_from(rng.below(7)).expect("small") - 3;
            limiter.settle(key, delta).expect("built-in").await
        }
        15 => limiter.reset(key).expect("built-in").await,
        16 => {
            let duration = Duration::from_millis(100 + 100 * rng.below(10));
            limiter.block(key, duration).expect("built-in").await
        }
        _ if bucket => {
            let max_wait = Duration::from_millis(rng.below(1_500));
            limiter
                .reserve(key, cost, max_wait)
                .expect("a token bucket")
                .await
        }
        _ => limiter.check(key, cost).await,
    };
}

/// One recorded call: the script's name, its keys' count, its keys and arguments.
struct Recorded {
    script: String,
    keys: usize,
    words: Vec<Vec<u8>>,
}

impl Recorded {
    /// The caller's time of the call (its last argument), in microseconds.
    fn time_us(&self) -> i64 {
        std::str::from_utf8(self.words.last().expect("arguments"))
            .expect("digits")
            .parse()
            .expect("the caller's time")
    }
}

/// Runs every limiter through `rounds` random operations on a server whose clock
/// follows the callers' (`EVALSHA`, the callers' time), and returns the calls recorded.
async fn record(
    server: &RedisServer,
    clock: &ServerClock,
    rounds: usize,
    seed: u64,
) -> Vec<Recorded> {
    let shas: HashMap<String, String> = lua_texts()
        .into_iter()
        .filter(|(name, _)| name.ends_with(".caller"))
        .map(|(name, text)| {
            (
                redis::Script::new(&text).get_hash().to_owned(),
                name.trim_end_matches(".caller").to_owned(),
            )
        })
        .collect();
    let monitor = Monitor::start(server.port());
    // (MONITOR prints only what arrives after it started.)
    let _ = monitor.until(server.port(), "dialect-start");
    let manual = ManualClock::new(T0_US);
    let backend = support::backend_builder()
        .manual_clock(manual.clone())
        .deny_cache(0)
        .coalesce(false)
        .engine_functions(false)
        .call_timeout(Duration::from_secs(10))
        .redis(server.pool())
        .time_source(TimeSource::Caller)
        .build()
        .expect("backend");
    let limiters = limiters(&backend);
    let slots = InFlightLimiter::new(&backend, "slots", InFlightConfig::new(2)).expect("valid");
    let mut held = Vec::new();
    let mut rng = Rng(seed);
    let mut now = T0_US;
    for _ in 0..rounds {
        // Mostly forward, by up to 0.9 s; sometimes a whole window; now and then back.
        now = match rng.below(10) {
            0 => now - rng.below(500_000),
            1 => now + 1_000_000 + rng.below(3_000_000),
            _ => now + rng.below(900_000),
        };
        manual.set_us(now);
        clock.freeze_at(i64::try_from(now).expect("fits"));
        for (limiter, bucket) in &limiters {
            operate(&mut rng, limiter.as_ref(), *bucket).await;
        }
        if rng.below(2) == 0 {
            if let Ok(slot) = slots.acquire(b"s").await {
                held.push(slot);
            }
        } else if !held.is_empty() {
            drop(held.remove(0));
        }
    }
    drop(held);
    let _ = slots.in_flight(b"s").await;
    let lines = monitor.until(server.port(), "dialect-end");
    let mut recorded = Vec::new();
    for line in lines {
        let Some((client, words)) = monitor_words(&line) else {
            continue;
        };
        if client.contains("lua") || words.first().map(Vec::as_slice) != Some(b"EVALSHA") {
            continue;
        }
        let sha = String::from_utf8_lossy(&words[1]).into_owned();
        let script = shas
            .get(&sha)
            .unwrap_or_else(|| panic!("EVALSHA of an unknown script {sha}"))
            .clone();
        let keys = std::str::from_utf8(&words[2])
            .expect("digits")
            .parse()
            .expect("a count");
        recorded.push(Recorded {
            script,
            keys,
            words: words[3..].to_vec(),
        });
    }
    recorded
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

/// The replies of `lua` (`lua5.1` or `lua5.4`) running `calls` through the driver.
fn replay_in_lua(lua: &str, calls: &[Recorded], scripts: &[(String, PathBuf)]) -> Vec<String> {
    let dir = support::make_temp_dir("dialect-calls");
    let calls_path = dir.join("calls.txt");
    let mut text = String::new();
    for call in calls {
        let _ = write!(text, "{} {}", call.script, call.keys);
        for word in &call.words {
            let _ = write!(text, " {}", hex(word));
        }
        text.push('\n');
    }
    std::fs::write(&calls_path, text).expect("write the calls");
    let output = Command::new(tool(lua))
        .arg(repo().join("tests/lua/driver.lua"))
        .arg(&calls_path)
        .args(
            scripts
                .iter()
                .map(|(name, path)| format!("{name}={}", path.display())),
        )
        .output()
        .expect("run the driver");
    assert!(
        output.status.success(),
        "{lua}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("text")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A reply as the driver prints it.
fn render(reply: &Reply) -> String {
    match reply {
        Reply::Int(n) => n.to_string(),
        Reply::Nil => "nil".to_owned(),
        Reply::Simple(s) => format!("+{s}"),
        Reply::Bulk(s) => format!("\"{s}\""),
        Reply::Error(e) => format!("error: {e}"),
        Reply::Array(items) => format!(
            "[{}]",
            items.iter().map(render).collect::<Vec<_>>().join(",")
        ),
    }
}

/// The replies of a fresh server running `calls`, its clock at each call's time.
fn replay_in_redis(calls: &[Recorded], texts: &HashMap<String, String>) -> Vec<String> {
    let (server, clock) = RedisServer::start_with_clock();
    let client = redis::Client::open(server.url()).expect("a client");
    let mut conn = client.get_connection().expect("a connection");
    let mut shas = HashMap::new();
    for (name, text) in texts {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(text)
            .query(&mut conn)
            .expect("SCRIPT LOAD");
        shas.insert(name.clone(), sha);
    }
    calls
        .iter()
        .map(|call| {
            clock.freeze_at(call.time_us());
            let mut command = redis::cmd("EVALSHA");
            command.arg(&shas[&call.script]).arg(call.keys);
            for word in &call.words {
                command.arg(word.as_slice());
            }
            let reply: redis::Value = command.query(&mut conn).expect("EVALSHA");
            render(&Reply::from(reply))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_computes_alike_in_lua_5_1_lua_5_4_and_redis() {
    let (server, clock) = RedisServer::start_with_clock();
    let calls = record(&server, &clock, 60, 0x5eed_1e55_d1a1_ec75).await;
    let per_script = |name: &str| calls.iter().filter(|call| call.script == name).count();
    assert!(
        per_script("engine") > 500 && per_script("in_flight") > 20,
        "recorded {} engine and {} in-flight calls",
        per_script("engine"),
        per_script("in_flight")
    );

    let texts: HashMap<String, String> = lua_texts()
        .into_iter()
        .filter_map(|(name, text)| Some((name.strip_suffix(".caller")?.to_owned(), text)))
        .collect();
    let pairs: Vec<(String, String)> = texts
        .iter()
        .map(|(name, text)| (name.clone(), text.clone()))
        .collect();
    let (_dir, scripts) = write_texts("dialect-scripts", &pairs);
    let lua51 = replay_in_lua("lua5.1", &calls, &scripts);
    let lua54 = replay_in_lua("lua5.4", &calls, &scripts);
    let redis = tokio::task::spawn_blocking({
        let texts = texts.clone();
        move || replay_in_redis(&calls, &texts)
    })
    .await
    .expect("replayed");

    assert_eq!(lua51.len(), redis.len(), "lua5.1 answered every call");
    assert_eq!(lua54.len(), redis.len(), "lua5.4 answered every call");
    let mut admitted = 0;
    for (i, ((redis, lua51), lua54)) in redis.iter().zip(&lua51).zip(&lua54).enumerate() {
        assert!(!redis.starts_with("error"), "call {i}: Redis: {redis}");
        assert_eq!(lua51, redis, "call {i}: Lua 5.1 and Redis differ");
        assert_eq!(lua54, redis, "call {i}: Lua 5.4 and Redis differ");
        // (A packed admit, or a table whose first number is 1.)
        if redis.starts_with('-') || redis.starts_with("[1,") || redis.starts_with("[-") {
            admitted += 1;
        }
    }
    assert!(
        admitted > 100 && admitted < redis.len(),
        "both admissions and refusals: {admitted} of {}",
        redis.len()
    );
}

/// The driver answers like Redis where the scripts depend on it: shown on the commands
/// whose edge cases the engine reads (a key expiring this very millisecond, an expiry in
/// the past, `INCRBY` on a value that is no integer, `ZADD XX`, `MGET` of a missing key).
#[test]
fn the_driver_answers_like_redis() {
    let (server, clock) = RedisServer::start_with_clock();
    let first = "\
        local out = {}\n\
        out[#out + 1] = redis.call('SET', KEYS[1], '5', 'PX', 10)\n\
        out[#out + 1] = redis.call('PTTL', KEYS[1])\n\
        out[#out + 1] = redis.call('INCRBY', KEYS[1], 2)\n\
        out[#out + 1] = redis.call('PTTL', KEYS[1])\n\
        out[#out + 1] = redis.call('PEXPIREAT', KEYS[2], ARGV[1])\n\
        out[#out + 1] = redis.call('SET', KEYS[2], 'x y')\n\
        out[#out + 1] = type(redis.pcall('INCRBY', KEYS[2], 1)) == 'table' and 1 or 0\n\
        out[#out + 1] = redis.call('PTTL', KEYS[2])\n\
        out[#out + 1] = redis.call('PEXPIREAT', KEYS[2], ARGV[1] - 1)\n\
        out[#out + 1] = redis.call('PTTL', KEYS[2])\n\
        out[#out + 1] = redis.call('HINCRBY', KEYS[3], '7', 3)\n\
        out[#out + 1] = redis.call('HSET', KEYS[3], 's', '2')\n\
        out[#out + 1] = redis.call('HDEL', KEYS[3], '7', '8')\n\
        out[#out + 1] = redis.call('ZADD', KEYS[4], 5, 'a', 9, 'b')\n\
        out[#out + 1] = redis.call('ZADD', KEYS[4], 'XX', 6, 'a', 7, 'c')\n\
        out[#out + 1] = redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', 6)\n\
        out[#out + 1] = redis.call('ZCARD', KEYS[4])\n\
        out[#out + 1] = redis.call('MGET', KEYS[1], KEYS[5])\n\
        return out\n";
    let later = "return {redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])}\n";
    let t_us: i64 = 1_800_000_000_000_000;
    let t_ms = t_us / 1_000;
    // The first script at t; then 10 ms later (the key of `PX 10` expires this very
    // millisecond: still there) and 11 ms later (gone).
    let calls = [
        Recorded {
            script: "first".to_owned(),
            keys: 5,
            words: [
                "k1",
                "k2",
                "k3",
                "k4",
                "k5",
                &(t_ms + 1).to_string(),
                &t_us.to_string(),
            ]
            .map(|word| word.as_bytes().to_vec())
            .to_vec(),
        },
        Recorded {
            script: "later".to_owned(),
            keys: 1,
            words: vec![b"k1".to_vec(), (t_us + 10_000).to_string().into_bytes()],
        },
        Recorded {
            script: "later".to_owned(),
            keys: 1,
            words: vec![b"k1".to_vec(), (t_us + 11_000).to_string().into_bytes()],
        },
    ];
    let texts = [("first", first), ("later", later)];
    let redis: Vec<String> = calls
        .iter()
        .map(|call| {
            clock.freeze_at(call.time_us());
            let text = texts
                .iter()
                .find(|(name, _)| *name == call.script)
                .expect("a text")
                .1;
            let keys = call.keys.to_string();
            let mut args = vec!["EVAL", text, keys.as_str()];
            args.extend(
                call.words
                    .iter()
                    .map(|word| std::str::from_utf8(word).expect("text")),
            );
            render(&raw_cmd(server.port(), &args).expect("EVAL"))
        })
        .collect();
    assert_eq!(
        redis,
        [
            "[+OK,10,7,10,0,+OK,1,-1,1,-2,3,1,1,2,0,1,1,[\"7\",nil]]",
            "[0,\"7\"]",
            "[-2,nil]"
        ],
        "Redis"
    );

    let dir = support::make_temp_dir("dialect-driver");
    let scripts: Vec<(String, PathBuf)> = texts
        .iter()
        .map(|(name, text)| {
            let path = dir.join(format!("{name}.lua"));
            std::fs::write(&path, text).expect("write");
            ((*name).to_owned(), path)
        })
        .collect();
    for lua in ["lua5.1", "lua5.4"] {
        assert_eq!(
            replay_in_lua(lua, &calls, &scripts),
            redis,
            "{lua} and Redis differ"
        );
    }
}
