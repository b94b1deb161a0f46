//! The breaker judges Redis by time as well as by traffic (issue 27): a quiet service and
//! a Redis that accepts connections but never answers move to the failure policies
//! within a bounded number of failures or a bounded time, after which no check waits
//! for Redis; and the breaker cannot stick open on its own answers (issue 22).
//!
//! Every test runs a real `redis-server` behind the fault proxy of the test support.
//! Bounds are generous (a loaded 2-core machine must not make them flake): "answered at
//! once" is under half the call timeout, and switch times are the documented bound plus
//! half a second.

mod support;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::proxy::FaultProxy;
use support::RedisServer;
use tokio::time::Instant;
use tower_redis_ratelimit::RedisState;
use tower_redis_ratelimit::{Backend, FailurePolicy, Limiter, Source, State};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
/// The defaults: the issue was measured with them.
/// The default call timeout (documented on `BackendBuilder::call_timeout`).
const CALL: Duration = Duration::from_millis(100);
/// How long a connection attempt may take with that call timeout (four of them, at least
/// 1 s; documented on `BackendBuilder::call_timeout`): the checks waiting for a backend's
/// first connection wait that long.
const CONNECT: Duration = Duration::from_secs(1);
/// The default probe interval (documented on `BackendBuilder::probe_interval`).
const PROBE: Duration = Duration::from_millis(500);
/// A check answered without waiting for Redis takes well under this.
const AT_ONCE: Duration = Duration::from_millis(50);
/// The documented bound for a quiet service: the breaker opens within two probe rounds
/// (a probe interval and at most a call timeout each) of the first failure, whatever
/// the traffic.
fn quiet_bound() -> Duration {
    (PROBE + CALL) * 2
}
/// Slack for a loaded machine.
const SLACK: Duration = Duration::from_millis(500);

fn limiter(backend: &Backend) -> Arc<PeriodLimiter> {
    Arc::new(
        PeriodLimiter::new(
            backend,
            "quiet",
            PeriodConfig::new(1_000_000, Duration::from_secs(60)),
        )
        .unwrap(),
    )
}

/// Checks until Redis answers.
async fn warm(limiter: &PeriodLimiter) {
    let start = Instant::now();
    while limiter.check(b"warm", ONE).await.source != Source::Redis {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "redis never answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One check as a client saw it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// When it started, from the start of the outage.
    at: Duration,
    took: Duration,
    source: Source,
}

/// When the backend first reported `Fallback`, from `start` (polled every 5 ms by a
/// task of its own, so it is seen also between checks).
struct Watch {
    switched: Arc<std::sync::Mutex<Option<Duration>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn start(backend: &Backend, start: Instant) -> Self {
        let switched = Arc::new(std::sync::Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (backend, switched, stop) = (backend.clone(), switched.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    if backend.redis_state() == Some(RedisState::Fallback) {
                        switched.lock().unwrap().get_or_insert(start.elapsed());
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        Self {
            switched,
            stop,
            task,
        }
    }

    async fn switched(self) -> Option<Duration> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        *self.switched.lock().unwrap()
    }
}

/// One check every `every` for `span`, from `start`.
async fn paced(
    limiter: &PeriodLimiter,
    start: Instant,
    every: Duration,
    span: Duration,
) -> Vec<Seen> {
    let mut seen = Vec::new();
    let mut tick = tokio::time::interval_at(start, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if start.elapsed() >= span {
            return seen;
        }
        let began = Instant::now();
        let source = limiter.check(b"k", ONE).await.source;
        seen.push(Seen {
            at: began - start,
            took: began.elapsed(),
            source,
        });
    }
}

/// `tasks` tasks checking back to back (1 ms apart) for `span`, from `start`.
async fn busy(
    limiter: &Arc<PeriodLimiter>,
    start: Instant,
    tasks: usize,
    span: Duration,
) -> Vec<Seen> {
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let limiter = Arc::clone(limiter);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut i = 0u64;
                while start.elapsed() < span {
                    let began = Instant::now();
                    let key = format!("k{}", (t as u64 * 7 + i) % 16);
                    let source = limiter.check(key.as_bytes(), ONE).await.source;
                    seen.push(Seen {
                        at: began - start,
                        took: began.elapsed(),
                        source,
                    });
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                seen
            })
        })
        .collect();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    all.sort_by_key(|s| s.at);
    all
}

