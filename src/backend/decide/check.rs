//! A check's journey, top-down, each step a call down and back:
//!
//! 1. [`check`] routes it: a cost above capacity is refused at once; without Redis the
//!    in-process host answers ([`local_check`]); a token bucket with leases goes by
//!    [`check_leased`] (`leased.rs`); while the breaker keeps calls from Redis, the
//!    failure policy answers ([`unavailable`], `policy.rs`).
//! 2. The deny cache ([`cached_refusal`], `reply.rs`): a key Redis refused moments ago
//!    is refused without a round trip.
//! 3. Coalescing: a check of a key already in flight queues in the limiter's
//!    [`Coalescer`](super::coalesce::Coalescer), for at most the call timeout; the
//!    [`Leader`] of the key sends the queue with the next call when its own is over
//!    ([`calls`], `queued.rs`). Batching likewise: past the bound of a limiter's calls
//!    in flight to a node, a check queues in its [`Batcher`](super::batch::Batcher) and
//!    goes with the next batch ([`batches`], `queued.rs`).
//! 4. The engine call ([`engine_call`], `call.rs`): one round trip, `FCALL` or
//!    `EVALSHA`, on the connection `backend/redis` keeps and judges
//!    ([`RedisBackend::eval`]).
//! 5. The conclusion ([`conclude`], `reply.rs`): the reply read into a decision
//!    ([`read_reply`](super::reply::read_reply)), a refusal remembered in the deny cache
//!    (and a lockout written to the limit's list of blocked keys, in the background:
//!    `listing.rs`); a failed call answered by the failure policy ([`unavailable`]),
//!    which in [`FailurePolicy::Fallback`](crate::backend::FailurePolicy::Fallback) is
//!    the in-process host ([`local_check`]).
//!
//! The handles' other operations (`operate.rs`) take the same steps from there; nothing
//! here calls them. Each algorithm's two hosts are `hosts.rs`'s [`Hosts`].

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::batch::{self, Ask, Queued};
use super::call::{engine_call, engine_call_of};
use super::coalesce::{Part, Turn};
use super::hosts::Hosts;
use super::leased::check_leased;
use super::policy::{answering, local_check, unavailable, unavailable_priority};
use super::protocol::Op;
use super::queued::{batches, calls, queued_part};
use super::reply::{cached_refusal, conclude, read_reply, report};
use crate::backend::redis::fault::ScriptError;
use crate::backend::redis::RedisBackend;
use crate::decision::{Priority, Source};
use crate::limiter::DecisionFuture;

/// Answers a check from Redis when the breaker lets it through (one round trip, run by
/// SHA), by the layer's [`FailurePolicy`](crate::backend::FailurePolicy) otherwise; a
/// failed round trip is answered by the failure policy too, and counts toward the
/// breaker unless it concerns only its key. A key Redis refused recently is refused from
/// the deny cache without a round trip.
pub(crate) fn check<T: Hosts + ?Sized>(
    store: &Arc<T>,
    key: &[u8],
    cost: NonZeroU32,
) -> DecisionFuture {
    let remote = store.remote();
    let backend = &remote.backend;
    let redis = backend.redis_handle();
    if u64::from(cost.get()) > store.capacity() {
        return DecisionFuture::ready(store.exceeds_capacity(answering(redis)));
    }
    let Some(redis) = redis else {
        let whole = Priority::WHOLE;
        return DecisionFuture::ready(local_check(
            &**store,
            key,
            cost.get(),
            whole,
            Source::InProcess,
        ));
    };
    if let Some(leases) = store.leases() {
        return check_leased(store, leases, redis, key, cost);
    }
    if !redis.admit() {
        return DecisionFuture::ready(unavailable(&**store, key, cost));
    }
    let redis_key = remote.redis_key(key);
    let deny_key = match cached_refusal(&**store, &redis_key) {
        Ok(deny_key) => deny_key,
        Err(refused) => return DecisionFuture::ready(refused),
    };
    // Coalescing: while another check of this key is in flight, this one goes with the
    // key's next call.
    let mut turn = None;
    if backend.coalesces() {
        let hash = deny_key.unwrap_or_else(|| backend.deny().hash(&redis_key));
        match remote.coalescer.turn(hash, cost) {
            Turn::Wait(part) => return wait_for_key(store, redis, part, redis_key, cost, deny_key),
            Turn::Lead => turn = Some(hash),
        }
    }
    let mut leader = Leader::of_key(store, redis, redis_key, turn);
    // Batching: past the bound of calls in flight, the check goes with the next batch.
    let after = backend.batch_after();
    if after > 0 {
        let route = redis.route(&leader.redis_key);
        let queued = |reply| Queued {
            redis_key: leader.redis_key.clone(),
            ask: Ask::Check(cost),
            reply,
        };
        let deadline = redis.call_timeout();
        match remote.batcher.turn(route, after, deadline, queued) {
            batch::Turn::Queued(part) => {
                return wait_for_batch(leader, part, deadline, cost, deny_key)
            }
            batch::Turn::Call => leader.route = Some(route),
        }
    }
    call_redis(leader, key, cost, deny_key)
}

