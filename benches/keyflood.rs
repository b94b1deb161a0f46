//! Memory and latency under a key flood: sends new keys at a steady rate (default 45 000
//! new keys per second for 15 s) through the in-process state of each algorithm, with the
//! backend's DEFAULT settings, then keeps a trickle of requests going while the flood's
//! state expires. Reports, per algorithm: the peak resident memory of the process
//! (`VmHWM`), the resident memory after the expiry phase (`VmRSS`), and the slowest single
//! check over the whole run (the flood and the expiry phase), also less the time the
//! thread spent waiting for a CPU meanwhile (`/proc/thread-self/schedstat`, read around
//! each millisecond's batch of checks), which separates the limiter's own pauses from
//! the machine's other processes.
//!
//! ```text
//! cargo bench --bench keyflood                     # all, 15 s at 45 000 keys/s
//! cargo bench --bench keyflood -- rolling 60       # one algorithm, 60 s
//! cargo bench --bench keyflood -- all 15 45000 65  # seconds, keys/s, expiry s
//! cargo bench --bench keyflood -- rolling 30 45000 0 8  # rolling: 8 buckets
//! ```
//!
//! Each algorithm runs in a fresh child process (this program started again), so one
//! algorithm's memory does not hide another's. Real time, in-process only (no network):
//! the run is bounded by its arguments (flood + expiry seconds per algorithm).
//!
//! | algorithm | configuration |
//! |---|---|
//! | `token_bucket` | 10 per second, burst 10 (a bucket is full again 1 s after its request) |
//! | `period` | 100 per minute |
//! | `rolling` | 100 per minute, in 60 buckets of 1 s (or the fifth argument's count) |
//!
//! With minute windows no key expires during a 15 s flood, so the flood's state is all
//! there at its end; the expiry phase (default 65 s) outlasts every window.
//!
//! Linux only (`/proc`). The figures include the allocator's behaviour: memory freed
//! goes back to the allocator, which need not return it to the system.

use std::num::NonZeroU32;
use std::process::Command;
use std::time::{Duration, Instant};

use tower_redis_ratelimit::{Backend, Limiter};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const ALGORITHMS: [&str; 3] = ["token_bucket", "period", "rolling"];
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

fn limiter(algorithm: &str, backend: &Backend, buckets: u32) -> Box<dyn Limiter> {
    let sec = Duration::from_secs(1);
    match algorithm {
        "token_bucket" => Box::new(
            TokenBucketLimiter::new(backend, "flood", TokenBucketConfig::new(10, sec, 10))
                .expect("valid token bucket"),
        ),
        "period" => Box::new(
            PeriodLimiter::new(backend, "flood", PeriodConfig::new(100, 60 * sec))
                .expect("valid period"),
        ),
        "rolling" => Box::new(
            RollingWindowLimiter::new(backend, "flood", RollingConfig::new(100, buckets, sec))
                .expect("valid rolling window"),
        ),
        other => panic!("unknown algorithm {other:?}; one of {ALGORITHMS:?}"),
    }
}

/// The settings of one run.
#[derive(Debug, Clone, Copy)]
struct Run {
    flood: Duration,
    rate: u64,
    expiry: Duration,
    /// The rolling window's buckets (of 1 s).
    buckets: u32,
}

/// Nanoseconds this thread has run, and waited for a CPU while runnable
/// (`/proc/thread-self/schedstat`).
fn schedstat() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut fields = stat.split_whitespace().map(|f| f.parse().unwrap_or(0));
    (fields.next().unwrap_or(0), fields.next().unwrap_or(0))
}

/// The slowest checks seen.
#[derive(Debug, Default)]
struct Slowest {
    max: Duration,
    /// The slowest check of a batch, less the time the thread waited for a CPU during
    /// the batch: what is left when the machine's other processes are taken out.
    max_not_waiting: Duration,
    /// The slowest check of the current batch, and the wait counter at its start.
    batch_max: Duration,
    batch_wait: u64,
    /// Checks that took more than 1 ms, and more than 20 ms.
    over_1ms: u64,
    over_20ms: u64,
}

