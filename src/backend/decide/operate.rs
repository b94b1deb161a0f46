//! The operations on a key other than a check, for the limiter handles: peek, refund,
//! settle, reset, block, unblock and reserve, each one engine call on Redis (or answered by the
//! in-process state while Redis cannot). They take a check's steps (`check.rs`), from
//! the same files: the engine call (`call.rs`), the reply (`reply.rs`), the failure
//! policy (`policy.rs`), in the same order; with a token bucket's leases, a peek may
//! answer from this process's lease, and a block or a reset ends it (a block giving its
//! unused tokens back first, a second call). A block or a reset that Redis made is then
//! written to the limit's list of blocked keys (`listing.rs`), one more call, before the
//! handle's answer; [`list_blocked`] reads that list (or, in process, the blocks'
//! registry).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::batch::{self, Ask, Queued};
use super::call::engine_call;
use super::check::Leader;
use super::hosts::Hosts;
use super::lease;
use super::listing::MAX_LISTED;
use super::policy::{answering, no_share, refused_until_probe, unavailable};
use super::protocol::Op;
use super::queued::queued_part;
use super::reply::{forget_refusal, read_reply, report};
use crate::backend::redis::fault::ScriptError;
use crate::backend::FailurePolicy;
use crate::blocked::{Blocked, Listing};
use crate::decision::{Decision, Priority, Source};
use crate::key::Key;
use crate::limiter::DecisionFuture;

/// What [`operate`] does to a key, besides a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// Says what a check of the cost would answer, spending nothing.
    Peek,
    /// Gives the cost back.
    Refund,
    /// Settles a request to what it really cost: `delta` units more than it spent
    /// (spent whatever the limit says: above the limit, the key owes them), or fewer
    /// (given back).
    Settle { delta: i64 },
    /// Forgets the key (and lifts its block).
    Reset,
    /// Refuses the key for the cost, in milliseconds.
    Block,
    /// Lifts the key's block, keeping what its limits have counted.
    Unblock,
    /// Takes the cost at the earliest time it fits, at most this many µs away (token
    /// buckets only; see [`Hosts::local_reserve`]).
    Reserve { max_wait_us: u64 },
}

impl Operation {
    /// The engine's operation for it.
    fn op(self) -> Op {
        match self {
            Self::Peek => Op::Peek,
            Self::Refund => Op::Refund,
            Self::Settle { .. } => Op::Settle,
            Self::Reset => Op::Reset,
            Self::Block => Op::Block,
            Self::Unblock => Op::Unblock,
            Self::Reserve { .. } => Op::Reserve,
        }
    }
}

