//! Unit tests of the key extractors: every extractor's key bytes, the forwarded-header
//! walk, IP normalization and the extractor tags that keep keys from colliding.

use std::collections::HashSet;
use std::net::SocketAddr;

use http::request::Parts;
use http::{HeaderValue, Request};

use super::*;

pub(super) fn req() -> Parts {
    Request::new(()).into_parts().0
}

pub(super) fn with_peer(peer: &str) -> Parts {
    let mut req = req();
    req.extensions.insert(peer.parse::<SocketAddr>().unwrap());
    req
}

pub(super) fn with_peer_and_headers(peer: &str, headers: &[(&str, &str)]) -> Parts {
    let mut req = with_peer(peer);
    for (name, value) in headers {
        req.headers.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    req
}

/// The key as text (every key of these tests is UTF-8 unless it says otherwise).
pub(super) fn key<K: KeyExtractor>(k: &K, req: &Parts) -> Option<String> {
    k.extract(req)
        .map(|key| String::from_utf8(key.into()).expect("a UTF-8 key"))
}

/// Whether a key was built without a heap allocation.
pub(super) fn no_heap(key: &Option<Key<'_>>) -> bool {
    matches!(key, Some(key) if !key.is_on_heap())
}

fn assert_traits<T: Clone + fmt::Debug + Send + Sync + 'static>() {}

#[test]
fn public_types_are_clone_debug_send_sync() {
    struct NotCloneNorDebug;
    assert_traits::<GlobalKey>();
    assert_traits::<PeerIp>();
    assert_traits::<ForwardedIp>();
    assert_traits::<ForwardedHeader>();
    assert_traits::<HeaderKey>();
    assert_traits::<ExtensionKey<NotCloneNorDebug>>();
    assert_traits::<PathKey>();
    assert_traits::<Or<GlobalKey, PathKey>>();
    assert_traits::<And<GlobalKey, PathKey>>();
    #[cfg(feature = "axum")]
    assert_traits::<MatchedPathKey>();
}

#[test]
fn extractors_are_object_safe() {
    let extractors: Vec<Box<dyn KeyExtractor>> = vec![
        Box::new(GlobalKey::new()),
        Box::new(PathKey::new()),
        Box::new(|_: &Parts| Some("closure")),
        Box::new(HeaderKey::from_static("x-a")),
    ];
    let keys: Vec<_> = extractors.iter().map(|k| key(&**k, &req())).collect();
    assert_eq!(
        keys,
        [
            Some(b"global".to_vec()),
            Some(b"path:/".to_vec()),
            Some(b"fn:closure".to_vec()),
            None,
        ]
    );

    fn key<K: KeyExtractor + ?Sized>(k: &K, req: &Parts) -> Option<Vec<u8>> {
        k.extract(req).map(Vec::from)
    }
}

// ---------------------------------------------------------------- closures

#[test]
fn closure_returning_owned_keys() {
    let tenant = |req: &Parts| {
        req.headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let mut r = req();
    assert_eq!(tenant.extract(&r), None);
    r.headers
        .insert("x-tenant", HeaderValue::from_static("acme"));
    let k = tenant.extract(&r);
    assert!(no_heap(&k));
    assert_eq!(k.unwrap(), "fn:acme");

    // `&'static str`, bytes and `Bytes` are keys as well.
    let constant = |_: &Parts| Some("const");
    assert_eq!(key(&constant, &r).as_deref(), Some("fn:const"));
    let bytes = |_: &Parts| Some(vec![0xff_u8, b'x']);
    assert_eq!(bytes.extract(&r).unwrap(), b"fn:\xffx");
    let shared = |_: &Parts| Some(bytes::Bytes::from_static(b"\x00"));
    assert_eq!(shared.extract(&r).unwrap(), b"fn:\x00");
    let never = |_: &Parts| None::<String>;
    assert_eq!(key(&never, &r), None);
}

#[test]
fn closures_combine_with_trait_methods() {
    let never = |_: &Parts| None::<String>;
    let always = |_: &Parts| Some("x".to_owned());
    assert_eq!(key(&never.or(GlobalKey), &req()).as_deref(), Some("global"));
    assert_eq!(
        key(&always.and(PathKey), &req()).as_deref(),
        Some("and:4:fn:x:path:/")
    );
    assert_eq!(key(&always.and(never), &req()), None);
}

// ---------------------------------------------------------------- global / path

#[test]
fn global_key_is_constant_and_borrowed() {
    let r = req();
    let k = GlobalKey::new().extract(&r);
    assert!(k.as_ref().is_some_and(Key::is_borrowed));
    assert_eq!(k.unwrap(), "global");
    fn default<T: Default>() -> T {
        T::default()
    }
    assert_eq!(default::<GlobalKey>(), GlobalKey);
}

#[test]
fn path_key_is_the_path_without_query_and_allocates_nothing() {
    let r = Request::builder()
        .uri("https://example.com/users/42?page=2")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let k = PathKey::new().extract(&r);
    assert!(no_heap(&k));
    assert_eq!(k.unwrap(), "path:/users/42");
}

#[test]
fn path_key_none_without_path() {
    let r = Request::builder()
        .method("CONNECT")
        .uri("example.com:443")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    assert_eq!(key(&PathKey, &r), None);
}

// ---------------------------------------------------------------- headers

#[test]
fn header_key_is_tagged_and_allocates_nothing() {
    let k = HeaderKey::from_static("x-api-key");
    let r = with_peer_and_headers("1.2.3.4:1", &[("x-api-key", "secret")]);
    let v = k.extract(&r);
    assert!(no_heap(&v));
    assert_eq!(v.unwrap(), "hdr:x-api-key:secret");
}

#[test]
fn header_key_missing_or_empty_is_none() {
    let k = HeaderKey::new(HeaderName::from_static("x-api-key"));
    assert_eq!(key(&k, &req()), None);
    let r = with_peer_and_headers("1.2.3.4:1", &[("x-api-key", "")]);
    assert_eq!(key(&k, &r), None);
}

#[test]
fn header_key_uses_first_line() {
    let k = HeaderKey::from_static("x-api-key");
    let r = with_peer_and_headers("1.2.3.4:1", &[("x-api-key", "one"), ("x-api-key", "two")]);
    assert_eq!(key(&k, &r).as_deref(), Some("hdr:x-api-key:one"));
}

#[test]
fn header_key_non_ascii_values() {
    let k = HeaderKey::from_static("x-user");
    let mut r = req();
    // Valid UTF-8 (not visible ASCII): still borrowed.
    r.headers.insert(
        "x-user",
        HeaderValue::from_bytes("jürgen".as_bytes()).unwrap(),
    );
    let v = k.extract(&r);
    assert!(no_heap(&v));
    assert_eq!(v.unwrap(), "hdr:x-user:jürgen");
    // Not UTF-8: the bytes as they are, never converted.
    let mut keys = HashSet::new();
    for value in [
        &b"a\xffb"[..],
        b"a\xfeb",
        "a\u{fffd}b".as_bytes(),
        b"a\x80b",
    ] {
        r.headers
            .insert("x-user", HeaderValue::from_bytes(value).unwrap());
        let v = k.extract(&r).unwrap();
        assert_eq!(v, [&b"hdr:x-user:"[..], value].concat()[..]);
        keys.insert(v.into_owned());
    }
    assert_eq!(keys.len(), 4, "different bytes, different keys");
    // Long values are keys too (on the heap).
    let long = "k".repeat(200);
    r.headers
        .insert("x-user", HeaderValue::from_str(&long).unwrap());
    let v = k.extract(&r).unwrap();
    assert!(v.is_on_heap());
    assert_eq!(v.len(), "hdr:x-user:".len() + 200);
}

// ---------------------------------------------------------------- extensions

#[derive(Clone)]
struct UserId(u64);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user:{}", self.0)
    }
}

