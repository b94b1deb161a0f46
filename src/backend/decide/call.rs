//! One call of the engine ([`engine_call`]; [`engine_call_of`] for a batch's keys):
//! the one place that lays out `engine.lua`'s `KEYS` and `ARGV`.

use super::engine::ENGINE;
use super::hosts::Hosts;
use super::protocol::{write_head, Op};
use crate::backend::redis::call::Call;
use crate::backend::redis::time::TimeSource;
use deadpool_redis::redis::ToRedisArgs;

/// One call of the engine for `key` (whose Redis key is `redis_key`): every limit's key
/// and the block key, then the head (one text `op:count:param`: `count` a cost, or how
/// many coalesced costs; `param` the lockout, a reservation's longest wait or a lease's
/// size), the limits' arguments (one text), each calendar window's four boundaries,
/// `extra` (the costs of coalesced checks; a lease's expired unused tokens; a batch's
/// items), and the
/// caller's time when the backend sends it. The one place that lays out `engine.lua`'s
/// `ARGV`.
pub(super) fn engine_call<T: Hosts + ?Sized>(
    store: &T,
    key: &[u8],
    redis_key: &[u8],
    op: Op,
    count: impl std::fmt::Display,
    param: u64,
    extra: &[u32],
) -> Call {
    engine_call_of(store, &[(key, redis_key)], op, count, param, extra)
}

/// [`engine_call`] for the keys of several checks (`(key, Redis key)` each, a batch's:
/// each check's keys in turn, see `batch` in `engine.lua`), with `extra` of any kind
/// of argument (a batch's: its items, [`Ask`](super::batch::Ask)).
pub(super) fn engine_call_of<T: Hosts + ?Sized, E: ToRedisArgs>(
    store: &T,
    keys: &[(&[u8], &[u8])],
    op: Op,
    count: impl std::fmt::Display,
    param: u64,
    extra: &[E],
) -> Call {
    let remote = store.remote();
    let backend = remote.backend();
    let time = backend.time_source();
    let limits = store.limit_count();
    let limit_args = remote.limit_args(|args| store.limit_args(args));
    let (args, bytes) = limit_args.size();
    let key_bytes: usize = keys.iter().map(|(_, redis_key)| redis_key.len() + 8).sum();
    // Room for the keys (a set's other keys about as long as the first), the head (three
    // numbers), the limits' argument, the extra numbers and the time.
    let functions = backend
        .redis_handle()
        .is_some_and(|redis| redis.engine_functions());
    let mut call = Call::engine(
        &ENGINE,
        time,
        functions,
        // A peek writes nothing: a read-only replica or a server out of memory runs it.
        !op.writes(),
        (limits + 1) * keys.len(),
        (limits + 1) * keys.len() + 1 + args + extra.len() + 1,
        (limits + 1) * key_bytes + 3 * 20 + bytes + extra.len() * 21 + 20,
    );
    for &(key, redis_key) in keys {
        call.key(redis_key);
        store.extra_keys(key, &mut call);
        call.written(|out| remote.block_layout.write_redis_key(key, out));
    }
    call.written(|out| {
        write_head(out, op, &count, param);
    });
    call.args(limit_args);
    // Calendar windows: their boundaries around this host's clock (the engine picks the
    // window of the time it reads: the server's, or the caller's sent below).
    let now_ms = i64::try_from(backend.caller_now_us() / 1_000).unwrap_or(i64::MAX);
    store.window_args(now_ms, &mut call);
    for number in extra {
        call.arg(number);
    }
    if time == TimeSource::Caller {
        call.arg(backend.caller_now_us());
    }
    call
}
