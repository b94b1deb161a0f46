//! Redis CPU per decision: the microseconds Redis spends in one engine call
//! (`INFO commandstats` `usec_per_call` of `EVALSHA` and `FCALL`, after `CONFIG
//! RESETSTAT`), for each algorithm (a calendar window too), a set, a coalesced batch, a
//! lease, a lockout, an in-flight slot (acquire and release, and with renewals while
//! held) and a request settled after its response (its check and its settlement), next
//! to two peer scripts written for this benchmark from their published algorithms: GCRA
//! as go-redis/redis_rate does it (`GET`, arithmetic on the arrival time, `SET ... EX`)
//! and a fixed window as go-zero's `PeriodLimit` does it (`INCRBY`, then `EXPIRE` on the
//! first unit). Run by `scripts/bench-engine`, which starts the `redis-server`.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:PORT cargo run --release --example bench_engine -- [rounds]
//! ```
//!
//! Every row checks 10 000 keys twice (a warm-up pass creates them; then `CONFIG
//! RESETSTAT` and the measured pass), 64 checks in flight, nothing refused. Rows take
//! turns, round after round (default 3); the median round of each row is printed. The
//! crate's rows run on each path the server takes: Redis Functions (`FCALL`, Redis 7
//! and later) and `EVALSHA`.

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tower_redis_ratelimit::deadpool_redis::redis;
use tower_redis_ratelimit::in_flight::{InFlightConfig, InFlightLimiter};
use tower_redis_ratelimit::period::{Calendar, PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::rolling::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::set::{LimitSet, SetLimiter};
use tower_redis_ratelimit::token_bucket::{TokenBucketConfig, TokenBucketLimiter};
use tower_redis_ratelimit::{Backend, Limiter, Source};

const KEYS: usize = 10_000;
const IN_FLIGHT: usize = 64;
const ONE: NonZeroU32 = NonZeroU32::MIN;
const MINUTE: Duration = Duration::from_secs(60);
const HUGE: u64 = 1_000_000_000;

/// GCRA as go-redis/redis_rate runs it: the arrival time in seconds since an epoch, a
/// float; `SET` with `EX` while the bucket is not full. Written for this benchmark.
const GCRA: &str = r"
redis.replicate_commands()
local key = KEYS[1]
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local interval = period / rate
local increment = interval * cost
local offset = interval * burst
local t = redis.call('TIME')
local now = (t[1] - 1483228800) + t[2] / 1000000
local tat = redis.call('GET', key)
if not tat then tat = now else tat = tonumber(tat) end
tat = math.max(tat, now)
local new_tat = tat + increment
local diff = now - (new_tat - offset)
local remaining = diff / interval
if remaining < 0 then
  return {0, 0, tostring(-diff), tostring(tat - now)}
end
local reset = new_tat - now
if reset > 0 then
  redis.call('SET', key, new_tat, 'EX', math.ceil(reset))
end
return {cost, remaining, tostring(-1), tostring(reset)}
";

/// A fixed window as go-zero's `PeriodLimit` runs it: `INCRBY`, `EXPIRE` on the first
/// unit. Written for this benchmark.
const PERIOD: &str = r"
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local current = redis.call('INCRBY', KEYS[1], 1)
if current == 1 then
  redis.call('EXPIRE', KEYS[1], window)
end
if current < limit then
  return 1
elseif current == limit then
  return 2
else
  return 0
end
";

/// What one row runs for a key.
type Run = Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = u64> + Send>> + Send + Sync>;

struct Row {
    name: String,
    run: Run,
    /// Whether the row's calls finish in the background (an in-flight slot's release):
    /// the stats are read once they are done.
    background: bool,
}

fn limiter_row<L: Limiter + 'static>(name: &str, limiter: L) -> Row {
    let limiter = Arc::new(limiter);
    Row {
        name: name.to_owned(),
        run: Arc::new(move |key| {
            let limiter = Arc::clone(&limiter);
            Box::pin(async move {
                let decision = limiter.check(key.as_bytes(), ONE).await;
                assert!(decision.is_admitted(), "refused: {decision:?}");
                assert!(
                    matches!(decision.source, Source::Redis | Source::Lease),
                    "{decision:?}"
                );
                1
            })
        }),
        background: false,
    }
}

