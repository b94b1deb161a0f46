//! The keys a layer refused most lately: a bounded space-saving sketch per policy
//! ([`Offenders`]), fed by each refusal, read as [`Denied`] entries.
//!
//! Space-saving (Metwally, Agrawal, El Abbadi, 2005) keeps [`COUNTERS`] counters: a
//! refused key that has one adds to it; one that has none takes over the smallest,
//! starting from its count (that count is the entry's `error`). Every entry's count is
//! at least the key's true count and at most `error` above it, `error` is at most the
//! number of refusals over [`COUNTERS`], and every key refused more often than that is
//! in the sketch. Memory is fixed: [`COUNTERS`] keys (each at most the layer's longest
//! key) per policy, whatever the number of keys refused. The sketch covers two windows
//! of [`WINDOW`]: the current one and the one before (so the last 5 to 10 minutes).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::key::Key;

/// The counters of one window's sketch.
pub(crate) const COUNTERS: usize = 256;
/// How long a window lasts.
pub(crate) const WINDOW: Duration = Duration::from_secs(300);

/// A key a layer refused often, and how often: `count` refusals since
/// [`since`](Self::since) at most, `count - error` at least (a bounded sketch counts
/// them: see [`LimitLayer::denied`](crate::LimitLayer::denied)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Denied {
    /// The policy that refused the key (`api`; a plan's `api.pro`).
    pub limit: String,
    /// The key the limit counts, tag and all (`hdr:x-api-key:trap`).
    pub key: Key<'static>,
    /// The client's value the key was made from, when the layer's extractor names it
    /// (as [`Blocked::value`](crate::Blocked::value)).
    pub value: Option<Key<'static>>,
    /// Its refusals counted (an upper bound).
    pub count: u64,
    /// How far `count` may be above the true count.
    pub error: u64,
    /// How long ago the counting began (5 to 10 minutes once the layer has run that
    /// long).
    pub since: Duration,
}

/// One key's counter.
#[derive(Debug, Clone)]
struct Counter {
    key: Box<[u8]>,
    count: u64,
    error: u64,
}

/// One window's space-saving sketch.
#[derive(Debug, Default)]
struct Sketch {
    counters: Vec<Counter>,
    /// The index of each key's counter.
    index: HashMap<Box<[u8]>, usize>,
    /// Refusals counted.
    total: u64,
}

impl Sketch {
    fn add(&mut self, key: &[u8]) {
        self.total += 1;
        if let Some(&i) = self.index.get(key) {
            self.counters[i].count += 1;
            return;
        }
        if self.counters.len() < COUNTERS {
            self.index.insert(key.into(), self.counters.len());
            self.counters.push(Counter {
                key: key.into(),
                count: 1,
                error: 0,
            });
            return;
        }
        // Full: the new key takes over the smallest counter, from its count.
        let (i, smallest) = self
            .counters
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.count)
            .map(|(i, c)| (i, c.count))
            .expect("a full sketch has counters");
        let old = std::mem::replace(
            &mut self.counters[i],
            Counter {
                key: key.into(),
                count: smallest + 1,
                error: smallest,
            },
        );
        self.index.remove(&old.key);
        self.index.insert(key.into(), i);
    }

    /// The smallest count, when full (a key not in the sketch was refused at most that
    /// often), else 0.
    fn floor(&self) -> u64 {
        if self.counters.len() < COUNTERS {
            0
        } else {
            self.counters.iter().map(|c| c.count).min().unwrap_or(0)
        }
    }
}

/// The current window's sketch and the one before.
#[derive(Debug)]
struct Windows {
    current: Sketch,
    previous: Sketch,
    /// When the current window began.
    started: Instant,
    /// When the previous window began (`None` before the first rotation).
    previous_started: Option<Instant>,
}

/// The keys one policy refused most lately.
#[derive(Debug)]
pub(crate) struct Offenders {
    windows: Mutex<Windows>,
}

impl Default for Offenders {
    fn default() -> Self {
        Self {
            windows: Mutex::new(Windows {
                current: Sketch::default(),
                previous: Sketch::default(),
                started: Instant::now(),
                previous_started: None,
            }),
        }
    }
}

impl Offenders {
    /// Counts a refusal of `key` at `now`.
    pub(crate) fn add(&self, key: &[u8], now: Instant) {
        let mut windows = self.lock();
        windows.rotate(now);
        windows.current.add(key);
    }

