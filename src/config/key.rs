//! Key extractors as data: [`KeyConfig`] and the extractor it builds.

use std::fmt;

use http::HeaderName;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::ConfigError;
use crate::key::{
    ForwardedHeader, ForwardedIp, GlobalKey, HeaderKey, Key, KeyExtractor, KeyForError, KeyOrigin,
    PathKey, PeerIp,
};

/// Which key extractor a rule uses, as data.
///
/// A bare name for the extractors without settings, or a one-entry table:
///
/// | TOML | extractor |
/// |---|---|
/// | `"global"` | [`GlobalKey`] |
/// | `"peer_ip"` or `{ peer_ip = { ipv6_prefix = 56 } }` | [`PeerIp`] |
/// | `{ forwarded_ip = { trusted = ["10.0.0.0/8"], header = "forwarded", ipv6_prefix = 64 } }` | [`ForwardedIp`] (`header`: `x_forwarded_for`, the default, `forwarded` or `auto`) |
/// | `{ header = "x-api-key" }` | [`HeaderKey`] |
/// | `"path"` | [`PathKey`] |
/// | `"matched_path"` | `MatchedPathKey` (feature `axum`) |
/// | `{ or = [a, b, ...] }` | `a.or(b).or(...)` |
/// | `{ and = [a, b, ...] }` | `a.and(b).and(...)` |
///
/// The keys are the same bytes as those of the extractors built in code, so a rule from
/// a file and a layer built in code with the same name share their counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KeyConfig {
    /// One key for all requests (the default).
    #[default]
    Global,
    /// The TCP peer address ([`PeerIp`]).
    PeerIp {
        /// The IPv6 prefix length clients are grouped by (default 64).
        #[serde(skip_serializing_if = "Option::is_none")]
        ipv6_prefix: Option<u8>,
    },
    /// The client address behind trusted proxies ([`ForwardedIp`]).
    ForwardedIp {
        /// The trusted proxies: networks (`10.0.0.0/8`) or single addresses.
        trusted: Vec<String>,
        /// The forwarding header to read (default `x_forwarded_for`).
        #[serde(skip_serializing_if = "Option::is_none")]
        header: Option<ForwardedHeader>,
        /// The IPv6 prefix length clients are grouped by (default 64).
        #[serde(skip_serializing_if = "Option::is_none")]
        ipv6_prefix: Option<u8>,
    },
    /// The value of a request header.
    Header(String),
    /// The request path.
    Path,
    /// axum's matched route template (feature `axum`).
    MatchedPath,
    /// The first extractor that has a key.
    Or(Vec<KeyConfig>),
    /// All keys joined (none when any is missing).
    And(Vec<KeyConfig>),
}

/// The settings of `peer_ip`, as a file holds them.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerIpFile {
    #[serde(default)]
    ipv6_prefix: Option<u8>,
}

/// The settings of `forwarded_ip`, as a file holds them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForwardedIpFile {
    #[serde(default)]
    trusted: Vec<String>,
    #[serde(default)]
    header: Option<ForwardedHeader>,
    #[serde(default)]
    ipv6_prefix: Option<u8>,
}

const VARIANTS: &[&str] = &[
    "global",
    "peer_ip",
    "forwarded_ip",
    "header",
    "path",
    "matched_path",
    "or",
    "and",
];

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Tag {
    Global,
    PeerIp,
    ForwardedIp,
    Header,
    Path,
    MatchedPath,
    Or,
    And,
}

