//! The HTTP load-test target of `scripts/bench` and `scripts/bench-http`: one axum server whose routes differ only
//! in their rate limiter, so `wrk` can measure what each limiter costs per request.
//!
//! ```text
//! cargo bench --bench loadtest                                   # in-process only
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench --bench loadtest  # with /token/redis
//! wrk -t1 -c32 -d10s --latency -H 'x-api-key: k1' http://127.0.0.1:3000/token/in-process
//! ```
//!
//! Routes (each answers `ok`; the limited ones are keyed per `x-api-key` header):
//!
//! | route | limiter |
//! |---|---|
//! | `/unlimited` | none: the baseline |
//! | `/token/in-process` | `TokenBucketLayer` on `Backend::in_process()` |
//! | `/token/in-process/no-headers` | the same with `admitted_headers(false)` and `decision_extension(false)`: no `RateLimit` / `RateLimit-Policy` headers on admitted responses and no `Decision` in the request extensions (like `/governor`) |
//! | `/token/redis` | `TokenBucketLayer` on `Backend::redis` at `REDIS_URL` (503 without it); concurrent checks of one key coalesce (the default) |
//! | `/set/redis` | an atomic pair on Redis: the same token bucket and a daily window, one script call |
//! | `/period/redis` | `PeriodLimitLayer` on Redis: `BENCH_RATE` per 1 s window |
//! | `/rolling/redis` | `RollingWindowLayer` on Redis: `BENCH_RATE` per 10 buckets of 100 ms |
//! | `/token/redis-lease` | the same limit in lease mode (`TokenBucketConfig::lease`, `LEASE_SIZE` tokens, default 50, for `LEASE_MS`, default 100) |
//! | `/governor` | `tower_governor` 0.8 with the same quota and key |
//! | `/governor/headers` | the same with tower_governor's `use_headers()`: `x-ratelimit-limit` and `x-ratelimit-remaining` on admitted responses |
//! | `/bare/evalsha` | no limiter crate: `EVALSHA` of the token-bucket script, same arguments, on one shared multiplexed connection (503 without `REDIS_URL`) |
//!
//! `/bare/evalsha` is a reference for `/token/redis`: the same script and arguments on
//! one multiplexed connection, as the crate's backend does, but without the crate (no
//! key extraction, decision, fallback, deny cache or headers). It answers 429 when
//! refused.
//!
//! Environment:
//!
//! - `PORT`: the port on 127.0.0.1 (default 3000; `0` picks a free one). The server
//!   prints `listening on http://127.0.0.1:<port>` once it accepts connections.
//! - `BENCH_RATE`: tokens per second, and the burst (default 1 000 000, far above what
//!   one machine can send, so nothing is refused; 1 to 1 000 000, the most the token
//!   bucket accepts).
//! - `REDIS_URL`: enables `/token/redis`.
//! - `REDIS_POOL_SIZE`: the deadpool-redis pool size (default: deadpool's, twice the
//!   number of CPUs). The pool has wait, create and recycle timeouts of the call timeout.
//! - `WORKER_THREADS`: tokio's worker threads (default: one per CPU).
//! - `CALL_TIMEOUT_MS`: the Redis backend's call timeout (default 100; longer under
//!   callgrind, which slows Redis down fifty times).
//! - `BATCH_AFTER`: the Redis backend's
//!   [`batch_after`](tower_redis_ratelimit::BackendBuilder::batch_after) (default 2;
//!   0 turns batching off).
//!
//! Nothing is logged per request.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::PeriodConfig;
use tower_redis_ratelimit::TokenBucketConfig;
use tower_redis_ratelimit::{deadpool_redis, Backend};

#[path = "support/routes.rs"]
mod routes;

use routes::{ok, API_KEY};
use tower_redis_ratelimit::{LimitLayer, LimitSet, RollingConfig};

/// The default of `BENCH_RATE`: a token per microsecond and a burst of a million.
const DEFAULT_RATE: u64 = 1_000_000;
/// The backend's default call timeout and batching threshold.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(100);
const DEFAULT_BATCH_AFTER: usize = 2;
/// The highest `BENCH_RATE`: a token per microsecond (the most the limiters accept).
const MAX_RATE: u64 = 1_000_000;
/// The script every check runs (the engine), for the bare `EVALSHA` route.
fn token_script() -> String {
    tower_redis_ratelimit::engine_script()
}

/// The epoch of the token bucket's arrival times (the crate's, 2026-01-01Z).
const TAT_EPOCH_SECS: i64 = 1_767_225_600;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map_err(|_| format!("{name}={value:?} is not a valid number")),
        Err(_) => Ok(default),
    }
}

async fn no_redis() -> (StatusCode, &'static str) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "REDIS_URL is not set: restart the loadtest harness with \
         REDIS_URL=redis://127.0.0.1:<port> to enable /token/redis and /bare/evalsha\n",
    )
}

/// `/bare/evalsha`: the token-bucket script by SHA on a shared multiplexed connection.
#[derive(Clone)]
struct Bare {
    conn: MultiplexedConnection,
    sha: String,
    interval_us: f64,
    rate: u64,
}

