//! `redis/*`: one check on `Backend::redis` against a throw-away `redis-server`, next to
//! a bare `EVALSHA` of the same token-bucket script through the `redis` crate.
//!
//! Contenders are interleaved: every iteration of every bench in a comparison runs one
//! call of each contender, in turn, and times only its own. A Redis round trip on a
//! small shared VM moves between ~20 and ~45 µs from one second to the next with the
//! load of the machine, so criterion's figures, taken one bench after the other, are
//! not comparable to a few microseconds. After each comparison, the mean of *every*
//! call of each contender across all its benches (same number of calls, interleaved,
//! so the same conditions) is printed on stderr, with its ratio to the last contender
//! (the bare `EVALSHA` through the pool): those ratios are the comparison.
//!
//! - `redis/sequential`, one call at a time:
//!   - `hot_key`: `token_bucket`, `period` and `rolling` (`Limiter::check`),
//!     `evalsha_conn` (`EVALSHA` on one connection held throughout: no pool at all) and
//!     `evalsha_pool` (a connection from a pool like the limiter's, then `EVALSHA` with
//!     the arguments the token bucket sends);
//!   - `10k_keys`: `token_bucket` and `evalsha_pool` cycling through 10 000 keys.
//! - `redis/in_flight_32`: 32 calls on one hot key in flight at once (spawned tasks, one
//!   pool of the default size), `token_bucket` and `evalsha_pool`.
//! - `redis/refused`: a hot key over its quota (1 per hour): `token_bucket` answered by
//!   the local deny cache (not interleaved: no round trip at all), and, interleaved,
//!   `token_bucket_no_deny_cache` (a backend built with `deny_cache(0)`) and
//!   `evalsha_pool`.
//!
//! After each limiter bench, the share of checks each store answered (`Redis`,
//! `DenyCache`, `Fallback`, ...) is printed on stderr: a check answered by the
//! in-process fallback (Redis slower than the 100 ms deadline) would make Redis look
//! fast.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;
use tower_redis_ratelimit::deadpool_redis::{self, redis};
use tower_redis_ratelimit::{Backend, Limiter, Source, State};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

use crate::support::RedisServer;

const ONE: NonZeroU32 = NonZeroU32::MIN;
/// Calls in flight in `redis/in_flight_32`.
const IN_FLIGHT: usize = 32;
/// The epoch of the token-bucket script's arrival times (the crate's, 2026-01-01Z).
const TAT_EPOCH_SECS: i64 = 1_767_225_600;

static TOKEN_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&tower_redis_ratelimit::engine_script()));

/// A token bucket of `rate` tokens per `period_secs` and a burst of `rate`: the limiter's
/// configuration, and the script arguments the limiter sends for it.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    rate: u64,
    period_secs: u64,
}

impl Bucket {
    /// A token per microsecond and a burst of a million: never refused by one client.
    ///
    /// Not a token per nanosecond as in `in_process/*`: the script keeps arrival times
    /// as doubles of microseconds since 2026-01-01, whose resolution is 1/256 µs in
    /// 2026, so a token of 0.001 µs rounds to nothing and the script then sets a zero
    /// expiry, which Redis refuses (the check then falls back to in-process state).
    const HUGE: Self = Self {
        rate: 1_000_000,
        period_secs: 1,
    };
    /// One token per hour: refused after the first check.
    const HOURLY: Self = Self {
        rate: 1,
        period_secs: 3_600,
    };

    fn config(self) -> TokenBucketConfig {
        TokenBucketConfig::new(self.rate, Duration::from_secs(self.period_secs), self.rate)
    }

    /// `EVALSHA <sha> 2 <key> <key>:block c:<cost>:0 t:3:<µs per token>:<burst>:<epoch>`:
    /// a check of one token bucket, as the limiter sends it.
    fn evalsha(self, key: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(TOKEN_SCRIPT.get_hash())
            .arg(2)
            .arg(key)
            .arg(format!("{key}:block"))
            .arg("c:1:0")
            .arg(format!(
                "t:3:{}:{}:{TAT_EPOCH_SECS}",
                self.period_secs as f64 * 1e6 / self.rate as f64,
                self.rate
            ));
        cmd
    }
}