/// Reads a bare name (`"peer_ip"`) or a one-entry table (`{ header = "x-api-key" }`),
/// with serde's own errors for unknown names and fields.
impl<'de> Deserialize<'de> for KeyConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeyConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key extractor: a name such as \"peer_ip\" or a table such as { header = \"x-api-key\" }")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<KeyConfig, E> {
                match name {
                    "global" => Ok(KeyConfig::Global),
                    "peer_ip" => Ok(KeyConfig::PeerIp { ipv6_prefix: None }),
                    "path" => Ok(KeyConfig::Path),
                    "matched_path" => Ok(KeyConfig::MatchedPath),
                    "forwarded_ip" | "header" | "or" | "and" => Err(E::custom(format_args!(
                        "key extractor `{name}` needs settings: write {{ {name} = ... }}"
                    ))),
                    _ => Err(E::unknown_variant(name, VARIANTS)),
                }
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<KeyConfig, M::Error> {
                let Some(tag) = map.next_key::<Tag>()? else {
                    return Err(de::Error::invalid_length(0, &"one key extractor"));
                };
                let key = match tag {
                    Tag::Global => map
                        .next_value::<de::IgnoredAny>()
                        .map(|_| KeyConfig::Global)?,
                    Tag::Path => map
                        .next_value::<de::IgnoredAny>()
                        .map(|_| KeyConfig::Path)?,
                    Tag::MatchedPath => map
                        .next_value::<de::IgnoredAny>()
                        .map(|_| KeyConfig::MatchedPath)?,
                    Tag::PeerIp => {
                        let PeerIpFile { ipv6_prefix } = map.next_value()?;
                        KeyConfig::PeerIp { ipv6_prefix }
                    }
                    Tag::ForwardedIp => {
                        let ForwardedIpFile {
                            trusted,
                            header,
                            ipv6_prefix,
                        } = map.next_value()?;
                        KeyConfig::ForwardedIp {
                            trusted,
                            header,
                            ipv6_prefix,
                        }
                    }
                    Tag::Header => KeyConfig::Header(map.next_value()?),
                    Tag::Or => KeyConfig::Or(map.next_value()?),
                    Tag::And => KeyConfig::And(map.next_value()?),
                };
                if map.next_key::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom(
                        "a key table names one extractor: combine several with `or` or `and`",
                    ));
                }
                Ok(key)
            }
        }

        deserializer.deserialize_any(KeyVisitor)
    }
}

fn invalid(reason: impl fmt::Display) -> ConfigError {
    ConfigError::InvalidValue {
        setting: "key",
        reason: reason.to_string(),
    }
}

impl KeyConfig {
    /// Checks the settings and builds the extractor.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] for a trusted network or header name that cannot be
    /// parsed, an IPv6 prefix over 128, an `or`/`and` of fewer than two extractors, or
    /// `matched_path` without the `axum` feature.
    pub(crate) fn build(&self) -> Result<RuleKey, ConfigError> {
        let prefix = |prefix: Option<u8>| match prefix {
            Some(p) if p > 128 => Err(invalid(format_args!(
                "`ipv6_prefix` is {p}, at most 128 is accepted"
            ))),
            _ => Ok(prefix),
        };
        let key = match self {
            Self::Global => Inner::Global(GlobalKey),
            Self::PeerIp { ipv6_prefix } => Inner::PeerIp(match prefix(*ipv6_prefix)? {
                Some(p) => PeerIp::new().ipv6_prefix(p),
                None => PeerIp::new(),
            }),
            Self::ForwardedIp {
                trusted,
                header,
                ipv6_prefix,
            } => {
                let mut key = ForwardedIp::from_strs(trusted).map_err(|_| {
                    let bad = trusted
                        .iter()
                        .find(|s| ForwardedIp::from_strs([s]).is_err());
                    invalid(format_args!(
                        "trusted proxy {:?} is neither a network nor an address",
                        bad.map_or("", String::as_str)
                    ))
                })?;
                if let Some(header) = *header {
                    key = key.header(header);
                }
                if let Some(p) = prefix(*ipv6_prefix)? {
                    key = key.ipv6_prefix(p);
                }
                Inner::ForwardedIp(key)
            }
            Self::Header(name) => Inner::Header(HeaderKey::new(
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| invalid(format_args!("{name:?} is not a header name")))?,
            )),
            Self::Path => Inner::Path(PathKey),
            #[cfg(feature = "axum")]
            Self::MatchedPath => Inner::MatchedPath(crate::key::MatchedPathKey),
            #[cfg(not(feature = "axum"))]
            Self::MatchedPath => return Err(invalid("`matched_path` needs the `axum` feature")),
            Self::Or(keys) | Self::And(keys) => {
                let (word, is_or) = match self {
                    Self::Or(_) => ("or", true),
                    _ => ("and", false),
                };
                if keys.len() < 2 {
                    return Err(invalid(format_args!(
                        "`{word}` combines at least two extractors"
                    )));
                }
                let keys = keys
                    .iter()
                    .map(Self::build)
                    .collect::<Result<Box<[_]>, _>>()?;
                if is_or {
                    Inner::Or(keys)
                } else {
                    Inner::And(keys)
                }
            }
        };
        Ok(RuleKey(key))
    }
}