/// Runs `op` on `key`: on Redis when the breaker lets calls through (one round trip,
/// the engine's same script), in the in-process state otherwise. The answer is what a
/// check of `cost` would say (peek), or where the key stands after the change (refund,
/// reset). A refund or a reset also forgets the key's cached refusal.
pub(crate) fn operate<T: Hosts + ?Sized>(
    store: &Arc<T>,
    op: Operation,
    key: &[u8],
    cost: u64,
) -> DecisionFuture {
    let remote = store.remote();
    let backend = &remote.backend();
    let redis = backend.redis_handle();
    if matches!(op, Operation::Peek | Operation::Reserve { .. }) && cost > store.capacity() {
        return DecisionFuture::ready(store.exceeds_capacity(answering(redis)));
    }
    let Some(redis) = redis else {
        return DecisionFuture::ready(operate_locally(&**store, op, key, cost, Source::InProcess));
    };
    // This process's lease of the key (token buckets with leases; see `lease.rs`): a
    // peek answers from it as a check would; a block or a reset ends it, so that no
    // leased token is answered past the block or on top of the fresh bucket. A block's
    // unused tokens go back to the bucket (as an expiring lease's do), a reset's are
    // forgotten (the bucket starts full).
    let mut unused = 0;
    if let Some(leases) = store.leases() {
        let local = backend.local();
        let lease_key = leases.key(local, key);
        match op {
            Operation::Peek => {
                let now_us = backend.clock().now_us();
                if let Some(left) = leases.peek(local, lease_key, cost, now_us) {
                    return DecisionFuture::ready(lease::answer(store.capacity(), left));
                }
            }
            Operation::Block => unused = leases.end(local, lease_key),
            Operation::Reset => {
                leases.end(local, lease_key);
            }
            _ => {}
        }
    }
    if !redis.admit() {
        // Redis cannot take a block's unused tokens back now: they are forgotten.
        return DecisionFuture::ready(operate_unavailable(&**store, op, key, cost));
    }
    let redis_key = remote.redis_key(key);
    if op != Operation::Peek {
        forget_refusal(&**store, &redis_key);
    }
    let param = match op {
        Operation::Reserve { max_wait_us } => max_wait_us,
        _ => store.blocks().lockout_ms(),
    };
    // Batching (`batch.rs`): past the bound of calls in flight, a settlement goes with
    // the next batch of the limiter's checks, as a check does (it settles what a check
    // spent: as many of them at saturation); its own call holds a turn like a check's.
    let mut leader = None;
    let after = backend.batch_after();
    if let (Operation::Settle { delta }, 1..) = (op, after) {
        let route = redis.route(&redis_key);
        let deadline = redis.call_timeout();
        let queued = |reply| Queued {
            redis_key: redis_key.clone(),
            ask: Ask::Settle(delta),
            reply,
        };
        match remote.batcher.turn(route, after, deadline, queued) {
            batch::Turn::Queued(part) => {
                // Its wait: no longer than for a call of its own (then settled in
                // process, as a failed call's settlement is; its key's error reported
                // here, a batch's by the batch).
                let store = Arc::clone(store);
                let redis = Arc::clone(redis);
                let key = key.to_vec();
                return DecisionFuture::pending(async move {
                    let part = queued_part(part, deadline).await;
                    let decision = part.map(|reply| {
                        read_reply(&*store, &reply, NonZeroU32::MIN, Priority::WHOLE)
                            .ok_or_else(|| ScriptError::Reply(reply.to_vec()))
                    });
                    match decision {
                        Ok(Ok(decision)) => decision,
                        Ok(Err(error)) | Err(Some(error)) => {
                            report(&*store, &redis, &redis_key, &error);
                            operate_unavailable(&*store, op, &key, cost)
                        }
                        Err(None) => operate_unavailable(&*store, op, &key, cost),
                    }
                });
            }
            batch::Turn::Call => leader = Some(Leader::of_route(store, redis, route)),
        }
    }
    let call = match op {
        Operation::Settle { delta } => {
            engine_call(&**store, key, &redis_key, op.op(), delta, param, &[])
        }
        _ => engine_call(&**store, key, &redis_key, op.op(), cost, param, &[]),
    };
    // A block's unused leased tokens go back first, so that its answer counts them.
    let give_back = (unused > 0)
        .then(|| engine_call(&**store, key, &redis_key, Op::Refund, unused, param, &[]));
    // (A reset or unblocked key's hash in the deny cache: the list forgets its lockout
    // by it.)
    let key_hash = matches!(op, Operation::Reset | Operation::Unblock)
        .then(|| backend.deny().hash(&redis_key));
    let store = Arc::clone(store);
    let redis = Arc::clone(redis);
    let key = key.to_vec();
    DecisionFuture::pending(async move {
        if let Some(give_back) = give_back {
            // Lost with a failed call, as an expired lease's would be.
            let _ = redis.eval(&give_back).await;
        }
        let started = std::time::Instant::now();
        let result = redis.eval(&call).await;
        if let Some(leader) = leader {
            store.remote().batcher.observe(started.elapsed());
            // (A settlement's turn: the items queued meanwhile go now.)
            leader.hand_over();
        }
        let reply = result.as_ref().ok();
        let decision = reply.and_then(|reply| {
            let cost = u32::try_from(cost).ok().and_then(NonZeroU32::new);
            read_reply(
                &*store,
                reply,
                cost.unwrap_or(NonZeroU32::MIN),
                Priority::WHOLE,
            )
        });
        match (&result, &decision) {
            (Err(error), _) => report(&*store, &redis, &redis_key, error),
            (Ok(reply), None) => {
                report(
                    &*store,
                    &redis,
                    &redis_key,
                    &ScriptError::Reply(reply.clone()),
                );
            }
            (Ok(_), Some(_)) => {}
        }
        // Redis made the change: the list of blocked keys follows, before the answer
        // (a failed write is logged, never this operation's failure).
        let blocked_ms = reply.and_then(|reply| reply.get(1).copied());
        let remote = store.remote();
        let now_ms = remote.backend().clock().now_us() / 1_000;
        match (
            op,
            &decision,
            blocked_ms.and_then(|ms| u64::try_from(ms).ok()),
        ) {
            (Operation::Block, Some(_), Some(ms @ 1..)) => {
                let until_ms = now_ms.saturating_add(ms);
                remote.index.list(&redis, &key, until_ms, now_ms).await;
            }
            (Operation::Reset | Operation::Unblock, Some(_), _) => {
                let hash = key_hash.unwrap_or_default();
                remote.index.unlist(&redis, &key, hash, now_ms).await;
            }
            _ => {}
        }
        decision.unwrap_or_else(|| operate_unavailable(&*store, op, &key, cost))
    })
}

