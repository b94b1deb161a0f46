//! Every path decided like one model (issue 22): generated sequences of operations
//! (checks, checks of priority classes, peeks, refunds, settlements, resets, blocks,
//! reservations, concurrent batches, time passing, steps of the Redis server's clock
//! back and forward and its return to the true time) on one limit or a set of up to
//! three limits of mixed algorithms, with costs up to above the capacity, run through
//! every host and path, and compared with a reference model field by field (state,
//! limit, remaining, reset and retry-after, to the microsecond).
//!
//! The reference model is the plainest statement of each algorithm, written apart from
//! the crate's steps: a fixed window is a count and an end; a token bucket is a level
//! refilled continuously, in exact integer arithmetic (scaled by the rate, so no
//! rounding ever happens); a rolling window is a map of bucket index to count. What it
//! keeps of each key, and the documented clock rules, are in `model/kept.rs`: each key
//! holds the newest time it has seen (its time is the clock's plus a skew, taken from
//! its floor: a window's end minus a period, a bucket's TAT minus a burst or a
//! reservation's time, a rolling window's newest bucket), its expiry is a time of the
//! server's clock (a key expired there is gone, skew and all: a step back does not bring
//! it back), and with the callers' clocks a caller behind reads a TAT as at most an
//! empty bucket and counts from the newest bucket, and a window more than a period away
//! is cut to one period. The token bucket's documented gap (up to one burst given back
//! by a step back and its return: a full bucket has no key, and the floor is a lower
//! bound) is the model's too, since it states the rules the crate documents: the
//! comparison stays exact.
//!
//! Hosts and paths, each on a fresh limiter name per case, every third step through a
//! second limiter of the same name (a handle: on another instance of the same Redis
//! where instances agree exactly, on the same backend otherwise), and what each sees of
//! the clocks (the true time only moves on; the server's clock is the true time plus the
//! steps, frozen by the test at each operation):
//! - in process, on a clock the test sets: the true time. In-process time is monotonic,
//!   so a step of the wall clock is never seen: the model runs on the true time;
//! - Redis with the server's clock, no deny cache, no coalescing (batches go one by
//!   one): the model runs on the server's clock, steps and all;
//! - Redis with the callers' clocks: the algorithms read the caller's clock (the first
//!   instance's is the true time; the second's is `caller_skew_ms` off it, from −2.5 s
//!   to +1.5 s), keys and blocks expire on the server's clock, which steps;
//! - Redis with the deny cache and coalescing (the defaults; batches go at once and
//!   queue behind the first call): the server's clock, as above;
//! - the fallback: a Redis backend whose Redis never answers (a closed port): in-process
//!   state on the true time.
//!
//! Allowed differences, as documented: a refusal answered from the deny cache is the
//! one Redis gave to a one-unit check, aged, so for a larger cost its retry-after may be
//! earlier than the model's (and a set's may name another of its limits, whose states
//! move while the refusal is cached), and its reset may be earlier when the key was
//! blocked before a window opened; it is aged by the process's clock, which no step of
//! the server's moves, so within the cache's maximum age (1 s) after steps its wait may
//! differ from the model's by up to the steps' sizes (plus a rolling window's interval:
//! a key's time moves by whole buckets), its reset may be another window's (a step
//! across a window's edge), and it may refuse where the model admits (a step forward
//! ended a window early on Redis) or refuse as blocked (nothing left, the block's
//! shorter wait) where a step forward ended the block on Redis. A decision above the capacity
//! says `Redis` or `Fallback` by the breaker's state. Nothing else may differ, but for
//! the one approximate path, leases: a token bucket alone with leases (see
//! [`run_leased`]) is held to the leases' documented bound instead of the model's
//! decisions one by one (at most one lease per instance beyond the limit over any
//! window).
//!
//! `PROPTEST_CASES` sets the number of cases (default 48 here: a short run in
//! `scripts/test`); a release runs `PROPTEST_CASES=3000 cargo test --all-features
//! --test model` (about 2 minutes; see `benches/NOTES.md`). A failure prints the shrunk case.

#[path = "model/kept.rs"]
mod kept;
mod support;

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use kept::{Clock, Kept};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::{RedisServer, ServerClock};
use tower_redis_ratelimit::{Backend, Decision, Limiter, Source, State};
use tower_redis_ratelimit::{Calendar, PeriodConfig, PeriodLimiter, UtcOffset};
use tower_redis_ratelimit::{LimitSet, SetLimiter};
use tower_redis_ratelimit::{ManualClock, TimeSource};
use tower_redis_ratelimit::{RollingConfig, RollingWindowLimiter};
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

/// 2027-01-15T08:00:00Z in milliseconds (midnight in America/Los_Angeles): every step is
/// a whole millisecond after it.
const T0_MS: u64 = 1_800_000_000_000;

// ---------------------------------------------------------------------------
// What is generated
// ---------------------------------------------------------------------------

/// One limit's settings.
#[derive(Debug, Clone, Copy)]
enum Limit {
    /// A fixed window, aligned to a UTC offset (in seconds) or starting at the first
    /// request.
    Period {
        quota: u64,
        period_ms: u64,
        align: Option<i32>,
        /// A calendar day in America/Los_Angeles (`period_ms` a day, `align` -8 h): the
        /// cases run on 2027-01-15 from local midnight ([`T0_MS`]), where it is that
        /// aligned window.
        calendar: bool,
    },
    Bucket {
        rate: u64,
        period_ms: u64,
        burst: u64,
    },
    Rolling {
        limit: u64,
        buckets: u64,
        interval_ms: u64,
    },
}

