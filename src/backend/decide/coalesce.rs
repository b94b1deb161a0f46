//! Coalescing: concurrent checks of one key in one process that would each wait for
//! Redis join one script call instead, carrying their costs in arrival order; the
//! engine decides each as its own call would, so the decisions are exact.
//!
//! A check of a key with no call in flight goes to Redis at once (it leads). Checks of
//! that key arriving meanwhile queue; when the call returns, the queue goes to Redis in
//! one call (engine op `m`; `M` when they all cost the same, the cost sent once), and so
//! on until nobody waits. So a hot key under N concurrent requests costs about two
//! calls per round trip instead of N, and a key with one request at a time costs
//! exactly what it did: one call each, no waiting.

use std::num::NonZeroU32;
use std::ops::{Deref, Range};
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::oneshot;

use super::deny::PreHashed;
use crate::backend::redis::fault::ScriptError;

/// A waiting check's part of a shared call (a coalesced or a batched one): its reply,
/// or the call's error (`Err(Some)`: its own to report, a key's error; `Err(None)`:
/// reported by the call, or no reply of the expected shape), which the failure policy
/// answers.
pub(crate) type Part = Result<Share, Option<ScriptError>>;

/// A check's reply within a shared call's: the call's numbers, which its checks share
/// (one allocation a call, not one a check), and where this check's are.
#[derive(Debug, Clone)]
pub(crate) struct Share {
    numbers: Arc<Vec<i64>>,
    range: Range<usize>,
}

impl Share {
    /// Each check's share of a call's `numbers`, by its range in them.
    pub(crate) fn split(
        numbers: Vec<i64>,
        ranges: impl IntoIterator<Item = Range<usize>>,
    ) -> impl Iterator<Item = Self> {
        let numbers = Arc::new(numbers);
        ranges.into_iter().map(move |range| Self {
            numbers: Arc::clone(&numbers),
            range,
        })
    }

    /// A reply that is a call's own.
    pub(crate) fn whole(numbers: Vec<i64>) -> Self {
        let range = 0..numbers.len();
        Self {
            numbers: Arc::new(numbers),
            range,
        }
    }
}

impl Deref for Share {
    type Target = [i64];

    fn deref(&self) -> &[i64] {
        // (The ranges come from `split_batch`, within the numbers.)
        self.numbers.get(self.range.clone()).unwrap_or_default()
    }
}

/// The calls in flight of one limiter, and the checks waiting for them.
#[derive(Debug, Default)]
pub(crate) struct Coalescer {
    /// A key (by the 128-bit keyed hash of its Redis key, as the deny cache keys it) is
    /// present while a call for it is in flight; its value is the queue.
    keys: DashMap<u128, Vec<Waiting>, PreHashed>,
}

/// A check waiting for the next call of its key.
#[derive(Debug)]
pub(crate) struct Waiting {
    pub(crate) cost: NonZeroU32,
    /// Gets the check's part of the call.
    pub(crate) reply: oneshot::Sender<Part>,
}

/// What a check does: lead a call, or wait for a later one.
pub(crate) enum Turn {
    /// No call in flight: this check makes one, and must call [`Coalescer::next`]
    /// when it returns.
    Lead,
    /// A call is in flight: this check's part of the next one arrives here.
    Wait(oneshot::Receiver<Part>),
}

impl Coalescer {
    /// Takes a turn for the key whose Redis key hashes to `hash`.
    pub(crate) fn turn(&self, hash: u128, cost: NonZeroU32) -> Turn {
        match self.keys.entry(hash) {
            dashmap::Entry::Occupied(mut queue) => {
                let (tx, rx) = oneshot::channel();
                queue.get_mut().push(Waiting { cost, reply: tx });
                Turn::Wait(rx)
            }
            dashmap::Entry::Vacant(slot) => {
                slot.insert(Vec::new());
                Turn::Lead
            }
        }
    }

    /// After a call for the key hashing to `hash` returned: the checks that queued
    /// meanwhile (the next call, which the caller makes), or none, and then the key is
    /// free.
    pub(crate) fn next(&self, hash: u128) -> Vec<Waiting> {
        let mut waiting = Vec::new();
        self.keys.remove_if_mut(&hash, |_, queue| {
            if queue.is_empty() {
                return true;
            }
            waiting = std::mem::take(queue);
            false
        });
        waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_leads_the_others_queue_then_the_key_is_free() {
        let coalescer = Coalescer::default();
        let one = NonZeroU32::MIN;
        let (k, other) = (1, 2);
        assert!(matches!(coalescer.turn(k, one), Turn::Lead));
        assert!(matches!(coalescer.turn(other, one), Turn::Lead));
        let waiting: Vec<_> = (0..3).map(|_| coalescer.turn(k, one)).collect();
        assert!(waiting.iter().all(|t| matches!(t, Turn::Wait(_))));
        assert_eq!(coalescer.next(k).len(), 3);
        // The batch is in flight: a newcomer queues for the one after it.
        assert!(matches!(coalescer.turn(k, one), Turn::Wait(_)));
        assert_eq!(coalescer.next(k).len(), 1);
        assert!(coalescer.next(k).is_empty());
        assert!(matches!(coalescer.turn(k, one), Turn::Lead));
    }
}