    /// The `max` keys refused most over both windows, most first: each key's counts
    /// summed (a key missing from one window counted at that window's floor, which is
    /// added to its error).
    pub(crate) fn top(&self, max: usize, now: Instant) -> Vec<(Key<'static>, u64, u64, Duration)> {
        let mut windows = self.lock();
        windows.rotate(now);
        let since =
            now.saturating_duration_since(windows.previous_started.unwrap_or(windows.started));
        let (current, previous) = (&windows.current, &windows.previous);
        let mut merged: HashMap<&[u8], (u64, u64)> = HashMap::new();
        for (sketch, other) in [(current, previous), (previous, current)] {
            let floor = other.floor();
            for counter in &sketch.counters {
                let entry = merged.entry(&counter.key).or_insert((0, 0));
                entry.0 += counter.count;
                entry.1 += counter.error;
                if !other.index.contains_key(&counter.key) {
                    // Counted in one window only: the other may have refused it up to
                    // its floor times.
                    entry.0 += floor;
                    entry.1 += floor;
                }
            }
        }
        let mut top: Vec<(Key<'static>, u64, u64, Duration)> = merged
            .into_iter()
            .map(|(key, (count, error))| (Key::from(key.to_vec()), count, error, since))
            .collect();
        top.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| a.0.as_bytes().cmp(b.0.as_bytes()))
        });
        top.truncate(max);
        top
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Windows> {
        // A panic while counting leaves at worst one count off: carry on.
        self.windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Windows {
    /// Starts a new window when the current one is over (the current one becomes the
    /// previous; after a window of no refusals at all, both are forgotten).
    fn rotate(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.started);
        if age < WINDOW {
            return;
        }
        if age < 2 * WINDOW {
            self.previous = std::mem::take(&mut self.current);
            self.previous_started = Some(self.started);
            self.started += WINDOW;
        } else {
            self.previous = Sketch::default();
            self.current = Sketch::default();
            self.previous_started = None;
            self.started = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Zipf stream: `n` draws over `universe` keys, rank `k` drawn in proportion to
    /// `1 / k^s`, from a fixed seed (xorshift64*).
    fn zipf(n: usize, universe: usize, s: f64, seed: u64) -> Vec<usize> {
        let weights: Vec<f64> = (1..=universe).map(|k| 1.0 / (k as f64).powf(s)).collect();
        let total: f64 = weights.iter().sum();
        let mut cumulative = Vec::with_capacity(universe);
        let mut sum = 0.0;
        for w in &weights {
            sum += w / total;
            cumulative.push(sum);
        }
        let mut state = seed;
        (0..n)
            .map(|_| {
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let r =
                    (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
                cumulative.partition_point(|&c| c < r).min(universe - 1)
            })
            .collect()
    }

    /// 100 000 refusals over 100 000 possible keys (Zipf, s = 1.1, keys in a random
    /// order of first appearance): the true top 10 are the sketch's top 10, each count
    /// within its stated error of the truth, every error within the bound
    /// (refusals / counters), the memory 256 counters.
    #[test]
    fn a_zipf_stream_of_100_000_keys_gives_the_true_top_10() {
        for seed in [1, 7, 2026] {
            let stream = zipf(100_000, 100_000, 1.1, seed);
            let offenders = Offenders::default();
            let now = Instant::now();
            let mut truth: HashMap<usize, u64> = HashMap::new();
            for &rank in &stream {
                // Ranks are not the order keys appear in: a key's bytes say nothing.
                let key = format!(
                    "ip:10.{}.{}.{}",
                    rank % 251,
                    (rank / 251) % 251,
                    rank / 63_001
                );
                offenders.add(key.as_bytes(), now);
                *truth.entry(rank).or_default() += 1;
            }
            let sketch = offenders.lock();
            assert_eq!(sketch.current.counters.len(), COUNTERS);
            assert_eq!(sketch.current.index.len(), COUNTERS);
            drop(sketch);
            let bound = 100_000 / COUNTERS as u64;
            let top = offenders.top(10, now);
            let mut true_top: Vec<(usize, u64)> = truth.iter().map(|(&r, &c)| (r, c)).collect();
            true_top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let name = |rank: usize| {
                format!(
                    "ip:10.{}.{}.{}",
                    rank % 251,
                    (rank / 251) % 251,
                    rank / 63_001
                )
            };
            for (key, count, error, _) in &top {
                let rank = true_top
                    .iter()
                    .find(|(r, _)| name(*r).as_bytes() == key.as_bytes())
                    .expect("a key of the stream");
                assert!(*error <= bound, "seed {seed}: error {error} above {bound}");
                assert!(
                    rank.1 <= *count && *count - error <= rank.1,
                    "seed {seed}: {key:?} counted {count} (error {error}), truly {}",
                    rank.1
                );
            }
            let found: Vec<String> = top
                .iter()
                .map(|(k, ..)| String::from_utf8_lossy(k).into_owned())
                .collect();
            let wanted: Vec<String> = true_top[..10].iter().map(|(r, _)| name(*r)).collect();
            assert_eq!(found, wanted, "seed {seed}");
        }
    }

    #[test]
    fn windows_rotate_and_age_out() {
        let offenders = Offenders::default();
        let t0 = Instant::now();
        for _ in 0..3 {
            offenders.add(b"a", t0);
        }
        offenders.add(b"b", t0 + WINDOW);
        // Both windows: a from the previous, b from the current.
        let top = offenders.top(10, t0 + WINDOW);
        let counts: Vec<(&[u8], u64)> = top.iter().map(|(k, c, ..)| (k.as_bytes(), *c)).collect();
        assert_eq!(counts, [(&b"a"[..], 3), (&b"b"[..], 1)]);
        // A window later a is gone; two later, everything.
        assert_eq!(offenders.top(10, t0 + 2 * WINDOW).len(), 1);
        assert!(offenders.top(10, t0 + 4 * WINDOW).is_empty());
    }
}
