//! The engine's text: every algorithm's Lua (its fast path and its general steps) and
//! the engine that runs one limit or a set with them, as one script per time source and
//! one library of Redis Functions ([`ENGINE`]).

use std::sync::LazyLock;

use super::protocol::reply_numbers;
use crate::backend::redis::script::{Body, Scripts};
use crate::backend::redis::time::TimeSource;

/// The engine: every algorithm as a function, and the code that runs one limit or a set
/// of limits with them, in both time versions, as a script (`EVALSHA`) and as a library
/// of Redis Functions. Loaded once per connection (script) or per server (library).
pub(crate) static ENGINE: LazyLock<Scripts> = LazyLock::new(|| {
    let parts = Parts::of(&FILES);
    Scripts::new(parts.body(), reply_numbers)
});

/// The engine's Lua files: each algorithm's (its part of the fast path and its steps),
/// the fast path's, and the general engine's (which also reads a call's head and
/// limits). Each file is cut into sections by lines `--## <section>`; [`Parts::of`]
/// places the sections in [`SECTIONS`]' order, each section's parts in this order.
pub(super) const FILES: [&str; 5] = [
    include_str!("../../period/period.lua"),
    include_str!("../../token_bucket/token_bucket.lua"),
    include_str!("../../rolling/rolling.lua"),
    include_str!("fast.lua"),
    include_str!("engine.lua"),
];

/// The sections of the engine's text, in the order a call meets them:
/// - `locals`: what the rest reads as locals (library functions, the call's texts read
///   into lists);
/// - `fast`: the fast path: the common check, coalesced checks and settlement in the
///   fewest commands, deciding as the general engine would;
/// - `entry`: what each call runs first; it returns when the fast path decides;
/// - `general`: the general engine (every operation, every case), which a call built
///   by `EVALSHA` defines only when the fast path did not decide;
/// - `return`: the general engine's call.
const SECTIONS: [&str; 5] = ["locals", "fast", "entry", "general", "return"];

/// The engine's text gathered by section (see [`SECTIONS`]): `locals` and `fast` as
/// the head the two paths share.
struct Parts {
    head: String,
    entry: String,
    general: String,
    last: String,
}

impl Parts {
    /// Each section's lines from every file of `files`, in order. A file's lines before
    /// its first `--## ` line are its header, for readers only.
    fn of(files: &[&str]) -> Self {
        let mut sections: [String; 5] = Default::default();
        for file in files {
            let mut into = None;
            for line in file.split_inclusive('\n') {
                if let Some(name) = line.strip_prefix("--## ") {
                    let name = name.trim_end();
                    into = SECTIONS.iter().position(|section| *section == name);
                    assert!(into.is_some(), "no engine section `{name}`");
                    continue;
                }
                if let Some(at) = into {
                    sections[at].push_str(line);
                }
            }
        }
        let [locals, fast, entry, general, last] = sections;
        Self {
            head: locals + &fast,
            entry,
            general,
            last,
        }
    }

    /// The script's parts as the two paths arrange them.
    fn body(&self) -> Body<'_> {
        Body {
            head: &self.head,
            entry: &self.entry,
            tail: &self.general,
            last: &self.last,
        }
    }
}

/// Not part of the API: the text of the script every check runs, in the version that
/// reads the server's time, so that benchmarks can time a bare `EVALSHA` of the very
/// same script (`KEYS`: the limit's key, then `<key>:block`; `ARGV`: see
/// `src/backend/decide/engine.lua`).
#[doc(hidden)]
#[must_use]
pub fn engine_script() -> String {
    Parts::of(&FILES).body().source(TimeSource::Server)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script: the engine (every algorithm) and the probe.
    fn bodies() -> [(&'static str, String); 2] {
        [
            ("engine", {
                let parts = Parts::of(&FILES);
                [parts.head, parts.general].concat()
            }),
            ("probe", crate::backend::redis::probe::TEXT.to_owned()),
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
        let engine = FILES[4];
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
}
