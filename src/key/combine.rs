//! Combining extractors: [`Or`] (the first key found) and [`And`] (both keys, joined
//! unambiguously, whatever their bytes), made by [`KeyExtractor::or`] and [`KeyExtractor::and`].

use super::*;

/// The first key of two extractors: `A`'s, or `B`'s when `A` has none.
///
/// Created by [`KeyExtractor::or`].
#[derive(Clone, Copy, Debug)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A, B> Or<A, B> {
    /// Combines `first` and `second`; see [`KeyExtractor::or`].
    pub const fn new(first: A, second: B) -> Self {
        Self { first, second }
    }
}

impl<A, B> KeyExtractor for Or<A, B>
where
    A: KeyExtractor,
    B: KeyExtractor,
{
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        self.first
            .extract(parts)
            .or_else(|| self.second.extract(parts))
    }

    /// The keys of every branch that can count `value`, left to right, each once: a
    /// request carrying `value` where the first branch reads it is counted under the
    /// first branch's key, one carrying it only where the second reads it under the
    /// second's. An error ([`KeyForError::NoBranch`]) only when no branch can.
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        super::value::any_branch([self.first.keys_for(value), self.second.keys_for(value)])
    }

    /// No key from either branch: the server's doing if either branch reads what the
    /// server provides.
    fn origin(&self) -> KeyOrigin {
        self.first.origin().either(self.second.origin())
    }

    /// The shorter of the two branches' shortest keys, when both know theirs.
    fn shortest_key(&self) -> Option<usize> {
        Some(self.first.shortest_key()?.min(self.second.shortest_key()?))
    }
}

/// Both keys of two extractors, joined unambiguously.
///
/// Created by [`KeyExtractor::and`]; see there for the key format.
#[derive(Clone, Copy, Debug)]
pub struct And<A, B> {
    first: A,
    second: B,
}

impl<A, B> And<A, B> {
    /// Combines `first` and `second`; see [`KeyExtractor::and`].
    pub const fn new(first: A, second: B) -> Self {
        Self { first, second }
    }
}

impl<A, B> KeyExtractor for And<A, B>
where
    A: KeyExtractor,
    B: KeyExtractor,
{
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let first = self.first.extract(parts)?;
        let second = self.second.extract(parts)?;
        Some(join(&first, &second))
    }

    /// Always [`KeyForError::Pair`]: the key is made of two values, which one value
    /// cannot name; act on the key a request carrying both makes
    /// ([`extract`](KeyExtractor::extract)).
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        let _ = value;
        Err(KeyForError::Pair)
    }

    fn origin(&self) -> KeyOrigin {
        self.first.origin().either(self.second.origin())
    }
}

/// `and:<len(first)>:<first>:<second>`: unambiguous for any bytes, since the length
/// says where `first` ends.
pub(crate) fn join(first: &[u8], second: &[u8]) -> Key<'static> {
    let mut len = itoa::Buffer::new();
    let len = len.format(first.len()).as_bytes();
    Key::concat(&[b"and:", len, b":", first, b":", second])
}
