//! How long a change made on one instance takes to reach another (issue 35, item 2):
//! from the moment instance B sends a reset of a key that instance A refuses from its
//! deny cache, to A's first admission of that key. Both instances are backends on one
//! Redis, built from its URL, with a deny cache whose max age (30 s) would otherwise
//! hold the refusal; A checks the key in a loop (each check answered in process, from
//! the deny cache, until the change's message arrives). Beside it, B's own reset (one
//! round trip, the engine's call) for scale.
//!
//! ```text
//! redis-server --port 6390 --save '' &
//! REDIS_URL=redis://127.0.0.1:6390 cargo bench --bench propagation -- [trials]
//! ```
//!
//! Prints the median, the 90th and 99th percentiles and the maximum of both, and of
//! how much later than B's reply A admitted (per trial), over the trials (default
//! 2 000), each on a key of its own.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use tower_redis_ratelimit::deadpool_redis::redis;
use tower_redis_ratelimit::{Backend, Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;

fn instance(url: &str, prefix: &str) -> Result<Backend, Box<dyn std::error::Error>> {
    Ok(Backend::builder()
        .redis_url(url)
        .prefix(prefix)
        .deny_cache_max_age(Duration::from_secs(30))
        .build()?)
}

/// The `p`-th percentile of sorted `samples`.
fn percentile(samples: &[Duration], p: f64) -> Duration {
    let at = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[at.min(samples.len() - 1)]
}

fn summary(name: &str, samples: &mut [Duration]) {
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{name:<34} p50 {:>7.1} µs   p90 {:>7.1} µs   p99 {:>7.1} µs   max {:>8.1} µs",
        us(percentile(samples, 0.5)),
        us(percentile(samples, 0.9)),
        us(percentile(samples, 0.99)),
        us(samples[samples.len() - 1]),
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let trials: usize = std::env::args()
        .filter(|arg| arg != "--bench")
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(2_000);
    let prefix = format!("propagation{}", std::process::id());
    let config = PeriodConfig::new(1, Duration::from_secs(3_600));
    let a = PeriodLimiter::new(&instance(&url, &prefix)?, "p", config)?;
    let b = PeriodLimiter::new(&instance(&url, &prefix)?, "p", config)?;
    // Both connected, and both subscribed (in the background, after the first
    // connection).
    a.check(b"warm-up", ONE).await;
    b.check(b"warm-up", ONE).await;
    let mut admin = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let channel = format!("{prefix}:changes");
    let started = Instant::now();
    loop {
        let (_, subscribers): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut admin)
            .await?;
        if subscribers >= 2 {
            break;
        }
        if started.elapsed() > Duration::from_secs(5) {
            return Err("the instances did not subscribe within 5 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut propagation = Vec::with_capacity(trials);
    let mut round_trip = Vec::with_capacity(trials);
    for trial in 0..trials {
        let key = format!("k{trial}");
        let key = key.as_bytes();
        assert!(a.check(key, ONE).await.is_admitted());
        assert!(!a.check(key, ONE).await.is_admitted());
        let cached = a.check(key, ONE).await;
        assert_eq!(cached.source, Source::DenyCache, "{cached:?}");
        let sent = Instant::now();
        // B's reset runs beside A's checks, as on two machines.
        let reset = b.reset(key).expect("a built-in limiter resets");
        let reset = tokio::spawn(async move {
            let decision = reset.await;
            (decision.is_admitted(), sent.elapsed())
        });
        loop {
            let decision = a.check(key, ONE).await;
            if decision.is_admitted() {
                propagation.push(sent.elapsed());
                break;
            }
            if sent.elapsed() > Duration::from_secs(5) {
                return Err(format!("A still refuses 5 s after the reset: {decision:?}").into());
            }
            tokio::task::yield_now().await;
        }
        let (admitted, took) = reset.await?;
        assert!(admitted);
        round_trip.push(took);
    }
    // Per trial: how much later A admitted than B had its reply (0 when A was first).
    let mut after_reply: Vec<Duration> = propagation
        .iter()
        .zip(&round_trip)
        .map(|(admitted, replied)| admitted.saturating_sub(*replied))
        .collect();
    println!("{trials} trials, loopback, {url}");
    summary("B's reset, one round trip", &mut round_trip);
    summary("reset on B -> first admission on A", &mut propagation);
    summary("A's admission after B's reply", &mut after_reply);
    Ok(())
}
