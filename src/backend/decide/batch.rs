//! Batching: once enough calls of one limiter are in flight to a Redis node (on Redis
//! Cluster, to one slot), its checks of other keys (and its settlements) queue, and each
//! time one of those calls returns the queue goes to Redis in one script call (engine
//! op `k`), which decides each check (and settles each settlement) exactly as its own
//! call would.
//!
//! The coalescer (`coalesce.rs`) shares calls among checks of one key; this shares them
//! among keys: a check here is one that leads its key. The fixed cost of a call in Redis
//! (parsing it, running the function, its reply) is then paid once per batch: at high
//! load Redis decides more checks per second, and a queued check waits for a call that
//! was ahead of it at Redis anyway.

use std::io::Write;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use deadpool_redis::redis::{RedisWrite, ToRedisArgs};
use tokio::sync::oneshot;

use super::coalesce::Part;
use crate::decision::Priority;

/// The most checks one call carries (the rest go with the next).
pub(crate) const MAX_BATCH: usize = 128;

/// One limiter's calls in flight per route (a node, or a Cluster slot: see
/// [`RedisBackend::route`](crate::backend::redis::RedisBackend::route)) and the checks
/// queued for the next call.
#[derive(Debug, Default)]
pub(crate) struct Batcher {
    routes: DashMap<u16, Route>,
    /// Set when a server refused a batch for its keys (a proxy that wants every call's
    /// keys in one slot): each check then makes its own call.
    refused: AtomicBool,
    /// The round trip of this limiter's calls lately, in µs (a moving average; 0 before
    /// the first): a queued check waits for a call in flight and then its own, so checks
    /// queue only while that fits well within their deadline.
    round_trip_us: AtomicU64,
}

#[derive(Debug, Default)]
struct Route {
    in_flight: usize,
    queue: Vec<Queued>,
}

/// A check (or a settlement) waiting for the next call of its route.
#[derive(Debug)]
pub(crate) struct Queued {
    /// The check's Redis key.
    pub(crate) redis_key: Vec<u8>,
    pub(crate) ask: Ask,
    /// Gets the check's part of the batch.
    pub(crate) reply: oneshot::Sender<Part>,
}

/// What a queued item asks of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A check of the cost.
    Check(NonZeroU32),
    /// A settlement by the delta (see `Operation::Settle`).
    Settle(i64),
    /// A check of the cost by a priority class (the engine's `h`).
    Priority(NonZeroU32, Priority),
}

impl ToRedisArgs for Ask {
    /// Its text in a batch (see `batch` in `engine.lua`): a check's cost, a settlement's
    /// delta after an `s`; a priority class's check, its cost after an `h` (its keeps
    /// are the limiter's: `item_text` in `queued.rs`).
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut digits = itoa::Buffer::new();
        match *self {
            Self::Check(cost) => out.write_arg(digits.format(cost.get()).as_bytes()),
            Self::Priority(cost, _) => {
                let mut arg = out.writer_for_next_arg();
                let _ = arg.write_all(b"h");
                let _ = arg.write_all(digits.format(cost.get()).as_bytes());
            }
            Self::Settle(delta) => {
                let mut arg = out.writer_for_next_arg();
                let _ = arg.write_all(b"s");
                let _ = arg.write_all(digits.format(delta).as_bytes());
            }
        }
    }
}

/// What a check does: make its own call, or wait for a batch.
pub(crate) enum Turn {
    /// Fewer than the bound of calls in flight: this check makes its own call, and
    /// must call [`Batcher::next`] when it returns.
    Call,
    /// The bound is reached: the check's reply comes from a later batch.
    Queued(oneshot::Receiver<Part>),
}

impl Batcher {
    /// Takes a turn on `route` with at most `after` calls in flight: a call of its own,
    /// or a place in the queue (built by `queued` only then).
    /// Checks queue only while two round trips take at most a quarter of
    /// `call_timeout` (so a far Redis, whose checks would then wait past their deadline,
    /// never batches), and not before a first call has returned.
    pub(crate) fn turn(
        &self,
        route: u16,
        after: usize,
        call_timeout: Duration,
        queued: impl FnOnce(oneshot::Sender<Part>) -> Queued,
    ) -> Turn {
        let round_trip_us = self.round_trip_us.load(Ordering::Relaxed);
        let timeout_us = u64::try_from(call_timeout.as_micros()).unwrap_or(u64::MAX);
        let near = round_trip_us > 0 && round_trip_us.saturating_mul(8) <= timeout_us;
        let mut route = self.routes.entry(route).or_default();
        if route.in_flight < after || !near || self.refused.load(Ordering::Relaxed) {
            route.in_flight += 1;
            return Turn::Call;
        }
        let (tx, rx) = oneshot::channel();
        route.queue.push(queued(tx));
        Turn::Queued(rx)
    }

    /// After a call on `route` returned: the checks queued meanwhile (at most
    /// [`MAX_BATCH`]), which the caller sends in its next call, or none, and then the
    /// call is no longer in flight. Checks that stopped waiting are left out.
    pub(crate) fn next(&self, route: u16) -> Vec<Queued> {
        let mut batch = Vec::new();
        self.routes.remove_if_mut(&route, |_, route| {
            route.queue.retain(|check| !check.reply.is_closed());
            if route.queue.is_empty() {
                route.in_flight -= 1;
                return route.in_flight == 0;
            }
            if route.queue.len() <= MAX_BATCH {
                batch = std::mem::take(&mut route.queue);
            } else {
                batch = route.queue.drain(..MAX_BATCH).collect();
            }
            false
        });
        batch
    }

