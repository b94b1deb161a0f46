//! The slots' two hosts: the Redis script (`in_flight.lua`, one sorted set per key whose
//! members are leases) and the in-process counts; and the one renewal task per limiter
//! that keeps this instance's Redis leases alive while their requests run.

use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use dashmap::DashMap;
use smallvec::SmallVec;

use crate::backend::{Backend, Call, FailurePolicy, Layout, Owner, Scripts, TimeSource};
use crate::decision::{Decision, Source, State};
use crate::metrics::RedisMetrics;

/// The in-flight script in both time versions, as a library of Redis Functions (loaded
/// on a server's first call) and as a script for `EVALSHA`.
pub(crate) static SCRIPTS: LazyLock<Scripts> =
    LazyLock::new(|| Scripts::standalone(include_str!("in_flight.lua")));

/// The script's operations.
pub(crate) const ACQUIRE: &str = "a";
pub(crate) const RELEASE: &str = "r";
pub(crate) const RENEW: &str = "n";
pub(crate) const PEEK: &str = "p";

/// The in-process counts of one limit, by key (shared by the limiters of one name on a
/// backend). A key is there only while it holds slots, so the map holds at most as many
/// keys as there are requests in flight: never evicted, never swept.
#[derive(Debug, Default)]
pub(crate) struct LocalCounts(DashMap<Box<[u8]>, u64>);

impl LocalCounts {
    /// Takes a slot of `key` if fewer than `limit` are held: the slots held then, or
    /// `Err` with the slots held.
    fn take(&self, key: &[u8], limit: u64) -> Result<u64, u64> {
        let take = |held: &mut u64| {
            if *held >= limit {
                return Err(*held);
            }
            *held += 1;
            Ok(*held)
        };
        if let Some(mut held) = self.0.get_mut(key) {
            return take(&mut held);
        }
        let result = take(&mut self.0.entry(key.into()).or_insert(0));
        // A limit of 0 (never built) would leave an empty entry.
        self.0.remove_if(key, |_, held| *held == 0);
        result
    }

    fn give_back(&self, key: &[u8]) {
        if let Some(mut held) = self.0.get_mut(key) {
            *held = held.saturating_sub(1);
        }
        self.0.remove_if(key, |_, held| *held == 0);
    }

    fn held(&self, key: &[u8]) -> u64 {
        self.0.get(key).map_or(0, |held| *held)
    }
}

#[cfg(test)]
impl Slots {
    /// Whether no key holds an in-process slot.
    pub(crate) fn local_is_empty(&self) -> bool {
        self.local.0.is_empty()
    }
}

/// One in-flight limit on a backend: its settings, its keys, its in-process counts and
/// the Redis slots this instance holds (renewed together).
#[derive(Debug)]
pub(crate) struct Slots {
    pub(crate) backend: Backend,
    layout: Layout,
    pub(crate) slots: u64,
    pub(crate) lease: Duration,
    lease_ms: u64,
    pub(crate) retry_after: Duration,
    local: Arc<LocalCounts>,
    /// This instance's part of every slot id: random per limiter.
    instance: u64,
    next_id: AtomicU64,
    /// The Redis slots held here, by Redis key: what the renewal renews.
    held: DashMap<Box<[u8]>, SmallVec<[u64; 4]>>,
    renewing: AtomicBool,
    /// The policy name, for the metrics.
    name: String,
    /// The duration of the calls that take slots.
    metrics: RedisMetrics,
}

impl Slots {
    pub(crate) fn new(
        backend: &Backend,
        name: &str,
        slots: u64,
        lease: Duration,
        retry_after: Duration,
    ) -> Self {
        let layout = backend.layout("inflight", Owner::Own(name));
        let local = backend
            .local_store()
            .shared::<LocalCounts>(layout.local_id(b"inflight", 0));
        let instance = std::collections::hash_map::RandomState::new().hash_one((
            std::process::id(),
            name,
            std::time::SystemTime::now(),
        ));
        Self {
            backend: backend.clone(),
            layout,
            slots,
            lease,
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            retry_after,
            local,
            instance,
            next_id: AtomicU64::new(0),
            held: DashMap::new(),
            renewing: AtomicBool::new(false),
            name: name.to_owned(),
            metrics: RedisMetrics::default(),
        }
    }

