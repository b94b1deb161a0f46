//! Settlement helpers shared by `tests/settle.rs` and `tests/settle_body.rs`: where a
//! test's limits are kept ([`Host`]), and where a key stands after a settlement.

use std::time::Duration;

use tower_redis_ratelimit::{Backend, Decision, Limiter, Source};

use super::RedisServer;

pub(crate) const SEC: Duration = Duration::from_secs(1);
pub(crate) const MINUTE: Duration = Duration::from_secs(60);

/// Where a test's limits are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    InProcess,
    Redis,
    /// A Redis backend whose server does not answer: the in-process fallback.
    Fallback,
}

pub(crate) fn backend(host: Host, redis: &RedisServer) -> Backend {
    match host {
        Host::InProcess => Backend::in_process(),
        Host::Redis => redis.uncached_backend(),
        Host::Fallback => super::backend_builder()
            .redis_url(format!("redis://127.0.0.1:{}", super::free_port()))
            .call_timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    }
}

pub(crate) fn source(host: Host) -> Source {
    match host {
        Host::InProcess => Source::InProcess,
        Host::Redis => Source::Redis,
        Host::Fallback => Source::Fallback,
    }
}

/// Where `key` stands: a settlement of nothing.
pub(crate) async fn standing(limiter: &dyn Limiter, key: &[u8]) -> Decision {
    limiter.settle(key, 0).expect("built-in").await
}

/// Polls `limiter`'s standing on `key` until `expected` units are left (the settlement
/// runs in the background on Redis).
pub(crate) async fn until_remaining(limiter: &dyn Limiter, key: &[u8], expected: u64) {
    let mut last = None;
    for _ in 0..500 {
        let d = standing(limiter, key).await;
        if d.remaining == expected {
            return;
        }
        last = Some(d);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never {expected} left: {last:?}");
}
