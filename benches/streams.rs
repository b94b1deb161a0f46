//! Redis calls per streamed message (issue 54): `connections` connections of one user,
//! each a [`StreamLimit`](tower_redis_ratelimit::limit::StreamLimit) of one layer,
//! send their messages at `rate` messages a second in all for `seconds`, each message one
//! `check` awaited before the connection's next (as a WebSocket handler does); the limit
//! is high enough to admit them all. The engine calls Redis ran are read from `INFO
//! commandstats` before and after (`FCALL`, `FCALL_RO`, `EVALSHA`, `EVALSHA_RO`).
//!
//! ```text
//! redis-server --port 6390 --save '' &
//! REDIS_URL=redis://127.0.0.1:6390 cargo bench --bench streams -- [connections] [rate] [seconds] [limit]
//! ```
//!
//! `limit` is `period` (a fixed window: one engine call per check) or `lease` (a token
//! bucket with leases of 20 tokens: a call per lease, the checks between answered in
//! process). Prints the messages sent, the engine calls, calls per message, and each
//! check's median and 99th-percentile latency (defaults: 5 connections, 1 000
//! messages/s, 5 s, `period`).

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use tower_redis_ratelimit::deadpool_redis::redis;
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::StreamLimit;
use tower_redis_ratelimit::{Backend, LimitLayer, PeriodConfig, TokenBucketConfig};

/// A layer's [`LimitLayer::stream`], its type erased.
type Streams = std::sync::Arc<dyn Fn(&http::request::Parts) -> Option<StreamLimit> + Send + Sync>;

trait StreamHandle {
    fn stream_handle(self) -> Streams;
}

impl<L, K, C, R> StreamHandle for LimitLayer<L, K, C, R>
where
    L: tower_redis_ratelimit::Limiter,
    K: tower_redis_ratelimit::key::KeyExtractor,
    C: Send + Sync + 'static,
    R: Send + Sync + 'static,
{
    fn stream_handle(self) -> Streams {
        std::sync::Arc::new(move |parts| self.stream(parts))
    }
}

/// The engine calls the server has run, from `INFO commandstats`.
async fn engine_calls(url: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    let calls = |command: &str| {
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(["fcall", "fcall_ro", "evalsha", "evalsha_ro"]
        .iter()
        .map(|c| calls(c))
        .sum())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL (see the header)")?;
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    let connections: u32 = args.next().map_or(Ok(5), |a| a.parse())?;
    let rate: u32 = args.next().map_or(Ok(1_000), |a| a.parse())?;
    let seconds: u64 = args.next().map_or(Ok(5), |a| a.parse())?;
    let limit = args.next().unwrap_or_else(|| "period".to_owned());

    let backend = Backend::builder()
        .redis_url(&url)
        .prefix("bench-streams")
        .build()?;
    backend.warm_up().await?;
    let hour = Duration::from_secs(3_600);
    let user = || HeaderKey::from_static("x-user");
    let layer = match limit.as_str() {
        "period" => LimitLayer::builder(&backend, PeriodConfig::new(100_000_000, hour))
            .name("messages")
            .key(user())
            .build()?
            .stream_handle(),
        "lease" => {
            let config = TokenBucketConfig::new(100_000, Duration::from_secs(1), 100_000)
                .lease(20, Duration::from_secs(1));
            LimitLayer::builder(&backend, config)
                .name("messages-leased")
                .key(user())
                .build()?
                .stream_handle()
        }
        other => return Err(format!("no limit {other:?}: `period` or `lease`").into()),
    };
    let (open, ()) = http::Request::get("/ws")
        .header("x-user", "alice")
        .body(())?
        .into_parts();

    let before = engine_calls(&url).await?;
    let started = Instant::now();
    let every = Duration::from_secs_f64(f64::from(connections) / f64::from(rate));
    let tasks: Vec<_> = (0..connections)
        .map(|i| {
            let stream = layer(&open).expect("a key");
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                // Spread the connections' first messages over one interval.
                let offset = every.mul_f64(f64::from(i) / f64::from(connections));
                let mut tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + offset, every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let end = Instant::now() + Duration::from_secs(seconds);
                while Instant::now() < end {
                    tick.tick().await;
                    let asked = Instant::now();
                    let decision = stream.check(NonZeroU32::MIN).await;
                    latencies.push(asked.elapsed());
                    assert!(decision.is_admitted(), "{decision:?}");
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await?);
    }
    let elapsed = started.elapsed();
    let calls = engine_calls(&url).await? - before;
    latencies.sort();
    let at = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    let messages = latencies.len();
    println!(
        "{limit}: {connections} connections, {:.0} messages/s for {:.1} s: {messages} messages, {calls} engine calls, {:.3} calls per message; check p50 {:?}, p99 {:?}",
        messages as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64(),
        calls as f64 / messages as f64,
        at(0.5),
        at(0.99),
    );
    Ok(())
}
