//! How a limiter's check is answered: [`Hosts`] is one algorithm's two hosts (its Redis
//! script and its in-process state), and [`check`] picks the one that answers — Redis
//! when the breaker lets the check through, the layer's failure policy otherwise.

use std::num::NonZeroU32;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use super::block::Blocks;
use super::coalesce::{Coalescer, Leader, Turn};
use super::connect::{Args, Call};
use super::deny::Denied;
use super::layout::{Layout, Owner};
use super::lease::{check_leased, Leases};
use super::redis::{Fault, RedisBackend, ScriptError};
use super::{Backend, FailurePolicy, Scripts, TimeSource, DEFAULT_PROBE_INTERVAL};
use crate::decision::{Decision, Source, State};
use crate::limiter::Check;
use crate::metrics::RedisMetrics;

/// The engine: every algorithm as a function, and the code that runs one limit or a set
/// of limits with them, in both time versions, as a script (`EVALSHA`) and as a library
/// of Redis Functions. Loaded once per connection (script) or per server (library).
pub(crate) static ENGINE: LazyLock<Scripts> =
    LazyLock::new(|| Scripts::new(&engine_lean(), &engine_general()));

/// The engine's lean check (`lean.lua`, after each algorithm's lean functions): what a
/// common check runs, before the general engine's text.
pub(crate) fn engine_lean() -> String {
    [
        include_str!("../period/period_lean.lua"),
        include_str!("../token_bucket/token_bucket_lean.lua"),
        include_str!("../rolling/rolling_lean.lua"),
        include_str!("lean.lua"),
    ]
    .concat()
}

/// The general engine (`engine.lua`, after every algorithm's steps), which defines
/// `engine(KEYS, ARGV, L)`.
pub(crate) fn engine_general() -> String {
    [
        include_str!("../period/period.lua"),
        include_str!("../token_bucket/token_bucket.lua"),
        include_str!("../rolling/rolling.lua"),
        include_str!("engine.lua"),
    ]
    .concat()
}

/// The engine's operation that spends when every limit admits.
pub(crate) const CHECK: &str = "c";

/// What one limiter needs of the backend: the handle, its Redis key layout, and its
/// Redis metrics.
#[derive(Debug)]
pub(crate) struct Remote {
    backend: Backend,
    /// How this limiter's Redis keys are built.
    layout: Layout,
    /// How its keys' blocks are built.
    block_layout: Layout,
    /// The policy name, for metrics labels.
    name: String,
    metrics: RedisMetrics,
    /// This limiter's blocked keys and lockout.
    blocks: Blocks,
    /// This limiter's calls in flight, and the checks of the same key waiting for them.
    coalescer: Coalescer,
    /// The limits' part of the engine's `ARGV`, encoded on first use.
    limit_args: OnceLock<Args>,
}

impl Remote {
    /// The backend side of `owner`'s limiter of algorithm `kind`, with `lockout`.
    pub(crate) fn new(
        backend: &Backend,
        kind: &str,
        owner: Owner<'_>,
        lockout: Option<Duration>,
    ) -> Self {
        let layout = backend.layout(kind, owner);
        let block_layout = layout.blocks();
        let blocks = Blocks::new(
            &backend.inner.local,
            block_layout.local_id(b"block", 0),
            lockout,
        );
        Self {
            backend: backend.clone(),
            layout,
            block_layout,
            name: owner.policy_name().into_owned(),
            metrics: RedisMetrics::default(),
            blocks,
            coalescer: Coalescer::default(),
            limit_args: OnceLock::new(),
        }
    }

    /// The limits' part of the engine's `ARGV`, one argument (encoded by `encode` the
    /// first time, its words joined by `:`).
    fn limit_args(&self, encode: impl FnOnce(&mut Args)) -> &Args {
        self.limit_args.get_or_init(|| {
            let mut words = Args::default();
            encode(&mut words);
            let mut args = Args::default();
            args.arg(words.joined(b':'));
            args
        })
    }

    pub(crate) fn coalescer(&self) -> &Coalescer {
        &self.coalescer
    }

