//! Combining extractors: [`Or`] (the first key found) and [`And`] (both keys, joined
//! unambiguously, whatever their bytes), made by [`KeyExtractorExt`]'s `or` / `and` on
//! every extractor and by the same inherent methods of the built-in ones
//! (`combinators!`).

use super::*;

/// Combinators for every [`KeyExtractor`].
///
/// The built-in extractors (and [`Or`] / [`And`]) also have inherent `or` /
/// `and` methods with the same behavior, which work without naming the body
/// type (these extractors implement [`KeyExtractor<B>`] for every `B`, so
/// the trait methods could not infer it).
pub trait KeyExtractorExt<B>: KeyExtractor<B> + Sized {
    /// Uses the key of `self`, or if it has none the key of `other`,
    /// unchanged.
    ///
    /// The two branches never share a key: each built-in extractor tags its
    /// keys (see the [table](super#tags)), so a header value that spells an IP
    /// address is still not that address's key.
    fn or<O: KeyExtractor<B>>(self, other: O) -> Or<Self, O> {
        Or::new(self, other)
    }

    /// Combines the keys of `self` and `other` into one (`None` when either
    /// has none).
    ///
    /// The key is `and:`, the length of `self`'s key in decimal, `:`,
    /// `self`'s key, `:` and `other`'s key: the length says where the first
    /// key ends, so different pairs of byte strings never produce the same
    /// key (`("a:b", "c")` becomes `and:3:a:b:c`, `("a", "b:c")` becomes
    /// `and:1:a:b:c`).
    fn and<O: KeyExtractor<B>>(self, other: O) -> And<Self, O> {
        And::new(self, other)
    }
}

impl<B, K: KeyExtractor<B>> KeyExtractorExt<B> for K {}

/// Adds inherent `or` / `and` methods to extractors that work for any body
/// type, so they can be combined without naming `B`.
macro_rules! combinators {
    ($ty:ident $(<$($param:ident),+>)?) => {
        impl $(<$($param),+>)? $ty $(<$($param),+>)? {
            /// Uses the key of `self`, or if it has none the key of `other`.
            ///
            /// See [`KeyExtractorExt::or`].
            pub fn or<O>(self, other: O) -> Or<Self, O> {
                Or::new(self, other)
            }

            /// Combines the keys of `self` and `other` unambiguously (`None`
            /// when either has none).
            ///
            /// See [`KeyExtractorExt::and`].
            pub fn and<O>(self, other: O) -> And<Self, O> {
                And::new(self, other)
            }
        }
    };
}
pub(super) use combinators;

/// The first key of two extractors: `A`'s, or `B`'s when `A` has none.
///
/// Created by [`KeyExtractorExt::or`].
#[derive(Clone, Copy, Debug)]
pub struct Or<A, B> {
    first: A,
    second: B,
}

impl<A, B> Or<A, B> {
    /// Combines `first` and `second`; see [`KeyExtractorExt::or`].
    pub const fn new(first: A, second: B) -> Self {
        Self { first, second }
    }
}

combinators!(Or<A, B>);

impl<Body, A, B> KeyExtractor<Body> for Or<A, B>
where
    A: KeyExtractor<Body>,
    B: KeyExtractor<Body>,
{
    fn extract<'r>(&self, req: &'r http::Request<Body>) -> Option<Key<'r>> {
        self.first.extract(req).or_else(|| self.second.extract(req))
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
}

/// Both keys of two extractors, joined unambiguously.
///
/// Created by [`KeyExtractorExt::and`]; see there for the key format.
#[derive(Clone, Copy, Debug)]
pub struct And<A, B> {
    first: A,
    second: B,
}

impl<A, B> And<A, B> {
    /// Combines `first` and `second`; see [`KeyExtractorExt::and`].
    pub const fn new(first: A, second: B) -> Self {
        Self { first, second }
    }
}

combinators!(And<A, B>);

impl<Body, A, B> KeyExtractor<Body> for And<A, B>
where
    A: KeyExtractor<Body>,
    B: KeyExtractor<Body>,
{
    fn extract<'r>(&self, req: &'r http::Request<Body>) -> Option<Key<'r>> {
        let first = self.first.extract(req)?;
        let second = self.second.extract(req)?;
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