    /// Records a call's round trip (a moving average of a quarter's weight; the first
    /// is taken as it is).
    pub(crate) fn observe(&self, elapsed: Duration) {
        let sample = u64::try_from(elapsed.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let _ = self
            .round_trip_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |average| {
                Some(if average == 0 {
                    sample
                } else {
                    average - average / 4 + sample / 4
                })
            });
    }

    /// Stops batching for this limiter: a server refused a call for spanning slots.
    pub(crate) fn refuse(&self) {
        self.refused.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::decide::coalesce::Share;

    /// A call timeout of 100 ms.
    const MS: Duration = Duration::from_millis(100);

    /// A batcher whose calls took 1 ms.
    fn near() -> Batcher {
        let batcher = Batcher::default();
        batcher.observe(Duration::from_millis(1));
        batcher
    }

    fn queued(tx: oneshot::Sender<Part>) -> Queued {
        Queued {
            redis_key: b"k".to_vec(),
            ask: Ask::Check(NonZeroU32::MIN),
            reply: tx,
        }
    }

    #[test]
    fn calls_go_at_once_up_to_the_bound_then_queue_until_one_returns() {
        let batcher = near();
        assert!(matches!(batcher.turn(0, 2, MS, queued), Turn::Call));
        assert!(matches!(batcher.turn(0, 2, MS, queued), Turn::Call));
        let Turn::Queued(mut first) = batcher.turn(0, 2, MS, queued) else {
            panic!("a third check goes with a batch");
        };
        let Turn::Queued(_second) = batcher.turn(0, 2, MS, queued) else {
            panic!("so does a fourth");
        };
        // Another route (a Cluster slot) has its own calls.
        assert!(matches!(batcher.turn(7, 2, MS, queued), Turn::Call));
        // A call returns: the two queued checks go in its place, still two in flight.
        let batch = batcher.next(0);
        assert_eq!(batch.len(), 2);
        let Turn::Queued(_third) = batcher.turn(0, 2, MS, queued) else {
            panic!("a check arriving meanwhile queues");
        };
        for check in batch {
            let _ = check.reply.send(Ok(Share::whole(vec![1])));
        }
        assert_eq!(first.try_recv().unwrap().ok().as_deref(), Some(&[1][..]));
        // The batch returns: the check queued meanwhile goes next.
        assert_eq!(batcher.next(0).len(), 1);
        // Nobody waits: the calls end, and the route is free.
        assert!(batcher.next(0).is_empty());
        assert!(batcher.next(0).is_empty());
        assert!(batcher.routes.get(&0).is_none());
        assert!(matches!(batcher.turn(0, 2, MS, queued), Turn::Call));
    }

    #[test]
    fn a_check_that_stopped_waiting_goes_in_no_batch() {
        let batcher = near();
        assert!(matches!(batcher.turn(0, 1, MS, queued), Turn::Call));
        let Turn::Queued(gone) = batcher.turn(0, 1, MS, queued) else {
            panic!("queued");
        };
        drop(gone);
        assert!(batcher.next(0).is_empty());
        assert!(batcher.routes.get(&0).is_none());
    }

    #[test]
    fn a_batch_carries_at_most_its_bound() {
        let batcher = near();
        assert!(matches!(batcher.turn(0, 1, MS, queued), Turn::Call));
        let waiting: Vec<_> = (0..MAX_BATCH + 3)
            .map(|_| batcher.turn(0, 1, MS, queued))
            .collect();
        assert_eq!(batcher.next(0).len(), MAX_BATCH);
        assert_eq!(batcher.next(0).len(), 3);
        drop(waiting);
    }

    #[test]
    fn a_far_redis_or_none_heard_from_yet_never_batches() {
        let batcher = Batcher::default();
        for _ in 0..3 {
            assert!(matches!(batcher.turn(0, 1, MS, queued), Turn::Call));
        }
        // Round trips of 20 ms against a deadline of 100 ms: two of them plus the wait
        // for the call in flight would come too near it.
        batcher.observe(Duration::from_millis(20));
        assert!(matches!(batcher.turn(0, 1, MS, queued), Turn::Call));
        // Near again: the average comes down.
        for _ in 0..20 {
            batcher.observe(Duration::from_micros(200));
        }
        assert!(matches!(batcher.turn(0, 1, MS, queued), Turn::Queued(_)));
    }

    #[test]
    fn an_item_is_a_cost_or_a_delta_after_an_s() {
        let text = |ask: Ask| ask.to_redis_args();
        assert_eq!(
            text(Ask::Check(NonZeroU32::new(7).unwrap())),
            [b"7".to_vec()]
        );
        assert_eq!(text(Ask::Settle(-3)), [b"s-3".to_vec()]);
        assert_eq!(text(Ask::Settle(12)), [b"s12".to_vec()]);
    }

    #[test]
    fn once_refused_every_check_makes_its_own_call() {
        let batcher = near();
        batcher.refuse();
        for _ in 0..5 {
            assert!(matches!(batcher.turn(0, 1, MS, queued), Turn::Call));
        }
    }
}
