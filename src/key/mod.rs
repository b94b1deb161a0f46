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
//! | [`a.and(b)`](KeyExtractorExt::and) | `and:`, the length of `a`'s key in decimal, `:`, `a`'s key, `:`, `b`'s key | `and:16:hdr:x-api-key:k1:path:/` |
//! | [`a.or(b)`](KeyExtractorExt::or) | `a`'s key, or else `b`'s, unchanged | |
//!
//! [`PeerIp`] and [`ForwardedIp`] share the tag `ip:` on purpose: both name a
//! client address, so `ForwardedIp` falling back to `PeerIp` keeps one client
//! on one key. A key no tag can be confused with: tags are ASCII words that end
//! in `:` (and header names, extension tags and lengths contain no `:`), the
//! `and:` length says where the first key ends, and `global` has no `:` at all.
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
//! use tower_redis_ratelimit::key::{
//!     ForwardedIp, HeaderKey, KeyExtractor, KeyExtractorExt, PathKey,
//! };
//!
//! // Clients with an API key are limited per key, everybody else per client
//! // address; the app runs behind a load balancer in 10.0.0.0/8.
//! let key = HeaderKey::from_static("x-api-key").or(ForwardedIp::from_strs(["10.0.0.0/8"])?);
//!
//! let mut req = http::Request::builder()
//!     .header("x-forwarded-for", "203.0.113.7, 10.1.2.3")
//!     .body(())?;
//! req.extensions_mut().insert("10.0.0.1:443".parse::<SocketAddr>()?);
//! assert_eq!(key.extract(&req).unwrap(), "ip:203.0.113.7");
//!
//! req.headers_mut().insert("x-api-key", "secret-1".parse()?);
//! assert_eq!(key.extract(&req).unwrap(), "hdr:x-api-key:secret-1");
//!
//! // A client whose API key spells an address still has a key of its own.
//! req.headers_mut().insert("x-api-key", "203.0.113.7".parse()?);
//! assert_eq!(key.extract(&req).unwrap(), "hdr:x-api-key:203.0.113.7");
//!
//! // A separate limit per API key and path:
//! let per_route = HeaderKey::from_static("x-api-key").and(PathKey::new());
//! req.headers_mut().insert("x-api-key", "k1".parse()?);
//! assert_eq!(per_route.extract(&req).unwrap(), "and:16:hdr:x-api-key:k1:path:/");
//!
//! // Closures work as extractors; their keys are tagged `fn:`.
//! let tenant = |req: &http::Request<()>| {
//!     req.uri().host().map(str::to_owned)
//! };
//! let per_tenant = tenant.or(key);
//! assert_eq!(per_tenant.extract(&req).unwrap(), "hdr:x-api-key:k1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::fmt::Write as _;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use ipnet::IpNet;

mod ip;
mod raw;

pub use self::raw::Key;
use self::raw::Writer;

/// The IPv6 prefix length [`PeerIp`] and [`ForwardedIp`] group clients by,
/// unless told otherwise: a /64, the smallest network a single host usually
/// controls.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Extracts the rate-limit key of a request.
///
/// Returning `None` means no key could be extracted; the service then
/// applies its missing-key policy. A [`Key`] is bytes that either borrow from
/// the request or, when short, are built on the stack: no allocation on the
/// hot path.
///
/// Implemented for every closure `Fn(&Request<B>) -> Option<T>` where
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
/// impl<B> KeyExtractor<B> for ApiVersion {
///     fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Key<'r>> {
///         let segment = req.uri().path().trim_start_matches('/').split('/').next()?;
///         (!segment.is_empty()).then(|| Key::concat(&[b"version:", segment.as_bytes()]))
///     }
/// }
///
/// let req = http::Request::builder().uri("/v2/users").body(()).unwrap();
/// assert_eq!(ApiVersion.extract(&req).unwrap(), "version:v2");
/// ```
pub trait KeyExtractor<B>: Send + Sync + 'static {
    /// Returns the key of `req`, or `None` when it has none.
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Key<'r>>;
}

/// The tag of closure keys.
const FN_TAG: &[u8] = b"fn:";

impl<B, F, T> KeyExtractor<B> for F
where
    F: Fn(&http::Request<B>) -> Option<T> + Send + Sync + 'static,
    T: AsRef<[u8]>,
{
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Key<'r>> {
        self(req).map(|key| Key::concat(&[FN_TAG, key.as_ref()]))
    }
}

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
    /// keys (see the [table](self#tags)), so a header value that spells an IP
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

/// One key for all requests: a single limit shared by everybody.
///
/// The key is the constant `global`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalKey;

impl GlobalKey {
    /// The key every request gets.
    pub const KEY: &'static str = "global";

    /// Creates the extractor.
    pub const fn new() -> Self {
        Self
    }
}

combinators!(GlobalKey);