/// Whether `redis-server` can be started (the harness panics when it cannot).
fn redis_available() -> bool {
    let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
    std::process::Command::new(bin)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Which store answered the checks of the current bench; printed and reset by `report`.
#[derive(Default)]
struct Sources {
    counts: RefCell<BTreeMap<String, u64>>,
}

impl Sources {
    fn count(&self, source: Source) {
        *self
            .counts
            .borrow_mut()
            .entry(format!("{source:?}"))
            .or_default() += 1;
    }

    fn report(&self, what: &str) {
        let counts = std::mem::take(&mut *self.counts.borrow_mut());
        let total: u64 = counts.values().sum();
        if total == 0 {
            return;
        }
        let shares: Vec<String> = counts
            .iter()
            .map(|(source, n)| format!("{source} {:.1}%", *n as f64 * 100.0 / total as f64))
            .collect();
        eprintln!("{what}: answered by {}", shares.join(", "));
        if counts.keys().any(|s| s != "Redis" && s != "DenyCache") {
            eprintln!("warning: {what}: some checks did not reach Redis");
        }
    }
}

/// One contender: what one call does.
#[derive(Clone, Copy)]
enum Call<'a> {
    /// `limiter.check(key)`, keys in turn.
    Check(&'a dyn Limiter, &'a [String]),
    /// `pool.get()` then `EVALSHA`, keys in turn.
    EvalshaPool(Bucket, &'a [String]),
    /// `EVALSHA` on the connection held for the whole sample.
    EvalshaHeld(Bucket, &'a [String]),
}

/// Everything a call needs.
struct Env<'a> {
    rt: &'a Runtime,
    pool: &'a deadpool_redis::Pool,
    sources: &'a Sources,
    /// Every call of every contender of the current comparison, timed or not by
    /// criterion: (total time, calls) per contender.
    paired: RefCell<Vec<(Duration, u64)>>,
}

impl Env<'_> {
    async fn call(
        &self,
        call: Call<'_>,
        i: usize,
        held: &mut Option<deadpool_redis::Connection>,
        counted: bool,
    ) {
        let query = |bucket: Bucket, keys: &[String]| bucket.evalsha(&keys[i % keys.len()]);
        match call {
            Call::Check(limiter, keys) => {
                let decision = limiter.check(keys[i % keys.len()].as_bytes(), ONE).await;
                if counted {
                    self.sources.count(decision.source);
                }
            }
            Call::EvalshaPool(bucket, keys) => {
                let mut conn = self.pool.get().await.expect("redis connection");
                let reply = numbers(
                    query(bucket, keys)
                        .query_async(&mut conn)
                        .await
                        .expect("EVALSHA"),
                );
                std::hint::black_box(reply);
            }
            Call::EvalshaHeld(bucket, keys) => {
                let conn = held.as_mut().expect("a held connection");
                let reply = numbers(
                    query(bucket, keys)
                        .query_async(conn)
                        .await
                        .expect("EVALSHA"),
                );
                std::hint::black_box(reply);
            }
        }
    }

    /// One bench per contender; each iteration of each bench runs every contender once,
    /// in turn, and times only its own.
    fn interleaved(
        &self,
        group: &mut BenchmarkGroup<'_, WallTime>,
        name: &str,
        label: &str,
        contenders: &[(&str, Call<'_>)],
    ) {
        let next = Cell::new(0usize);
        self.paired.borrow_mut().clear();
        for (me, (id, _)) in contenders.iter().enumerate() {
            group.bench_function(BenchmarkId::new(*id, label), |b| {
                b.to_async(self.rt).iter_custom(|iters| {
                    let next = &next;
                    async move {
                        let mut held = Some(self.pool.get().await.expect("redis connection"));
                        let mut timed = Duration::ZERO;
                        for _ in 0..iters {
                            let i = next.get().wrapping_add(1);
                            next.set(i);
                            for (k, (_, call)) in contenders.iter().enumerate() {
                                let start = Instant::now();
                                self.call(*call, i, &mut held, k == me).await;
                                let took = start.elapsed();
                                self.record(k, took, 1);
                                if k == me {
                                    timed += took;
                                }
                            }
                        }
                        timed
                    }
                });
            });
            self.sources.report(&format!("{name}/{id}/{label}"));
        }
        let ids: Vec<&str> = contenders.iter().map(|(id, _)| *id).collect();
        self.report_paired(&format!("{name}/*/{label}"), &ids);
    }

    fn record(&self, contender: usize, took: Duration, calls: u64) {
        let mut paired = self.paired.borrow_mut();
        if paired.len() <= contender {
            paired.resize(contender + 1, (Duration::ZERO, 0));
        }
        paired[contender].0 += took;
        paired[contender].1 += calls;
    }

    /// Prints the mean of every call of each contender across all the benches of one
    /// comparison: every contender ran the same number of times, interleaved, so these
    /// means compare them under the same conditions (criterion's figures are taken one
    /// bench after the other, while the machine's load changes).
    fn report_paired(&self, what: &str, ids: &[&str]) {
        let paired = std::mem::take(&mut *self.paired.borrow_mut());
        if ids.len() < 2 || paired.len() < ids.len() {
            return;
        }
        let mean =
            |(total, calls): (Duration, u64)| total.as_secs_f64() * 1e6 / calls.max(1) as f64;
        let base = mean(paired[ids.len() - 1]);
        let means: Vec<String> = ids
            .iter()
            .zip(&paired)
            .map(|(id, &p)| format!("{id} {:.2} µs ({:.2}x)", mean(p), mean(p) / base))
            .collect();
        eprintln!(
            "{what}: interleaved means over {} calls each: {}",
            paired[0].1,
            means.join(", ")
        );
    }

    /// `IN_FLIGHT` calls of one contender at once, per iteration; the contenders' batches
    /// are interleaved like single calls in [`interleaved`](Self::interleaved).
    fn in_flight(
        &self,
        group: &mut BenchmarkGroup<'_, WallTime>,
        name: &str,
        limiter: &TokenBucketLimiter,
    ) {
        let ids = ["token_bucket", "evalsha_pool"];
        self.paired.borrow_mut().clear();
        for (me, id) in ids.iter().enumerate() {
            group.bench_function(BenchmarkId::new(*id, "hot_key"), |b| {
                b.to_async(self.rt).iter_custom(|iters| async move {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        for k in 0..ids.len() {
                            let start = Instant::now();
                            if k == 0 {
                                self.checks_in_flight(limiter, k == me).await;
                            } else {
                                self.evalsha_in_flight().await;
                            }
                            let took = start.elapsed();
                            self.record(k, took, IN_FLIGHT as u64);
                            if k == me {
                                timed += took;
                            }
                        }
                    }
                    timed
                });
            });
            self.sources.report(&format!("{name}/{id}/hot_key"));
        }
        self.report_paired(&format!("{name}/*/hot_key (time per call)"), &ids);
    }

    async fn checks_in_flight(&self, limiter: &TokenBucketLimiter, counted: bool) {
        let mut set = JoinSet::new();
        for _ in 0..IN_FLIGHT {
            set.spawn(limiter.check(b"hot", ONE));
        }
        while let Some(decision) = set.join_next().await {
            let decision = decision.expect("check task");
            if counted {
                self.sources.count(decision.source);
            }
        }
    }

    async fn evalsha_in_flight(&self) {
        let mut set = JoinSet::new();
        for _ in 0..IN_FLIGHT {
            let pool = self.pool.clone();
            set.spawn(async move {
                let mut conn = pool.get().await.expect("redis connection");
                numbers(
                    Bucket::HUGE
                        .evalsha("bare:hot")
                        .query_async(&mut conn)
                        .await
                        .expect("EVALSHA"),
                )
            });
        }
        while let Some(reply) = set.join_next().await {
            std::hint::black_box(reply.expect("EVALSHA task"));
        }
    }
}

/// Starts a benchmark group of `elements` calls per iteration.
fn start_group<'c>(
    c: &'c mut Criterion,
    name: &str,
    elements: u64,
) -> BenchmarkGroup<'c, WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(elements));
    group
}

