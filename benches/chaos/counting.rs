//! Counting what a run saw: warn lines, switches to the fallback and back, and the
//! samples of every decision.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// Counting: warn lines, switches, decisions
// ---------------------------------------------------------------------------

pub(crate) static WARNS: AtomicU64 = AtomicU64::new(0);
pub(crate) static INFO_AND_UP: AtomicU64 = AtomicU64::new(0);

/// A tracing layer that counts `WARN` events, and all events at `INFO` or above (what a
/// default log filter shows).
pub(crate) struct CountWarnings;

impl<S: tracing::Subscriber> Layer<S> for CountWarnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let level = *event.metadata().level();
        if level == tracing::Level::WARN {
            WARNS.fetch_add(1, Ordering::Relaxed);
        }
        if level <= tracing::Level::INFO {
            INFO_AND_UP.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `(warn lines, lines at info or above)` logged so far.
pub(crate) fn log_lines() -> (u64, u64) {
    (
        WARNS.load(Ordering::Relaxed),
        INFO_AND_UP.load(Ordering::Relaxed),
    )
}

/// When the backend switched to the fallback and back, since the scenario's clock.
#[derive(Debug, Clone, Default)]
pub(crate) struct Switches {
    pub(crate) to_fallback: Vec<Duration>,
    pub(crate) to_redis: Vec<Duration>,
}

impl Switches {
    pub(crate) fn count(&self) -> usize {
        self.to_fallback.len()
    }

    pub(crate) fn count_between(&self, from: Duration, to: Duration) -> usize {
        self.to_fallback
            .iter()
            .filter(|t| (from..to).contains(t))
            .count()
    }

    /// Switches both ways (to the fallback and back to Redis) within `from..to`.
    pub(crate) fn transitions_between(&self, from: Duration, to: Duration) -> usize {
        self.count_between(from, to)
            + self
                .to_redis
                .iter()
                .filter(|t| (from..to).contains(t))
                .count()
    }
}

pub(crate) struct SwitchWatch {
    pub(crate) log: Arc<Mutex<Switches>>,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl SwitchWatch {
    pub(crate) fn finish(self) -> Switches {
        self.task.abort();
        self.log.lock().unwrap().clone()
    }
}

/// Polls `backend.redis_state()` every millisecond and records every switch to the
/// fallback (`true` -> `false`) and back. The one place that counts switches: swap the
/// polling for the backend's own counter once it has one.
pub(crate) fn watch_switches(backend: &Backend, clock: Instant) -> SwitchWatch {
    let log = Arc::new(Mutex::new(Switches::default()));
    let backend = backend.clone();
    let task = tokio::spawn({
        let log = Arc::clone(&log);
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
            let mut healthy = !matches!(
                backend.redis_state(),
                Some(RedisState::Fallback | RedisState::Recovering)
            );
            loop {
                tick.tick().await;
                let now = !matches!(
                    backend.redis_state(),
                    Some(RedisState::Fallback | RedisState::Recovering)
                );
                if now != healthy {
                    let mut log = log.lock().unwrap();
                    let at = clock.elapsed();
                    if now {
                        &mut log.to_redis
                    } else {
                        &mut log.to_fallback
                    }
                    .push(at);
                    healthy = now;
                }
            }
        }
    });
    SwitchWatch { log, task }
}

/// One decision: when it was asked (since the scenario's clock), on which key, what answered, and how long it took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) at: Duration,
    pub(crate) key: usize,
    pub(crate) source: Source,
    pub(crate) admitted: bool,
    pub(crate) latency: Duration,
}

impl Sample {
    pub(crate) fn on_redis(&self) -> bool {
        matches!(self.source, Source::Redis | Source::DenyCache)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Samples(pub(crate) Vec<Sample>);

impl Samples {
    /// The share of decisions from Redis among those `which` selects.
    pub(crate) fn on_redis(&self, which: impl Fn(&Sample) -> bool) -> Option<f64> {
        let (mut all, mut redis) = (0usize, 0usize);
        for s in self.0.iter().filter(|s| which(s)) {
            all += 1;
            redis += usize::from(s.on_redis());
        }
        (all > 0).then(|| redis as f64 / all as f64)
    }

    pub(crate) fn admitted(&self, which: impl Fn(&Sample) -> bool) -> usize {
        self.0.iter().filter(|s| which(s) && s.admitted).count()
    }

    pub(crate) fn count(&self, which: impl Fn(&Sample) -> bool) -> usize {
        self.0.iter().filter(|s| which(s)).count()
    }

    /// The first decision from Redis asked at or after `after`.
    pub(crate) fn first_on_redis(&self, after: Duration) -> Option<Duration> {
        self.0
            .iter()
            .filter(|s| s.at >= after && s.on_redis())
            .map(|s| s.at - after)
            .min()
    }

    /// The `q` quantile (0..=1) of the latency of the decisions `which` selects.
    pub(crate) fn latency(&self, q: f64, which: impl Fn(&Sample) -> bool) -> Option<Duration> {
        let mut latencies: Vec<Duration> = self
            .0
            .iter()
            .filter(|s| which(s))
            .map(|s| s.latency)
            .collect();
        if latencies.is_empty() {
            return None;
        }
        latencies.sort_unstable();
        let index = ((latencies.len() - 1) as f64 * q).round() as usize;
        Some(latencies[index])
    }

    /// Decisions by source, for the log line of a run.
    pub(crate) fn sources(&self) -> String {
        let mut by: HashMap<String, usize> = HashMap::new();
        for s in &self.0 {
            *by.entry(format!("{:?}", s.source)).or_default() += 1;
        }
        let mut by: Vec<_> = by.into_iter().collect();
        by.sort();
        by.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub(crate) fn between(from: Duration, to: Duration) -> impl Fn(&Sample) -> bool {
    move |s| (from..to).contains(&s.at)
}
