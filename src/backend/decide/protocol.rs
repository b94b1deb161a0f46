//! The engine's wire format on one page: the operations a call names ([`Op`]), how a
//! call's head and its limits are written ([`write_head`], [`Limit`]), and how replies
//! are read ([`Reply`] and each algorithm's limit reply; packed admits and batches,
//! [`reply_numbers`], [`batch_numbers`]).
//!
//! A call is `KEYS` (each limit's key, then the key's block) and `ARGV`: the head
//! (`op:count:param`), the limits (each one's letter, its count of arguments and its
//! arguments, joined by `:`), then per operation calendar boundaries, extra numbers and,
//! with the caller's clock, the time. The Lua side reads them in `engine.lua`'s
//! `locals` section (`list_of`) and answers in the layouts below; this module's tests
//! read the Lua files and fail when an operation, a limit's letter or a reply's layout
//! differs from what is defined here.

use std::fmt::Display;
use std::io::Write;

use deadpool_redis::redis::{self, FromRedisValue, Value};

use crate::backend::redis::call::Args;

/// An operation of the engine: the head's first word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Decides a check, and spends when every limit admits.
    Check,
    /// Decides a check of a priority class: each limit admits when the cost and the
    /// units the class leaves to others (the extra numbers, one per limit) fit, and
    /// spends the cost.
    Priority,
    /// Decides a check, spending nothing.
    Peek,
    /// Gives the cost back to every limit.
    Refund,
    /// Settles a request to what it really cost: the count is a signed delta, given
    /// back below 0, spent whatever the limits say above 0.
    Settle,
    /// Forgets the key and lifts its block.
    Reset,
    /// Refuses the key for `count` ms.
    Block,
    /// Lifts the key's block, keeping what its limits have counted.
    Unblock,
    /// Takes one token bucket's tokens at the earliest time they fit, at most `param`
    /// µs away.
    Reserve,
    /// Takes at least `count` and at most `param` tokens of one token bucket, after
    /// giving back the key's expired lease (its unused tokens the first extra number).
    Lease,
    /// Coalesced checks of one key (`count` of them, their costs the extra numbers),
    /// each decided as its own check.
    Coalesced,
    /// [`Op::Coalesced`] checks that all cost the same, their cost the one extra number.
    SharedCoalesced,
    /// Checks and settlements of several keys of one limiter (`count` of them, each
    /// one's cost, `s` and its delta, or `h`, its cost and its keeps, an extra
    /// argument), each decided as its own.
    Batch,
    /// [`Op::Batch`] checks that all cost the same (of one priority class, if any), their
    /// text the one extra argument.
    SharedBatch,
}

impl Op {
    /// Every operation (for the tests that hold the Lua to them).
    #[cfg(test)]
    pub(crate) const ALL: [Op; 14] = [
        Op::Check,
        Op::Priority,
        Op::Peek,
        Op::Refund,
        Op::Settle,
        Op::Reset,
        Op::Block,
        Op::Unblock,
        Op::Reserve,
        Op::Lease,
        Op::Coalesced,
        Op::SharedCoalesced,
        Op::Batch,
        Op::SharedBatch,
    ];

    /// Its word in the head (one letter: the head is sent with every call).
    pub(crate) const fn word(self) -> &'static str {
        match self {
            Op::Check => "c",
            Op::Priority => "h",
            Op::Peek => "p",
            Op::Refund => "f",
            Op::Settle => "s",
            Op::Reset => "x",
            Op::Block => "b",
            Op::Unblock => "u",
            Op::Reserve => "v",
            Op::Lease => "l",
            Op::Coalesced => "m",
            Op::SharedCoalesced => "M",
            Op::Batch => "k",
            Op::SharedBatch => "K",
        }
    }

    /// Whether it may write: all but a peek (which a read-only replica, or a server out
    /// of memory, still runs: `FCALL_RO`).
    pub(crate) const fn writes(self) -> bool {
        !matches!(self, Op::Peek)
    }
}

/// Writes a call's head: `op:count:param` (`count`: the cost, a settlement's delta, a
/// batch's size; `param`: a check's lockout in ms, a reservation's longest wait in µs,
/// a lease's size).
pub(crate) fn write_head(out: &mut dyn Write, op: Op, count: impl Display, param: u64) {
    // (Writing into a call's buffer does not fail.)
    let _ = write!(out, "{}:{count}:{param}", op.word());
}

/// A limit as the limits' text names it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Limit {
    /// A fixed window (`w`) of `quota` per `period_ms`, its windows aligned to
    /// `offset_ms` from the epoch, or (`None`) starting at a key's first request.
    Window {
        quota: u64,
        period_ms: u64,
        offset_ms: Option<i64>,
    },
    /// A calendar window (`c`): a fixed window whose four boundaries the call sends
    /// after the limits (`period_ms`: its usual length, for the key's expiry).
    Calendar { quota: u64, period_ms: u64 },
    /// A token bucket (`t`) of `burst`, one token per `interval_us`, its times counted
    /// from `epoch_secs`.
    TokenBucket {
        interval_us: f64,
        burst: u64,
        epoch_secs: i64,
    },
    /// A rolling window (`r`) of `limit` over `buckets` buckets of `interval_ms`.
    Rolling {
        limit: u64,
        buckets: u32,
        interval_ms: u64,
    },
}

