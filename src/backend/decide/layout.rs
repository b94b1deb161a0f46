//! The Redis key layout, built here and nowhere else (see the [module docs](super#redis-keys)):
//!
//! ```text
//! <prefix>:{v1:<escaped key>}:<algorithm>:<name>                      a limiter's own key
//! <prefix>:{v1:<escaped key>}:set:<set name length>:<set name>:<algorithm>:<limit>
//!                                                                    a set's limit
//! <prefix>:{v1:<escaped key>}:block:<what follows `}:` in the key above>
//!                                                                    the key's block
//! <prefix>:blocked:<what follows `}:` in a limit's key>               the limit's list of
//!                                                                    blocked keys
//! ```
//!
//! The escaped key is the key's bytes with `%` written `%25`, `{` written `%7B` and `}`
//! written `%7D`; every other byte is kept as it is.

use std::borrow::Cow;
use std::hash::Hasher as _;

use siphasher::sip::SipHasher13;

/// The version of the layout, inside the hash tag.
pub(crate) const VERSION: &str = "v1";

/// Whose keys a limiter's are: a limiter of its own name, or one limit of a
/// [set](crate::LimitSet).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owner<'a> {
    /// A limiter named so.
    Own(&'a str),
    /// The limit `limit` of the set `set`.
    Member { set: &'a str, limit: &'a str },
}

impl Owner<'_> {
    /// The policy name: the limiter's, or `<set>.<limit>` (the name in the headers and
    /// the metrics, not the Redis key).
    pub(crate) fn policy_name(&self) -> Cow<'_, str> {
        match *self {
            Self::Own(name) => Cow::Borrowed(name),
            Self::Member { set, limit } => Cow::Owned(format!("{set}.{limit}")),
        }
    }

    /// Checks the names (a set checks its own and its limits' names when it is built).
    pub(crate) fn validate(&self) -> Result<(), crate::ConfigError> {
        match *self {
            Self::Own(name) => crate::error::validate_name("name", name),
            Self::Member { set, limit } => crate::error::validate_name("name", set)
                .and_then(|()| crate::error::validate_name("limit", limit)),
        }
    }
}

/// The bytes around one limiter's escaped keys.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// `<prefix>:{v1:`
    head: Box<[u8]>,
    /// `}:<algorithm>:<name>` (or a set member's, or a block's: see the module docs)
    tail: Box<[u8]>,
}

impl Layout {
    /// The layout of the keys of `owner`'s limits of `algorithm` under `prefix`.
    ///
    /// `prefix` and the names are checked names (no `{` or `}`, see
    /// [`validate_name`](crate::error::validate_name)); `algorithm` is one of the crate's
    /// constants (`period`, `token`, `rolling`), without `:`.
    pub(crate) fn new(prefix: &str, algorithm: &str, owner: Owner<'_>) -> Self {
        debug_assert!(!prefix.contains(['{', '}']) && !algorithm.contains([':', '{', '}']));
        debug_assert!(!matches!(algorithm, "set" | "block"));
        let head = [prefix, ":{", VERSION, ":"].concat();
        let tail = match owner {
            Owner::Own(name) => ["}:", algorithm, ":", name].concat(),
            // The set's name is length-prefixed, so no set name and limit name can be
            // read as another pair, whatever `:` or `.` they hold.
            Owner::Member { set, limit } => {
                let len = set.len().to_string();
                ["}:set:", &len, ":", set, ":", algorithm, ":", limit].concat()
            }
        };
        Self {
            head: head.into_bytes().into(),
            tail: tail.into_bytes().into(),
        }
    }

    /// The layout of the blocks of this layout's keys: `block` in place of the
    /// algorithm (or `set`), then the rest of this layout's tail. `block` is neither an
    /// algorithm nor `set`, and what follows it is a whole limit tail, so no block key is
    /// another limit's key or another limit's block key, whatever the names hold.
    pub(crate) fn blocks(&self) -> Self {
        let rest = self
            .tail
            .strip_prefix(b"}:")
            .expect("every tail starts with `}:`");
        Self {
            head: self.head.clone(),
            tail: [b"}:block:".as_slice(), rest].concat().into(),
        }
    }