impl Limit {
    fn capacity(self) -> u64 {
        match self {
            Self::Period { quota, .. } => quota,
            Self::Bucket { burst, .. } => burst,
            Self::Rolling { limit, .. } => limit,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Check(u32),
    Peek(u32),
    Refund(u32),
    Reset,
    /// Blocks the key for this many milliseconds.
    Block(u64),
    /// Lifts the key's block (and lockout), its counts kept.
    Unblock,
    /// Time passes, in milliseconds.
    Wait(u64),
    /// Concurrent checks of the key, in this order.
    Batch(Vec<u32>),
    /// Reserves the cost at most this many milliseconds ahead (a token bucket alone).
    Reserve(u32, u64),
    /// Settles the key by this many units: spent past the limit (debt), or given back.
    Settle(i64),
    /// A check of this cost by a priority class that may use this percentage of each
    /// limit (`LayerBuilder::priority`; 100: a check).
    Priority(u32, u32),
    /// The Redis server's clock steps by this many milliseconds (negative: back).
    Step(i64),
    /// The Redis server's clock comes back to the true time (after its steps).
    Return,
}

#[derive(Debug, Clone)]
struct Case {
    /// One limit alone (`set` false), or a set of these limits.
    limits: Vec<Limit>,
    set: bool,
    /// The limit's (or set's) lockout, in milliseconds.
    lockout_ms: Option<u64>,
    /// With the callers' clocks, how far the second instance's clock is ahead of the
    /// first's (ms; negative: behind).
    caller_skew_ms: i64,
    ops: Vec<Op>,
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        (
            1..=5u64,
            prop::sample::select(vec![1_000u64, 3_000, 7_000, 10_000]),
            prop::option::of(prop::sample::select(vec![0i32, 28_800, -18_000, 19_800])),
        )
            .prop_map(|(quota, period_ms, align)| Limit::Period {
                quota,
                period_ms,
                align,
                calendar: false,
            }),
        (1..=5u64).prop_map(|quota| Limit::Period {
            quota,
            period_ms: 86_400_000,
            align: Some(-28_800),
            calendar: true,
        }),
        (
            // Rates whose emission interval is a whole number of microseconds, and
            // fractional ones (3 per 2 s: 666 666.67 µs).
            prop::sample::select(vec![
                (1u64, 1_000u64),
                (2, 1_000),
                (4, 1_000),
                (5, 2_000),
                (1, 3_000),
                (10, 1_000),
                (3, 1_000),
                (3, 2_000),
                (7, 3_000),
            ]),
            1..=6u64
        )
            .prop_map(|((rate, period_ms), burst)| Limit::Bucket {
                rate,
                period_ms,
                burst
            }),
        (
            1..=6u64,
            1..=5u64,
            prop::sample::select(vec![100u64, 250, 1_000])
        )
            .prop_map(|(limit, buckets, interval_ms)| Limit::Rolling {
                limit,
                buckets,
                interval_ms
            }),
    ]
}

/// The operations on a limit (or set) of `capacity`: settlements up to twice it past
/// the limit (debt; a caller's clock behind reads a bucket's debt as an empty bucket, as
/// the model does), steps of the Redis server's clock and its return.
fn op(capacity: u32) -> impl Strategy<Value = Op> {
    let cost = 1..=capacity + 1;
    let most = i64::from(capacity);
    let settle = -most..=2 * most;
    prop_oneof![
        6 => cost.clone().prop_map(Op::Check),
        3 => (cost.clone(), prop::sample::select(vec![0u32, 30, 60, 85, 99, 100]))
            .prop_map(|(cost, percent)| Op::Priority(cost, percent)),
        2 => cost.clone().prop_map(Op::Peek),
        2 => (1..=capacity).prop_map(Op::Refund),
        1 => Just(Op::Reset),
        1 => prop::sample::select(vec![1u64, 50, 400, 1_500]).prop_map(Op::Block),
        1 => Just(Op::Unblock),
        5 => prop::sample::select(vec![0u64, 1, 37, 99, 100, 250, 999, 1_000, 1_700, 4_000])
            .prop_map(Op::Wait),
        1 => prop::collection::vec(cost.clone(), 2..=4).prop_map(Op::Batch),
        1 => (cost, prop::sample::select(vec![0u64, 100, 1_000, 5_000]))
            .prop_map(|(cost, wait)| Op::Reserve(cost, wait)),
        2 => settle.prop_map(Op::Settle),
        1 => prop::sample::select(vec![-20_000i64, -5_000, -1_500, -400, -1, 1, 250, 2_000, 12_000])
            .prop_map(Op::Step),
        1 => Just(Op::Return),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let lockout = prop::option::weighted(0.2, prop::sample::select(vec![200u64, 1_500]));
    let skew = prop::sample::select(vec![0i64, 0, -2_500, -250, -1, 1, 40, 1_500]);
    (
        prop::collection::vec(limit(), 1..=3),
        any::<bool>(),
        lockout,
        skew,
    )
        .prop_flat_map(|(limits, set, lockout_ms, caller_skew_ms)| {
            let set = set || limits.len() > 1;
            let capacity = limits.iter().map(|l| l.capacity()).min().unwrap_or(1);
            let capacity = u32::try_from(capacity).expect("small");
            prop::collection::vec(op(capacity), 1..=40).prop_map(move |ops| Case {
                limits: limits.clone(),
                set,
                lockout_ms,
                caller_skew_ms,
                ops,
            })
        })
}

/// A token bucket alone, without a lockout: the cases the leased host runs.
fn leased_case() -> impl Strategy<Value = Case> {
    limit()
        .prop_filter("a token bucket", |l| matches!(l, Limit::Bucket { .. }))
        .prop_flat_map(|limit| {
            let capacity = u32::try_from(limit.capacity()).expect("small");
            prop::collection::vec(op(capacity), 1..=40).prop_map(move |ops| Case {
                limits: vec![limit],
                set: false,
                lockout_ms: None,
                caller_skew_ms: 0,
                ops,
            })
        })
}

// ---------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------

/// The fields every host must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    state: State,
    limit: u64,
    remaining: u64,
    reset_us: u128,
    retry_us: Option<u128>,
}

impl Answer {
    fn of(decision: &Decision) -> Self {
        Self {
            state: decision.state,
            limit: decision.limit,
            remaining: decision.remaining,
            reset_us: decision.reset.as_micros(),
            retry_us: decision.retry_after.map(|d| d.as_micros()),
        }
    }

    fn admitted(&self) -> bool {
        matches!(self.state, State::Allowed | State::HitQuota)
    }
}

#[derive(Debug, Clone)]
struct Model {
    limits: Vec<Limit>,
    set: bool,
    lockout_ms: u64,
    kept: Vec<Kept>,
    /// Blocked until (ms).
    blocked_until: u64,
    /// The callers' clocks: the algorithms read `read`, the caller's clock (ms), and
    /// keys expire by the server's.
    caller: bool,
    read: u64,
}

fn div_ceil(a: u128, b: u128) -> u128 {
    a.div_ceil(b)
}

/// `answer` for a priority class that leaves `keep` units to the others: what remains
/// is the class's (an admission that leaves it nothing is `HitQuota`).
fn keeping(mut answer: Answer, keep: u64) -> Answer {
    answer.remaining = answer.remaining.saturating_sub(keep);
    if answer.state == State::Allowed && answer.remaining == 0 {
        answer.state = State::HitQuota;
    }
    answer
}

/// A decision of `state` for a limit of `limit`: admitted ones are `HitQuota` when
/// nothing is left.
fn answer(
    admitted: bool,
    limit: u64,
    remaining: u64,
    reset_us: u128,
    retry_us: Option<u128>,
) -> Answer {
    let state = match (admitted, remaining) {
        (true, 0) => State::HitQuota,
        (true, _) => State::Allowed,
        (false, _) => State::OverQuota,
    };
    Answer {
        state,
        limit,
        remaining,
        reset_us,
        retry_us: if admitted { None } else { retry_us },
    }
}

impl Model {
    fn new(case: &Case) -> Self {
        let kept = case.limits.iter().map(|&l| Kept::new(l)).collect();
        Self {
            limits: case.limits.clone(),
            set: case.set,
            lockout_ms: case.lockout_ms.unwrap_or(0),
            kept,
            blocked_until: 0,
            caller: false,
            read: 0,
        }
    }

    /// The clocks of an operation at `now` on the server's clock.
    fn clock(&self, now: u64) -> Clock {
        Clock {
            server: now,
            now: if self.caller { self.read } else { now },
            caller: self.caller,
        }
    }

    /// One limit deciding `cost` at `now` (ms); with `write` (a check's writing
    /// step), spending it if admitted.
    fn decide_one(&mut self, i: usize, now: u64, cost: u64, write: bool) -> Answer {
        let clock = self.clock(now);
        self.kept[i].decide(self.limits[i], clock, cost, write)
    }