/// [`operate`] while Redis cannot answer: a reservation admits, so it follows the
/// layer's failure policy as a check does; the other operations act on the in-process
/// state.
fn operate_unavailable<T: Hosts + ?Sized>(
    store: &T,
    op: Operation,
    key: &[u8],
    cost: u64,
) -> Decision {
    let policy = store.remote().backend().failover.policy;
    match (op, policy) {
        (Operation::Reserve { .. }, FailurePolicy::FailOpen | FailurePolicy::FailClosed) => {
            let cost = u32::try_from(cost).ok().and_then(NonZeroU32::new);
            unavailable(store, key, cost.unwrap_or(NonZeroU32::MIN))
        }
        // No share of the limit here: a peek or a reservation says what a check would.
        (Operation::Peek | Operation::Reserve { .. }, _) if no_share(store) => {
            refused_until_probe(store, Source::Fallback)
        }
        _ => operate_locally(store, op, key, cost, Source::Fallback),
    }
}

/// [`operate`] on the in-process state.
fn operate_locally<T: Hosts + ?Sized>(
    store: &T,
    op: Operation,
    key: &[u8],
    cost: u64,
    source: Source,
) -> Decision {
    let local = store.remote().backend().local();
    let units = u32::try_from(cost).unwrap_or(u32::MAX);
    let now_us = store.remote().backend().clock().now_us();
    // The key's block before the operation (read once; only a reset or a block change
    // it, and they read it again below).
    let until = store.blocks().until(local, key, || now_us);
    let decision = match op {
        // While blocked, a peek or a reservation says what a check would (below).
        Operation::Peek | Operation::Reserve { .. } if until.is_some() => None,
        Operation::Peek => Some(store.local(key, units, source, false)),
        Operation::Refund => {
            store.local_refund(key, units);
            None
        }
        Operation::Settle { delta } => {
            store.local_settle(key, delta);
            None
        }
        Operation::Reset => {
            store.local_reset(key);
            store.blocks().unblock(local, key);
            None
        }
        Operation::Unblock => {
            store.blocks().unblock(local, key);
            None
        }
        Operation::Block => {
            let until = now_us.saturating_add(cost.saturating_mul(1_000));
            store.blocks().block(local, key, until, true, now_us);
            None
        }
        Operation::Reserve { max_wait_us } => {
            match store.local_reserve(key, units, max_wait_us, source) {
                Some(decision) => return decision,
                None => Some(store.local(key, units, source, false)),
            }
        }
    };
    let until = match op {
        Operation::Reset | Operation::Unblock | Operation::Block => {
            store.blocks().until(local, key, || now_us)
        }
        _ => until,
    };
    // What a check of the cost would say (a peek, a reservation), or where the key stands
    // after the change; blocked while the key is.
    let cost = match op {
        Operation::Peek | Operation::Reserve { .. } => units,
        _ => 0,
    };
    match until {
        Some(until) => {
            let wait = Duration::from_micros(until - now_us);
            store.local_blocked(key, cost, Priority::WHOLE, source, wait)
        }
        None => decision.unwrap_or_else(|| store.local(key, 0, source, false)),
    }
}

