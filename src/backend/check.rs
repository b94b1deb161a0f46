//! A check's journey, top-down in this one file: [`check`] routes it (a cost above
//! capacity; no Redis: the in-process host; a token bucket with leases:
//! [`check_leased`]; the breaker open: the failure policy), then the deny cache (a key
//! Redis refused moments ago is refused without a round trip), coalescing (a check of
//! a key already in flight queues in the [`Coalescer`](super::coalesce::Coalescer);
//! its [`Leader`] sends the queue with the next call when its own is over), and the
//! engine call: one round trip, `FCALL` or `EVALSHA`, on the connection
//! [`RedisBackend`] keeps and judges. Building that call, reading its reply and the
//! failure policy's answers are `answer.rs`, shared with the handles' operations
//! (`operate.rs`); the limits' two hosts are `hosts.rs`, the connection and its health
//! `redis.rs` and `health.rs`. Nothing below imports this module.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::answer::{answering, cached_refusal, conclude, engine_call, local_check, unavailable};
use super::call::Call;
use super::coalesce::{Turn, Waiting};
use super::engine::CHECK;
use super::hosts::Hosts;
use super::lease::{self, Leases, Take};
use super::operate::{operate, Operation};
use super::redis::RedisBackend;
use crate::decision::{Decision, Source, State};
use crate::limiter::Check;

/// Answers a check from Redis when the breaker lets it through (one round trip, run by
/// SHA), by the layer's [`FailurePolicy`](super::FailurePolicy) otherwise; a failed round trip is answered by
/// the failure policy too, and counts toward the breaker unless it concerns only its key.
/// A key Redis refused recently is refused from the deny cache without a round trip.
pub(crate) fn check<T: Hosts + ?Sized>(store: &Arc<T>, key: &[u8], cost: NonZeroU32) -> Check {
    let remote = store.remote();
    let backend = &remote.backend;
    let redis = backend.redis_handle();
    if u64::from(cost.get()) > store.capacity() {
        return Check::ready(store.exceeds_capacity(answering(redis)));
    }
    let Some(redis) = redis else {
        return Check::ready(local_check(&**store, key, cost.get(), Source::InProcess));
    };
    if let Some(leases) = store.leases() {
        return check_leased(store, leases, redis, key, cost);
    }
    if !redis.admit() {
        return Check::ready(unavailable(&**store, key, cost));
    }
    let redis_key = remote.redis_key(key);
    let deny_key = match cached_refusal(&**store, &redis_key) {
        Ok(deny_key) => deny_key,
        Err(refused) => return Check::ready(refused),
    };
    let turn = if backend.inner.coalesce {
        let hash = deny_key.unwrap_or_else(|| backend.inner.deny.hash(&redis_key));
        match remote.coalescer.turn(hash, cost) {
            Turn::Wait(part) => {
                // Another check of this key is in flight: this one goes with the next call.
                let store = Arc::clone(store);
                let redis = Arc::clone(redis);
                return Check::pending(async move {
                    let part = part.await.ok().flatten().ok_or(None);
                    conclude(&*store, &redis, part, &redis_key, cost, deny_key)
                });
            }
            Turn::Lead => Some(hash),
        }
    } else {
        None
    };
    // Only a check that goes to Redis itself builds the call.
    let lockout = store.blocks().lockout_ms();
    let call = engine_call(
        &**store,
        key,
        &redis_key,
        CHECK,
        u64::from(cost.get()),
        lockout,
        &[],
    );
    let leader = Leader {
        store: Arc::clone(store),
        redis: Arc::clone(redis),
        redis_key,
        turn,
    };
    Check::pending(async move {
        let remote = leader.store.remote();
        let started = std::time::Instant::now();
        let result = leader.redis.eval(&call).await;
        remote.metrics.duration(&remote.name, started.elapsed());
        let decision = conclude(
            &*leader.store,
            &leader.redis,
            result.map_err(Some),
            &leader.redis_key,
            cost,
            deny_key,
        );
        // The checks of this key that queued meanwhile go now.
        drop(leader);
        decision
    })
}

/// A check that makes its own call: what the call's future needs, and, with
/// coalescing, the key's turn. Once that call is over (or the check is dropped), the
/// checks that queued meanwhile go to Redis together, and so on until nobody waits.
struct Leader<T: Hosts + ?Sized> {
    store: Arc<T>,
    redis: Arc<RedisBackend>,
    redis_key: Vec<u8>,
    /// The key's hash in the coalescer, when this check took the key's turn.
    turn: Option<u128>,
}

impl<T: Hosts + ?Sized> Drop for Leader<T> {
    fn drop(&mut self) {
        let Some(hash) = self.turn else {
            return;
        };
        let waiting = self.store.remote().coalescer().next(hash);
        if waiting.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to call from: the waiting checks answer by the failure policy.
            for check in waiting {
                let _ = check.reply.send(None);
            }
            let _ = self.store.remote().coalescer().next(hash);
            return;
        };
        let store = Arc::clone(&self.store);
        let redis = Arc::clone(&self.redis);
        let redis_key = std::mem::take(&mut self.redis_key);
        runtime.spawn(calls(store, redis, redis_key, hash, waiting));
    }
}

