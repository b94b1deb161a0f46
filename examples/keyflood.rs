//! Memory under a key flood: pushes one million distinct keys through the in-process
//! state of each algorithm and reports the resident memory of the process (`VmRSS` from
//! `/proc/self/status`) before the flood, at its peak, after the idle sweep has dropped
//! the expired state, and at the peak of a second flood of as many new keys (which shows
//! whether the freed memory is reused).
//!
//! ```text
//! cargo run --release --example keyflood                   # all algorithms, 1 000 000 keys
//! cargo run --release --example keyflood -- period 200000  # one algorithm, fewer keys
//! ```
//!
//! Each algorithm runs in a fresh child process (this program started again), so one
//! algorithm's freed memory does not hide another's. Time is tokio's paused clock: the
//! flood takes no tokio time, then the clock is advanced past the expiry of every key
//! and past the sweep interval, and one more check starts the sweep (on the blocking pool)
//! (its duration is reported too).
//!
//! | algorithm | configuration | sweep |
//! |---|---|---|
//! | `token_bucket` | 10 per second, burst 10 | idle (full) buckets every 10 s |
//! | `period` | 10 per second | expired windows every min(period, 60 s), at least 1 s |
//! | `rolling` | 10 per 10 × 100 ms | expired keys every min(window, 60 s), at least 1 s |
//!
//! Linux only (`/proc`). The figures include the allocator's behaviour: memory freed by
//! the sweep goes back to the allocator, which need not return it to the system.

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::process::Command;
use std::time::{Duration, Instant};

use tower_redis_ratelimit::period::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::rolling::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::token_bucket::{TokenBucketConfig, TokenBucketLimiter};
use tower_redis_ratelimit::{Backend, Limiter, State};

const ALGORITHMS: [&str; 3] = ["token_bucket", "period", "rolling"];
const DEFAULT_KEYS: usize = 1_000_000;
const ONE: NonZeroU32 = NonZeroU32::MIN;

/// `VmRSS` or `VmHWM` of this process, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// The limiter under test, and how far to advance the clock so that every key has
/// expired and the next check sweeps.
fn limiter(algorithm: &str, backend: &Backend) -> (Box<dyn Limiter>, Duration) {
    let sec = Duration::from_secs(1);
    match algorithm {
        // Full again 100 ms after one request; the sweep runs every 10 s.
        "token_bucket" => (
            Box::new(
                TokenBucketLimiter::new(backend, "flood", TokenBucketConfig::new(10, sec, 10))
                    .expect("valid token bucket"),
            ),
            Duration::from_secs(11),
        ),
        // Windows end 1 s after their first request; the sweep runs every second.
        "period" => (
            Box::new(
                PeriodLimiter::new(backend, "flood", PeriodConfig::new(10, sec))
                    .expect("valid period"),
            ),
            Duration::from_secs(3),
        ),
        // A 1 s window; the sweep runs every second.
        "rolling" => (
            Box::new(
                RollingWindowLimiter::new(
                    backend,
                    "flood",
                    RollingConfig::new(10, 10, Duration::from_millis(100)),
                )
                .expect("valid rolling window"),
            ),
            Duration::from_secs(3),
        ),
        other => panic!("unknown algorithm {other:?}; one of {ALGORITHMS:?}"),
    }
}

/// Checks `count` distinct keys named `<prefix><i>`; all must be admitted.
async fn flood(limiter: &dyn Limiter, prefix: &str, count: usize) -> Duration {
    let mut key = String::with_capacity(prefix.len() + 20);
    let start = Instant::now();
    for i in 0..count {
        key.clear();
        key.push_str(prefix);
        write!(key, "{i}").expect("write to a String");
        let decision = limiter.check(key.as_bytes(), ONE).await;
        assert!(
            matches!(decision.state, State::Allowed | State::HitQuota),
            "{key} was refused: {decision:?}"
        );
    }
    start.elapsed()
}

/// Runs one algorithm in this process and prints one table row.
fn run(algorithm: &str, keys: usize) {
    // One blocking thread: the sweeps run there, and a no-op task queued behind a sweep
    // tells when it is done.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .max_blocking_threads(1)
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let backend = Backend::in_process();
        let (limiter, idle) = limiter(algorithm, &backend);
        let before = status_kib("VmRSS");
        let took = flood(&*limiter, "flood-", keys).await;
        let peak = status_kib("VmRSS");
        tokio::time::advance(idle).await;
        // The first check after the sweep interval starts a sweep on the blocking pool.
        let sweep_start = Instant::now();
        let _ = limiter.check(b"after-the-sweep", ONE).await;
        let request = sweep_start.elapsed();
        tokio::task::spawn_blocking(|| ())
            .await
            .expect("the blocking pool runs");
        let sweep = sweep_start.elapsed();
        let after = status_kib("VmRSS");
        let again = flood(&*limiter, "second-flood-", keys).await;
        let second_peak = status_kib("VmRSS");
        let per_key = (peak.saturating_sub(before) as f64 * 1024.0) / keys as f64;
        println!(
            "| {algorithm} | {keys} | {} | {} | {per_key:.0} | {:.0} | {:.3} | {:.1} | {} | {} | {:.0} |",
            mib(before),
            mib(peak),
            keys as f64 / took.as_secs_f64(),
            request.as_secs_f64() * 1e3,
            sweep.as_secs_f64() * 1e3,
            mib(after),
            mib(second_peak),
            keys as f64 / again.as_secs_f64(),
        );
    });
}

fn header() {
    println!(
        "| algorithm | keys | RSS before (MiB) | RSS at peak (MiB) | bytes/key | new keys/s \
         | request that starts the sweep (ms) | sweep, off the request path (ms) \
         | RSS after sweep (MiB) | RSS at 2nd flood peak (MiB) | 2nd flood keys/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map_or("all", String::as_str);
    let keys = match args.get(1) {
        Some(n) => n.parse()?,
        None => DEFAULT_KEYS,
    };
    if let Some(child) = which.strip_prefix("--child=") {
        run(child, keys);
        return Ok(());
    }
    let algorithms: Vec<&str> = match which {
        "all" => ALGORITHMS.to_vec(),
        one if ALGORITHMS.contains(&one) => vec![one],
        other => return Err(format!("unknown algorithm {other:?}; one of {ALGORITHMS:?}").into()),
    };
    header();
    let exe = std::env::current_exe()?;
    for algorithm in algorithms {
        let status = Command::new(&exe)
            .arg(format!("--child={algorithm}"))
            .arg(keys.to_string())
            .status()?;
        if !status.success() {
            return Err(format!("{algorithm}: the child process failed ({status})").into());
        }
    }
    Ok(())
}