impl Limit {
    /// Its letter (in capitals, a set's member that counts requests, not cost).
    pub(crate) const fn letter(self) -> &'static str {
        match self {
            Limit::Window { .. } => "w",
            Limit::Calendar { .. } => "c",
            Limit::TokenBucket { .. } => "t",
            Limit::Rolling { .. } => "r",
        }
    }

    /// Appends its words: its letter, its count of arguments, its arguments.
    pub(crate) fn write(self, args: &mut Args) {
        args.arg(self.letter());
        match self {
            Limit::Window {
                quota,
                period_ms,
                offset_ms: None,
            }
            | Limit::Calendar { quota, period_ms } => args.arg(2).arg(quota).arg(period_ms),
            Limit::Window {
                quota,
                period_ms,
                offset_ms: Some(offset),
            } => args.arg(3).arg(quota).arg(period_ms).arg(offset),
            Limit::TokenBucket {
                interval_us,
                burst,
                epoch_secs,
            } => args.arg(3).arg(interval_us).arg(burst).arg(epoch_secs),
            Limit::Rolling {
                limit,
                buckets,
                interval_ms,
            } => args.arg(3).arg(limit).arg(buckets).arg(interval_ms),
        };
    }
}

/// The engine's reply to a call on one key: `{admitted by every limit (1/0), ms the
/// key stays blocked (0: not blocked), then each limit's reply in order}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply<'a> {
    pub(crate) admitted: bool,
    pub(crate) blocked_ms: u64,
    /// Each limit's reply, in order (read by its algorithm: [`WindowReply`],
    /// [`BucketReply`], [`RollingReply`]).
    pub(crate) limits: &'a [i64],
}

impl<'a> Reply<'a> {
    /// Its slots, as `engine.lua` declares them.
    #[cfg(test)]
    pub(crate) const SLOTS: &'static [&'static str] = &["admitted", "blocked_ms", "limits..."];

    /// Reads `numbers` (see [`reply_numbers`]), or `None` when they are not a reply.
    pub(crate) fn read(numbers: &'a [i64]) -> Option<Self> {
        let [admitted, blocked_ms, limits @ ..] = numbers else {
            return None;
        };
        Some(Self {
            admitted: *admitted == 1,
            blocked_ms: u64::try_from(*blocked_ms).ok()?,
            limits,
        })
    }
}

/// A fixed window's (or a calendar window's) reply: whether it admits, the window's
/// count after the check, and the ms until the window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowReply {
    pub(crate) admitted: bool,
    pub(crate) count: u64,
    pub(crate) window_ms: u64,
}

impl WindowReply {
    /// Its slots, as `period.lua` declares them.
    pub(crate) const SLOTS: &'static [&'static str] = &["admitted", "count", "window_ms"];

    /// Reads one limit's reply.
    pub(crate) fn read(reply: &[i64]) -> Option<Self> {
        let &[admitted, count, window_ms] = reply else {
            return None;
        };
        Some(Self {
            admitted: admitted == 1,
            count: u64::try_from(count).ok()?,
            window_ms: u64::try_from(window_ms).unwrap_or(0),
        })
    }
}

/// A token bucket's reply: whether it admits, the tokens left, the µs to wait (a
/// refusal's retry, a reservation's wait before use; else 0) and the µs until full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketReply {
    pub(crate) admitted: bool,
    pub(crate) left: u64,
    pub(crate) wait_us: u64,
    pub(crate) full_us: u64,
}

impl BucketReply {
    /// Its slots, as `token_bucket.lua` declares them.
    pub(crate) const SLOTS: &'static [&'static str] = &["admitted", "left", "wait_us", "full_us"];

    /// Reads one limit's reply.
    pub(crate) fn read(reply: &[i64]) -> Option<Self> {
        let &[admitted, left, wait_us, full_us] = reply else {
            return None;
        };
        let us = |v: i64| u64::try_from(v).unwrap_or(0);
        Some(Self {
            admitted: admitted == 1,
            left: us(left),
            wait_us: us(wait_us),
            full_us: us(full_us),
        })
    }
}

/// A rolling window's reply: whether it admits, the live buckets' sum after the check,
/// the ms until the cost could be admitted (0 when admitted) and the ms until every
/// counted unit has expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RollingReply {
    pub(crate) admitted: bool,
    pub(crate) sum: u64,
    pub(crate) retry_ms: u64,
    pub(crate) reset_ms: u64,
}