pub(crate) fn benches(c: &mut Criterion) {
    if !redis_available() {
        eprintln!(
            "redis-server not found: skipping the redis/* benches (scripts/bench installs it)"
        );
        return;
    }
    // Shows why a check fell back, if one does.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .try_init();
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // The crate's recommended pool configuration, for the limiters and the bare EVALSHA.
    let new_pool = || {
        pool_config(server.url(), DEFAULT_CALL_TIMEOUT)
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("deadpool-redis pool")
    };
    let pool = new_pool();
    let (backend, no_deny_cache) = rt.block_on(async {
        let no_deny_cache = Backend::builder()
            .redis(new_pool())
            .deny_cache(0)
            .build()
            .expect("valid backend");
        (Backend::redis(new_pool()), no_deny_cache)
    });
    let sources = Sources::default();
    let env = Env {
        rt: &rt,
        pool: &pool,
        sources: &sources,
        paired: RefCell::new(Vec::new()),
    };

    let token = TokenBucketLimiter::new(&backend, "bench", Bucket::HUGE.config())
        .expect("valid token bucket");
    let period = PeriodLimiter::new(
        &backend,
        "bench",
        PeriodConfig::new(1 << 60, Duration::from_secs(60)),
    )
    .expect("valid period");
    let rolling = RollingWindowLimiter::new(
        &backend,
        "bench",
        RollingConfig::new(1 << 60, 10, Duration::from_millis(100)),
    )
    .expect("valid rolling window");
    // The token bucket and the fixed window above as one atomic pair (one script call).
    let pair = SetLimiter::new(
        &backend,
        "bench-pair",
        LimitSet::new().limit("burst", Bucket::HUGE.config()).limit(
            "window",
            PeriodConfig::new(1 << 60, Duration::from_secs(60)),
        ),
    )
    .expect("valid set");
    // One token per hour: the first check takes it, every later one is refused.
    let refusing = TokenBucketLimiter::new(&backend, "refused", Bucket::HOURLY.config())
        .expect("valid token bucket");
    let refusing_uncached =
        TokenBucketLimiter::new(&no_deny_cache, "refused-uncached", Bucket::HOURLY.config())
            .expect("valid token bucket");

    let hot = crate::keys(1);
    let many = crate::keys(crate::key_count(10_000));
    let many_label = format!("{}k_keys", many.len() / 1_000);
    let bare =
        |keys: &[String]| -> Vec<String> { keys.iter().map(|k| format!("bare:{k}")).collect() };
    let (bare_hot, bare_many) = (bare(&hot), bare(&many));
    let refused_hot = vec!["refused".to_owned()];
    let bare_refused_hot = bare(&refused_hot);

    // Load the bare script, and make sure every limiter answers from Redis as expected.
    rt.block_on(async {
        let mut conn = pool.get().await.expect("redis connection");
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(tower_redis_ratelimit::engine_script())
            .query_async(&mut conn)
            .await
            .expect("SCRIPT LOAD");
        assert_eq!(sha, TOKEN_SCRIPT.get_hash());
        for limiter in [&token as &dyn Limiter, &period, &rolling, &pair] {
            let decision = limiter.check(b"warm-up", ONE).await;
            assert_eq!(decision.source, Source::Redis, "{decision:?}");
            assert_eq!(decision.state, State::Allowed, "{decision:?}");
        }
        for limiter in [&refusing, &refusing_uncached] {
            let _ = limiter.check(refused_hot[0].as_bytes(), ONE).await;
            let decision = limiter.check(refused_hot[0].as_bytes(), ONE).await;
            assert_eq!(decision.state, State::OverQuota, "{decision:?}");
        }
        for admitted in [1, 0] {
            let reply = numbers(
                Bucket::HOURLY
                    .evalsha(&bare_refused_hot[0])
                    .query_async(&mut conn)
                    .await
                    .expect("EVALSHA"),
            );
            assert_eq!(
                tower_redis_ratelimit::engine_admits(&reply),
                admitted == 1,
                "{reply:?}"
            );
        }
    });

    let name = "redis/sequential";
    let mut group = start_group(c, name, 1);
    env.interleaved(
        &mut group,
        name,
        "hot_key",
        &[
            ("token_bucket", Call::Check(&token, &hot)),
            ("period", Call::Check(&period, &hot)),
            ("rolling", Call::Check(&rolling, &hot)),
            ("set_pair", Call::Check(&pair, &hot)),
            ("evalsha_conn", Call::EvalshaHeld(Bucket::HUGE, &bare_hot)),
            ("evalsha_pool", Call::EvalshaPool(Bucket::HUGE, &bare_hot)),
        ],
    );
    env.interleaved(
        &mut group,
        name,
        &many_label,
        &[
            ("token_bucket", Call::Check(&token, &many)),
            ("set_pair", Call::Check(&pair, &many)),
            ("evalsha_pool", Call::EvalshaPool(Bucket::HUGE, &bare_many)),
        ],
    );
    group.finish();

    let name = "redis/in_flight_32";
    let mut group = start_group(c, name, IN_FLIGHT as u64);
    env.in_flight(&mut group, name, &token);
    group.finish();

    let name = "redis/refused";
    let mut group = start_group(c, name, 1);
    env.interleaved(
        &mut group,
        name,
        "hot_key",
        &[("token_bucket", Call::Check(&refusing, &refused_hot))],
    );
    env.interleaved(
        &mut group,
        name,
        "hot_key",
        &[
            (
                "token_bucket_no_deny_cache",
                Call::Check(&refusing_uncached, &refused_hot),
            ),
            (
                "evalsha_pool",
                Call::EvalshaPool(Bucket::HOURLY, &bare_refused_hot),
            ),
        ],
    );
    group.finish();

    drop(rt);
    drop(server);
}

/// The backend's default call timeout.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(100);

/// A `deadpool-redis` configuration whose wait, create and recycle timeouts are
/// `timeout` (the backend's call timeout), so a hung Redis or a full pool fails fast.
fn pool_config(url: impl Into<String>, timeout: Duration) -> deadpool_redis::Config {
    let mut config = deadpool_redis::Config::from_url(url);
    let mut pool = deadpool_redis::PoolConfig::default();
    pool.timeouts.wait = Some(timeout);
    pool.timeouts.create = Some(timeout);
    pool.timeouts.recycle = Some(timeout);
    config.pool = Some(pool);
    config
}

/// An engine reply as numbers: a table's, or the one number of a fast path's packed
/// admit (negative; see `engine_admits`).
fn numbers(reply: redis::Value) -> Vec<i64> {
    match reply {
        redis::Value::Int(packed) => vec![packed],
        reply => redis::FromRedisValue::from_redis_value(reply).expect("an engine reply"),
    }
}
