//! Keys from the client's address: [`PeerIp`] (the TCP peer) and [`ForwardedIp`] (the
//! client behind trusted proxies), IPv6 grouped by prefix.

use super::*;

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
    /// Creates the extractor, keying IPv6 clients by their /64 (see
    /// [`ipv6_prefix`](Self::ipv6_prefix)).
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

impl KeyExtractor for PeerIp {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let peer = ip::peer_ip(parts)?;
        Some(ip::ip_key(peer, self.ipv6_prefix))
    }

    /// The key of a client at the address `value`: `ip:` and the address, an IPv6
    /// address grouped by the extractor's [prefix](Self::ipv6_prefix) as extraction
    /// groups it (an IPv4-mapped address as its IPv4 address). The network itself,
    /// as keys show it (`2001:db8:1:2::/64`, with the extractor's prefix length), names
    /// the same key. See [`KeyExtractor::keys_for`].
    ///
    /// # Errors
    ///
    /// [`KeyForError::Unreachable`] for a value that is not an IP address.
    ///
    /// ```
    /// use tower_redis_ratelimit::key::{PeerIp, KeyExtractor};
    ///
    /// assert_eq!(PeerIp::new().keys_for(b"203.0.113.7")?, ["ip:203.0.113.7"]);
    /// assert_eq!(
    ///     PeerIp::new().keys_for(b"2001:db8:1:2::abcd")?,
    ///     ["ip:2001:db8:1:2::/64"]
    /// );
    /// assert!(PeerIp::new().keys_for(b"localhost").is_err());
    /// # Ok::<(), tower_redis_ratelimit::key::KeyForError>(())
    /// ```
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        ip::value_key(value, self.ipv6_prefix, "PeerIp").map(|key| vec![key])
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
/// let (mut req, ()) = http::Request::builder()
///     .header("x-forwarded-for", "198.51.100.1, 203.0.113.7, 192.0.2.1")
///     .body(())?
///     .into_parts();
/// req.extensions.insert("10.0.0.2:50000".parse::<SocketAddr>()?);
/// assert_eq!(key.extract(&req).unwrap(), "ip:203.0.113.7");
///
/// // The same header from an untrusted peer is ignored.
/// req.extensions.insert("198.51.100.99:50000".parse::<SocketAddr>()?);
/// assert_eq!(key.extract(&req).unwrap(), "ip:198.51.100.99");
///
/// // IPv6 clients are limited per /64.
/// req.extensions.insert("10.0.0.2:50000".parse::<SocketAddr>()?);
/// req.headers.insert("x-forwarded-for", "2001:db8:1:2::abcd".parse()?);
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
    #[cfg(test)]
    pub(crate) fn trusted(&self) -> &[IpNet] {
        &self.trusted
    }

    /// The client address of the request whose head is `parts` (before IPv6 prefix grouping).
    fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = ip::peer_ip(parts)?;
        if !ip::is_trusted(&self.trusted, peer) {
            return Some(peer);
        }
        let source = match self.header {
            ForwardedHeader::Forwarded => ip::ChainHeader::Forwarded,
            ForwardedHeader::XForwardedFor => ip::ChainHeader::XForwardedFor,
            ForwardedHeader::Auto => {
                if parts.headers.contains_key(FORWARDED) {
                    ip::ChainHeader::Forwarded
                } else {
                    ip::ChainHeader::XForwardedFor
                }
            }
        };
        Some(ip::resolve_client(
            &parts.headers,
            source,
            peer,
            &self.trusted,
        ))
    }
}

impl KeyExtractor for ForwardedIp {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let client = self.client_ip(parts)?;
        Some(ip::ip_key(client, self.ipv6_prefix))
    }

    /// The key of a client at the address `value` (the client behind the proxies, as
    /// extraction finds it): `ip:` and the address, IPv6 grouped by the extractor's
    /// [prefix](Self::ipv6_prefix); see [`PeerIp::keys_for`].
    ///
    /// # Errors
    ///
    /// [`KeyForError::Unreachable`] for a value that is not an IP address.
    ///
    /// ```
    /// use tower_redis_ratelimit::key::{ForwardedIp, KeyExtractor};
    ///
    /// let key = ForwardedIp::from_strs(["10.0.0.0/8"]).unwrap().ipv6_prefix(56);
    /// assert_eq!(key.keys_for(b"203.0.113.7")?, ["ip:203.0.113.7"]);
    /// assert_eq!(key.keys_for(b"2001:db8:1:2::abcd")?, ["ip:2001:db8:1::/56"]);
    /// # Ok::<(), tower_redis_ratelimit::key::KeyForError>(())
    /// ```
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        ip::value_key(value, self.ipv6_prefix, "ForwardedIp").map(|key| vec![key])
    }
}
