//! Listing what is blocked ([`Limiter::blocked`](crate::Limiter::blocked)) without
//! reading the keyspace: blocks are rare, so each limit keeps a small list of its
//! blocked keys beside them, and a listing reads that list alone.
//!
//! On Redis the list is a sorted set per limit, `<prefix>:blocked:<algorithm>:<name>`
//! ([`Layout::blocked_index`](super::layout::Layout::blocked_index)): a member per
//! blocked key (the key's bytes, as the limit counts it), scored by the block's end in
//! Unix milliseconds. It is written here, in Rust, beside the engine's calls, never by
//! the engine's script: after a handle's block (`ZADD`) or reset (`ZREM`) that Redis
//! answered, before the handle's answer; after a check that Redis refused with a
//! lockout, in the background (a spawned task: no check waits for it or fails with it),
//! once per lockout and instance. Each write first drops the entries that have ended
//! (`ZREMRANGEBYSCORE -inf now`), so the set holds the blocks running at its last write.
//! A listing is one `ZRANGEBYSCORE <list> (now +inf WITHSCORES LIMIT 0 max`: at most
//! `max` entries read, whatever the number of keys, limits or blocks of other limits.
//!
//! The block's own key stays the truth: the list is advisory. It is written in another
//! call than the block's (on Redis Cluster it lives in another slot, outside every
//! key's hash tag), so it may lag the block by that call, miss a block whose write
//! failed (a warning says so), and list until its end a block whose key Redis evicted
//! or a user deleted, or a lockout that a reset on another instance lifted before the
//! lockout's write landed. In process (an in-process backend) the list is the
//! blocks' [`Registry`](super::block::Registry), each entry checked against the block
//! itself when listed. The handles' listing, which picks one or the other, is
//! `operate.rs`'s [`list_blocked`](super::operate::list_blocked).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_redis::redis::{self, Value};

use crate::backend::redis::RedisBackend;
use crate::error::AdminError;

/// The most entries one listing reads, whatever `max` it is asked for.
pub(crate) const MAX_LISTED: usize = 10_000;

/// How many lockouts an instance remembers having listed (per limit), so that the
/// refusals of a locked-out key that reach Redis list it once.
const MAX_REMEMBERED: usize = 4_096;

/// Two ends of one lockout seen by two refusals differ by the clocks' jitter; a new
/// lockout ends at least a lockout later than the one before.
const SAME_END_MS: u64 = 100;

/// How often a failed write of the list is logged, at most, per limit.
const WARN_INTERVAL_MS: u64 = 60_000;

/// One limit's list of blocked keys on Redis: its key, and the lockouts this instance
/// listed lately. Cheap to clone (a spawned write holds a clone).
#[derive(Debug, Clone)]
pub(crate) struct Index(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    /// `<prefix>:blocked:<algorithm>:<name>`.
    key: Box<[u8]>,
    /// Lockouts listed by this instance: the key's hash, and when its lockout ends (ms).
    listed: Mutex<HashMap<u128, u64>>,
    /// When a failed write was last logged (Unix ms; 0: never).
    warned_ms: AtomicU64,
}

impl Index {
    /// The list kept under the Redis key `key`.
    pub(crate) fn new(key: Vec<u8>) -> Self {
        Self(Arc::new(Shared {
            key: key.into(),
            listed: Mutex::default(),
            warned_ms: AtomicU64::new(0),
        }))
    }

