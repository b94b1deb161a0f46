//! The Redis key layout, built here and nowhere else (see the [module docs](super#redis-keys)):
//!
//! ```text
//! <prefix>:{v1:<escaped key>}:<algorithm>:<name>
//! ```
//!
//! The escaped key is the key's bytes with `%` written `%25`, `{` written `%7B` and `}`
//! written `%7D`; every other byte is kept as it is.

use std::borrow::Cow;

/// The version of the layout, inside the hash tag.
pub(crate) const VERSION: &str = "v1";

/// The bytes around one limiter's escaped keys.
#[derive(Debug)]
pub(crate) struct Layout {
    /// `<prefix>:{v1:`
    head: Box<[u8]>,
    /// `}:<algorithm>:<name>`
    tail: Box<[u8]>,
}

impl Layout {
    /// The layout of the keys of limiter `name` of `algorithm` under `prefix`.
    ///
    /// `prefix` and `name` are checked names (no `{` or `}`, see
    /// [`validate_name`](crate::error::validate_name)); `algorithm` is one of the crate's
    /// constants (`period`, `token`, `rolling`), without `:`.
    pub(crate) fn new(prefix: &str, algorithm: &str, name: &str) -> Self {
        debug_assert!(!prefix.contains(['{', '}']) && !algorithm.contains([':', '{', '}']));
        let head = [prefix, ":{", VERSION, ":"].concat();
        let tail = ["}:", algorithm, ":", name].concat();
        Self {
            head: head.into_bytes().into(),
            tail: tail.into_bytes().into(),
        }
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

    #[test]
    fn documented_format() {
        let layout = Layout::new("app", "period", "sms:daily");
        assert_eq!(
            layout.redis_key(b"hdr:x-api-key:k1"),
            b"app:{v1:hdr:x-api-key:k1}:period:sms:daily"
        );
        assert_eq!(
            layout.redis_key(b"a%b{c}\xff"),
            b"app:{v1:a%25b%7Bc%7D\xff}:period:sms:daily"
        );
        assert_eq!(layout.redis_key(b""), b"app:{v1:}:period:sms:daily");
    }

    /// Pairs of tuples the old layout `<prefix>:<algorithm>:<name>:<key>` confused, and
    /// keys made of every byte that matters to the layout.
    fn tuples() -> Vec<(&'static str, &'static str, &'static str, Vec<u8>)> {
        let names = [
            "a",
            "a:b",
            "b",
            "a:period:b",
            "sms",
            "sms:daily",
            "%7B",
            "v1",
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
        let mut out = Vec::new();
        for prefix in prefixes {
            if prefix.contains(['{', '}']) {
                continue; // rejected by `validate_name`
            }
            for algorithm in algorithms {
                for name in names {
                    for key in &keys {
                        out.push((prefix, algorithm, name, key.clone()));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn no_two_tuples_share_a_redis_key_and_every_key_reads_back() {
        let mut seen = HashMap::new();
        for (prefix, algorithm, name, key) in tuples() {
            let layout = Layout::new(prefix, algorithm, name);
            let redis_key = layout.redis_key(&key);
            assert_eq!(
                layout.key_of(&redis_key).as_deref(),
                Some(&key[..]),
                "{}",
                redis_key.escape_ascii()
            );
            let tuple = (prefix, algorithm, name, key);
            if let Some(other) = seen.insert(redis_key.clone(), tuple.clone()) {
                panic!("{tuple:?} and {other:?} share {}", redis_key.escape_ascii());
            }
        }
    }

    #[test]
    fn the_hash_tag_is_the_escaped_key_and_never_empty() {
        let period = Layout::new("app", "period", "a");
        let token = Layout::new("other", "token", "b:c");
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
        let layout = Layout::new("app", "period", "a");
        assert_eq!(layout.key_of(b"app:{v1:k}:period:b"), None);
        assert_eq!(layout.key_of(b"app:{v1:%7}:period:a"), None);
        assert_eq!(layout.key_of(b"app:{v1:%zz}:period:a"), None);
        assert_eq!(layout.key_of(b"app:{v1:}x}:period:a"), None);
        assert_eq!(layout.key_of(b"app:period:a:k"), None);
    }
}
