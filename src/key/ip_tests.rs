//! Unit tests of the IP key extractors: the peer's address, the forwarded-header walk
//! and IP normalization (split from `tests.rs`, which holds the helpers).

use std::net::IpAddr;

use http::request::Parts;
use http::HeaderValue;

use super::ip::parse_forwarded_line;
use super::tests::{key, req, with_peer, with_peer_and_headers};
use super::*;

/// The address in an IP key, after checking its `ip:` tag.
fn ip<K: KeyExtractor>(k: &K, req: &Parts) -> Option<String> {
    key(k, req).map(|key| {
        key.strip_prefix("ip:")
            .unwrap_or_else(|| panic!("{key} has no `ip:` tag"))
            .to_owned()
    })
}

// ---------------------------------------------------------------- peer ip

#[test]
fn peer_ip_none_without_connection_info() {
    assert_eq!(ip(&PeerIp::new(), &req()), None);
}

#[test]
fn peer_ip_from_socket_addr() {
    let r = with_peer("192.0.2.10:5555");
    assert_eq!(ip(&PeerIp::new(), &r).as_deref(), Some("192.0.2.10"));
    let r = with_peer("[2001:db8::1]:5555");
    // IPv6 clients by their /64 by default.
    assert_eq!(ip(&PeerIp::default(), &r).as_deref(), Some("2001:db8::/64"));
    let full = PeerIp::new().ipv6_prefix(128);
    assert_eq!(ip(&full, &r).as_deref(), Some("2001:db8::1"));
}

#[cfg(feature = "axum")]
#[test]
fn peer_ip_prefers_connect_info() {
    use std::net::SocketAddr;

    use axum::extract::ConnectInfo;
    let mut r = with_peer("192.0.2.1:1");
    r.extensions
        .insert(ConnectInfo("198.51.100.2:2".parse::<SocketAddr>().unwrap()));
    assert_eq!(ip(&PeerIp::new(), &r).as_deref(), Some("198.51.100.2"));

    let mut r = req();
    r.extensions.insert(ConnectInfo(
        "[::ffff:198.51.100.3]:2".parse::<SocketAddr>().unwrap(),
    ));
    assert_eq!(ip(&PeerIp::new(), &r).as_deref(), Some("198.51.100.3"));
}

#[test]
fn peer_ip_normalizes_ipv4_mapped() {
    let r = with_peer("[::ffff:1.2.3.4]:80");
    assert_eq!(ip(&PeerIp::new(), &r).as_deref(), Some("1.2.3.4"));
    // Mapping is not applied to the deprecated IPv4-compatible form.
    let r = with_peer("[::1.2.3.4]:80");
    let full = PeerIp::new().ipv6_prefix(128);
    assert_eq!(ip(&full, &r).as_deref(), Some("::102:304"));
}

#[test]
fn peer_ip_ipv6_prefix_grouping() {
    assert_eq!(PeerIp::new(), PeerIp::new().ipv6_prefix(64), "the default");
    let k = PeerIp::new();
    let a = with_peer("[2001:db8:1:2:aaaa::1]:1");
    let b = with_peer("[2001:db8:1:2:bbbb::2]:1");
    let c = with_peer("[2001:db8:1:3::1]:1");
    assert_eq!(ip(&k, &a).as_deref(), Some("2001:db8:1:2::/64"));
    assert_eq!(ip(&k, &a), ip(&k, &b));
    assert_eq!(ip(&k, &c).as_deref(), Some("2001:db8:1:3::/64"));
    // IPv4 (also mapped) is unaffected.
    assert_eq!(
        ip(&k, &with_peer("10.1.2.3:1")).as_deref(),
        Some("10.1.2.3")
    );
    assert_eq!(
        ip(&k, &with_peer("[::ffff:10.1.2.3]:1")).as_deref(),
        Some("10.1.2.3")
    );
    // Odd prefixes, zero and clamping.
    assert_eq!(
        ip(&PeerIp::new().ipv6_prefix(56), &a).as_deref(),
        Some("2001:db8:1::/56")
    );
    assert_eq!(
        ip(&PeerIp::new().ipv6_prefix(0), &a).as_deref(),
        Some("::/0")
    );
    assert_eq!(
        PeerIp::new().ipv6_prefix(200),
        PeerIp::new().ipv6_prefix(128)
    );
    assert_eq!(
        ip(&PeerIp::new().ipv6_prefix(200), &a).as_deref(),
        Some("2001:db8:1:2:aaaa::1")
    );
}

