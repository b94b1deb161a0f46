//! [`Waiter`]: an awaitable acquire over any [`Limiter`], one FIFO queue per key.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::Mutex;
use tokio::time::{sleep_until, timeout_at, Instant};

use super::WaitError;
use crate::decision::{Decision, Policy, Source, State};
use crate::limiter::Limiter;

/// The shortest sleep after a refusal, so that a limiter answering a zero
/// `retry_after` cannot make a waiter call it in a busy loop.
const MIN_SLEEP: Duration = Duration::from_millis(1);

/// Waits for a [`Limiter`] to admit a cost instead of taking its refusal: the awaitable
/// side of a limit, for requests a service *sends* (an upstream API's limit shared by
/// every replica), queue consumers and batch jobs.
///
/// [`acquire`](Self::acquire) on a token bucket reserves the cost at the earliest time
/// it fits ([`Limiter::reserve`]) and sleeps until then: one call per request, however
/// many instances share the bucket; a dropped future gives its reservation back. On
/// other limiters it checks; while the limiter refuses, it sleeps for the refusal's
/// `retry_after` (computed from the shared state, so there is no polling loop) and
/// checks again. Either way it fails at once when the next possible admission lies
/// beyond the maximum wait.
///
/// In one process, the waiters on one key form a first-in, first-out queue: only the
/// waiter at its head reserves or checks (a later, cheaper request cannot overtake an
/// earlier, costlier one). Dropping the future of `acquire` spends nothing (a
/// reservation is refunded) and leaves no task behind. A key's queue is removed as soon
/// as nobody waits on it.
///
/// Cloning is cheap; clones share the limiter and the queues.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use tower_redis_ratelimit::{outbound::Waiter, Backend, TokenBucketConfig, TokenBucketLimiter};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // The SMS gateway allows 2 messages per second per sender.
/// let config = TokenBucketConfig::new(2, Duration::from_secs(1), 1);
/// let limiter = TokenBucketLimiter::new(&Backend::in_process(), "sms", config)?;
/// let waiter = Waiter::new(limiter);
/// let one = NonZeroU32::MIN;
/// for message in 0..4 {
///     // Waits about half a second from the second message on; gives up after 5 s.
///     let decision = waiter.acquire(b"sender:42", one, Duration::from_secs(5)).await?;
///     assert!(decision.is_admitted());
/// }
/// # Ok(()) }
/// ```
pub struct Waiter<L> {
    shared: Arc<Shared<L>>,
}

struct Shared<L> {
    limiter: L,
    /// The queue of each key that has waiters.
    lanes: DashMap<Box<[u8]>, Arc<Lane>>,
}

/// One key's queue: a fair (first-in, first-out) mutex held by the waiter at its head.
/// It guards the earliest time the next head should check: set when an admission used
/// the last of the limit, so that the next head does not spend a call on a refusal.
#[derive(Default)]
struct Lane {
    head: Mutex<Option<Instant>>,
}

/// A place in a key's queue; leaving it removes the queue if nobody else is in it.
struct Ticket<'a> {
    lanes: &'a DashMap<Box<[u8]>, Arc<Lane>>,
    key: &'a [u8],
    lane: Arc<Lane>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        // Clones of a lane are made under its shard's lock, which `remove_if` holds:
        // two references (the map's and this one) mean nobody else waits.
        self.lanes
            .remove_if(self.key, |_, lane| Arc::strong_count(lane) == 2);
    }
}

impl<L> Waiter<L> {
    /// A waiter over `limiter` (any [`Limiter`]: a token bucket, a fixed window, a
    /// rolling window, on Redis or in-process, or your own).
    pub fn new(limiter: L) -> Self {
        Self {
            shared: Arc::new(Shared {
                limiter,
                lanes: DashMap::new(),
            }),
        }
    }

    /// The limiter this waiter asks.
    pub fn limiter(&self) -> &L {
        &self.shared.limiter
    }

    /// How many keys have waiters right now (each has a queue in memory; a key's queue
    /// is removed when its last waiter is admitted, gives up or is dropped); for tests of
    /// that bound.
    #[doc(hidden)]
    #[must_use]
    pub fn queued_keys(&self) -> usize {
        self.shared.lanes.len()
    }

    fn join<'a>(&'a self, key: &'a [u8]) -> Ticket<'a> {
        let lanes = &self.shared.lanes;
        let lane = match lanes.get(key) {
            Some(lane) => Arc::clone(&lane),
            None => Arc::clone(&lanes.entry(key.into()).or_default()),
        };
        Ticket { lanes, key, lane }
    }
}