/// One call per queue of waiting checks of `redis_key` (hashing to `hash`), until
/// nobody waits.
async fn calls<T: Hosts + ?Sized>(
    store: Arc<T>,
    redis: Arc<RedisBackend>,
    redis_key: Vec<u8>,
    hash: u128,
    mut waiting: Vec<Waiting>,
) {
    let remote = store.remote();
    let part = 2 + store.reply_len();
    let lockout = store.blocks().lockout_ms();
    // The limited key, read back from the Redis key (a set's other keys are built from it).
    let key = remote.key_of(&redis_key).map(|key| key.into_owned());
    while !waiting.is_empty() {
        let costs: Vec<u32> = waiting.iter().map(|check| check.cost.get()).collect();
        let count = costs.len() as u64;
        let call: Option<Call> = key
            .as_deref()
            .map(|key| engine_call(&*store, key, &redis_key, "m", count, lockout, &costs));
        let result = match &call {
            Some(call) => {
                let started = std::time::Instant::now();
                let result = redis.eval(call).await;
                remote.record_duration(started.elapsed());
                if let Err(error) = &result {
                    remote.record_error(error);
                }
                result.ok()
            }
            None => None,
        };
        match result {
            Some(reply) if reply.len() == part * waiting.len() => {
                for (check, part) in waiting.drain(..).zip(reply.chunks(part)) {
                    let _ = check.reply.send(Some(part.to_vec()));
                }
            }
            _ => {
                for check in waiting.drain(..) {
                    let _ = check.reply.send(None);
                }
            }
        }
        waiting = remote.coalescer().next(hash);
    }
}

/// A check of a limiter with leases: from the key's lease in process when it covers
/// the cost, else one round trip that takes a new lease (and gives an expired lease's
/// unused units back, in the background).
fn check_leased<T: Hosts + ?Sized>(
    store: &Arc<T>,
    leases: &Leases,
    redis: &Arc<RedisBackend>,
    key: &[u8],
    cost: NonZeroU32,
) -> Check {
    let remote = store.remote();
    let backend = remote.backend();
    // Borrowed, not cloned: no shared reference count touched per check.
    let local = &*backend.inner.local;
    let now_us = backend.clock().now_us();
    let lease_key = leases.key(local, key);
    let unused = match leases.take(local, lease_key, u64::from(cost.get()), now_us) {
        Take::Taken(left) => return Check::ready(lease::answer(store.capacity(), left)),
        Take::Missing(unused) => unused,
    };
    // An expired lease's unused tokens go back with the call that takes the next lease,
    // or by themselves (in the background) when this check makes no call.
    let unused = u32::try_from(unused).unwrap_or(u32::MAX);
    let give_back = |store: &Arc<T>| {
        if unused > 0 {
            let refund = operate(store, Operation::Refund, key, u64::from(unused));
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(refund);
            }
        }
    };
    if !redis.admit() {
        give_back(store);
        return Check::ready(unavailable(&**store, key, cost));
    }
    let redis_key = remote.redis_key(key);
    // A key Redis refused moments ago is refused here until then, as without leases.
    let deny_key = match cached_refusal(&**store, &redis_key) {
        Ok(deny_key) => deny_key,
        Err(refused) => {
            give_back(store);
            return Check::ready(refused);
        }
    };
    let call = engine_call(
        &**store,
        key,
        &redis_key,
        "l",
        u64::from(cost.get()),
        leases.size,
        &[unused],
    );
    let store = Arc::clone(store);
    let redis = Arc::clone(redis);
    let size = leases.size;
    Check::pending(async move {
        let remote = store.remote();
        let started = std::time::Instant::now();
        let result = redis.eval(&call).await;
        remote.record_duration(started.elapsed());
        // An admitted lease: `{1, 0, 1, left, taken, full in}`; the check keeps its
        // cost, the rest is the lease.
        if let Ok(reply) = &result {
            if let &[1, 0, 1, left, taken, full_us] = reply.as_slice() {
                let taken = u64::try_from(taken).unwrap_or(0).min(size.max(1));
                let backend = remote.backend();
                let leftover = taken.saturating_sub(u64::from(cost.get()));
                if let Some(leases) = store.leases() {
                    let now_us = backend.clock().now_us();
                    leases.keep(&backend.inner.local, lease_key, leftover, now_us);
                }
                let left = u64::try_from(left).unwrap_or(0);
                let state = if left + leftover == 0 {
                    State::HitQuota
                } else {
                    State::Allowed
                };
                let reset = Duration::from_micros(u64::try_from(full_us).unwrap_or(0));
                return Decision::new(
                    state,
                    store.capacity(),
                    left + leftover,
                    reset,
                    Source::Redis,
                );
            }
        }
        conclude(
            &*store,
            &redis,
            result.map_err(Some),
            &redis_key,
            cost,
            deny_key,
        )
    })
}