/// [`check`] for a request of a priority class that may use `priority` of each limit:
/// on Redis, the engine's `h` (one round trip: each limit admits when the cost and what
/// the class leaves to others fit, and spends the cost), answering the class's
/// remaining. A cost above the class's part of the capacity can never be admitted.
/// Such a check takes no shortcut that would answer for another class (no lease, no
/// coalescing; it goes in a batch as an item of its own), and its refusal is neither remembered in the deny cache nor
/// a lockout (it did not use the limit up); a refusal the deny cache holds is the
/// limit's, and refuses every class. The fallback applies the class's part to the limits
/// in force.
pub(crate) fn check_priority<T: Hosts + ?Sized>(
    store: &Arc<T>,
    key: &[u8],
    cost: NonZeroU32,
    priority: Priority,
) -> DecisionFuture {
    if priority.is_whole() {
        return check(store, key, cost);
    }
    let remote = store.remote();
    let redis = remote.backend.redis_handle();
    if u64::from(cost.get()) > priority.allowed(store.capacity()) {
        return DecisionFuture::ready(store.exceeds_capacity(answering(redis)));
    }
    let Some(redis) = redis else {
        return DecisionFuture::ready(local_check(
            &**store,
            key,
            cost.get(),
            priority,
            Source::InProcess,
        ));
    };
    if !redis.admit() {
        return DecisionFuture::ready(unavailable_priority(&**store, key, cost, priority));
    }
    let redis_key = remote.redis_key(key);
    if let Err(refused) = cached_refusal(&**store, &redis_key) {
        return DecisionFuture::ready(refused);
    }
    // Batching, as a check's: past the bound of calls in flight, it goes with the next
    // batch (an item that carries its keeps); else its own call holds a turn.
    let mut route = None;
    let after = remote.backend.batch_after();
    if after > 0 {
        let on = redis.route(&redis_key);
        let deadline = redis.call_timeout();
        let queued = |reply| Queued {
            redis_key: redis_key.clone(),
            ask: Ask::Priority(cost, priority),
            reply,
        };
        match remote.batcher.turn(on, after, deadline, queued) {
            batch::Turn::Queued(part) => {
                let store = Arc::clone(store);
                let redis = Arc::clone(redis);
                return DecisionFuture::pending(async move {
                    let part = queued_part(part, deadline).await;
                    conclude_priority(&*store, &redis, part, &redis_key, cost, priority)
                });
            }
            batch::Turn::Call => route = Some(Leader::of_route(store, redis, on)),
        }
    }
    let keeps = store.keeps(priority);
    let keys = [(key, &redis_key[..])];
    let call = engine_call_of(&**store, &keys, Op::Priority, cost, 0, &keeps);
    let store = Arc::clone(store);
    let redis = Arc::clone(redis);
    DecisionFuture::pending(async move {
        let started = std::time::Instant::now();
        let result = redis.eval(&call).await;
        let elapsed = started.elapsed();
        store.remote().record_duration(elapsed);
        if let Some(leader) = route {
            // The checks that queued for this route meanwhile go now.
            store.remote().batcher.observe(elapsed);
            leader.hand_over();
        }
        let result = result.map_err(Some);
        conclude_priority(&*store, &redis, result, &redis_key, cost, priority)
    })
}

