//! A check's journey, top-down in this one file, each step a call down and back:
//!
//! 1. [`check`] routes it: a cost above capacity is refused at once; without Redis the
//!    in-process host answers ([`local_check`]); a token bucket with leases goes by
//!    [`check_leased`]; while the breaker keeps calls from Redis, the failure policy
//!    answers ([`unavailable`]).
//! 2. The deny cache ([`cached_refusal`]): a key Redis refused moments ago is refused
//!    without a round trip.
//! 3. Coalescing: a check of a key already in flight queues in the limiter's
//!    [`Coalescer`](super::coalesce::Coalescer), for at most the call timeout; the
//!    [`Leader`] of the key sends the queue with the next call when its own is over
//!    ([`calls`]).
//! 4. The engine call ([`engine_call`]): one round trip, `FCALL` or `EVALSHA`, on the
//!    connection the Redis room keeps and judges ([`RedisBackend::eval`]).
//! 5. The conclusion ([`conclude`]): the reply read into a decision ([`read_reply`]),
//!    a refusal remembered in the deny cache (and a lockout written to the limit's list
//!    of blocked keys, in the background: `listing.rs`); a failed call answered by the failure
//!    policy ([`unavailable`]), which in [`FailurePolicy::Fallback`] is the in-process
//!    host ([`local_check`]).
//!
//! The handles' other operations (`operate.rs`) take the same steps from here; nothing
//! here calls them. Each algorithm's two hosts are `hosts.rs`'s [`Hosts`].

use std::num::NonZeroU32;
use std::ops::{Deref, Range};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::batch::{self, Ask, Queued};
use super::coalesce::{Part, Share, Turn, Waiting};
use super::deny::Denied;
use super::engine::{
    batch_numbers, BATCH, CHECK, COALESCED, ENGINE, LEASE, PEEK, REFUND, SETTLE, SHARED_BATCH,
    SHARED_COALESCED,
};
use super::hosts::Hosts;
use super::lease::{self, Leases, Take};
use crate::backend::redis::call::Call;
use crate::backend::redis::fault::{Fault, ScriptError};
use crate::backend::redis::time::TimeSource;
use crate::backend::redis::RedisBackend;
use crate::backend::{FailurePolicy, DEFAULT_PROBE_INTERVAL};
use crate::decision::{Decision, Source, State};
use crate::limiter::DecisionFuture;
use deadpool_redis::redis::ToRedisArgs;

/// Answers a check from Redis when the breaker lets it through (one round trip, run by
/// SHA), by the layer's [`FailurePolicy`] otherwise; a failed round trip is answered by
/// the failure policy too, and counts toward the breaker unless it concerns only its key.
/// A key Redis refused recently is refused from the deny cache without a round trip.
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
        return DecisionFuture::ready(local_check(&**store, key, cost.get(), Source::InProcess));
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
    let turn = if backend.inner.coalesce {
        let hash = deny_key.unwrap_or_else(|| backend.inner.deny.hash(&redis_key));
        match remote.coalescer.turn(hash, cost) {
            Turn::Wait(part) => {
                // Another check of this key is in flight: this one goes with the next call,
                // and waits for it no longer than for a call of its own (the failure policy
                // answers then; the call's own failure is the leader's to report).
                let store = Arc::clone(store);
                let redis = Arc::clone(redis);
                let deadline = redis.call_timeout();
                return DecisionFuture::pending(async move {
                    let part = queued_part(part, deadline).await;
                    conclude(&*store, &redis, part, &redis_key, cost, deny_key)
                });
            }
            Turn::Lead => Some(hash),
        }
    } else {
        None
    };
    // Batching: past the bound of calls in flight, the check goes with the next batch.
    let after = backend.inner.batch_after;
    let route = (after > 0).then(|| redis.route(&redis_key));
    if let Some(route) = route {
        let queued = |reply| Queued {
            redis_key: redis_key.clone(),
            ask: Ask::Check(cost),
            reply,
        };
        let deadline = redis.call_timeout();
        if let batch::Turn::Queued(part) = remote.batcher.turn(route, after, deadline, queued) {
            // Its wait: no longer than for a call of its own (the failure policy answers
            // then); a batch's failure is reported by the batch, a key's error by
            // this check.
            let leader = Leader {
                store: Arc::clone(store),
                redis: Arc::clone(redis),
                redis_key,
                turn,
                route: None,
            };
            return DecisionFuture::pending(async move {
                let part = queued_part(part, deadline).await;
                let decision = conclude(
                    &*leader.store,
                    &leader.redis,
                    part,
                    &leader.redis_key,
                    cost,
                    deny_key,
                );
                drop(leader);
                decision
            });
        }
    }
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
        route,
    };
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
        // The checks of this key that queued meanwhile go now.
        drop(leader);
        decision
    })
}