    /// Whether the lockout of the key hashing to `hash`, ending at `until_ms`, is not
    /// listed by this instance yet (and remembers it now).
    fn first_sight(&self, hash: u128, until_ms: u64, now_ms: u64) -> bool {
        let mut listed = self.0.listed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&known) = listed.get(&hash) {
            if known > now_ms && known.abs_diff(until_ms) <= SAME_END_MS {
                return false;
            }
        }
        if listed.len() >= MAX_REMEMBERED {
            listed.retain(|_, &mut until| until > now_ms);
            if listed.len() >= MAX_REMEMBERED {
                listed.clear();
            }
        }
        listed.insert(hash, until_ms);
        true
    }

    fn forget(&self, hash: u128) {
        let mut listed = self.0.listed.lock().unwrap_or_else(|e| e.into_inner());
        listed.remove(&hash);
    }

    /// Sends `pipe` (this list's commands); a failure is logged (at most every
    /// [`WARN_INTERVAL_MS`]), never returned: the block itself holds.
    async fn write(&self, redis: &Arc<RedisBackend>, pipe: redis::Pipeline, now_ms: u64) {
        let Err(error) = redis.commands(&pipe).await else {
            return;
        };
        let warned = self.0.warned_ms.load(Ordering::Relaxed);
        let due = warned == 0 || now_ms.saturating_sub(warned) >= WARN_INTERVAL_MS;
        if due
            && self
                .0
                .warned_ms
                .compare_exchange(warned, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                list = %String::from_utf8_lossy(&self.0.key),
                %error,
                "the list of blocked keys could not be written: a listing may miss a \
                 block until its end (the block itself holds)"
            );
        }
    }

    /// The commands that drop the entries ended at `now_ms`, then `more`.
    fn trimmed(&self, now_ms: u64) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&*self.0.key)
            .arg("-inf")
            .arg(now_ms)
            .ignore();
        pipe
    }
}

impl Index {
    /// Lists `key` as blocked until `until_ms` (at `now_ms`): after a handle's block
    /// that Redis answered (awaited by the handle: its block is listed when it answers).
    pub(super) async fn list(
        &self,
        redis: &Arc<RedisBackend>,
        key: &[u8],
        until_ms: u64,
        now_ms: u64,
    ) {
        let mut pipe = self.trimmed(now_ms);
        pipe.cmd("ZADD")
            .arg(&*self.0.key)
            .arg(until_ms)
            .arg(key)
            .ignore();
        self.write(redis, pipe, now_ms).await;
    }

    /// Takes `key` (hashing to `hash` in the deny cache) off the list at `now_ms`: after
    /// a handle's reset that Redis answered (awaited by the handle).
    pub(super) async fn unlist(
        &self,
        redis: &Arc<RedisBackend>,
        key: &[u8],
        hash: u128,
        now_ms: u64,
    ) {
        self.forget(hash);
        let mut pipe = self.trimmed(now_ms);
        pipe.cmd("ZREM").arg(&*self.0.key).arg(key).ignore();
        self.write(redis, pipe, now_ms).await;
    }

    /// Lists `key` (hashing to `hash` in the deny cache) as locked out until `until_ms`
    /// (at `now_ms`), after a check that Redis refused with a lockout: in the
    /// background, once per lockout on this instance (the refusals that reach Redis
    /// while it runs find it listed). Without a runtime, nothing (the lockout holds,
    /// unlisted).
    pub(super) fn list_lockout(
        &self,
        redis: &Arc<RedisBackend>,
        key: &[u8],
        hash: u128,
        until_ms: u64,
        now_ms: u64,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.first_sight(hash, until_ms, now_ms) {
            return;
        }
        let index = self.clone();
        let mut pipe = index.trimmed(now_ms);
        pipe.cmd("ZADD")
            .arg(&*index.0.key)
            .arg(until_ms)
            .arg(key)
            .ignore();
        let redis = Arc::clone(redis);
        runtime.spawn(async move { index.write(&redis, pipe, now_ms).await });
    }

    /// The keys listed as blocked after `now_ms`, soonest end first, at most `max` (and
    /// [`MAX_LISTED`]): `(key, until ms)`, or why Redis did not answer.
    pub(super) fn read(
        &self,
        redis: &Arc<RedisBackend>,
        now_ms: u64,
        max: usize,
    ) -> impl Future<Output = Result<Vec<(Vec<u8>, u64)>, AdminError>> + Send + 'static {
        let mut pipe = redis::pipe();
        pipe.cmd("ZRANGEBYSCORE")
            .arg(&*self.0.key)
            .arg(format!("({now_ms}"))
            .arg("+inf")
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(0)
            .arg(max.min(MAX_LISTED));
        let redis = Arc::clone(redis);
        async move {
            if max == 0 {
                return Ok(Vec::new());
            }
            let replies = redis
                .commands(&pipe)
                .await
                .map_err(|error| AdminError::Listing(error.to_string()))?;
            replies.first().and_then(read_entries).ok_or_else(|| {
                AdminError::Listing("redis answered ZRANGEBYSCORE with an unexpected reply".into())
            })
        }
    }
}

/// A listed key and its block's end (Unix ms).
type Entry = (Vec<u8>, u64);

