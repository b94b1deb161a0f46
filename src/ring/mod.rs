//! Rings of time buckets: a [`Ring`] keeps the last `size` buckets of a grid of equal
//! intervals, moved forward (or back) by a bucket index its caller computes from its own
//! clock. Both rolling windows of this crate are built on it: the
//! [rolling-window limiter](crate::RollingConfig) (a ring of counts per key, on Redis's or the
//! process's clock) and [`RollingWindow`] (sums and counts for a service's own statistics).
//!
//! | item | what | file |
//! |---|---|---|
//! | [`Ring`], [`StepBack`] | the buckets and the rules to advance them: no clock, no lock, no I/O | `mod.rs` |
//! | [`RollingWindow`], [`Bucket`], [`RollingWindowError`] | a ring of sums and counts behind a lock, advanced by tokio's clock | `window.rs` |
//!
//! A ring is pure, so the same steps give the same buckets wherever it lives; this
//! module depends on nothing else in the crate, and the algorithms and the backend (whose
//! breaker judges Redis with a [`RollingWindow`]) build on it.

use std::ops::{Deref, DerefMut};

mod window;

pub(crate) use self::window::RollingWindow;

/// What a [`Ring`] does when it is advanced to a bucket older than its newest one (the
/// clock stepped back, or callers' clocks disagree).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub(crate) enum StepBack {
    /// The buckets follow the clock back: each keeps its value and its age, as if no
    /// time had passed. A step back then never frees a bucket early, and never keeps
    /// one longer than a window after the step. For a single clock that may be stepped,
    /// when nothing else holds the time the ring had reached. (The rolling-window
    /// limiter instead keeps its buckets where they are and runs the key's own time
    /// ahead of a clock that stepped back, so that the clock's return finds them as the
    /// key left them: see [`rolling`](crate::RollingConfig#clocks).)
    #[default]
    Follow,
    /// The buckets stay where they are, and the older time counts as the newest bucket.
    /// For clocks that disagree (several callers): moving back once per caller that is
    /// behind would age the buckets without bound.
    Hold,
}

/// A ring of `size` time buckets: the newest bucket's absolute index on a grid of
/// equal intervals, and the values of it and the `size - 1` buckets before it.
///
/// Bucket `i` lives in slot `i % size` of `buckets`, so that moving forward only
/// clears the slots of the buckets that expired, and a ring is just its buckets and one
/// index. `B` is any owner of a slice of bucket values: a `Box<[V]>` from
/// [`Ring::new`], or a slice inside a larger allocation of the caller's (see
/// [`Ring::from_parts`]).
///
/// The ring knows no time: its caller maps time to bucket indices (for example
/// `unix_ms / interval_ms`) and passes them in. A bucket whose index is at most
/// `current - size` has expired at `current`.
///
/// The unit test `the_documented_walk` walks a ring through time, forward and back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Ring<B> {
    newest: u64,
    buckets: B,
}

impl<V: Default> Ring<Box<[V]>> {
    /// A ring of `size` default buckets, the newest at index 0.
    pub(crate) fn new(size: std::num::NonZeroUsize) -> Self {
        Self {
            newest: 0,
            buckets: std::iter::repeat_with(V::default)
                .take(size.get())
                .collect(),
        }
    }
}

impl<B> Ring<B> {
    /// The ring whose newest bucket is `newest` and whose bucket `i` is in slot
    /// `i % buckets.len()` of `buckets`; `None` if `buckets` is empty.
    ///
    /// With [`into_parts`](Self::into_parts), this lets a caller keep a ring packed
    /// into its own storage (the index beside the values, in one allocation) and
    /// borrow it as a `Ring<&mut [V]>` for a step.
    pub(crate) fn from_parts<V>(newest: u64, buckets: B) -> Option<Self>
    where
        B: Deref<Target = [V]>,
    {
        (!buckets.is_empty()).then_some(Self { newest, buckets })
    }