/// An in-flight slot per key: taken (one call), held `hold`, then given back (one call,
/// in the background), with the renewals of a lease of `lease` meanwhile.
fn in_flight_row(backend: &Backend, name: &str, hold: Duration, lease: Duration) -> Row {
    let config = InFlightConfig::new(HUGE).lease(lease);
    let limiter = InFlightLimiter::new(backend, name.split(' ').next().unwrap(), config).unwrap();
    Row {
        name: name.to_owned(),
        run: Arc::new(move |key| {
            let limiter = limiter.clone();
            Box::pin(async move {
                let slot = limiter.acquire(key.as_bytes()).await.expect("a slot");
                assert_eq!(slot.decision().source, Source::Redis);
                if !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                }
                drop(slot);
                1
            })
        }),
        background: true,
    }
}

/// A settled request: a check of `estimate`, then (its response ended) a settlement of
/// `delta`, each one engine call.
fn settle_row<L: Limiter + 'static>(name: &str, limiter: L, estimate: u32, delta: i64) -> Row {
    let limiter = Arc::new(limiter);
    let estimate = NonZeroU32::new(estimate).expect("an estimate above 0");
    Row {
        name: name.to_owned(),
        run: Arc::new(move |key| {
            let limiter = Arc::clone(&limiter);
            Box::pin(async move {
                let decision = limiter.check(key.as_bytes(), estimate).await;
                assert!(decision.is_admitted(), "refused: {decision:?}");
                let settled = limiter
                    .settle(key.as_bytes(), delta)
                    .expect("settles")
                    .await;
                assert_eq!(settled.source, Source::Redis, "{settled:?}");
                1
            })
        }),
        // The settlement is awaited here (a layer sends it in the background).
        background: false,
    }
}

/// `batch` checks of each key at once: the first goes alone, the others together in one
/// coalesced call.
fn batch_row<L: Limiter + 'static>(name: &str, limiter: L, batch: usize) -> Row {
    let limiter = Arc::new(limiter);
    Row {
        name: name.to_owned(),
        run: Arc::new(move |key| {
            let limiter = Arc::clone(&limiter);
            Box::pin(async move {
                // Each check takes its turn when made: the first leads, the others queue.
                let checks: Vec<_> = (0..batch)
                    .map(|_| limiter.check(key.as_bytes(), ONE))
                    .collect();
                for check in checks {
                    assert!(check.await.is_admitted());
                }
                batch as u64
            })
        }),
        background: false,
    }
}

fn script_row(
    name: &str,
    conn: &redis::aio::MultiplexedConnection,
    script: &str,
    args: Vec<String>,
) -> Row {
    let script = Arc::new(redis::Script::new(script));
    let conn = conn.clone();
    let args = Arc::new(args);
    Row {
        name: name.to_owned(),
        run: Arc::new(move |key| {
            let (script, mut conn, args) = (Arc::clone(&script), conn.clone(), Arc::clone(&args));
            Box::pin(async move {
                // A key as long as the crate's (`ratelimit:{v1:<key>}:token_bucket:tb`).
                let mut invocation = script.key(format!("ratelimit:{{v1:{key}}}:peer_script:p"));
                for arg in args.iter() {
                    invocation.arg(arg);
                }
                let _: redis::Value = invocation
                    .invoke_async(&mut conn)
                    .await
                    .expect("peer script");
                1
            })
        }),
        background: false,
    }
}

async fn pass(row: &Row, prefix: &str) -> u64 {
    let mut tasks = tokio::task::JoinSet::new();
    let mut sum = 0;
    for i in 0..KEYS {
        if tasks.len() >= IN_FLIGHT {
            sum += tasks.join_next().await.unwrap().unwrap();
        }
        tasks.spawn((row.run)(format!("{prefix}{i:05}")));
    }
    while let Some(n) = tasks.join_next().await {
        sum += n.unwrap();
    }
    sum
}

