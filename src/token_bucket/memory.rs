//! The in-process token buckets: GCRA, one theoretical arrival time (TAT) per key (and
//! the key's skew after a clock step back), 16 bytes of state in the backend's bounded [local store](crate::local), the same algorithm as
//! `token_bucket.lua` in integer nanoseconds of the crate's monotonic clock.
//!
//! [`Tat::hit`] is the whole algorithm, a pure step: (state, now, cost, settings) ->
//! (state, outcome).

use std::sync::Arc;

use crate::local::{Key, LocalStore, Tat};

/// A bucket's settings in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    /// Nanoseconds per token (at least 1).
    pub(crate) interval_ns: u64,
    /// The bucket's capacity in tokens (at least 1).
    pub(crate) burst: u64,
}

/// The outcome of one hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Taken: `left` whole tokens remain; the bucket is full again in `full_in_ns`.
    Admitted { left: u64, full_in_ns: u64 },
    /// Refused, nothing taken: `left` whole tokens are there, the cost fits in
    /// `wait_ns`, and the bucket is full in `full_in_ns`.
    Refused {
        left: u64,
        wait_ns: u64,
        full_in_ns: u64,
    },
    /// The cost is above the burst: it can never pass.
    ExceedsCapacity,
}

impl Tat {
    /// The key's time at `now_ns` for a bucket of span `tau`, and its skew (as in
    /// `token_bucket.lua`). The key's floor is the earliest time its state proves it has
    /// seen: `TAT - tau` (an empty bucket), or the time stored by a reservation that took
    /// the TAT further. With the clock below the floor (it stepped back), the key's time
    /// is the later of the clock plus the stored skew and the floor, in whole
    /// microseconds ahead of the clock as the script's: it runs on at the clock's rate
    /// after a step back (a step back blocks a key for at most a refill), the TAT stays in
    /// the key's time (the clock's return refills nothing), and the skew is dropped once
    /// the clock is at the floor again.
    fn key_now(&self, tau: u64, now_ns: u64) -> (u64, u64) {
        let floor = match self.floor_plus_one {
            0 => self.tat.saturating_sub(tau),
            floor => floor - 1,
        };
        if now_ns >= floor {
            return (now_ns, 0);
        }
        let skew = self.skew.max((floor - now_ns).div_ceil(1_000) * 1_000);
        (now_ns.saturating_add(skew), skew)
    }

    /// Writes the TAT `tat` (in the key's time `now_ns`, skew `skew`), as the script's
    /// store does: the floor only when the TAT alone does not tell it (a reservation).
    fn store(&mut self, tat: u64, now_ns: u64, skew: u64, tau: u64) {
        *self = Self {
            tat: tat.max(now_ns),
            skew,
            floor_plus_one: if tat > now_ns.saturating_add(tau) {
                now_ns.saturating_add(1)
            } else {
                0
            },
        };
    }

    /// Takes `cost` tokens at `now_ns` if the bucket holds them.
    ///
    /// A full bucket has TAT <= now; each token moves TAT one interval later; a cost fits
    /// while TAT stays within `burst` intervals of now. TAT only moves forward, so no
    /// clock step can refill the bucket beyond what the time elapsed allows; and when
    /// the clock is below the key's floor (it stepped back), the key's time is moved up
    /// to it (see [`key_now`](Self::key_now)), so a step back never blocks a key longer
    /// than refilling an empty bucket takes, and the clock's return refills nothing. A
    /// step forward at most refills the bucket early.
    #[cfg(test)]
    pub(crate) fn hit(&mut self, bucket: Bucket, cost: u64, now_ns: u64) -> Outcome {
        self.hit_keeping(bucket, cost, 0, now_ns)
    }

    /// [`hit`](Self::hit) that admits only when `keep` more tokens would fit too (the
    /// tokens a priority class leaves to others), spending `cost`.
    pub(crate) fn hit_keeping(
        &mut self,
        bucket: Bucket,
        cost: u64,
        keep: u64,
        now_ns: u64,
    ) -> Outcome {
        if cost > bucket.burst {
            return Outcome::ExceedsCapacity;
        }
        let interval = bucket.interval_ns.max(1);
        let tau = interval.saturating_mul(bucket.burst);
        let (now_ns, skew) = self.key_now(tau, now_ns);
        let horizon = now_ns.saturating_add(tau);
        // A TAT beyond the horizon is a reservation's (tokens promised ahead): it counts.
        let tat = self.tat.max(now_ns);
        let new_tat = tat.saturating_add(cost.saturating_mul(interval));
        let needed = new_tat.saturating_add(keep.saturating_mul(interval));
        if needed > horizon {
            if skew != self.skew {
                // The script stores the new skew of a refused check.
                self.store(self.tat, now_ns, skew, tau);
            }
            return Outcome::Refused {
                left: horizon.saturating_sub(tat) / interval,
                wait_ns: needed - horizon,
                full_in_ns: tat - now_ns,
            };
        }
        self.store(new_tat, now_ns, skew, tau);
        Outcome::Admitted {
            left: (horizon - new_tat) / interval,
            full_in_ns: new_tat - now_ns,
        }
    }
}