    /// Records a call's duration in the metrics.
    pub(crate) fn record_duration(&self, elapsed: Duration) {
        self.metrics.duration(&self.name, elapsed);
    }

    /// Records a failed call in the metrics.
    pub(crate) fn record_error(&self, error: &ScriptError) {
        crate::metrics::redis_error(&self.name, error.fault().label());
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The Redis key of `key` for this limiter.
    pub(crate) fn redis_key(&self, key: &[u8]) -> Vec<u8> {
        self.layout.redis_key(key)
    }

    /// Adds the Redis key of `key` to `call`, written straight into it.
    pub(crate) fn add_redis_key(&self, key: &[u8], call: &mut Call) {
        call.key_written(|out| self.layout.write_redis_key(key, out));
    }

    /// The key whose Redis key is `redis_key`, if it is one of this limiter's.
    pub(crate) fn key_of<'a>(&self, redis_key: &'a [u8]) -> Option<std::borrow::Cow<'a, [u8]>> {
        self.layout.key_of(redis_key)
    }

    /// The id of this limiter's in-process state `role` of `shape` (see
    /// [`Layout::local_id`]): the same for every limiter of its name and algorithm.
    pub(crate) fn local_id(&self, role: &[u8], shape: u64) -> u64 {
        self.layout.local_id(role, shape)
    }

    /// The blocks of `key`s of this limiter's name, with `lockout`, for a
    /// [set](crate::set) (whose block is its first limit's).
    pub(crate) fn set_blocks(&self, lockout: Option<Duration>) -> Blocks {
        let id = self.block_layout.local_id(b"block", 0);
        Blocks::new(&self.backend.inner.local, id, lockout)
    }

    /// The layout of this limiter's keys.
    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// One algorithm's two hosts on a backend: its Redis script (arguments in, reply out) and
/// its in-process state, with the same semantics. [`check`] picks the host that answers.
pub(crate) trait Hosts: Send + Sync + 'static {
    fn remote(&self) -> &Remote;
    /// The largest cost that can ever be admitted at once.
    fn capacity(&self) -> u64;
    /// The decision for a cost above [`capacity`](Self::capacity).
    fn exceeds_capacity(&self, source: Source) -> Decision;
    /// How many limits the engine decides for one check: one, or a
    /// [set](crate::set)'s members.
    fn limit_count(&self) -> usize {
        1
    }
    /// Appends the Redis keys of the limits after the first (whose key, `remote`'s, the
    /// check adds): none for one limit.
    fn extra_keys(&self, key: &[u8], call: &mut Call) {
        let _ = (key, call);
    }
    /// Each limit's part of the engine's `ARGV`: its algorithm's letter, the count of its
    /// arguments and the arguments (see `engine.lua`). Encoded once per limiter
    /// ([`Remote::limit_args`]).
    fn limit_args(&self, args: &mut Args);
    /// How many numbers this limit's reply holds (its admitted flag first).
    fn reply_len(&self) -> usize;
    /// Reads this limit's part of the engine's reply; `None` when it is not of the
    /// expected shape.
    fn decide(&self, reply: &[i64], cost: NonZeroU32) -> Option<Decision>;
    /// Each limit's own decision in `reply`, for a set, whose refusal the deny cache
    /// keeps limit by limit: `None` for one limit (the default).
    fn member_decisions(&self, reply: &[i64], cost: NonZeroU32) -> Option<Arc<[Decision]>> {
        let _ = (reply, cost);
        None
    }
    /// The one decision of a set from its limits' decisions (those that
    /// [`member_decisions`](Self::member_decisions) gave, aged), with every limit in the
    /// headers: `None` for one limit (the default).
    fn combine_members(&self, members: &[Decision]) -> Option<Decision> {
        let _ = members;
        None
    }
    /// Answers from the in-process state; with `spend` false, only says what spending
    /// would answer, changing nothing (a `cost` of 0: where the key stands).
    fn local(&self, key: &[u8], cost: u32, source: Source, spend: bool) -> Decision;
    /// The leases of this limit, when it takes leases (token buckets may).
    fn leases(&self) -> Option<&Leases> {
        None
    }
    /// The blocked keys and the lockout of this limit (or set).
    fn blocks(&self) -> &Blocks {
        &self.remote().blocks
    }
    /// Gives `cost` units back to `key` in the in-process state.
    fn local_refund(&self, key: &[u8], cost: u32);
    /// Forgets `key` in the in-process state.
    fn local_reset(&self, key: &[u8]);
    /// Takes `cost` units at the earliest time they fit, at most `max_wait_us` away,
    /// in the in-process state: an admitted decision's `retry_after` is the wait before
    /// using them. `None` for the algorithms that cannot reserve ahead (the default).
    fn local_reserve(
        &self,
        key: &[u8],
        cost: u32,
        max_wait_us: u64,
        source: Source,
    ) -> Option<Decision> {
        let _ = (key, cost, max_wait_us, source);
        None
    }
}

