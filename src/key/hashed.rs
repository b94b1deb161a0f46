//! [`Hashed`]: another extractor's keys replaced by a keyed hash of them, so that the
//! store (Redis, its dumps, its `SCAN`) never holds a client's value.

use std::fmt;

use http::request::Parts;

use super::{Key, KeyExtractor, KeyForError, KeyOrigin};

/// The tag of a hashed key.
const TAG: &[u8] = b"h:";
/// The bytes of the hash kept: 128 bits, written as 32 hex digits.
const HASH_BYTES: usize = 16;
/// BLAKE3's context for deriving the hashing key from the secret (fixed for the crate:
/// another context would derive another key, and every hashed key would change).
const CONTEXT: &str = "tower-redis-ratelimit 2026-12 hashed keys";

/// `E`'s keys, each replaced by `h:` and a keyed hash of it: keyed BLAKE3 (the key
/// derived from your secret with BLAKE3's `derive_key`), its first 128 bits in 32
/// lowercase hex digits (`h:5f0c…`, 34 bytes whatever the value's length).
///
/// Created by [`KeyExtractor::hashed`].
///
/// What it protects: Redis holds no client value (an API key from `Authorization`, an
/// address), so neither `SCAN`, `MONITOR`, a dump nor a replica of it reveals one, and
/// without the secret a key cannot be tested against a guess (an address has few
/// possible values: an unkeyed hash would be reversed by trying them all). What it does
/// not: this process sees the values (it hashes them), the secret must stay secret (with
/// it, a guess can be tested), and two requests of the same value still share one key
/// (that is the point of a limit). Changing the secret changes every key, so every
/// count starts afresh.
///
/// Admin by value works as before: [`keys_for`](KeyExtractor::keys_for) hashes the
/// given value the same way, so [`LimitLayer::reset_value`](crate::LimitLayer::reset_value)
/// and its siblings find the key; a listing of blocked keys
/// ([`LimitLayer::blocked`](crate::LimitLayer::blocked)) says the value is unknown
/// (`None`), since only its hash is kept. `Debug` shows the inner extractor, never the
/// secret.
///
/// ```
/// use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::from_static("authorization").hashed(b"a secret of 32 random bytes, not this");
/// let (mut head, ()) = http::Request::new(()).into_parts();
/// head.headers.insert("authorization", "Bearer live-credential".parse().unwrap());
/// let hashed = key.extract(&head).unwrap();
/// assert_eq!(hashed.len(), 34);
/// assert!(hashed.starts_with(b"h:"));
/// assert!(!hashed.windows(4).any(|w| w == b"live"));
/// // By value: the same key.
/// assert_eq!(key.keys_for(b"Bearer live-credential").unwrap(), [hashed.into_owned()]);
/// ```
#[derive(Clone)]
pub struct Hashed<E> {
    inner: E,
    /// BLAKE3's key, derived from the secret.
    key: [u8; 32],
}

impl<E> Hashed<E> {
    /// `inner`'s keys hashed with a key derived from `secret` (keep it as a secret; 32
    /// random bytes, from your secret store); see [`KeyExtractor::hashed`].
    pub fn new(inner: E, secret: impl AsRef<[u8]>) -> Self {
        Self {
            inner,
            key: blake3::derive_key(CONTEXT, secret.as_ref()),
        }
    }

    /// `key` hashed: `h:` and 32 hex digits.
    fn hash(&self, key: &[u8]) -> Key<'static> {
        let hash = blake3::keyed_hash(&self.key, key);
        let mut hex = [0u8; 2 * HASH_BYTES];
        for (pair, byte) in hex.chunks_exact_mut(2).zip(&hash.as_bytes()[..HASH_BYTES]) {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        Key::concat(&[TAG, &hex])
    }
}

impl<E: fmt::Debug> fmt::Debug for Hashed<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hashed")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<E: KeyExtractor> KeyExtractor for Hashed<E> {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let key = self.inner.extract(parts)?;
        Some(self.hash(&key))
    }

    /// The inner extractor's keys for `value`, hashed.
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        let keys = self.inner.keys_for(value)?;
        Ok(keys.iter().map(|key| self.hash(key)).collect())
    }

    fn origin(&self) -> KeyOrigin {
        self.inner.origin()
    }

    /// Every hashed key is 34 bytes.
    fn shortest_key(&self) -> Option<usize> {
        Some(TAG.len() + 2 * HASH_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{HeaderKey, PeerIp};

    fn head(api_key: &str) -> Parts {
        let (mut head, ()) = http::Request::new(()).into_parts();
        head.headers.insert("x-api-key", api_key.parse().unwrap());
        head
    }

    #[test]
    fn the_key_is_the_tag_and_32_hex_digits_of_nothing_the_client_sent() {
        let key = HeaderKey::from_static("x-api-key").hashed("s3cret");
        let hashed = key.extract(&head("k_live_1234")).unwrap().into_owned();
        let text = std::str::from_utf8(&hashed).unwrap();
        assert_eq!(text.len(), 34);
        assert!(text.starts_with("h:"));
        assert!(text[2..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(!text.contains("k_live") && !text.contains("x-api-key"));
        // One value, one key; another value, another key.
        assert_eq!(key.extract(&head("k_live_1234")).unwrap(), hashed);
        assert_ne!(key.extract(&head("k_live_1235")).unwrap(), hashed);
    }

    #[test]
    fn another_secret_makes_other_keys() {
        let a = HeaderKey::from_static("x-api-key").hashed("one");
        let b = HeaderKey::from_static("x-api-key").hashed("two");
        assert_ne!(
            a.extract(&head("k")).unwrap(),
            b.extract(&head("k")).unwrap()
        );
    }

    #[test]
    fn the_tagged_key_is_hashed_so_extractors_stay_apart() {
        // `x-api-key: 127.0.0.1` and the client at 127.0.0.1: two keys, hashed too.
        let key = HeaderKey::from_static("x-api-key")
            .or(PeerIp::new())
            .hashed("s");
        let by_header = key.keys_for(b"127.0.0.1").unwrap();
        assert_eq!(by_header.len(), 2);
        assert_ne!(by_header[0], by_header[1]);
    }

    #[test]
    fn by_value_is_the_key_a_request_makes_and_a_wrong_value_an_error() {
        let key = PeerIp::new().hashed("s");
        let (mut head, ()) = http::Request::new(()).into_parts();
        head.extensions
            .insert("203.0.113.7:443".parse::<std::net::SocketAddr>().unwrap());
        assert_eq!(
            key.keys_for(b"203.0.113.7").unwrap(),
            [key.extract(&head).unwrap().into_owned()]
        );
        assert!(key.keys_for(b"not an address").is_err());
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let key = HeaderKey::from_static("x-api-key").hashed("hunter2");
        let shown = format!("{key:?}");
        assert!(shown.starts_with("Hashed { inner: "), "{shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("key:"),
            "{shown}"
        );
    }
}
