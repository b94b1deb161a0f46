//! The engine's text: every algorithm's Lua (its lean check and its general steps) and
//! the engine that runs one limit or a set with them, as one script per time source and
//! one library of Redis Functions ([`ENGINE`]).

use std::sync::LazyLock;

use deadpool_redis::redis::{self, FromRedisValue, Value};

use super::{Scripts, TimeSource};

/// The engine: every algorithm as a function, and the code that runs one limit or a set
/// of limits with them, in both time versions, as a script (`EVALSHA`) and as a library
/// of Redis Functions. Loaded once per connection (script) or per server (library).
pub(crate) static ENGINE: LazyLock<Scripts> =
    LazyLock::new(|| Scripts::new(&engine_lean(), &engine_general()));

/// The engine's lean check (`lean.lua`, after each algorithm's lean functions): what a
/// common check runs, before the general engine's text.
pub(crate) fn engine_lean() -> String {
    [
        include_str!("../period/period_lean.lua"),
        include_str!("../token_bucket/token_bucket_lean.lua"),
        include_str!("../rolling/rolling_lean.lua"),
        include_str!("lean.lua"),
    ]
    .concat()
}

/// The general engine (`engine.lua`, after every algorithm's steps), which defines
/// `engine(KEYS, ARGV, L, H)`.
pub(crate) fn engine_general() -> String {
    [
        include_str!("../period/period.lua"),
        include_str!("../token_bucket/token_bucket.lua"),
        include_str!("../rolling/rolling.lua"),
        include_str!("engine.lua"),
    ]
    .concat()
}

/// A script's reply as numbers: for the engine, its table, with a lean check's packed
/// admits read back into the table they stand for (`packed` in `lean.lua`: one limit's
/// reply is a negative number, a set's a table of them); other scripts' tables never
/// start with a negative number.
pub(crate) fn reply_numbers(value: Value) -> redis::RedisResult<Vec<i64>> {
    match value {
        Value::Int(packed) if packed < 0 => Ok(unpacked([packed].into_iter(), 1)),
        Value::Array(items) if matches!(items.first(), Some(Value::Int(first)) if *first < 0) => {
            let count = items.len();
            let limits = items.into_iter().map(|item| match item {
                Value::Int(packed) => packed,
                // (Not the engine's: read as nothing admitted, which no decision reads.)
                _ => 0,
            });
            Ok(unpacked(limits, count))
        }
        value => Ok(Vec::<i64>::from_redis_value(value)?),
    }
}

/// The engine's reply `{1, 0, each limit's reply}` from `count` limits' packed admits:
/// each `-((t * 2^bits + n) * 128 + shape * 64 + bits) - 1`, whose reply is `{1, n, t}`
/// (shape 0, a fixed window's) or `{1, n, 0, t}` (shape 1).
fn unpacked(limits: impl Iterator<Item = i64>, count: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(2 + 4 * count);
    out.extend([1, 0]);
    for packed in limits {
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
    out
}

/// Not part of the API: whether a reply of [`engine_script`] (read as numbers by
/// redis-rs) admits: its table's first number is 1, or it is a lean check's packed
/// admit (negative).
#[doc(hidden)]
#[must_use]
pub fn engine_admits(reply: &[i64]) -> bool {
    matches!(reply.first(), Some(&first) if first == 1 || first < 0)
}

/// The engine's operation that spends when every limit admits.
pub(crate) const CHECK: &str = "c";

/// Not part of the API: the text of the script every check runs, in the version that
/// reads the server's time, so that benchmarks can time a bare `EVALSHA` of the very
/// same script (`KEYS`: the limit's key, then `<key>:block`; `ARGV`: see
/// `src/backend/engine.lua`).
#[doc(hidden)]
#[must_use]
pub fn engine_script() -> String {
    super::time::source(TimeSource::Server, &engine_lean(), &engine_general())
}

#[cfg(test)]
mod tests {
    use super::*;

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
