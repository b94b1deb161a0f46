//! N instances under faults never admit beyond the documented bound (issue 22), in the
//! manner of Jepsen's counter checks: three backends, each with its own connections
//! through its own fault proxy to one `redis-server`, each on a random path (coalescing
//! and the deny cache on or off), check keys of a fixed window and of a token bucket
//! with leases from concurrent tasks while random faults come and go on each proxy
//! (latency, held replies, lost replies, resets, partitions, refused connections) and
//! the server's clock steps back and returns. Every admission is recorded with the store
//! that answered it, then compared with the bound the docs state:
//!
//! - answered by Redis (or from a lease): at most the limit, as Redis counts it (a
//!   fixed window: its quota in its window; a token bucket: its burst plus its rate over
//!   the run); a step back of the server's clock, then its return, adds nothing to a
//!   fixed window (a token bucket: the known gap below); leases add at most N × their
//!   size;
//! - answered by an instance's fallback: at most that instance's share of the limit
//!   (`fallback_share` = 1/N), per instance.
//!
//! One seed per run, printed: `BOUND_SEED=<seed>` replays the same schedule of faults
//! and paths (the interleaving of the tasks follows the machine). `BOUND_ROUNDS` sets the
//! number of runs (default 2), `BOUND_CLOCK` the clock steps (0: none, 1: every run;
//! default: half of the runs), `BOUND_LEASE=0` turns the leases off.
//!
//! Known gap: a token bucket under a step back of the server's clock and its return may
//! give back up to a burst (its docs say why); that bound is checked only with
//! `BOUND_STRICT=1`, which fails within a few seeds. The fixed window's bound, and the
//! token bucket's without clock steps, are checked in every run.