    /// The Redis key of the list of this layout's blocked keys (see
    /// [`listing`](super::listing)): `<prefix>:blocked:` then what follows `}:block:` in
    /// a block key of this layout (of a layout's own keys: what follows `}:`), e.g.
    /// `ratelimit:blocked:period:login`. Outside every hash tag (one list per limit, in
    /// its own slot on Redis Cluster), and never a limit's or a block's key (they hold
    /// `{`, it does not); what follows `blocked:` is a whole limit tail, so no two limits
    /// share a list, whatever their names hold.
    pub(crate) fn blocked_index(&self) -> Vec<u8> {
        let prefix = self
            .head
            .strip_suffix(b"{v1:")
            .expect("every head ends with `{v1:`");
        let rest = self
            .tail
            .strip_prefix(b"}:block:")
            .or_else(|| self.tail.strip_prefix(b"}:"))
            .expect("every tail starts with `}:`");
        [prefix, b"blocked:", rest].concat()
    }

    /// The id of this layout's keys in the in-process store, for the state `role`
    /// (`b"state"`, `b"lease"`, ...) and `shape` (what must match for two limiters to
    /// share the state: a rolling window's bucket count): two limiters of one name and
    /// algorithm on one backend share their in-process state as they share their Redis
    /// keys. (The prefix is the backend's: one store per backend.)
    pub(crate) fn local_id(&self, role: &[u8], shape: u64) -> u64 {
        // Fixed keys: the id only has to be the same for the same tail in this process;
        // the store hashes (id, key) again with its random keys.
        let mut h = SipHasher13::new_with_keys(0x7265_6469_735f_726c, 0x6c61_796f_7574_5f69);
        h.write_usize(role.len());
        h.write(role);
        h.write_u64(shape);
        h.write(&self.tail);
        h.finish()
    }

    /// The Redis key of `key`, in one allocation of its exact size.
    pub(crate) fn redis_key(&self, key: &[u8]) -> Vec<u8> {
        let specials = key.iter().filter(|&&b| is_special(b)).count();
        let mut out =
            Vec::with_capacity(self.head.len() + key.len() + 2 * specials + self.tail.len());
        self.write_redis_key(key, &mut out);
        out
    }

    /// Writes the Redis key of `key` to `out` (a `Vec`, or a script call's argument).
    pub(crate) fn write_redis_key(&self, key: &[u8], out: &mut dyn std::io::Write) {
        // Writing to memory cannot fail.
        let _ = out.write_all(&self.head);
        if key.iter().any(|&b| is_special(b)) {
            for &b in key {
                let _ = match b {
                    b'%' => out.write_all(b"%25"),
                    b'{' => out.write_all(b"%7B"),
                    b'}' => out.write_all(b"%7D"),
                    _ => out.write_all(&[b]),
                };
            }
        } else {
            let _ = out.write_all(key);
        }
        let _ = out.write_all(&self.tail);
    }

    /// The key a Redis key of this limiter was built from (`None` for a Redis key of
    /// another limiter, or not built by [`redis_key`](Self::redis_key)).
    pub(crate) fn key_of<'a>(&self, redis_key: &'a [u8]) -> Option<Cow<'a, [u8]>> {
        let escaped = redis_key
            .strip_prefix(&*self.head)?
            .strip_suffix(&*self.tail)?;
        if !escaped.iter().any(|&b| is_special(b)) {
            return Some(Cow::Borrowed(escaped));
        }
        let mut key = Vec::with_capacity(escaped.len());
        let mut rest = escaped;
        while let Some((&b, tail)) = rest.split_first() {
            match b {
                b'%' => {
                    let (byte, tail) = match tail {
                        [b'2', b'5', tail @ ..] => (b'%', tail),
                        [b'7', b'B', tail @ ..] => (b'{', tail),
                        [b'7', b'D', tail @ ..] => (b'}', tail),
                        _ => return None,
                    };
                    key.push(byte);
                    rest = tail;
                }
                b'{' | b'}' => return None,
                _ => {
                    key.push(b);
                    rest = tail;
                }
            }
        }
        Some(Cow::Owned(key))
    }
}