/// A check on the in-process state: refused while the key is blocked (spending
/// nothing), and a refusal starts the limit's lockout.
fn local_check<T: Hosts + ?Sized>(store: &T, key: &[u8], cost: u32, source: Source) -> Decision {
    let blocks = store.blocks();
    let local = &*store.remote().backend.inner.local;
    let now_us = || store.remote().backend.clock().now_us();
    if let Some(until) = blocks.until(local, key, now_us) {
        let decision = store.local(key, 0, source, false);
        return blocked(
            decision,
            Duration::from_micros(until.saturating_sub(now_us())),
        );
    }
    let decision = store.local(key, cost, source, true);
    if decision.is_admitted() || decision.state == State::ExceedsCapacity {
        return decision;
    }
    let now = now_us();
    match blocks.lock_out(local, key, now) {
        Some(until) => blocked(decision, Duration::from_micros(until.saturating_sub(now))),
        None => decision,
    }
}

/// `decision` for a key blocked for `wait` more: refused, with nothing left until then.
pub(super) fn blocked(mut decision: Decision, wait: Duration) -> Decision {
    decision.state = State::OverQuota;
    decision.remaining = 0;
    decision.reset = decision.reset.max(wait);
    decision.retry_after = Some(decision.retry_after.map_or(wait, |r| r.max(wait)));
    decision
}

/// The engine's reply: `{admitted, blocked ms, each limit's reply}`.
pub(super) fn read_reply<T: Hosts + ?Sized>(
    store: &T,
    reply: &[i64],
    cost: NonZeroU32,
) -> Option<Decision> {
    let blocked_ms = u64::try_from(*reply.get(1)?).ok()?;
    let decision = store.decide(reply.get(2..)?, cost)?;
    Some(if blocked_ms > 0 {
        blocked(decision, Duration::from_millis(blocked_ms))
    } else {
        decision
    })
}