/// A check of a limiter with leases: from the key's lease in process when it covers
/// the cost, else one round trip that takes a new lease (and gives an expired lease's
/// unused units back with it, or by themselves when this check makes no call).
fn check_leased<T: Hosts + ?Sized>(
    store: &Arc<T>,
    leases: &Leases,
    redis: &Arc<RedisBackend>,
    key: &[u8],
    cost: NonZeroU32,
) -> DecisionFuture {
    let remote = store.remote();
    let backend = remote.backend();
    // Borrowed, not cloned: no shared reference count touched per check.
    let local = &*backend.inner.local;
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
        LEASE,
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
    let call = engine_call(&**store, key, redis_key, REFUND, unused, lockout, &[]);
    let store = Arc::clone(store);
    let redis = Arc::clone(redis);
    let key = key.to_vec();
    runtime.spawn(async move {
        let reply = redis.eval(&call).await;
        if reply
            .ok()
            .and_then(|reply| read_reply(&*store, &reply, units))
            .is_none()
        {
            store.local_refund(&key, unused);
        }
    });
}

/// The deny cache's entry for `redis_key`: `Err` with the refusal when Redis refused the
/// key moments ago until a time not reached yet; else `Ok` with the key's hash in the
/// cache (to remember a refusal to come), or `None` when the cache is off. (A refusal
/// is the rare, flooded case: its size does not matter.)
#[allow(clippy::result_large_err)]
pub(super) fn cached_refusal<T: Hosts + ?Sized>(
    store: &T,
    redis_key: &[u8],
) -> Result<Option<u128>, Decision> {
    let backend = store.remote().backend();
    let deny = &backend.inner.deny;
    if !deny.is_enabled() {
        return Ok(None);
    }
    let hash = deny.hash(redis_key);
    let now_us = backend.clock().now_us();
    let Some(denied) = deny.get(hash, now_us) else {
        return Ok(Some(hash));
    };
    if denied.limit != store.capacity() {
        // Refused under another limit of the key (a dynamic limit changed): Redis decides.
        deny.remove(hash);
        return Ok(Some(hash));
    }
    let us = |t: u64| Duration::from_micros(t.saturating_sub(now_us));
    // A set's limits as Redis gave them, aged by the time since: every limit in the
    // headers, as in Redis's answer.
    let elapsed = Duration::from_micros(now_us.saturating_sub(denied.made_us));
    let combined = denied.members.as_deref().and_then(|members| {
        let aged: Vec<Decision> = members
            .iter()
            .map(|member| {
                let mut member = member.clone();
                member.reset = member.reset.saturating_sub(elapsed);
                member.retry_after = member.retry_after.map(|r| r.saturating_sub(elapsed));
                member.source = Source::DenyCache;
                member
            })
            .collect();
        if denied.blocked_until_us > now_us {
            store.combine_members_blocked(&aged, us(denied.blocked_until_us))
        } else {
            store.combine_members(&aged)
        }
    });
    let decision = combined.unwrap_or_else(|| {
        Decision::new(
            State::OverQuota,
            store.capacity(),
            0,
            us(denied.reset_us),
            Source::DenyCache,
        )
    });
    Err(decision.blocked(us(denied.retry_us)))
}

/// Forgets the deny cache's refusal of `redis_key`: a refund, a reset, a block or a
/// reservation changes what Redis would answer.
pub(super) fn forget_refusal<T: Hosts + ?Sized>(store: &T, redis_key: &[u8]) {
    let deny = &store.remote().backend().inner.deny;
    if deny.is_enabled() {
        deny.remove(deny.hash(redis_key));
    }
}

/// A check (or a settlement) that makes its own call: what the call's future needs,
/// and, with coalescing, the key's turn. Once that call is over (or the check is
/// dropped), the checks that queued meanwhile go to Redis together, and so on until
/// nobody waits.
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
}