#[test]
fn extension_key() {
    let k = ExtensionKey::<UserId>::new();
    let mut r = req();
    assert_eq!(key(&k, &r), None);
    r.extensions.insert(UserId(7));
    assert_eq!(key(&k, &r).as_deref(), Some("ext::user:7"));
    assert!(format!("{k:?}").contains("UserId"));
    let copy = k;
    assert_eq!(key(&copy.clone(), &r).as_deref(), Some("ext::user:7"));
    let tagged = k.tag("uid");
    assert_eq!(key(&tagged, &r).as_deref(), Some("ext:uid:user:7"));
    assert!(format!("{tagged:?}").contains("uid"));
    assert!(no_heap(&tagged.extract(&r)));
}

#[test]
#[should_panic(expected = "must not contain `:`")]
fn extension_key_tags_with_colons_are_refused() {
    let _ = ExtensionKey::<UserId>::new().tag("a:b");
}

#[test]
fn extension_key_empty_display_is_none() {
    #[derive(Clone)]
    struct Empty;
    impl fmt::Display for Empty {
        fn fmt(&self, _f: &mut fmt::Formatter<'_>) -> fmt::Result {
            Ok(())
        }
    }
    let mut r = req();
    r.extensions.insert(Empty);
    assert_eq!(key(&ExtensionKey::<Empty>::default(), &r), None);
}