/// Whether `b` is written escaped.
fn is_special(b: u8) -> bool {
    matches!(b, b'%' | b'{' | b'}')
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// The bytes Redis Cluster hashes to find a key's slot: the hash tag when there is
    /// a non-empty one, otherwise the whole key.
    fn hashed(key: &[u8]) -> &[u8] {
        if let Some(open) = key.iter().position(|&b| b == b'{') {
            if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    fn own(name: &str) -> Owner<'_> {
        Owner::Own(name)
    }

    #[test]
    fn documented_format() {
        let layout = Layout::new("app", "period", own("sms:daily"));
        assert_eq!(
            layout.redis_key(b"hdr:x-api-key:k1"),
            b"app:{v1:hdr:x-api-key:k1}:period:sms:daily"
        );
        assert_eq!(
            layout.redis_key(b"a%b{c}\xff"),
            b"app:{v1:a%25b%7Bc%7D\xff}:period:sms:daily"
        );
        assert_eq!(layout.redis_key(b""), b"app:{v1:}:period:sms:daily");
        assert_eq!(
            layout.blocks().redis_key(b"k"),
            b"app:{v1:k}:block:period:sms:daily"
        );
        let member = Owner::Member {
            set: "reports",
            limit: "daily",
        };
        let layout = Layout::new("app", "token", member);
        assert_eq!(
            layout.redis_key(b"k"),
            b"app:{v1:k}:set:7:reports:token:daily"
        );
        assert_eq!(
            layout.blocks().redis_key(b"k"),
            b"app:{v1:k}:block:set:7:reports:token:daily"
        );
    }

    #[test]
    fn each_limit_lists_its_blocks_under_a_key_of_its_own() {
        let layout = Layout::new("app", "period", own("sms:daily"));
        assert_eq!(
            layout.blocks().blocked_index(),
            b"app:blocked:period:sms:daily"
        );
        assert_eq!(layout.blocked_index(), layout.blocks().blocked_index());
        let member = Owner::Member {
            set: "reports",
            limit: "daily",
        };
        assert_eq!(
            Layout::new("app", "token", member).blocks().blocked_index(),
            b"app:blocked:set:7:reports:token:daily"
        );
        // One list per limit, never a limit's or a block's key.
        let mut seen = HashMap::new();
        for (prefix, algorithm, owner, _, _) in tuples() {
            let layout = Layout::new(prefix, algorithm, owner).blocks();
            let index = layout.blocked_index();
            assert!(!index.contains(&b'{'), "{}", index.escape_ascii());
            let limit = format!("{prefix} {algorithm} {owner:?}");
            if let Some(other) = seen.insert(index.clone(), limit.clone()) {
                assert_eq!(other, limit, "share {}", index.escape_ascii());
            }
        }
    }

    /// The collisions of the layout before sets and blocks had their own places: a
    /// limiter named `n:block` wrote `n`'s block; set `x` with limit `y.z` and set `x.y`
    /// with limit `z` shared `x.y.z`.
    #[test]
    fn names_with_separators_never_reach_another_limits_key() {
        let n = Layout::new("p", "period", own("n"));
        let n_block = Layout::new("p", "period", own("n:block"));
        assert_ne!(n.blocks().redis_key(b"k"), n_block.redis_key(b"k"));
        let one = Layout::new(
            "p",
            "period",
            Owner::Member {
                set: "x",
                limit: "y.z",
            },
        );
        let two = Layout::new(
            "p",
            "period",
            Owner::Member {
                set: "x.y",
                limit: "z",
            },
        );
        assert_ne!(one.redis_key(b"k"), two.redis_key(b"k"));
        let three = Layout::new("p", "period", own("x.y.z"));
        assert_ne!(one.redis_key(b"k"), three.redis_key(b"k"));
        assert_ne!(one.local_id(b"state", 0), two.local_id(b"state", 0));
        assert_ne!(
            n.blocks().local_id(b"state", 0),
            n_block.local_id(b"state", 0)
        );
    }

    /// Pairs of tuples the old layout `<prefix>:<algorithm>:<name>:<key>` confused, and
    /// keys made of every byte that matters to the layout.
    fn tuples() -> Vec<(&'static str, &'static str, Owner<'static>, bool, Vec<u8>)> {
        let names = [
            "a",
            "a:b",
            "b",
            "a:period:b",
            "sms",
            "sms:daily",
            "%7B",
            "v1",
            "a.b",
            "b.c",
            "a:block",
            "block",
            "set",
            "set:1:a",
            "1:a:period",
        ];
        let prefixes = ["a", "a:period:b", "ratelimit", "a:{v1:"];
        let algorithms = ["period", "token", "rolling"];
        let atoms: [&[u8]; 9] = [
            b"",
            b":",
            b"{",
            b"}",
            b"%",
            b"%7D",
            b"\xff",
            b"daily",
            b"}:period:a",
        ];
        let mut keys = std::collections::BTreeSet::new();
        for x in atoms {
            for y in atoms {
                keys.insert([x, y].concat());
            }
        }
        let mut owners = Vec::new();
        for name in names {
            owners.push(Owner::Own(name));
            for limit in names {
                owners.push(Owner::Member { set: name, limit });
            }
        }
        let mut out = Vec::new();
        for prefix in prefixes {
            if prefix.contains(['{', '}']) {
                continue; // rejected by `validate_name`
            }
            for algorithm in algorithms {
                for &owner in &owners {
                    for block in [false, true] {
                        for key in &keys {
                            out.push((prefix, algorithm, owner, block, key.clone()));
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn no_two_tuples_share_a_redis_key_and_every_key_reads_back() {
        let mut seen = HashMap::new();
        for (prefix, algorithm, owner, block, key) in tuples() {
            let mut layout = Layout::new(prefix, algorithm, owner);
            if block {
                layout = layout.blocks();
            }
            let redis_key = layout.redis_key(&key);
            assert_eq!(
                layout.key_of(&redis_key).as_deref(),
                Some(&key[..]),
                "{}",
                redis_key.escape_ascii()
            );
            let tuple = format!("{prefix} {algorithm} {owner:?} block={block} {key:?}");
            if let Some(other) = seen.insert(redis_key.clone(), tuple.clone()) {
                panic!("{tuple} and {other} share {}", redis_key.escape_ascii());
            }
        }
    }

    #[test]
    fn the_hash_tag_is_the_escaped_key_and_never_empty() {
        let period = Layout::new("app", "period", own("a"));
        let token = Layout::new("other", "token", own("b:c"));
        let keys: [&[u8]; 7] = [b"", b"{", b"}", b"{}", b"}{", b"{user-1}", b"ip:10.0.0.1"];
        for key in keys {
            let one = period.redis_key(key);
            let two = token.redis_key(key);
            // One slot per key, whatever the limiter: what #14 needs.
            assert_eq!(hashed(&one), hashed(&two), "{}", one.escape_ascii());
            assert!(hashed(&one).starts_with(b"v1:"), "{}", one.escape_ascii());
        }
        assert_ne!(
            hashed(&period.redis_key(b"{")),
            hashed(&period.redis_key(b"}"))
        );
    }

    #[test]
    fn foreign_keys_do_not_read_back() {
        let layout = Layout::new("app", "period", own("a"));
        assert_eq!(layout.key_of(b"app:{v1:k}:period:b"), None);
        assert_eq!(layout.key_of(b"app:{v1:%7}:period:a"), None);
        assert_eq!(layout.key_of(b"app:{v1:%zz}:period:a"), None);
        assert_eq!(layout.key_of(b"app:{v1:}x}:period:a"), None);
        assert_eq!(layout.key_of(b"app:period:a:k"), None);
    }
}
