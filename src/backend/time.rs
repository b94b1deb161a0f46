//! Which clock the Redis scripts read: [`TimeSource`], and the two versions of each
//! script that it picks between ([`Scripts`]).
//!
//! The engine reads time only through `unix_us(ARGV)`; a short prelude, one per time
//! source, defines it:
//!
//! - server time: `unix_us()` calls `TIME`;
//! - caller time: `unix_us(ARGV)` reads the last `ARGV` (microseconds since the Unix
//!   epoch, appended by [`check`](super::check::check())). The text of this version holds no `TIME`
//!   call at all, so a server that refuses `TIME` in scripts, or scans scripts for it,
//!   never meets it.
//!
//! `caller_time` tells the body which one it runs in, for the few rules that differ
//! (see each algorithm's "Clocks" docs).
//!
//! The engine runs on one of two paths, the same Lua either way (the body defines
//! `engine(KEYS, ARGV)`):
//!
//! - Redis Functions (Redis 7 and later): one library holds both time versions, loaded
//!   once per server with `FUNCTION LOAD`; each check is one `FCALL`. The algorithms'
//!   functions and tables are built once, when the library loads.
//! - `EVALSHA` (Redis before 7, and servers that refuse `FUNCTION`): the script runs
//!   the whole body per call, then `engine(KEYS, ARGV)`.

use deadpool_redis::redis::Script;

use super::{Backend, BackendBuilder};

/// Where the Redis scripts take the current time from; see
/// [`BackendBuilder::time_source`](crate::BackendBuilder::time_source).
///
/// ```
/// use tower_redis_ratelimit::{backend::TimeSource, Backend};
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// // Dragonfly, ElastiCache Serverless: no `TIME` in scripts.
/// let backend = Backend::builder()
///     .redis_url("redis://127.0.0.1:6379")
///     .time_source(TimeSource::Caller)
///     .build()?;
/// assert_eq!(backend.time_source(), TimeSource::Caller);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum TimeSource {
    /// The Redis server's clock, read with `TIME` inside each script (the default): one
    /// clock for every instance, so skewed application hosts change nothing. Needs a
    /// server whose scripts may call `TIME` and get the real time (Redis 5 and later;
    /// Valkey, a fork of Redis 7.2, should behave alike but is not tested here).
    #[default]
    Server,
    /// The caller's clock, sent to each script as one more argument (its only cost: one
    /// more short argument per check); no script ever calls `TIME`. For servers that
    /// refuse `TIME` in scripts or answer it uselessly (ElastiCache Serverless; Dragonfly
    /// returns 0).
    ///
    /// The clock is the backend's own: the host's Unix time when the backend was built,
    /// advanced by the monotonic clock (tokio's, so a paused tokio clock drives it in
    /// tests), so it never steps back. Instances whose clocks differ by up to `s` (their
    /// hosts' wall-clock difference when their backends were built, plus the time a check
    /// takes to reach Redis, below the [call timeout](crate::BackendBuilder::call_timeout))
    /// keep each algorithm's guarantees within a bound of `s`: see "Clocks" in the
    /// [fixed window](crate::period#clocks), [token bucket](crate::token_bucket#clocks)
    /// and [rolling window](crate::rolling#clocks) docs. Keep hosts on NTP.
    Caller,
}

impl BackendBuilder {
    /// Where the Redis scripts take the current time from (default
    /// [`TimeSource::Server`], the Redis server's `TIME`). [`TimeSource::Caller`] sends
    /// this backend's clock to every script as one more argument instead, and no script
    /// calls `TIME`: for servers that refuse `TIME` in scripts or answer it uselessly
    /// (ElastiCache Serverless; Dragonfly returns 0). Instances whose clocks differ then
    /// keep each algorithm's guarantees within a documented bound (see [`TimeSource`]);
    /// every instance on one Redis must use the same setting.
    ///
    /// ```
    /// use tower_redis_ratelimit::{backend::TimeSource, Backend};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_url("redis://dragonfly.internal:6379")
    ///     .time_source(TimeSource::Caller)
    ///     .build()?;
    /// # let _ = backend; Ok(()) }
    /// ```
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// Not part of the API: moves the clock that [`TimeSource::Caller`] sends to the
    /// scripts by `offset_us` microseconds (negative: behind), so that tests can run
    /// instances whose clocks differ.
    #[doc(hidden)]
    pub fn caller_clock_offset_us(mut self, offset_us: i64) -> Self {
        self.caller_offset_us = offset_us;
        self
    }

    /// Not part of the API: the in-process state (and the caller's time sent to the
    /// scripts) reads `clock`, which the tests set, instead of tokio's clock.
    #[doc(hidden)]
    pub fn manual_clock(mut self, clock: crate::clock::ManualClock) -> Self {
        self.manual_clock = Some(clock);
        self
    }
}

