//! The states the in-process store keeps, one per key: a fixed window, a rolling
//! window's counts, a token bucket's arrival time, a block or a lease; what each weighs
//! against the store's bound and whether dropping it loses something.

use crate::period::window::Window;
use crate::rolling::counts::Counts;

/// A rolling-window key weighs one key per this many buckets (or part of it).
const BUCKETS_PER_KEY: usize = 8;

/// One key's state, of whichever algorithm the key belongs to (or its block).
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    Blocked(Blocked),
    Lease(Lease),
    Window(Window),
    Ring(Counts),
    Tat(Tat),
}

impl Slot {
    pub(super) fn weight(&self) -> u64 {
        match self {
            Self::Ring(ring) => ring_weight(ring.len()),
            Self::Window(_) | Self::Tat(_) | Self::Blocked(_) | Self::Lease(_) => 1,
        }
    }

    /// Whether dropping this state at `now` loses something: a key that has spent part
    /// of its limit, or is blocked. A key back at its full limit, and a lease (units
    /// taken from Redis, whose loss only spends fewer), carry nothing.
    pub(super) fn carries(&self, now: Now) -> bool {
        match self {
            Self::Window(window) => window.carries(now.us),
            Self::Tat(tat) => tat.tat > now.ns.saturating_add(tat.skew),
            Self::Ring(ring) => ring.sum() > 0,
            Self::Blocked(Blocked(until_us)) => *until_us > now.us,
            Self::Lease(_) => false,
        }
    }
}

/// The store's clock read once: Unix microseconds (windows, blocks) and the
/// nanoseconds token buckets count in.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Now {
    pub(super) us: u64,
    pub(super) ns: u64,
}

/// What a rolling-window key with `buckets` buckets counts for against the bound.
pub(crate) fn ring_weight(buckets: usize) -> u64 {
    buckets.div_ceil(BUCKETS_PER_KEY).max(1) as u64
}

/// An algorithm's state, kept in a [`Slot`].
pub(crate) trait State: Sized {
    /// The state in `slot`, if it holds this algorithm's.
    fn get(slot: &mut Slot) -> Option<&mut Self>;
    fn into_slot(self) -> Slot;
}

impl State for Window {
    fn get(slot: &mut Slot) -> Option<&mut Self> {
        match slot {
            Slot::Window(w) => Some(w),
            _ => None,
        }
    }

    fn into_slot(self) -> Slot {
        Slot::Window(self)
    }
}

impl State for Counts {
    fn get(slot: &mut Slot) -> Option<&mut Self> {
        match slot {
            Slot::Ring(r) => Some(r),
            _ => None,
        }
    }

    fn into_slot(self) -> Slot {
        Slot::Ring(self)
    }
}

/// Until when a key is blocked, in Unix microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Blocked(pub(crate) u64);

impl State for Blocked {
    fn get(slot: &mut Slot) -> Option<&mut Self> {
        match slot {
            Slot::Blocked(b) => Some(b),
            _ => None,
        }
    }

    fn into_slot(self) -> Slot {
        Slot::Blocked(self)
    }
}

/// A key's lease: units taken from Redis, answered in process until expiry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) units: u64,
    pub(crate) expires_us: u64,
}

impl State for Lease {
    fn get(slot: &mut Slot) -> Option<&mut Self> {
        match slot {
            Slot::Lease(l) => Some(l),
            _ => None,
        }
    }

    fn into_slot(self) -> Slot {
        Slot::Lease(self)
    }
}

/// A token bucket's theoretical arrival time (nanoseconds of the crate clock, in the
/// key's time), how far the key's time runs ahead of the clock after the clock stepped
/// back, and the key's time plus one when a reservation took the TAT beyond the burst
/// (0: none; the crate clock starts at 0); see [`Tat::hit`]. On a monotonic clock the
/// skew stays 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tat {
    pub(crate) tat: u64,
    pub(crate) skew: u64,
    pub(crate) floor_plus_one: u64,
}

impl State for Tat {
    fn get(slot: &mut Slot) -> Option<&mut Self> {
        match slot {
            Slot::Tat(t) => Some(t),
            _ => None,
        }
    }

    fn into_slot(self) -> Slot {
        Slot::Tat(self)
    }
}