#[test]
fn extension_key_with_plain_types() {
    let mut r = req();
    r.extensions.insert(42_u32);
    r.extensions.insert(String::from("tenant-a"));
    assert_eq!(
        key(&ExtensionKey::<u32>::new(), &r).as_deref(),
        Some("ext::42")
    );
    assert_eq!(
        key(&ExtensionKey::<String>::new(), &r).as_deref(),
        Some("ext::tenant-a")
    );
    // Two extension types in one `or` stay apart with their own tags.
    let user = ExtensionKey::<u32>::new().tag("user");
    let tenant = ExtensionKey::<String>::new().tag("tenant");
    assert_ne!(key(&user, &r), key(&tenant, &r));
    assert_eq!(key(&ExtensionKey::<u64>::new(), &r), None);
}

// ---------------------------------------------------------------- or / and

#[test]
fn or_uses_first_available_key() {
    let k = HeaderKey::from_static("x-api-key").or(GlobalKey);
    assert_eq!(key(&k, &req()).as_deref(), Some("global"));
    let r = with_peer_and_headers("1.2.3.4:1", &[("x-api-key", "abc")]);
    let v = k.extract(&r);
    assert!(no_heap(&v), "or adds no allocation");
    assert_eq!(v.unwrap(), "hdr:x-api-key:abc");

    let none = HeaderKey::from_static("a").or(HeaderKey::from_static("b"));
    assert_eq!(key(&none, &req()), None);
}

#[test]
fn and_requires_both_keys() {
    let k = HeaderKey::from_static("x-api-key").and(PathKey);
    assert_eq!(key(&k, &req()), None);
    let r = with_peer_and_headers("1.2.3.4:1", &[("x-api-key", "abc")]);
    assert_eq!(
        key(&k, &r).as_deref(),
        Some("and:17:hdr:x-api-key:abc:path:/")
    );
    let k = GlobalKey.and(HeaderKey::from_static("x-missing"));
    assert_eq!(key(&k, &r), None);
}

/// A borrowed key of exactly these bytes, untagged (as a type of your own might return).
#[derive(Clone, Copy)]
struct Raw(&'static [u8]);

impl KeyExtractor for Raw {
    fn extract<'r>(&self, _req: &'r Parts) -> Option<Key<'r>> {
        Some(Key::borrowed(self.0))
    }
}

