//! Rate-limit keys: which bucket a request is counted against.
//!
//! A [`KeyExtractor`] looks at a request and returns its key, or `None` when
//! no key can be extracted (the service then applies its missing-key policy).
//! Requests with the same key share one limit.
//!
//! Built-in extractors:
//!
//! | Extractor | Key |
//! |-----------|-----|
//! | [`GlobalKey`] | the constant `global`: one limit shared by everybody |
//! | [`PeerIp`] | the TCP peer address |
//! | [`ForwardedIp`] | the client address behind trusted reverse proxies (`Forwarded` / `X-Forwarded-For`) |
//! | [`HeaderKey`] | the value of a request header, e.g. an API key |
//! | [`ExtensionKey`] | a value an earlier layer put into the request extensions, e.g. a user id |
//! | [`PathKey`] | the request path |
//! | `MatchedPathKey` | axum's route template, e.g. `/users/{id}` (feature `axum`) |
//!
//! Any closure `Fn(&Request<B>) -> Option<T>` with `T: Into<String>` is an
//! extractor too, and extractors combine with [`or`](KeyExtractorExt::or)
//! (the first key found) and [`and`](KeyExtractorExt::and) (both keys, joined
//! unambiguously).
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
//! assert_eq!(key.extract(&req).as_deref(), Some("203.0.113.7"));
//!
//! req.headers_mut().insert("x-api-key", "secret-1".parse()?);
//! assert_eq!(key.extract(&req).as_deref(), Some("secret-1"));
//!
//! // A separate limit per API key and path:
//! let per_route = HeaderKey::from_static("x-api-key").and(PathKey::new());
//! assert_eq!(per_route.extract(&req).as_deref(), Some("secret-1:/"));
//!
//! // Closures work as extractors (they return owned keys):
//! let tenant = |req: &http::Request<()>| {
//!     req.uri().host().map(str::to_owned)
//! };
//! let per_tenant = tenant.or(key);
//! assert_eq!(per_tenant.extract(&req).as_deref(), Some("secret-1"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use ipnet::IpNet;

mod ip;

/// Extracts the rate-limit key of a request.
///
/// Returning `None` means no key could be extracted; the service then
/// applies its missing-key policy. Keys are returned as [`Cow`] so that
/// extractors can borrow from the request (no allocation on the hot path)
/// and still compute owned keys when they have to.
///
/// Implemented for every closure `Fn(&Request<B>) -> Option<T>` where
/// `T: Into<String>` (the key is always owned then; to borrow from the
/// request, implement the trait on a type instead).
///
/// # Example
///
/// ```
/// use std::borrow::Cow;
/// use tower_redis_ratelimit::key::KeyExtractor;
///
/// /// The first path segment, e.g. `v1` for `/v1/users`.
/// #[derive(Clone, Debug)]
/// struct ApiVersion;
///
/// impl<B> KeyExtractor<B> for ApiVersion {
///     fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
///         let segment = req.uri().path().trim_start_matches('/').split('/').next()?;
///         (!segment.is_empty()).then_some(Cow::Borrowed(segment))
///     }
/// }
///
/// let req = http::Request::builder().uri("/v2/users").body(()).unwrap();
/// assert_eq!(ApiVersion.extract(&req).as_deref(), Some("v2"));
/// ```
pub trait KeyExtractor<B>: Send + Sync + 'static {
    /// Returns the key of `req`, or `None` when it has none.
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>>;
}

impl<B, F, T> KeyExtractor<B> for F
where
    F: Fn(&http::Request<B>) -> Option<T> + Send + Sync + 'static,
    T: Into<String>,
{
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
        self(req).map(|key| Cow::Owned(key.into()))
    }
}

/// Combinators for every [`KeyExtractor`].
///
/// The built-in extractors (and [`Or`] / [`And`]) also have inherent `or` /
/// `and` methods with the same behavior, which work without naming the body
/// type (these extractors implement [`KeyExtractor<B>`] for every `B`, so
/// the trait methods could not infer it).
pub trait KeyExtractorExt<B>: KeyExtractor<B> + Sized {
    /// Uses the key of `self`, or if it has none the key of `other`.
    ///
    /// Note that the two extractors share one key space: make sure their
    /// keys cannot collide when that matters (e.g. a header value that looks
    /// like an IP address).
    fn or<O: KeyExtractor<B>>(self, other: O) -> Or<Self, O> {
        Or::new(self, other)
    }

    /// Combines the keys of `self` and `other` into one (`None` when either
    /// has none).
    ///
    /// The keys are joined with `:`; any `:` or `\` inside them is escaped
    /// with a backslash, so different pairs never produce the same key:
    /// `("a:b", "c")` becomes `a\:b:c`, while `("a", "b:c")` becomes
    /// `a:b\:c`.
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
    fn extract<'r>(&self, req: &'r http::Request<Body>) -> Option<Cow<'r, str>> {
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
    fn extract<'r>(&self, req: &'r http::Request<Body>) -> Option<Cow<'r, str>> {
        let first = self.first.extract(req)?;
        let second = self.second.extract(req)?;
        Some(Cow::Owned(join_escaped(&first, &second)))
    }
}