    /// Takes a slot of `key`: one round trip on Redis (while the breaker lets calls
    /// through), the in-process counts otherwise.
    pub(crate) fn acquire(self: &Arc<Self>, key: &[u8]) -> Acquire {
        let Some(redis) = self.backend.redis_handle() else {
            return Acquire::Ready(Some(self.take_local(key, self.slots, Source::InProcess)));
        };
        if !redis.admit() {
            return Acquire::Ready(Some(self.unavailable(key)));
        }
        let redis_key: Box<[u8]> = self.layout.redis_key(key).into();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let call = self.call(ACQUIRE, &redis_key, &[id]);
        let redis = Arc::clone(redis);
        // Should the request go away during the call, the slot it may have taken is
        // given back at once.
        let mut pending = PendingSlot {
            slots: Arc::clone(self),
            redis_key: Some(redis_key),
            id,
        };
        Acquire::Pending(Box::pin(async move {
            let started = std::time::Instant::now();
            let reply = redis.eval(&call).await.ok();
            let this = Arc::clone(&pending.slots);
            this.metrics.duration(&this.name, started.elapsed());
            match reply.as_deref() {
                Some(&[admitted, held]) => {
                    let held = u64::try_from(held).unwrap_or(0);
                    if admitted != 1 {
                        pending.redis_key.take();
                        return (this.refused(held, Source::Redis), None);
                    }
                    let redis_key = pending.redis_key.take().expect("taken once");
                    this.hold(&redis_key, id);
                    let decision = this.admitted(held, Source::Redis);
                    (decision, Some(Held::Redis { redis_key, id }))
                }
                // The key, read back from the Redis key (only on this failure path).
                _ => {
                    let redis_key = pending.redis_key.as_deref().unwrap_or_default();
                    let key = this.layout.key_of(redis_key).unwrap_or_default();
                    this.unavailable(&key)
                }
            }
        }))
    }

    /// How many slots of `key` are held, spending nothing.
    pub(crate) fn in_flight(
        self: &Arc<Self>,
        key: &[u8],
    ) -> Pin<Box<dyn Future<Output = u64> + Send>> {
        let local = self.local.held(key);
        let Some(redis) = self.backend.redis_handle() else {
            return Box::pin(std::future::ready(local));
        };
        if !redis.admit() {
            return Box::pin(std::future::ready(local));
        }
        let call = self.call(PEEK, &self.layout.redis_key(key), &[]);
        let redis = Arc::clone(redis);
        Box::pin(async move {
            match redis.eval(&call).await.ok().as_deref() {
                Some(&[_, held]) => u64::try_from(held).unwrap_or(0),
                _ => local,
            }
        })
    }

    /// Gives a slot back.
    pub(crate) fn release(self: &Arc<Self>, held: Held) {
        match held {
            Held::Local { key } => self.local.give_back(&key),
            Held::Redis { redis_key, id } => {
                self.unhold(&redis_key, id);
                self.release_remote(&redis_key, id);
            }
        }
    }

    /// Removes slot `id` from `redis_key` on Redis, in the background; when that cannot
    /// be done, its lease runs out on its own.
    fn release_remote(self: &Arc<Self>, redis_key: &[u8], id: u64) {
        let Some(redis) = self.backend.redis_handle() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let call = self.call(RELEASE, redis_key, &[id]);
        let redis = Arc::clone(redis);
        runtime.spawn(async move {
            let _ = redis.eval(&call).await;
        });
    }