/// A priority class's check concluded from its reply (its own call's, or its part of a
/// batch), or, when the call failed (`Err(Some)`: the error; `Err(None)`: reported by
/// the batch), by the failure policy; nothing goes into the deny cache.
fn conclude_priority<T: Hosts + ?Sized, R: std::ops::Deref<Target = [i64]>>(
    store: &T,
    redis: &Arc<RedisBackend>,
    reply: Result<R, Option<ScriptError>>,
    redis_key: &[u8],
    cost: NonZeroU32,
    priority: Priority,
) -> crate::decision::Decision {
    let error = match reply {
        Ok(reply) => match read_reply(store, &reply, cost, priority) {
            Some(decision) => return decision,
            None => Some(ScriptError::Reply(reply.to_vec())),
        },
        Err(error) => error,
    };
    if let Some(error) = error {
        report(store, redis, redis_key, &error);
    }
    // The key, read back from the Redis key (only on this failure path).
    let key = store
        .remote()
        .layout()
        .key_of(redis_key)
        .unwrap_or_default();
    unavailable_priority(store, &key, cost, priority)
}

/// A check of a key another check's call is in flight for: its part of the key's next
/// call, waited for no longer than for a call of its own (the failure policy answers
/// then; the call's own failure is the leader's to report).
fn wait_for_key<T: Hosts + ?Sized>(
    store: &Arc<T>,
    redis: &Arc<RedisBackend>,
    part: oneshot::Receiver<Part>,
    redis_key: Vec<u8>,
    cost: NonZeroU32,
    deny_key: Option<u128>,
) -> DecisionFuture {
    let store = Arc::clone(store);
    let redis = Arc::clone(redis);
    let deadline = redis.call_timeout();
    DecisionFuture::pending(async move {
        let part = queued_part(part, deadline).await;
        conclude(&*store, &redis, part, &redis_key, cost, deny_key)
    })
}

/// A check queued for its route's next batch: its part of it, waited for no longer than
/// `deadline`, as for a call of its own (the failure policy answers then); a batch's
/// failure is reported by the batch, a key's error by this check. The checks of its key
/// that queued meanwhile go after it.
fn wait_for_batch<T: Hosts + ?Sized>(
    leader: Leader<T>,
    part: oneshot::Receiver<Part>,
    deadline: Duration,
    cost: NonZeroU32,
    deny_key: Option<u128>,
) -> DecisionFuture {
    DecisionFuture::pending(async move {
        let part = queued_part(part, deadline).await;
        let decision = conclude(
            &*leader.store,
            &leader.redis,
            part,
            &leader.redis_key,
            cost,
            deny_key,
        );
        leader.hand_over();
        decision
    })
}