    fn refund_one(&mut self, i: usize, now: u64, cost: u64) {
        let clock = self.clock(now);
        self.kept[i].refund(self.limits[i], clock, cost);
    }

    /// [`decide_one`](Self::decide_one) for a priority class that leaves `keep` units of
    /// limit `i` to the others: admitted when a check of `cost + keep` would be, spending
    /// `cost` (a refusal is the refusal of `cost + keep`); what remains is the class's.
    fn decide_one_keeping(
        &mut self,
        i: usize,
        now: u64,
        cost: u64,
        keep: u64,
        write: bool,
    ) -> Answer {
        if keep == 0 {
            return self.decide_one(i, now, cost, write);
        }
        let clock = self.clock(now);
        let probe = self.kept[i]
            .clone()
            .decide(self.limits[i], clock, cost + keep, false);
        let asked = if probe.admitted() { cost } else { cost + keep };
        let answer = self.kept[i].decide(self.limits[i], clock, asked, write);
        keeping(answer, keep)
    }

    /// The one decision of every limit: a set's two passes, then its combination.
    fn decide(&mut self, now: u64, cost: u64, spend: bool) -> Answer {
        let none = vec![0; self.limits.len()];
        self.decide_keeping(now, cost, &none, spend)
    }

    /// [`decide`](Self::decide) for a priority class that leaves `keeps` (one per limit)
    /// to the others.
    fn decide_keeping(&mut self, now: u64, cost: u64, keeps: &[u64], spend: bool) -> Answer {
        let n = self.limits.len();
        let mut answers: Vec<Answer> = (0..n)
            .map(|i| self.decide_one_keeping(i, now, cost, keeps[i], spend && n == 1))
            .collect();
        let all = answers.iter().all(Answer::admitted);
        if n > 1 && spend && all {
            answers = (0..n)
                .map(|i| keeping(self.decide_one(i, now, cost, true), keeps[i]))
                .collect();
        } else if n > 1 && !all {
            for (i, answer) in answers.iter_mut().enumerate() {
                if answer.admitted() {
                    *answer = keeping(self.decide_one(i, now, 0, false), keeps[i]);
                }
            }
        }
        if all {
            // The one with the least left; the first of those.
            let least = answers.iter().map(|a| a.remaining).min().expect("a limit");
            *answers
                .iter()
                .find(|a| a.remaining == least)
                .expect("found")
        } else {
            // The refusing one with the longest wait; the first of those.
            let refusing = answers.iter().filter(|a| !a.admitted());
            let longest = refusing
                .clone()
                .map(|a| a.retry_us)
                .max()
                .expect("one refuses");
            *refusing
                .clone()
                .find(|a| a.retry_us == longest)
                .expect("found")
        }
    }

    /// A blocked key's answer before the block: the limits' refusal of `cost`, or where
    /// the key stands.
    fn refusal_or_standing(&mut self, now: u64, cost: u64) -> Answer {
        let answer = self.decide(now, cost, false);
        if answer.admitted() {
            self.decide(now, 0, false)
        } else {
            answer
        }
    }

    fn blocked(&self, now: u64, mut answer: Answer) -> Answer {
        if self.blocked_until <= now {
            return answer;
        }
        let wait = u128::from(self.blocked_until - now) * 1_000;
        answer.state = State::OverQuota;
        answer.remaining = 0;
        answer.reset_us = answer.reset_us.max(wait);
        answer.retry_us = Some(answer.retry_us.map_or(wait, |r| r.max(wait)));
        answer
    }

    fn exceeds_capacity(&self, cost: u64) -> Option<Answer> {
        let capacity = self
            .limits
            .iter()
            .map(|l| l.capacity())
            .min()
            .expect("a limit");
        if cost <= capacity {
            return None;
        }
        let first = self
            .limits
            .iter()
            .find(|l| l.capacity() == capacity)
            .expect("found");
        let (limit, reset_us) = match *first {
            Limit::Period {
                quota, period_ms, ..
            } => (quota, u128::from(period_ms) * 1_000),
            Limit::Bucket { burst, .. } => (burst, 0),
            Limit::Rolling {
                limit,
                buckets,
                interval_ms,
            } => (limit, u128::from(buckets * interval_ms) * 1_000),
        };
        Some(Answer {
            state: State::ExceedsCapacity,
            limit,
            remaining: 0,
            reset_us,
            retry_us: None,
        })
    }

    /// Where the key stands (after a refund, reset or block).
    fn stands(&mut self, now: u64) -> Answer {
        let answer = self.decide(now, 0, false);
        self.blocked(now, answer)
    }

    fn check(&mut self, now: u64, cost: u64) -> Answer {
        if let Some(answer) = self.exceeds_capacity(cost) {
            return answer;
        }
        if self.blocked_until > now {
            // Blocked: spending nothing, the limit's refusal or where the key stands,
            // then the block.
            let answer = self.refusal_or_standing(now, cost);
            return self.blocked(now, answer);
        }
        let answer = self.decide(now, cost, true);
        if answer.admitted() || self.lockout_ms == 0 {
            return answer;
        }
        // Refused: the key is locked out.
        self.blocked_until = now + self.lockout_ms;
        self.blocked(now, answer)
    }

    /// A check of a priority class that may use `percent` of each limit: each limit keeps
    /// back what the class leaves to others (`capacity - capacity × percent / 100`, in
    /// whole units); a cost above the class's part of the smallest limit can never be
    /// admitted; a blocked key refuses it as its own check would; its refusal locks
    /// nothing out (the limit is not used up). A class of 100% checks.
    fn priority(&mut self, now: u64, cost: u64, percent: u32) -> Answer {
        if percent >= 100 {
            return self.check(now, cost);
        }
        let keep = |capacity: u64| capacity - capacity * u64::from(percent) / 100;
        let keeps: Vec<u64> = self.limits.iter().map(|l| keep(l.capacity())).collect();
        let smallest = self
            .limits
            .iter()
            .map(|l| l.capacity())
            .min()
            .expect("a limit");
        if cost > smallest - keep(smallest) {
            return self
                .exceeds_capacity(u64::MAX)
                .expect("above every capacity");
        }
        if self.blocked_until > now {
            let answer = self.decide_keeping(now, cost, &keeps, false);
            let answer = if answer.admitted() {
                self.decide(now, 0, false)
            } else {
                answer
            };
            return self.blocked(now, answer);
        }
        self.decide_keeping(now, cost, &keeps, true)
    }

    /// A token bucket alone reserving `cost` at most `max_wait_ms` ahead; `None` for
    /// other limits (they cannot reserve).
    fn reserve(&mut self, now: u64, cost: u64, max_wait_ms: u64) -> Option<Answer> {
        if self.set || !matches!(self.limits[..], [Limit::Bucket { .. }]) {
            return None;
        }
        if let Some(answer) = self.exceeds_capacity(cost) {
            return Some(answer);
        }
        if self.blocked_until > now {
            let answer = self.refusal_or_standing(now, cost);
            return Some(self.blocked(now, answer));
        }
        let clock = self.clock(now);
        Some(self.kept[0].reserve(self.limits[0], clock, cost, max_wait_ms))
    }

