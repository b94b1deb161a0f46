//! Unit tests of [`KeyExtractor::keys_for`]: a table per extractor kind, `or` branches,
//! IPv6 grouping, the errors, and a property: for generated values, the key `extract`
//! makes from a request carrying the value is what `keys_for` names.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::request::Parts;
use http::{HeaderValue, Request};
use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
struct User(String);

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The keys of a value as text, or the error.
type Keys = Result<Vec<String>, KeyForError>;

fn keys<K: KeyExtractor>(k: &K, value: &str) -> Keys {
    k.keys_for(value.as_bytes()).map(|keys| {
        keys.into_iter()
            .map(|key| String::from_utf8(key.into()).unwrap())
            .collect()
    })
}

fn closure(req: &Parts) -> Option<String> {
    Some(req.headers.get("x-api-key")?.to_str().ok()?.to_owned())
}

#[test]
fn every_extractor_kind_names_its_key() {
    let header = HeaderKey::from_static("x-api-key");
    let user = ExtensionKey::<User>::new().tag("user");
    let untagged = ExtensionKey::<User>::new();
    let table: Vec<(&str, Keys, &[&str])> = vec![
        ("header", keys(&header, "trap"), &["hdr:x-api-key:trap"]),
        ("extension", keys(&user, "carol"), &["ext:user:carol"]),
        ("untagged extension", keys(&untagged, "42"), &["ext::42"]),
        (
            "peer v4",
            keys(&PeerIp::new(), "203.0.113.7"),
            &["ip:203.0.113.7"],
        ),
        (
            "forwarded v4",
            keys(&ForwardedIp::new([]), "203.0.113.7"),
            &["ip:203.0.113.7"],
        ),
        ("path", keys(&PathKey, "/users/42"), &["path:/users/42"]),
        ("OPTIONS *", keys(&PathKey, "*"), &["path:*"]),
        ("closure", keys(&closure, "trap"), &["fn:trap"]),
        ("empty closure value", keys(&closure, ""), &["fn:"]),
        (
            "or",
            keys(&header.clone().or(user), "carol"),
            &["hdr:x-api-key:carol", "ext:user:carol"],
        ),
        (
            "one key for two ip branches",
            keys(&PeerIp::new().or(ForwardedIp::new([])), "192.0.2.1"),
            &["ip:192.0.2.1"],
        ),
        (
            "or skips a branch that cannot",
            keys(&PeerIp::new().or(header.clone()), "trap"),
            &["hdr:x-api-key:trap"],
        ),
        (
            "or skips global",
            keys(&header.clone().or(GlobalKey), "trap"),
            &["hdr:x-api-key:trap"],
        ),
    ];
    #[cfg(feature = "axum")]
    let table = {
        let mut table = table;
        table.push((
            "route",
            keys(&MatchedPathKey, "/users/{id}"),
            &["route:/users/{id}"],
        ));
        table
    };
    for (case, got, want) in table {
        let want: Vec<String> = want.iter().map(|key| (*key).to_owned()).collect();
        assert_eq!(got, Ok(want), "{case}");
    }
}

#[test]
fn values_no_request_carries_are_errors() {
    let unreachable =
        |k: &dyn Fn(&str) -> Keys, v: &str| matches!(k(v), Err(KeyForError::Unreachable { .. }));
    let header = |v: &str| keys(&HeaderKey::from_static("x-api-key"), v);
    assert!(unreachable(&header, ""));
    assert!(unreachable(&header, "a\nb"));
    assert!(unreachable(&header, "a\0b"));
    let peer = |v: &str| keys(&PeerIp::new(), v);
    for not_an_address in ["", "localhost", "203.0.113.7:80", "trap", "2001:db8::/48"] {
        assert!(unreachable(&peer, not_an_address), "{not_an_address}");
    }
    let path = |v: &str| keys(&PathKey, v);
    for not_a_path in ["", "users", "/a?b=c", "http://host/a"] {
        assert!(unreachable(&path, not_a_path), "{not_a_path}");
    }
    let user = |v: &str| keys(&ExtensionKey::<User>::new().tag("user"), v);
    assert!(unreachable(&user, ""));
    assert_eq!(
        KeyExtractor::keys_for(&ExtensionKey::<User>::new(), b"\xff"),
        Err(KeyForError::Unreachable {
            extractor: "ExtensionKey",
            reason: "`Display` writes UTF-8 text"
        })
    );
    assert_eq!(keys(&GlobalKey, "carol"), Err(KeyForError::Shared));
    let pair = HeaderKey::from_static("x-api-key").and(PathKey);
    assert_eq!(keys(&pair, "trap"), Err(KeyForError::Pair));
    assert!(KeyForError::Pair.to_string().contains("pair of values"));
}

