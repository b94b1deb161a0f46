//! The calls of what queued while a call was in flight, which the call's
//! [`Leader`](super::check::Leader) starts when it is over: a key's coalesced checks, one
//! call per queue ([`calls`], `coalesce.rs`), and a route's batches of checks and
//! settlements of many keys ([`batches`], `batch.rs`); and a queued item's wait for
//! its part ([`queued_part`]).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::batch::{Ask, Queued};
use super::call::{engine_call, engine_call_of};
use super::coalesce::{Part, Share, Waiting};
use super::hosts::Hosts;
use super::protocol::{batch_numbers, Op};
use crate::backend::redis::call::Call;
use crate::backend::redis::fault::ScriptError;
use crate::backend::redis::RedisBackend;

/// One call per queue of waiting checks of `redis_key` (hashing to `hash`), until
/// nobody waits.
pub(super) async fn calls<T: Hosts + ?Sized>(
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
            (Op::SharedCoalesced, &one)
        } else {
            each = waiting.iter().map(|check| check.cost.get()).collect();
            (Op::Coalesced, &each)
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

/// Sends `batch`, checks of this limiter's keys queued for `route` (see `batch.rs`),
/// then each batch queued meanwhile, until nobody waits.
pub(super) async fn batches<T: Hosts + ?Sized>(
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
        if asks.iter().any(|ask| matches!(ask, Ask::Priority(..))) {
            // A priority class's item carries its limits' keeps; the checks of one class
            // that all cost the same send theirs once too.
            if asks.iter().all(|ask| *ask == asks[0]) {
                let text = [item_text(&**store, asks[0])];
                engine_call_of(
                    &**store,
                    &pairs,
                    Op::SharedBatch,
                    batch.len(),
                    lockout,
                    &text,
                )
            } else {
                let texts: Vec<Vec<u8>> =
                    asks.iter().map(|ask| item_text(&**store, *ask)).collect();
                engine_call_of(&**store, &pairs, Op::Batch, batch.len(), lockout, &texts)
            }
        } else if matches!(asks[0], Ask::Check(_)) && asks.iter().all(|ask| *ask == asks[0]) {
            engine_call_of(
                &**store,
                &pairs,
                Op::SharedBatch,
                batch.len(),
                lockout,
                &asks[..1],
            )
        } else {
            engine_call_of(&**store, &pairs, Op::Batch, batch.len(), lockout, &asks)
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
                    Ask::Check(cost) => engine_call(
                        &**store,
                        &key,
                        redis_key,
                        Op::Check,
                        cost.get(),
                        lockout,
                        &[],
                    ),
                    Ask::Settle(delta) => {
                        engine_call(&**store, &key, redis_key, Op::Settle, delta, lockout, &[])
                    }
                    Ask::Priority(cost, priority) => {
                        let keeps = store.keeps(priority);
                        let keys = [(&key[..], &redis_key[..])];
                        engine_call_of(&**store, &keys, Op::Priority, cost.get(), 0, &keeps)
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

/// A queued item's part of its batch (a check's or a settlement's, `batch.rs`; a
/// coalesced check's, `coalesce.rs`), waited for no longer than `deadline`:
/// `Err(None)` when it did not come in time or its call failed (which the call reported).
pub(super) async fn queued_part(part: oneshot::Receiver<Part>, deadline: Duration) -> Part {
    match tokio::time::timeout(deadline, part).await {
        Ok(Ok(part)) => part,
        _ => Err(None),
    }
}

/// An item's text in a batch, for a limiter whose hosts are `store`: as
/// [`Ask`]'s `ToRedisArgs` writes it, or for a priority class's check `h`, its cost, then
/// each limit's keep ([`Hosts::keeps`]), after a `:` each (`h1:40:12`).
fn item_text<T: Hosts + ?Sized>(store: &T, ask: Ask) -> Vec<u8> {
    let Ask::Priority(cost, priority) = ask else {
        return deadpool_redis::redis::ToRedisArgs::to_redis_args(&ask).concat();
    };
    let mut digits = itoa::Buffer::new();
    let mut text = b"h".to_vec();
    text.extend_from_slice(digits.format(cost.get()).as_bytes());
    for keep in store.keeps(priority) {
        text.push(b':');
        text.extend_from_slice(digits.format(keep).as_bytes());
    }
    text
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