/// Answers a check from Redis when the breaker lets it through (one round trip, run by
/// SHA), by the layer's [`FailurePolicy`] otherwise; a failed round trip is answered by
/// the failure policy too, and counts toward the breaker unless it concerns only its key.
/// A key Redis refused recently is refused from the deny cache without a round trip.
pub(crate) fn check<T: Hosts + ?Sized>(store: &Arc<T>, key: &[u8], cost: NonZeroU32) -> Check {
    let remote = store.remote();
    let backend = &remote.backend;
    let redis = backend.redis_handle();
    if u64::from(cost.get()) > store.capacity() {
        return Check::ready(store.exceeds_capacity(answering(redis)));
    }
    let Some(redis) = redis else {
        return Check::ready(local_check(&**store, key, cost.get(), Source::InProcess));
    };
    if let Some(leases) = store.leases() {
        return check_leased(store, leases, redis, key, cost);
    }
    if !redis.admit() {
        return Check::ready(unavailable(&**store, key, cost));
    }
    let redis_key = remote.redis_key(key);
    let deny_key = match cached_refusal(&**store, &redis_key) {
        Ok(deny_key) => deny_key,
        Err(refused) => return Check::ready(refused),
    };
    let turn = if backend.inner.coalesce {
        let hash = deny_key.unwrap_or_else(|| backend.inner.deny.hash(&redis_key));
        match remote.coalescer.turn(hash, cost) {
            Turn::Wait(part) => {
                // Another check of this key is in flight: this one goes with the next call.
                let store = Arc::clone(store);
                let redis = Arc::clone(redis);
                return Check::pending(async move {
                    let part = part.await.ok().flatten().ok_or(None);
                    conclude(&*store, &redis, part, &redis_key, cost, deny_key)
                });
            }
            Turn::Lead => Some(hash),
        }
    } else {
        None
    };
    // Only a check that goes to Redis itself builds the call.
    let lockout = store.blocks().lockout_ms();
    let call = engine_call(
        &**store,
        key,
        &redis_key,
        CHECK,
        u64::from(cost.get()),
        lockout,
        &[],
    );
    let leader = Leader {
        store: Arc::clone(store),
        redis: Arc::clone(redis),
        redis_key,
        turn,
    };
    Check::pending(async move {
        let remote = leader.store.remote();
        let started = std::time::Instant::now();
        let result = leader.redis.eval(&call).await;
        remote.metrics.duration(&remote.name, started.elapsed());
        let decision = conclude(
            &*leader.store,
            &leader.redis,
            result.map_err(Some),
            &leader.redis_key,
            cost,
            deny_key,
        );
        // The checks of this key that queued meanwhile go now.
        drop(leader);
        decision
    })
}

/// One call of the engine for `key` (whose Redis key is `redis_key`): every limit's key
/// and the block key, then `op`, `count` (a cost, or how many coalesced costs), `param`
/// (the lockout; a reservation's longest wait; a lease's size), the limits' arguments
/// (one text), `extra` (the costs of coalesced checks; a lease's
/// expired unused tokens), and the caller's time
/// when the backend sends it. The one place that lays out `engine.lua`'s `ARGV`.
pub(super) fn engine_call<T: Hosts + ?Sized>(
    store: &T,
    key: &[u8],
    redis_key: &[u8],
    op: &str,
    count: u64,
    param: u64,
    extra: &[u32],
) -> Call {
    let remote = store.remote();
    let backend = remote.backend();
    let time = backend.inner.time;
    let limits = store.limit_count();
    let limit_args = remote.limit_args(|args| store.limit_args(args));
    let (args, bytes) = limit_args.size();
    // Room for the keys (a set's other keys about as long as the first), three numbers,
    // the limits' argument, the extra numbers and the time.
    let functions = backend
        .redis_handle()
        .is_some_and(|redis| redis.engine_functions());
    let mut call = Call::engine(
        &ENGINE,
        time,
        functions,
        limits + 1,
        limits + 1 + 3 + args + extra.len() + 1,
        (limits + 1) * (redis_key.len() + 8) + 3 * 20 + bytes + extra.len() * 10 + 20,
    );
    call.key(redis_key);
    store.extra_keys(key, &mut call);
    call.key_written(|out| remote.block_layout.write_redis_key(key, out));
    call.arg(op).arg(count).arg(param);
    call.args(limit_args);
    for &number in extra {
        call.arg(number);
    }
    if time == TimeSource::Caller {
        call.arg(backend.caller_now_us());
    }
    call
}

/// Who answers a check that needs no store (a cost above capacity): Redis while it is
/// healthy, the fallback while it is not, the process without Redis.
pub(super) fn answering(redis: Option<&Arc<RedisBackend>>) -> Source {
    match redis {
        None => Source::InProcess,
        Some(redis) if redis.is_healthy() => Source::Redis,
        Some(_) => Source::Fallback,
    }
}

