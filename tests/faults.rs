//! Partial Redis faults: a real `redis-server`, reached through the fault-injecting proxy
//! of the test support where the fault is on the way. Each test asserts which source
//! answered, how often the breaker switched, and per-key isolation — not timings.

mod support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use support::proxy::FaultProxy;
use support::RedisServer;
use tokio::time::Instant;
use tower_redis_ratelimit::RedisState;
use tower_redis_ratelimit::{Backend, BackendBuilder, FailurePolicy, Limiter, Source, State};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const PROBE: Duration = Duration::from_millis(100);
const RECOVERY: Duration = Duration::from_millis(300);

/// The crate's defaults, with a faster probe and recovery to keep tests short.
fn builder() -> BackendBuilder {
    support::backend_builder()
        .probe_interval(PROBE)
        .recovery(RECOVERY)
}

fn limiter(backend: &Backend, name: &str) -> Arc<PeriodLimiter> {
    Arc::new(
        PeriodLimiter::new(
            backend,
            name,
            PeriodConfig::new(1_000_000, Duration::from_secs(60)),
        )
        .unwrap(),
    )
}

/// Decisions by source.
#[derive(Debug, Default, Clone, Copy)]
struct Sources {
    redis: usize,
    other: usize,
}

impl Sources {
    fn add(&mut self, source: Source) {
        if source == Source::Redis {
            self.redis += 1;
        } else {
            self.other += 1;
        }
    }

    fn merge(&mut self, other: Sources) {
        self.redis += other.redis;
        self.other += other.other;
    }

    fn redis_share(&self) -> f64 {
        self.redis as f64 / (self.redis + self.other).max(1) as f64
    }
}

/// `tasks` tasks checking `limiter` back to back for `span`, each pausing `pause` between
/// checks; the decisions by source.
async fn load(
    limiter: &Arc<PeriodLimiter>,
    tasks: usize,
    span: Duration,
    pause: Duration,
) -> Sources {
    let until = Instant::now() + span;
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let limiter = Arc::clone(limiter);
            tokio::spawn(async move {
                let mut sources = Sources::default();
                let mut i = 0u64;
                while Instant::now() < until {
                    let key = format!("k{}", (t as u64 * 7 + i) % 16);
                    sources.add(limiter.check(key.as_bytes(), ONE).await.source);
                    i += 1;
                    tokio::time::sleep(pause).await;
                }
                sources
            })
        })
        .collect();
    let mut total = Sources::default();
    for worker in workers {
        total.merge(worker.await.unwrap());
    }
    total
}