impl Tat {
    /// Takes `cost` tokens at the earliest time they fit, if that is at most
    /// `max_wait_ns` after `now_ns`: TAT moves on now (as in the script's reservation).
    /// `Admitted`'s `wait_ns` is the time to wait before using them.
    pub(crate) fn reserve(
        &mut self,
        bucket: Bucket,
        cost: u64,
        now_ns: u64,
        max_wait_ns: u64,
    ) -> Reservation {
        let interval = bucket.interval_ns.max(1);
        let tau = interval.saturating_mul(bucket.burst);
        let (now_ns, skew) = self.key_now(tau, now_ns);
        let tat = self.tat.max(now_ns);
        let new_tat = tat.saturating_add(cost.saturating_mul(interval));
        let wait_ns = new_tat.saturating_sub(tau).saturating_sub(now_ns);
        if wait_ns > max_wait_ns {
            if skew != self.skew {
                self.store(self.tat, now_ns, skew, tau);
            }
            return Reservation::Refused {
                left: tau.saturating_sub(tat - now_ns) / interval,
                wait_ns,
                full_in_ns: tat - now_ns,
            };
        }
        self.store(new_tat, now_ns, skew, tau);
        Reservation::Admitted {
            left: tau.saturating_sub(new_tat - now_ns - wait_ns) / interval,
            wait_ns,
            full_in_ns: new_tat - now_ns,
        }
    }

    /// Spends `cost` tokens at `now_ns` whatever the bucket holds (as the script's
    /// `token_bucket_charge`): a TAT taken beyond `now + tau` is debt, which the next
    /// hits refuse until the time has paid it off.
    pub(crate) fn charge(&mut self, bucket: Bucket, cost: u64, now_ns: u64) {
        let interval = bucket.interval_ns.max(1);
        let tau = interval.saturating_mul(bucket.burst);
        let (now_ns, skew) = self.key_now(tau, now_ns);
        let tat = self.tat.max(now_ns);
        self.store(
            tat.saturating_add(cost.saturating_mul(interval)),
            now_ns,
            skew,
            tau,
        );
    }

    /// Puts `cost` tokens back at `now_ns`: TAT moves back by their intervals, never
    /// below the key's time (as in the script; a bucket full again is forgotten).
    pub(crate) fn refund(&mut self, bucket: Bucket, cost: u64, now_ns: u64) {
        let interval = bucket.interval_ns.max(1);
        let tau = interval.saturating_mul(bucket.burst);
        let (now_ns, skew) = self.key_now(tau, now_ns);
        if self.tat > now_ns {
            let back = cost.saturating_mul(interval);
            let tat = self.tat.saturating_sub(back).max(now_ns);
            if tat == now_ns {
                *self = Self::default();
            } else {
                self.store(tat, now_ns, skew, tau);
            }
        }
    }
}

/// The outcome of a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reservation {
    /// Taken for the time `wait_ns` from now; `left` tokens remain then.
    Admitted {
        left: u64,
        wait_ns: u64,
        full_in_ns: u64,
    },
    /// They would fit only after `wait_ns`, past the maximum wait: nothing taken.
    Refused {
        left: u64,
        wait_ns: u64,
        full_in_ns: u64,
    },
}

/// One limiter's buckets in the backend's local store.
#[derive(Debug)]
pub(crate) struct Buckets {
    store: Arc<LocalStore>,
    limiter: u64,
}

impl Buckets {
    /// The buckets under `limiter` (the limiter name's id) in `store`.
    pub(crate) fn new(store: Arc<LocalStore>, limiter: u64) -> Self {
        Self { store, limiter }
    }

    pub(crate) fn key(&self, key: &[u8]) -> Key {
        self.store.key(self.limiter, key)
    }

    /// Reserves `cost` tokens of `key`'s bucket (see [`Tat::reserve`]).
    pub(crate) fn reserve(
        &self,
        key: &[u8],
        bucket: Bucket,
        cost: u64,
        now_ns: u64,
        max_wait_ns: u64,
    ) -> Reservation {
        self.store
            .update(self.key(key), Tat::default, |tat: &mut Tat| {
                tat.reserve(bucket, cost, now_ns, max_wait_ns)
            })
    }

