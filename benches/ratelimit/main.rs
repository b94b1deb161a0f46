//! Criterion benchmarks of one rate-limit check.
//!
//! - `in_process/*`: `Limiter::check` of each algorithm (fixed window, token bucket,
//!   rolling window) on `Backend::in_process()`, next to a keyed `governor::RateLimiter`
//!   with the same quota called directly; with one hot key, with 100 000 keys, and with
//!   a hot key that is refused on every check.
//! - `redis/*`: the same checks on `Backend::redis` against a throw-away `redis-server`
//!   (started here with the test harness on a free loopback port), next to a bare
//!   `EVALSHA` of the token-bucket script through the `redis` crate: sequential latency,
//!   32 checks in flight, and a refused hot key (with and without the deny cache). The
//!   contenders of each comparison run interleaved, and the mean of each over the same
//!   moments is printed on stderr (see `redis_checks.rs`): use those ratios to compare,
//!   since Redis round trips on a shared machine drift from one bench to the next.
//!
//! - `keys/*`: one key extraction with the built-in extractors (see `keys.rs`).
//! - `service/*`: one HTTP request through an axum `Router` (no network) on the routes of
//!   the `loadtest` harness: no limiter, the in-process token bucket with and without
//!   headers, `tower_governor` with and without headers, and both refusing (see
//!   `service.rs`).
//!
//! Rates are huge (nothing is refused) except in the `refused` groups. Each check is one
//! element (`Throughput::Elements`), so criterion reports checks per second as well.
//!
//! ```text
//! cargo bench --bench ratelimit -- --warm-up-time 1 --measurement-time 3
//! cargo bench --bench ratelimit -- --warm-up-time 1 --measurement-time 3 in_process/
//! cargo bench --bench ratelimit -- --warm-up-time 1 --measurement-time 3 redis/
//! cargo bench --bench ratelimit -- --warm-up-time 1 --measurement-time 3 service/
//! ```
//!
//! The Redis benches need `redis-server` on `PATH` (or `$REDIS_SERVER`; `scripts/bench`
//! installs it) and are skipped with a message when it is missing. Run as a test
//! (`cargo test --benches`) every bench runs once, with fewer keys.

#[path = "../../tests/support/mod.rs"]
mod support;

mod in_process;
mod keys;
mod redis_checks;
mod service;

use criterion::Criterion;

/// `n`, or a small number of keys when the binary runs as a test (no `--bench` flag), so
/// that `cargo test --all-targets` stays quick.
fn key_count(n: usize) -> usize {
    if std::env::args().any(|arg| arg == "--bench") {
        n
    } else {
        n.min(1_000)
    }
}

/// `count` distinct keys shaped like API keys.
fn keys(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("api-key-{i:08}")).collect()
}

/// What `criterion_group!` and `criterion_main!` expand to, without their undocumented
/// public function.
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    in_process::benches(&mut criterion);
    keys::benches(&mut criterion);
    service::benches(&mut criterion);
    redis_checks::benches(&mut criterion);
    criterion.final_summary();
}
