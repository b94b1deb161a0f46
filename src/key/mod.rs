//! Rate-limit keys: which bucket a request is counted against.
//!
//! A [`KeyExtractor`] looks at a request and returns its key, or `None` when
//! no key can be extracted (the service then applies its missing-key policy).
//! Requests with the same key share one limit. Keys are bytes ([`Key`]):
//! header values that are not UTF-8 are used as they are, never converted,
//! so different bytes are always different keys.
//!
//! # Tags
//!
//! Every built-in extractor starts its key with a tag that names it, so two
//! extractors can never produce the same key for different things: with
//! `HeaderKey::from_static("x-api-key").or(PeerIp::new())`, a client sending
//! `x-api-key: 127.0.0.1` gets the key `hdr:x-api-key:127.0.0.1`, never the
//! key `ip:127.0.0.1` of the client at that address.
//!
//! | Extractor | Key | Example |
//! |-----------|-----|---------|
//! | [`GlobalKey`] | the constant `global`: one limit shared by everybody | `global` |
//! | [`PeerIp`] | `ip:` and the TCP peer address (IPv6 by its /64) | `ip:192.0.2.7`, `ip:2001:db8:1:2::/64` |
//! | [`ForwardedIp`] | `ip:` and the client address behind trusted reverse proxies (`Forwarded` / `X-Forwarded-For`) | `ip:203.0.113.7` |
//! | [`HeaderKey`] | `hdr:`, the header name, `:`, and the value's bytes, e.g. an API key | `hdr:x-api-key:secret-1` |
//! | [`ExtensionKey`] | `ext:`, its [tag](ExtensionKey::tag) (empty by default), `:`, and the `Display` of a value an earlier layer put into the request extensions, e.g. a user id | `ext::42`, `ext:user:42` |
//! | [`PathKey`] | `path:` and the request path | `path:/users/42` |
//! | `MatchedPathKey` | `route:` and axum's route template (feature `axum`) | `route:/users/{id}` |
//! | a closure | `fn:` and the bytes it returns | `fn:acme` |
//! | [`a.and(b)`](KeyExtractor::and) | `and:`, the length of `a`'s key in decimal, `:`, `a`'s key, `:`, `b`'s key | `and:16:hdr:x-api-key:k1:path:/` |
//! | [`a.or(b)`](KeyExtractor::or) | `a`'s key, or else `b`'s, unchanged | |
//! | [`a.hashed(secret)`](KeyExtractor::hashed) | `h:` and 32 hex digits of a keyed hash of `a`'s key ([`Hashed`]) | `h:5f0c…` (34 bytes) |
//!
//! [`PeerIp`] and [`ForwardedIp`] share the tag `ip:` on purpose: both name a
//! client address, so `ForwardedIp` falling back to `PeerIp` keeps one client
//! on one key. A key no tag can be confused with: tags are ASCII words that end
//! in `:` (and header names, extension tags and lengths contain no `:`), the
//! `and:` length says where the first key ends, and `global` has no `:` at all.
//!
//! # From a client's value to its key
//!
//! An administrator knows the client's value (the API key `trap`, the user `carol`, the
//! address `203.0.113.7`), not its tag. [`KeyExtractor::keys_for`] names the key(s) a
//! request carrying a value is counted under, exactly as [`extract`](KeyExtractor::extract)
//! would make them (`hdr:x-api-key:trap`), and refuses a value the extractor never
//! counts ([`KeyForError`]); the layers' admin actions by value
//! ([`LimitLayer::reset_value`](crate::LimitLayer::reset_value) and its siblings) go
//! through it.
//!
//! A type of your own that implements [`KeyExtractor`] returns its bytes as
//! they are: when you combine it with other extractors, start its keys with a
//! tag of your own (`tenant:`) that is not one of the above. So is the
//! constant key of [`MissingKey::Key`](crate::MissingKey::Key) (a constant
//! without `:` can never equal a tagged key).
//!
//! # Example
//!
//! ```
//! use std::net::SocketAddr;
//! use tower_redis_ratelimit::key::{ForwardedIp, HeaderKey, KeyExtractor, PathKey};
//!
//! // Clients with an API key are limited per key, everybody else per client
//! // address; the app runs behind a load balancer in 10.0.0.0/8.
//! let key = HeaderKey::from_static("x-api-key").or(ForwardedIp::from_strs(["10.0.0.0/8"])?);
//!
//! let (mut head, ()) = http::Request::builder()
//!     .header("x-forwarded-for", "203.0.113.7, 10.1.2.3")
//!     .body(())?
//!     .into_parts();
//! head.extensions.insert("10.0.0.1:443".parse::<SocketAddr>()?);
//! assert_eq!(key.extract(&head).unwrap(), "ip:203.0.113.7");
//!
//! head.headers.insert("x-api-key", "secret-1".parse()?);
//! assert_eq!(key.extract(&head).unwrap(), "hdr:x-api-key:secret-1");
//!
//! // A client whose API key spells an address still has a key of its own.
//! head.headers.insert("x-api-key", "203.0.113.7".parse()?);
//! assert_eq!(key.extract(&head).unwrap(), "hdr:x-api-key:203.0.113.7");
//!
//! // A separate limit per API key and path:
//! let per_route = HeaderKey::from_static("x-api-key").and(PathKey::new());
//! head.headers.insert("x-api-key", "k1".parse()?);
//! assert_eq!(per_route.extract(&head).unwrap(), "and:16:hdr:x-api-key:k1:path:/");
//!
//! // Closures work as extractors; their keys are tagged `fn:`.
//! let tenant = |parts: &http::request::Parts| parts.uri.host().map(str::to_owned);
//! let per_tenant = tenant.or(key);
//! assert_eq!(per_tenant.extract(&head).unwrap(), "hdr:x-api-key:k1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::fmt::Write as _;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use http::request::Parts;
use ipnet::IpNet;