impl<T: Hosts + ?Sized> Drop for Leader<T> {
    fn drop(&mut self) {
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
    let lockout = store.blocks().lockout_ms();
    // The limited key, read back from the Redis key (a set's other keys are built from it).
    let key = remote.key_of(&redis_key).map(|key| key.into_owned());
    while !waiting.is_empty() {
        // Checks that stopped waiting (past their deadline, or dropped) go in no call.
        waiting.retain(|check| !check.reply.is_closed());
        if waiting.is_empty() {
            waiting = remote.coalescer().next(hash);
            continue;
        }
        let count = waiting.len() as u64;
        // Checks that all cost the same (a hot key's, mostly) send their cost once: Redis
        // spends about a microsecond per argument of a call.
        let one = [waiting[0].cost.get()];
        let each: Vec<u32>;
        let (op, costs): (_, &[u32]) = if waiting.iter().all(|check| check.cost.get() == one[0]) {
            (SHARED_COALESCED, &one)
        } else {
            each = waiting.iter().map(|check| check.cost.get()).collect();
            (COALESCED, &each)
        };
        // The reply: each check's in its own item, as a batch's (`engine.lua`, op `m`).
        let call: Option<Call> = key.as_deref().map(|key| {
            let mut call = engine_call(&*store, key, &redis_key, op, count, lockout, costs);
            call.reading(batch_numbers);
            call
        });
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
        let ranges = result.and_then(|flat| {
            let ranges = split_batch(&flat, waiting.len())?;
            Some(Share::split(flat, ranges))
        });
        match ranges {
            Some(parts) => {
                for (check, part) in waiting.drain(..).zip(parts) {
                    let _ = check.reply.send(Ok(part));
                }
            }
            None => {
                for check in waiting.drain(..) {
                    let _ = check.reply.send(Err(None));
                }
            }
        }
        waiting = remote.coalescer().next(hash);
    }
}

/// One call of the engine for `key` (whose Redis key is `redis_key`): every limit's key
/// and the block key, then the head (one text `op:count:param`: `count` a cost, or how
/// many coalesced costs; `param` the lockout, a reservation's longest wait or a lease's
/// size), the limits' arguments (one text), each calendar window's four boundaries,
/// `extra` (the costs of coalesced checks; a lease's expired unused tokens; a batch's
/// items), and the
/// caller's time when the backend sends it. The one place that lays out `engine.lua`'s
/// `ARGV`.
pub(super) fn engine_call<T: Hosts + ?Sized>(
    store: &T,
    key: &[u8],
    redis_key: &[u8],
    op: &str,
    count: impl std::fmt::Display,
    param: u64,
    extra: &[u32],
) -> Call {
    engine_call_of(store, &[(key, redis_key)], op, count, param, extra)
}

/// [`engine_call`] for the keys of several checks (`(key, Redis key)` each, a batch's:
/// each check's keys in turn, see `batch` in `engine.lua`), with `extra` of any kind
/// of argument (a batch's: its items, [`Ask`]).
fn engine_call_of<T: Hosts + ?Sized, E: ToRedisArgs>(
    store: &T,
    keys: &[(&[u8], &[u8])],
    op: &str,
    count: impl std::fmt::Display,
    param: u64,
    extra: &[E],
) -> Call {
    let remote = store.remote();
    let backend = remote.backend();
    let time = backend.inner.time;
    let limits = store.limit_count();
    let limit_args = remote.limit_args(|args| store.limit_args(args));
    let (args, bytes) = limit_args.size();
    let key_bytes: usize = keys.iter().map(|(_, redis_key)| redis_key.len() + 8).sum();
    // Room for the keys (a set's other keys about as long as the first), the head (three
    // numbers), the limits' argument, the extra numbers and the time.
    let functions = backend
        .redis_handle()
        .is_some_and(|redis| redis.engine_functions());
    let mut call = Call::engine(
        &ENGINE,
        time,
        functions,
        // A peek writes nothing: a read-only replica or a server out of memory runs it.
        op == PEEK,
        (limits + 1) * keys.len(),
        (limits + 1) * keys.len() + 1 + args + extra.len() + 1,
        (limits + 1) * key_bytes + 3 * 20 + bytes + extra.len() * 21 + 20,
    );
    for &(key, redis_key) in keys {
        call.key(redis_key);
        store.extra_keys(key, &mut call);
        call.written(|out| remote.block_layout.write_redis_key(key, out));
    }
    call.written(|out| {
        // (Writing into the call's buffer does not fail.)
        let _ = write!(out, "{op}:{count}:{param}");
    });
    call.args(limit_args);
    // Calendar windows: their boundaries around this host's clock (the engine picks the
    // window of the time it reads: the server's, or the caller's sent below).
    let now_ms = i64::try_from(backend.caller_now_us() / 1_000).unwrap_or(i64::MAX);
    store.window_args(now_ms, &mut call);
    for number in extra {
        call.arg(number);
    }
    if time == TimeSource::Caller {
        call.arg(backend.caller_now_us());
    }
    call
}

/// Sends `batch`, checks of this limiter's keys queued for `route` (see `batch.rs`),
/// then each batch queued meanwhile, until nobody waits.
async fn batches<T: Hosts + ?Sized>(
    store: Arc<T>,
    redis: Arc<RedisBackend>,
    route: u16,
    mut batch: Vec<Queued>,
) {
    while !batch.is_empty() {
        send_batch(&store, &redis, batch).await;
        batch = store.remote().batcher.next(route);
    }
}

/// One call for the checks of `batch` (engine op `k`; a check alone, its own call),
/// each check's reply sent to it (a check whose key raised an error in the script gets
/// none, and so the failure policy's answer; the others are decided). When a proxy
/// refuses the call for spanning slots (`CROSSSLOT`: nothing ran), each check makes its
/// own call, and the limiter stops batching.
async fn send_batch<T: Hosts + ?Sized>(
    store: &Arc<T>,
    redis: &Arc<RedisBackend>,
    batch: Vec<Queued>,
) {
    let remote = store.remote();
    let lockout = store.blocks().lockout_ms();
    // Each check's key, read back from its Redis key (a set's other keys are built from it).
    let keys: Vec<(std::borrow::Cow<'_, [u8]>, &[u8])> = batch
        .iter()
        .filter_map(|check| Some((remote.key_of(&check.redis_key)?, &check.redis_key[..])))
        .collect();
    if keys.len() != batch.len() || batch.len() == 1 {
        // (A key not of this limiter cannot be queued: each alone, as a check alone.)
        drop(keys);
        return alone(store, redis, batch).await;
    }
    let mut call = {
        let pairs: Vec<(&[u8], &[u8])> = keys.iter().map(|(key, rk)| (&key[..], *rk)).collect();
        let asks: Vec<Ask> = batch.iter().map(|item| item.ask).collect();
        // Checks that all cost the same send their cost once.
        if matches!(asks[0], Ask::Check(_)) && asks.iter().all(|ask| *ask == asks[0]) {
            engine_call_of(
                &**store,
                &pairs,
                SHARED_BATCH,
                batch.len(),
                lockout,
                &asks[..1],
            )
        } else {
            engine_call_of(&**store, &pairs, BATCH, batch.len(), lockout, &asks)
        }
    };
    call.reading(batch_numbers);
    drop(keys);
    let started = std::time::Instant::now();
    let result = redis.eval_checks(&call, batch.len()).await;
    remote.record_duration(started.elapsed());
    remote.batcher.observe(started.elapsed());
    match result {
        Ok(flat) => match split_batch(&flat, batch.len()) {
            Some(ranges) => {
                for (check, part) in batch.into_iter().zip(Share::split(flat, ranges)) {
                    let part = if part.is_empty() {
                        // The item raised an error (its key's value): its own to report.
                        Err(Some(ScriptError::Unreadable))
                    } else {
                        Ok(part)
                    };
                    let _ = check.reply.send(part);
                }
            }
            None => {
                for check in batch {
                    let _ = check.reply.send(Err(None));
                }
            }
        },
        Err(error) if error.code() == Some("CROSSSLOT") => {
            tracing::warn!(
                limiter = %remote.name,
                "the server refused a batch of keys in several slots: this limiter's checks \
                 now make one call each"
            );
            remote.batcher.refuse();
            alone(store, redis, batch).await;
        }
        Err(error) => {
            remote.record_error(&error);
            for check in batch {
                let _ = check.reply.send(Err(None));
            }
        }
    }
}

/// Each check (settlement) of `batch` in its own call, all at once (a call's error goes
/// to its check, which reports it as a check of its own does).
async fn alone<T: Hosts + ?Sized>(store: &Arc<T>, redis: &Arc<RedisBackend>, batch: Vec<Queued>) {
    let remote = store.remote();
    let lockout = store.blocks().lockout_ms();
    let calls = batch.into_iter().map(|check| async move {
        let reply = match remote.key_of(&check.redis_key) {
            Some(key) => {
                let redis_key = &check.redis_key;
                let call = match check.ask {
                    Ask::Check(cost) => {
                        engine_call(&**store, &key, redis_key, CHECK, cost.get(), lockout, &[])
                    }
                    Ask::Settle(delta) => {
                        engine_call(&**store, &key, redis_key, SETTLE, delta, lockout, &[])
                    }
                };
                let started = std::time::Instant::now();
                let result = redis.eval(&call).await;
                remote.record_duration(started.elapsed());
                result.map(Share::whole).map_err(Some)
            }
            None => Err(None),
        };
        let _ = check.reply.send(reply);
    });
    futures_util::future::join_all(calls).await;
}

/// A batch's reply, read by [`batch_numbers`], split into its `count` checks' replies:
/// where each is in it, or `None` when it is not of that shape.
fn split_batch(flat: &[i64], count: usize) -> Option<Vec<Range<usize>>> {
    let mut parts = Vec::with_capacity(count);
    let mut at = 0;
    while let Some(&len) = flat.get(at) {
        let start = at + 1;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|&end| end <= flat.len())?;
        parts.push(start..end);
        at = end;
    }
    (parts.len() == count).then_some(parts)
}

/// A check's decision from its part of the engine's reply (caching a refusal in the
/// deny cache), or, when the call failed (`Err(Some)`: the error; `Err(None)`: reported
/// by the call this check went with), from the failure policy.
fn conclude<T: Hosts + ?Sized, R: Deref<Target = [i64]>>(
    store: &T,
    redis: &Arc<RedisBackend>,
    reply: Result<R, Option<ScriptError>>,
    redis_key: &[u8],
    cost: NonZeroU32,
    deny_key: Option<u128>,
) -> Decision {
    let remote = store.remote();
    let error = match reply {
        Ok(reply) => match read_reply(store, &reply, cost) {
            Some(decision) => {
                // A refusal that locked the key out: listed in the background.
                let locked_ms = reply.get(1).and_then(|&ms| u64::try_from(ms).ok());
                if let (true, Some(ms @ 1..)) = (store.blocks().lockout_ms() > 0, locked_ms) {
                    if let Some(key) = remote.key_of(redis_key) {
                        let backend = remote.backend();
                        let hash = backend.inner.deny.hash(redis_key);
                        let now_ms = backend.clock().now_us() / 1_000;
                        let until_ms = now_ms.saturating_add(ms);
                        remote
                            .index
                            .list_lockout(redis, &key, hash, until_ms, now_ms);
                    }
                }
                if let (Some(hash), Some(retry), 1) = (deny_key, decision.retry_after, cost.get()) {
                    let backend = &remote.backend;
                    let deny = &backend.inner.deny;
                    let now_us = backend.clock().now_us();
                    let at = |d: Duration| {
                        now_us.saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
                    };
                    // With a lockout, only a refusal decided by Redis starts one: the
                    // cache answers no longer than the running lock, so that the next
                    // refusal after it goes to Redis and locks the key out again.
                    let mut until_us = deny.answer_until(now_us, at(retry));
                    if let (true, Some(ms @ 1..)) = (store.blocks().lockout_ms() > 0, locked_ms) {
                        until_us = until_us.min(at(Duration::from_millis(ms)));
                    }
                    let denied = Denied {
                        until_us,
                        retry_us: at(retry),
                        reset_us: at(decision.reset),
                        blocked_until_us: locked_ms
                            .filter(|&ms| ms > 0)
                            .map_or(0, |ms| at(Duration::from_millis(ms))),
                        made_us: now_us,
                        members: store.member_decisions(reply.get(2..).unwrap_or_default(), cost),
                        limit: store.capacity(),
                    };
                    deny.insert(hash, denied, now_us);
                }
                return decision;
            }
            None => Some(ScriptError::Reply(reply.to_vec())),
        },
        Err(error) => error,
    };
    if let Some(error) = error {
        report(store, redis, redis_key, &error);
    }
    // The key, read back from the Redis key (only on this failure path).
    let key = remote.layout().key_of(redis_key).unwrap_or_default();
    unavailable(store, &key, cost)
}

/// Reports a call's failure for `redis_key` (a check's, an operation's): counted by its
/// fault, and a key's own fault logged for that key (once a while per key).
pub(super) fn report<T: Hosts + ?Sized>(
    store: &T,
    redis: &RedisBackend,
    redis_key: &[u8],
    error: &ScriptError,
) {
    let remote = store.remote();
    let fault = error.fault();
    crate::metrics::redis_error(&remote.name, fault.label());
    if fault == Fault::Key {
        redis.key_error(remote.backend.inner.deny.hash(redis_key), error);
    }
}

/// A queued item's part of its batch (a check's or a settlement's, `batch.rs`; a
/// coalesced check's, `coalesce.rs`), waited for no longer than `deadline`:
/// `Err(None)` when it did not come in time or its call failed (which the call reported).
pub(super) async fn queued_part(part: oneshot::Receiver<Part>, deadline: Duration) -> Part {
    match tokio::time::timeout(deadline, part).await {
        Ok(Ok(part)) => part,
        _ => Err(None),
    }
}

/// The engine's reply: `{admitted, blocked ms, each limit's reply}`.
pub(super) fn read_reply<T: Hosts + ?Sized>(
    store: &T,
    reply: &[i64],
    cost: NonZeroU32,
) -> Option<Decision> {
    let blocked_ms = u64::try_from(*reply.get(1)?).ok()?;
    let limits = reply.get(2..)?;
    if blocked_ms > 0 {
        store.decide_blocked(limits, cost, Duration::from_millis(blocked_ms))
    } else {
        store.decide(limits, cost)
    }
}

/// The answer while Redis is unreachable, by the layer's failure policy.
pub(super) fn unavailable<T: Hosts + ?Sized>(store: &T, key: &[u8], cost: NonZeroU32) -> Decision {
    let backend = &store.remote().backend;
    match backend.failover.policy {
        FailurePolicy::Fallback if no_share(store) => refused_until_probe(store, Source::Fallback),
        FailurePolicy::Fallback => local_check(store, key, cost.get(), Source::Fallback),
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
/// nothing), and a refusal starts the limit's lockout.
fn local_check<T: Hosts + ?Sized>(store: &T, key: &[u8], cost: u32, source: Source) -> Decision {
    let blocks = store.blocks();
    let local = &*store.remote().backend.inner.local;
    let now_us = || store.remote().backend.clock().now_us();
    if let Some(until) = blocks.until(local, key, now_us) {
        let wait = Duration::from_micros(until.saturating_sub(now_us()));
        return store.local_blocked(key, cost, source, wait);
    }
    let decision = store.local(key, cost, source, true);
    if decision.is_admitted() || decision.state == State::ExceedsCapacity {
        return decision;
    }
    let now = now_us();
    match blocks.lock_out(local, key, now) {
        // (The refusal spent nothing: the key stands where the refusal found it.)
        Some(until) => {
            let wait = Duration::from_micros(until.saturating_sub(now));
            store.local_blocked(key, cost, source, wait)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_reply_splits_into_its_checks_shares_or_none() {
        let flat = vec![2, 1, 0, 0, 3, 1, 0, 7];
        let ranges = split_batch(&flat, 3).expect("three items");
        assert_eq!(ranges, vec![1..3, 4..4, 5..8]);
        let shares: Vec<Vec<i64>> = Share::split(flat.clone(), ranges)
            .map(|share| share.to_vec())
            .collect();
        assert_eq!(shares, vec![vec![1, 0], vec![], vec![1, 0, 7]]);
        // Another count, a length past the end, a negative length: not of that shape.
        assert_eq!(split_batch(&flat, 2), None);
        assert_eq!(split_batch(&[3, 1, 0], 1), None);
        assert_eq!(split_batch(&[-1, 1], 1), None);
        assert_eq!(split_batch(&[], 0), Some(vec![]));
    }
}