    fn peek(&mut self, now: u64, cost: u64) -> Answer {
        if let Some(answer) = self.exceeds_capacity(cost) {
            return answer;
        }
        if self.blocked_until > now {
            let answer = self.refusal_or_standing(now, cost);
            return self.blocked(now, answer);
        }
        self.decide(now, cost, false)
    }

    fn refund(&mut self, now: u64, cost: u64) -> Answer {
        for i in 0..self.limits.len() {
            self.refund_one(i, now, cost);
        }
        self.stands(now)
    }

    /// Spends `cost` of limit `i` at `now` (ms), whatever it holds.
    fn charge_one(&mut self, i: usize, now: u64, cost: u64) {
        let clock = self.clock(now);
        self.kept[i].charge(self.limits[i], clock, cost);
    }

    /// Settles every limit by `delta`: spent past the limit above 0, given back below.
    fn settle(&mut self, now: u64, delta: i64) -> Answer {
        for i in 0..self.limits.len() {
            if delta > 0 {
                self.charge_one(i, now, delta.unsigned_abs());
            } else if delta < 0 {
                self.refund_one(i, now, delta.unsigned_abs());
            }
        }
        self.stands(now)
    }

    fn reset(&mut self, now: u64) -> Answer {
        let lockout_ms = self.lockout_ms;
        let (caller, read) = (self.caller, self.read);
        *self = Self::new(&Case {
            limits: self.limits.clone(),
            set: self.set,
            lockout_ms: Some(lockout_ms),
            caller_skew_ms: 0,
            ops: Vec::new(),
        });
        (self.caller, self.read) = (caller, read);
        self.stands(now)
    }

    /// Forgets what expired before `now` (Redis deletes a key once its time is past its
    /// expiry: a step back after that does not bring it back).
    fn expire(&mut self, now: u64) {
        if now > self.blocked_until {
            self.blocked_until = 0;
        }
        for kept in &mut self.kept {
            kept.expire(now);
        }
    }

    fn block(&mut self, now: u64, ms: u64) -> Answer {
        self.blocked_until = now + ms;
        self.stands(now)
    }

    /// Lifts the block (a lockout's too): the limits keep what they counted, and the
    /// marks come off as when a block runs out (their keys' expiries kept).
    fn unblock(&mut self, now: u64) -> Answer {
        self.blocked_until = 0;
        self.stands(now)
    }

    /// After an operation that may write (all but a peek) at `now`, on a key blocked
    /// then: its token buckets' and rolling windows' keys are marked, and a mark keeps
    /// the key at least until the block ends (`token_bucket_mark`, `rolling_mark`: a
    /// blocked key's state outlives the block; a fixed window's mark keeps its key's
    /// expiry, the window's end). Seen only when the server's clock steps past a key's
    /// own expiry during a block (the state stays where it would have been forgotten).
    ///
    /// A block ending at `now` is over, and a call that reached Redis then deleted it
    /// (`block_left` in the engine): no step of the server's clock brings it back.
    fn mark(&mut self, now: u64, reached: bool) {
        if self.blocked_until <= now {
            if reached && self.blocked_until == now {
                self.blocked_until = 0;
            }
            return;
        }
        for kept in &mut self.kept {
            kept.keep_until(self.blocked_until);
        }
    }
}

// ---------------------------------------------------------------------------
// The hosts
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    InProcess,
    RedisServerTime,
    RedisCallerTime,
    /// Deny cache and coalescing on (the defaults).
    RedisCached,
    Fallback,
}

const HOSTS: [Host; 5] = [
    Host::RedisServerTime,
    Host::InProcess,
    Host::RedisCallerTime,
    Host::RedisCached,
    Host::Fallback,
];

struct Shared {
    /// Taken out (and so stopped) by `StopServer` when the test ends.
    redis: Mutex<Option<RedisServer>>,
    clock: ServerClock,
    /// A pool of the test's own, for `sweep`.
    sweeper: deadpool_redis::Pool,
    /// A loopback port nothing listens on.
    dead_port: u16,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

fn shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        let (redis, clock) = RedisServer::start_with_clock();
        Shared {
            sweeper: redis.pool(),
            redis: Mutex::new(Some(redis)),
            clock,
            dead_port: support::free_port(),
        }
    })
}

/// A pool of its own on the shared server, for one backend.
fn pool() -> deadpool_redis::Pool {
    shared()
        .redis
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .expect("the shared server runs until the test ends")
        .pool()
}

/// Stops the shared server when the test ends, passed or failed: a static is never
/// dropped, and the server would outlive the test's process.
struct StopServer;

impl Drop for StopServer {
    fn drop(&mut self) {
        if let Some(shared) = SHARED.get() {
            let server = shared
                .redis
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            drop(server);
        }
    }
}

/// A backend for `host`; with the callers' clocks, its clock `ahead_ms` ahead of
/// `manual`.
fn backend(host: Host, manual: &ManualClock, ahead_ms: i64) -> Backend {
    let shared = shared();
    // A generous deadline: a loaded machine must not turn a slow call into a fallback.
    let builder = support::backend_builder()
        .manual_clock(manual.clone())
        .caller_clock_offset_us(ahead_ms * 1_000)
        .call_timeout(Duration::from_secs(5));
    match host {
        Host::InProcess => builder.build(),
        Host::RedisServerTime => builder.redis(pool()).deny_cache(0).coalesce(false).build(),
        Host::RedisCallerTime => builder
            .redis(pool())
            .deny_cache(0)
            .coalesce(false)
            .time_source(TimeSource::Caller)
            .build(),
        Host::RedisCached => builder.redis(pool()).build(),
        Host::Fallback => builder
            .redis_url(format!("redis://127.0.0.1:{}", shared.dead_port))
            .build(),
    }
    .expect("a valid backend")
}

fn limiter(case: &Case, backend: &Backend, name: &str) -> Box<dyn Limiter> {
    if case.set {
        let mut set = LimitSet::new();
        for (i, limit) in case.limits.iter().enumerate() {
            let member = format!("l{i}");
            set = match *limit {
                Limit::Period { .. } => set.limit(member, period_config(*limit)),
                Limit::Bucket {
                    rate,
                    period_ms,
                    burst,
                } => set.limit(
                    member,
                    TokenBucketConfig::new(rate, Duration::from_millis(period_ms), burst),
                ),
                Limit::Rolling {
                    limit,
                    buckets,
                    interval_ms,
                } => set.limit(
                    member,
                    RollingConfig::new(
                        limit,
                        u32::try_from(buckets).expect("small"),
                        Duration::from_millis(interval_ms),
                    ),
                ),
            };
        }
        if let Some(ms) = case.lockout_ms {
            set = set.lockout(Duration::from_millis(ms));
        }
        return Box::new(SetLimiter::new(backend, name, set).expect("a valid set"));
    }
    let lockout = Duration::from_millis(case.lockout_ms.unwrap_or(0));
    let locked = case.lockout_ms.is_some();
    match case.limits[0] {
        Limit::Period { .. } => {
            let mut config = period_config(case.limits[0]);
            if locked {
                config = config.lockout(lockout);
            }
            Box::new(PeriodLimiter::new(backend, name, config).expect("valid"))
        }
        Limit::Bucket {
            rate,
            period_ms,
            burst,
        } => Box::new(
            TokenBucketLimiter::new(backend, name, {
                let config = TokenBucketConfig::new(rate, Duration::from_millis(period_ms), burst);
                if locked {
                    config.lockout(lockout)
                } else {
                    config
                }
            })
            .expect("valid"),
        ),
        Limit::Rolling {
            limit,
            buckets,
            interval_ms,
        } => Box::new(
            RollingWindowLimiter::new(backend, name, {
                let config = RollingConfig::new(
                    limit,
                    u32::try_from(buckets).expect("small"),
                    Duration::from_millis(interval_ms),
                );
                if locked {
                    config.lockout(lockout)
                } else {
                    config
                }
            })
            .expect("valid"),
        ),
    }
}

