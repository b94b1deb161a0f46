//! The limits' two hosts: [`Hosts`] is one algorithm's two hosts (its Redis script and
//! its in-process state), and [`Remote`] what one limiter needs of the backend. A
//! check's journey through them is in `check.rs` ([`check`](super::check::check())).

use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::batch::Batcher;
use super::block::Blocks;
use super::coalesce::Coalescer;
use super::layout::{Layout, Owner};
use super::lease::Leases;
use super::listing::Index;
use crate::backend::redis::call::{Args, Call};
use crate::backend::redis::fault::ScriptError;
use crate::backend::Backend;
use crate::decision::{Decision, Priority, Source};
use crate::metrics::RedisMetrics;

/// What one limiter needs of the backend: the handle, its Redis key layout, and its
/// Redis metrics.
#[derive(Debug)]
pub(crate) struct Remote {
    pub(super) backend: Backend,
    /// How this limiter's Redis keys are built.
    layout: Layout,
    /// How its keys' blocks are built.
    pub(super) block_layout: Layout,
    /// The policy name, for metrics labels and logs (a set's for its members: the set
    /// decides in one call).
    pub(super) name: String,
    pub(super) metrics: RedisMetrics,
    /// This limiter's blocked keys and lockout.
    pub(super) blocks: Blocks,
    /// The list of its blocked keys on Redis (see `listing.rs`).
    pub(super) index: Index,
    /// This limiter's calls in flight, and the checks of the same key waiting for them.
    pub(super) coalescer: Coalescer,
    /// This limiter's calls in flight per node, and the checks of other keys queued for
    /// the next (see `batch.rs`).
    pub(super) batcher: Batcher,
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
        let blocks = Blocks::new(backend.local(), block_layout.local_id(b"block", 0), lockout);
        let index = Index::new(block_layout.blocked_index());
        Self {
            backend: backend.clone(),
            layout,
            block_layout,
            index,
            // A set's one call is its own: named by the set, as its layer's metrics are.
            name: match owner {
                Owner::Member { set, .. } => set.to_owned(),
                Owner::Own(name) => name.to_owned(),
            },
            metrics: RedisMetrics::default(),
            blocks,
            coalescer: Coalescer::default(),
            batcher: Batcher::default(),
            limit_args: OnceLock::new(),
        }
    }

    /// The limits' part of the engine's `ARGV`, one argument (encoded by `encode` the
    /// first time, its words joined by `:`).
    pub(super) fn limit_args(&self, encode: impl FnOnce(&mut Args)) -> &Args {
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
        call.written(|out| self.layout.write_redis_key(key, out));
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
    /// [set](crate::LimitSet) (whose block is its first limit's).
    pub(crate) fn set_blocks(&self, lockout: Option<Duration>) -> Blocks {
        let id = self.block_layout.local_id(b"block", 0);
        Blocks::new(self.backend.local(), id, lockout)
    }

    /// The layout of this limiter's keys.
    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// One algorithm's two hosts on a backend: its Redis script (arguments in, reply out) and
/// its in-process state, with the same semantics. [`check`](super::check::check()) picks the host
/// that answers.
pub(crate) trait Hosts: Send + Sync + 'static {
    fn remote(&self) -> &Remote;
    /// The largest cost that can ever be admitted at once.
    fn capacity(&self) -> u64;
    /// The decision for a cost above [`capacity`](Self::capacity).
    fn exceeds_capacity(&self, source: Source) -> Decision;
    /// How many limits the engine decides for one check: one, or a
    /// [set](crate::LimitSet)'s members.
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
    /// The numbers each call sends after the limits' text, for limits whose arguments
    /// change with time: a calendar window's four boundaries around `now_ms` (the
    /// caller's clock, Unix ms), in the order of the limits. None by default.
    fn window_args(&self, now_ms: i64, call: &mut Call) {
        let _ = (now_ms, call);
    }
    /// How many numbers this limit's reply holds (its admitted flag first).
    fn reply_len(&self) -> usize;
    /// Reads this limit's part of the engine's reply; `None` when it is not of the
    /// expected shape.
    fn decide(&self, reply: &[i64], cost: NonZeroU32) -> Option<Decision>;
    /// [`decide`](Self::decide) for a key blocked for `wait` more: refused, with nothing
    /// left until then ([`Decision::blocked`]). A set's decision is the one its limits'
    /// standing gives, blocked, and every limit in its headers says it is blocked.
    fn decide_blocked(&self, reply: &[i64], cost: NonZeroU32, wait: Duration) -> Option<Decision> {
        self.decide(reply, cost)
            .map(|decision| decision.blocked(wait))
    }
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
    /// [`combine_members`](Self::combine_members) for a key blocked for `wait` more
    /// (see [`decide_blocked`](Self::decide_blocked)): `None` for one limit (the
    /// default).
    fn combine_members_blocked(&self, members: &[Decision], wait: Duration) -> Option<Decision> {
        let _ = (members, wait);
        None
    }
    /// Answers from the in-process state; with `spend` false, only says what spending
    /// would answer, changing nothing (a `cost` of 0: where the key stands).
    fn local(&self, key: &[u8], cost: u32, source: Source, spend: bool) -> Decision {
        self.local_priority(key, cost, Priority::WHOLE, source, spend)
    }
    /// [`local`](Self::local) for a request of a priority class that may use `priority`
    /// of each limit: admitted when the cost and what the class leaves of the limit in
    /// force to others ([`Priority::keep`]) fit, spending the cost, in one step under the
    /// key's lock, as the engine's `h`; its remaining is the class's.
    fn local_priority(
        &self,
        key: &[u8],
        cost: u32,
        priority: Priority,
        source: Source,
        spend: bool,
    ) -> Decision;
    /// What a priority class of `priority` leaves to others of each limit on Redis, in
    /// order: the engine's `h`'s extra numbers.
    fn keeps(&self, priority: Priority) -> Vec<u64> {
        vec![priority.keep(self.capacity())]
    }
    /// [`decide`](Self::decide) for a check of a class of `priority`
    /// ([`keeps`](Self::keeps)): each limit's remaining is the class's.
    fn decide_priority(
        &self,
        reply: &[i64],
        cost: NonZeroU32,
        priority: Priority,
    ) -> Option<Decision> {
        let keep = priority.keep(self.capacity());
        self.decide(reply, cost)
            .map(|decision| decision.keeping(keep))
    }
    /// What a check of `cost` says of a key blocked for `wait` more, spending nothing:
    /// the limit's refusal of the cost if it would refuse it (so the wait is the longer
    /// of the block's and the limit's own), else where the key stands (as the engine
    /// does), then blocked. A set blocks each of its limits (see
    /// [`decide_blocked`](Self::decide_blocked)). A check of a priority class is refused
    /// as its class's check would be.
    fn local_blocked(
        &self,
        key: &[u8],
        cost: u32,
        priority: Priority,
        source: Source,
        wait: Duration,
    ) -> Decision {
        let decision = self.local_priority(key, cost, priority, source, false);
        let decision = if decision.is_admitted() {
            self.local(key, 0, source, false)
        } else {
            decision
        };
        decision.blocked(wait)
    }
    /// Each limit's own answer from the in-process state to a check of `cost`, spending
    /// nothing, blocked while the key is: a set's limits, in order; `None` for one limit
    /// (the default).
    fn local_members(&self, key: &[u8], cost: u32, source: Source) -> Option<Vec<Decision>> {
        let _ = (key, cost, source);
        None
    }
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
    /// Spends `cost` units of `key` in the in-process state whatever the limit says
    /// (above the limit, the key owes them: see each algorithm's `X_charge` in Lua).
    fn local_charge(&self, key: &[u8], cost: u64);
    /// Settles `key` by `delta` units in the in-process state: spends them past the
    /// limit when above 0, gives them back when below (the engine's `'s'`).
    fn local_settle(&self, key: &[u8], delta: i64) {
        if delta > 0 {
            self.local_charge(key, delta.unsigned_abs());
        } else if delta < 0 {
            self.local_refund(key, u32::try_from(delta.unsigned_abs()).unwrap_or(u32::MAX));
        }
    }
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