/// What the checks of an outage showed: when the backend switched, and the checks that
/// waited for Redis or were not answered by the fallback after it.
fn judge(seen: &[Seen], switched: Option<Duration>, bound: Duration) -> Duration {
    let slow = seen.iter().filter(|s| s.took >= AT_ONCE).count();
    let summary = format!(
        "switched at {switched:?}; {} checks, {slow} of them took {AT_ONCE:?} or more; \
         slowest {:?}; first checks {:?}",
        seen.len(),
        seen.iter().map(|s| s.took).max(),
        &seen[..seen.len().min(6)],
    );
    let switched = switched.unwrap_or_else(|| panic!("never switched to the fallback: {summary}"));
    assert!(switched <= bound, "switched too late: {summary}");
    // Every check that started after the switch was answered by the fallback, at once.
    let after: Vec<&Seen> = seen.iter().filter(|s| s.at > switched).collect();
    assert!(!after.is_empty(), "{summary}");
    for s in &after {
        assert_eq!(s.source, Source::Fallback, "{s:?}: {summary}");
        assert!(s.took < AT_ONCE, "{s:?} waited: {summary}");
    }
    eprintln!("{summary}");
    switched
}

/// A Redis stopped under a quiet service (a check every `every`): the backend reports
/// the fallback within the documented bound, and later checks wait for nothing.
async fn stopped_at(every: Duration) {
    let mut redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let backend = support::backend_builder()
        .redis_url(proxy.url())
        .build()
        .unwrap();
    let limiter = limiter(&backend);
    warm(&limiter).await;
    redis.kill();
    let start = Instant::now();
    let watch = Watch::start(&backend, start);
    let seen = paced(&limiter, start, every, Duration::from_secs(4)).await;
    let switched = watch.switched().await;
    judge(&seen, switched, quiet_bound() + SLACK);
    // At most three checks failed before the switch.
    let failed = seen.iter().filter(|s| Some(s.at) <= switched).count();
    assert!(failed <= 3, "{failed} checks before the switch: {seen:?}");
    assert_eq!(backend.redis_state(), Some(RedisState::Fallback));
    assert!(matches!(
        backend.redis_state(),
        Some(RedisState::Fallback | RedisState::Recovering)
    ));
    assert_eq!(backend.redis_switches(), Some(1));
    // And it comes back.
    redis.restart();
    let start = Instant::now();
    while backend.redis_state() != Some(RedisState::Healthy) {
        assert!(start.elapsed() < Duration::from_secs(4), "not back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    assert_eq!(backend.redis_switches(), Some(1));
}

#[tokio::test]
async fn a_stopped_redis_at_one_check_a_second_switches_within_the_bound() {
    stopped_at(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_stopped_redis_at_two_checks_a_second_switches_within_the_bound() {
    stopped_at(Duration::from_millis(500)).await;
}

/// A Redis that accepts connections and never answers, from start-up.
fn hung() -> (RedisServer, FaultProxy, Backend) {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    proxy.blackhole(true);
    let backend = support::backend_builder()
        .redis_url(proxy.url())
        .build()
        .unwrap();
    (redis, proxy, backend)
}

#[tokio::test]
async fn a_redis_that_never_answers_from_start_up_switches_at_two_checks_a_second() {
    let (_redis, proxy, backend) = hung();
    let limiter = limiter(&backend);
    let start = Instant::now();
    let watch = Watch::start(&backend, start);
    let seen = paced(
        &limiter,
        start,
        Duration::from_millis(500),
        Duration::from_secs(4),
    )
    .await;
    let switched = watch.switched().await;
    // The first checks wait for the first connection attempt, which gives up at the
    // connect timeout: the bound runs from there.
    judge(&seen, switched, CONNECT + quiet_bound() + SLACK);
    let waited = seen.iter().filter(|s| s.took >= AT_ONCE).count();
    assert!(waited <= 3, "{waited} checks waited: {seen:?}");
    assert_eq!(backend.redis_state(), Some(RedisState::Fallback));
    assert_eq!(backend.redis_switches(), Some(1));
    assert!(proxy.connections() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_never_answers_from_start_up_switches_under_load() {
    const TASKS: usize = 16;
    let (_redis, _proxy, backend) = hung();
    let limiter = limiter(&backend);
    let start = Instant::now();
    let watch = Watch::start(&backend, start);
    let seen = busy(&limiter, start, TASKS, Duration::from_secs(3)).await;
    let switched = watch.switched().await;
    judge(&seen, switched, CONNECT + quiet_bound() + SLACK);
    // Each task waited for at most a few checks.
    let waited = seen.iter().filter(|s| s.took >= AT_ONCE).count();
    assert!(waited <= TASKS * 4, "{waited} checks waited");
    assert_eq!(backend.redis_state(), Some(RedisState::Fallback));
    assert_eq!(backend.redis_switches(), Some(1));
}

/// The breaker never counts its own answers: refusals by the failure policy (here fail
/// closed) and deny-cache answers are not Redis failures, so a flood of them neither
/// opens the breaker nor holds it open (go-zero's breaker did: zeromicro/go-zero#5551).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_cannot_stick_open_on_its_own_refusals() {
    let mut redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let backend = support::backend_builder()
        .redis_url(proxy.url())
        .failure_policy(FailurePolicy::FailClosed)
        .probe_interval(Duration::from_millis(100))
        // A recovery of a second, which the polling below cannot miss, and a call timeout
        // under which a busy machine's slow call is not a refusal by the failure policy.
        .recovery(Duration::from_secs(1))
        .call_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let limiter = Arc::new(
        PeriodLimiter::new(
            &backend,
            "tight",
            PeriodConfig::new(1, Duration::from_secs(60)),
        )
        .unwrap(),
    );
    // A key over its limit: Redis refuses it once, the deny cache answers the flood.
    assert!(limiter.check(b"hot", ONE).await.is_admitted());
    let refused = limiter.check(b"hot", ONE).await;
    assert_eq!(
        (refused.source, refused.state),
        (Source::Redis, State::OverQuota)
    );
    for _ in 0..1000 {
        let d = limiter.check(b"hot", ONE).await;
        assert_eq!((d.source, d.state), (Source::DenyCache, State::OverQuota));
    }
    assert_eq!(backend.redis_state(), Some(RedisState::Healthy));
    assert_eq!(backend.redis_switches(), Some(0));

    // Redis goes away: the breaker opens once, and the failure policy refuses everything.
    redis.kill();
    let start = Instant::now();
    while backend.redis_state() != Some(RedisState::Fallback) {
        assert!(start.elapsed() < Duration::from_secs(3), "never switched");
        limiter.check(b"k", ONE).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let flood = |n: usize| {
        let limiter = Arc::clone(&limiter);
        async move {
            let mut sources = Vec::new();
            for i in 0..n {
                let key = format!("k{}", i % 50);
                sources.push(limiter.check(key.as_bytes(), ONE).await.source);
            }
            sources
        }
    };
    let during = flood(5000).await;
    assert!(
        during.iter().all(|s| *s == Source::FailClosed),
        "{during:?}"
    );

    // Redis is back: the probe finds it, and recovery ends although the failure policy
    // refused most checks meanwhile (the share not yet sent to Redis).
    redis.restart();
    let start = Instant::now();
    let mut refused_while_recovering = 0usize;
    while backend.redis_state() != Some(RedisState::Healthy) {
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "stuck in {:?}",
            backend.redis_state()
        );
        if backend.redis_state() == Some(RedisState::Recovering) {
            refused_while_recovering += flood(50)
                .await
                .iter()
                .filter(|s| **s == Source::FailClosed)
                .count();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        refused_while_recovering > 0,
        "the flood reached no recovery"
    );
    assert_eq!(backend.redis_switches(), Some(1));
    // The deny cache's answers after recovery do not count either.
    let after = flood(500).await;
    assert!(after.iter().all(|s| *s != Source::FailClosed), "{after:?}");
    assert_eq!(backend.redis_state(), Some(RedisState::Healthy));
    assert_eq!(backend.redis_switches(), Some(1));
}

/// The time away from Redis is counted in seconds while the outage lasts, not only when
/// it ends.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn time_away_is_counted_in_seconds_while_the_outage_lasts() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    const AWAY: &str = "ratelimit_redis_fallback_seconds_total";
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The runtime is single-threaded: the probe records here too.
    let _guard = metrics::set_default_local_recorder(&recorder);
    // A snapshot drains the counters it reads.
    let read = |snapshotter: &Snapshotter, name: &str| -> Option<DebugValue> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find(|(key, ..)| key.key().name() == name)
            .map(|(.., value)| value)
    };
    let mut redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    let backend = support::backend_builder()
        .redis_url(proxy.url())
        .probe_interval(Duration::from_millis(100))
        .recovery(Duration::from_millis(200))
        .build()
        .unwrap();
    let limiter = limiter(&backend);
    warm(&limiter).await;
    redis.kill();
    while backend.redis_state() != Some(RedisState::Fallback) {
        limiter.check(b"k", ONE).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let away = Instant::now();
    // (2.6 s: at least two whole seconds counted even if the probe's tick is late.)
    tokio::time::sleep(Duration::from_millis(2600)).await;
    assert_eq!(backend.redis_state(), Some(RedisState::Fallback));
    let during = match read(&snapshotter, AWAY) {
        Some(DebugValue::Counter(seconds)) => seconds,
        other => panic!("{AWAY} during the outage: {other:?}"),
    };
    assert!((2..=3).contains(&during), "{during} s after 2.6 s away");
    redis.restart();
    while backend.redis_state() != Some(RedisState::Healthy) {
        assert!(away.elapsed() < Duration::from_secs(8), "not back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let total = during
        + match read(&snapshotter, AWAY) {
            Some(DebugValue::Counter(seconds)) => seconds,
            _ => 0,
        };
    let elapsed = away.elapsed().as_secs();
    assert!(
        (during..=elapsed + 1).contains(&total),
        "{total} s counted for {elapsed} s away"
    );
}