    /// One call of the script: the key, the operation, the limit, the lease, the slot
    /// ids, and the caller's time when the backend sends it.
    fn call(&self, op: &str, redis_key: &[u8], ids: &[u64]) -> Call {
        let time = self.backend.time_source();
        let functions = self
            .backend
            .redis_handle()
            .is_some_and(|redis| redis.engine_functions());
        let args = 1 + 3 + ids.len() + 1;
        let mut call = Call::engine(
            &SCRIPTS,
            time,
            functions,
            // (Every operation of the script writes: each drops the expired leases.)
            false,
            1,
            args,
            redis_key.len() + 48 + ids.len() * 16,
        );
        call.key(redis_key)
            .arg(op)
            .arg(self.slots)
            .arg(self.lease_ms);
        for &id in ids {
            call.arg(&self.member(id)[..]);
        }
        if time == TimeSource::Caller {
            call.arg(self.backend.caller_now_us());
        }
        call
    }

    /// Slot `id`'s member in the key's set: this instance, then the id.
    fn member(&self, id: u64) -> [u8; 16] {
        let mut member = [0; 16];
        member[..8].copy_from_slice(&self.instance.to_be_bytes());
        member[8..].copy_from_slice(&id.to_be_bytes());
        member
    }

    /// A slot in the in-process counts, of at most `limit`.
    fn take_local(&self, key: &[u8], limit: u64, source: Source) -> (Decision, Option<Held>) {
        match self.local.take(key, limit) {
            Ok(held) => {
                let decision = self.admitted_of(limit, held, source);
                (decision, Some(Held::Local { key: key.into() }))
            }
            Err(held) => (self.refused_of(limit, held, source), None),
        }
    }

    /// The answer while Redis cannot give one, by the layer's failure policy.
    fn unavailable(&self, key: &[u8]) -> (Decision, Option<Held>) {
        match self.backend.failover().policy {
            FailurePolicy::FailOpen => {
                let decision = Decision::new(
                    State::Allowed,
                    self.slots,
                    self.slots,
                    Duration::ZERO,
                    Source::FailOpen,
                );
                (decision, None)
            }
            FailurePolicy::FailClosed => {
                let retry = self
                    .backend
                    .redis_handle()
                    .map_or(crate::backend::DEFAULT_PROBE_INTERVAL, |r| {
                        r.probe_interval()
                    });
                let decision =
                    Decision::new(State::OverQuota, self.slots, 0, retry, Source::FailClosed)
                        .with_retry_after(retry);
                (decision, None)
            }
            // Each instance its share of the slots.
            _ => self.take_local(key, self.backend.local_limit(self.slots), Source::Fallback),
        }
    }

    fn admitted(&self, held: u64, source: Source) -> Decision {
        self.admitted_of(self.slots, held, source)
    }

    fn admitted_of(&self, limit: u64, held: u64, source: Source) -> Decision {
        let state = if held >= limit {
            State::HitQuota
        } else {
            State::Allowed
        };
        Decision::new(
            state,
            limit,
            limit.saturating_sub(held),
            Duration::ZERO,
            source,
        )
    }

    fn refused(&self, held: u64, source: Source) -> Decision {
        self.refused_of(self.slots, held, source)
    }

    /// A refusal: a slot frees when a request ends, which nobody can foresee, so the
    /// client is told to come back after the configured `retry_after`.
    fn refused_of(&self, limit: u64, held: u64, source: Source) -> Decision {
        let _ = held;
        Decision::new(State::OverQuota, limit, 0, self.retry_after, source)
            .with_retry_after(self.retry_after)
    }