// ---------------------------------------------------------------- forwarded ip

fn proxies() -> ForwardedIp {
    ForwardedIp::from_strs(["10.0.0.0/8", "2001:db8:ffff::/48"]).unwrap()
}

#[test]
fn forwarded_ip_none_without_peer() {
    let mut r = req();
    r.headers
        .insert("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
    assert_eq!(ip(&proxies(), &r), None);
}

#[test]
fn forwarded_ip_ignores_headers_from_untrusted_peer() {
    let r = with_peer_and_headers(
        "198.51.100.1:1",
        &[("x-forwarded-for", "1.1.1.1"), ("forwarded", "for=2.2.2.2")],
    );
    assert_eq!(ip(&proxies(), &r).as_deref(), Some("198.51.100.1"));
}

#[test]
fn forwarded_ip_without_header_uses_peer() {
    let r = with_peer("10.0.0.1:1");
    assert_eq!(ip(&proxies(), &r).as_deref(), Some("10.0.0.1"));
}

#[test]
fn forwarded_ip_no_trusted_networks_is_peer_ip() {
    let k = ForwardedIp::new([]);
    let r = with_peer_and_headers("10.0.0.1:1", &[("x-forwarded-for", "1.1.1.1")]);
    assert_eq!(ip(&k, &r).as_deref(), Some("10.0.0.1"));
    assert!(k.trusted().is_empty());
}

#[test]
fn xff_skips_trusted_proxies() {
    let r = with_peer_and_headers(
        "10.0.0.1:1",
        &[("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.2.2.2,10.3.3.3")],
    );
    assert_eq!(ip(&proxies(), &r).as_deref(), Some("203.0.113.9"));
}

#[test]
fn xff_all_trusted_uses_leftmost() {
    let r = with_peer_and_headers("10.0.0.1:1", &[("x-forwarded-for", "10.9.9.9, 10.2.2.2")]);
    assert_eq!(ip(&proxies(), &r).as_deref(), Some("10.9.9.9"));
}

#[test]
fn xff_garbage_ends_the_walk() {
    let k = proxies();
    // Garbage right after trusted hops: nearest valid address.
    let r = with_peer_and_headers(
        "10.0.0.1:1",
        &[("x-forwarded-for", "1.1.1.1, not-an-ip, 10.5.5.5")],
    );
    assert_eq!(ip(&k, &r).as_deref(), Some("10.5.5.5"));
    // Garbage as the nearest entry: the peer.
    let r = with_peer_and_headers("10.0.0.1:1", &[("x-forwarded-for", "1.1.1.1, unknown")]);
    assert_eq!(ip(&k, &r).as_deref(), Some("10.0.0.1"));
    // Garbage left of the client is never reached.
    let r = with_peer_and_headers("10.0.0.1:1", &[("x-forwarded-for", "garbage, 2.2.2.2")]);
    assert_eq!(ip(&k, &r).as_deref(), Some("2.2.2.2"));
    // Bad port, zone ids, host names.
    for bad in [
        "1.2.3.4:99999",
        "1.2.3.4:",
        "fe80::1%eth0",
        "example.com",
        "_hidden",
    ] {
        let r = with_peer_and_headers("10.0.0.1:1", &[("x-forwarded-for", bad)]);
        assert_eq!(ip(&k, &r).as_deref(), Some("10.0.0.1"), "{bad}");
    }
}

#[test]
fn xff_ports_and_ipv6() {
    let k = proxies().ipv6_prefix(128);
    for (value, expected) in [
        ("203.0.113.9:4711", "203.0.113.9"),
        ("[2001:db8::7]:4711", "2001:db8::7"),
        ("[2001:db8::7]", "2001:db8::7"),
        ("2001:db8::7", "2001:db8::7"),
        ("::ffff:203.0.113.9", "203.0.113.9"),
        ("  203.0.113.9\t", "203.0.113.9"),
    ] {
        let r = with_peer_and_headers("10.0.0.1:1", &[("x-forwarded-for", value)]);
        assert_eq!(ip(&k, &r).as_deref(), Some(expected), "{value}");
    }
}

#[test]
fn xff_multiple_lines_and_empty_elements() {
    let r = with_peer_and_headers(
        "10.0.0.1:1",
        &[
            ("x-forwarded-for", "1.1.1.1, 2.2.2.2"),
            ("x-forwarded-for", "10.1.1.1, ,"),
            ("x-forwarded-for", "10.2.2.2"),
        ],
    );
    assert_eq!(ip(&proxies(), &r).as_deref(), Some("2.2.2.2"));
}

#[test]
fn xff_non_ascii_line_is_garbage() {
    let mut r = with_peer("10.0.0.1:1");
    r.headers.append(
        "x-forwarded-for",
        HeaderValue::from_bytes(b"1.1.1.1, \xff").unwrap(),
    );
    r.headers
        .append("x-forwarded-for", HeaderValue::from_static("10.7.7.7"));
    assert_eq!(ip(&proxies(), &r).as_deref(), Some("10.7.7.7"));
}

#[test]
fn oversized_header_is_ignored() {
    let k = proxies();
    let mut long = "9.9.9.9, ".repeat(1000);
    long.push_str("1.2.3.4");
    assert!(long.len() > 8 * 1024);
    let r = with_peer_and_headers("10.0.0.1:1", &[("x-forwarded-for", &long)]);
    assert_eq!(ip(&k, &r).as_deref(), Some("10.0.0.1"));

    // The limit applies to all lines together.
    let line = format!("{}1.2.3.4", "9.9.9.9, ".repeat(500));
    let r = with_peer_and_headers(
        "10.0.0.1:1",
        &[("x-forwarded-for", &line), ("x-forwarded-for", &line)],
    );
    assert_eq!(ip(&k, &r).as_deref(), Some("10.0.0.1"));
    let r = with_peer_and_headers("10.0.0.1:1", &[("x-forwarded-for", &line)]);
    assert_eq!(ip(&k, &r).as_deref(), Some("1.2.3.4"));

    // An oversized `Forwarded` header does not fall back to (possibly
    // client-controlled) `X-Forwarded-For`.
    let k = proxies().header(ForwardedHeader::Auto);
    let long = format!("{}for=1.2.3.4", "for=9.9.9.9, ".repeat(1000));
    let r = with_peer_and_headers(
        "10.0.0.1:1",
        &[("forwarded", &long), ("x-forwarded-for", "5.5.5.5")],
    );
    assert_eq!(ip(&k, &r).as_deref(), Some("10.0.0.1"));
}

#[test]
fn forwarded_header_basic() {
    let k = proxies()
        .header(ForwardedHeader::Forwarded)
        .ipv6_prefix(128);
    for (value, expected) in [
        ("for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
        ("For=\"192.0.2.60\"", "192.0.2.60"),
        ("for=\"[2001:db8:cafe::17]:4711\"", "2001:db8:cafe::17"),
        ("for=\"[2001:db8:cafe::17]\"", "2001:db8:cafe::17"),
        ("for=\"192.0.2.60:8080\"", "192.0.2.60"),
        ("for=192.0.2.60:8080", "192.0.2.60"),
        ("for=\"192.0.2.60:_abc\"", "192.0.2.60"),
        (
            "proto=https; for=192.0.2.60 ;host=example.com",
            "192.0.2.60",
        ),
        ("for=\"\\[2001:db8::5\\]\"", "2001:db8::5"),
        (
            "for=192.0.2.43, for=\"[2001:db8:cafe::17]\"",
            "2001:db8:cafe::17",
        ),
        ("for=192.0.2.43, for=10.4.4.4", "192.0.2.43"),
        ("for=192.0.2.43,for=10.4.4.4;by=\"a,b;c\"", "192.0.2.43"),
        ("for=192.0.2.43, , for=10.4.4.4", "192.0.2.43"),
        ("for=\"[::ffff:192.0.2.1]\"", "192.0.2.1"),
    ] {
        let r = with_peer_and_headers("10.0.0.1:1", &[("forwarded", value)]);
        assert_eq!(ip(&k, &r).as_deref(), Some(expected), "{value}");
    }
}

#[test]
fn forwarded_header_unusable_elements() {
    let k = proxies()
        .header(ForwardedHeader::Forwarded)
        .ipv6_prefix(128);
    for (value, expected) in [
        // Obfuscated / unknown identifiers end the walk.
        ("for=1.1.1.1, for=unknown", "10.0.0.1"),
        ("for=1.1.1.1, for=_hidden", "10.0.0.1"),
        ("for=1.1.1.1, for=_hidden, for=10.3.3.3", "10.3.3.3"),
        // An element without `for` is a hop of unknown origin.
        ("for=1.1.1.1, proto=https", "10.0.0.1"),
        // Duplicate `for` makes the element invalid.
        ("for=1.1.1.1;for=2.2.2.2", "10.0.0.1"),
        // Unquoted IPv6 (not a token) is still understood.
        ("for=[2001:db8::9]:80", "2001:db8::9"),
        // Malformed elements; parsing resumes at the next element.
        ("for=1.1.1.1;;garbage here, for=2.2.2.2", "2.2.2.2"),
        ("for=1.1.1.1, =x, for=10.3.3.3", "10.3.3.3"),
        ("for 1.1.1.1", "10.0.0.1"),
        ("for=\"1.1.1.1\"x, for=2.2.2.2", "2.2.2.2"),
        // An unterminated quote swallows the rest of the line.
        ("for=1.1.1.1, for=\"10.2.2.2, for=3.3.3.3", "10.0.0.1"),
        // An empty value.
        ("for=", "10.0.0.1"),
        ("for=\"\"", "10.0.0.1"),
    ] {
        let r = with_peer_and_headers("10.0.0.1:1", &[("forwarded", value)]);
        assert_eq!(ip(&k, &r).as_deref(), Some(expected), "{value}");
    }
}

#[test]
fn forwarded_header_multiple_lines() {
    let r = with_peer_and_headers(
        "10.0.0.1:1",
        &[
            ("forwarded", "for=1.1.1.1, for=\"broken"),
            ("forwarded", "for=203.0.113.5"),
            ("forwarded", "for=10.1.1.1;proto=https"),
        ],
    );
    let forwarded = proxies().header(ForwardedHeader::Forwarded);
    assert_eq!(ip(&forwarded, &r).as_deref(), Some("203.0.113.5"));

    // The garbage line is reached only when every hop right of it is trusted.
    let r = with_peer_and_headers(
        "10.0.0.1:1",
        &[
            ("forwarded", "for=1.1.1.1, for=\"broken"),
            ("forwarded", "for=10.1.1.1"),
        ],
    );
    assert_eq!(ip(&forwarded, &r).as_deref(), Some("10.1.1.1"));
}

#[test]
fn forwarded_header_selection() {
    let headers = [("forwarded", "for=1.1.1.1"), ("x-forwarded-for", "2.2.2.2")];
    let r = with_peer_and_headers("10.0.0.1:1", &headers);
    // By default only `X-Forwarded-For` counts: a client's own `Forwarded` is ignored.
    assert_eq!(ip(&proxies(), &r).as_deref(), Some("2.2.2.2"));
    let auto = proxies().header(ForwardedHeader::Auto);
    assert_eq!(ip(&auto, &r).as_deref(), Some("1.1.1.1"));
    let k = proxies().header(ForwardedHeader::Forwarded);
    assert_eq!(ip(&k, &r).as_deref(), Some("1.1.1.1"));
    let k = proxies().header(ForwardedHeader::XForwardedFor);
    assert_eq!(ip(&k, &r).as_deref(), Some("2.2.2.2"));

    let only_xff = with_peer_and_headers("10.0.0.1:1", &headers[1..]);
    assert_eq!(ip(&proxies(), &only_xff).as_deref(), Some("2.2.2.2"));
    let k = proxies().header(ForwardedHeader::Forwarded);
    assert_eq!(ip(&k, &only_xff).as_deref(), Some("10.0.0.1"));
}

#[test]
fn forwarded_ip_ipv6_and_mapped_addresses() {
    // IPv6 clients by their /64 by default.
    let k = proxies();
    assert!(format!("{k:?}").contains("ipv6_prefix: 64"));
    // Trusted IPv6 proxy, IPv6 client grouped by /64.
    let r = with_peer_and_headers(
        "[2001:db8:ffff::1]:1",
        &[("x-forwarded-for", "2001:db8:1:2::99, 2001:db8:ffff::2")],
    );
    assert_eq!(ip(&k, &r).as_deref(), Some("2001:db8:1:2::/64"));
    // Untrusted IPv6 peer grouped as well.
    let r = with_peer_and_headers("[2001:db8:1:2::5]:1", &[("x-forwarded-for", "1.1.1.1")]);
    assert_eq!(ip(&k, &r).as_deref(), Some("2001:db8:1:2::/64"));
    // A mapped peer matches IPv4 trusted networks.
    let r = with_peer_and_headers(
        "[::ffff:10.0.0.1]:1",
        &[("x-forwarded-for", "::ffff:10.8.8.8, ::ffff:203.0.113.1")],
    );
    assert_eq!(ip(&proxies(), &r).as_deref(), Some("203.0.113.1"));
    // Trusted networks written in mapped form are normalized too.
    let k = ForwardedIp::from_strs(["::ffff:10.0.0.0/104"]).unwrap();
    assert_eq!(k.trusted(), ["10.0.0.0/8".parse::<IpNet>().unwrap()]);
    let r = with_peer_and_headers("10.0.0.1:1", &[("x-forwarded-for", "1.2.3.4")]);
    assert_eq!(ip(&k, &r).as_deref(), Some("1.2.3.4"));
}

#[cfg(feature = "axum")]
#[test]
fn forwarded_ip_uses_connect_info() {
    use std::net::SocketAddr;

    use axum::extract::ConnectInfo;
    let mut r = req();
    r.extensions
        .insert(ConnectInfo("10.0.0.1:1".parse::<SocketAddr>().unwrap()));
    r.headers
        .insert("x-forwarded-for", HeaderValue::from_static("203.0.113.1"));
    assert_eq!(ip(&proxies(), &r).as_deref(), Some("203.0.113.1"));
}

#[test]
fn forwarded_ip_from_strs() {
    let k = ForwardedIp::from_strs(["10.0.0.0/8", " 192.0.2.1 ", "2001:db8::/32", "::1"]).unwrap();
    let expected: Vec<IpNet> = ["10.0.0.0/8", "192.0.2.1/32", "2001:db8::/32", "::1/128"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(k.trusted(), expected);
    // Host bits are dropped.
    let strs: &[&str] = &["10.1.2.3/8"];
    let k = ForwardedIp::from_strs(strs).unwrap();
    assert_eq!(k.trusted(), ["10.0.0.0/8".parse::<IpNet>().unwrap()]);
    assert!(ForwardedIp::from_strs(["10.0.0.0/33"]).is_err());
    assert!(ForwardedIp::from_strs(vec![String::from("nope")]).is_err());
    // Clamping and Debug.
    let k = k.ipv6_prefix(129);
    assert!(format!("{k:?}").contains("ipv6_prefix: 128"));
}

#[test]
fn parse_forwarded_lines() {
    fn parse(line: &str) -> Vec<Option<IpAddr>> {
        let mut out = Vec::new();
        parse_forwarded_line(line, &mut out);
        out
    }
    let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
    assert_eq!(parse(""), []);
    assert_eq!(parse(" , ,"), []);
    assert_eq!(parse("for=1.2.3.4"), [ip("1.2.3.4")]);
    assert_eq!(
        parse("for=1.2.3.4,for=\"[::1]:80\";by=x, proto=http, for=unknown"),
        [ip("1.2.3.4"), ip("::1"), None, None]
    );
    assert_eq!(parse("by=\"x,y\", for=5.6.7.8"), [None, ip("5.6.7.8")]);
    assert_eq!(parse("for=\"a\\\"b\", for=5.6.7.8"), [None, ip("5.6.7.8")]);
    assert_eq!(
        parse("for=1.2.3.4 junk, for=5.6.7.8"),
        [None, ip("5.6.7.8")]
    );
    assert_eq!(parse("for=\"1.2.3.4"), [None]);
    assert_eq!(parse("for=\"1.2.3.4\\"), [None]);
    assert_eq!(parse(";;for=1.2.3.4;;"), [ip("1.2.3.4")]);
}