/// Checks until Redis answers: the connection is made and the script loaded. (Within
/// 10 s: a far Redis's first connection takes a few seconds, more on a busy machine.)
async fn warm(limiter: &PeriodLimiter) {
    let start = Instant::now();
    while limiter.check(b"warm", ONE).await.source != Source::Redis {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "redis never answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_state(backend: &Backend, state: RedisState, within: Duration) {
    let start = Instant::now();
    while backend.redis_state() != Some(state) {
        assert!(
            start.elapsed() < within,
            "not {state:?} after {within:?}: {:?}",
            backend.redis_state()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_held_past_the_deadline_are_answered_locally_without_a_switch() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    // The deadline and the hold of 100 ms and 150 ms scaled by three: the checks behind a
    // held reply fail for half a deadline, far from the two deadlines of failures in a
    // row that open the breaker, however busy the machine.
    let backend = builder()
        .redis_url(proxy.url())
        .call_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let limiter = limiter(&backend, "held");
    warm(&limiter).await;
    // Now and then a reply is held 450 ms, past the 300 ms deadline: every reply behind
    // it on the connection waits too (head-of-line).
    proxy.hold_replies(0.005, Duration::from_millis(450));
    let sources = load(
        &limiter,
        8,
        Duration::from_secs(3),
        Duration::from_millis(2),
    )
    .await;
    assert!(sources.other > 0, "no reply was held: {sources:?}");
    assert_eq!(backend.redis_switches(), Some(0), "{sources:?}");
    assert!(sources.redis_share() >= 0.8, "{sources:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_with_their_connection_are_absorbed() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    // A check whose reply is lost reconnects and calls again within its deadline: 300 ms,
    // so that a busy machine's reconnection is not taken for a failure.
    let backend = builder()
        .redis_url(proxy.url())
        .call_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let limiter = limiter(&backend, "lost");
    warm(&limiter).await;
    proxy.lose_replies(0.01);
    let sources = load(
        &limiter,
        4,
        Duration::from_secs(2),
        Duration::from_millis(2),
    )
    .await;
    assert!(proxy.connections() > 1, "no reply was lost");
    assert_eq!(backend.redis_switches(), Some(0), "{sources:?}");
    assert!(sources.redis_share() >= 0.95, "{sources:?}");
}

#[tokio::test]
async fn a_key_of_the_wrong_type_affects_only_its_own_requests() {
    let redis = RedisServer::start();
    // (The harness's deadline: a key's error is answered at once, and no check of a good
    // key may meet the failure policy because the machine was busy.)
    let backend = builder()
        .redis_url(redis.url())
        .call_timeout(support::CALL_TIMEOUT)
        .build()
        .unwrap();
    let limiter = limiter(&backend, "wrong");
    let closed = PeriodLimiter::new(
        &backend.clone(),
        "closed",
        PeriodConfig::new(10, Duration::from_secs(60)),
    )
    .unwrap();
    // Something else wrote the limiter's keys: a hash where a counter belongs.
    assert_eq!(limiter.check(b"bad", ONE).await.source, Source::Redis);
    assert_eq!(closed.check(b"bad", ONE).await.source, Source::Redis);
    let keys = redis.cmd(&["KEYS", "*bad*"]);
    assert_eq!(keys.lines().count(), 2, "{keys}");
    for key in keys.lines() {
        redis.cmd(&["DEL", key]);
        redis.cmd(&["HSET", key, "field", "value"]);
    }
    let mut good = Sources::default();
    for i in 0..200 {
        let bad = limiter.check(b"bad", ONE).await;
        assert_eq!(
            bad.source,
            Source::Fallback,
            "the failure policy decides it"
        );
        good.add(
            limiter
                .check(format!("good{}", i % 10).as_bytes(), ONE)
                .await
                .source,
        );
    }
    assert_eq!(good.redis, 200, "{good:?}");
    assert_eq!(backend.redis_switches(), Some(0));
    assert_eq!(backend.redis_state(), Some(RedisState::Healthy));

    // A layer that fails closed refuses that key alone.
    let closed_backend = builder()
        .redis_url(redis.url())
        .call_timeout(support::CALL_TIMEOUT)
        .failure_policy(FailurePolicy::FailClosed)
        .build()
        .unwrap();
    let closed = PeriodLimiter::new(
        &closed_backend,
        "closed",
        PeriodConfig::new(10, Duration::from_secs(60)),
    )
    .unwrap();
    let refused = closed.check(b"bad", ONE).await;
    assert_eq!(
        (refused.source, refused.state),
        (Source::FailClosed, State::OverQuota)
    );
    assert_eq!(closed.check(b"fine", ONE).await.source, Source::Redis);
}

/// How the checks of [`refuses_writes_then_recovers`] reach Redis.
#[derive(Clone, Copy)]
enum Calls {
    /// Two at a time, each its own call (the defaults: Functions on Redis 7).
    OwnCalls,
    /// Sixteen at a time on the EVALSHA path, most of them batched (a batch's items
    /// run in one script, each in `pcall`).
    Batched,
}

async fn refuses_writes_then_recovers(
    redis: &RedisServer,
    refuse: &[&[&str]],
    accept: &[&[&str]],
    calls: Calls,
) {
    // (The harness's deadline: refusals are answered at once, and the checks before and
    // after must not meet the failure policy because the machine was busy. Batching
    // still starts once a round trip is within an eighth of it.)
    let (backend, tasks) = match calls {
        Calls::OwnCalls => (
            builder()
                .redis_url(redis.url())
                .call_timeout(support::CALL_TIMEOUT)
                .build()
                .unwrap(),
            2,
        ),
        Calls::Batched => {
            let backend = builder()
                .redis_url(redis.url())
                .call_timeout(support::CALL_TIMEOUT)
                .engine_functions(false)
                .batch_after(1)
                .build()
                .unwrap();
            (backend, 16)
        }
    };
    let limiter = limiter(&backend, "writes");
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    for command in refuse {
        assert_eq!(redis.cmd(command), "OK", "{command:?}");
    }
    // PING still answers, writes do not: the breaker opens once and stays open while
    // the probe (a write) keeps failing.
    assert_eq!(redis.cmd(&["PING"]), "PONG");
    let during = load(
        &limiter,
        tasks,
        Duration::from_millis(1500),
        Duration::from_millis(1),
    )
    .await;
    assert_eq!(
        backend.redis_state(),
        Some(RedisState::Fallback),
        "{during:?}"
    );
    assert_eq!(backend.redis_switches(), Some(1), "{during:?}");
    assert!(during.other > during.redis * 10, "{during:?}");
    for command in accept {
        assert_eq!(redis.cmd(command), "OK", "{command:?}");
    }
    wait_state(&backend, RedisState::Healthy, Duration::from_secs(2)).await;
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    assert_eq!(backend.redis_switches(), Some(1));
}

/// A Redis out of memory (refusing every write) until it accepts writes again.
async fn out_of_memory(calls: Calls) {
    let redis = RedisServer::start();
    refuses_writes_then_recovers(
        &redis,
        &[
            &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
            &["CONFIG", "SET", "maxmemory", "1"],
        ],
        &[&["CONFIG", "SET", "maxmemory", "0"]],
        calls,
    )
    .await;
}

/// A replica (refusing every write) until it is promoted.
async fn read_only_replica(calls: Calls) {
    let redis = RedisServer::start();
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    refuses_writes_then_recovers(
        &redis,
        &[&["REPLICAOF", "127.0.0.1", &port]],
        &[&["REPLICAOF", "NO", "ONE"]],
        calls,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_stays_in_fallback_until_it_accepts_writes() {
    out_of_memory(Calls::OwnCalls).await;
}

/// Batched checks meet the refusal inside their batch's script: the batch fails as
/// their own calls would (the breaker counts each of its checks), not item by item as
/// if each key's value were at fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_stops_batched_checks_as_their_own_calls() {
    out_of_memory(Calls::Batched).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_stays_in_fallback_until_it_is_promoted() {
    read_only_replica(Calls::OwnCalls).await;
}

/// A replica refuses a batch's writes as it refuses a check's own call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_stops_batched_checks_as_their_own_calls() {
    read_only_replica(Calls::Batched).await;
}

/// A Redis `one_way` away each way, more than half the deadline for a round trip: a
/// connection takes two round trips, more than one deadline, and still gets made; then
/// every check is answered by Redis, on one connection. (The callers leave at least
/// 300 ms between a round trip and the deadline: a check that a busy machine delays past
/// its deadline would open a second connection.)
async fn far_redis(
    one_way: Duration,
    call_timeout: Duration,
) -> (RedisServer, FaultProxy, Backend, Arc<PeriodLimiter>) {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    proxy.set_latency(one_way);
    let backend = builder()
        .redis_url(proxy.url())
        .call_timeout(call_timeout)
        .build()
        .unwrap();
    let limiter = limiter(&backend, "far");
    warm(&limiter).await;
    let sources = load(
        &limiter,
        8,
        Duration::from_secs(2),
        Duration::from_millis(5),
    )
    .await;
    assert_eq!(backend.redis_switches(), Some(0), "{sources:?}");
    assert!(sources.redis_share() >= 0.95, "{sources:?}");
    // (Beside the backend's change subscription.)
    let subscribed = support::subscribed_clients(&redis, 1).await as u64;
    assert_eq!(
        proxy.connections() - subscribed,
        1,
        "one connection attempt at a time"
    );
    (redis, proxy, backend, limiter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_redis_within_the_deadline_keeps_answering() {
    // A 450 ms round trip against a 750 ms deadline (three fifths, as 120 ms against 200).
    let (_redis, proxy, backend, limiter) =
        far_redis(Duration::from_millis(225), Duration::from_millis(750)).await;

    // A 3 s partition: the breaker opens, and Redis answers again soon after it ends.
    // (Long enough for four deadlines: the breaker opens by its failure ratio after two,
    // by the streak after three.)
    proxy.blackhole(true);
    let during = load(
        &limiter,
        8,
        Duration::from_secs(3),
        Duration::from_millis(5),
    )
    .await;
    assert_eq!(
        backend.redis_state(),
        Some(RedisState::Fallback),
        "{during:?}"
    );
    proxy.blackhole(false);
    // (A connection and a probe take a few round trips: 6 s for "soon".)
    wait_state(&backend, RedisState::Healthy, Duration::from_secs(6)).await;
    // (1 s: a few round trips for each task.)
    let after = load(
        &limiter,
        8,
        Duration::from_secs(1),
        Duration::from_millis(5),
    )
    .await;
    assert_eq!(after.other, 0, "{after:?}");
    assert_eq!(backend.redis_switches(), Some(1));
}

/// A new instance's first checks reach a Redis that answers within the connect timeout
/// (issue 53, item 4): connecting and loading the engine take several round trips, more
/// than the call timeout meant for a check on a warm connection, so the checks waiting
/// for the first connection wait for it (up to the connect timeout) instead of being
/// answered in process. Here a 70 ms round trip against the default 100 ms deadline: a
/// check on a warm connection fits, the first connection's three round trips do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_on_a_slow_redis_is_answered_by_redis() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    proxy.set_latency(Duration::from_millis(35));
    let backend = builder().redis_url(proxy.url()).build().unwrap();
    let limiter = limiter(&backend, "cold");
    let first = futures_util::future::join_all((0..4).map(|_| limiter.check(b"k", ONE))).await;
    let sources: Vec<Source> = first.iter().map(|d| d.source).collect();
    assert_eq!(
        sources,
        [Source::Redis; 4],
        "the first checks of a new backend"
    );
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    assert_eq!(backend.redis_switches(), Some(0));
    let subscribed = support::subscribed_clients(&redis, 1).await as u64;
    assert_eq!(
        proxy.connections() - subscribed,
        1,
        "one connection attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_region_with_a_longer_deadline_keeps_answering() {
    // A 560 ms round trip against a 875 ms deadline (as 160 ms against 250).
    far_redis(Duration::from_millis(280), Duration::from_millis(875)).await;
}

/// A round trip three quarters of the deadline: the checks that wait for the first
/// connection fail, so the probe starts and first runs its script while the connection
/// is being made; the connection loads it before it is handed out, or the probe's first
/// call would meet `NOSCRIPT`, load it and call again, outlast the deadline and open a
/// second connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_a_round_trip_short_of_the_deadline_keeps_answering() {
    // A 900 ms round trip against a 1.2 s deadline: 300 ms to spare for each check, and
    // the probe (a deadline and a probe interval after the first check) starts 500 ms
    // before the connection's first round trip of scripts returns (200 ms at 400 ms
    // against 500 ms).
    far_redis(Duration::from_millis(450), Duration::from_millis(1200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_under_load_switches_once_and_comes_back() {
    let mut redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    // A 50 ms round trip against a 350 ms deadline: 300 ms to spare for each check on a
    // busy machine, and still more than an eighth of the deadline, so that checks make
    // their own calls (no batching), as at 30 ms against the default 100 ms.
    proxy.set_latency(Duration::from_millis(25));
    let backend = builder()
        .redis_url(proxy.url())
        .call_timeout(Duration::from_millis(350))
        .build()
        .unwrap();
    let limiter = limiter(&backend, "restart");
    warm(&limiter).await;
    let before = load(
        &limiter,
        16,
        Duration::from_millis(500),
        Duration::from_millis(10),
    )
    .await;
    assert!(before.redis_share() >= 0.9, "{before:?}");
    redis.kill();
    // (1.5 s: twice the 700 ms of failures in a row that open the breaker, whatever its
    // failure ratio does.)
    let during = load(
        &limiter,
        16,
        Duration::from_millis(1500),
        Duration::from_millis(10),
    )
    .await;
    assert_eq!(
        backend.redis_state(),
        Some(RedisState::Fallback),
        "{during:?}"
    );
    redis.restart();
    wait_state(&backend, RedisState::Healthy, Duration::from_secs(3)).await;
    let after = load(
        &limiter,
        16,
        Duration::from_secs(1),
        Duration::from_millis(10),
    )
    .await;
    assert!(after.redis_share() >= 0.95, "{after:?}");
    assert_eq!(backend.redis_switches(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_under_concurrency_makes_one_connection() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    proxy.set_latency(Duration::from_millis(5));
    // A 500 ms deadline: the first connection (two round trips and the engine's loading)
    // is made within it on a busy machine too, so that the checks waiting for it do not
    // fail for two deadlines and open the breaker; with a 10 ms round trip, checks still
    // batch (a round trip within an eighth of the deadline), as with the default 100 ms.
    let backend = builder()
        .redis_url(proxy.url())
        .call_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let limiter = limiter(&backend, "cold");
    let sources = load(
        &limiter,
        32,
        Duration::from_secs(1),
        Duration::from_millis(1),
    )
    .await;
    // (Beside the backend's change subscription.)
    let subscribed = support::subscribed_clients(&redis, 1).await as u64;
    assert_eq!(proxy.connections() - subscribed, 1, "{sources:?}");
    assert_eq!(backend.redis_switches(), Some(0), "{sources:?}");
    assert!(sources.redis_share() >= 0.95, "{sources:?}");
}

#[tokio::test]
async fn backends_built_from_a_pool_recover_the_same_way() {
    let mut redis = RedisServer::start();
    // (The harness's deadline: a killed server fails checks at once, and the checks
    // before and after must not meet the failure policy because the machine was busy.)
    let backend = builder()
        .redis(redis.pool())
        .call_timeout(support::CALL_TIMEOUT)
        .build()
        .unwrap();
    let limiter = limiter(&backend, "pool");
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    redis.kill();
    while backend.redis_state() == Some(RedisState::Healthy) {
        assert_ne!(limiter.check(b"k", ONE).await.source, Source::Redis);
    }
    redis.restart();
    wait_state(&backend, RedisState::Healthy, Duration::from_secs(3)).await;
    assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    assert_eq!(backend.redis_switches(), Some(1));
}

#[test]
fn invalid_breaker_settings_fail_when_built() {
    let err = support::backend_builder()
        .breaker_failure_ratio(1.5)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "`breaker_failure_ratio` must be a fraction in (0, 1]"
    );
    let err = support::backend_builder()
        .breaker_min_calls(0)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "`breaker_min_calls` must be greater than zero"
    );
    let err = support::backend_builder()
        .breaker_window(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("breaker_window"), "{err}");
}

/// The return to Redis after a partition (issue 35, item 4): all checks are back on
/// Redis (Healthy) within a probe interval, a round trip and the recovery of the
/// partition's end, as the guide says (1.8 s here: a 600 ms probe interval, a 200 ms
/// round trip and the default recovery; 300 ms of margin for a busy machine's
/// scheduling). Probes that started an interval after the last one ended took up to a
/// call timeout more (1.73 s and 1.83 s measured against 1.57 s, at the defaults and a
/// 70 ms round trip).
///
/// Where the partition's end falls among the probes and the connection attempts decides
/// the return (at the defaults, anywhere from 1.24 s to 2.2 s for the same code), so the
/// test places it. The partition starts on a quiet backend (the probe that the first
/// connection's failed checks started has stopped), so that the probes and the
/// connection attempt follow its first failed check, a deadline in; it ends 2.6 s after
/// that check: after the attempt gave up (at four deadlines), 200 ms after the probe
/// that made the next one, which then has time to finish. Measured: back after 1.67 s
/// (2.07 s to 1.57 s for ends 400 ms earlier to 200 ms later); with probes an interval
/// after the last one ended, 2.37 s (2.76 s to 2.16 s), past the margin. The deadline
/// is under three round trips, as the default 100 ms is against 70 ms: a probe that has
/// to wait for a connection made after the partition fails, so a late probe shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_return_after_a_partition_is_within_the_documented_bound() {
    const PROBE_INTERVAL: Duration = Duration::from_millis(600);
    const DEADLINE: Duration = Duration::from_millis(500);
    const ONE_WAY: Duration = Duration::from_millis(100);
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port());
    proxy.set_latency(ONE_WAY);
    let backend = support::backend_builder()
        .redis_url(proxy.url())
        .probe_interval(PROBE_INTERVAL)
        .call_timeout(DEADLINE)
        .build()
        .unwrap();
    let limiter = limiter(&backend, "partition");
    warm(&limiter).await;
    // The first check waited for the connection (two round trips) and its own round
    // trip, past the deadline, so the probe started: it stops at its next tick.
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.blackhole(true);
    let during = load(
        &limiter,
        4,
        DEADLINE + Duration::from_millis(2600),
        Duration::from_millis(10),
    )
    .await;
    assert_eq!(
        backend.redis_state(),
        Some(RedisState::Fallback),
        "{during:?}"
    );
    proxy.blackhole(false);
    let healed = Instant::now();
    let mut first = None;
    while backend.redis_state() != Some(RedisState::Healthy) {
        assert!(healed.elapsed() < Duration::from_secs(6), "never back");
        let source = limiter.check(b"after", ONE).await.source;
        if source == Source::Redis && first.is_none() {
            first = Some(healed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let back = healed.elapsed();
    let bound = PROBE_INTERVAL + Duration::from_secs(1) + ONE_WAY * 2;
    eprintln!("first decision from redis after {first:?}, healthy after {back:?}");
    assert!(
        back <= bound + Duration::from_millis(300),
        "back on Redis {back:?} after the partition, past {bound:?}"
    );
}