    /// Notes a Redis slot held here, for the renewal, which starts with the first one.
    fn hold(self: &Arc<Self>, redis_key: &[u8], id: u64) {
        match self.held.get_mut(redis_key) {
            Some(mut ids) => ids.push(id),
            None => self.held.entry(redis_key.into()).or_default().push(id),
        }
        if !self.renewing.load(Ordering::Relaxed) && !self.renewing.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(renew(Arc::downgrade(self), self.renew_every()));
                }
                Err(_) => self.renewing.store(false, Ordering::Release),
            }
        }
    }

    fn unhold(&self, redis_key: &[u8], id: u64) {
        if let Some(mut ids) = self.held.get_mut(redis_key) {
            ids.retain(|held| *held != id);
        }
        self.held.remove_if(redis_key, |_, ids| ids.is_empty());
    }

    /// How often the leases are renewed: three times per lease, so that a renewal
    /// that fails (one call timeout) leaves two more before the lease runs out.
    pub(crate) fn renew_every(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(1))
    }

    /// Renews every Redis slot held here: one call per key holding slots, whatever the
    /// number of slots, the calls of all keys at once.
    async fn renew_all(self: &Arc<Self>) {
        let Some(redis) = self.backend.redis_handle() else {
            return;
        };
        // While the breaker is open, the leases cannot be renewed: they run out, and
        // the slots count again once Redis is back only for the requests that start then.
        if !redis.admit() {
            return;
        }
        let mut calls = tokio::task::JoinSet::new();
        for entry in &self.held {
            let call = self.call(RENEW, entry.key(), entry.value());
            let redis = Arc::clone(redis);
            calls.spawn(async move {
                let _ = redis.eval(&call).await;
            });
        }
        while calls.join_next().await.is_some() {}
    }
}

/// The renewal of one limiter's Redis slots: every `every`, while the limiter exists.
async fn renew(slots: Weak<Slots>, every: Duration) {
    // Should this task end with its runtime (a limiter used from several runtimes), the
    // next slot held starts another.
    let _running = Running(slots.clone());
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(slots) = slots.upgrade() else {
            return;
        };
        if slots.held.is_empty() {
            continue;
        }
        slots.renew_all().await;
    }
}

/// Marks the renewal task as running while it lives.
struct Running(Weak<Slots>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(slots) = self.0.upgrade() {
            slots.renewing.store(false, Ordering::Release);
        }
    }
}

/// A slot that is held: where, and which.
#[derive(Debug)]
pub(crate) enum Held {
    /// In the in-process counts (no Redis, or the fallback).
    Local { key: Box<[u8]> },
    /// On Redis: slot `id` of the set `redis_key`.
    Redis { redis_key: Box<[u8]>, id: u64 },
}

/// A slot asked of Redis whose answer has not come: given back if the request goes
/// away meanwhile (its `redis_key` is taken once the answer is known).
struct PendingSlot {
    slots: Arc<Slots>,
    redis_key: Option<Box<[u8]>>,
    id: u64,
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        if let Some(redis_key) = self.redis_key.take() {
            self.slots.release_remote(&redis_key, self.id);
        }
    }
}

/// The answer of an acquisition: the decision, and the slot when one was taken.
pub(crate) type Acquired = (Decision, Option<Held>);

/// An acquisition: known at once (in process), or after a round trip.
pub(crate) enum Acquire {
    Ready(Option<Acquired>),
    Pending(Pin<Box<dyn Future<Output = Acquired> + Send>>),
}

impl Acquire {
    /// Takes the answer out if it was known at once.
    pub(crate) fn take_ready(&mut self) -> Option<Acquired> {
        match self {
            Self::Ready(ready) => ready.take(),
            Self::Pending(_) => None,
        }
    }
}

impl Future for Acquire {
    type Output = Acquired;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Acquired> {
        match self.get_mut() {
            Self::Ready(ready) => Poll::Ready(ready.take().expect("polled after completion")),
            Self::Pending(future) => future.as_mut().poll(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    /// Redis Cluster and managed servers need every key a script touches in `KEYS`, and
    /// cluster proxies read it from the call's text: each call of the in-flight script
    /// touches `KEYS[1]`, written so (tests/dialect.rs checks every script alike).
    #[test]
    fn every_key_the_script_touches_is_declared() {
        let lua = include_str!("in_flight.lua");
        let mut calls = 0;
        for (at, open) in lua.match_indices("redis.call(") {
            let args = &lua[at + open.len()..];
            let args = &args[..args.find(')').expect("a closing parenthesis")];
            let mut args = args.split(',').map(str::trim);
            let command = args.next().unwrap();
            assert_ne!(command, "'TIME'", "the time comes from the prelude");
            assert_eq!(
                args.next(),
                Some("KEYS[1]"),
                "{command} touches another key"
            );
            calls += 1;
        }
        assert_eq!(calls, 12);
    }
}