fn period_config(limit: Limit) -> PeriodConfig {
    let Limit::Period {
        quota,
        period_ms,
        align,
        calendar,
    } = limit
    else {
        unreachable!("a fixed window")
    };
    if calendar {
        return PeriodConfig::calendar(quota, Calendar::day("America/Los_Angeles"));
    }
    let config = PeriodConfig::new(quota, Duration::from_millis(period_ms));
    match align {
        Some(seconds) => config.align(UtcOffset::from_seconds(seconds)),
        None => config,
    }
}

fn expected_source(host: Host) -> Source {
    match host {
        Host::InProcess => Source::InProcess,
        Host::Fallback => Source::Fallback,
        _ => Source::Redis,
    }
}

/// The deny cache's maximum age on the hosts here (the default, 1 s), in µs.
const DENY_CACHE_MAX_AGE_US: u128 = 1_000_000;

/// Whether `got` is what the model answered, on `host`, for `cost`.
fn agrees(
    host: Host,
    case: &Case,
    drift_us: u128,
    cost: u64,
    got: &Decision,
    want: &Answer,
) -> Result<(), String> {
    let set = case.set;
    let answer = Answer::of(got);
    if want.state == State::ExceedsCapacity {
        // Who answers depends on the breaker's state, not the check.
        return if answer == *want {
            Ok(())
        } else {
            Err(format!("expected {want:?}"))
        };
    }
    if got.source == Source::DenyCache && host == Host::RedisCached {
        // A cached refusal of one unit, aged: the same for one unit; for more, it
        // may say to retry earlier, and a set may name another refusing limit.
        // Its reset is the refusal's, aged: earlier than the model's for a key blocked
        // before any window opened (a window not yet open has a whole period ahead).
        // Its wait is Redis's, aged by this process's clock: it may say to retry earlier
        // than Redis would now, by at most its age in the cache (the cache's maximum
        // age), never later. A client that comes back early is refused again; one told
        // to wait too long would be wronged.
        let aged = |got: Option<u128>, want: Option<u128>| match (got, want) {
            (Some(got), Some(want)) => got <= want && want - got <= DENY_CACHE_MAX_AGE_US,
            (got, want) => got == want,
        };
        let same = answer.state == want.state
            && if set {
                // Another limit of the set may be the one named: its limits' states move
                // while the refusal is cached (one expires, another still refuses), and a
                // larger cost may be refused by another limit; what it says of that limit
                // is the cached refusal's (nothing left).
                answer.retry_us <= want.retry_us
            } else if cost == 1 {
                answer.limit == want.limit
                    && answer.remaining == want.remaining
                    && answer.reset_us <= want.reset_us
                    && aged(answer.retry_us, want.retry_us)
            } else {
                // The reset is the cached refusal's (for one unit), not this cost's.
                answer.remaining == want.remaining && answer.retry_us <= want.retry_us
            };
        // The server's clock stepped while the refusal may have been cached: the cached
        // refusal is Redis's, aged by this process's clock, which did not step. So its
        // wait may be off by the steps (a step forward may have ended the window, or
        // refilled the bucket, early on Redis: the model may even admit), for at most
        // the cache's maximum age, and its reset may be another window's (a step across
        // a window's edge leaves the window the refusal saw): it is not compared. A
        // refusal cached while the key was blocked still says so (nothing left, the
        // block's wait) where a step forward ended the block on Redis: it says no more
        // than the model, and to come back no later.
        let near = |got: Option<u128>, want: Option<u128>| match (got, want) {
            (Some(got), Some(want)) => got.abs_diff(want) <= drift_us,
            _ => false,
        };
        let blocked_then = answer.remaining == 0
            && matches!((answer.retry_us, want.retry_us), (Some(got), Some(want)) if got <= want);
        let stepped = drift_us > 0
            && answer.state == State::OverQuota
            && (want.admitted() || near(answer.retry_us, want.retry_us) || blocked_then);
        return if same || stepped {
            Ok(())
        } else {
            Err(format!("expected {want:?} (from the deny cache)"))
        };
    }
    if got.source != expected_source(host) {
        return Err(format!("answered by {:?}", got.source));
    }
    if answer != *want {
        return Err(format!("expected {want:?}"));
    }
    Ok(())
}

