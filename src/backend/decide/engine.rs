//! The engine's text: every algorithm's Lua (its lean check and its general steps) and
//! the engine that runs one limit or a set with them, as one script per time source and
//! one library of Redis Functions ([`ENGINE`]).

use std::sync::LazyLock;

use deadpool_redis::redis::{self, FromRedisValue, Value};

use crate::backend::redis::time::{Body, Scripts, TimeSource};

/// The engine: every algorithm as a function, and the code that runs one limit or a set
/// of limits with them, in both time versions, as a script (`EVALSHA`) and as a library
/// of Redis Functions. Loaded once per connection (script) or per server (library).
pub(crate) static ENGINE: LazyLock<Scripts> = LazyLock::new(|| {
    let (lean, general) = (engine_lean(), engine_general());
    Scripts::new(body(&lean, &general), reply_numbers)
});

/// The engine's entry: the lean check's locals bound (`bind.lua`, once per library),
/// the head's and the limits' words (read from the library's lists when it holds them,
/// without a call), then the lean check for a check (and for coalesced checks of one
/// limit, and a settlement of one limit), which returns when it decides.
const ENTRY: &str = "\
if not floor then
  bind_lean()
end
local H = texts[1][ARGV[1]] or list_of(1, ARGV[1])
local L = texts[2][ARGV[2]] or list_of(2, ARGV[2])
if H[1] == 'c' then
  local out = lean(KEYS, ARGV, L, 0, #KEYS - 1, H[2], H[4], nil)
  if out then
    return out
  end
elseif (H[1] == 'm' or H[1] == 'M') and #KEYS == 2 then
  local out = lean_coalesced(KEYS, ARGV, L, H[2], H[1] == 'M', unix_us(ARGV))
  if out then
    return out
  end
elseif H[1] == 's' then
  local out = lean_settle(KEYS, ARGV, L, 0, #KEYS - 1, H[2], H[4], nil)
  if out then
    return out
  end
end
";

/// The engine's text in the parts the two paths arrange: the lean check (`lean`),
/// the entry, which returns when the lean check decides, and only then the general
/// engine (`general`) and its call.
fn body<'a>(lean: &'a str, general: &'a str) -> Body<'a> {
    Body {
        head: lean,
        entry: ENTRY,
        tail: general,
        last: "if H[1] == 'k' or H[1] == 'K' then\n  return batch(KEYS, ARGV, L, H)\nend\nreturn engine(KEYS, ARGV, L, H)\n",
    }
}

/// The engine's lean check (`lean.lua`, after each algorithm's lean functions): what a
/// common check runs, before the general engine's text.
pub(crate) fn engine_lean() -> String {
    [
        include_str!("bind.lua"),
        include_str!("../../period/period_lean.lua"),
        include_str!("../../token_bucket/token_bucket_lean.lua"),
        include_str!("../../rolling/rolling_lean.lua"),
        include_str!("lean.lua"),
    ]
    .concat()
}

/// The general engine (`engine.lua`, after every algorithm's steps), which defines
/// `engine(KEYS, ARGV, L, H)`.
pub(crate) fn engine_general() -> String {
    [
        include_str!("../../period/period.lua"),
        include_str!("../../token_bucket/token_bucket.lua"),
        include_str!("../../rolling/rolling.lua"),
        include_str!("engine.lua"),
    ]
    .concat()
}

/// A script's reply as numbers: for the engine, its table, with a lean check's admits
/// read back into the table they stand for (`lean.lua`: one limit's reply is a packed
/// negative number, or the table of its wide admit; a set's, a table of its limits'
/// admits, each packed or wide); other scripts' tables never start with a negative
/// number.
pub(crate) fn reply_numbers(value: Value) -> redis::RedisResult<Vec<i64>> {
    match value {
        Value::Int(packed) if packed < 0 => {
            let mut out = Vec::with_capacity(6);
            out.extend([1, 0]);
            unpack_into(&mut out, packed);
            Ok(out)
        }
        Value::Array(items) if matches!(items.first(), Some(Value::Int(first)) if *first < 0) => {
            let mut out = Vec::with_capacity(2 + 4 * items.len());
            out.extend([1, 0]);
            let mut items = items.into_iter();
            while let Some(item) = items.next() {
                if !admit_into(&mut out, item, &mut items) {
                    // (Not the engine's: read as nothing admitted, which no decision reads.)
                    out.push(0);
                }
            }
            Ok(out)
        }
        value => Ok(Vec::<i64>::from_redis_value(value)?),
    }
}

/// A batch's reply (engine ops `k`, `K` and `m`: one table, the count of limits `n`,
/// then each check's reply in order, flat: an admit as its `n` limits' admits, packed
/// or wide, anything else as its table, an item that raised an error as nil) as
/// numbers: each check's reply, read as [`reply_numbers`] reads it, after its length
/// (none for a check that raised an error, whose failure policy answers).
pub(crate) fn batch_numbers(value: Value) -> redis::RedisResult<Vec<i64>> {
    let Value::Array(items) = value else {
        // (Not a batch's reply: read as no check's, which fails every check.)
        return Ok(Vec::new());
    };
    let mut items = items.into_iter();
    let Some(Value::Int(n @ 1..)) = items.next() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(items.len() * 7);
    while let Some(item) = items.next() {
        let at = out.len();
        out.push(0);
        match item {
            Value::Nil | Value::Boolean(false) => {}
            Value::Int(first) if first < 0 => {
                out.extend([1, 0]);
                let mut admit = Some(Value::Int(first));
                for _ in 0..n {
                    let read = match admit.take().or_else(|| items.next()) {
                        Some(item) => admit_into(&mut out, item, &mut items),
                        None => false,
                    };
                    if !read {
                        // (Not the engine's: read as no check's, which fails every check.)
                        return Ok(Vec::new());
                    }
                }
            }
            item => out.extend(reply_numbers(item).unwrap_or_default()),
        }
        out[at] = i64::try_from(out.len() - at - 1).unwrap_or(i64::MAX);
    }
    Ok(out)
}

/// Appends the reply that one limit's admit stands for (`item`, packed, or the first
/// number of a wide admit, whose other two `rest` gives), or returns false when it is
/// not an admit.
fn admit_into(out: &mut Vec<i64>, item: Value, rest: &mut impl Iterator<Item = Value>) -> bool {
    let Value::Int(first @ ..0) = item else {
        return false;
    };
    let word = -(first.saturating_add(1));
    if word & 63 != 0 {
        unpack_into(out, first);
        return true;
    }
    // Wide: -(shape * 64) - 1, then n and t.
    let (Some(Value::Int(n)), Some(Value::Int(t))) = (rest.next(), rest.next()) else {
        return false;
    };
    out.extend([1, n]);
    if word & 64 != 0 {
        out.push(0);
    }
    out.push(t);
    true
}

/// Appends the reply `{1, n, t}` (shape 0, a fixed window's) or `{1, n, 0, t}` (shape 1)
/// that a lean check's packed admit stands for:
/// `-((t * 2^bits + n) * 128 + shape * 64 + bits) - 1`.
fn unpack_into(out: &mut Vec<i64>, packed: i64) {
    let word = -(packed.saturating_add(1));
    let bits = word & 63;
    let rest = word >> 7;
    let n = rest & ((1_i64 << bits.min(62)) - 1);
    out.extend([1, n]);
    if word & 64 != 0 {
        out.push(0);
    }
    out.push(rest >> bits);
}

/// Not part of the API: whether a reply of [`engine_script`] (read as numbers by
/// redis-rs) admits: its table's first number is 1, or it is a lean check's packed
/// admit (negative).
#[doc(hidden)]
#[must_use]
pub fn engine_admits(reply: &[i64]) -> bool {
    matches!(reply.first(), Some(&first) if first == 1 || first < 0)
}

/// The engine's operations (the first word of its head, see `engine.lua`): a check,
/// which spends when every limit admits.
pub(crate) const CHECK: &str = "c";
/// Coalesced checks of one key, each decided as its own check.
pub(crate) const COALESCED: &str = "m";
/// [`COALESCED`] checks that all cost the same: the cost sent once.
pub(crate) const SHARED_COALESCED: &str = "M";
/// Checks of several keys of one limiter, each decided as its own check (`batch.rs`).
pub(crate) const BATCH: &str = "k";
/// A [`BATCH`] of checks that all cost the same: the cost sent once.
pub(crate) const SHARED_BATCH: &str = "K";
/// A check that takes a lease (see `lease.rs`).
pub(crate) const LEASE: &str = "l";
/// What a check would answer, spending nothing.
pub(crate) const PEEK: &str = "p";
/// Gives units back.
pub(crate) const REFUND: &str = "f";
/// Settles a request to what it really cost.
pub(crate) const SETTLE: &str = "s";
/// Forgets the key and lifts its block.
pub(crate) const RESET: &str = "x";
/// Blocks the key.
pub(crate) const BLOCK: &str = "b";
/// Takes units at the earliest time they fit.
pub(crate) const RESERVE: &str = "v";

/// Not part of the API: the text of the script every check runs, in the version that
/// reads the server's time, so that benchmarks can time a bare `EVALSHA` of the very
/// same script (`KEYS`: the limit's key, then `<key>:block`; `ARGV`: see
/// `src/backend/decide/engine.lua`).
#[doc(hidden)]
#[must_use]
pub fn engine_script() -> String {
    let (lean, general) = (engine_lean(), engine_general());
    body(&lean, &general).source(TimeSource::Server)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script: the engine (every algorithm) and the probe.
    fn bodies() -> [(&'static str, String); 2] {
        [
            ("engine", [engine_lean(), engine_general()].concat()),
            ("probe", include_str!("../redis/probe.lua").to_owned()),
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
            let caller = Body::standalone(&body).source(TimeSource::Caller);
            assert!(
                !caller.to_ascii_uppercase().contains("'TIME'"),
                "{name} calls TIME in caller mode"
            );
            assert!(!calls(&caller).is_empty(), "{name}");
        }
        // The server version of the time-reading bodies does.
        assert!(Body::standalone(&bodies()[0].1)
            .source(TimeSource::Server)
            .contains("redis.call('TIME')"));
    }

    /// Redis Cluster, Dragonfly and managed servers need every key a script touches in
    /// `KEYS`, and cluster proxies such as Alibaba Cloud's read it from the call's text:
    /// each command's key arguments are written `KEYS[..]` in the call itself (the
    /// algorithms' functions take `KEYS` and their key's index, which the engine passes
    /// as `KEYS, i`). tests/dialect.rs checks the assembled scripts the same way and more.
    #[test]
    fn every_key_a_script_touches_is_declared() {
        let engine = include_str!("engine.lua");
        let mut calls_with_a_key = 0;
        for (at, _) in engine.match_indices("limits[i][1].") {
            let call = &engine[at + "limits[i][1].".len()..];
            let (function, args) = call.split_once('(').expect("a call");
            if function != "step" && function != "charge" {
                assert!(
                    args.starts_with("KEYS, i, ") || args.starts_with("KEYS, i)"),
                    "{}",
                    &call[..40]
                );
                calls_with_a_key += 1;
            }
        }
        assert_eq!(
            calls_with_a_key, 7,
            "state, save, refund, a settlement's refund and state, mark and unmark"
        );
        for (name, body) in bodies() {
            for time in [TimeSource::Server, TimeSource::Caller] {
                for call in calls(&Body::standalone(&body).source(time)) {
                    let command = call[0].trim_matches('\'').to_ascii_uppercase();
                    if command == "TIME" {
                        assert_eq!(call.len(), 1, "{name}: {call:?}");
                        continue;
                    }
                    if command == "PUBLISH" {
                        // A channel, not a key (`<prefix>:changes`).
                        continue;
                    }
                    let keys = if command == "MGET" {
                        &call[1..]
                    } else {
                        &call[1..2]
                    };
                    assert!(
                        keys.iter().all(|key| key.starts_with("KEYS[")),
                        "{name}: {call:?} touches a key not written KEYS[..]"
                    );
                }
            }
        }
    }

    /// A limit's admit packed as `lean.lua` packs it.
    fn packed(n: i64, t: i64, shape: i64, bits: i64) -> i64 {
        -((((t << bits) + n) << 7) + (shape << 6) + bits) - 1
    }

    #[test]
    fn packed_admits_read_back_into_the_engine_table() {
        // A fixed window (count 7 of a quota of 100: 7 bits; 59 s left).
        assert_eq!(
            reply_numbers(Value::Int(packed(7, 59_000, 0, 7))).unwrap(),
            [1, 0, 1, 7, 59_000]
        );
        // A token bucket (no tokens left of a burst of 1: 1 bit; 1 s until full).
        assert_eq!(
            reply_numbers(Value::Int(packed(0, 1_000_000, 1, 1))).unwrap(),
            [1, 0, 1, 0, 0, 1_000_000]
        );
        // A set: each limit packed, in order; the largest values that fit.
        let (n, t) = ((1 << 20) - 1, (1 << 26) - 1);
        assert_eq!(
            reply_numbers(Value::Array(vec![
                Value::Int(packed(5, 2, 1, 3)),
                Value::Int(packed(n, t, 0, 20)),
            ]))
            .unwrap(),
            [1, 0, 1, 5, 0, 2, 1, n, t]
        );
    }

    #[test]
    fn wide_admits_read_back_into_the_engine_table() {
        // A daily window of 2^40 (too large to pack): -(shape * 64) - 1, n, t; in a set
        // after a packed token bucket, and alone.
        let (n, t) = (1 << 40, 86_400_000);
        let wide = |shape: i64| [-(shape << 6) - 1, n, t].map(Value::Int);
        let mut set = vec![Value::Int(packed(5, 2, 1, 3))];
        set.extend(wide(0));
        assert_eq!(
            reply_numbers(Value::Array(set)).unwrap(),
            [1, 0, 1, 5, 0, 2, 1, n, t]
        );
        assert_eq!(
            reply_numbers(Value::Array(wide(1).to_vec())).unwrap(),
            [1, 0, 1, n, 0, t]
        );
        // (A wide admit cut short is not the engine's.)
        assert_eq!(
            reply_numbers(Value::Array(wide(0)[..2].to_vec())).unwrap(),
            [1, 0, 0]
        );
    }

    #[test]
    fn a_batch_reads_back_into_each_checks_reply() {
        // Two limits: an admit (packed, then wide), a refusal's table, an item that
        // raised an error, an admit (both packed).
        let items = [
            Value::Int(2),
            Value::Int(packed(5, 2, 1, 3)),
            Value::Int(-1),
            Value::Int(1 << 40),
            Value::Int(7),
            Value::Array([0, 0, 0, 0, 9, 2, 1, 3, 5].map(Value::Int).to_vec()),
            Value::Nil,
            Value::Int(packed(4, 1, 1, 3)),
            Value::Int(packed(3, 9, 0, 7)),
        ];
        assert_eq!(
            batch_numbers(Value::Array(items.to_vec())).unwrap(),
            [
                [9, 1, 0, 1, 5, 0, 2, 1, 1 << 40, 7].as_slice(),
                &[9, 0, 0, 0, 0, 9, 2, 1, 3, 5],
                &[0],
                &[9, 1, 0, 1, 4, 0, 1, 1, 3, 9],
            ]
            .concat()
        );
        // Not a batch's reply (no count of limits, an admit cut short): no check's.
        assert!(batch_numbers(Value::Array(items[1..].to_vec()))
            .unwrap()
            .is_empty());
        assert!(batch_numbers(Value::Array(items[..3].to_vec()))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn tables_pass_through() {
        let table = || Value::Array(vec![Value::Int(0), Value::Int(250), Value::Int(1)]);
        assert_eq!(reply_numbers(table()).unwrap(), [0, 250, 1]);
        // (No script answers a number that is not a packed admit: an error, as before.)
        assert!(reply_numbers(Value::Int(5)).is_err());
        assert!(reply_numbers(Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn admits_are_told_from_refusals() {
        assert!(engine_admits(&[1, 0, 1, 5, 100]));
        assert!(engine_admits(&[packed(5, 100, 0, 3)]));
        assert!(!engine_admits(&[0, 0, 0, 5, 100]));
        assert!(!engine_admits(&[]));
    }
}
