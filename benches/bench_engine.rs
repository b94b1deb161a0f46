//! Redis CPU per decision: the microseconds Redis spends in one engine call
//! (`INFO commandstats` `usec` of `EVALSHA` and `FCALL`, the difference around each
//! pass), for each algorithm (a calendar window too), a set, a coalesced batch, a
//! lease, a lockout, an in-flight slot (acquire and release, and with renewals while
//! held) and a request settled after its response (its check and its settlement), next
//! to two peer scripts written for this benchmark from their published algorithms: GCRA
//! as go-redis/redis_rate does it (`GET`, arithmetic on the arrival time, `SET ... EX`)
//! and a fixed window as go-zero's `PeriodLimit` does it (`INCRBY`, then `EXPIRE` on the
//! first unit). Two floor scripts hold only the commands a token bucket and a set of a
//! token bucket and a fixed window run in the crate's engine, with the call's shape the
//! crate sends: what any script making those decisions from the same stored state pays.
//! Run by `scripts/bench-engine`, which starts the `redis-server`.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:PORT cargo bench --bench bench_engine -- [rounds]
//! ```
//!
//! Every row checks 10 000 keys twice, 64 checks in flight, nothing refused, in ten
//! slices of 1 000 keys in which the rows take turns (after a `FLUSHALL`), so that rows
//! compared share the machine's moments: for each slice, a warm-up pass creates its
//! keys, then the measured pass checks them again (rows whose calls end in the
//! background, the in-flight slots, run their 10 000 keys whole, after). Round after round (default 3); the median round of each
//! row is printed, then the targets' ratios (the median of each round's ratio). The crate's rows run on each path the server takes: Redis Functions
//! (`FCALL`, Redis 7 and later) and `EVALSHA`.
//!
//! `BENCH_ROWS` (comma-separated texts) keeps only the rows whose name contains one.
//!
//! With `BENCH_CALLGRIND=1`, `scripts/bench-engine` runs the `redis-server` under
//! valgrind's callgrind and each row also reports the instructions Redis ran per
//! decision: exact counts, free of the timing noise of a shared machine (one round is
//! enough), at the price of a server about fifty times slower.

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tower_redis_ratelimit::deadpool_redis::redis;
use tower_redis_ratelimit::in_flight::{InFlightConfig, InFlightLimiter};
use tower_redis_ratelimit::{Backend, Limiter, Source};
use tower_redis_ratelimit::{Calendar, PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

const KEYS: usize = 10_000;
/// The slices of the keys in which rows take turns (see `main`).
const SLICES: usize = 10;
const IN_FLIGHT: usize = 64;
const ONE: NonZeroU32 = NonZeroU32::MIN;
const MINUTE: Duration = Duration::from_secs(60);
const HUGE: u64 = 1_000_000_000;

/// GCRA as go-redis/redis_rate runs it: the arrival time in seconds since an epoch, a
/// float; `SET` with `EX` while the bucket is not full. Written for this benchmark.
const GCRA: &str = include_str!("../scripts/peers/gcra.lua");

/// A fixed window as go-zero's `PeriodLimit` runs it: `INCRBY`, `EXPIRE` on the first
/// unit. Written for this benchmark.
const PERIOD: &str = include_str!("../scripts/peers/period.lua");

/// The floor of a token bucket: the commands the crate's engine runs for one (`MGET` of
/// the key and its block, `TIME`, `SET ... PX`) and nothing else, called with the shape
/// of the crate's call (two keys, two texts). Written for this benchmark.
const FLOOR_TOKEN: &str = r"
local v = redis.call('MGET', KEYS[1], KEYS[2])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local tat = tonumber(v[1]) or now
if tat < now then tat = now end
tat = tat + 1
redis.call('SET', KEYS[1], tat, 'PX', 1000)
return -(tat - now) - 1
";

/// The floor of a set of a token bucket and a fixed window: the commands the crate's
/// engine runs for it (the token bucket's, then `INCRBY` and `PTTL` of the window: its
/// count and its end) and a reply of each limit's numbers, called with the shape of the
/// crate's call (three keys, two texts). Written for this benchmark.
const FLOOR_SET: &str = r"
local v = redis.call('MGET', KEYS[1], KEYS[3])
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local count = redis.call('INCRBY', KEYS[2], '1')
local ttl = redis.call('PTTL', KEYS[2])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[2], 60000)
  ttl = 60000
end
local tat = tonumber(v[1]) or now
if tat < now then tat = now end
tat = tat + 1
redis.call('SET', KEYS[1], tat, 'PX', 1000)
return { -(tat - now) - 1, -(count * 65536 + ttl) - 1 }
";