    #[cfg(test)]
    /// The newest bucket's index and the buckets, as [`from_parts`](Self::from_parts)
    /// takes them.
    pub(crate) fn into_parts(self) -> (u64, B) {
        (self.newest, self.buckets)
    }

    /// The index of the newest bucket.
    pub(crate) fn newest(&self) -> u64 {
        self.newest
    }
}

impl<B, V> Ring<B>
where
    B: Deref<Target = [V]>,
{
    /// How many buckets the ring holds (at least 1).
    pub(crate) fn size(&self) -> usize {
        self.buckets.len()
    }

    fn slot(&self, index: u64) -> usize {
        // The remainder is below the size, a usize.
        (index % self.buckets.len() as u64) as usize
    }

    /// Every bucket, oldest first: the last one is the newest bucket, the first one
    /// `size - 1` buckets older. Never-written buckets hold `V::default()`.
    pub(crate) fn iter<'a>(&'a self) -> impl DoubleEndedIterator<Item = &'a V> + Clone + 'a
    where
        V: 'a,
    {
        let oldest = (self.slot(self.newest) + 1) % self.buckets.len();
        let (newer, older) = self.buckets.split_at(oldest);
        older.iter().chain(newer)
    }

    /// How many of the buckets have expired at bucket `current`: 0 when `current` is
    /// not past the newest bucket, and at most `size`.
    pub(crate) fn expired_at(&self, current: u64) -> usize {
        let ahead = current.saturating_sub(self.newest);
        usize::try_from(ahead).map_or(self.size(), |ahead| ahead.min(self.size()))
    }

    /// The buckets still live at bucket `current`, oldest first: [`iter`](Self::iter)
    /// without the ones that [`advance`](Self::advance) to `current` would clear. The
    /// ring is not changed.
    pub(crate) fn live<'a>(&'a self, current: u64) -> impl Iterator<Item = &'a V> + Clone + 'a
    where
        V: 'a,
    {
        self.iter().skip(self.expired_at(current))
    }
}

