//! Fuzz targets, one per surface that takes outside bytes (issue 53): rule files, Redis
//! URLs, proxy headers, the Redis key layout, the engine's replies and the `RateLimit`
//! headers. Each runs generated inputs (mutated seeds and structure-aware values: zero,
//! nanosecond and `u64::MAX` settings, secrets at every place of a URL) for a bounded
//! time, as an ordinary test on stable: `FUZZ_SECONDS` (default 2) per target, the
//! random seed from `FUZZ_SEED` to replay a run. Every input that ever failed is kept in
//! [`regressions`] and runs first.
//!
//! ```text
//! cargo nextest run --all-features --lib fuzz:: --no-capture            # 2 s each
//! FUZZ_SECONDS=300 cargo nextest run --all-features --lib fuzz:: --no-capture
//! ```

use std::fmt::Debug;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

mod regressions;
mod targets;

/// Runs `target` on values of `strategy`: first on `regressions`, then on generated
/// values for `FUZZ_SECONDS`; prints the executions per second. A failing input is
/// printed (`Debug`) with the seed that replays the run.
fn fuzz<S>(name: &str, strategy: S, regressions: &[S::Value], target: impl Fn(&S::Value))
where
    S: Strategy,
    S::Value: Debug + Clone,
{
    for input in regressions {
        target(input);
    }
    let seconds: f64 = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let start = Instant::now();
    let budget = Duration::from_secs_f64(seconds);
    let mut runs = 0u64;
    while runs < 64 || start.elapsed() < budget {
        let input = strategy
            .new_tree(&mut runner)
            .expect("the strategies never reject")
            .current();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&input)));
        if let Err(panic) = outcome {
            eprintln!("fuzz {name}: failed on {input:?} (FUZZ_SEED={seed}, run {runs})");
            std::panic::resume_unwind(panic);
        }
        runs += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    eprintln!(
        "fuzz {name}: {runs} runs in {elapsed:.1} s, {:.0}/s, seed {seed}",
        runs as f64 / elapsed
    );
}

/// `seed` with up to eight byte edits (insert, delete, replace), as a fuzzer mutates its
/// corpus.
fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let edits = prop::collection::vec((0usize..4, any::<prop::sample::Index>(), any::<u8>()), 0..8);
    (prop::sample::select(seeds), edits).prop_map(|(mut bytes, edits)| {
        for (kind, at, byte) in edits {
            let len = bytes.len();
            match kind {
                0 => bytes.insert(at.index(len + 1), byte),
                1 if len > 0 => {
                    bytes.remove(at.index(len));
                }
                2 if len > 0 => bytes[at.index(len)] = byte,
                // A byte the formats care about.
                _ => bytes.insert(
                    at.index(len + 1),
                    b"{}[]\"'=:,;%&?@/\\\n#"[usize::from(byte) % 18],
                ),
            }
        }
        bytes
    })
}

/// The peer a request came from, as axum's `ConnectInfo` carries it.
fn from_peer(peer: IpAddr) -> http::request::Parts {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts
        .extensions
        .insert(axum::extract::ConnectInfo(SocketAddr::new(peer, 40_000)));
    parts
}