impl<B> KeyExtractor<B> for GlobalKey {
    fn extract<'r>(&self, _req: &'r http::Request<B>) -> Option<Key<'r>> {
        Some(Key::borrowed(Self::KEY.as_bytes()))
    }
}

/// The TCP peer address of the connection; the key is `ip:` and the address,
/// IPv6 addresses grouped by their /64.
///
/// The address is read from the request extensions: axum's
/// `ConnectInfo<SocketAddr>` (with the `axum` feature; serve the app with
/// `into_make_service_with_connect_info::<SocketAddr>()`), otherwise a plain
/// [`SocketAddr`](std::net::SocketAddr) extension. `None` when neither is
/// present. The port is not part of the key.
///
/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`, as seen on dual-stack
/// sockets) are keyed as the IPv4 address (`ip:1.2.3.4`).
///
/// Behind a reverse proxy every request comes from the proxy; use
/// [`ForwardedIp`] there.
///
/// # IPv6 prefixes
///
/// A single IPv6 client typically controls a whole /64 (2^64 addresses, or
/// more), so a limit per address is easy to evade by rotating addresses.
/// IPv6 addresses are therefore grouped by network, by default their /64: the
/// key of `2001:db8:1:2::abcd` is `ip:2001:db8:1:2::/64`.
/// [`ipv6_prefix`](Self::ipv6_prefix) chooses another prefix length (`56` or
/// `48` for providers that hand out larger networks; `128` keys each full
/// address, `ip:2001:db8:1:2::abcd`). IPv4 addresses are always keyed by the
/// full address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Creates the extractor, keying IPv6 clients by their /64
    /// ([`DEFAULT_IPV6_PREFIX`]).
    pub const fn new() -> Self {
        Self {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Groups IPv6 clients by the network of this prefix length (default 64;
    /// 128 for the full address).
    ///
    /// Values above 128 are clamped to 128 (the full address).
    #[must_use]
    pub const fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.ipv6_prefix = ip::clamp_prefix(prefix);
        self
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

combinators!(PeerIp);

impl<B> KeyExtractor<B> for PeerIp {
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Key<'r>> {
        let peer = ip::peer_ip(req)?;
        Some(ip::ip_key(peer, self.ipv6_prefix))
    }
}

/// Which forwarding header [`ForwardedIp`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `Forwarded` (RFC 7239) when the request has that header, otherwise
    /// `X-Forwarded-For`.
    ///
    /// Only safe when the proxies rewrite or strip whichever of the two
    /// headers they do not maintain themselves: if a proxy appends to
    /// `X-Forwarded-For` but passes a client's `Forwarded` header through
    /// untouched, that client can pick its own key. Prefer one of the other
    /// variants when you know what your proxies send.
    Auto,
    /// Only the RFC 7239 `Forwarded` header.
    Forwarded,
    /// Only `X-Forwarded-For`: the default, since it is the header that nearly every
    /// reverse proxy and load balancer appends to (nginx, HAProxy, Envoy, Traefik, the
    /// cloud load balancers). A client's own `Forwarded` header is then ignored.
    #[default]
    XForwardedFor,
}

/// The client address behind trusted reverse proxies; the key is `ip:` and the
/// address, IPv6 addresses grouped by their /64 (as by [`PeerIp`]).
///
/// Reads the `Forwarded` (RFC 7239) or `X-Forwarded-For` header, but only
/// believes what trusted proxies wrote into it:
///
/// 1. The peer address is looked up as by [`PeerIp`] (`None` when there is
///    none). If the peer is not in a trusted network, the forwarding headers
///    are ignored and the peer address is the key: a client talking to the
///    app directly cannot spoof its address.
/// 2. Otherwise the forwarding chain is walked from right (nearest hop) to
///    left, skipping trusted addresses; the first untrusted address is the
///    client. If every address is trusted, the leftmost one is used.
/// 3. An entry that is not an IP address (`unknown`, obfuscated identifiers
///    like `_hidden`, a `Forwarded` element without `for=`, garbage) ends the
///    walk: the key is the nearest valid address seen so far, since nothing
///    left of such an entry can be trusted.
///
/// Multiple header lines are read in order, as one list. `Forwarded`
/// elements are parsed with quoted values and ports
/// (`for="[2001:db8::1]:4711"`); `X-Forwarded-For` entries may carry a port
/// (`1.2.3.4:5678`, `[2001:db8::1]:5678`). IPv4-mapped IPv6 addresses are
/// normalized to IPv4, for both the key and the trust check.
///
/// A forwarding header larger than 8 KiB (all lines together) is not parsed
/// at all; the key is then the peer address, as if the chain were garbage.
///
/// [`header`](Self::header) chooses the header (by default `X-Forwarded-For`;
/// choose `Forwarded` when your proxies maintain RFC 7239 headers instead), and [`ipv6_prefix`](Self::ipv6_prefix)
/// groups IPv6 clients as described on [`PeerIp`].
///
/// # Example
///
/// ```
/// use std::net::SocketAddr;
/// use tower_redis_ratelimit::key::{ForwardedIp, KeyExtractor};
///
/// let key = ForwardedIp::from_strs(["10.0.0.0/8", "192.0.2.1"])?;
///
/// // Client 203.0.113.7 -> proxy 192.0.2.1 -> load balancer 10.0.0.2 -> app.
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "198.51.100.1, 203.0.113.7, 192.0.2.1")
///     .body(())?;
/// req.extensions_mut().insert("10.0.0.2:50000".parse::<SocketAddr>()?);
/// assert_eq!(key.extract(&req).unwrap(), "ip:203.0.113.7");
///
/// // The same header from an untrusted peer is ignored.
/// req.extensions_mut().insert("198.51.100.99:50000".parse::<SocketAddr>()?);
/// assert_eq!(key.extract(&req).unwrap(), "ip:198.51.100.99");
///
/// // IPv6 clients are limited per /64.
/// req.extensions_mut().insert("10.0.0.2:50000".parse::<SocketAddr>()?);
/// req.headers_mut().insert("x-forwarded-for", "2001:db8:1:2::abcd".parse()?);
/// assert_eq!(key.extract(&req).unwrap(), "ip:2001:db8:1:2::/64");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ForwardedIp {
    trusted: Arc<[IpNet]>,
    header: ForwardedHeader,
    ipv6_prefix: u8,
}