mod hashed;
mod ip;
mod raw;
mod tagged;
mod value;

pub use self::raw::Key;
use self::raw::Writer;
pub use self::tagged::TaggedKey;
pub use self::value::KeyForError;

/// The IPv6 prefix length [`PeerIp`] and [`ForwardedIp`] group clients by,
/// unless told otherwise: a /64, the smallest network a single host usually
/// controls.
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Extracts the rate-limit key of a request from its head
/// ([`http::request::Parts`]: method, URI, headers, extensions), never its body, so
/// one extractor serves every body type, inbound, in flight and outbound alike.
///
/// Returning `None` means no key could be extracted; the service then
/// applies its missing-key policy. A [`Key`] is bytes that either borrow from
/// the request or, when short, are built on the stack: no allocation on the
/// hot path.
///
/// Implemented for every closure `Fn(&Parts) -> Option<T>` where
/// `T: AsRef<[u8]>` (`String`, `&'static str`, `Vec<u8>`, [`Bytes`](bytes::Bytes),
/// a [`Key`], ...); its key is `fn:` followed by the bytes it returns, so it
/// never equals a key of a built-in extractor it is combined with.
///
/// # Example
///
/// ```
/// use tower_redis_ratelimit::key::{Key, KeyExtractor};
///
/// /// The first path segment, e.g. `v1` for `/v1/users`, tagged `version:`.
/// #[derive(Clone, Debug)]
/// struct ApiVersion;
///
/// impl KeyExtractor for ApiVersion {
///     fn extract<'r>(&self, parts: &'r http::request::Parts) -> Option<Key<'r>> {
///         let segment = parts.uri.path().trim_start_matches('/').split('/').next()?;
///         (!segment.is_empty()).then(|| Key::concat(&[b"version:", segment.as_bytes()]))
///     }
/// }
///
/// let (parts, ()) = http::Request::builder().uri("/v2/users").body(()).unwrap().into_parts();
/// assert_eq!(ApiVersion.extract(&parts).unwrap(), "version:v2");
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// Returns the key of the request whose head is `parts`, or `None` when it has none.
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>>;

    /// The keys a request carrying the client's `value` is counted under, exactly as
    /// [`extract`](Self::extract) would make them: what an administrator acts on when
    /// they know the client's API key, user id or address, not the extractor's
    /// [tags](self#tags).
    ///
    /// | Extractor | `value` | keys |
    /// |-----------|---------|------|
    /// | [`HeaderKey`] `x-api-key` | `trap` | `hdr:x-api-key:trap` |
    /// | [`ExtensionKey`] tagged `user` | `carol` | `ext:user:carol` |
    /// | [`PeerIp`], [`ForwardedIp`] | `203.0.113.7`, `2001:db8:1:2::abcd` | `ip:203.0.113.7`, `ip:2001:db8:1:2::/64` (IPv6 grouped by the extractor's prefix) |
    /// | [`PathKey`], `MatchedPathKey` | `/users/42`, `/users/{id}` | `path:/users/42`, `route:/users/{id}` |
    /// | a closure | `acme` | `fn:acme` |
    /// | [`a.or(b)`](KeyExtractor::or) | | the keys of every branch that can count `value`, left to right |
    /// | [`GlobalKey`] | | an error: [`KeyForError::Shared`] |
    /// | [`a.and(b)`](KeyExtractor::and) | | an error: [`KeyForError::Pair`] |
    ///
    /// Several keys only from an `or`: a header value that spells an address is the
    /// header's key *and* the address's. A value the extractor could never find in a
    /// request (not an address for [`PeerIp`], bytes no header can hold, an empty value)
    /// is a [`KeyForError`], never a key of its own: acting on it would act on a key no
    /// request is counted under. The layers act by value with these keys:
    /// [`LimitLayer::reset_value`](crate::LimitLayer::reset_value) and its siblings.
    ///
    /// The default is [`KeyForError::Unsupported`], for extractors of your own that do
    /// not say; implement it when a value maps to your keys (tag and all).
    ///
    /// # Errors
    ///
    /// A [`KeyForError`] saying why no request carrying `value` is counted under a key
    /// of this extractor, or that it cannot say.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_redis_ratelimit::key::{Key, KeyExtractor, KeyForError};
    ///
    /// /// The first path segment, e.g. `v1` for `/v1/users`, tagged `version:`.
    /// #[derive(Clone, Debug)]
    /// struct ApiVersion;
    ///
    /// impl KeyExtractor for ApiVersion {
    ///     fn extract<'r>(&self, parts: &'r http::request::Parts) -> Option<Key<'r>> {
    ///         let segment = parts.uri.path().trim_start_matches('/').split('/').next()?;
    ///         (!segment.is_empty()).then(|| Key::concat(&[b"version:", segment.as_bytes()]))
    ///     }
    ///
    ///     fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
    ///         if value.is_empty() || value.contains(&b'/') {
    ///             return Err(KeyForError::unreachable(
    ///                 "ApiVersion",
    ///                 "a path segment is not empty and holds no `/`",
    ///             ));
    ///         }
    ///         Ok(vec![Key::concat(&[b"version:", value])])
    ///     }
    /// }
    ///
    /// let (parts, ()) = http::Request::builder().uri("/v2/users").body(()).unwrap().into_parts();
    /// let keys = ApiVersion.keys_for(b"v2").unwrap();
    /// assert_eq!(keys, [ApiVersion.extract(&parts).unwrap()]);
    /// ```
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        let _ = value;
        Err(KeyForError::unsupported(std::any::type_name::<Self>()))
    }

    /// Who provides what this extractor reads, and so whose mistake a request without a
    /// key is: the client's (a header it did not send: an ordinary client error, logged
    /// at `debug`) or the server's (a peer address, an extension an authentication
    /// layer should have set: a misconfiguration, logged at `warn`). Either way the
    /// layer answers by its [`MissingKey`](crate::MissingKey) setting and counts the
    /// request in the `missing_key` metric.
    ///
    /// The default is [`KeyOrigin::Server`], so that a missing key of an extractor of
    /// your own warns; say [`KeyOrigin::Client`] for one that reads what clients send.
    fn origin(&self) -> KeyOrigin {
        KeyOrigin::Server
    }

    /// The length of the shortest key this extractor makes, when it knows it: what
    /// the layer builder checks [`max_key_len`](crate::LayerBuilder::max_key_len)
    /// against. The default, `None`, checks nothing.
    #[doc(hidden)]
    fn shortest_key(&self) -> Option<usize> {
        None
    }
    /// Uses the key of `self`, or if it has none the key of `other`,
    /// unchanged.
    ///
    /// The two branches never share a key: each built-in extractor tags its
    /// keys (see the [table](self#tags)), so a header value that spells an IP
    /// address is still not that address's key.
    fn or<O: KeyExtractor>(self, other: O) -> Or<Self, O>
    where
        Self: Sized,
    {
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
    fn and<O: KeyExtractor>(self, other: O) -> And<Self, O>
    where
        Self: Sized,
    {
        And::new(self, other)
    }

    /// Replaces each key by `h:` and a keyed hash of it, so that the store never holds
    /// the client's value (an API key, a credential, an address): see [`Hashed`] for
    /// what it protects and what it does not. `secret` derives the hash's key: keep it
    /// secret, and the same on every instance sharing the limit.
    ///
    /// ```
    /// use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor, PeerIp};
    ///
    /// let secret = std::env::var("RATELIMIT_KEY_SECRET").unwrap_or_else(|_| "dev only".into());
    /// let key = HeaderKey::from_static("x-api-key").or(PeerIp::new()).hashed(secret);
    /// # let _ = key;
    /// ```
    fn hashed(self, secret: impl AsRef<[u8]>) -> Hashed<Self>
    where
        Self: Sized,
    {
        Hashed::new(self, secret)
    }
}

