//! One engine call and its answer, for every path (a check, a coalesced batch, a leased
//! check, a handle's operation): the call built ([`engine_call`]), the deny cache's
//! refusal ([`cached_refusal`]), the reply read ([`conclude`], [`read_reply`]) and,
//! when Redis does not answer, the failure policy ([`unavailable`]).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::call::Call;
use super::deny::Denied;
use super::engine::ENGINE;
use super::hosts::Hosts;
use super::redis::{Fault, RedisBackend, ScriptError};
use super::{FailurePolicy, TimeSource, DEFAULT_PROBE_INTERVAL};
use crate::decision::{Decision, Source, State};

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
        store.combine_members(&aged)
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
    Err(blocked(decision, us(denied.retry_us)))
}

/// One call of the engine for `key` (whose Redis key is `redis_key`): every limit's key
/// and the block key, then the head (one text `op:count:param`: `count` a cost, or how
/// many coalesced costs; `param` the lockout, a reservation's longest wait or a lease's
/// size), the limits' arguments (one text), each calendar window's four boundaries,
/// `extra` (the costs of coalesced checks; a lease's expired unused tokens), and the
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
    let remote = store.remote();
    let backend = remote.backend();
    let time = backend.inner.time;
    let limits = store.limit_count();
    let limit_args = remote.limit_args(|args| store.limit_args(args));
    let (args, bytes) = limit_args.size();
    // Room for the keys (a set's other keys about as long as the first), the head (three
    // numbers), the limits' argument, the extra numbers and the time.
    let functions = backend
        .redis_handle()
        .is_some_and(|redis| redis.engine_functions());
    let mut call = Call::engine(
        &ENGINE,
        time,
        functions,
        limits + 1,
        limits + 1 + 1 + args + extra.len() + 1,
        (limits + 1) * (redis_key.len() + 8) + 3 * 20 + bytes + extra.len() * 10 + 20,
    );
    call.key(redis_key);
    store.extra_keys(key, &mut call);
    call.written(|out| remote.block_layout.write_redis_key(key, out));
    call.written(|out| {
        // (Writing into the call's buffer does not fail.)
        let _ = write!(out, "{op}:{count}:{param}");
    });
    call.args(limit_args);
    // Calendar windows: their boundaries around this host's clock (the engine picks the
    // window of the time it reads: the server's, or the caller's sent below).
    let now_ms = i64::try_from(backend.caller_now_us() / 1_000).unwrap_or(i64::MAX);
    store.window_args(now_ms, &mut call);
    for &number in extra {
        call.arg(number);
    }
    if time == TimeSource::Caller {
        call.arg(backend.caller_now_us());
    }
    call
}

/// A check's decision from its part of the engine's reply (caching a refusal in the
/// deny cache), or, when the call failed (`Err(Some)`: the error; `Err(None)`: reported
/// by the call this check went with), from the failure policy.
pub(super) fn conclude<T: Hosts + ?Sized>(
    store: &T,
    redis: &Arc<RedisBackend>,
    reply: Result<Vec<i64>, Option<ScriptError>>,
    redis_key: &[u8],
    cost: NonZeroU32,
    deny_key: Option<u128>,
) -> Decision {
    let remote = store.remote();
    let error = match reply {
        Ok(reply) => match read_reply(store, &reply, cost) {
            Some(decision) => {
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
                    let locked_ms = reply.get(1).and_then(|&ms| u64::try_from(ms).ok());
                    if let (true, Some(ms @ 1..)) = (store.blocks().lockout_ms() > 0, locked_ms) {
                        until_us = until_us.min(at(Duration::from_millis(ms)));
                    }
                    let denied = Denied {
                        until_us,
                        retry_us: at(retry),
                        reset_us: at(decision.reset),
                        made_us: now_us,
                        members: store.member_decisions(reply.get(2..).unwrap_or_default(), cost),
                    };
                    deny.insert(hash, denied, now_us);
                }
                return decision;
            }
            None => Some(ScriptError::Reply(reply)),
        },
        Err(error) => error,
    };
    if let Some(error) = error {
        let fault = error.fault();
        crate::metrics::redis_error(&remote.name, fault.label());
        if fault == Fault::Key {
            redis.key_error(remote.backend.inner.deny.hash(redis_key), &error);
        }
    }
    // The key, read back from the Redis key (only on this failure path).
    let key = remote.layout().key_of(redis_key).unwrap_or_default();
    unavailable(store, &key, cost)
}

/// The engine's reply: `{admitted, blocked ms, each limit's reply}`.
pub(super) fn read_reply<T: Hosts + ?Sized>(
    store: &T,
    reply: &[i64],
    cost: NonZeroU32,
) -> Option<Decision> {
    let blocked_ms = u64::try_from(*reply.get(1)?).ok()?;
    let decision = store.decide(reply.get(2..)?, cost)?;
    Some(if blocked_ms > 0 {
        blocked(decision, Duration::from_millis(blocked_ms))
    } else {
        decision
    })
}

/// What a blocked key's check says before the block is applied, spending nothing: the
/// limit's refusal of `cost` if it would refuse it (so the wait is the longer of the
/// block's and the limit's own), else where the key stands (as the engine does).
pub(super) fn refusal_or_standing<T: Hosts + ?Sized>(
    store: &T,
    key: &[u8],
    cost: u32,
    source: Source,
) -> Decision {
    let decision = store.local(key, cost, source, false);
    if decision.is_admitted() {
        store.local(key, 0, source, false)
    } else {
        decision
    }
}

/// `decision` for a key blocked for `wait` more: refused, with nothing left until then.
pub(super) fn blocked(mut decision: Decision, wait: Duration) -> Decision {
    decision.state = State::OverQuota;
    decision.remaining = 0;
    decision.reset = decision.reset.max(wait);
    decision.retry_after = Some(decision.retry_after.map_or(wait, |r| r.max(wait)));
    decision
}

/// The answer while Redis is unreachable, by the layer's failure policy.
pub(super) fn unavailable<T: Hosts + ?Sized>(store: &T, key: &[u8], cost: NonZeroU32) -> Decision {
    let backend = &store.remote().backend;
    match backend.failover.policy {
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
        FailurePolicy::FailClosed => {
            let retry = backend
                .redis_handle()
                .map_or(DEFAULT_PROBE_INTERVAL, |r| r.probe_interval());
            Decision::new(
                State::OverQuota,
                store.capacity(),
                0,
                retry,
                Source::FailClosed,
            )
            .with_retry_after(retry)
        }
    }
}

/// A check on the in-process state: refused while the key is blocked (spending
/// nothing), and a refusal starts the limit's lockout.
pub(super) fn local_check<T: Hosts + ?Sized>(
    store: &T,
    key: &[u8],
    cost: u32,
    source: Source,
) -> Decision {
    let blocks = store.blocks();
    let local = &*store.remote().backend.inner.local;
    let now_us = || store.remote().backend.clock().now_us();
    if let Some(until) = blocks.until(local, key, now_us) {
        let decision = refusal_or_standing(store, key, cost, source);
        return blocked(
            decision,
            Duration::from_micros(until.saturating_sub(now_us())),
        );
    }
    let decision = store.local(key, cost, source, true);
    if decision.is_admitted() || decision.state == State::ExceedsCapacity {
        return decision;
    }
    let now = now_us();
    match blocks.lock_out(local, key, now) {
        Some(until) => blocked(decision, Duration::from_micros(until.saturating_sub(now))),
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