impl<L: Limiter> Waiter<L> {
    /// Waits until the limiter admits `cost` units against `key`, for at most
    /// `max_wait`, and returns the admitting [`Decision`].
    ///
    /// The wait is bounded without sleeping in vain: when a refusal says the next
    /// possible admission lies beyond the deadline, `acquire` fails at once. A
    /// `max_wait` of zero makes one check (after the waiters ahead, if they leave at
    /// once).
    ///
    /// The limiter's [`FailurePolicy`](crate::FailurePolicy) applies while Redis cannot
    /// answer: `Fallback` waits on the in-process state, `FailOpen` admits, `FailClosed`
    /// fails with [`WaitError::Unavailable`].
    ///
    /// # Errors
    ///
    /// [`WaitError::TimedOut`] when the limit cannot admit the cost within `max_wait`,
    /// [`WaitError::ExceedsCapacity`] when it never can (a cost above the burst or the
    /// limit), [`WaitError::Unavailable`] when Redis is unreachable and the failure
    /// policy refuses, [`WaitError::Refused`] when a custom limiter refuses without a
    /// time to retry.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the queue: nothing was counted against the limit (a
    /// refused check counts nothing), and the waiter behind it becomes the head. The
    /// one exception is a check already sent to Redis when the future is dropped: Redis
    /// runs it anyway, and counts it if it admits.
    pub async fn acquire(
        &self,
        key: &[u8],
        cost: NonZeroU32,
        max_wait: Duration,
    ) -> Result<Decision, WaitError> {
        let deadline = Instant::now().checked_add(max_wait);
        let ticket = self.join(key);
        let mut head = match deadline {
            Some(deadline) => timeout_at(deadline, ticket.lane.head.lock())
                .await
                .map_err(|_| WaitError::TimedOut {
                    max_wait,
                    decision: None,
                })?,
            None => ticket.lane.head.lock().await,
        };
        // A token bucket reserves: one call takes the earliest slot within the wait, for
        // this instance and every other one sharing the bucket.
        let left = deadline.map_or(max_wait, |d| d.saturating_duration_since(Instant::now()));
        if let Some(reservation) = self.shared.limiter.reserve(key, cost, left) {
            let decision = reservation.await;
            // The next waiter reserves the next slot while this one waits for its own.
            drop(head);
            return self.use_reservation(key, cost, decision, max_wait).await;
        }
        // The previous head used the last of the limit: no point asking before this.
        if let Some(at) = head.take() {
            if deadline.is_none_or(|deadline| at <= deadline) {
                sleep_until(at).await;
            }
        }
        loop {
            let decision = self.shared.limiter.check(key, cost).await;
            if decision.is_admitted() {
                if decision.remaining == 0 {
                    *head = next_unit(&decision, self.shared.limiter.policy());
                }
                return Ok(decision);
            }
            if decision.state == State::ExceedsCapacity {
                return Err(WaitError::ExceedsCapacity { decision });
            }
            if decision.source == Source::FailClosed {
                return Err(WaitError::Unavailable { decision });
            }
            let Some(wait) = retry_in(&decision) else {
                return Err(WaitError::Refused { decision });
            };
            let at = Instant::now().checked_add(wait.max(MIN_SLEEP));
            match (at, deadline) {
                (Some(at), Some(deadline)) if at <= deadline => sleep_until(at).await,
                (Some(at), None) => sleep_until(at).await,
                _ => {
                    return Err(WaitError::TimedOut {
                        max_wait,
                        decision: Some(decision),
                    })
                }
            }
        }
    }
}

impl<L: Limiter> Waiter<L> {
    /// Waits for a reservation's slot (giving its units back if dropped meanwhile), or
    /// turns its refusal into the error.
    async fn use_reservation(
        &self,
        key: &[u8],
        cost: NonZeroU32,
        mut decision: Decision,
        max_wait: Duration,
    ) -> Result<Decision, WaitError> {
        if decision.is_admitted() {
            if let Some(wait) = decision.retry_after.take() {
                let mut unused = Unused {
                    limiter: &self.shared.limiter,
                    key,
                    cost,
                    armed: true,
                };
                tokio::time::sleep(wait).await;
                unused.armed = false;
            }
            return Ok(decision);
        }
        Err(match decision.state {
            State::ExceedsCapacity => WaitError::ExceedsCapacity { decision },
            _ if decision.source == Source::FailClosed => WaitError::Unavailable { decision },
            _ => WaitError::TimedOut {
                max_wait,
                decision: Some(decision),
            },
        })
    }
}

/// A reservation not used yet: given back if its waiter is dropped before its time.
struct Unused<'a, L: Limiter> {
    limiter: &'a L,
    key: &'a [u8],
    cost: NonZeroU32,
    armed: bool,
}

impl<L: Limiter> Drop for Unused<'_, L> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(mut refund) = self.limiter.refund(self.key, self.cost) {
            if refund.take_ready().is_none() {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(refund);
                }
            }
        }
    }
}

/// How long until a refused request could pass: its `retry_after`, or else its reset.
fn retry_in(decision: &Decision) -> Option<Duration> {
    decision
        .retry_after
        .or((!decision.reset.is_zero()).then_some(decision.reset))
}

/// After an admission that left nothing: the earliest time one unit can be back, from
/// the limiter's policy (`window / quota` per unit, the rest of `reset` being the other
/// units). Exact for a token bucket, earlier than the truth for a fixed or rolling
/// window; the next head's check corrects an early guess. `None` when the decision is
/// not under the limiter's default policy (a per-request limit).
fn next_unit(decision: &Decision, policy: &Policy) -> Option<Instant> {
    let quota = policy.quota();
    if quota == 0 || decision.limit != quota {
        return None;
    }
    let others = policy.window().as_nanos() * u128::from(quota - 1) / u128::from(quota);
    let wait_ns = decision.reset.as_nanos().saturating_sub(others);
    Instant::now().checked_add(Duration::from_nanos(u64::try_from(wait_ns).ok()?))
}

impl<L> Clone for Waiter<L> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<L: Limiter> fmt::Debug for Waiter<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("policy", self.shared.limiter.policy())
            .field("queued_keys", &self.queued_keys())
            .finish()
    }
}
