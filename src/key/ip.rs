//! Client address helpers: peer lookup, normalization, key formatting and
//! parsing of the `Forwarded` (RFC 7239) and `X-Forwarded-For` headers.
//!
//! Everything in here is private to the `key` module; the public extractors
//! ([`PeerIp`](super::PeerIp), [`ForwardedIp`](super::ForwardedIp)) are thin
//! wrappers around these functions.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::header::{HeaderMap, HeaderName, FORWARDED};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::{Key, KeyForError, Writer};

/// `X-Forwarded-For` (not among `http`'s predefined header names).
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Forwarding headers whose combined size (all lines) exceeds this many
/// bytes are not parsed at all.
pub(crate) const MAX_FORWARDING_HEADER_LEN: usize = 8 * 1024;

/// The TCP peer address of a request: axum's `ConnectInfo<SocketAddr>` (with
/// the `axum` feature), tonic's `TcpConnectInfo` (with the `grpc` feature), then
/// a plain `SocketAddr` extension. The result is already [`normalize`]d.
pub(crate) fn peer_ip(parts: &http::request::Parts) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    {
        if let Some(info) = parts
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(normalize(info.0.ip()));
        }
    }
    #[cfg(feature = "grpc")]
    {
        if let Some(addr) = parts
            .extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|info| info.remote_addr())
        {
            return Some(normalize(addr.ip()));
        }
    }
    parts
        .extensions
        .get::<SocketAddr>()
        .map(|addr| normalize(addr.ip()))
}

/// Turns an IPv4-mapped IPv6 address (`::ffff:1.2.3.4`) into the IPv4
/// address it carries; every other address is returned unchanged.
pub(crate) fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// Same as [`normalize`] for networks: `::ffff:10.0.0.0/104` becomes
/// `10.0.0.0/8`, so trusted ranges match normalized addresses. The network is
/// also truncated to its network address.
pub(crate) fn normalize_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net {
        if v6.prefix_len() >= 96 {
            if let Some(v4) = v6.network().to_ipv4_mapped() {
                if let Ok(v4net) = Ipv4Net::new(v4, v6.prefix_len() - 96) {
                    return IpNet::V4(v4net.trunc());
                }
            }
        }
    }
    net.trunc()
}

/// Clamps an IPv6 prefix length to the valid range `0..=128`.
pub(crate) const fn clamp_prefix(prefix: u8) -> u8 {
    if prefix > 128 {
        128
    } else {
        prefix
    }
}

/// The rate-limit key of an (already normalized) address: `ip:` and the address.
///
/// IPv4 addresses are always the full dotted address. IPv6 addresses are the
/// full address when `ipv6_prefix` is 128, otherwise the network address
/// with its prefix length, e.g. `ip:2001:db8:1:2::/64`. Written on the stack
/// (an IPv6 network with its tag is at most 47 bytes).
pub(crate) fn ip_key(ip: IpAddr, ipv6_prefix: u8) -> Key<'static> {
    let mut key = Key::with_capacity(48);
    key.push(b"ip:");
    let mut out = Writer(&mut key);
    // Writing into a key cannot fail.
    let _ = match ip {
        IpAddr::V6(v6) if ipv6_prefix < 128 => {
            let net =
                Ipv6Net::new(v6, ipv6_prefix).map_or_else(|_| Ipv6Net::from(v6), |n| n.trunc());
            write!(out, "{net}")
        }
        _ => write!(out, "{ip}"),
    };
    key
}

/// The key of the client address `value` (text): as [`ip_key`] makes it from the
/// [`normalize`]d address. A network as keys show it (`2001:db8:1:2::/64`, with the
/// extractor's prefix length) names the same key.
pub(crate) fn value_key(
    value: &[u8],
    ipv6_prefix: u8,
    extractor: &'static str,
) -> Result<Key<'static>, KeyForError> {
    let not_an_address = KeyForError::Unreachable {
        extractor,
        reason: "it is not an IP address",
    };
    let text = std::str::from_utf8(value).map_err(|_| not_an_address.clone())?;
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(ip_key(normalize(ip), ipv6_prefix));
    }
    match text.parse::<Ipv6Net>() {
        Ok(net) if ipv6_prefix < 128 && net.prefix_len() == ipv6_prefix => {
            Ok(ip_key(IpAddr::V6(net.network()), ipv6_prefix))
        }
        _ => Err(not_an_address),
    }
}