mod support;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::RedisServer;
use tower_redis_ratelimit::{Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const INSTANCES: usize = 3;
const KEYS: usize = 3;
/// The fixed window: 40 per minute (one window during a run).
const QUOTA: u64 = 40;
/// The token bucket: 20 a second, bursts of 10, leases of 3 for 200 ms.
const RATE: u64 = 20;
const BURST: u64 = 10;
const RUN: Duration = Duration::from_millis(2_500);
/// The token bucket's lease size.
const LEASE: u64 = 3;

/// Whether the token bucket takes leases (`BOUND_LEASE=0`: no, to tell them apart).
fn leased() -> bool {
    std::env::var("BOUND_LEASE").map_or(true, |v| v != "0")
}

/// A small PRNG (xorshift64*): the run's schedule from its seed.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What was admitted, by limiter, key, instance and store.
#[derive(Debug, Default)]
struct Ledger {
    admitted: HashMap<(&'static str, usize, usize, Source), u64>,
}

struct Instance {
    period: PeriodLimiter,
    bucket: TokenBucketLimiter,
    proxy: FaultProxy,
    path: String,
}

fn instance(redis: &RedisServer, rng: &mut Rng) -> Instance {
    let proxy = FaultProxy::start(redis.port());
    proxy.set_seed(rng.next());
    let coalesce = rng.below(2) == 0;
    let deny_cache = if rng.below(2) == 0 { 0 } else { 10_000 };
    let backend = support::backend_builder()
        .redis(proxy.pool())
        .coalesce(coalesce)
        .deny_cache(deny_cache)
        .fallback_share(1.0 / INSTANCES as f64)
        .probe_interval(Duration::from_millis(100))
        .build()
        .expect("a valid backend");
    let period = PeriodLimiter::new(
        &backend,
        "bound-period",
        PeriodConfig::new(QUOTA, Duration::from_secs(60)),
    )
    .expect("valid");
    let bucket = TokenBucketLimiter::new(&backend, "bound-bucket", {
        let config = TokenBucketConfig::new(RATE, Duration::from_secs(1), BURST);
        if leased() {
            config.lease(LEASE, Duration::from_millis(200))
        } else {
            config
        }
    })
    .expect("valid");
    Instance {
        period,
        bucket,
        proxy,
        path: format!("coalesce={coalesce} deny_cache={deny_cache}"),
    }
}

/// One random fault on `proxy` for a while, then none.
async fn fault(proxy: &FaultProxy, rng: &mut Rng) -> &'static str {
    let fault = match rng.below(8) {
        0 => {
            proxy.set_latency(Duration::from_millis(30 + rng.below(60)));
            "latency"
        }
        1 => {
            proxy.hold_replies(0.2, Duration::from_millis(150));
            "held replies"
        }
        2 => {
            proxy.lose_replies(0.1);
            "lost replies"
        }
        3 => {
            proxy.reset_connections();
            "reset"
        }
        4 => {
            proxy.blackhole(true);
            "partition"
        }
        5 => {
            proxy.refuse(true);
            proxy.reset_connections();
            "refused"
        }
        _ => "none",
    };
    tokio::time::sleep(Duration::from_millis(100 + rng.below(300))).await;
    proxy.clear();
    fault
}

async fn run(seed: u64) -> Result<(), String> {
    let (redis, clock) = RedisServer::start_with_clock();
    let mut rng = Rng(seed | 1);
    let instances: Vec<Arc<Instance>> = (0..INSTANCES)
        .map(|_| Arc::new(instance(&redis, &mut rng)))
        .collect();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, instance) in instances.iter().enumerate() {
        for t in 0..4 {
            let instance = Arc::clone(instance);
            let ledger = Arc::clone(&ledger);
            let mut rng = Rng(rng.next() | 1);
            tasks.spawn(async move {
                while started.elapsed() < RUN {
                    let key = rng.below(KEYS as u64) as usize;
                    let name = [b'k', b'0' + key as u8];
                    let (limiter, decision) = if (t + key) % 2 == 0 {
                        (
                            "period",
                            instance.period.check(&name, NonZeroU32::MIN).await,
                        )
                    } else {
                        (
                            "bucket",
                            instance.bucket.check(&name, NonZeroU32::MIN).await,
                        )
                    };
                    if decision.is_admitted() {
                        let mut ledger = ledger.lock().expect("no panic holding it");
                        *ledger
                            .admitted
                            .entry((limiter, key, i, decision.source))
                            .or_default() += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(rng.below(8))).await;
                }
            });
        }
    }
    // Faults on each proxy, and the server's clock stepping back and returning.
    let mut schedule = Vec::new();
    let mut cycles = 0u64;
    // Clock steps in half of the runs (`BOUND_CLOCK=0`: never; `=1`: always).
    let steps = match std::env::var("BOUND_CLOCK").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => rng.below(2) == 0,
    };
    while started.elapsed() < RUN {
        let which = rng.below(INSTANCES as u64 + u64::from(steps)) as usize;
        if which == INSTANCES {
            let back = 1_000_000 + rng.below(20_000_000) as i64;
            clock.set_offset_us(-back);
            tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
            clock.set_offset_us(0);
            schedule.push(format!("clock back {back} µs and return"));
            cycles += 1;
        } else {
            let what = fault(&instances[which].proxy, &mut rng).await;
            schedule.push(format!("instance {which}: {what}"));
        }
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed();
    clock.set_offset_us(0);

    let ledger = ledger.lock().expect("no panic holding it");
    let mut report = String::new();
    let share = QUOTA / INSTANCES as u64;
    // The token bucket: Redis's tokens over the run (its burst, plus its rate over the
    // run and one call timeout); each fallback: its share of both.
    let secs = elapsed.as_secs_f64() + 0.1;
    // Known gap (issue 22's note; the token bucket's "Clocks" docs): a token bucket's
    // key knows the newest time it has seen only as its TAT minus a refill, so a step
    // back of the server's clock and its return may give back up to a burst. Its bound
    // is checked in runs without steps, and in runs with them only with
    // `BOUND_STRICT=1` (which reproduces the gap within a few seeds), against the
    // refill of an interval, the gap between checks and the faults' longest round trip
    // (250 ms, five tokens) per step.
    let per_step = (RATE as f64 * 0.25).ceil() as u64;
    let strict = std::env::var("BOUND_STRICT").is_ok_and(|v| v == "1");
    // Leases: units leased before a span are used in it, N × L at most (the docs).
    let leases = if leased() {
        INSTANCES as u64 * LEASE
    } else {
        0
    };
    let bucket_bound = BURST + leases + per_step * cycles + (RATE as f64 * secs).ceil() as u64;
    let local_burst = ((BURST as f64 / INSTANCES as f64).floor() as u64).max(1);
    let local_bound = local_burst + (RATE as f64 / INSTANCES as f64 * secs).ceil() as u64;
    for limiter in ["period", "bucket"] {
        for key in 0..KEYS {
            let count = |pick: &dyn Fn(usize, Source) -> bool| -> u64 {
                ledger
                    .admitted
                    .iter()
                    .filter(|((l, k, i, s), _)| *l == limiter && *k == key && pick(*i, *s))
                    .map(|(_, n)| n)
                    .sum()
            };
            let shared = count(&|_, s| matches!(s, Source::Redis | Source::Lease));
            let shared_bound = if limiter == "period" {
                QUOTA
            } else {
                bucket_bound
            };
            let checked = limiter == "period" || cycles == 0 || strict;
            if checked && shared > shared_bound {
                report += &format!(
                    "{limiter} k{key}: {shared} admitted by Redis and leases, bound {shared_bound}\n"
                );
            }
            for i in 0..INSTANCES {
                let local = count(&|j, s| j == i && s == Source::Fallback);
                let bound = if limiter == "period" {
                    share
                } else {
                    local_bound
                };
                if local > bound {
                    report += &format!(
                        "{limiter} k{key}: instance {i}'s fallback admitted {local}, bound {bound}\n"
                    );
                }
            }
        }
    }
    let paths: Vec<_> = instances.iter().map(|i| i.path.clone()).collect();
    println!(
        "seed {seed}: {elapsed:?}, paths {paths:?}\nadmitted: {:?}\nschedule: {schedule:?}",
        ledger.admitted
    );
    if report.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "BOUND_SEED={seed}: admitted beyond the bound:\n{report}paths {paths:?}\nschedule: {schedule:?}"
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_under_faults_admit_within_the_bound() {
    let seeds: Vec<u64> = match std::env::var("BOUND_SEED") {
        Ok(seed) => vec![seed.parse().expect("a number")],
        Err(_) => {
            let rounds = std::env::var("BOUND_ROUNDS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(2);
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos() as u64;
            (0..rounds)
                .map(|r| base.wrapping_add(r * 0x9E37_79B9))
                .collect()
        }
    };
    for seed in seeds {
        println!("BOUND_SEED={seed}");
        if let Err(why) = run(seed).await {
            panic!("{why}");
        }
    }
}