impl<B, V> Ring<B>
where
    B: DerefMut<Target = [V]>,
    V: Default,
{
    /// Every bucket, oldest first, to change in place (see [`iter`](Ring::iter)).
    pub(crate) fn iter_mut<'a>(&'a mut self) -> impl DoubleEndedIterator<Item = &'a mut V> + 'a
    where
        V: 'a,
    {
        let oldest = (self.slot(self.newest) + 1) % self.buckets.len();
        let (newer, older) = self.buckets.split_at_mut(oldest);
        older.iter_mut().chain(newer)
    }

    /// Moves the ring to bucket `current` and returns the bucket a value at `current`
    /// goes into: `current` itself, unless the ring [holds](StepBack::Hold) a newer one.
    ///
    /// Forward, the buckets that expired in between (at most `size`) are taken out,
    /// passed to `expired` oldest first, and left as `V::default()`. Back (`current`
    /// below the newest bucket), `step_back` says whether the buckets follow, or the
    /// newest bucket stays newest and is returned.
    pub(crate) fn advance(
        &mut self,
        current: u64,
        step_back: StepBack,
        expired: impl FnMut(V),
    ) -> &mut V {
        if current > self.newest {
            let clear = self.expired_at(current);
            let first = (self.slot(self.newest) + 1) % self.size();
            let (newer, older) = self.buckets.split_at_mut(first);
            older
                .iter_mut()
                .chain(newer)
                .take(clear)
                .map(std::mem::take)
                .for_each(expired);
            self.newest = current;
        } else if current < self.newest && step_back == StepBack::Follow {
            // Bucket `i` becomes `i - shift`, which lives in slot `(i - shift) % size`.
            let shift = (self.newest - current) % self.size() as u64;
            self.buckets.rotate_left(shift as usize);
            self.newest = current;
        }
        let newest = self.slot(self.newest);
        &mut self.buckets[newest]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    #[test]
    fn the_documented_walk() {
        // Three buckets of counts; the index is, say, whole seconds.
        let mut ring = Ring::<Box<[u64]>>::new(NonZeroUsize::new(3).unwrap());
        *ring.advance(10, StepBack::Follow, drop) += 1;
        *ring.advance(11, StepBack::Follow, drop) += 2;
        *ring.advance(11, StepBack::Follow, drop) += 3;
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [0, 1, 5]);

        // At 13, buckets 9 and 10 have expired: `live` skips them, `advance` clears them.
        assert_eq!(ring.live(13).copied().collect::<Vec<_>>(), [5]);
        let mut expired = 0;
        ring.advance(13, StepBack::Follow, |count| expired += count);
        assert_eq!((expired, ring.newest()), (1, 13));
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [5, 0, 0]);

        // The clock steps back by 10: the buckets follow it, keeping their values.
        ring.advance(3, StepBack::Follow, drop);
        assert_eq!((ring.newest(), ring.iter().sum::<u64>()), (3, 5));
    }

    fn ring(size: usize) -> Ring<Box<[u64]>> {
        Ring::new(NonZeroUsize::new(size).unwrap())
    }

    fn values<B: Deref<Target = [u64]>>(ring: &Ring<B>) -> Vec<u64> {
        ring.iter().copied().collect()
    }

    #[test]
    fn a_new_ring_is_all_defaults() {
        let r = ring(3);
        assert_eq!((r.size(), r.newest()), (3, 0));
        assert_eq!(values(&r), [0, 0, 0]);
        assert!(Ring::<&mut [u64]>::from_parts(5, &mut []).is_none());
    }

    #[test]
    fn forward_clears_only_the_expired_buckets_oldest_first() {
        let mut r = ring(4);
        for i in 100..104 {
            *r.advance(i, StepBack::Follow, |v| {
                assert_eq!(v, 0, "only empty buckets")
            }) += i;
        }
        assert_eq!(values(&r), [100, 101, 102, 103]);
        assert_eq!(r.live(105).copied().collect::<Vec<_>>(), [102, 103]);
        let mut expired = Vec::new();
        r.advance(105, StepBack::Follow, |v| expired.push(v));
        assert_eq!(expired, [100, 101]);
        assert_eq!(values(&r), [102, 103, 0, 0]);
        // Far ahead: every bucket once, whatever the distance.
        expired.clear();
        r.advance(u64::MAX, StepBack::Follow, |v| expired.push(v));
        assert_eq!(expired, [102, 103, 0, 0]);
        assert_eq!((r.newest(), r.expired_at(u64::MAX)), (u64::MAX, 0));
    }

    #[test]
    fn back_follow_moves_every_bucket_hold_keeps_the_newest() {
        let mut r = ring(4);
        for i in 100..104 {
            *r.advance(i, StepBack::Follow, drop) += i - 99;
        }
        let mut held = r.clone();
        // Back by 9 buckets: bucket 103 becomes 94, 100 becomes 91.
        *r.advance(94, StepBack::Follow, |_| panic!("nothing expires")) += 10;
        assert_eq!((r.newest(), values(&r)), (94, vec![1, 2, 3, 14]));
        assert_eq!(r.live(95).copied().collect::<Vec<_>>(), [2, 3, 14]);
        // Held: the older time counts as the newest bucket.
        *held.advance(94, StepBack::Hold, |_| panic!("nothing expires")) += 10;
        assert_eq!((held.newest(), values(&held)), (103, vec![1, 2, 3, 14]));
        assert_eq!(held.expired_at(94), 0);
    }

    #[test]
    fn a_ring_packed_in_a_larger_slice() {
        let mut data = [7u64, 0, 0, 0];
        let (head, buckets) = data.split_at_mut(1);
        let mut r = Ring::from_parts(head[0], buckets).unwrap();
        *r.advance(8, StepBack::Follow, drop) += 1;
        let (newest, _) = r.into_parts();
        head[0] = newest;
        // Bucket 8 is in slot 8 % 3.
        assert_eq!(data, [8, 0, 0, 1]);
    }
}