/// The targets' ratios: (what, numerator row, denominator row, target).
const RATIOS: &[(&str, &str, &str, &str)] = &[
    (
        "token bucket / GCRA",
        "token bucket [functions]",
        "peer: GCRA (redis_rate)",
        "<= 1.0",
    ),
    (
        "rolling window / GCRA",
        "rolling window, 10 buckets [functions]",
        "peer: GCRA (redis_rate)",
        "<= 1.0",
    ),
    (
        "fixed window / go-zero",
        "fixed window [functions]",
        "peer: INCRBY + EXPIRE (go-zero)",
        "<= 1.5",
    ),
    (
        "set / token bucket",
        "set: token bucket + fixed window [functions]",
        "token bucket [functions]",
        "<= 1.5",
    ),
    (
        "floor: set / token bucket",
        "floor: set (token bucket + fixed window), its commands only",
        "floor: token bucket, its commands only",
        "",
    ),
    (
        "lockout / token bucket",
        "token bucket, lockout (never blocked) [functions]",
        "token bucket [functions]",
        "<= 1.0",
    ),
];

/// The instructions the `redis-server` runs, counted by valgrind's callgrind (its pid
/// and output directory in `BENCH_CALLGRIND_PID` and `BENCH_CALLGRIND_DIR`, set by
/// `scripts/bench-engine`).
struct Callgrind {
    pid: String,
    dir: std::path::PathBuf,
}

impl Callgrind {
    fn from_env() -> Option<Self> {
        Some(Self {
            pid: std::env::var("BENCH_CALLGRIND_PID").ok()?,
            dir: std::env::var("BENCH_CALLGRIND_DIR").ok()?.into(),
        })
    }

    fn control(&self, option: &str) {
        let status = std::process::Command::new("callgrind_control")
            .args([option, &self.pid])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("callgrind_control");
        assert!(status.success(), "callgrind_control {option}: {status}");
    }

    /// Counts from zero.
    fn zero(&self) {
        self.control("-z");
    }

    /// The instructions run since `zero`, from the dump this writes (then removed).
    fn instructions(&self) -> f64 {
        self.control("-d");
        let dump = std::fs::read_dir(&self.dir)
            .expect("the callgrind directory")
            .map(|entry| entry.unwrap().path())
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| {
                        name.starts_with("callgrind.out.") && name.matches('.').count() == 3
                    })
            })
            .max_by_key(|path| std::fs::metadata(path).unwrap().modified().unwrap())
            .expect("a callgrind dump");
        let text = std::fs::read_to_string(&dump).unwrap();
        std::fs::remove_file(&dump).unwrap();
        text.lines()
            .find_map(|line| {
                line.strip_prefix("summary:")
                    .or_else(|| line.strip_prefix("totals:"))
            })
            .and_then(|n| n.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("a total in the callgrind dump")
    }
}

/// One row's figures in one round, per decision.
#[derive(Clone, Copy)]
struct Sample {
    /// Redis µs (commandstats).
    us: f64,
    /// Script calls.
    calls: f64,
    /// Redis CPU µs, I/O included.
    cpu: f64,
    /// Instructions Redis ran (with callgrind).
    instructions: Option<f64>,
}

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
    class_row(name, limiter, 1.0)
}

/// [`limiter_row`] for requests of a priority class that may use `priority` of the
/// limit (`LayerBuilder::priority`; 1.0: a check).
fn class_row<L: Limiter + 'static>(name: &str, limiter: L, priority: f64) -> Row {
    let limiter = Arc::new(limiter);
    Row {
        name: name.to_owned(),
        run: Arc::new(move |key| {
            let limiter = Arc::clone(&limiter);
            Box::pin(async move {
                let decision = limiter
                    .check_priority(0, key.as_bytes(), ONE, priority)
                    .await;
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
    let config = InFlightConfig::new(HUGE).slot_ttl(lease);
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
    keys: &'static [&'static str],
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
                // Keys as long as the crate's (`ratelimit:{v1:<key>}:token_bucket:tb`).
                let mut invocation = script.prepare_invoke();
                for name in keys {
                    invocation.key(format!("ratelimit:{{v1:{key}}}:{name}"));
                }
                for arg in args.iter() {
                    invocation.arg(arg);
                }
                let _: redis::Value = invocation
                    .invoke_async(&mut conn)
                    .await
                    .expect("a script row's call");
                1
            })
        }),
        background: false,
    }
}