#[test]
fn or_fails_only_when_no_branch_can_and_says_why_for_each() {
    let key = PeerIp::new()
        .or(GlobalKey)
        .or(HeaderKey::from_static("x-api-key"));
    let err = keys(&key, "a\nb").unwrap_err();
    let KeyForError::NoBranch(errors) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(errors.len(), 3, "nested `or`s flattened: {errors:?}");
    assert_eq!(errors[1], KeyForError::Shared);
    let text = err.to_string();
    assert!(text.starts_with("no branch of the `or` extractor counts this value: "));
    assert!(text.contains("`PeerIp` never counts") && text.contains("`HeaderKey` never"));
    assert!(!text.contains("a\nb"), "the value is never shown");
}

#[test]
fn ipv6_is_grouped_by_the_extractors_prefix() {
    let value = "2001:db8:1:2:3:4:5:6";
    assert_eq!(
        keys(&PeerIp::new(), value).unwrap(),
        ["ip:2001:db8:1:2::/64"]
    );
    assert_eq!(
        keys(&PeerIp::new().ipv6_prefix(48), value).unwrap(),
        ["ip:2001:db8:1::/48"]
    );
    assert_eq!(
        keys(&ForwardedIp::new([]).ipv6_prefix(128), value).unwrap(),
        ["ip:2001:db8:1:2:3:4:5:6"]
    );
    // IPv4-mapped addresses are their IPv4 address, as extraction normalizes them.
    assert_eq!(
        keys(&PeerIp::new(), "::ffff:192.0.2.7").unwrap(),
        ["ip:192.0.2.7"]
    );
    // The network as keys show it names the same key; another prefix length does not.
    assert_eq!(
        keys(&PeerIp::new(), "2001:db8:1:2::/64").unwrap(),
        ["ip:2001:db8:1:2::/64"]
    );
    assert!(keys(&PeerIp::new().ipv6_prefix(56), "2001:db8:1:2::/64").is_err());
}

#[test]
fn a_custom_extractor_cannot_say_by_default() {
    #[derive(Clone, Debug)]
    struct Tenant;
    impl KeyExtractor for Tenant {
        fn extract<'r>(&self, req: &'r http::request::Parts) -> Option<Key<'r>> {
            req.uri
                .host()
                .map(|host| Key::concat(&[b"tenant:", host.as_bytes()]))
        }
    }
    let err = keys(&Tenant, "acme").unwrap_err();
    assert!(
        matches!(err, KeyForError::Unsupported { extractor } if extractor.ends_with("Tenant")),
        "{err:?}"
    );
    assert!(err
        .to_string()
        .contains("implement `KeyExtractor::keys_for`"));
    // In an `or`, the branches that can say still name their keys.
    assert_eq!(
        keys(
            &Or::new(Tenant, HeaderKey::from_static("x-api-key")),
            "acme"
        )
        .unwrap(),
        ["hdr:x-api-key:acme"]
    );
}

