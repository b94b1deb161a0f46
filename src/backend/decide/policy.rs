//! What answers a check when Redis does not: the layer's failure policy
//! ([`unavailable`]), which in [`FailurePolicy::Fallback`] is the in-process host
//! ([`local_check`]) and refuses a limit this instance has no share of ([`no_share`]);
//! a refusal until the probe may have found Redis again ([`refused_until_probe`]); and
//! who answers a check that needs no store ([`answering`]).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::hosts::Hosts;
use crate::backend::redis::RedisBackend;
use crate::backend::{FailurePolicy, DEFAULT_PROBE_INTERVAL};
use crate::decision::{Decision, Priority, Source, State};

/// The answer while Redis is unreachable, by the layer's failure policy.
pub(super) fn unavailable<T: Hosts + ?Sized>(store: &T, key: &[u8], cost: NonZeroU32) -> Decision {
    unavailable_priority(store, key, cost, Priority::WHOLE)
}

/// [`unavailable`] for a priority class of `priority`: the fallback applies it to the
/// limits in force.
pub(super) fn unavailable_priority<T: Hosts + ?Sized>(
    store: &T,
    key: &[u8],
    cost: NonZeroU32,
    priority: Priority,
) -> Decision {
    let backend = &store.remote().backend;
    match backend.failover.policy {
        FailurePolicy::Fallback if no_share(store) => refused_until_probe(store, Source::Fallback),
        FailurePolicy::Fallback => local_check(store, key, cost.get(), priority, Source::Fallback),
        FailurePolicy::FailOpen => {
            let limit = store.capacity();
            Decision::new(
                State::Allowed,
                limit,
                limit,
                Duration::ZERO,
                Source::FailOpen,
            )
        }
        FailurePolicy::FailClosed => refused_until_probe(store, Source::FailClosed),
    }
}

/// Whether this instance's fallback share of a limit (of a set: of its smallest) rounds
/// to nothing ([`ShareRounding::WithinLimit`](crate::backend::ShareRounding)): the
/// fallback then refuses it.
pub(super) fn no_share<T: Hosts + ?Sized>(store: &T) -> bool {
    store.remote().backend.local_limit(store.capacity()) == 0
}

/// A refusal until the probe may have found Redis again: fail closed, or a fallback
/// without a share of the limit.
pub(super) fn refused_until_probe<T: Hosts + ?Sized>(store: &T, source: Source) -> Decision {
    let retry = store
        .remote()
        .backend
        .redis_handle()
        .map_or(DEFAULT_PROBE_INTERVAL, |r| r.probe_interval());
    Decision::new(State::OverQuota, store.capacity(), 0, retry, source).with_retry_after(retry)
}

/// A check on the in-process state: refused while the key is blocked (spending
/// nothing), and a refusal starts the limit's lockout (a priority class's refusal, of
/// a `priority` below the whole, does not: the limit is not used up).
pub(super) fn local_check<T: Hosts + ?Sized>(
    store: &T,
    key: &[u8],
    cost: u32,
    priority: Priority,
    source: Source,
) -> Decision {
    let blocks = store.blocks();
    let local = store.remote().backend.local();
    let now_us = || store.remote().backend.clock().now_us();
    if let Some(until) = blocks.until(local, key, now_us) {
        let wait = Duration::from_micros(until.saturating_sub(now_us()));
        return store.local_blocked(key, cost, priority, source, wait);
    }
    let decision = store.local_priority(key, cost, priority, source, true);
    if decision.is_admitted() || decision.state == State::ExceedsCapacity || !priority.is_whole() {
        return decision;
    }
    let now = now_us();
    match blocks.lock_out(local, key, now) {
        // (The refusal spent nothing: the key stands where the refusal found it.)
        Some(until) => {
            let wait = Duration::from_micros(until.saturating_sub(now));
            store.local_blocked(key, cost, priority, source, wait)
        }
        None => decision,
    }
}

/// Who answers a check that needs no store (a cost above capacity): Redis while it is
/// healthy, the fallback while it is not, the process without Redis.
pub(super) fn answering(redis: Option<&Arc<RedisBackend>>) -> Source {
    match redis {
        None => Source::InProcess,
        Some(redis) if redis.is_healthy() => Source::Redis,
        Some(_) => Source::Fallback,
    }
}