async fn cmd(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn).await.expect("redis command")
}

/// Calls and µs of the script commands (`evalsha`, `fcall`) since the last reset.
async fn script_stats(conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    let (mut calls, mut usec) = (0, 0);
    for line in info.lines() {
        let Some(rest) = ["cmdstat_evalsha:", "cmdstat_fcall:", "cmdstat_evalsha_ro:"]
            .iter()
            .find_map(|p| line.strip_prefix(p))
        else {
            continue;
        };
        for field in rest.split(',') {
            if let Some(v) = field.strip_prefix("calls=") {
                calls += v.parse::<u64>().unwrap();
            } else if let Some(v) = field.strip_prefix("usec=") {
                usec += v.parse::<u64>().unwrap();
            }
        }
    }
    (calls, usec)
}

/// The CPU time the server has used (user and system), in µs: its whole work, reading
/// requests and writing replies included (commandstats count the commands only).
async fn server_cpu_us(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO");
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    };
    (field("used_cpu_user:") + field("used_cpu_sys:")) * 1e6
}

fn backend(url: &str, cluster: &[String], functions: bool) -> Backend {
    let builder = if cluster.is_empty() {
        Backend::builder().redis_url(url)
    } else {
        Backend::builder().redis_cluster_urls(cluster.iter().cloned())
    };
    let builder = builder.call_timeout(Duration::from_secs(2));
    let builder = if functions {
        builder
    } else {
        builder.engine_functions(false)
    };
    builder.build().expect("backend")
}