impl Bare {
    async fn check(self, headers: HeaderMap) -> (StatusCode, &'static str) {
        let Some(key) = headers.get(API_KEY).and_then(|v| v.to_str().ok()) else {
            return (StatusCode::BAD_REQUEST, "no x-api-key\n");
        };
        let mut conn = self.conn;
        let redis_key = format!("loadtest:bare:{key}");
        // As the limiter sends it: the key and its block; a check of cost 1 against one
        // token bucket (`t`, 3 arguments) with no lockout.
        let reply: Result<Vec<i64>, _> = redis::cmd("EVALSHA")
            .arg(&self.sha)
            .arg(2)
            .arg(&redis_key)
            .arg(format!("{redis_key}:block"))
            .arg("c:1:0")
            .arg(format!(
                "t:3:{}:{}:{TAT_EPOCH_SECS}",
                self.interval_us, self.rate
            ))
            .query_async(&mut conn)
            .await;
        match reply.as_deref() {
            Ok(reply) if tower_redis_ratelimit::engine_admits(reply) => (StatusCode::OK, "ok"),
            Ok(_) => (StatusCode::TOO_MANY_REQUESTS, "refused\n"),
            Err(_) => (StatusCode::BAD_GATEWAY, "redis error\n"),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Tokio's multi-threaded runtime, one worker per CPU unless WORKER_THREADS says.
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Ok(workers) = std::env::var("WORKER_THREADS") {
        let workers: usize = workers
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("WORKER_THREADS={workers:?} is not a positive number"))?;
        runtime.worker_threads(workers);
    }
    runtime.enable_all().build()?.block_on(serve())
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let rate: u64 = env_or("BENCH_RATE", DEFAULT_RATE)?;
    if !(1..=MAX_RATE).contains(&rate) {
        return Err(format!("BENCH_RATE must be within 1..={MAX_RATE}, not {rate}").into());
    }
    let port: u16 = env_or("PORT", 3000)?;

    // The in-process rows (shared with the `costs` harness and the `service/*` benches).
    let mut app = routes::router(&Backend::in_process(), rate)?;

    let redis = match std::env::var("REDIS_URL") {
        Ok(url) => {
            // The crate's recommended pool: wait, create and recycle timeouts equal to the
            // backend's call timeout.
            let call_timeout = Duration::from_millis(
                env_or("CALL_TIMEOUT_MS", DEFAULT_CALL_TIMEOUT.as_millis())?
                    .try_into()
                    .map_err(|_| "CALL_TIMEOUT_MS is too large")?,
            );
            let mut config = pool_config(url.clone(), call_timeout);
            if let Ok(size) = std::env::var("REDIS_POOL_SIZE") {
                let size = size
                    .parse()
                    .map_err(|_| format!("REDIS_POOL_SIZE={size:?} is not a number"))?;
                if let Some(pool) = config.pool.as_mut() {
                    pool.max_size = size;
                }
            }
            let pool = config.create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
            let pool_size = pool.status().max_size;
            let batch_after: usize = env_or("BATCH_AFTER", DEFAULT_BATCH_AFTER)?;
            let backend = Backend::builder()
                .redis(pool)
                .prefix("loadtest")
                .call_timeout(call_timeout)
                .batch_after(batch_after)
                .build()?;
            let layer = LimitLayer::builder(
                &backend,
                TokenBucketConfig::new(rate, Duration::from_secs(1), rate),
            )
            .name("loadtest")
            .key(HeaderKey::from_static(API_KEY))
            .build()?;
            app = app.route("/token/redis", get(ok).layer(layer));
            // The same limit in lease mode: each key's tokens taken from Redis up to
            // LEASE_SIZE (default 50) at a time, answered in process for LEASE_MS (100).
            let lease_size: u64 = env_or("LEASE_SIZE", 50)?;
            let lease_ms: u64 = env_or("LEASE_MS", 100)?;
            let leased = TokenBucketConfig::new(rate, Duration::from_secs(1), rate)
                .lease(lease_size.min(rate), Duration::from_millis(lease_ms));
            let layer = LimitLayer::builder(&backend, leased)
                .name("loadtest-lease")
                .key(HeaderKey::from_static(API_KEY))
                .build()?;
            app = app.route("/token/redis-lease", get(ok).layer(layer));
            // An atomic pair: the same token bucket and a daily window, one script call.
            let pair = LimitLayer::builder(
                &backend,
                LimitSet::new()
                    .limit(
                        "burst",
                        TokenBucketConfig::new(rate, Duration::from_secs(1), rate),
                    )
                    .limit(
                        "daily",
                        PeriodConfig::new(1 << 40, Duration::from_secs(86_400)),
                    ),
            )
            .name("loadtest-pair")
            .key(HeaderKey::from_static(API_KEY))
            .build()?;
            app = app.route("/set/redis", get(ok).layer(pair));
            // A fixed window and a rolling window (10 buckets) of the same rate.
            let window =
                LimitLayer::builder(&backend, PeriodConfig::new(rate, Duration::from_secs(1)))
                    .name("loadtest-window")
                    .key(HeaderKey::from_static(API_KEY))
                    .build()?;
            app = app.route("/period/redis", get(ok).layer(window));
            let rolling = LimitLayer::builder(
                &backend,
                RollingConfig::new(rate, 10, Duration::from_millis(100)),
            )
            .name("loadtest-rolling")
            .key(HeaderKey::from_static(API_KEY))
            .build()?;
            app = app.route("/rolling/redis", get(ok).layer(rolling));

            let mut conn = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(token_script())
                .query_async(&mut conn)
                .await?;
            let bare = Bare {
                conn,
                sha,
                interval_us: 1e6 / rate as f64,
                rate,
            };
            app = app.route(
                "/bare/evalsha",
                get(move |headers: HeaderMap| bare.clone().check(headers)),
            );
            format!("{url} (pool of {pool_size})")
        }
        Err(_) => {
            app = app
                .route("/token/redis", get(no_redis))
                .route("/token/redis-lease", get(no_redis))
                .route("/set/redis", get(no_redis))
                .route("/period/redis", get(no_redis))
                .route("/rolling/redis", get(no_redis))
                .route("/bare/evalsha", get(no_redis));
            "none (REDIS_URL is not set: /token/redis answers 503)".to_owned()
        }
    };

    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    println!("rate {rate}/s, burst {rate}; redis: {redis}");
    println!("listening on http://{addr}");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

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
