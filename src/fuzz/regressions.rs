//! Every input a target ever failed on, run before its generated inputs: add each new
//! one here with what it found (and the fix's commit).

use std::time::Duration;

use crate::decision::State;

/// A header target's input: the policy (name, quota, window) and the decision (state,
/// remaining, reset, retry after).
pub(super) type Headers = (
    String,
    u64,
    Duration,
    State,
    u64,
    Duration,
    Option<Duration>,
);

/// Rule files: the documented forms the fuzzing started from, and every failure.
pub(super) fn rule_files() -> Vec<Vec<u8>> {
    [
        // Issue 53, item 2: the map form of `missing_key` in YAML.
        "backend: {}\nrules:\n- name: r\n  key: global\n  missing_key: {reject: 401}\n  \
         limit: {algorithm: period, quota: 1, period: 1s}\n",
        // A zero period and a one-nanosecond window: errors when built, not panics.
        "[backend]\n[[rules]]\nname = \"r\"\nkey = \"global\"\n\
         limit = { algorithm = \"period\", quota = 1, period = \"0s\" }\n",
        "[backend]\n[[rules]]\nname = \"r\"\nkey = \"global\"\n\
         limit = { algorithm = \"token_bucket\", rate = 18446744073709551615, per = \"1ns\", burst = 1 }\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

/// Redis URLs and the secret each must never show.
pub(super) fn redis_urls() -> Vec<(String, String)> {
    // Issue 53, item 1: a `?` typed for `&` put the password into the client's error.
    vec![(
        "redis://127.0.0.1:6379/2?protocol=resp3?password=s3cret".to_owned(),
        "s3cret".to_owned(),
    )]
}

/// `RateLimit` headers.
pub(super) fn ratelimit_headers() -> Vec<Headers> {
    // A retry after of `Duration::MAX` (a block or lockout of that long): rounding it up
    // to whole seconds overflowed (`ceil_secs`), a panic in debug builds and a
    // `Retry-After: 0` in release ones.
    vec![(
        "6..-__m".to_owned(),
        14_384_001_425_457_133_882,
        Duration::from_secs(8_194_436_266),
        State::OverQuota,
        5_935_007_586_529_848_890,
        Duration::ZERO,
        Some(Duration::MAX),
    )]
}