impl RollingReply {
    /// Its slots, as `rolling.lua` declares them.
    pub(crate) const SLOTS: &'static [&'static str] = &["admitted", "sum", "retry_ms", "reset_ms"];

    /// Reads one limit's reply (`None` unless its first slot is 1 or 0).
    pub(crate) fn read(reply: &[i64]) -> Option<Self> {
        let &[admitted @ (0 | 1), sum, retry_ms, reset_ms] = reply else {
            return None;
        };
        let ms = |v: i64| u64::try_from(v).unwrap_or(0);
        Some(Self {
            admitted: admitted == 1,
            sum: u64::try_from(sum).ok()?,
            retry_ms: ms(retry_ms),
            reset_ms: ms(reset_ms),
        })
    }
}

/// A script's reply as numbers: for the engine, its table, with a fast path's admits
/// read back into the table they stand for (`fast.lua`: one limit's reply is a packed
/// negative number, or the table of its wide admit; a set's, a table of its limits'
/// admits, each packed or wide); other scripts' tables never start with a negative
/// number.
pub(crate) fn reply_numbers(value: Value) -> redis::RedisResult<Vec<i64>> {
    match value {
        Value::Int(packed) if packed < 0 => {
            let mut out = Vec::with_capacity(6);
            out.extend([1, 0]);
            unpack_into(&mut out, packed);
            Ok(out)
        }
        Value::Array(items) if matches!(items.first(), Some(Value::Int(first)) if *first < 0) => {
            let mut out = Vec::with_capacity(2 + 4 * items.len());
            out.extend([1, 0]);
            let mut items = items.into_iter();
            while let Some(item) = items.next() {
                if !admit_into(&mut out, item, &mut items) {
                    // (Not the engine's: read as nothing admitted, which no decision reads.)
                    out.push(0);
                }
            }
            Ok(out)
        }
        value => Ok(Vec::<i64>::from_redis_value(value)?),
    }
}

/// A batch's reply (engine ops `k`, `K` and `m`: one table, the count of limits `n`,
/// then each check's reply in order, flat: an admit as its `n` limits' admits, packed
/// or wide, anything else as its table, an item that raised an error as nil) as
/// numbers: each check's reply, read as [`reply_numbers`] reads it, after its length
/// (none for a check that raised an error, whose failure policy answers).
pub(crate) fn batch_numbers(value: Value) -> redis::RedisResult<Vec<i64>> {
    let Value::Array(items) = value else {
        // (Not a batch's reply: read as no check's, which fails every check.)
        return Ok(Vec::new());
    };
    let mut items = items.into_iter();
    let Some(Value::Int(n @ 1..)) = items.next() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(items.len() * 7);
    while let Some(item) = items.next() {
        let at = out.len();
        out.push(0);
        match item {
            Value::Nil | Value::Boolean(false) => {}
            Value::Int(first) if first < 0 => {
                out.extend([1, 0]);
                let mut admit = Some(Value::Int(first));
                for _ in 0..n {
                    let read = match admit.take().or_else(|| items.next()) {
                        Some(item) => admit_into(&mut out, item, &mut items),
                        None => false,
                    };
                    if !read {
                        // (Not the engine's: read as no check's, which fails every check.)
                        return Ok(Vec::new());
                    }
                }
            }
            item => out.extend(reply_numbers(item).unwrap_or_default()),
        }
        out[at] = i64::try_from(out.len() - at - 1).unwrap_or(i64::MAX);
    }
    Ok(out)
}

/// Appends the reply that one limit's admit stands for (`item`, packed, or the first
/// number of a wide admit, whose other two `rest` gives), or returns false when it is
/// not an admit.
fn admit_into(out: &mut Vec<i64>, item: Value, rest: &mut impl Iterator<Item = Value>) -> bool {
    let Value::Int(first @ ..0) = item else {
        return false;
    };
    let word = -(first.saturating_add(1));
    if word & 63 != 0 {
        unpack_into(out, first);
        return true;
    }
    // Wide: -(shape * 64) - 1, then n and t.
    let (Some(Value::Int(n)), Some(Value::Int(t))) = (rest.next(), rest.next()) else {
        return false;
    };
    out.extend([1, n]);
    if word & 64 != 0 {
        out.push(0);
    }
    out.push(t);
    true
}

/// Appends the reply `{1, n, t}` (shape 0, a fixed window's) or `{1, n, 0, t}` (shape 1)
/// that a fast path's packed admit stands for:
/// `-((t * 2^bits + n) * 128 + shape * 64 + bits) - 1`.
fn unpack_into(out: &mut Vec<i64>, packed: i64) {
    let word = -(packed.saturating_add(1));
    let bits = word & 63;
    let rest = word >> 7;
    let n = rest & ((1_i64 << bits.min(62)) - 1);
    out.extend([1, n]);
    if word & 64 != 0 {
        out.push(0);
    }
    out.push(rest >> bits);
}

/// Not part of the API: whether a reply of [`engine_script`] (read as numbers by
/// redis-rs) admits: its table's first number is 1, or it is a fast path's packed
/// admit (negative).
#[doc(hidden)]
#[must_use]
pub fn engine_admits(reply: &[i64]) -> bool {
    matches!(reply.first(), Some(&first) if first == 1 || first < 0)
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
