//! The tests of [`Hashed`](super::Hashed) keys.

use http::request::Parts;

use super::{HeaderKey, KeyExtractor, PeerIp};

fn head(api_key: &str) -> Parts {
    let (mut head, ()) = http::Request::new(()).into_parts();
    head.headers.insert("x-api-key", api_key.parse().unwrap());
    head
}

#[test]
fn the_key_is_the_tag_and_32_hex_digits_of_nothing_the_client_sent() {
    let key = HeaderKey::from_static("x-api-key").hashed("s3cret");
    let hashed = key.extract(&head("k_live_1234")).unwrap().into_owned();
    let text = std::str::from_utf8(&hashed).unwrap();
    assert_eq!(text.len(), 34);
    assert!(text.starts_with("h:"));
    assert!(text[2..]
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert!(!text.contains("k_live") && !text.contains("x-api-key"));
    // One value, one key; another value, another key.
    assert_eq!(key.extract(&head("k_live_1234")).unwrap(), hashed);
    assert_ne!(key.extract(&head("k_live_1235")).unwrap(), hashed);
}

#[test]
fn another_secret_makes_other_keys() {
    let a = HeaderKey::from_static("x-api-key").hashed("one");
    let b = HeaderKey::from_static("x-api-key").hashed("two");
    assert_ne!(
        a.extract(&head("k")).unwrap(),
        b.extract(&head("k")).unwrap()
    );
}

#[test]
fn the_tagged_key_is_hashed_so_extractors_stay_apart() {
    // `x-api-key: 127.0.0.1` and the client at 127.0.0.1: two keys, hashed too.
    let key = HeaderKey::from_static("x-api-key")
        .or(PeerIp::new())
        .hashed("s");
    let by_header = key.keys_for(b"127.0.0.1").unwrap();
    assert_eq!(by_header.len(), 2);
    assert_ne!(by_header[0], by_header[1]);
}

#[test]
fn by_value_is_the_key_a_request_makes_and_a_wrong_value_an_error() {
    let key = PeerIp::new().hashed("s");
    let (mut head, ()) = http::Request::new(()).into_parts();
    head.extensions
        .insert("203.0.113.7:443".parse::<std::net::SocketAddr>().unwrap());
    assert_eq!(
        key.keys_for(b"203.0.113.7").unwrap(),
        [key.extract(&head).unwrap().into_owned()]
    );
    assert!(key.keys_for(b"not an address").is_err());
}

#[test]
fn debug_never_shows_the_secret() {
    let key = HeaderKey::from_static("x-api-key").hashed("hunter2");
    let shown = format!("{key:?}");
    assert!(shown.starts_with("Hashed { inner: "), "{shown}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("key:"),
        "{shown}"
    );
}