#[test]
fn and_is_unambiguous_for_any_bytes() {
    let pair = |a: &'static [u8], b: &'static [u8]| -> Vec<u8> {
        Raw(a).and(Raw(b)).extract(&req()).unwrap().into()
    };
    assert_eq!(pair(b"a:b", b"c"), b"and:3:a:b:c");
    assert_eq!(pair(b"a", b"b:c"), b"and:1:a:b:c");
    assert_ne!(pair(b"a:b", b"c"), pair(b"a", b"b:c"));

    let atoms: [&'static [u8]; 10] = [
        b"", b":", b"\\", b"a", b"1", b"1:", b":1", b"and:", b"\xff", b"\x00",
    ];
    let mut parts: Vec<&'static [u8]> = Vec::new();
    for x in atoms {
        for y in atoms {
            parts.push(Box::leak([x, y].concat().into_boxed_slice()));
        }
    }
    let mut keys = HashSet::new();
    for &a in &parts {
        for &b in &parts {
            keys.insert((pair(a, b), (a, b)));
        }
    }
    let distinct: HashSet<_> = keys.iter().map(|(key, _)| key.clone()).collect();
    let pairs: HashSet<_> = keys.iter().map(|(_, pair)| *pair).collect();
    assert_eq!(distinct.len(), pairs.len(), "two pairs joined to one key");
    // Nested: `(a and b) and c` is never `a and (b and c)`.
    let left = Raw(b"a").and(Raw(b"b")).and(Raw(b"c"));
    let right = Raw(b"a").and(Raw(b"b").and(Raw(b"c")));
    assert_ne!(left.extract(&req()), right.extract(&req()));
}

#[test]
fn or_branches_never_share_a_key() {
    // The quickstart's key: a client whose API key spells an address.
    let k = HeaderKey::from_static("x-api-key").or(PeerIp::new());
    let by_ip = key(&k, &with_peer("127.0.0.1:1")).unwrap();
    let spoof = with_peer_and_headers("10.9.9.9:1", &[("x-api-key", "127.0.0.1")]);
    assert_ne!(key(&k, &spoof).unwrap(), by_ip);
    assert_eq!(by_ip, "ip:127.0.0.1");
    // Whatever a client sends, a header key never equals a key of another extractor.
    let others = [
        key(&PeerIp::new(), &with_peer("127.0.0.1:1")),
        key(&PathKey, &req()),
        key(&GlobalKey, &req()),
        key(&|_: &Parts| Some("x"), &req()),
        key(&ExtensionKey::<u32>::new(), &{
            let mut r = req();
            r.extensions.insert(7_u32);
            r
        }),
    ];
    for other in others {
        let other = other.unwrap();
        for value in [other.as_str(), other.split_once(':').map_or("", |(_, v)| v)] {
            if value.is_empty() {
                continue;
            }
            let r = with_peer_and_headers("1.1.1.1:1", &[("x-api-key", value)]);
            assert_ne!(key(&k, &r).unwrap(), other, "x-api-key: {value}");
        }
    }
}

#[test]
fn nested_combinators() {
    let r = with_peer_and_headers("1.2.3.4:1", &[("x-b", "b")]);
    let k = HeaderKey::from_static("x-a")
        .or(HeaderKey::from_static("x-b"))
        .and(PeerIp::new())
        .or(GlobalKey);
    assert_eq!(key(&k, &r).as_deref(), Some("and:9:hdr:x-b:b:ip:1.2.3.4"));
    assert_eq!(key(&k, &req()).as_deref(), Some("global"));
    // Explicit trait syntax works as well.
    let k = KeyExtractor::or(PathKey, GlobalKey);
    assert_eq!(key(&k, &r).as_deref(), Some("path:/"));
}

// ---------------------------------------------------------------- matched path

#[cfg(feature = "axum")]
#[test]
fn matched_path_key_absent() {
    assert_eq!(key(&MatchedPathKey::new(), &req()), None);
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn matched_path_key_from_router() {
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    async fn handler(req: Request<Body>) -> String {
        let (parts, _) = req.into_parts();
        let key = MatchedPathKey::new().or(PathKey).extract(&parts);
        assert!(no_heap(&key));
        String::from_utf8(key.unwrap().into()).unwrap()
    }

    let app = axum::Router::new()
        .route("/users/{id}", get(handler))
        .route("/static", get(handler));
    for (uri, expected) in [
        ("/users/42", "route:/users/{id}"),
        ("/static", "route:/static"),
    ] {
        let res = app
            .clone()
            .oneshot(Request::builder().uri(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
        assert_eq!(body, expected);
    }
}