async fn pass(row: &Row, prefix: &str, keys: std::ops::Range<usize>) -> u64 {
    let mut tasks = tokio::task::JoinSet::new();
    let mut sum = 0;
    for i in keys {
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

/// A row's figures summed over its slices in one round.
#[derive(Clone, Default)]
struct Totals {
    decisions: u64,
    usec: u64,
    /// Redis CPU µs, I/O included.
    cpu: f64,
    instructions: Option<f64>,
    /// Script calls per master (one on a single server).
    shares: Vec<u64>,
}

impl Totals {
    fn calls(&self) -> u64 {
        self.shares.iter().sum()
    }
}

/// After a pass of a row whose calls end in the background (an in-flight slot's
/// release, its renewals): waits for the last of them.
async fn background_ends(row: &Row) {
    if row.background {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs the row on `keys` twice, a warm-up pass (which creates the keys) then the
/// measured pass, and adds what Redis spent in the second to `total`: the differences
/// of the servers' script stats and CPU time (and of callgrind's count) around it.
async fn measure(
    row: &Row,
    i: usize,
    keys: std::ops::Range<usize>,
    nodes: &mut [redis::aio::MultiplexedConnection],
    callgrind: Option<&Callgrind>,
    total: &mut Totals,
) {
    let prefix = format!("r{i}:");
    pass(row, &prefix, keys.clone()).await;
    background_ends(row).await;
    let mut before = Vec::new();
    for conn in nodes.iter_mut() {
        before.push((script_stats(conn).await, server_cpu_us(conn).await));
    }
    if let Some(callgrind) = callgrind {
        callgrind.zero();
    }
    total.decisions += pass(row, &prefix, keys).await;
    background_ends(row).await;
    if let Some(callgrind) = callgrind {
        *total.instructions.get_or_insert(0.0) += callgrind.instructions();
    }
    total.shares.resize(nodes.len(), 0);
    for (n, (conn, ((calls, usec), cpu))) in nodes.iter_mut().zip(before).enumerate() {
        let (calls_after, usec_after) = script_stats(conn).await;
        total.cpu += server_cpu_us(conn).await - cpu;
        total.usec += usec_after - usec;
        total.shares[n] += calls_after - calls;
    }
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
        class_row(
            &p("token bucket, a class of 60%"),
            TokenBucketLimiter::new(backend, "tbp", tb).unwrap(),
            0.6,
        ),
        class_row(
            &p("fixed window, a class of 60%"),
            PeriodLimiter::new(backend, "fwp", PeriodConfig::new(HUGE, MINUTE)).unwrap(),
            0.6,
        ),
        class_row(
            &p("set: token bucket + fixed window, a class of 60%"),
            SetLimiter::new(
                backend,
                "setp",
                LimitSet::new()
                    .limit("burst", tb)
                    .limit("daily", PeriodConfig::new(HUGE, MINUTE)),
            )
            .unwrap(),
            0.6,
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
        batch_row(
            &p("fixed window, coalesced (8 at once, per decision)"),
            PeriodLimiter::new(backend, "fwc", PeriodConfig::new(HUGE, MINUTE)).unwrap(),
            8,
        ),
        batch_row(
            &p("rolling window, coalesced (8 at once, per decision)"),
            RollingWindowLimiter::new(backend, "rwc", RollingConfig::new(HUGE, 10, MINUTE / 10))
                .unwrap(),
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
            &p("settled request, fixed window: check 100, settle +20"),
            PeriodLimiter::new(backend, "fwu", PeriodConfig::new(HUGE, MINUTE)).unwrap(),
            100,
            20,
        ),
        settle_row(
            &p("settled request, rolling window, 10 buckets: check 100, settle -20"),
            RollingWindowLimiter::new(backend, "rwd", RollingConfig::new(HUGE, 10, MINUTE / 10))
                .unwrap(),
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
        // The same hold without renewals: the renew row's excess over it is the
        // renewals' alone, on keys as cold as theirs.
        in_flight_row(
            backend,
            &p("inflightheld slot held 20 ms, lease 10 s (no renewal)"),
            Duration::from_millis(20),
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
        .filter(|arg| arg != "--bench")
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
        backend.warm_up().await.expect("redis");
        rows.extend(crate_rows(&backend, path));
        std::mem::forget(backend);
    }
    let huge = HUGE.to_string();
    if cluster.is_empty() {
        rows.push(script_row(
            "peer: GCRA (redis_rate)",
            &conn,
            GCRA,
            &["peer_script:p"],
            vec!["1000000".into(), "1000000".into(), "1".into(), "1".into()],
        ));
        rows.push(script_row(
            "peer: INCRBY + EXPIRE (go-zero)",
            &conn,
            PERIOD,
            &["peer_script:p"],
            vec![huge.clone(), "60".into()],
        ));
        // The crate's texts for these limits (`tb` and `MINUTE` of `crate_rows`).
        let texts = |limits: &str| vec!["c:1:0".to_owned(), limits.to_owned()];
        let token = "t:3:1.0:1000000:1767225600";
        rows.push(script_row(
            "floor: token bucket, its commands only",
            &conn,
            FLOOR_TOKEN,
            &["token:floor", "block:token:floor"],
            texts(token),
        ));
        rows.push(script_row(
            "floor: set (token bucket + fixed window), its commands only",
            &conn,
            FLOOR_SET,
            &["set:floor:token", "set:floor:period", "block:set:floor"],
            texts(&format!("{token}:w:2:{HUGE}:60000")),
        ));
    }

    // BENCH_ROWS: only the rows whose name contains one of its comma-separated texts.
    if let Ok(wanted) = std::env::var("BENCH_ROWS") {
        let wanted: Vec<&str> = wanted.split(',').filter(|w| !w.is_empty()).collect();
        rows.retain(|row| wanted.iter().any(|w| row.name.contains(w)));
        assert!(!rows.is_empty(), "BENCH_ROWS={wanted:?} selects no row");
    }

    let callgrind = Callgrind::from_env();
    let mut results: BTreeMap<usize, Vec<Sample>> = BTreeMap::new();
    for round in 0..rounds {
        for conn in &mut nodes {
            cmd(conn, &["FLUSHALL"]).await;
        }
        // Rows take turns slice by slice, so that the rows a ratio compares share
        // the machine's moments (its noise is most of the spread between rounds); rows
        // whose calls end in the background run their pass whole, after.
        let mut totals = vec![Totals::default(); rows.len()];
        for slice in 0..SLICES {
            for k in 0..rows.len() {
                let i = (k + slice) % rows.len();
                if !rows[i].background {
                    let keys = slice * KEYS / SLICES..(slice + 1) * KEYS / SLICES;
                    measure(
                        &rows[i],
                        i,
                        keys,
                        &mut nodes,
                        callgrind.as_ref(),
                        &mut totals[i],
                    )
                    .await;
                }
            }
        }
        for (i, row) in rows.iter().enumerate() {
            if row.background {
                measure(
                    row,
                    i,
                    0..KEYS,
                    &mut nodes,
                    callgrind.as_ref(),
                    &mut totals[i],
                )
                .await;
            }
        }
        for (i, (row, total)) in rows.iter().zip(&totals).enumerate() {
            let decisions = total.decisions as f64;
            if nodes.len() > 1 {
                eprintln!(
                    "round {round} {}: calls per master {:?}",
                    row.name, total.shares
                );
            }
            let per_decision = total.usec as f64 / decisions;
            let calls = total.calls();
            let per_call = total.usec as f64 / calls.max(1) as f64;
            eprintln!(
                "round {round} {:<58} {per_decision:6.2} µs/decision {per_call:6.2} µs/call {} calls",
                row.name, calls
            );
            results.entry(i).or_default().push(Sample {
                us: per_decision,
                calls: calls as f64 / decisions,
                cpu: total.cpu / decisions,
                instructions: total.instructions.map(|n| n / decisions),
            });
        }
    }
    // With callgrind: the instructions per decision (of the median round), a column more.
    let (head, rule) = if callgrind.is_some() {
        (" instructions per decision (callgrind) |", "---:|")
    } else {
        ("", "")
    };
    println!(
        "| decision | Redis µs per decision (commandstats) | decisions/s per Redis core | \
         script calls per decision | Redis CPU µs per decision, I/O included |{head}"
    );
    println!("|---|---:|---:|---:|---:|{rule}");
    for (i, row) in rows.iter().enumerate() {
        let mut r = results[&i].clone();
        r.sort_by(|a, b| a.us.total_cmp(&b.us));
        let Sample {
            us,
            calls,
            instructions,
            ..
        } = r[r.len() / 2];
        let mut cpu: Vec<f64> = r.iter().map(|x| x.cpu).collect();
        cpu.sort_by(f64::total_cmp);
        let counted = instructions.map_or(String::new(), |n| format!(" {n:.0} |"));
        println!(
            "| {} | {us:.2} | {:.0} | {calls:.2} | {:.1} |{counted}",
            row.name,
            1_000_000.0 / us,
            cpu[cpu.len() / 2]
        );
    }
    println!();
    println!("| ratio (median of the rounds' ratios) | ratio | each round | target |{head}");
    println!("|---|---:|---|---|{rule}");
    let row_of = |name: &str| rows.iter().position(|row| row.name == name);
    for &(what, over, under, target) in RATIOS {
        let (Some(over), Some(under)) = (row_of(over), row_of(under)) else {
            continue;
        };
        let pairs = || results[&over].iter().zip(&results[&under]);
        let mut ratios: Vec<f64> = pairs().map(|(a, b)| a.us / b.us).collect();
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        ratios.sort_by(f64::total_cmp);
        let mut counted: Vec<f64> = pairs()
            .filter_map(|(a, b)| Some(a.instructions? / b.instructions?))
            .collect();
        counted.sort_by(f64::total_cmp);
        let counted = counted
            .get(counted.len() / 2)
            .map_or(String::new(), |r| format!(" {r:.2} |"));
        println!(
            "| {what} | {:.2} | {} | {target} |{counted}",
            ratios[ratios.len() / 2],
            each.join(", ")
        );
    }
}