/// The deny cache's entry for `redis_key`: `Err` with the refusal when Redis refused the
/// key moments ago until a time not reached yet; else `Ok` with the key's hash in the
/// cache (to remember a refusal to come), or `None` when the cache is off. (A refusal
/// is the rare, flooded case: its size does not matter.)
#[allow(clippy::result_large_err)]
pub(super) fn cached_refusal<T: Hosts + ?Sized>(
    store: &T,
    redis_key: &[u8],
) -> Result<Option<u128>, Decision> {
    let backend = store.remote().backend();
    let deny = &backend.inner.deny;
    if !deny.is_enabled() {
        return Ok(None);
    }
    let hash = deny.hash(redis_key);
    let now_us = backend.clock().now_us();
    let Some(denied) = deny.get(hash, now_us) else {
        return Ok(Some(hash));
    };
    let us = |t: u64| Duration::from_micros(t.saturating_sub(now_us));
    // A set's limits as Redis gave them, aged by the time since: every limit in the
    // headers, as in Redis's answer.
    let elapsed = Duration::from_micros(now_us.saturating_sub(denied.made_us));
    let combined = denied.members.as_deref().and_then(|members| {
        let aged: Vec<Decision> = members
            .iter()
            .map(|member| {
                let mut member = member.clone();
                member.reset = member.reset.saturating_sub(elapsed);
                member.retry_after = member.retry_after.map(|r| r.saturating_sub(elapsed));
                member.source = Source::DenyCache;
                member
            })
            .collect();
        store.combine_members(&aged)
    });
    let decision = combined.unwrap_or_else(|| {
        Decision::new(
            State::OverQuota,
            store.capacity(),
            0,
            us(denied.reset_us),
            Source::DenyCache,
        )
    });
    Err(blocked(decision, us(denied.retry_us)))
}

/// A check's decision from its part of the engine's reply (caching a refusal in the
/// deny cache), or, when the call failed (`Err(Some)`: the error; `Err(None)`: reported
/// by the call this check went with), from the failure policy.
pub(super) fn conclude<T: Hosts + ?Sized>(
    store: &T,
    redis: &Arc<RedisBackend>,
    reply: Result<Vec<i64>, Option<ScriptError>>,
    redis_key: &[u8],
    cost: NonZeroU32,
    deny_key: Option<u128>,
) -> Decision {
    let remote = store.remote();
    let error = match reply {
        Ok(reply) => match read_reply(store, &reply, cost) {
            Some(decision) => {
                if let (Some(hash), Some(retry), 1) = (deny_key, decision.retry_after, cost.get()) {
                    let backend = &remote.backend;
                    let deny = &backend.inner.deny;
                    let now_us = backend.clock().now_us();
                    let at = |d: Duration| {
                        now_us.saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
                    };
                    let denied = Denied {
                        until_us: deny.answer_until(now_us, at(retry)),
                        retry_us: at(retry),
                        reset_us: at(decision.reset),
                        made_us: now_us,
                        members: store.member_decisions(reply.get(2..).unwrap_or_default(), cost),
                    };
                    deny.insert(hash, denied, now_us);
                }
                return decision;
            }
            None => Some(ScriptError::Reply(reply)),
        },
        Err(error) => error,
    };
    if let Some(error) = error {
        let fault = error.fault();
        crate::metrics::redis_error(&remote.name, fault.label());
        if fault == Fault::Key {
            redis.key_error(remote.backend.inner.deny.hash(redis_key), &error);
        }
    }
    // The key, read back from the Redis key (only on this failure path).
    let key = remote.layout.key_of(redis_key).unwrap_or_default();
    unavailable(store, &key, cost)
}

/// The answer while Redis is unreachable, by the layer's failure policy.
pub(super) fn unavailable<T: Hosts + ?Sized>(store: &T, key: &[u8], cost: NonZeroU32) -> Decision {
    let backend = &store.remote().backend;
    match backend.failover.policy {
        FailurePolicy::Fallback => local_check(store, key, cost.get(), Source::Fallback),
        FailurePolicy::FailOpen => {
            let limit = store.capacity();
            Decision::new(
                State::Allowed,
                limit,
                limit,
                Duration::ZERO,
                Source::FailOpen,
            )
        }
        FailurePolicy::FailClosed => {
            let retry = backend
                .redis_handle()
                .map_or(DEFAULT_PROBE_INTERVAL, |r| r.probe_interval());
            Decision::new(
                State::OverQuota,
                store.capacity(),
                0,
                retry,
                Source::FailClosed,
            )
            .with_retry_after(retry)
        }
    }
}