/// A `ZRANGEBYSCORE … WITHSCORES` reply as `(member, score)` pairs: a flat array of
/// members and scores (RESP2), or an array of pairs (RESP3). A score that is no time
/// (infinite, negative: only another program writes one) leaves its entry out; `None`
/// for a reply of any other shape.
fn read_entries(reply: &Value) -> Option<Vec<Entry>> {
    let Value::Array(items) = reply else {
        return None;
    };
    // `Some(None)`: a well-formed entry whose score is no time.
    let pair = |member: &Value, score: &Value| -> Option<Option<Entry>> {
        let Value::BulkString(member) = member else {
            return None;
        };
        let score: f64 = match score {
            Value::Double(score) => *score,
            Value::BulkString(text) => std::str::from_utf8(text).ok()?.parse().ok()?,
            Value::Int(score) => *score as f64,
            _ => return None,
        };
        Some((score.is_finite() && score >= 0.0).then(|| (member.clone(), score as u64)))
    };
    let pairs: Option<Vec<Option<Entry>>> =
        if items.iter().all(|item| matches!(item, Value::Array(_))) {
            items
                .iter()
                .map(|item| match item {
                    Value::Array(two) if two.len() == 2 => pair(&two[0], &two[1]),
                    _ => None,
                })
                .collect()
        } else if items.len() % 2 == 0 {
            items.chunks(2).map(|two| pair(&two[0], &two[1])).collect()
        } else {
            None
        };
    Some(pairs?.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_of_either_protocol_read_the_same() {
        let resp2 = Value::Array(vec![
            Value::BulkString(b"a".to_vec()),
            Value::BulkString(b"1700000000000".to_vec()),
            Value::BulkString(b"b:c".to_vec()),
            Value::BulkString(b"1700000000500".to_vec()),
        ]);
        let resp3 = Value::Array(vec![
            Value::Array(vec![
                Value::BulkString(b"a".to_vec()),
                Value::Double(1.7e12),
            ]),
            Value::Array(vec![
                Value::BulkString(b"b:c".to_vec()),
                Value::Double(1_700_000_000_500.0),
            ]),
        ]);
        let expected = vec![
            (b"a".to_vec(), 1_700_000_000_000),
            (b"b:c".to_vec(), 1_700_000_000_500),
        ];
        assert_eq!(read_entries(&resp2), Some(expected.clone()));
        assert_eq!(read_entries(&resp3), Some(expected));
        assert_eq!(read_entries(&Value::Array(Vec::new())), Some(Vec::new()));
        // Never a panic on a reply of another shape.
        for odd in [
            Value::Nil,
            Value::Int(3),
            Value::Array(vec![Value::BulkString(b"a".to_vec())]),
            Value::Array(vec![Value::Int(1), Value::Int(2)]),
            Value::Array(vec![Value::Array(vec![Value::Nil])]),
            Value::Array(vec![
                Value::BulkString(b"a".to_vec()),
                Value::BulkString(b"soon".to_vec()),
            ]),
        ] {
            assert_eq!(read_entries(&odd), None, "{odd:?}");
        }
        // Scores that are no time: those entries left out.
        let no_time = Value::Array(vec![
            Value::BulkString(b"a".to_vec()),
            Value::BulkString(b"inf".to_vec()),
            Value::BulkString(b"b".to_vec()),
            Value::BulkString(b"-1".to_vec()),
            Value::BulkString(b"c".to_vec()),
            Value::BulkString(b"5".to_vec()),
        ]);
        assert_eq!(read_entries(&no_time), Some(vec![(b"c".to_vec(), 5)]));
    }

    #[test]
    fn a_lockout_is_listed_once_per_instance() {
        let index = Index::new(b"p:blocked:period:login".to_vec());
        assert!(index.first_sight(1, 10_000, 1_000));
        // The same lockout, seen by a later refusal through the clocks' jitter.
        assert!(!index.first_sight(1, 10_040, 2_000));
        // Another key; then a new lockout of the first once its own has ended.
        assert!(index.first_sight(2, 10_000, 2_000));
        assert!(index.first_sight(1, 25_000, 11_000));
        // A reset forgets it: the next lockout is listed whatever its end.
        index.forget(1);
        assert!(index.first_sight(1, 25_000, 12_000));
    }
}
