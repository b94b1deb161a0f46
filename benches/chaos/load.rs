//! The app instances (a backend and a limiter each) and the load that drives them: open
//! loops at a fixed rate and closed loops with a fixed number in flight.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// Instances and load
// ---------------------------------------------------------------------------

/// One app instance: its own backend (pool, kept connection, health) and one limiter.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    pub(crate) backend: Backend,
    pub(crate) limiter: PeriodLimiter,
}

/// The limiter's name in every scenario.
pub(crate) const NAME: &str = "chaos";
/// Every scenario, in the order they run (`soak` only when named).
pub(crate) const SCENARIOS: [&str; 7] = [
    "held",
    "wrongtype",
    "writes",
    "rtt",
    "restart",
    "latency",
    "soak",
];

pub(crate) fn instance(backend: Backend, quota: u64, period: Duration) -> Instance {
    let limiter = PeriodLimiter::new(&backend, NAME, PeriodConfig::new(quota, period))
        .expect("a valid period limit");
    Instance { backend, limiter }
}

/// A backend with the crate's defaults, as the README shows: `redis_url` (whose pool
/// gets the recommended timeouts) and nothing else.
pub(crate) fn default_backend(url: &str) -> Backend {
    Backend::builder()
        .redis_url(url)
        .build()
        .expect("a valid Redis URL")
}

pub(crate) fn keys(n: usize) -> Arc<[String]> {
    (0..n).map(|i| format!("key{i}")).collect()
}

pub(crate) async fn check(
    instance: &Instance,
    keys: &[String],
    key: usize,
    clock: Instant,
) -> Sample {
    let at = clock.elapsed();
    let started = Instant::now();
    let decision = instance.limiter.check(keys[key].as_bytes(), ONE).await;
    Sample {
        at,
        key,
        source: decision.source,
        admitted: decision.is_admitted(),
        latency: started.elapsed(),
    }
}

/// Offers `rate` checks per second from every instance for `duration` (open loop: a slow
/// check does not slow the offered load), keys in turn. Runs as its own task so the
/// scenario can inject faults meanwhile; await the handle for the samples.
pub(crate) fn open_loop(
    instances: Vec<Instance>,
    keys: Arc<[String]>,
    rate: f64,
    duration: Duration,
    clock: Instant,
) -> tokio::task::JoinHandle<Samples> {
    tokio::spawn(async move {
        let mut tickers = JoinSet::new();
        for (index, instance) in instances.into_iter().enumerate() {
            let keys = Arc::clone(&keys);
            tickers.spawn(async move {
                let mut samples = Vec::new();
                let mut inflight = JoinSet::new();
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
                tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
                let end = Instant::now() + duration;
                let mut next_key = index; // instances start on different keys
                while Instant::now() < end {
                    tick.tick().await;
                    let (instance, keys) = (instance.clone(), Arc::clone(&keys));
                    let key = next_key % keys.len();
                    next_key += 1;
                    inflight.spawn(async move { check(&instance, &keys, key, clock).await });
                    while let Some(done) = inflight.try_join_next() {
                        samples.push(done.expect("a check task"));
                    }
                }
                while let Some(done) = inflight.join_next().await {
                    samples.push(done.expect("a check task"));
                }
                samples
            });
        }
        let mut all = Vec::new();
        while let Some(samples) = tickers.join_next().await {
            all.extend(samples.expect("a load task"));
        }
        all.sort_by_key(|s| s.at);
        Samples(all)
    })
}

/// The shortest time between two checks of one closed-loop worker.
pub(crate) const CLIENT_TURNAROUND: Duration = Duration::from_millis(1);

/// `concurrency` tasks checking back to back on one instance for `duration` (closed
/// loop; each at most one check per [`CLIENT_TURNAROUND`]), each on its own key.
pub(crate) fn closed_loop(
    instance: Instance,
    keys: Arc<[String]>,
    concurrency: usize,
    duration: Duration,
    clock: Instant,
) -> tokio::task::JoinHandle<Samples> {
    tokio::spawn(async move {
        let end = Instant::now() + duration;
        let mut workers = JoinSet::new();
        for worker in 0..concurrency {
            let (instance, keys) = (instance.clone(), Arc::clone(&keys));
            workers.spawn(async move {
                let mut samples = Vec::new();
                // A client's own round trip: at most one check per millisecond, so a
                // worker answered at once by the fallback neither spins nor starves the
                // runtime (the probe and the switch watch run on it too).
                let mut pace = tokio::time::interval(CLIENT_TURNAROUND);
                pace.set_missed_tick_behavior(MissedTickBehavior::Delay);
                while Instant::now() < end {
                    pace.tick().await;
                    samples.push(check(&instance, &keys, worker % keys.len(), clock).await);
                }
                samples
            });
        }
        let mut all = Vec::new();
        while let Some(samples) = workers.join_next().await {
            all.extend(samples.expect("a load task"));
        }
        all.sort_by_key(|s| s.at);
        Samples(all)
    })
}

/// Checks once on a fresh key and makes sure [`redis_key`] names the key Redis holds.
pub(crate) async fn check_key_layout(redis: &RedisServer, instance: &Instance) {
    let probe = "layout-probe";
    let decision = instance.limiter.check(probe.as_bytes(), ONE).await;
    assert_eq!(
        decision.source,
        Source::Redis,
        "the layout check needs Redis"
    );
    let key = redis_key(PREFIX, KIND, NAME, probe);
    assert_eq!(
        redis.cmd(&["EXISTS", &key]),
        "1",
        "the crate no longer keeps {key:?}: update redis_key() in benches/chaos/main.rs \
         (keys now: {})",
        redis.cmd(&["KEYS", "*"]).replace('\n', ", ")
    );
    redis.cmd(&["DEL", &key]);
}

/// Checks one at a time until Redis answers (at most ~5 s).
pub(crate) async fn settle(instance: &Instance) {
    for _ in 0..50 {
        if instance.limiter.check(b"settle", ONE).await.source == Source::Redis {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("  (never answered from Redis while settling)");
}

/// Runs a blocking harness call (kill, restart, ...) without stalling the runtime.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

pub(crate) fn log_run(what: &str, samples: &Samples, switches: usize) {
    eprintln!(
        "  [{what}] {} decisions ({}); {switches} switches to the fallback",
        samples.0.len(),
        samples.sources(),
    );
}
