//! The keyed hash of [`Hashed`](super::Hashed) keys: BLAKE3 keyed by a key derived from
//! the secret, 128 bits of it in hex after the tag `h:`.

use super::raw::Key;

/// The tag of a hashed key.
const TAG: &[u8] = b"h:";
/// The bytes of the hash kept: 128 bits, written as 32 hex digits.
const HASH_BYTES: usize = 16;
/// The length of every hashed key.
pub(super) const HASHED_LEN: usize = TAG.len() + 2 * HASH_BYTES;
/// BLAKE3's context for deriving the hashing key from the secret (fixed for the crate:
/// another context would derive another key, and every hashed key would change).
const CONTEXT: &str = "tower-redis-ratelimit 2026-12 hashed keys";

/// BLAKE3's key, derived from `secret`.
pub(super) fn derive(secret: &[u8]) -> [u8; 32] {
    blake3::derive_key(CONTEXT, secret)
}

/// `bytes` hashed with `key`: `h:` and 32 hex digits.
pub(super) fn hash(key: &[u8; 32], bytes: &[u8]) -> Key<'static> {
    let hash = blake3::keyed_hash(key, bytes);
    let mut hex = [0u8; 2 * HASH_BYTES];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(&hash.as_bytes()[..HASH_BYTES]) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
    Key::concat(&[TAG, &hex])
}