/// The key extractor a [`KeyConfig`] builds: one type for every extractor, so rules
/// with different keys are layers of one type (a `LimitLayer<Arc<dyn Limiter>,
/// Box<dyn KeyExtractor>>`, which holds it boxed).
#[derive(Debug, Clone)]
pub(crate) struct RuleKey(Inner);

#[derive(Debug, Clone)]
enum Inner {
    Global(GlobalKey),
    PeerIp(PeerIp),
    ForwardedIp(ForwardedIp),
    Header(HeaderKey),
    Path(PathKey),
    #[cfg(feature = "axum")]
    MatchedPath(crate::key::MatchedPathKey),
    Or(Box<[RuleKey]>),
    And(Box<[RuleKey]>),
}

impl KeyExtractor for RuleKey {
    fn extract<'r>(&self, parts: &'r http::request::Parts) -> Option<Key<'r>> {
        match &self.0 {
            Inner::Global(key) => key.extract(parts),
            Inner::PeerIp(key) => key.extract(parts),
            Inner::ForwardedIp(key) => key.extract(parts),
            Inner::Header(key) => key.extract(parts),
            Inner::Path(key) => key.extract(parts),
            #[cfg(feature = "axum")]
            Inner::MatchedPath(key) => key.extract(parts),
            Inner::Or(keys) => keys.iter().find_map(|key| key.extract(parts)),
            Inner::And(keys) => {
                // Left to right, as `a.and(b).and(c)`: and(and(a, b), c).
                let mut keys = keys.iter();
                let first = keys.next()?.extract(parts)?;
                keys.try_fold(first, |joined, key| {
                    let next = key.extract(parts)?;
                    Some(crate::key::join(&joined, &next))
                })
            }
        }
    }

    /// As the extractor built in code: see [`KeyExtractor::keys_for`].
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        match &self.0 {
            Inner::Global(key) => key.keys_for(value),
            Inner::PeerIp(key) => key.keys_for(value),
            Inner::ForwardedIp(key) => key.keys_for(value),
            Inner::Header(key) => key.keys_for(value),
            Inner::Path(key) => key.keys_for(value),
            #[cfg(feature = "axum")]
            Inner::MatchedPath(key) => key.keys_for(value),
            Inner::Or(keys) => crate::key::any_branch(keys.iter().map(|key| key.keys_for(value))),
            Inner::And(_) => Err(KeyForError::Pair),
        }
    }

    /// As the extractor built in code: known for a global or header key, and for an
    /// `or` of keys that all know theirs.
    fn shortest_key(&self) -> Option<usize> {
        match &self.0 {
            Inner::Global(key) => key.shortest_key(),
            Inner::Header(key) => key.shortest_key(),
            Inner::Or(keys) => keys
                .iter()
                .map(KeyExtractor::shortest_key)
                .try_fold(usize::MAX, |shortest, key| Some(shortest.min(key?))),
            _ => None,
        }
    }

    /// As the extractor built in code: see [`KeyExtractor::origin`].
    fn origin(&self) -> KeyOrigin {
        match &self.0 {
            Inner::Global(key) => key.origin(),
            Inner::PeerIp(key) => key.origin(),
            Inner::ForwardedIp(key) => key.origin(),
            Inner::Header(key) => key.origin(),
            Inner::Path(key) => key.origin(),
            #[cfg(feature = "axum")]
            Inner::MatchedPath(key) => key.origin(),
            Inner::Or(keys) | Inner::And(keys) => keys
                .iter()
                .map(KeyExtractor::origin)
                .fold(KeyOrigin::Client, KeyOrigin::either),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::KeyConfig;
    use crate::key::{ForwardedIp, HeaderKey, KeyExtractor, PathKey, PeerIp};

    fn request(peer: &str, headers: &[(&str, &str)], path: &str) -> http::request::Parts {
        let mut req = http::Request::builder().uri(path);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let (mut req, ()) = req.body(()).unwrap().into_parts();
        req.extensions.insert(peer.parse::<SocketAddr>().unwrap());
        req
    }

    fn key_of(text: &str) -> KeyConfig {
        #[derive(serde::Deserialize)]
        struct Wrap {
            key: KeyConfig,
        }
        toml::from_str::<Wrap>(&format!("key = {text}"))
            .unwrap_or_else(|error| panic!("{text}: {error}"))
            .key
    }

    /// Every extractor of a file gives the very keys of the extractor built in code.
    #[test]
    fn keys_are_those_of_the_extractors() {
        let requests = [
            request("10.0.0.2:1", &[("x-forwarded-for", "203.0.113.7")], "/a"),
            request("[2001:db8:1:2::9]:1", &[("x-api-key", "k1")], "/b"),
            request(
                "198.51.100.1:1",
                &[("x-api-key", "k2"), ("x-forwarded-for", "2001:db8::1")],
                "/",
            ),
        ];
        let forwarded = ForwardedIp::from_strs(["10.0.0.0/8"]).unwrap();
        let cases: Vec<(&str, Box<dyn KeyExtractor>)> = vec![
            ("\"global\"", Box::new(crate::key::GlobalKey)),
            ("\"peer_ip\"", Box::new(PeerIp::new())),
            ("{ peer_ip = { ipv6_prefix = 48 } }", Box::new(PeerIp::new().ipv6_prefix(48))),
            ("\"path\"", Box::new(PathKey)),
            ("{ header = \"X-Api-Key\" }", Box::new(HeaderKey::from_static("x-api-key"))),
            (
                "{ forwarded_ip = { trusted = [\"10.0.0.0/8\"], header = \"x_forwarded_for\", ipv6_prefix = 128 } }",
                Box::new(forwarded.clone().ipv6_prefix(128)),
            ),
            (
                "{ or = [{ header = \"x-api-key\" }, { forwarded_ip = { trusted = [\"10.0.0.0/8\"] } }] }",
                Box::new(HeaderKey::from_static("x-api-key").or(forwarded.clone())),
            ),
            (
                "{ and = [{ header = \"x-api-key\" }, \"path\", \"peer_ip\"] }",
                Box::new(HeaderKey::from_static("x-api-key").and(PathKey).and(PeerIp::new())),
            ),
            (
                "{ or = [{ and = [{ header = \"x-api-key\" }, \"path\"] }, \"peer_ip\"] }",
                Box::new(HeaderKey::from_static("x-api-key").and(PathKey).or(PeerIp::new())),
            ),
        ];
        for (text, code) in cases {
            let from_file = key_of(text).build().unwrap();
            for req in &requests {
                let want = code.extract(req).map(|k| k.as_bytes().to_vec());
                let got = from_file.extract(req).map(|k| k.as_bytes().to_vec());
                assert_eq!(got, want, "{text}");
            }
            // And the keys a client's value is counted under (issue 35), errors included.
            for value in ["k1", "203.0.113.7", "2001:db8:1:2::9", "/a", "", "a\nb"] {
                let want = code.keys_for(value.as_bytes());
                let got = from_file.keys_for(value.as_bytes());
                assert_eq!(got, want, "{text}: {value:?}");
            }
        }
    }
}
