//! Which clock the Redis scripts read: [`TimeSource`], and the prelude that gives each
//! script's two versions ([`Scripts`](super::script::Scripts)) their clock.
//!
//! The engine reads time only through `unix_us(ARGV)`; a short prelude, one per time
//! source, defines it:
//!
//! - server time: `unix_us()` calls `TIME`;
//! - caller time: `unix_us(ARGV)` reads the last `ARGV` (microseconds since the Unix
//!   epoch, appended to every call of such a script). The text of this version holds
//!   no `TIME` call at all, so a server that refuses `TIME` in scripts, or scans scripts for it,
//!   never meets it.
//!
//! `caller_time` tells the body which one it runs in, for the few rules that differ
//! (see each algorithm's "Clocks" docs).

/// Where the Redis scripts take the current time from; see
/// [`BackendBuilder::time_source`](crate::BackendBuilder::time_source).
///
/// ```
/// use tower_redis_ratelimit::{TimeSource, Backend};
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// // A server that refuses `TIME` inside scripts (reported of ElastiCache Serverless).
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
    /// server whose scripts may call `TIME` and get the real time: Redis 6.2 to 8 and
    /// Valkey 8 and 9 (tested here: `scripts/matrix`); Dragonfly since 1.15 (a time in
    /// ms, the same for the whole script: not tested here).
    /// [`Backend::warm_up`](crate::Backend::warm_up) tells a server that
    /// refuses `TIME` inside scripts, and names this remedy.
    #[default]
    Server,
    /// The caller's clock, sent to each script as one more argument (its only cost: one
    /// more short argument per check); no script ever calls `TIME`. For servers that
    /// refuse `TIME` in scripts (reported of ElastiCache Serverless; an ACL rule `-time`
    /// does it too, and [`Backend::warm_up`](crate::Backend::warm_up) says so).
    ///
    /// The clock is the backend's own: the host's Unix time when the backend was built,
    /// advanced by the monotonic clock (tokio's, so a paused tokio clock drives it in
    /// tests), so it never steps back. Instances whose clocks differ by up to `s` (their
    /// hosts' wall-clock difference when their backends were built, plus the time a check
    /// takes to reach Redis, below the [call timeout](crate::BackendBuilder::call_timeout))
    /// keep each algorithm's guarantees within a bound of `s`: see "Clocks" in the
    /// [fixed window](crate::PeriodConfig#clocks), [token bucket](crate::TokenBucketConfig#clocks)
    /// and [rolling window](crate::RollingConfig#clocks) docs. Keep hosts on NTP.
    Caller,
}

/// What both preludes define first: `unpack_list()` and `native_numbers()`.
macro_rules! common_prelude {
    () => {
        "\
-- unpack: a global in Lua 5.1 (Redis, Valkey), table.unpack in Lua 5.4 (Dragonfly); read
-- when called (a library of Redis Functions may not read `table` while it loads).
local function unpack_list(list, i, j)
  return (table.unpack or unpack)(list, i, j) -- luacheck: ignore 113 143
end
-- Whether a number given to a command goes as it is: Redis 7.2 and later and Valkey
-- (Lua 5.1) write it themselves, exactly (a whole number's digits, else the shortest
-- digits that read back as the same double) and for a fraction of what string.format
-- costs. Elsewhere it goes as text: Redis before 7.2 writes a number with libc's
-- '%.17g', which costs more than string.format's integer formats; a Lua 5.4 server
-- (Dragonfly, Garnet) or one that does not say its version, its own way. (Lua 5.1
-- prints a whole float as '1', 5.4 as '1.0'.) Found at a call's first need and kept: a
-- library of Redis Functions may read neither `tostring` nor `_VERSION` while it loads.
local numbers_native = nil
local function native_numbers()
  if numbers_native == nil then
    numbers_native = tostring(0.5 + 0.5) == '1' and (redis.REDIS_VERSION_NUM or 0) >= 459264
  end
  return numbers_native
end
"
    };
}

/// Sets `unix_us()` and `caller_time` for a script body, from `TIME`.
const SERVER_PRELUDE: &str = concat!(
    common_prelude!(),
    "\
-- Time: the Redis server's clock.
local caller_time = false
local function unix_us(_)
  local t = redis.call('TIME')
  -- (Arithmetic reads TIME's numbers: tonumber() would cost Redis three times as much.)
  return t[1] * 1000000 + t[2]
end
"
);

/// Sets `unix_us()` and `caller_time` for a script body, from the last `ARGV`.
const CALLER_PRELUDE: &str = concat!(
    common_prelude!(),
    "\
-- Time: the caller's clock, the last ARGV (microseconds since the Unix epoch).
local caller_time = true
local function unix_us(argv)
  return tonumber(argv[#argv])
end
"
);

/// The prelude that defines `unix_us()` and `caller_time` for `time`.
pub(crate) fn prelude(time: TimeSource) -> &'static str {
    match time {
        TimeSource::Server => SERVER_PRELUDE,
        TimeSource::Caller => CALLER_PRELUDE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::script::Scripts;

    #[test]
    fn the_preludes_differ() {
        let scripts = Scripts::standalone("return caller_time");
        assert_ne!(
            scripts.get(TimeSource::Server).get_hash(),
            scripts.get(TimeSource::Caller).get_hash()
        );
        assert_eq!(TimeSource::default(), TimeSource::Server);
    }
}