    /// Puts `cost` tokens back into `key`'s bucket.
    pub(crate) fn refund(&self, key: &[u8], bucket: Bucket, cost: u64, now_ns: u64) {
        self.store.modify(self.key(key), |tat: &mut Tat| {
            tat.refund(bucket, cost, now_ns)
        });
    }

    /// Spends `cost` tokens of `key`'s bucket whatever it holds (see [`Tat::charge`]).
    pub(crate) fn charge(&self, key: &[u8], bucket: Bucket, cost: u64, now_ns: u64) {
        self.store
            .update(self.key(key), Tat::default, |tat: &mut Tat| {
                tat.charge(bucket, cost, now_ns)
            });
    }

    /// Forgets `key`'s bucket.
    pub(crate) fn reset(&self, key: &[u8]) {
        self.store.remove(self.key(key));
    }

    /// Takes `cost` tokens from `key`'s bucket at `now_ns` if it holds them and `keep`
    /// more (see [`Tat::hit_keeping`]). With `spend` false, only says what taking them would answer.
    pub(crate) fn hit(
        &self,
        key: &[u8],
        bucket: Bucket,
        cost: u64,
        keep: u64,
        now_ns: u64,
        spend: bool,
    ) -> Outcome {
        if cost > bucket.burst {
            return Outcome::ExceedsCapacity;
        }
        let step = |tat: &mut Tat| tat.hit_keeping(bucket, cost, keep, now_ns);
        if spend {
            self.store.update(self.key(key), Tat::default, step)
        } else {
            self.store.peek(self.key(key), Tat::default, step)
        }
    }

    #[cfg(test)]
    pub(crate) fn store(&self) -> &LocalStore {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    /// 10 per second, burst 5.
    const BUCKET: Bucket = Bucket {
        interval_ns: 100 * MS,
        burst: 5,
    };
    const T0: u64 = 100_000_000 * MS;

    #[test]
    fn a_full_bucket_then_the_refill_rate() {
        let mut tat = Tat::default();
        for left in (0..5).rev() {
            assert_eq!(
                tat.hit(BUCKET, 1, T0),
                Outcome::Admitted {
                    left,
                    full_in_ns: (5 - left) * 100 * MS
                }
            );
        }
        assert_eq!(
            tat.hit(BUCKET, 1, T0 + 30 * MS),
            Outcome::Refused {
                left: 0,
                wait_ns: 70 * MS,
                full_in_ns: 470 * MS
            }
        );
        assert!(matches!(
            tat.hit(BUCKET, 1, T0 + 100 * MS),
            Outcome::Admitted { left: 0, .. }
        ));
        // Weighted: 3 tokens are there 300 ms later, not 4.
        assert!(matches!(
            tat.hit(BUCKET, 4, T0 + 400 * MS),
            Outcome::Refused { left: 3, .. }
        ));
        assert_eq!(tat.hit(BUCKET, 6, T0), Outcome::ExceedsCapacity);
        // Idle for long: full again, never more.
        assert!(matches!(
            tat.hit(BUCKET, 5, T0 + 3_600_000 * MS),
            Outcome::Admitted { left: 0, .. }
        ));
    }

    #[test]
    fn a_step_back_never_refills_and_blocks_at_most_a_refill() {
        let mut tat = Tat::default();
        assert!(matches!(
            tat.hit(BUCKET, 5, T0),
            Outcome::Admitted { left: 0, .. }
        ));
        // An hour back: the bucket is empty, and fills at the rate from there.
        let back = T0 - 3_600_000 * MS;
        assert_eq!(
            tat.hit(BUCKET, 1, back),
            Outcome::Refused {
                left: 0,
                wait_ns: 100 * MS,
                full_in_ns: 500 * MS
            }
        );
        assert!(matches!(
            tat.hit(BUCKET, 1, back + 100 * MS),
            Outcome::Admitted { left: 0, .. }
        ));
        // A step back of less than a refill keeps the TAT as it is.
        let mut tat = Tat::default();
        tat.hit(BUCKET, 2, T0);
        assert!(matches!(
            tat.hit(BUCKET, 4, T0 - 100 * MS),
            Outcome::Refused { left: 2, .. }
        ));
    }

    #[test]
    fn a_step_forward_at_most_refills_early() {
        let mut tat = Tat::default();
        tat.hit(BUCKET, 5, T0);
        assert_eq!(
            tat.hit(BUCKET, 5, T0 + 3_600_000 * MS),
            Outcome::Admitted {
                left: 0,
                full_in_ns: 500 * MS
            }
        );
    }
}