/// Who provides what a [`KeyExtractor`] reads: see [`KeyExtractor::origin`].
///
/// | Extractor | origin |
/// |---|---|
/// | [`HeaderKey`], [`PathKey`], [`GlobalKey`] | client |
/// | [`PeerIp`], [`ForwardedIp`] (the peer address from the server's `ConnectInfo`), [`ExtensionKey`] (set by an earlier layer), `MatchedPathKey` (the router's), a closure, an extractor of your own by default | server |
/// | [`a.or(b)`](KeyExtractor::or), [`a.and(b)`](KeyExtractor::and) | server if either is, else client |
///
/// ```
/// use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor, KeyOrigin, PeerIp};
///
/// let api_key = HeaderKey::from_static("x-api-key");
/// assert_eq!(api_key.origin(), KeyOrigin::Client);
/// // Without the header, the peer address: a request with neither means that the
/// // server gives no peer address (a misconfiguration), not a client's mistake.
/// let or_peer = HeaderKey::from_static("x-api-key").or(PeerIp::new());
/// assert_eq!(or_peer.origin(), KeyOrigin::Server);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyOrigin {
    /// The client sends it (a header such as an API key, the request path).
    Client,
    /// The server provides it (the peer address, a request extension, the route).
    Server,
}

impl KeyOrigin {
    /// The origin of a key made of two extractors' (either one's, or both): the server
    /// when either is.
    #[must_use]
    pub(crate) fn either(self, other: Self) -> Self {
        if self == Self::Server || other == Self::Server {
            Self::Server
        } else {
            Self::Client
        }
    }
}