/// Runs `case` on `host` next to the model: the first difference, described.
async fn run(case: &Case, host: Host, serial: u64) -> Result<(), String> {
    let manual = ManualClock::new(T0_MS * 1_000);
    let backend = backend(host, &manual, 0);
    let name = format!("m{serial}-{host:?}");
    let first = limiter(case, &backend, &name);
    // A handle: another limiter of the same name, which every third step goes through.
    // On another instance (its own backend and connections) where instances agree
    // exactly (Redis without the deny cache); on the same backend otherwise (a process's
    // deny cache and fallback state are its own).
    let other = match host {
        Host::RedisServerTime => self::backend(host, &manual, 0),
        // An instance whose clock is not the first's.
        Host::RedisCallerTime => self::backend(host, &manual, case.caller_skew_ms),
        Host::InProcess | Host::RedisCached | Host::Fallback => backend.clone(),
    };
    let second = limiter(case, &other, &name);
    let mut model = Model::new(case);
    let mut now = T0_MS;
    // The server clock's steps (ms), and the time on the host's clock: the server's on
    // the hosts that read it, the true (monotonic) time elsewhere.
    let mut offset = 0i64;
    // When it stepped, and by how much (ms).
    let mut steps: Vec<(u64, u64)> = Vec::new();
    let interval_ms = |limit: &Limit| match limit {
        Limit::Rolling { interval_ms, .. } => *interval_ms,
        _ => 0,
    };
    let granularity_ms = case.limits.iter().map(interval_ms).max().unwrap_or(0);
    let stepped = matches!(
        host,
        Host::RedisServerTime | Host::RedisCached | Host::RedisCallerTime
    );
    model.caller = host == Host::RedisCallerTime;
    let redis = !matches!(host, Host::InProcess | Host::Fallback);
    if redis {
        // Only this run's keys, for `sweep`.
        let mut conn = shared().sweeper.get().await.expect("a connection");
        let () = deadpool_redis::redis::cmd("FLUSHALL")
            .query_async(&mut conn)
            .await
            .expect("FLUSHALL");
    }
    let mut log = String::new();
    for (step, op) in case.ops.iter().enumerate() {
        let limiter = if step % 3 == 2 { &second } else { &first };
        let t = if stepped {
            now.checked_add_signed(offset).expect("after the epoch")
        } else {
            now
        };
        if !matches!(op, Op::Wait(_) | Op::Step(_) | Op::Return) {
            // The server's clock is at the times of the operations only (so its keys
            // expire at those times, as the model's do).
            manual.set_us(now * 1_000);
            shared()
                .clock
                .freeze_at(i64::try_from(t * 1_000).expect("fits"));
            model.expire(t);
            if redis {
                sweep().await;
            }
            // The caller's clock: the first instance's is the true time.
            let ahead = if step % 3 == 2 {
                case.caller_skew_ms
            } else {
                0
            };
            model.read = now.checked_add_signed(ahead).expect("after the epoch");
        }
        let key: &[u8] = b"k";
        let one = |cost: u32| NonZeroU32::new(cost).expect("a cost of one or more");
        let results: Vec<(u64, Answer, Decision)> = match op {
            Op::Wait(ms) => {
                now += ms;
                continue;
            }
            Op::Step(ms) => {
                offset += ms;
                steps.push((now, ms.unsigned_abs()));
                continue;
            }
            Op::Return => {
                steps.push((now, offset.unsigned_abs()));
                offset = 0;
                continue;
            }
            Op::Check(cost) => {
                let decision = limiter.check(key, one(*cost)).await;
                let cost = u64::from(*cost);
                vec![(cost, check(&mut model, t, cost, &decision), decision)]
            }
            Op::Priority(cost, percent) => {
                let priority = f64::from(*percent) / 100.0;
                let decision = limiter.check_priority(0, key, one(*cost), priority).await;
                let before = model.clone();
                let want = model.priority(t, u64::from(*cost), *percent);
                if decision.source == Source::DenyCache {
                    model = before;
                }
                // A class below 100% is held to a cached refusal as a larger cost is: the
                // refusal of one unit, whose wait may be earlier than the class's.
                let cost = if *percent < 100 {
                    u64::from(*cost).max(2)
                } else {
                    u64::from(*cost)
                };
                vec![(cost, want, decision)]
            }
            Op::Peek(cost) => vec![(
                u64::from(*cost),
                model.peek(t, u64::from(*cost)),
                limiter.peek(key, one(*cost)).expect("built-in").await,
            )],
            Op::Refund(cost) => vec![(
                0,
                model.refund(t, u64::from(*cost)),
                limiter.refund(key, one(*cost)).expect("built-in").await,
            )],
            Op::Reset => vec![(
                0,
                model.reset(t),
                limiter.reset(key).expect("built-in").await,
            )],
            Op::Settle(delta) => vec![(
                0,
                model.settle(t, *delta),
                limiter.settle(key, *delta).expect("built-in").await,
            )],
            Op::Unblock => vec![(
                0,
                model.unblock(t),
                limiter.unblock(key).expect("built-in").await,
            )],
            Op::Block(ms) => vec![(
                0,
                model.block(t, *ms),
                limiter
                    .block(key, Duration::from_millis(*ms))
                    .expect("built-in")
                    .await,
            )],
            Op::Reserve(cost, max_wait_ms) => {
                let max_wait = Duration::from_millis(*max_wait_ms);
                let got = limiter.reserve(key, one(*cost), max_wait);
                match (got, model.reserve(t, u64::from(*cost), *max_wait_ms)) {
                    (Some(check), Some(want)) => vec![(u64::from(*cost), want, check.await)],
                    (None, None) => continue,
                    (got, want) => {
                        return Err(format!(
                            "{host:?}, step #{step}: reserve answered {:?}, the model {want:?}",
                            got.is_some()
                        ))
                    }
                }
            }
            Op::Batch(costs) => {
                let decisions = if host == Host::RedisCached {
                    // At once: the first goes to Redis, the others queue behind it.
                    let checks = costs.iter().map(|&c| limiter.check(key, one(c)));
                    futures_join(checks.collect()).await
                } else {
                    let mut decisions = Vec::new();
                    for &c in costs {
                        decisions.push(limiter.check(key, one(c)).await);
                    }
                    decisions
                };
                costs
                    .iter()
                    .zip(decisions)
                    .map(|(&c, d)| (u64::from(c), check(&mut model, t, u64::from(c), &d), d))
                    .collect()
            }
        };
        if !matches!(op, Op::Peek(_)) {
            // (Whether a call reached Redis: a refusal from the deny cache did not, nor
            // a cost above the capacity, answered at once.)
            let reached = !redis
                || results.iter().any(|(_, _, d)| {
                    d.source == Source::Redis && d.state != State::ExceedsCapacity
                });
            model.mark(t, reached);
        }
        // The server clock's steps within a deny-cache entry's life (see `agrees`), and
        // then a rolling window's interval: a key's time moves by whole buckets.
        let stepped_us: u128 = steps
            .iter()
            .filter(|(at, _)| at + DENY_CACHE_MAX_AGE_MS > now)
            .map(|(_, by)| u128::from(*by) * 1_000)
            .sum();
        let drift_us = if stepped_us > 0 {
            stepped_us + u128::from(granularity_ms) * 1_000
        } else {
            0
        };
        for (cost, want, decision) in results {
            let _ = writeln!(log, "  #{step} at +{} ms {op:?}: {decision:?}", now - T0_MS);
            if let Err(why) = agrees(host, case, drift_us, cost, &decision, &want) {
                return Err(format!(
                    "{host:?}, step #{step} ({op:?} at +{} ms): got {:?}, {why}\n{log}",
                    now - T0_MS,
                    Answer::of(&decision)
                ));
            }
        }
    }
    Ok(())
}

/// The leased host's leases: their lifetime, on the backend's clock.
const LEASE_LIFETIME_MS: u64 = 1_500;