/// What `extract` makes of a request carrying `value` where `kind` reads it.
fn extracted(kind: usize, value: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let text = std::str::from_utf8(value).ok();
    let mut req = Request::new(()).into_parts().0;
    let (extract, keys_for): (Option<Key<'_>>, _) = match kind {
        0 => {
            let key = HeaderKey::from_static("x-api-key");
            req.headers
                .insert("x-api-key", HeaderValue::from_bytes(value).ok()?);
            (key.extract(&req).map(Key::into_owned), key.keys_for(value))
        }
        1 => {
            let key = ExtensionKey::<User>::new().tag("user");
            req.extensions.insert(User(text?.to_owned()));
            (key.extract(&req).map(Key::into_owned), key.keys_for(value))
        }
        2 => {
            let key = |req: &Parts| req.extensions.get::<Vec<u8>>().cloned();
            req.extensions.insert(value.to_vec());
            (key.extract(&req).map(Key::into_owned), key.keys_for(value))
        }
        3 => {
            let key = PathKey;
            // Only URIs whose path is the whole value carry it as their path.
            let uri = http::Uri::try_from(value).ok()?;
            if uri.path().as_bytes() != value {
                return None;
            }
            req.uri = uri;
            (key.extract(&req).map(Key::into_owned), key.keys_for(value))
        }
        _ => unreachable!(),
    };
    let extract = extract?;
    let mut keys = keys_for.expect("a value a request carries names a key");
    assert_eq!(keys.len(), 1);
    Some((extract.into(), keys.remove(0).into()))
}

/// The address's key by extraction (as the TCP peer, and behind a trusted proxy) and
/// by value, for one prefix.
fn ip_keys(ip: IpAddr, prefix: u8) -> [Vec<u8>; 4] {
    let peer = PeerIp::new().ipv6_prefix(prefix);
    let forwarded = ForwardedIp::from_strs(["10.0.0.0/8"])
        .unwrap()
        .ipv6_prefix(prefix);
    let mut direct = Request::new(()).into_parts().0;
    direct.extensions.insert(SocketAddr::new(ip, 443));
    let mut proxied = Request::new(()).into_parts().0;
    proxied
        .extensions
        .insert(SocketAddr::new(Ipv4Addr::new(10, 0, 0, 1).into(), 443));
    proxied.headers.insert(
        "x-forwarded-for",
        HeaderValue::from_str(&ip.to_string()).unwrap(),
    );
    let value = ip.to_string();
    [
        peer.extract(&direct).unwrap().into(),
        forwarded.extract(&proxied).unwrap().into(),
        peer.keys_for(value.as_bytes()).unwrap().remove(0).into(),
        forwarded
            .keys_for(value.as_bytes())
            .unwrap()
            .remove(0)
            .into(),
    ]
}

proptest! {
    #[test]
    fn keys_for_is_what_extract_makes(kind in 0..4usize, value in prop::collection::vec(any::<u8>(), 0..40)) {
        if let Some((extract, keys_for)) = extracted(kind, &value) {
            prop_assert_eq!(extract, keys_for);
        }
    }

    #[test]
    fn keys_for_is_what_extract_makes_of_text(
        kind in 0..4usize,
        // Printable text, paths, and a small alphabet of the bytes that matter (spaces,
        // tabs, `:`, `/`, `?`, `#`, `%`, `*`) so that each shows up at either end.
        value in "[ -~]{0,30}|/[a-zA-Z0-9/_.%-]{0,30}|[ \t/a:?#%*\x7f]{0,8}",
    ) {
        if let Some((extract, keys_for)) = extracted(kind, value.as_bytes()) {
            prop_assert_eq!(extract, keys_for);
        }
    }

    #[test]
    fn an_address_has_one_key_by_extraction_and_by_value(
        v4 in any::<u32>(),
        v6 in any::<u128>(),
        mapped in any::<bool>(),
        prefix in 0..=130u8,
    ) {
        let v4 = Ipv4Addr::from(v4);
        // Keep the trusted proxy range out of the client's addresses.
        prop_assume!(v4.octets()[0] != 10);
        let v6 = if mapped { v4.to_ipv6_mapped() } else { Ipv6Addr::from(v6) };
        for ip in [IpAddr::V4(v4), IpAddr::V6(v6)] {
            let [peer, forwarded, peer_value, forwarded_value] = ip_keys(ip, prefix);
            prop_assert_eq!(&peer, &peer_value);
            prop_assert_eq!(&forwarded, &forwarded_value);
            prop_assert_eq!(&peer, &forwarded);
        }
    }
}
