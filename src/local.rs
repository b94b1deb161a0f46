//! Helpers shared by the in-process stores: keyed entries updated in place, and a
//! sweep schedule that lets exactly one caller at a time drop stale keys.

use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

/// Runs `f` on `key`'s entry, inserting `init()` first if the key is new. Existing keys
/// are found without allocating an owned key.
pub(crate) fn update<V, R>(
    map: &DashMap<Box<[u8]>, V>,
    key: &[u8],
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
/// when most of the map is gone (after a flood of keys, say). The sweep walks the whole
/// map, so it runs [off the request path](off_the_request_path).
pub(crate) fn sweep<K, V, F>(sweep: &Sweep, map: &Arc<DashMap<K, V>>, now: u64, keep: F)
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    F: FnMut(&K, &mut V) -> bool + Send + 'static,
{
    if sweep.due(now) {
        let map = Arc::clone(map);
        off_the_request_path(move || {
            let before = map.len();
            map.retain(keep);
            if map.len() < map.capacity() / 4 {
                map.shrink_to_fit();
            }
            tracing::debug!(before, after = map.len(), "swept expired rate-limit keys");
        });
    }
}

/// Runs `job` on tokio's blocking pool when there is a runtime (a sweep of a million
/// keys takes up to ~100 ms, which must not stall an async worker), at once otherwise.
pub(crate) fn off_the_request_path(job: impl FnOnce() + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(job)),
        Err(_) => job(),
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
        let map = Arc::new(DashMap::new());
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

    #[tokio::test]
    async fn with_a_runtime_sweeps_run_on_the_blocking_pool() {
        let map = Arc::new(DashMap::new());
        for i in 0..100u64 {
            map.insert(i, i);
        }
        let swept_on = Arc::new(std::sync::Mutex::new(None));
        let record = Arc::clone(&swept_on);
        sweep(&Sweep::every(1), &map, 0, move |k, _| {
            *record.lock().unwrap() = Some(std::thread::current().id());
            *k < 10
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while map.len() > 10 {
            assert!(std::time::Instant::now() < deadline, "never swept");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let thread = swept_on.lock().unwrap().expect("the sweep ran");
        assert_ne!(thread, std::thread::current().id());
    }

    #[test]
    fn update_inserts_then_finds() {
        let map = DashMap::new();
        assert_eq!(update(&map, b"k", || 1, |v| *v), 1);
        update(&map, b"k", || 1, |v| *v += 1);
        assert_eq!(update(&map, b"k", || 0, |v| *v), 2);
    }
}
