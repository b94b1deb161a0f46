//! [`TaggedKey`]: a key split into the tag of the built-in extractor that made it and the
//! value that extractor found.

use std::fmt;

/// A rate-limit key seen as the [tag](super#tags) of the built-in extractor that made it
/// and the value that extractor found: `hdr:x-merchant-id:acme` is the tag
/// `hdr:x-merchant-id` and the value `acme`, `ext:merchant:42` the tag `ext:merchant` and
/// the value `42`. It borrows the key: nothing is copied or allocated.
///
/// What [`LimitSource`](crate::LimitSource)s are asked with, so that a source
/// looks up the merchant or user the extractor found, without knowing the crate's key
/// format.
///
/// | key | [`tag`](Self::tag) | [`value`](Self::value) |
/// |---|---|---|
/// | `ip:192.0.2.7` | `ip` | `192.0.2.7` |
/// | `hdr:x-api-key:k1` | `hdr:x-api-key` | `k1` |
/// | `ext:merchant:acme`, `ext::42` | `ext:merchant`, `ext:` | `acme`, `42` |
/// | `path:/users`, `route:/users/{id}` | `path`, `route` | `/users`, `/users/{id}` |
/// | `fn:acme` (a closure's key) | `fn` | `acme` |
/// | `and:16:hdr:x-api-key:k1:path:/` | `and` | `hdr:x-api-key:k1:path:/`; see [`parts`](Self::parts) |
/// | `global`, a [`MissingKey::Key`](crate::MissingKey::Key) constant, a key of your own extractor | empty | the whole key |
///
/// A key of an extractor of your own is returned whole, as your extractor made it,
/// unless it starts like a built-in one (`ip:`, `hdr:…:`, `ext:…:`, `path:`, `route:`,
/// `fn:`, `and:<length>:`): give your keys a tag of your own.
///
/// ```
/// use tower_redis_ratelimit::key::{ExtensionKey, HeaderKey, KeyExtractor, TaggedKey};
///
/// let (req, ()) = http::Request::builder().header("x-merchant-id", "acme").body(())?.into_parts();
/// let key = HeaderKey::from_static("x-merchant-id").extract(&req).unwrap();
/// let tagged = TaggedKey::parse(&key);
/// assert_eq!(tagged.tag(), b"hdr:x-merchant-id");
/// assert_eq!(tagged.value(), b"acme");
/// assert_eq!(tagged.as_bytes(), b"hdr:x-merchant-id:acme");
///
/// let pair = TaggedKey::parse(b"and:10:ip:1.2.3.4:path:/pay");
/// let (first, second) = pair.parts().unwrap();
/// assert_eq!((first.value(), second.value()), (&b"1.2.3.4"[..], &b"/pay"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaggedKey<'a> {
    key: &'a [u8],
    /// Where the tag ends (0: no tag).
    tag_end: usize,
    /// Where the value starts (0: the whole key).
    value_start: usize,
}

/// Tags followed directly by the value.
const SIMPLE: [&[u8]; 4] = [b"ip:", b"path:", b"route:", b"fn:"];

impl<'a> TaggedKey<'a> {
    /// Splits `key` into its tag and value (see the table above). Never fails: a key
    /// without a built-in tag is all value.
    #[must_use]
    pub fn parse(key: &'a [u8]) -> Self {
        let untagged = Self {
            key,
            tag_end: 0,
            value_start: 0,
        };
        let tagged = |colon: usize| Self {
            key,
            tag_end: colon,
            value_start: colon + 1,
        };
        if let Some(tag) = SIMPLE.iter().find(|tag| key.starts_with(tag)) {
            return tagged(tag.len() - 1);
        }
        // `hdr:<name>:`, `ext:<tag>:`, `and:<length>:`: the second `:` ends the tag.
        for (prefix, digits) in [(&b"hdr:"[..], false), (b"ext:", false), (b"and:", true)] {
            let Some(rest) = key.strip_prefix(prefix) else {
                continue;
            };
            let Some(colon) = rest.iter().position(|&b| b == b':') else {
                return untagged;
            };
            if digits && (colon == 0 || !rest[..colon].iter().all(u8::is_ascii_digit)) {
                return untagged;
            }
            if digits {
                // `and`'s tag is `and`; its value is the pair, length and all removed.
                return Self {
                    key,
                    tag_end: 3,
                    value_start: prefix.len() + colon + 1,
                };
            }
            return tagged(prefix.len() + colon);
        }
        untagged
    }

