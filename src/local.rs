//! Helpers shared by the in-process stores: keyed entries updated in place, and a
//! sweep schedule that lets exactly one caller at a time drop stale keys.

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

/// Runs `f` on `key`'s entry, inserting `init()` first if the key is new. Existing keys
/// are found without allocating an owned key.
pub(crate) fn update<V, R>(
    map: &DashMap<Box<str>, V>,
    key: &str,
    init: impl FnOnce() -> V,
    f: impl FnOnce(&mut V) -> R,
) -> R {
    if let Some(mut entry) = map.get_mut(key) {
        return f(&mut entry);
    }
    let mut entry = map.entry(Box::from(key)).or_insert_with(init);
    f(&mut entry)
}

/// When stale keys are swept next; `due` says yes to exactly one caller per interval.
#[derive(Debug)]
pub(crate) struct Sweep {
    next: AtomicU64,
    every: u64,
}

impl Sweep {
    /// A sweep every `every` units of the caller's clock (the first call is due).
    pub(crate) fn every(every: u64) -> Self {
        Self {
            next: AtomicU64::new(0),
            every,
        }
    }

    /// Whether the caller should sweep now; at most one caller per interval gets `true`.
    pub(crate) fn due(&self, now: u64) -> bool {
        let due = self.next.load(Ordering::Relaxed);
        now >= due
            && self
                .next
                .compare_exchange(
                    due,
                    now.saturating_add(self.every),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

/// Drops the entries `keep` says no to, if a sweep is due, and gives the memory back
/// when most of the map is gone (after a flood of keys, say).
pub(crate) fn sweep<K: Hash + Eq, V>(
    sweep: &Sweep,
    map: &DashMap<K, V>,
    now: u64,
    keep: impl FnMut(&K, &mut V) -> bool,
) {
    if sweep.due(now) {
        map.retain(keep);
        if map.len() < map.capacity() / 4 {
            map.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sweep_per_interval() {
        let sweep = Sweep::every(10);
        assert!(sweep.due(0));
        assert!(!sweep.due(5));
        assert!(sweep.due(10));
        assert!(!sweep.due(19));
        assert!(sweep.due(100));
    }

    #[test]
    fn a_sweep_gives_memory_back() {
        let map = DashMap::new();
        for i in 0..10_000u64 {
            map.insert(i, i);
        }
        let before = map.capacity();
        sweep(&Sweep::every(1), &map, 0, |k, _| *k < 10);
        assert_eq!(map.len(), 10);
        assert!(
            map.capacity() < before / 4,
            "{} of {before}",
            map.capacity()
        );
    }

    #[test]
    fn update_inserts_then_finds() {
        let map = DashMap::new();
        assert_eq!(update(&map, "k", || 1, |v| *v), 1);
        update(&map, "k", || 1, |v| *v += 1);
        assert_eq!(update(&map, "k", || 0, |v| *v), 2);
    }
}
