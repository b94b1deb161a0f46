//! A peek writes nothing, so a server that refuses writes still answers it: a Redis out
//! of memory (`noeviction`) and a read-only replica. With Redis Functions, a function
//! not flagged `no-writes` is refused there before it runs; the engine's peek is called
//! as its `no-writes` twin (`FCALL_RO`). By `EVALSHA` (a server without Functions) the
//! script runs and writes nothing.

mod support;

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use support::RedisServer;
use tower_redis_ratelimit::{Backend, Limiter, Source, State};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;

fn backend(redis: &RedisServer) -> Backend {
    support::backend_builder()
        .redis_url(redis.url())
        .call_timeout(Duration::from_secs(5))
        .build()
        .expect("backend")
}

fn limiter(backend: &Backend) -> PeriodLimiter {
    PeriodLimiter::new(
        backend,
        "ro",
        PeriodConfig::new(5, Duration::from_secs(600)),
    )
    .expect("valid")
}

#[tokio::test]
async fn a_redis_out_of_memory_answers_peeks() {
    let redis = RedisServer::start();
    let backend = backend(&redis);
    let limiter = limiter(&backend);
    for _ in 0..2 {
        assert_eq!(limiter.check(b"k", ONE).await.source, Source::Redis);
    }
    redis.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]);

    let peek = limiter.peek(b"k", ONE).expect("built-in").await;
    assert_eq!(peek.source, Source::Redis, "{peek:?}");
    assert_eq!(
        (peek.state, peek.remaining),
        (State::Allowed, 2),
        "{peek:?}"
    );
    // A check, which writes, is refused by the server (and answered by the policy).
    let check = limiter.check(b"k", ONE).await;
    assert_ne!(check.source, Source::Redis, "{check:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_answers_peeks() {
    let primary = RedisServer::start();
    let limiter_on_primary = limiter(&backend(&primary));
    for _ in 0..3 {
        assert_eq!(
            limiter_on_primary.check(b"k", ONE).await.source,
            Source::Redis
        );
    }
    let replica = RedisServer::start();
    let port = primary.port().to_string();
    replica.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !replica
        .cmd(&["INFO", "replication"])
        .contains("master_link_status:up")
        || replica.cmd(&["DBSIZE"]) == "0"
    {
        assert!(Instant::now() < deadline, "the replica never synced");
        std::thread::sleep(Duration::from_millis(50));
    }

    let backend = backend(&replica);
    let limiter = limiter(&backend);
    let peek = limiter.peek(b"k", ONE).expect("built-in").await;
    assert_eq!(peek.source, Source::Redis, "{peek:?}");
    assert_eq!(
        (peek.state, peek.remaining),
        (State::Allowed, 1),
        "{peek:?}"
    );
}
