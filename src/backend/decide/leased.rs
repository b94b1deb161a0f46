//! A check of a limiter with leases (`lease.rs`): answered from the key's lease in
//! process when it covers the cost, else by one round trip that takes a new lease
//! ([`check_leased`]); an expired lease's unused units go back with that call, or by
//! themselves when the check makes none ([`give_back`]).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::call::engine_call;
use super::hosts::Hosts;
use super::lease::{self, Leases, Take};
use super::policy::unavailable;
use super::protocol::Op;
use super::reply::{cached_refusal, conclude, forget_refusal, read_reply};
use crate::backend::redis::RedisBackend;
use crate::decision::{Decision, Priority, Source, State};
use crate::limiter::DecisionFuture;

/// A check of a limiter with leases: from the key's lease in process when it covers
/// the cost, else one round trip that takes a new lease (and gives an expired lease's
/// unused units back with it, or by themselves when this check makes no call).
pub(super) fn check_leased<T: Hosts + ?Sized>(
    store: &Arc<T>,
    leases: &Leases,
    redis: &Arc<RedisBackend>,
    key: &[u8],
    cost: NonZeroU32,
) -> DecisionFuture {
    let remote = store.remote();
    let backend = remote.backend();
    // Borrowed, not cloned: no shared reference count touched per check.
    let local = backend.local();
    let now_us = backend.clock().now_us();
    let lease_key = leases.key(local, key);
    let unused = match leases.take(local, lease_key, u64::from(cost.get()), now_us) {
        Take::Taken(left) => return DecisionFuture::ready(lease::answer(store.capacity(), left)),
        Take::Missing(unused) => unused,
    };
    let unused = u32::try_from(unused).unwrap_or(u32::MAX);
    if !redis.admit() {
        // Redis takes no call: the unused tokens go back to the in-process state.
        if unused > 0 {
            store.local_refund(key, unused);
        }
        return DecisionFuture::ready(unavailable(&**store, key, cost));
    }
    let redis_key = remote.redis_key(key);
    // A key Redis refused moments ago is refused here until then, as without leases.
    let deny_key = match cached_refusal(&**store, &redis_key) {
        Ok(deny_key) => deny_key,
        Err(refused) => {
            give_back(store, redis, key, &redis_key, unused);
            return DecisionFuture::ready(refused);
        }
    };
    let call = engine_call(
        &**store,
        key,
        &redis_key,
        Op::Lease,
        u64::from(cost.get()),
        leases.size,
        &[unused],
    );
    let store = Arc::clone(store);
    let redis = Arc::clone(redis);
    let size = leases.size;
    DecisionFuture::pending(async move {
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
                    leases.keep(backend.local(), lease_key, leftover, now_us);
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

/// Gives an expired lease's `unused` tokens back to `key` by themselves, as a handle's
/// refund does: to Redis in the background (forgetting the key's cached refusal, which
/// a refund may lift), or to the in-process state when that call fails.
fn give_back<T: Hosts + ?Sized>(
    store: &Arc<T>,
    redis: &Arc<RedisBackend>,
    key: &[u8],
    redis_key: &[u8],
    unused: u32,
) {
    let Some(units) = NonZeroU32::new(unused) else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    forget_refusal(&**store, redis_key);
    let lockout = store.blocks().lockout_ms();
    let call = engine_call(&**store, key, redis_key, Op::Refund, unused, lockout, &[]);
    let store = Arc::clone(store);
    let redis = Arc::clone(redis);
    let key = key.to_vec();
    runtime.spawn(async move {
        let reply = redis.eval(&call).await;
        if reply
            .ok()
            .and_then(|reply| read_reply(&*store, &reply, units, Priority::WHOLE))
            .is_none()
        {
            store.local_refund(&key, unused);
        }
    });
}