/// Redis with leases (`TokenBucketConfig::lease`), for a token bucket alone without a
/// lockout (a lease and a lockout conflict): two instances (every third step through
/// the second, with its own backend), each taking leases of up to 2 tokens (the burst
/// when smaller) for [`LEASE_LIFETIME_MS`], the server's clock (frozen at each step,
/// never stepped), no deny cache, no coalescing; checks, batches and time passing only.
///
/// The allowed difference, as documented: a lease is approximate, so its decisions are
/// not the model's one by one (an instance answers from its lease while the shared
/// bucket is empty, and refuses while the other instance holds the tokens; a lease's
/// answer says what is left of the lease). What leases promise instead is compared:
/// every decision is one of the bucket's (its limit the burst, a cost above it exceeds
/// the capacity, an admission from Redis or a lease), and over any window `[s, t]` of
/// the run the two instances admit at most the burst plus the tokens refilled in
/// `t - s` plus one lease each.
async fn run_leased(case: &Case, serial: u64) -> Result<(), String> {
    let [Limit::Bucket {
        rate,
        period_ms,
        burst,
    }] = case.limits[..]
    else {
        return Ok(());
    };
    if case.set || case.lockout_ms.is_some() {
        return Ok(());
    }
    let size = burst.min(2);
    let config = TokenBucketConfig::new(rate, Duration::from_millis(period_ms), burst)
        .lease(size, Duration::from_millis(LEASE_LIFETIME_MS));
    let manual = ManualClock::new(T0_MS * 1_000);
    let name = format!("m{serial}-leases");
    let instances = [0, 1].map(|_| {
        let backend = backend(Host::RedisServerTime, &manual, 0);
        TokenBucketLimiter::new(&backend, &name, config).expect("valid")
    });
    {
        let mut conn = shared().sweeper.get().await.expect("a connection");
        let () = deadpool_redis::redis::cmd("FLUSHALL")
            .query_async(&mut conn)
            .await
            .expect("FLUSHALL");
    }
    let mut now = T0_MS;
    // What was admitted: when (ms) and its cost.
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let mut log = String::new();
    for (step, op) in case.ops.iter().enumerate() {
        let limiter = &instances[usize::from(step % 3 == 2)];
        let costs = match op {
            Op::Wait(ms) => {
                now += ms;
                continue;
            }
            Op::Check(cost) => vec![*cost],
            Op::Batch(costs) => costs.clone(),
            _ => continue,
        };
        manual.set_us(now * 1_000);
        shared()
            .clock
            .freeze_at(i64::try_from(now * 1_000).expect("fits"));
        sweep().await;
        for cost in costs {
            let decision = limiter
                .check(b"k", NonZeroU32::new(cost).expect("a cost"))
                .await;
            let _ = writeln!(
                log,
                "  #{step} at +{} ms check {cost}: {decision:?}",
                now - T0_MS
            );
            let cost = u64::from(cost);
            let fail = |why: String| Err(format!("RedisLeases, step #{step}: {why}\n{log}"));
            if decision.limit != burst {
                return fail(format!("limit {}, not the burst {burst}", decision.limit));
            }
            if cost > burst {
                if decision.state != State::ExceedsCapacity {
                    return fail(format!("{:?} above the capacity", decision.state));
                }
                continue;
            }
            if !matches!(decision.source, Source::Redis | Source::Lease) {
                return fail(format!("answered by {:?}", decision.source));
            }
            if decision.is_admitted() {
                admitted.push((now, cost));
            }
        }
        // The windows ending now: from each earlier admission.
        for &(since, _) in &admitted {
            let within: u64 = admitted
                .iter()
                .filter(|(at, _)| *at >= since)
                .map(|(_, cost)| cost)
                .sum();
            let refilled = (now - since) * rate / period_ms;
            let bound = burst + refilled + 2 * size;
            if within > bound {
                return Err(format!(
                    "RedisLeases, step #{step}: {within} admitted in [+{} ms, +{} ms], \
                     bound {bound}\n{log}",
                    since - T0_MS,
                    now - T0_MS
                ));
            }
        }
    }
    Ok(())
}

