//! The engine's text: every algorithm's Lua (its lean check and its general steps) and
//! the engine that runs one limit or a set with them, as one script per time source and
//! one library of Redis Functions ([`ENGINE`]).

use std::sync::LazyLock;

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
/// `engine(KEYS, ARGV, L)`.
pub(crate) fn engine_general() -> String {
    [
        include_str!("../period/period.lua"),
        include_str!("../token_bucket/token_bucket.lua"),
        include_str!("../rolling/rolling.lua"),
        include_str!("engine.lua"),
    ]
    .concat()
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
