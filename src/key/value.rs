//! From a client's value to the key a layer counts it under: [`KeyForError`], and the
//! helpers the extractors' [`keys_for`](super::KeyExtractor::keys_for) share.

use std::fmt;

use super::Key;

/// Why [`KeyExtractor::keys_for`](super::KeyExtractor::keys_for) names no key for a
/// value: the extractor could never count it, or cannot say.
///
/// Its message never shows the value (it may be an API key).
///
/// ```
/// use tower_redis_ratelimit::key::{KeyExtractor, KeyForError, PeerIp};
///
/// let err = PeerIp::new().keys_for(b"localhost").unwrap_err();
/// assert!(matches!(err, KeyForError::Unreachable { extractor: "PeerIp", .. }));
/// assert_eq!(err.to_string(), "`PeerIp` never counts this value: it is not an IP address");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyForError {
    /// The extractor does not say which key a value has: a
    /// [`KeyExtractor`](super::KeyExtractor) of your own that keeps the default
    /// [`keys_for`](super::KeyExtractor::keys_for).
    #[non_exhaustive]
    Unsupported {
        /// The extractor's type.
        extractor: &'static str,
    },
    /// The extractor could never find this value in a request: not an IP address for
    /// [`PeerIp`](super::PeerIp), bytes no header can hold for
    /// [`HeaderKey`](super::HeaderKey), an empty value (which counts as no key).
    #[non_exhaustive]
    Unreachable {
        /// The extractor.
        extractor: &'static str,
        /// Why it never counts the value.
        reason: &'static str,
    },
    /// [`GlobalKey`](super::GlobalKey) counts every request under the one key `global`:
    /// no client's value names it (act on the key `global` itself to act on everybody).
    Shared,
    /// An [`and`](super::KeyExtractor::and) counts a pair of values under one key:
    /// one value cannot name it (act on the key the pair makes, as
    /// [`extract`](super::KeyExtractor::extract) builds it).
    Pair,
    /// No branch of an [`or`](super::KeyExtractor::or) counts the value: why, for
    /// each branch, left to right.
    NoBranch(Vec<KeyForError>),
    /// Every key of the value is longer than the layer's
    /// [`max_key_len`](crate::LayerBuilder::max_key_len): the layer treats such a
    /// request as having no key, so it never counts the value.
    #[non_exhaustive]
    TooLong {
        /// The layer's longest key, in bytes.
        max_key_len: usize,
    },
}

impl KeyForError {
    /// The extractor `extractor` never counts the value, for `reason`: what a
    /// [`KeyExtractor`](super::KeyExtractor) of your own answers for a value no request
    /// carries.
    ///
    /// ```
    /// use tower_redis_ratelimit::key::KeyForError;
    ///
    /// let err = KeyForError::unreachable("TenantKey", "a tenant id is a number");
    /// assert_eq!(err.to_string(), "`TenantKey` never counts this value: a tenant id is a number");
    /// ```
    #[must_use]
    pub const fn unreachable(extractor: &'static str, reason: &'static str) -> Self {
        Self::Unreachable { extractor, reason }
    }

    /// The extractor `extractor` cannot say which key a value has: what the default
    /// [`keys_for`](super::KeyExtractor::keys_for) answers, with the extractor's type.
    ///
    /// ```
    /// use tower_redis_ratelimit::key::KeyForError;
    ///
    /// let err = KeyForError::unsupported("TenantKey");
    /// assert!(matches!(err, KeyForError::Unsupported { extractor: "TenantKey", .. }));
    /// ```
    #[must_use]
    pub const fn unsupported(extractor: &'static str) -> Self {
        Self::Unsupported { extractor }
    }
}

impl fmt::Display for KeyForError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported { extractor } => write!(
                f,
                "the key extractor `{extractor}` cannot say which key a value is counted \
                 under: implement `KeyExtractor::keys_for`, or act on the key itself"
            ),
            Self::Unreachable { extractor, reason } => {
                write!(f, "`{extractor}` never counts this value: {reason}")
            }
            Self::Shared => f.write_str(
                "`GlobalKey` counts every request under the one key `global`: no client's \
                 value names it (act on the key `global` to act on everybody)",
            ),
            Self::Pair => f.write_str(
                "an `and` extractor counts a pair of values under one key: one value cannot \
                 name it (act on the key the pair makes)",
            ),
            Self::NoBranch(errors) => {
                f.write_str("no branch of the `or` extractor counts this value")?;
                for (i, error) in errors.iter().enumerate() {
                    f.write_str(if i == 0 { ": " } else { "; " })?;
                    write!(f, "{error}")?;
                }
                Ok(())
            }
            Self::TooLong { max_key_len } => write!(
                f,
                "its key is longer than the layer's `max_key_len` ({max_key_len} bytes), so \
                 the layer counts such a request as having no key"
            ),
        }
    }
}

impl std::error::Error for KeyForError {}

/// The keys of an `or`: every key its branches name, left to right, each once; the
/// branches' errors when none names one (nested `or`s flattened).
pub(crate) fn any_branch(
    branches: impl IntoIterator<Item = Result<Vec<Key<'static>>, KeyForError>>,
) -> Result<Vec<Key<'static>>, KeyForError> {
    let mut keys: Vec<Key<'static>> = Vec::new();
    let mut errors = Vec::new();
    for branch in branches {
        match branch {
            Ok(found) => {
                for key in found {
                    if !keys.contains(&key) {
                        keys.push(key);
                    }
                }
            }
            Err(KeyForError::NoBranch(inner)) => errors.extend(inner),
            Err(error) => errors.push(error),
        }
    }
    if keys.is_empty() {
        Err(KeyForError::NoBranch(errors))
    } else {
        Ok(keys)
    }
}

/// The keys a layer with `max_key_len` counts: the others are missing keys to it;
/// [`KeyForError::TooLong`] when none is left.
pub(crate) fn fitting(
    mut keys: Vec<Key<'static>>,
    max_key_len: usize,
) -> Result<Vec<Key<'static>>, KeyForError> {
    keys.retain(|key| key.len() <= max_key_len);
    if keys.is_empty() {
        return Err(KeyForError::TooLong { max_key_len });
    }
    Ok(keys)
}

/// The value as text, for extractors whose values are text.
pub(crate) fn text<'v>(
    value: &'v [u8],
    extractor: &'static str,
    reason: &'static str,
) -> Result<&'v str, KeyForError> {
    std::str::from_utf8(value).map_err(|_| KeyForError::unreachable(extractor, reason))
}

/// Refuses an empty value: every built-in extractor (but closures) counts it as no key.
pub(crate) fn non_empty(value: &[u8], extractor: &'static str) -> Result<(), KeyForError> {
    if value.is_empty() {
        return Err(KeyForError::Unreachable {
            extractor,
            reason: "an empty value counts as no key",
        });
    }
    Ok(())
}