impl ForwardedIp {
    /// Creates the extractor, trusting proxies in the given networks.
    ///
    /// Use `/32` (IPv4) or `/128` (IPv6) networks for single proxies. With no
    /// trusted networks at all this behaves like [`PeerIp`].
    pub fn new(trusted: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            trusted: trusted.into_iter().map(ip::normalize_net).collect(),
            header: ForwardedHeader::XForwardedFor,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Creates the extractor from networks in text form: CIDR notation
    /// (`10.0.0.0/8`, `2001:db8::/32`) or single addresses (`192.0.2.1`).
    ///
    /// # Errors
    ///
    /// When an entry is neither a network nor an address.
    pub fn from_strs<I, S>(trusted: I) -> Result<Self, ipnet::AddrParseError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = trusted
            .into_iter()
            .map(|s| {
                let s = s.as_ref().trim();
                s.parse::<IpNet>()
                    .or_else(|err| s.parse::<IpAddr>().map(IpNet::from).map_err(|_| err))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(nets))
    }

    /// Chooses the forwarding header to read (default:
    /// [`ForwardedHeader::XForwardedFor`]).
    #[must_use]
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 clients by the network of this prefix length (default 64;
    /// 128 for the full address); see [`PeerIp`].
    ///
    /// Values above 128 are clamped to 128 (the full address).
    #[must_use]
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.ipv6_prefix = ip::clamp_prefix(prefix);
        self
    }

    /// The trusted networks.
    pub fn trusted(&self) -> &[IpNet] {
        &self.trusted
    }

    /// The client address of `req` (before IPv6 prefix grouping).
    fn client_ip<B>(&self, req: &http::Request<B>) -> Option<IpAddr> {
        let peer = ip::peer_ip(req)?;
        if !ip::is_trusted(&self.trusted, peer) {
            return Some(peer);
        }
        let source = match self.header {
            ForwardedHeader::Forwarded => ip::Source::Forwarded,
            ForwardedHeader::XForwardedFor => ip::Source::XForwardedFor,
            ForwardedHeader::Auto => {
                if req.headers().contains_key(FORWARDED) {
                    ip::Source::Forwarded
                } else {
                    ip::Source::XForwardedFor
                }
            }
        };
        Some(ip::resolve_client(
            req.headers(),
            source,
            peer,
            &self.trusted,
        ))
    }
}

combinators!(ForwardedIp);

impl<B> KeyExtractor<B> for ForwardedIp {
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Key<'r>> {
        let client = self.client_ip(req)?;
        Some(ip::ip_key(client, self.ipv6_prefix))
    }
}

/// The value of a request header, e.g. an API key; the key is `hdr:`, the
/// header name, `:`, and the value.
///
/// Only the first line of the header is used. `None` when the header is
/// missing or empty. The value's bytes are used as they are, whether UTF-8
/// or not: different values are always different keys.
///
/// The key holds the raw header value: for secrets such as API keys, consider
/// hashing keys before they reach shared storage.
///
/// ```
/// use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::from_static("x-api-key");
/// let req = http::Request::builder()
///     .header("x-api-key", http::HeaderValue::from_bytes(b"k\xff")?)
///     .body(())?;
/// assert_eq!(key.extract(&req).unwrap(), b"hdr:x-api-key:k\xff");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Creates the extractor for the header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }

    /// Creates the extractor for a header name known at compile time.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid, lowercase header name (see
    /// [`HeaderName::from_static`]).
    pub const fn from_static(name: &'static str) -> Self {
        Self {
            name: HeaderName::from_static(name),
        }
    }

    /// The header this extractor reads.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