/// A check's own call of the engine: one round trip, timed (for the batcher too when
/// the call holds a turn of its route), and concluded; then the checks that queued
/// meanwhile go.
fn call_redis<T: Hosts + ?Sized>(
    leader: Leader<T>,
    key: &[u8],
    cost: NonZeroU32,
    deny_key: Option<u128>,
) -> DecisionFuture {
    // Only a check that goes to Redis itself builds the call.
    let store = &*leader.store;
    let lockout = store.blocks().lockout_ms();
    let call = engine_call(
        store,
        key,
        &leader.redis_key,
        Op::Check,
        u64::from(cost.get()),
        lockout,
        &[],
    );
    DecisionFuture::pending(async move {
        let remote = leader.store.remote();
        let started = std::time::Instant::now();
        let result = leader.redis.eval(&call).await;
        let elapsed = started.elapsed();
        remote.metrics.duration(&remote.name, elapsed);
        if leader.route.is_some() {
            remote.batcher.observe(elapsed);
        }
        let decision = conclude(
            &*leader.store,
            &leader.redis,
            result.map_err(Some),
            &leader.redis_key,
            cost,
            deny_key,
        );
        // The checks that queued meanwhile go now.
        leader.hand_over();
        decision
    })
}

/// A check (or a settlement) that makes its own call: what the call's future needs,
/// and the turns it holds (the key's in the coalescer, a call's on the batcher's route).
/// Once that call is over, [`hand_over`](Self::hand_over) sends the checks that queued
/// meanwhile to Redis together, and so on until nobody waits.
pub(super) struct Leader<T: Hosts + ?Sized> {
    store: Arc<T>,
    redis: Arc<RedisBackend>,
    redis_key: Vec<u8>,
    /// The key's hash in the coalescer, when this check took the key's turn.
    turn: Option<u128>,
    /// The route of the batcher (see `batch.rs`) this check made a call on.
    route: Option<u16>,
}

impl<T: Hosts + ?Sized> Leader<T> {
    /// A check's call for `redis_key`, leading the key's coalesced checks when it took
    /// the key's `turn` (its hash in the coalescer); no route's turn yet.
    fn of_key(
        store: &Arc<T>,
        redis: &Arc<RedisBackend>,
        redis_key: Vec<u8>,
        turn: Option<u128>,
    ) -> Self {
        Self {
            store: Arc::clone(store),
            redis: Arc::clone(redis),
            redis_key,
            turn,
            route: None,
        }
    }

    /// A call on the batcher's `route` that leads no key's coalesced checks (a
    /// settlement's).
    pub(super) fn of_route(store: &Arc<T>, redis: &Arc<RedisBackend>, route: u16) -> Self {
        Self {
            store: Arc::clone(store),
            redis: Arc::clone(redis),
            redis_key: Vec::new(),
            turn: None,
            route: Some(route),
        }
    }

    /// The call is over: the checks queued meanwhile go now, in tasks of their own (the
    /// route's next batches, the key's next coalesced calls), or, without a runtime to
    /// call from, answer by the failure policy.
    pub(super) fn hand_over(mut self) {
        self.release();
    }

    /// [`hand_over`](Self::hand_over)'s work, done once: it takes the turns, so that the
    /// drop after it finds none.
    fn release(&mut self) {
        if let Some(route) = self.route.take() {
            // The checks of other keys queued meanwhile go now, together.
            let batch = self.store.remote().batcher.next(route);
            if !batch.is_empty() {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let store = Arc::clone(&self.store);
                    let redis = Arc::clone(&self.redis);
                    runtime.spawn(batches(store, redis, route, batch));
                } else {
                    // No runtime to call from: the queued checks answer by the failure
                    // policy, and so do any queued after them.
                    let mut batch = batch;
                    while !batch.is_empty() {
                        for check in batch {
                            let _ = check.reply.send(Err(None));
                        }
                        batch = self.store.remote().batcher.next(route);
                    }
                }
            }
        }
        let Some(hash) = self.turn.take() else {
            return;
        };
        let waiting = self.store.remote().coalescer().next(hash);
        if waiting.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to call from: the waiting checks answer by the failure policy.
            for check in waiting {
                let _ = check.reply.send(Err(None));
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

/// Drop guard: a leader dropped before [`Leader::hand_over`] (its check cancelled
/// mid-call) hands over all the same, or the checks queued behind it would never go.
impl<T: Hosts + ?Sized> Drop for Leader<T> {
    fn drop(&mut self) {
        self.release();
    }
}