/// Joins two keys with `:`, escaping `:` and `\` inside them.
fn join_escaped(first: &str, second: &str) -> String {
    fn push_escaped(out: &mut String, part: &str) {
        if part.contains([':', '\\']) {
            for c in part.chars() {
                if c == ':' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
        } else {
            out.push_str(part);
        }
    }
    let mut out = String::with_capacity(first.len() + second.len() + 1);
    push_escaped(&mut out, first);
    out.push(':');
    push_escaped(&mut out, second);
    out
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
    fn extract<'r>(&self, _req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
        Some(Cow::Borrowed(Self::KEY))
    }
}

/// The TCP peer address of the connection.
///
/// The address is read from the request extensions: axum's
/// `ConnectInfo<SocketAddr>` (with the `axum` feature; serve the app with
/// `into_make_service_with_connect_info::<SocketAddr>()`), otherwise a plain
/// [`SocketAddr`](std::net::SocketAddr) extension. `None` when neither is
/// present. The port is not part of the key.
///
/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`, as seen on dual-stack
/// sockets) are keyed as the IPv4 address (`1.2.3.4`).
///
/// Behind a reverse proxy every request comes from the proxy; use
/// [`ForwardedIp`] there.
///
/// # IPv6 prefixes
///
/// A single IPv6 client typically controls a whole /64 (or more), so
/// limiting per address is easy to evade. [`ipv6_prefix`](Self::ipv6_prefix)
/// groups addresses by network: with a prefix of 64 the key of
/// `2001:db8:1:2::abcd` is `2001:db8:1:2::/64`. The default, 128, keys by
/// the full address (`2001:db8:1:2::abcd`). IPv4 addresses are always keyed
/// by the full address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Creates the extractor, keying IPv6 clients by their full address.
    pub const fn new() -> Self {
        Self { ipv6_prefix: 128 }
    }

    /// Groups IPv6 clients by the network of this prefix length (e.g. 64).
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
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
        let peer = ip::peer_ip(req)?;
        Some(Cow::Owned(ip::ip_key(peer, self.ipv6_prefix)))
    }
}

/// Which forwarding header [`ForwardedIp`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// The client address behind trusted reverse proxies.
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
/// assert_eq!(key.extract(&req).as_deref(), Some("203.0.113.7"));
///
/// // The same header from an untrusted peer is ignored.
/// req.extensions_mut().insert("198.51.100.99:50000".parse::<SocketAddr>()?);
/// assert_eq!(key.extract(&req).as_deref(), Some("198.51.100.99"));
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
            ipv6_prefix: 128,
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

    /// Groups IPv6 clients by the network of this prefix length (e.g. 64);
    /// see [`PeerIp`].
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
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
        let client = self.client_ip(req)?;
        Some(Cow::Owned(ip::ip_key(client, self.ipv6_prefix)))
    }
}

/// The value of a request header, e.g. an API key.
///
/// Only the first line of the header is used. `None` when the header is
/// missing or empty. Values that are valid UTF-8 are borrowed from the
/// request (no allocation); other bytes are converted with
/// [`String::from_utf8_lossy`], so distinct invalid byte sequences may map to
/// the same key.
///
/// The key is the raw header value: for secrets such as API keys, consider
/// hashing keys before they reach shared storage.
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
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
        let value = req.headers().get(&self.name)?;
        if value.is_empty() {
            return None;
        }
        Some(String::from_utf8_lossy(value.as_bytes()))
    }
}

/// A value an earlier layer (e.g. authentication) put into the request
/// extensions, such as a user or tenant id.
///
/// The key is the value's [`Display`](fmt::Display) output. `None` when the
/// extension is missing or displays as an empty string. The layer that
/// inserts the value must run before the rate limiter.
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
/// assert_eq!(key.extract(&req).as_deref(), Some("user-42"));
/// ```
pub struct ExtensionKey<T> {
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Creates the extractor.
    pub const fn new() -> Self {
        Self {
            _marker: PhantomData,
        }
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
        write!(f, "ExtensionKey<{}>", std::any::type_name::<T>())
    }
}

impl<B, T> KeyExtractor<B> for ExtensionKey<T>
where
    T: fmt::Display + Send + Sync + 'static,
{
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
        let key = req.extensions().get::<T>()?.to_string();
        (!key.is_empty()).then_some(Cow::Owned(key))
    }
}

/// The request path (without the query string), e.g. `/users/42`.
///
/// Borrowed from the request. `None` for requests without a path (such as
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
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
        let path = req.uri().path();
        (!path.is_empty()).then_some(Cow::Borrowed(path))
    }
}

/// axum's matched route template, e.g. `/users/{id}`: one limit per route.
///
/// Read from axum's `MatchedPath` request extension, which the router
/// inserts before running route layers and handlers; `None` when it is
/// absent (e.g. when the rate limiter wraps the whole router rather than
/// being added with `route_layer`, or for unmatched requests). Borrowed from
/// the request.
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
    fn extract<'r>(&self, req: &'r http::Request<B>) -> Option<Cow<'r, str>> {
        req.extensions()
            .get::<axum::extract::MatchedPath>()
            .map(|path| Cow::Borrowed(path.as_str()))
    }
}

#[cfg(test)]
mod tests;
