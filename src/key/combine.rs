//! Combining extractors: [`Or`] (the first key found) and [`And`] (both keys, joined
//! unambiguously, whatever their bytes).

use super::*;

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
}

/// `and:<len(first)>:<first>:<second>`: unambiguous for any bytes, since the length
/// says where `first` ends.
pub(crate) fn join(first: &[u8], second: &[u8]) -> Key<'static> {
    let mut len = itoa::Buffer::new();
    let len = len.format(first.len()).as_bytes();
    Key::concat(&[b"and:", len, b":", first, b":", second])
}