impl Slowest {
    /// Checks `key`, recording how long the check took.
    async fn check(&mut self, limiter: &dyn Limiter, key: &str) {
        let start = Instant::now();
        let _ = limiter.check(key.as_bytes(), ONE).await;
        let took = start.elapsed();
        self.max = self.max.max(took);
        self.over_1ms += u64::from(took > Duration::from_millis(1));
        self.over_20ms += u64::from(took > Duration::from_millis(20));
        self.batch_max = self.batch_max.max(took);
    }

    fn start_batch(&mut self) {
        self.batch_max = Duration::ZERO;
        self.batch_wait = schedstat().1;
    }

    fn end_batch(&mut self) {
        let waited = Duration::from_nanos(schedstat().1.saturating_sub(self.batch_wait));
        self.max_not_waiting = self
            .max_not_waiting
            .max(self.batch_max.saturating_sub(waited));
    }
}

/// Runs one algorithm in this process and prints one table row.
fn run(algorithm: &str, run: Run) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let backend = Backend::in_process();
        let limiter = limiter(algorithm, &backend, run.buckets);
        let before = status_kib("VmRSS");
        let mut slowest = Slowest::default();
        let mut key = String::with_capacity(32);
        // The flood: new keys at `rate` per second, paced every millisecond.
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < run.flood {
            let due = (start.elapsed().as_secs_f64() * run.rate as f64) as u64;
            slowest.start_batch();
            while sent < due {
                key.clear();
                key.push_str("flood-");
                key.push_str(itoa::Buffer::new().format(sent));
                slowest.check(&*limiter, &key).await;
                sent += 1;
            }
            slowest.end_batch();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = start.elapsed();
        let at_end = status_kib("VmRSS");
        // Expiry: a trickle of 100 checks per second on a few keys.
        let idle = Instant::now();
        let mut i = 0u64;
        while idle.elapsed() < run.expiry {
            key.clear();
            key.push_str("trickle-");
            key.push_str(itoa::Buffer::new().format(i % 10));
            slowest.start_batch();
            slowest.check(&*limiter, &key).await;
            slowest.end_batch();
            i += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let after = status_kib("VmRSS");
        let peak = status_kib("VmHWM");
        println!(
            "| {algorithm} | {:.0} | {sent} | {:.0} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} |",
            took.as_secs_f64(),
            sent as f64 / took.as_secs_f64(),
            mib(before),
            mib(peak),
            mib(at_end),
            mib(after),
            slowest.max.as_secs_f64() * 1e3,
            slowest.max_not_waiting.as_secs_f64() * 1e3,
            slowest.over_1ms,
            slowest.over_20ms,
        );
    });
}

fn header() {
    println!(
        "| algorithm | flood (s) | new keys | keys/s | RSS before (MiB) | peak RSS (MiB) \
         | RSS at the flood's end (MiB) | RSS after expiry (MiB) | slowest check (ms) \
         | slowest, less CPU wait (ms) | checks > 1 ms | checks > 20 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args()
        .filter(|arg| arg != "--bench")
        .skip(1)
        .collect();
    let which = args.first().map_or("all", String::as_str).to_owned();
    let number = |i: usize, default: u64| -> Result<u64, Box<dyn std::error::Error>> {
        Ok(match args.get(i) {
            Some(n) => n.parse()?,
            None => default,
        })
    };
    let run_settings = Run {
        flood: Duration::from_secs(number(1, 15)?),
        rate: number(2, 45_000)?,
        expiry: Duration::from_secs(number(3, 65)?),
        buckets: u32::try_from(number(4, 60)?)?,
    };
    if let Some(child) = which.strip_prefix("--child=") {
        run(child, run_settings);
        return Ok(());
    }
    let algorithms: Vec<&str> = match which.as_str() {
        "all" => ALGORITHMS.to_vec(),
        one if ALGORITHMS.contains(&one) => vec![one],
        other => return Err(format!("unknown algorithm {other:?}; one of {ALGORITHMS:?}").into()),
    };
    header();
    let exe = std::env::current_exe()?;
    for algorithm in algorithms {
        let status = Command::new(&exe)
            .arg(format!("--child={algorithm}"))
            .args(&args[1.min(args.len())..])
            .status()?;
        if !status.success() {
            return Err(format!("{algorithm}: the child process failed ({status})").into());
        }
    }
    Ok(())
}