    /// The whole key, as the extractor made it and as it is counted under.
    #[must_use]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.key
    }

    /// The tag of the built-in extractor that made the key (`ip`, `hdr:x-api-key`,
    /// `ext:merchant`, `and`, ...), without its last `:`; empty for a key without one.
    #[must_use]
    pub fn tag(&self) -> &'a [u8] {
        &self.key[..self.tag_end]
    }

    /// What the extractor found: the header's value, the extension's `Display`, the
    /// address, the path, a closure's bytes; the whole key when it has no tag.
    #[must_use]
    pub fn value(&self) -> &'a [u8] {
        &self.key[self.value_start..]
    }

    /// The two keys of an [`and`](super::KeyExtractor::and) key, each split in turn;
    /// `None` for any other key.
    #[must_use]
    pub fn parts(&self) -> Option<(TaggedKey<'a>, TaggedKey<'a>)> {
        if self.tag() != b"and" {
            return None;
        }
        let length = &self.key[4..self.value_start - 1];
        let length: usize = std::str::from_utf8(length).ok()?.parse().ok()?;
        let pair = self.value();
        if pair.len() <= length || pair[length] != b':' {
            return None;
        }
        Some((
            Self::parse(&pair[..length]),
            Self::parse(&pair[length + 1..]),
        ))
    }
}

/// Shows the tag and the value's length, never the value (it may be an API key).
impl fmt::Debug for TaggedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TaggedKey(\"{}\", {} bytes)",
            self.tag().escape_ascii(),
            self.value().len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(key: &[u8]) -> (&[u8], &[u8]) {
        let tagged = TaggedKey::parse(key);
        (tagged.tag(), tagged.value())
    }

    #[test]
    fn every_built_in_tag_comes_off() {
        assert_eq!(split(b"ip:192.0.2.7"), (&b"ip"[..], &b"192.0.2.7"[..]));
        assert_eq!(
            split(b"ip:2001:db8::/64"),
            (&b"ip"[..], &b"2001:db8::/64"[..])
        );
        assert_eq!(
            split(b"hdr:x-api-key:a:b"),
            (&b"hdr:x-api-key"[..], &b"a:b"[..])
        );
        assert_eq!(split(b"ext::42"), (&b"ext:"[..], &b"42"[..]));
        assert_eq!(
            split(b"ext:merchant:acme"),
            (&b"ext:merchant"[..], &b"acme"[..])
        );
        assert_eq!(split(b"path:/a"), (&b"path"[..], &b"/a"[..]));
        assert_eq!(split(b"route:/a/{id}"), (&b"route"[..], &b"/a/{id}"[..]));
        assert_eq!(split(b"fn:acme"), (&b"fn"[..], &b"acme"[..]));
        assert_eq!(split(b"fn:"), (&b"fn"[..], &b""[..]));
        assert_eq!(split(b"and:4:ip:1:fn:x"), (&b"and"[..], &b"ip:1:fn:x"[..]));
        let (a, b) = TaggedKey::parse(b"and:4:ip:1:fn:x").parts().unwrap();
        assert_eq!((a.tag(), a.value()), (&b"ip"[..], &b"1"[..]));
        assert_eq!((b.tag(), b.value()), (&b"fn"[..], &b"x"[..]));
    }

    #[test]
    fn other_keys_are_all_value() {
        for key in [
            &b"global"[..],
            b"anonymous",
            b"tenant:acme",
            b"hdr:no-second-colon",
            b"ext:none",
            b"and:x:y",
            b"and::y",
            b"",
        ] {
            assert_eq!(split(key), (&b""[..], key));
            assert!(TaggedKey::parse(key).parts().is_none());
        }
        // A length that does not fit is no pair.
        assert!(TaggedKey::parse(b"and:40:ip:1").parts().is_none());
        assert!(TaggedKey::parse(b"ip:1").parts().is_none());
        assert_eq!(
            format!("{:?}", TaggedKey::parse(b"hdr:x-api-key:secret")),
            "TaggedKey(\"hdr:x-api-key\", 6 bytes)"
        );
    }
}