/// The tag of closure keys.
const FN_TAG: &[u8] = b"fn:";

/// A boxed extractor is the extractor it holds: extractors of different types (chosen
/// at run time, as a rule file does) behind one type.
impl KeyExtractor for Box<dyn KeyExtractor> {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        (**self).extract(parts)
    }

    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        (**self).keys_for(value)
    }

    fn origin(&self) -> KeyOrigin {
        (**self).origin()
    }

    fn shortest_key(&self) -> Option<usize> {
        (**self).shortest_key()
    }
}

impl<F, T> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<T> + Send + Sync + 'static,
    T: AsRef<[u8]>,
{
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        self(parts).map(|key| Key::concat(&[FN_TAG, key.as_ref()]))
    }

    /// `fn:` and the value: a closure's key is the bytes it returns, whatever they are.
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        Ok(vec![Key::concat(&[FN_TAG, value])])
    }
}

mod address;
mod request;

pub use self::address::{ForwardedHeader, ForwardedIp, PeerIp};
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use self::request::MatchedPathKey;
pub use self::request::{ExtensionKey, GlobalKey, HeaderKey, PathKey};
#[cfg(feature = "serde")]
pub(crate) use self::value::any_branch;
pub(crate) use self::value::fitting;

#[cfg(test)]
mod hashed_tests;
#[cfg(test)]
mod ip_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod value_tests;

// Combining extractors: `Or` (the first key found) and `And` (both keys, joined
// unambiguously, whatever their bytes), made by `KeyExtractor::or` and `KeyExtractor::and`.

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
        value::any_branch([self.first.keys_for(value), self.second.keys_for(value)])
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

// Hashing another extractor's keys (the hash itself in `hashed.rs`).

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
            key: hashed::derive(secret.as_ref()),
        }
    }

    /// `key` hashed: `h:` and 32 hex digits.
    fn hash(&self, key: &[u8]) -> Key<'static> {
        hashed::hash(&self.key, key)
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
        Some(hashed::HASHED_LEN)
    }
}

/// `and:<len(first)>:<first>:<second>`: unambiguous for any bytes, since the length
/// says where `first` ends.
pub(crate) fn join(first: &[u8], second: &[u8]) -> Key<'static> {
    let mut len = itoa::Buffer::new();
    let len = len.format(first.len()).as_bytes();
    Key::concat(&[b"and:", len, b":", first, b":", second])
}