fn crate_rows(backend: &Backend, path: &str) -> Vec<Row> {
    let tb = TokenBucketConfig::new(1_000_000, Duration::from_secs(1), 1_000_000);
    let p = |name: &str| format!("{name} [{path}]");
    vec![
        limiter_row(
            &p("token bucket"),
            TokenBucketLimiter::new(backend, "tb", tb).unwrap(),
        ),
        limiter_row(
            &p("fixed window"),
            PeriodLimiter::new(backend, "fw", PeriodConfig::new(HUGE, MINUTE)).unwrap(),
        ),
        limiter_row(
            &p("calendar window (a day in America/New_York)"),
            PeriodLimiter::new(
                backend,
                "cw",
                PeriodConfig::calendar(HUGE, Calendar::day("America/New_York")),
            )
            .unwrap(),
        ),
        limiter_row(
            &p("rolling window, 10 buckets"),
            RollingWindowLimiter::new(backend, "rw", RollingConfig::new(HUGE, 10, MINUTE / 10))
                .unwrap(),
        ),
        limiter_row(
            &p("set: token bucket + fixed window"),
            SetLimiter::new(
                backend,
                "set",
                LimitSet::new()
                    .limit("burst", tb)
                    .limit("daily", PeriodConfig::new(HUGE, MINUTE)),
            )
            .unwrap(),
        ),
        limiter_row(
            &p("token bucket, lockout (never blocked)"),
            TokenBucketLimiter::new(backend, "tbl", tb.lockout(MINUTE)).unwrap(),
        ),
        batch_row(
            &p("token bucket, coalesced (8 at once, per decision)"),
            TokenBucketLimiter::new(backend, "tbc", tb).unwrap(),
            8,
        ),
        settle_row(
            &p("settled request, token bucket: check 100, settle +20"),
            TokenBucketLimiter::new(backend, "tbu", tb).unwrap(),
            100,
            20,
        ),
        settle_row(
            &p("settled request, token bucket: check 100, settle -20"),
            TokenBucketLimiter::new(backend, "tbd", tb).unwrap(),
            100,
            -20,
        ),
        settle_row(
            &p("settled request, set requests + tokens: check 100, settle +20"),
            SetLimiter::new(
                backend,
                "llm",
                LimitSet::new().requests("rpm", tb).limit("tpm", tb),
            )
            .unwrap(),
            100,
            20,
        ),
        limiter_row(
            &p("token bucket, lease call (50 tokens)"),
            TokenBucketLimiter::new(backend, "tbs", tb.lease(50, Duration::from_millis(1)))
                .unwrap(),
        ),
        in_flight_row(
            backend,
            &p("inflight slot: acquire + release"),
            Duration::ZERO,
            Duration::from_secs(10),
        ),
        in_flight_row(
            backend,
            &p("inflightrenew slot held 20 ms, lease 30 ms (renewed every 10 ms)"),
            Duration::from_millis(20),
            Duration::from_millis(30),
        ),
    ]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = std::env::var("REDIS_URL").expect("REDIS_URL");
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(3, |r| r.parse().expect("rounds"));
    // With REDIS_CLUSTER_URLS (comma-separated masters), the crate's rows run on that
    // Redis Cluster; the figures are summed over its masters.
    let cluster: Vec<String> = std::env::var("REDIS_CLUSTER_URLS")
        .map(|urls| urls.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let node_urls = if cluster.is_empty() {
        vec![url.clone()]
    } else {
        cluster.clone()
    };
    let mut nodes = Vec::new();
    for node in &node_urls {
        let client = redis::Client::open(node.as_str()).unwrap();
        nodes.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    let conn = nodes[0].clone();

    let mut rows = Vec::new();
    let paths: &[(&str, bool)] = &[("functions", true), ("evalsha", false)];
    for &(path, functions) in paths {
        let backend = backend(&url, &cluster, functions);
        backend.probe_redis().await.expect("redis");
        rows.extend(crate_rows(&backend, path));
        std::mem::forget(backend);
    }
    let huge = HUGE.to_string();
    if cluster.is_empty() {
        rows.push(script_row(
            "peer: GCRA (redis_rate)",
            &conn,
            GCRA,
            vec!["1000000".into(), "1000000".into(), "1".into(), "1".into()],
        ));
        rows.push(script_row(
            "peer: INCRBY + EXPIRE (go-zero)",
            &conn,
            PERIOD,
            vec![huge.clone(), "60".into()],
        ));
    }

    let mut results: BTreeMap<usize, Vec<(f64, f64, f64)>> = BTreeMap::new();
    for round in 0..rounds {
        for (i, row) in rows.iter().enumerate() {
            let prefix = format!("r{i}:");
            for conn in &mut nodes {
                cmd(conn, &["FLUSHALL"]).await;
            }
            pass(row, &prefix).await;
            let mut cpu = 0.0;
            for conn in &mut nodes {
                cmd(conn, &["CONFIG", "RESETSTAT"]).await;
                cpu -= server_cpu_us(conn).await;
            }
            let decisions = pass(row, &prefix).await;
            if row.background {
                // The last releases (and renewals) are sent in the background.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let (mut calls, mut usec) = (0, 0);
            let mut shares = Vec::new();
            for conn in &mut nodes {
                cpu += server_cpu_us(conn).await;
                let (c, u) = script_stats(conn).await;
                calls += c;
                usec += u;
                shares.push(c);
            }
            let cpu = cpu / decisions as f64;
            if nodes.len() > 1 {
                eprintln!("round {round} {}: calls per master {shares:?}", row.name);
            }
            let per_decision = usec as f64 / decisions as f64;
            let per_call = usec as f64 / calls.max(1) as f64;
            eprintln!(
                "round {round} {:<58} {per_decision:6.2} µs/decision {per_call:6.2} µs/call {calls} calls",
                row.name
            );
            results.entry(i).or_default().push((
                per_decision,
                calls as f64 / decisions as f64,
                cpu,
            ));
        }
    }
    println!(
        "| decision | Redis µs per decision (commandstats) | decisions/s per Redis core | \
         script calls per decision | Redis CPU µs per decision, I/O included |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (i, row) in rows.iter().enumerate() {
        let mut r = results[&i].clone();
        r.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (us, calls, _) = r[r.len() / 2];
        let mut cpu: Vec<f64> = r.iter().map(|x| x.2).collect();
        cpu.sort_by(f64::total_cmp);
        println!(
            "| {} | {us:.2} | {:.0} | {calls:.2} | {:.1} |",
            row.name,
            1_000_000.0 / us,
            cpu[cpu.len() / 2]
        );
    }
}
