//! [`Key`]: the bytes of one rate-limit key, kept on the stack when short.

use std::borrow::Cow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use smallvec::SmallVec;

/// Keys up to this many bytes are built without a heap allocation.
const INLINE: usize = 64;

/// The key of a request: arbitrary bytes (headers are bytes; nothing is converted), as
/// a [`KeyExtractor`](super::KeyExtractor) returns it.
///
/// A key either borrows from the request or owns its bytes; owned keys of up to 64 bytes
/// (an IP address with its tag, a typical API key or path with its tag) live inline,
/// without a heap allocation. A key dereferences to `[u8]`.
///
/// The built-in extractors start their keys with a tag naming the extractor (see the
/// [table in the module docs](super#tags)), so that combined extractors never produce the
/// same key for different things.
///
/// `Debug` shows the key's tag (up to its first `:`) and its length, never the rest:
/// keys can be secrets such as API keys.
///
/// ```
/// use tower_redis_ratelimit::key::Key;
///
/// let borrowed = Key::from("tenant:acme");
/// assert_eq!(borrowed, "tenant:acme");
/// let owned = Key::from(vec![0xff, 0x00]);
/// assert_eq!(&owned[..], b"\xff\x00");
/// assert_eq!(format!("{borrowed:?}"), "Key(\"tenant:…\", 11 bytes)");
/// ```
#[derive(Clone)]
pub struct Key<'r> {
    repr: Repr<'r>,
}

#[derive(Clone)]
enum Repr<'r> {
    Borrowed(&'r [u8]),
    Owned(SmallVec<[u8; INLINE]>),
}

impl<'r> Key<'r> {
    /// A key borrowed from the request (or from static data): no copy.
    #[must_use]
    pub const fn borrowed(bytes: &'r [u8]) -> Self {
        Self {
            repr: Repr::Borrowed(bytes),
        }
    }

    /// An owned key that is the concatenation of `parts`, e.g. a tag and a value.
    ///
    /// ```
    /// use tower_redis_ratelimit::key::Key;
    ///
    /// let key = Key::concat(&[b"tenant:", b"acme"]);
    /// assert_eq!(key, "tenant:acme");
    /// ```
    #[must_use]
    pub fn concat(parts: &[&[u8]]) -> Key<'static> {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        let bytes = if len <= INLINE {
            // Straight into the inline buffer: plain copies, no capacity checks per part.
            let mut buf = [0; INLINE];
            let mut at = 0;
            for part in parts {
                buf[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            SmallVec::from_buf_and_len(buf, len)
        } else {
            SmallVec::from_vec(parts.concat())
        };
        Key {
            repr: Repr::Owned(bytes),
        }
    }

    /// The key's bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        match &self.repr {
            Repr::Borrowed(bytes) => bytes,
            Repr::Owned(bytes) => bytes,
        }
    }

    /// Whether the key borrows its bytes (from the request or static data).
    #[doc(hidden)]
    #[must_use]
    pub fn is_borrowed(&self) -> bool {
        matches!(self.repr, Repr::Borrowed(_))
    }

    /// Whether building the key allocated on the heap: `false` for borrowed keys and
    /// short owned ones.
    #[doc(hidden)]
    #[must_use]
    pub fn is_on_heap(&self) -> bool {
        matches!(&self.repr, Repr::Owned(bytes) if bytes.spilled())
    }

    /// The key, owning its bytes.
    #[must_use]
    pub fn into_owned(self) -> Key<'static> {
        match self.repr {
            Repr::Borrowed(bytes) => Key {
                repr: Repr::Owned(SmallVec::from_slice(bytes)),
            },
            Repr::Owned(bytes) => Key {
                repr: Repr::Owned(bytes),
            },
        }
    }

    /// An empty owned key with room for `capacity` bytes, to be written with
    /// [`Writer`].
    pub(crate) fn with_capacity(capacity: usize) -> Key<'static> {
        Key {
            repr: Repr::Owned(SmallVec::with_capacity(capacity)),
        }
    }

    /// Appends `bytes` (a borrowed key becomes owned first).
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        match &mut self.repr {
            Repr::Owned(owned) => owned.extend_from_slice(bytes),
            Repr::Borrowed(borrowed) => {
                let mut owned = SmallVec::with_capacity(borrowed.len() + bytes.len());
                owned.extend_from_slice(borrowed);
                owned.extend_from_slice(bytes);
                self.repr = Repr::Owned(owned);
            }
        }
    }
}

/// Writes formatted text (an address, a `Display` value) straight into a key.
pub(crate) struct Writer<'a, 'r>(pub(crate) &'a mut Key<'r>);

impl fmt::Write for Writer<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.push(s.as_bytes());
        Ok(())
    }
}

impl Deref for Key<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for Key<'_> {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.as_bytes();
        let tag = match bytes.iter().position(|&b| b == b':') {
            Some(colon) => &bytes[..=colon],
            None => &[],
        };
        write!(f, "Key(\"{}…\", {} bytes)", tag.escape_ascii(), bytes.len())
    }
}

impl PartialEq for Key<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key<'_> {}

impl Hash for Key<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq<[u8]> for Key<'_> {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_bytes() == other
    }
}

impl PartialEq<&[u8]> for Key<'_> {
    fn eq(&self, other: &&[u8]) -> bool {
        self.as_bytes() == *other
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for Key<'_> {
    fn eq(&self, other: &&[u8; N]) -> bool {
        self.as_bytes() == other.as_slice()
    }
}

impl PartialEq<str> for Key<'_> {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for Key<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl<'r> From<&'r [u8]> for Key<'r> {
    fn from(bytes: &'r [u8]) -> Self {
        Self::borrowed(bytes)
    }
}

impl<'r, const N: usize> From<&'r [u8; N]> for Key<'r> {
    fn from(bytes: &'r [u8; N]) -> Self {
        Self::borrowed(bytes)
    }
}

impl<'r> From<&'r str> for Key<'r> {
    fn from(s: &'r str) -> Self {
        Self::borrowed(s.as_bytes())
    }
}

impl From<Vec<u8>> for Key<'_> {
    fn from(bytes: Vec<u8>) -> Self {
        Self {
            repr: Repr::Owned(SmallVec::from_vec(bytes)),
        }
    }
}

impl From<String> for Key<'_> {
    fn from(s: String) -> Self {
        Self::from(s.into_bytes())
    }
}

impl From<bytes::Bytes> for Key<'_> {
    fn from(bytes: bytes::Bytes) -> Self {
        Self {
            repr: Repr::Owned(SmallVec::from_slice(&bytes)),
        }
    }
}

impl<'r> From<Cow<'r, [u8]>> for Key<'r> {
    fn from(bytes: Cow<'r, [u8]>) -> Self {
        match bytes {
            Cow::Borrowed(bytes) => Self::borrowed(bytes),
            Cow::Owned(bytes) => Self::from(bytes),
        }
    }
}

impl<'r> From<Cow<'r, str>> for Key<'r> {
    fn from(s: Cow<'r, str>) -> Self {
        match s {
            Cow::Borrowed(s) => Self::from(s),
            Cow::Owned(s) => Self::from(s),
        }
    }
}

impl From<Key<'_>> for Vec<u8> {
    fn from(key: Key<'_>) -> Self {
        match key.repr {
            Repr::Borrowed(bytes) => bytes.to_vec(),
            Repr::Owned(bytes) => bytes.into_vec(),
        }
    }
}