/// Whether `ip` lies in one of the `trusted` networks.
pub(crate) fn is_trusted(trusted: &[IpNet], ip: IpAddr) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// Which forwarding header [`resolve_client`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChainHeader {
    /// RFC 7239 `Forwarded`.
    Forwarded,
    /// `X-Forwarded-For`.
    XForwardedFor,
}

/// Walks a forwarding chain from right to left.
///
/// `current` starts as the (trusted) peer. Each step moves one hop to the
/// left: an unusable hop ends the walk without changing `current`; a usable
/// one becomes `current` and the walk continues only while it is trusted.
struct Walk<'a> {
    trusted: &'a [IpNet],
    current: IpAddr,
}

impl Walk<'_> {
    /// Feeds the next hop (right to left); returns whether to continue.
    fn step(&mut self, hop: Option<IpAddr>) -> bool {
        match hop {
            None => {
                tracing::debug!(
                    nearest = %self.current,
                    "unusable entry in forwarding header; stopping at the nearest valid address"
                );
                false
            }
            Some(ip) => {
                let ip = normalize(ip);
                self.current = ip;
                is_trusted(self.trusted, ip)
            }
        }
    }
}

/// Finds the client address behind the trusted `peer` (see
/// [`ForwardedIp`](super::ForwardedIp) for the algorithm).
pub(crate) fn resolve_client(
    headers: &HeaderMap,
    source: ChainHeader,
    peer: IpAddr,
    trusted: &[IpNet],
) -> IpAddr {
    let mut walk = Walk {
        trusted,
        current: peer,
    };
    let name = match source {
        ChainHeader::Forwarded => &FORWARDED,
        ChainHeader::XForwardedFor => &X_FORWARDED_FOR,
    };
    let lines = headers.get_all(name);
    let total: usize = lines.iter().map(|v| v.len()).sum();
    if total > MAX_FORWARDING_HEADER_LEN {
        tracing::debug!(
            header = %name,
            len = total,
            "forwarding header too large; ignoring it"
        );
        return peer;
    }
    match source {
        ChainHeader::Forwarded => walk_forwarded(headers, &mut walk),
        ChainHeader::XForwardedFor => walk_x_forwarded_for(headers, &mut walk),
    }
    walk.current
}

fn walk_x_forwarded_for(headers: &HeaderMap, walk: &mut Walk<'_>) {
    for line in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
        let Ok(line) = line.to_str() else {
            walk.step(None);
            return;
        };
        for entry in line.rsplit(',') {
            let entry = trim_ows(entry);
            if entry.is_empty() {
                // Empty list elements carry nothing (RFC 9110 §5.6.1).
                continue;
            }
            if !walk.step(parse_node(entry, false)) {
                return;
            }
        }
    }
}

fn walk_forwarded(headers: &HeaderMap, walk: &mut Walk<'_>) {
    let mut hops = Vec::new();
    for line in headers.get_all(FORWARDED).iter().rev() {
        let Ok(line) = line.to_str() else {
            walk.step(None);
            return;
        };
        hops.clear();
        parse_forwarded_line(line, &mut hops);
        for hop in hops.iter().rev() {
            if !walk.step(*hop) {
                return;
            }
        }
    }
}

fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim_ows(s: &str) -> &str {
    s.trim_matches(|c| c == ' ' || c == '\t')
}

fn skip_ows(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_ows(b[i]) {
        i += 1;
    }
    i
}

/// `tchar` from RFC 9110 §5.6.2.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Bytes allowed in an unquoted parameter value. Deliberately more lenient
/// than `token` so that sloppy but unambiguous values such as
/// `for=1.2.3.4:80` or `for=[2001:db8::1]` are still understood; the value is
/// validated as a node afterwards anyway.
fn is_bare_value_byte(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b',' | b';' | b'"')
}

