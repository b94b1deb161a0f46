//! `keys/*`: one key extraction per iteration, with the tags every extractor adds (see
//! the `key` module): the quickstart's `HeaderKey(x-api-key).or(PeerIp)` on a request
//! with the header and on one without, `PeerIp` on IPv4 and on IPv6 (grouped by /64),
//! `HeaderKey.and(PathKey)`, and a closure. Every key here is built without a heap
//! allocation except the closure's (it returns a `String`).

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{Criterion, Throughput};
use http::request::Parts;
use http::Request;
use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor, PathKey, PeerIp};

fn request(peer: &str, api_key: Option<&str>) -> Parts {
    let mut req = Request::get("/v1/users/42");
    if let Some(api_key) = api_key {
        req = req.header("x-api-key", api_key);
    }
    let (mut req, ()) = req.body(()).expect("a valid request").into_parts();
    req.extensions
        .insert(peer.parse::<SocketAddr>().expect("an address"));
    req
}

fn bench<K: KeyExtractor>(c: &mut Criterion, name: &str, key: &K, req: &Parts) {
    let mut group = c.benchmark_group("keys");
    group.throughput(Throughput::Elements(1));
    group.bench_function(name, |b| {
        b.iter(|| black_box(key.extract(black_box(req))).map(|key| key.len()))
    });
    group.finish();
}

pub(crate) fn benches(c: &mut Criterion) {
    let quickstart = HeaderKey::from_static("x-api-key").or(PeerIp::new());
    let with_key = request("203.0.113.7:50000", Some("key-0123456789abcdef"));
    let v4 = request("203.0.113.7:50000", None);
    let v6 = request("[2001:db8:1:2:3:4:5:6]:50000", None);
    bench(c, "header_or_ip/header", &quickstart, &with_key);
    bench(c, "header_or_ip/ipv4", &quickstart, &v4);
    bench(c, "header_or_ip/ipv6_64", &quickstart, &v6);
    let per_route = HeaderKey::from_static("x-api-key").and(PathKey::new());
    bench(c, "header_and_path", &per_route, &with_key);
    let closure = |req: &Parts| Some(req.uri.path().to_owned());
    bench(c, "closure", &closure, &with_key);
}
