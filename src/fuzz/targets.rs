//! The targets: what each surface must never do, whatever bytes it is given.

use std::net::IpAddr;
use std::time::Duration;

use http::HeaderMap;
use proptest::prelude::*;
use redis::Value;

use super::{from_peer, fuzz, mutated, regressions};
use crate::backend::decide::protocol::{batch_numbers, reply_numbers};
use crate::backend::{Layout, Owner};
use crate::decision::{Decision, Policy, Source, State};
use crate::key::{ForwardedHeader, ForwardedIp, KeyExtractor, PeerIp};
use crate::response::HeaderParts;
use crate::{Backend, RulesConfig};

/// The example rule file, and the same rules in JSON and YAML.
fn rule_seeds() -> Vec<Vec<u8>> {
    let toml_text = include_str!("../../examples/rules.toml");
    let value: toml::Value = toml::from_str(toml_text).expect("the example parses");
    vec![
        toml_text.as_bytes().to_vec(),
        serde_json::to_vec(&value).expect("JSON"),
        serde_yaml::to_string(&value).expect("YAML").into_bytes(),
    ]
}

/// A rule file of one rule, in TOML, with extreme settings: zero, one nanosecond,
/// `u64::MAX` and beyond, negative, fractional and unreadable.
fn extreme_rule() -> impl Strategy<Value = String> {
    let number = prop::sample::select(vec![
        "0",
        "1",
        "2",
        "4294967295",
        "4294967296",
        "18446744073709551615",
        "18446744073709551616",
        "-1",
        "0.5",
        "1e30",
        "\"5\"",
    ]);
    let duration = prop::sample::select(vec![
        "\"0s\"",
        "\"1ns\"",
        "\"1us\"",
        "\"999ns\"",
        "\"1ms\"",
        "\"1s\"",
        "\"1h 30m\"",
        "\"18446744073709551615s\"",
        "\"584942417355y\"",
        "\"\"",
        "\"-1s\"",
        "\"1 fortnight\"",
        "0",
        "1",
    ]);
    let limit = prop_oneof![
        (number.clone(), duration.clone())
            .prop_map(|(q, d)| format!(r#"{{ algorithm = "period", quota = {q}, period = {d} }}"#)),
        (number.clone(), duration.clone(), number.clone()).prop_map(|(r, d, b)| format!(
            r#"{{ algorithm = "token_bucket", rate = {r}, per = {d}, burst = {b} }}"#
        )),
        (number.clone(), number.clone(), duration.clone()).prop_map(|(l, b, d)| format!(
            r#"{{ algorithm = "rolling_window", limit = {l}, buckets = {b}, interval = {d} }}"#
        )),
        number.clone().prop_map(|q| format!(
            r#"{{ algorithm = "period", quota = {q}, calendar = "month", zone = "Pacific/Chatham" }}"#
        )),
    ];
    (limit, duration.clone(), number, duration).prop_map(|(limit, call, keys, lockout)| {
        format!(
            "[backend]\ncall_timeout = {call}\nmax_local_keys = {keys}\n\n\
             [[rules]]\nname = \"r\"\nkey = \"global\"\nlockout = {lockout}\nlimit = {limit}\n"
        )
    })
}

/// Reads `text` as a rule file in every format it may be, and builds what reads: an
/// error, never a panic.
fn read_rules(text: &[u8]) {
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let configs = [
        toml::from_str::<RulesConfig>(text).map_err(|e| e.to_string()),
        serde_json::from_str::<RulesConfig>(text).map_err(|e| e.to_string()),
        serde_yaml::from_str::<RulesConfig>(text).map_err(|e| e.to_string()),
    ];
    let backend = Backend::in_process();
    for config in configs.into_iter().flatten() {
        if let Err(error) = config.build_on(&backend) {
            assert!(!error.to_string().is_empty());
        }
    }
}

#[test]
fn rule_files() {
    let inputs = prop_oneof![
        mutated(rule_seeds()),
        extreme_rule().prop_map(String::into_bytes),
    ];
    fuzz("rule_files", inputs, &regressions::rule_files(), |text| {
        read_rules(text)
    });
}

/// A Redis URL with `secret` wherever a secret may be: the password, the user, a query
/// value (after a `?` typed for `&` too), the database.
fn url_with_secret() -> impl Strategy<Value = (String, String)> {
    let secret = "[A-Za-z0-9]{6,12}".prop_map(|s| format!("Zq{s}"));
    let scheme = prop::sample::select(vec![
        "redis://",
        "rediss://",
        "redis+unix://",
        "unix://",
        "valkey://",
        "http://",
        "",
        "redis:",
    ]);
    let user = prop::sample::select(vec![
        "",
        "{s}@",
        ":{s}@",
        "user:{s}@",
        "{s}:pw@",
        "u:{s}:x@",
    ]);
    let host = prop::sample::select(vec![
        "127.0.0.1",
        "[::1]",
        "localhost",
        "",
        "a:b:c",
        "%zz",
        "/tmp/r.sock",
    ]);
    let port = prop::sample::select(vec!["", ":6379", ":0", ":99999", ":abc"]);
    let path = prop::sample::select(vec!["", "/0", "/2", "/{s}", "/99999999999999999999"]);
    let query = prop::sample::select(vec![
        "",
        "?protocol=resp3",
        "?password={s}",
        "?protocol=resp3?password={s}",
        "?db=1&password={s}",
        "?user={s}",
        "?protocol={s}",
        "?{s}",
        "#{s}",
    ]);
    (secret, scheme, user, host, port, path, query).prop_map(
        |(secret, scheme, user, host, port, path, query)| {
            let url = [scheme, user, host, port, path, query]
                .concat()
                .replace("{s}", &secret);
            (url, secret)
        },
    )
}

#[test]
fn redis_urls() {
    fuzz(
        "redis_urls",
        url_with_secret(),
        &regressions::redis_urls(),
        |(url, secret)| {
            let builder = Backend::builder().redis_url(url.as_str());
            assert!(
                !format!("{builder:?}").contains(secret.as_str()),
                "{builder:?}"
            );
            match builder.build() {
                Err(error) => {
                    for text in [error.to_string(), format!("{error:?}")] {
                        assert!(!text.contains(secret.as_str()), "{text}");
                    }
                }
                Ok(backend) => assert!(!format!("{backend:?}").contains(secret.as_str())),
            }
        },
    );
}

/// Proxy headers as clients and proxies write them, mutated.
fn forwarded_seeds() -> Vec<Vec<u8>> {
    [
        "203.0.113.195, 70.41.3.18, 10.0.0.1",
        "2001:db8:85a3::8a2e:370:7334",
        "for=192.0.2.60;proto=http;by=203.0.113.43",
        "for=\"[2001:db8:cafe::17]:4711\", for=10.1.2.3",
        "for=unknown, for=_hidden, For=\"10.0.0.7\"",
        "::ffff:10.0.0.1, 10.0.0.2",
        "",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

#[test]
fn proxy_headers() {
    let peer = prop::sample::select(vec![
        "10.0.0.9".parse::<IpAddr>().unwrap(),
        "203.0.113.5".parse().unwrap(),
        "::ffff:10.0.0.9".parse().unwrap(),
        "2001:db8::1".parse().unwrap(),
    ]);
    let header = prop::sample::select(vec![
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::Auto,
    ]);
    let values = || prop::collection::vec(mutated(forwarded_seeds()), 1..3);
    let inputs = (peer, header, values(), values());
    fuzz(
        "proxy_headers",
        inputs,
        &[],
        |(peer, header, xff, forwarded)| {
            let mut parts = from_peer(*peer);
            for value in xff {
                if let Ok(value) = http::HeaderValue::from_bytes(value) {
                    parts.headers.append("x-forwarded-for", value);
                }
            }
            for value in forwarded {
                if let Ok(value) = http::HeaderValue::from_bytes(value) {
                    parts.headers.append(http::header::FORWARDED, value);
                }
            }
            let trusted = ["10.0.0.0/8".parse().unwrap()];
            let extractor = ForwardedIp::new(trusted).header(*header).ipv6_prefix(128);
            let peer_key = PeerIp::new()
                .ipv6_prefix(128)
                .extract(&parts)
                .expect("a peer");
            let Some(key) = extractor.extract(&parts) else {
                panic!("no key for a request with a peer");
            };
            // Only a trusted peer's headers are read; whatever they say, the key is an
            // address's key, as the extractor makes it for that address.
            if !peer.to_canonical().to_string().starts_with("10.") {
                assert_eq!(&*key, &*peer_key, "an untrusted peer's headers were read");
            }
            let address = key.strip_prefix(b"ip:").expect("an address's key");
            assert_eq!(
                extractor.keys_for(address).expect("an address"),
                std::slice::from_ref(&key)
            );
        },
    );
}

#[test]
fn key_layout() {
    let name = "[a-c:.%]{1,4}";
    let key = prop::collection::vec(prop::sample::select(b"ab:%{}7BD5\xff".to_vec()), 0..8);
    let owner = prop_oneof![
        name.prop_map(|n| (n, None)),
        (name, name).prop_map(|(s, l)| (s, Some(l))),
    ];
    let limit = (
        prop::sample::select(vec!["rl", "r:l"]),
        prop::sample::select(vec!["period", "token"]),
        owner,
        key,
    );
    let inputs = (limit.clone(), limit);
    fuzz("key_layout", inputs, &[], |(a, b)| {
        let redis_key =
            |(prefix, algorithm, owner, key): &(&str, &str, (String, Option<String>), Vec<u8>)| {
                let owner = match owner {
                    (name, None) => Owner::Own(name),
                    (set, Some(limit)) => Owner::Member { set, limit },
                };
                let layout = Layout::new(prefix, algorithm, owner);
                let redis_key = layout.redis_key(key);
                // The key comes back from its Redis key, and the hash tag is the key's alone.
                assert_eq!(layout.key_of(&redis_key).as_deref(), Some(key.as_slice()));
                let open = redis_key.iter().position(|&b| b == b'{').expect("a tag");
                let close = redis_key.iter().position(|&b| b == b'}').expect("a tag");
                assert!(open < close && !redis_key[open + 1..close].contains(&b'{'));
                redis_key
            };
        if redis_key(a) == redis_key(b) {
            assert_eq!(a, b, "two limits share a Redis key");
        }
    });
}

/// Replies as a broken or hostile server could send them: nested tables of numbers
/// near the packed forms' edges, strings, nils, errors' stand-ins.
fn reply() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        prop::sample::select(vec![
            i64::MIN,
            i64::MIN + 1,
            -1,
            -2,
            -64,
            -65,
            -129,
            0,
            1,
            2,
            i64::MAX
        ])
        .prop_map(Value::Int),
        any::<i64>().prop_map(Value::Int),
        Just(Value::Nil),
        Just(Value::Boolean(false)),
        Just(Value::Okay),
        any::<Vec<u8>>().prop_map(Value::BulkString),
    ];
    leaf.prop_recursive(3, 32, 8, |inner| {
        prop::collection::vec(inner, 0..8).prop_map(Value::Array)
    })
}

#[test]
fn engine_replies() {
    fuzz("engine_replies", reply(), &[], |reply| {
        // Read as numbers, a reply never panics; what is not the engine's reads as no
        // admit (the caller's decision reads only the engine's shapes).
        if let Ok(numbers) = reply_numbers(reply.clone()) {
            if numbers.first() == Some(&1) {
                assert!(
                    matches!(reply, Value::Int(..0) | Value::Array(_)),
                    "{numbers:?}"
                );
            }
        }
        let _ = batch_numbers(reply.clone());
    });
}

#[test]
fn ratelimit_headers() {
    let name = "[a-z0-9._-]{1,12}";
    let duration = prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        any::<u64>().prop_map(Duration::from_nanos)
    ];
    let state = prop::sample::select(vec![
        State::Allowed,
        State::HitQuota,
        State::OverQuota,
        State::ExceedsCapacity,
    ]);
    let inputs = (
        name,
        any::<u64>(),
        duration.clone(),
        state,
        any::<u64>(),
        duration.clone(),
        prop::option::of(duration),
    );
    fuzz(
        "ratelimit_headers",
        inputs,
        &regressions::ratelimit_headers(),
        |(name, quota, window, state, remaining, reset, retry)| {
            let policy = Policy::new(name.as_str(), *quota, *window);
            let mut decision = Decision::new(*state, *quota, *remaining, *reset, Source::InProcess);
            if let Some(retry) = retry {
                decision = decision.with_retry_after(*retry);
            }
            let mut headers = HeaderMap::new();
            // Twice: a stacked layer's values go before the first's.
            for _ in 0..2 {
                HeaderParts::new(&policy).apply(&mut headers, &decision);
            }
            let policy_value = headers["ratelimit-policy"].to_str().expect("ASCII");
            let item = format!("\"{name}\";q={quota};w=");
            assert!(policy_value.starts_with(&item), "{policy_value}");
            let value = headers["ratelimit"].to_str().expect("ASCII");
            assert!(value.starts_with(&format!("\"{name}\";r=")), "{value}");
            for number in value
                .split([';', ','])
                .filter_map(|part| part.trim().split_once('='))
            {
                number.1.parse::<u64>().expect("whole seconds and units");
            }
            if let Some(after) = headers.get(http::header::RETRY_AFTER) {
                after
                    .to_str()
                    .unwrap()
                    .parse::<u64>()
                    .expect("whole seconds");
            }
        },
    );
}