/// Index just past the next `,` that is not inside a quoted string, or the
/// end of the line.
fn skip_to_next_element(b: &[u8], mut i: usize) -> usize {
    let mut quoted = false;
    while i < b.len() {
        match b[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b',' if !quoted => return i + 1,
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Parses the quoted string starting at `s[start] == '"'`. Returns the
/// unescaped content and the index just past the closing quote, or `None`
/// when the string is not terminated.
fn quoted_string(s: &str, start: usize) -> Option<(Cow<'_, str>, usize)> {
    let b = s.as_bytes();
    let mut i = start + 1;
    let mut escaped = false;
    while i < b.len() {
        match b[i] {
            b'\\' => {
                escaped = true;
                i += 2;
            }
            b'"' => {
                let raw = &s[start + 1..i];
                let value = if escaped {
                    let mut out = String::with_capacity(raw.len());
                    let mut chars = raw.chars();
                    while let Some(c) = chars.next() {
                        if c == '\\' {
                            if let Some(next) = chars.next() {
                                out.push(next);
                            }
                        } else {
                            out.push(c);
                        }
                    }
                    Cow::Owned(out)
                } else {
                    Cow::Borrowed(raw)
                };
                return Some((value, i + 1));
            }
            _ => i += 1,
        }
    }
    None
}

/// One list element of a `Forwarded` line.
enum Element {
    /// An empty list element (`a, , b`); ignored.
    Empty,
    /// A hop: its usable `for=` address, or `None` when the address is
    /// missing, obfuscated, `unknown` or the element is malformed.
    Hop(Option<IpAddr>),
}

/// Parses the element starting at `i`; returns it and the index just past
/// its terminating comma (or the end of the line).
fn parse_element(s: &str, mut i: usize) -> (Element, usize) {
    let b = s.as_bytes();
    let mut pairs = 0usize;
    let mut client: Option<Option<IpAddr>> = None;
    loop {
        i = skip_ows(b, i);
        if i < b.len() && b[i] != b',' && b[i] != b';' {
            let name_start = i;
            while i < b.len() && is_tchar(b[i]) {
                i += 1;
            }
            let name = &s[name_start..i];
            i = skip_ows(b, i);
            if name.is_empty() || b.get(i) != Some(&b'=') {
                return (Element::Hop(None), skip_to_next_element(b, i));
            }
            i = skip_ows(b, i + 1);
            let value = if b.get(i) == Some(&b'"') {
                match quoted_string(s, i) {
                    Some((value, next)) => {
                        i = next;
                        value
                    }
                    // Unterminated quote: nothing after it can be delimited.
                    None => return (Element::Hop(None), b.len()),
                }
            } else {
                let value_start = i;
                while i < b.len() && is_bare_value_byte(b[i]) {
                    i += 1;
                }
                Cow::Borrowed(&s[value_start..i])
            };
            pairs += 1;
            if name.eq_ignore_ascii_case("for") {
                if client.is_some() {
                    // Duplicate parameter: the element is invalid.
                    return (Element::Hop(None), skip_to_next_element(b, i));
                }
                client = Some(parse_node(&value, true));
            }
            i = skip_ows(b, i);
        }
        let finish = |pairs: usize, client: Option<Option<IpAddr>>| {
            if pairs == 0 {
                Element::Empty
            } else {
                Element::Hop(client.flatten())
            }
        };
        match b.get(i) {
            None => return (finish(pairs, client), b.len()),
            Some(b',') => return (finish(pairs, client), i + 1),
            Some(b';') => i += 1,
            Some(_) => return (Element::Hop(None), skip_to_next_element(b, i)),
        }
    }
}

/// Parses one `Forwarded` header line, appending one entry per element (left
/// to right) to `out`. Malformed elements become `None` entries; parsing
/// resumes at the next element when that can be found unambiguously.
pub(crate) fn parse_forwarded_line(line: &str, out: &mut Vec<Option<IpAddr>>) {
    let mut i = 0;
    loop {
        let (element, next) = parse_element(line, i);
        if let Element::Hop(hop) = element {
            out.push(hop);
        }
        if next >= line.len() {
            return;
        }
        i = next;
    }
}

/// Whether `port` is a port number, or (with `allow_obfuscated`) an RFC 7239
/// obfuscated port such as `_abc`.
fn valid_port(port: &str, allow_obfuscated: bool) -> bool {
    let numeric =
        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok();
    let obfuscated = allow_obfuscated
        && port.len() > 1
        && port.starts_with('_')
        && port[1..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    numeric || obfuscated
}

/// Parses a node: `1.2.3.4`, `1.2.3.4:80`, `[2001:db8::1]`,
/// `[2001:db8::1]:80` or a bare `2001:db8::1`. Anything else (`unknown`,
/// obfuscated identifiers like `_hidden`, host names, garbage) is `None`.
/// `allow_obfuscated_port` accepts RFC 7239 obfuscated ports (`:_abc`).
pub(crate) fn parse_node(s: &str, allow_obfuscated_port: bool) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        let ip = inner.parse::<Ipv6Addr>().ok()?;
        let port_ok = after.is_empty()
            || after
                .strip_prefix(':')
                .is_some_and(|port| valid_port(port, allow_obfuscated_port));
        return port_ok.then_some(IpAddr::V6(ip));
    }
    let (host, port) = s.split_once(':')?;
    if !valid_port(port, allow_obfuscated_port) {
        return None;
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}