/// Each limit's own answer to a peek of `cost` (a [set](crate::LimitSet)'s limits, in order),
/// spending nothing: the engine's when Redis answers (blocked while the key is), else
/// the in-process state's. `None` for one limit.
pub(crate) async fn peek_each<T: Hosts + ?Sized>(
    store: Arc<T>,
    key: Vec<u8>,
    cost: NonZeroU32,
) -> Option<Vec<Decision>> {
    let remote = store.remote();
    let backend = remote.backend();
    let Some(redis) = backend.redis_handle() else {
        return store.local_members(&key, cost.get(), Source::InProcess);
    };
    if redis.admit() {
        let redis_key = remote.redis_key(&key);
        let lockout = store.blocks().lockout_ms();
        let call = engine_call(
            &*store,
            &key,
            &redis_key,
            Op::Peek,
            cost.get(),
            lockout,
            &[],
        );
        let result = redis.eval(&call).await;
        if let Err(error) = &result {
            report(&*store, redis, &redis_key, error);
        }
        if let Ok(reply) = result {
            let blocked_ms = reply.get(1).and_then(|&ms| u64::try_from(ms).ok());
            let members = reply
                .get(2..)
                .and_then(|limits| store.member_decisions(limits, cost));
            if let (Some(blocked_ms), Some(members)) = (blocked_ms, members) {
                let wait = Duration::from_millis(blocked_ms);
                let each = members.iter().cloned();
                return Some(if wait.is_zero() {
                    each.collect()
                } else {
                    each.map(|member| member.blocked(wait)).collect()
                });
            }
        }
    }
    store.local_members(&key, cost.get(), Source::Fallback)
}

/// The keys of `store`'s limit (named `name`) blocked now, soonest end first, at most
/// `max` (and [`MAX_LISTED`]): from the limit's list on Redis (`listing.rs`; an error
/// when Redis does not answer), from the blocks' registry in process, each entry as the
/// block itself says.
pub(crate) fn list_blocked<T: Hosts + ?Sized>(store: &Arc<T>, name: &str, max: usize) -> Listing {
    let max = max.min(MAX_LISTED);
    let remote = store.remote();
    let backend = remote.backend();
    let now_us = backend.clock().now_us();
    let Some(redis) = backend.redis_handle() else {
        let blocks = store.blocks();
        let local = backend.local();
        let mut listed: Vec<Blocked> = blocks
            .registry()
            .list(now_us)
            .into_iter()
            .filter_map(|(key, _)| {
                let until_us = blocks.until(local, &key, || now_us)?;
                let until = UNIX_EPOCH.checked_add(Duration::from_micros(until_us))?;
                Some(Blocked::new(name, Key::from(key), until))
            })
            .collect();
        crate::blocked::sort(&mut listed);
        listed.truncate(max);
        return Box::pin(std::future::ready(Ok(listed)));
    };
    let read = remote.index.read(redis, now_us / 1_000, max);
    let name = name.to_owned();
    Box::pin(async move {
        let mut listed: Vec<Blocked> = read
            .await?
            .into_iter()
            // (An end past what the platform's time can hold, written by someone else
            // under the list's key, is left out rather than a panic.)
            .filter_map(|(key, until_ms)| {
                let until = UNIX_EPOCH.checked_add(Duration::from_millis(until_ms))?;
                Some(Blocked::new(name.clone(), Key::from(key), until))
            })
            .collect();
        crate::blocked::sort(&mut listed);
        Ok(listed)
    })
}