/// Deletes the keys that expired by the server's (frozen) time, as the model forgets
/// them at each operation: Redis deletes an expired key when it is read, or when its
/// expiry cycle happens to run, and a step back after that would tell which. `SCAN`
/// deletes the expired keys it meets; the database holds this run's keys only.
async fn sweep() {
    let mut conn = shared().sweeper.get().await.expect("a connection");
    let mut cursor = 0u64;
    loop {
        let (next, _keys): (u64, Vec<Vec<u8>>) = deadpool_redis::redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1_000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

/// The deny cache's longest answer from one refusal (the backend's default).
const DENY_CACHE_MAX_AGE_MS: u64 = 1_000;

/// The model's check of `cost` at `t` where the host decided `got`: a refusal answered
/// from the deny cache never reached Redis, so the model keeps nothing of it (neither a
/// spending, judged by `agrees`, nor a skew or a lockout written by a refusal).
fn check(model: &mut Model, t: u64, cost: u64, got: &Decision) -> Answer {
    let before = model.clone();
    let want = model.check(t, cost);
    if got.source == Source::DenyCache {
        *model = before;
    }
    want
}

/// Polls `checks` together, in order, until all are done.
async fn futures_join(checks: Vec<tower_redis_ratelimit::DecisionFuture>) -> Vec<Decision> {
    let handles: Vec<_> = checks.into_iter().map(tokio::spawn).collect();
    let mut decisions = Vec::new();
    for handle in handles {
        decisions.push(handle.await.expect("a check never panics"));
    }
    decisions
}

/// Cases that failed once, shrunk, run on every host and path as generated ones are.
fn kept_cases() -> Vec<Case> {
    vec![
        // Valkey 8.0, the callers' clocks (a fresh-clone run of 2026-11-26): a set's
        // settlement after a block of 1 ms, a step of the server's clock back and its
        // return answered the block's 1 ms as its retry-after but the bucket's whole
        // interval as its reset.
        Case {
            limits: vec![
                Limit::Bucket {
                    rate: 7,
                    period_ms: 3_000,
                    burst: 1,
                },
                Limit::Rolling {
                    limit: 2,
                    buckets: 4,
                    interval_ms: 100,
                },
            ],
            set: true,
            lockout_ms: None,
            caller_skew_ms: 1_500,
            ops: vec![
                Op::Block(1),
                Op::Step(-20_000),
                Op::Settle(1),
                Op::Return,
                Op::Settle(0),
            ],
        },
        // A 2000-case run of 2026-11-27: the deny cache (coalescing on) after a 1 ms
        // block and a step of the server's clock past its end.
        Case {
            limits: vec![Limit::Period {
                quota: 2,
                period_ms: 10_000,
                align: None,
                calendar: false,
            }],
            set: false,
            lockout_ms: None,
            caller_skew_ms: -250,
            ops: vec![
                Op::Check(2),
                Op::Settle(-1),
                Op::Block(1),
                Op::Batch(vec![1, 1]),
                Op::Step(1),
                Op::Batch(vec![1, 2]),
            ],
        },
        // A 1500-case run on Valkey 8.0 of 2026-11-27: a block of 1 ms that ends at the
        // very millisecond of the next call, then a step of the server's clock back.
        Case {
            limits: vec![Limit::Bucket {
                rate: 4,
                period_ms: 1_000,
                burst: 4,
            }],
            set: true,
            lockout_ms: None,
            caller_skew_ms: -2_500,
            ops: vec![
                Op::Block(1),
                Op::Wait(1),
                Op::Refund(1),
                Op::Step(-20_000),
                Op::Check(1),
            ],
        },
        // The same with a cost above the capacity at the block's end (answered without
        // a call, so the block stays, and the step back brings it back).
        Case {
            limits: vec![
                Limit::Bucket {
                    rate: 3,
                    period_ms: 1_000,
                    burst: 6,
                },
                Limit::Bucket {
                    rate: 3,
                    period_ms: 1_000,
                    burst: 4,
                },
            ],
            set: true,
            lockout_ms: None,
            caller_skew_ms: 40,
            ops: vec![
                Op::Block(1),
                Op::Step(1),
                Op::Check(5),
                Op::Step(-20_000),
                Op::Check(1),
            ],
        },
    ]
}

#[test]
fn kept_cases_decide_like_the_model() {
    let _stop = StopServer;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // (Serials of their own: the generated cases' start at 0.)
    for (i, case) in kept_cases().iter().enumerate() {
        let serial = 1_000_000 + i as u64;
        runtime.block_on(async {
            for host in HOSTS {
                if let Err(why) = run(case, host, serial).await {
                    shared().clock.set_offset_us(0);
                    panic!("kept case {i} on {host:?}: {why}\n{case:?}");
                }
            }
        });
    }
    shared().clock.set_offset_us(0);
}

/// A case a 2000-case run of 2026-11-28 found (on the main of 2132c7e too): a calendar
/// day at its very start, the server's clock stepped 20 s back, a block of 1 ms, checks
/// answered by Redis, then 1 ms later by the deny cache. While the server's clock is
/// behind the window, Redis answers a whole period to wait at every moment; the deny
/// cache ages its refusal by this process's clock and says to retry 1 ms earlier. The
/// rule (issue 52): a cached refusal may say to retry earlier than Redis would, by at
/// most its age in the cache, never later.
#[test]
fn a_cached_refusal_ages_while_the_servers_clock_is_behind_its_window() {
    let _stop = StopServer;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let case = Case {
        limits: vec![Limit::Period {
            quota: 4,
            period_ms: 86_400_000,
            align: Some(-28_800),
            calendar: true,
        }],
        set: false,
        lockout_ms: None,
        caller_skew_ms: 40,
        ops: vec![
            Op::Settle(4),
            Op::Step(-20_000),
            Op::Wait(999),
            Op::Block(1),
            Op::Batch(vec![1, 1]),
            Op::Wait(1),
            Op::Batch(vec![1, 1]),
        ],
    };
    let result = runtime.block_on(run(&case, Host::RedisCached, 2_000_000));
    shared().clock.set_offset_us(0);
    if let Err(why) = result {
        panic!("{why}\n{case:?}");
    }
}

#[test]
fn every_host_and_path_decides_like_the_model() {
    let _stop = StopServer;
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(48);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let serial = AtomicU64::new(0);
    let result = runner.run(&case(), |case| {
        let serial = serial.fetch_add(1, Ordering::Relaxed);
        runtime.block_on(async {
            for host in HOSTS {
                if let Err(why) = run(&case, host, serial).await {
                    return Err(TestCaseError::fail(why));
                }
            }
            run_leased(&case, serial).await.map_err(TestCaseError::fail)
        })
    });
    // As many cases again of a token bucket alone, for the leased host (a few percent
    // of the cases above are), one after the other (they share the server's clock).
    let result = result.and_then(|()| {
        runner.run(&leased_case(), |case| {
            let serial = serial.fetch_add(1, Ordering::Relaxed);
            runtime
                .block_on(run_leased(&case, serial))
                .map_err(TestCaseError::fail)
        })
    });
    shared().clock.set_offset_us(0);
    if let Err(error) = result {
        panic!("{error}");
    }
}

// ---------------------------------------------------------------------------
// Headers that never mislead (issue 35, item 3)
// ---------------------------------------------------------------------------

/// Whole milliseconds from µs, rounded up: a client that follows a header waits at
/// least what it says (the headers' seconds round up further).
fn ms_up(us: u128) -> u64 {
    u64::try_from(us.div_ceil(1_000)).expect("fits")
}

/// What the answer `said` to a check of `cost` at `now` promises a client that follows
/// it, when nothing else happens to the key meanwhile, checked on copies of `model` (the
/// state right after the answer):
/// - admitted with `remaining` left: a check of that many units, at once, is admitted;
/// - refused with a retry-after: the same check, once it has passed, is admitted;
/// - a blocked key says nothing is left;
/// - one limit: at its reset, a check of its whole capacity is admitted.
fn promises(model: &Model, now: u64, cost: u64, said: Answer) -> Result<(), String> {
    if said.state == State::ExceedsCapacity {
        return Ok(());
    }
    let try_at = |at: u64, units: u64| {
        let mut copy = model.clone();
        copy.expire(at);
        copy.check(at, units)
    };
    if model.blocked_until > now && said.remaining != 0 {
        return Err(format!(
            "blocked until {} but said {said:?}",
            model.blocked_until
        ));
    }
    if said.admitted() && said.remaining > 0 {
        let got = try_at(now, said.remaining);
        if !got.admitted() {
            return Err(format!(
                "said {said:?}; {} units at once: {got:?}",
                said.remaining
            ));
        }
    }
    if !said.admitted() {
        let Some(retry_us) = said.retry_us else {
            return Err(format!("refused without a retry-after: {said:?}"));
        };
        let at = now + ms_up(retry_us);
        let got = try_at(at, cost);
        if !got.admitted() {
            return Err(format!(
                "said {said:?}; {cost} units after the retry-after (+{} ms): {got:?}",
                at - now
            ));
        }
    }
    if !model.set && model.blocked_until <= now {
        let capacity = model.limits[0].capacity();
        let at = now + ms_up(said.reset_us);
        let got = try_at(at, capacity);
        if !got.admitted() {
            return Err(format!(
                "said {said:?}; the whole capacity {capacity} at the reset (+{} ms): {got:?}",
                at - now
            ));
        }
    }
    Ok(())
}

/// Runs `case` on the model alone, on one clock (a client sees no step of the server's:
/// steps are the model test's business), and holds every check's answer to its
/// promises.
fn headers_hold(case: &Case) -> Result<(), String> {
    let mut model = Model::new(case);
    let mut now = T0_MS;
    for (step, op) in case.ops.iter().enumerate() {
        model.expire(now);
        model.read = now;
        let checks: Vec<u64> = match op {
            Op::Wait(ms) => {
                now += ms;
                continue;
            }
            Op::Step(_) | Op::Return => continue,
            Op::Check(cost) => vec![u64::from(*cost)],
            Op::Batch(costs) => costs.iter().map(|&c| u64::from(c)).collect(),
            Op::Peek(cost) => {
                model.peek(now, u64::from(*cost));
                continue;
            }
            Op::Refund(cost) => {
                model.refund(now, u64::from(*cost));
                continue;
            }
            Op::Reset => {
                model.reset(now);
                continue;
            }
            Op::Settle(delta) => {
                model.settle(now, *delta);
                continue;
            }
            Op::Block(ms) => {
                model.block(now, *ms);
                continue;
            }
            Op::Unblock => {
                model.unblock(now);
                continue;
            }
            Op::Reserve(cost, max_wait_ms) => {
                model.reserve(now, u64::from(*cost), *max_wait_ms);
                continue;
            }
            Op::Priority(cost, percent) => {
                model.priority(now, u64::from(*cost), *percent);
                continue;
            }
        };
        for cost in checks {
            let said = model.check(now, cost);
            promises(&model, now, cost, said)
                .map_err(|why| format!("step #{step} at +{} ms, {op:?}: {why}", now - T0_MS))?;
        }
    }
    Ok(())
}

/// A client that follows the headers is never refused before they said it would be,
/// nor told it has units it will not get (issue 35, item 3): any sequence of checks,
/// blocks, lockouts, resets, refunds and settlements, on one limit or a set, held to
/// [`promises`] on the reference model, which every host matches field by field
/// (above). The headers are these fields (`RateLimit`'s `r` and `t`, `Retry-After`),
/// in whole seconds rounded up.
#[test]
fn headers_never_mislead_a_client_that_follows_them() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(48)
        * 20;
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(error) = runner.run(&case(), |case| {
        headers_hold(&case).map_err(TestCaseError::fail)
    }) {
        panic!("{error}");
    }
}
