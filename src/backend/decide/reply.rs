//! A check's answer from Redis: a refusal the deny cache remembers, before any call
//! ([`cached_refusal`]; [`forget_refusal`] when a change makes it stale), or the call's
//! reply ([`conclude`]): read into a decision ([`read_reply`]), a refusal remembered in
//! the deny cache and a lockout listed (`listing.rs`); a failure reported ([`report`])
//! and answered by the failure policy (`policy.rs`).

use std::num::NonZeroU32;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use super::deny::Denied;
use super::hosts::Hosts;
use super::policy::unavailable;
use super::protocol::Reply;
use crate::backend::redis::fault::{Fault, ScriptError};
use crate::backend::redis::RedisBackend;
use crate::decision::{Decision, Priority, Source, State};

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
    let deny = backend.deny();
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
    let deny = store.remote().backend().deny();
    if deny.is_enabled() {
        deny.remove(deny.hash(redis_key));
    }
}

/// A check's decision from its part of the engine's reply (caching a refusal in the
/// deny cache), or, when the call failed (`Err(Some)`: the error; `Err(None)`: reported
/// by the call this check went with), from the failure policy.
pub(super) fn conclude<T: Hosts + ?Sized, R: Deref<Target = [i64]>>(
    store: &T,
    redis: &Arc<RedisBackend>,
    reply: Result<R, Option<ScriptError>>,
    redis_key: &[u8],
    cost: NonZeroU32,
    deny_key: Option<u128>,
) -> Decision {
    let remote = store.remote();
    let error = match reply {
        Ok(reply) => match read_reply(store, &reply, cost, Priority::WHOLE) {
            Some(decision) => {
                // A refusal that locked the key out: listed in the background.
                let locked_ms = reply.get(1).and_then(|&ms| u64::try_from(ms).ok());
                if let (true, Some(ms @ 1..)) = (store.blocks().lockout_ms() > 0, locked_ms) {
                    if let Some(key) = remote.key_of(redis_key) {
                        let backend = remote.backend();
                        let hash = backend.deny().hash(redis_key);
                        let now_ms = backend.clock().now_us() / 1_000;
                        let until_ms = now_ms.saturating_add(ms);
                        remote
                            .index
                            .list_lockout(redis, &key, hash, until_ms, now_ms);
                    }
                }
                if let (Some(hash), Some(retry), 1) = (deny_key, decision.retry_after, cost.get()) {
                    let backend = &remote.backend;
                    let deny = backend.deny();
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
        redis.key_error(remote.backend.deny().hash(redis_key), error);
    }
}

/// The engine's reply ([`Reply`]) read into a decision, of a priority class of
/// `priority` (the whole limit for any check but the engine's `h`).
pub(super) fn read_reply<T: Hosts + ?Sized>(
    store: &T,
    reply: &[i64],
    cost: NonZeroU32,
    priority: Priority,
) -> Option<Decision> {
    let reply = Reply::read(reply)?;
    if reply.blocked_ms > 0 {
        let blocked = Duration::from_millis(reply.blocked_ms);
        store.decide_blocked(reply.limits, cost, blocked)
    } else if priority.is_whole() {
        store.decide(reply.limits, cost)
    } else {
        store.decide_priority(reply.limits, cost, priority)
    }
}