impl Backend {
    /// Where the Redis scripts take the time from (see
    /// [`BackendBuilder::time_source`]).
    #[must_use]
    pub fn time_source(&self) -> TimeSource {
        self.inner.time
    }

    /// The time sent to the scripts with [`TimeSource::Caller`]: Unix microseconds.
    pub(crate) fn caller_now_us(&self) -> u64 {
        let now_us = self.clock().now_us();
        now_us.saturating_add_signed(self.inner.caller_offset_us)
    }
}

/// Sets `unix_us()` and `caller_time` for a script body, from `TIME`.
const SERVER_PRELUDE: &str = "\
-- Time: the Redis server's clock.
local caller_time = false
local function unix_us(_)
  local t = redis.call('TIME')
  -- (Arithmetic reads TIME's numbers: tonumber() would cost Redis three times as much.)
  return t[1] * 1000000 + t[2]
end
";

/// Sets `unix_us()` and `caller_time` for a script body, from the last `ARGV`.
const CALLER_PRELUDE: &str = "\
-- Time: the caller's clock, the last ARGV (microseconds since the Unix epoch).
local caller_time = true
local function unix_us(argv)
  return tonumber(argv[#argv])
end
";

/// The engine in both time versions: reading `TIME`, or the caller's time; as a script
/// for `EVALSHA` each, and as one library of Redis Functions holding both.
#[derive(Debug)]
pub(crate) struct Scripts {
    server: Script,
    caller: Script,
    library: Library,
}

/// A library of Redis Functions: its text (for `FUNCTION LOAD`) and its functions'
/// names, one per time version. The names carry a hash of the text, so that instances
/// running different versions of the crate on one server each call their own.
#[derive(Debug)]
pub(crate) struct Library {
    pub(crate) text: String,
    server: String,
    caller: String,
}

impl Library {
    /// The name of the function for `time`.
    pub(crate) fn function(&self, time: TimeSource) -> &str {
        match time {
            TimeSource::Server => &self.server,
            TimeSource::Caller => &self.caller,
        }
    }
}

impl Scripts {
    /// Both versions of the engine whose text is `lean` (which defines
    /// `list_of(kind, text)` and `lean(KEYS, ARGV, L, H)`) then `general` (which
    /// defines `engine(KEYS, ARGV, L, H)`).
    pub(crate) fn new(lean: &str, general: &str) -> Self {
        let hash = Script::new(&[lean, general].concat()).get_hash().to_owned();
        let tag = &hash[..16];
        let server = format!("tower_redis_ratelimit_{tag}_server");
        let caller = format!("tower_redis_ratelimit_{tag}_caller");
        let mut text = format!("#!lua name=tower_redis_ratelimit_{tag}\n");
        for (time, name) in [(TimeSource::Server, &server), (TimeSource::Caller, &caller)] {
            text.push_str("do\n");
            text.push_str(prelude(time));
            text.push_str(lean);
            text.push_str(general);
            text.push_str(&format!(
                "redis.register_function('{name}', function(KEYS, ARGV)\n{ENTRY}\
                 return engine(KEYS, ARGV, L, H)\nend)\nend\n"
            ));
        }
        Self {
            server: Script::new(&source(TimeSource::Server, lean, general)),
            caller: Script::new(&source(TimeSource::Caller, lean, general)),
            library: Library {
                text,
                server,
                caller,
            },
        }
    }

    /// Both versions of a script of its own, apart from the engine, whose `body` defines
    /// `engine(KEYS, ARGV)` (the [in-flight](crate::in_flight) slots): the same two
    /// paths as the engine's, a library of Redis Functions loaded on first use, or the
    /// script by `EVALSHA`.
    pub(crate) fn standalone(body: &str) -> Self {
        let hash = Script::new(body).get_hash().to_owned();
        let tag = &hash[..16];
        let server = format!("tower_redis_ratelimit_{tag}_server");
        let caller = format!("tower_redis_ratelimit_{tag}_caller");
        let mut text = format!("#!lua name=tower_redis_ratelimit_{tag}\n");
        for (time, name) in [(TimeSource::Server, &server), (TimeSource::Caller, &caller)] {
            text.push_str("do\n");
            text.push_str(prelude(time));
            text.push_str(body);
            text.push_str(&format!(
                "redis.register_function('{name}', function(KEYS, ARGV)\n\
                 return engine(KEYS, ARGV)\nend)\nend\n"
            ));
        }
        let script =
            |time| Script::new(&[prelude(time), body, "return engine(KEYS, ARGV)\n"].concat());
        Self {
            server: script(TimeSource::Server),
            caller: script(TimeSource::Caller),
            library: Library {
                text,
                server,
                caller,
            },
        }
    }

    /// The script for `time`.
    pub(crate) fn get(&self, time: TimeSource) -> &Script {
        match time {
            TimeSource::Server => &self.server,
            TimeSource::Caller => &self.caller,
        }
    }

    /// Whether `script` is one of the engine's scripts.
    pub(crate) fn holds(&self, script: &Script) -> bool {
        std::ptr::eq(script, &self.server) || std::ptr::eq(script, &self.caller)
    }

    /// The library of Redis Functions.
    pub(crate) fn library(&self) -> &Library {
        &self.library
    }
}

fn prelude(time: TimeSource) -> &'static str {
    match time {
        TimeSource::Server => SERVER_PRELUDE,
        TimeSource::Caller => CALLER_PRELUDE,
    }
}

/// The engine's entry: the head's and the limits' words (read from the library's lists
/// when it holds them, without a call), then the lean check for a check, which returns
/// when it decides.
const ENTRY: &str = "\
local H = texts[1][ARGV[1]] or list_of(1, ARGV[1])
local L = texts[2][ARGV[2]] or list_of(2, ARGV[2])
if H[1] == 'c' then
  local out = lean(KEYS, ARGV, L, H)
  if out then
    return out
  end
end
";

/// The engine's script for `time` (`EVALSHA`): the lean check, the entry (returning
/// when the lean check decides), and only then the general engine and its call.
pub(super) fn source(time: TimeSource, lean: &str, general: &str) -> String {
    [
        prelude(time),
        lean,
        ENTRY,
        general,
        "return engine(KEYS, ARGV, L, H)\n",
    ]
    .concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script: the engine (every algorithm) and the probe.
    fn bodies() -> [(&'static str, String); 2] {
        [
            (
                "engine",
                [
                    super::super::engine::engine_lean(),
                    super::super::engine::engine_general(),
                ]
                .concat(),
            ),
            ("probe", include_str!("probe.lua").to_owned()),
        ]
    }

    /// The arguments of every `redis.call(...)` and `redis.pcall(...)` in `lua`, as written.
    fn calls(lua: &str) -> Vec<Vec<String>> {
        ["redis.call(", "redis.pcall("]
            .iter()
            .flat_map(|pattern| lua.match_indices(pattern))
            .map(|(at, open)| {
                let rest = &lua[at + open.len()..];
                let end = rest.find(')').expect("a closing parenthesis");
                rest[..end]
                    .split(',')
                    .map(|arg| arg.trim().to_owned())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_caller_version_never_calls_time() {
        for (name, body) in bodies() {
            let caller = source(TimeSource::Caller, &body, "");
            assert!(
                !caller.to_ascii_uppercase().contains("'TIME'"),
                "{name} calls TIME in caller mode"
            );
            assert!(!calls(&caller).is_empty(), "{name}");
        }
        // The server version of the time-reading bodies does.
        assert!(source(TimeSource::Server, &bodies()[0].1, "").contains("redis.call('TIME')"));
    }

    /// Redis Cluster, Dragonfly and managed servers need every key a script touches in
    /// `KEYS`: each call's key argument is `KEYS[n]`, `key` in an algorithm's function
    /// (which the engine only ever calls with `KEYS[i]`), or the engine's `block`
    /// (`KEYS[n + 1]`).
    #[test]
    fn every_key_a_script_touches_is_declared() {
        let engine = include_str!("engine.lua");
        let mut calls_with_a_key = 0;
        for (at, _) in engine.match_indices("limits[i][1].") {
            let call = &engine[at + "limits[i][1].".len()..];
            let (function, args) = call.split_once('(').expect("a call");
            if function != "step" && function != "charge" {
                assert!(args.starts_with("KEYS[i], "), "{}", &call[..40]);
                calls_with_a_key += 1;
            }
        }
        assert_eq!(
            calls_with_a_key, 5,
            "state, save, refund, and a settlement's refund and state"
        );
        for (name, body) in bodies() {
            for time in [TimeSource::Server, TimeSource::Caller] {
                for call in calls(&source(time, &body, "")) {
                    let command = call[0].trim_matches('\'').to_ascii_uppercase();
                    if command == "TIME" {
                        assert_eq!(call.len(), 1, "{name}: {call:?}");
                        continue;
                    }
                    assert!(
                        call.get(1).is_some_and(|key| {
                            key.starts_with("KEYS[") || key == "key" || key == "block"
                        }),
                        "{name}: {call:?} touches a key not taken from KEYS"
                    );
                }
            }
        }
    }

    #[test]
    fn the_preludes_differ() {
        let scripts = Scripts::new("return caller_time", "");
        assert_ne!(
            scripts.get(TimeSource::Server).get_hash(),
            scripts.get(TimeSource::Caller).get_hash()
        );
        assert_eq!(TimeSource::default(), TimeSource::Server);
    }
}