combinators!(HeaderKey);

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Key<'r>> {
        let value = req.headers().get(&self.name)?;
        if value.is_empty() {
            return None;
        }
        Some(Key::concat(&[
            b"hdr:",
            self.name.as_str().as_bytes(),
            b":",
            value.as_bytes(),
        ]))
    }
}

/// A value an earlier layer (e.g. authentication) put into the request
/// extensions, such as a user or tenant id.
///
/// The key is `ext:`, the extractor's [tag](Self::tag) (empty by default),
/// `:`, and the value's [`Display`](fmt::Display) output. `None` when the
/// extension is missing or displays as an empty string. The layer that
/// inserts the value must run before the rate limiter. When you combine
/// extractors of several extension types, give each a tag of its own, so that
/// user `42` and tenant `42` never share a key.
///
/// # Example
///
/// ```
/// use tower_redis_ratelimit::key::{ExtensionKey, KeyExtractor};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// impl std::fmt::Display for UserId {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "user-{}", self.0)
///     }
/// }
///
/// let key = ExtensionKey::<UserId>::new();
/// let mut req = http::Request::new(());
/// assert_eq!(key.extract(&req), None);
/// req.extensions_mut().insert(UserId(42));
/// assert_eq!(key.extract(&req).unwrap(), "ext::user-42");
/// assert_eq!(key.tag("user").extract(&req).unwrap(), "ext:user:user-42");
/// ```
pub struct ExtensionKey<T> {
    tag: &'static str,
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Creates the extractor, with an empty tag.
    pub const fn new() -> Self {
        Self {
            tag: "",
            _marker: PhantomData,
        }
    }

    /// Tags the keys: `ext:<tag>:<value>`, to keep extractors of several
    /// extension types apart.
    ///
    /// # Panics
    ///
    /// When `tag` contains a `:` (which would make keys ambiguous).
    #[must_use]
    pub const fn tag(mut self, tag: &'static str) -> Self {
        let bytes = tag.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            assert!(
                bytes[i] != b':',
                "an `ExtensionKey` tag must not contain `:`"
            );
            i += 1;
        }
        self.tag = tag;
        self
    }
}

combinators!(ExtensionKey<T>);

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ExtensionKey<T> {}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ExtensionKey<{}>({:?})",
            std::any::type_name::<T>(),
            self.tag
        )
    }
}

impl<B, T> KeyExtractor<B> for ExtensionKey<T>
where
    T: fmt::Display + Send + Sync + 'static,
{
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Key<'r>> {
        let value = req.extensions().get::<T>()?;
        let mut key = Key::concat(&[b"ext:", self.tag.as_bytes(), b":"]);
        let tagged = key.len();
        write!(Writer(&mut key), "{value}").ok()?;
        (key.len() > tagged).then_some(key)
    }
}

/// The request path (without the query string), e.g. `/users/42`; the key is
/// `path:` and the path.
///
/// `None` for requests without a path (such as
/// `CONNECT host:port`). Every distinct path gets its own limit; to limit per
/// route rather than per concrete path, use `MatchedPathKey` (feature
/// `axum`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathKey;

impl PathKey {
    /// Creates the extractor.
    pub const fn new() -> Self {
        Self
    }
}

combinators!(PathKey);

impl<B> KeyExtractor<B> for PathKey {
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Key<'r>> {
        let path = req.uri().path();
        (!path.is_empty()).then(|| Key::concat(&[b"path:", path.as_bytes()]))
    }
}

/// axum's matched route template, e.g. `/users/{id}`: one limit per route;
/// the key is `route:` and the template.
///
/// Read from axum's `MatchedPath` request extension, which the router
/// inserts before running route layers and handlers; `None` when it is
/// absent (e.g. when the rate limiter wraps the whole router rather than
/// being added with `route_layer`, or for unmatched requests).
#[cfg(feature = "axum")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatchedPathKey;

#[cfg(feature = "axum")]
impl MatchedPathKey {
    /// Creates the extractor.
    pub const fn new() -> Self {
        Self
    }
}

#[cfg(feature = "axum")]
combinators!(MatchedPathKey);

#[cfg(feature = "axum")]
impl<B> KeyExtractor<B> for MatchedPathKey {
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Key<'r>> {
        req.extensions()
            .get::<axum::extract::MatchedPath>()
            .map(|path| Key::concat(&[b"route:", path.as_str().as_bytes()]))
    }
}

#[cfg(test)]
mod tests;
