//! Keys from the request itself: [`GlobalKey`], [`HeaderKey`], [`ExtensionKey`],
//! [`PathKey`] and `MatchedPathKey` (feature `axum`).

use super::value;
use super::*;

/// One key for all requests: a single limit shared by everybody.
///
/// The key is the constant `global`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalKey;

impl GlobalKey {
    /// The key every request gets.
    pub const KEY: &'static str = "global";

    /// Creates the extractor.
    pub const fn new() -> Self {
        Self
    }
}

impl KeyExtractor for GlobalKey {
    fn extract<'r>(&self, _parts: &'r Parts) -> Option<Key<'r>> {
        Some(Key::borrowed(Self::KEY.as_bytes()))
    }

    fn shortest_key(&self) -> Option<usize> {
        Some(Self::KEY.len())
    }

    /// Always [`KeyForError::Shared`]: every request is counted under the one key
    /// `global`, so no client's value names it, and acting on it would act on everybody
    /// (in an [`or`](KeyExtractor::or), this branch names no key). See
    /// [`KeyExtractor::keys_for`].
    ///
    /// # Errors
    ///
    /// Always [`KeyForError::Shared`].
    ///
    /// ```
    /// use tower_redis_ratelimit::key::{GlobalKey, KeyForError, KeyExtractor};
    ///
    /// assert_eq!(GlobalKey.keys_for(b"carol"), Err(KeyForError::Shared));
    /// ```
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        let _ = value;
        Err(KeyForError::Shared)
    }

    fn origin(&self) -> KeyOrigin {
        KeyOrigin::Client
    }
}

/// The value of a request header, e.g. an API key; the key is `hdr:`, the
/// header name, `:`, and the value.
///
/// Only the first line of the header is used. `None` when the header is
/// missing or empty. The value's bytes are used as they are, whether UTF-8
/// or not: different values are always different keys.
///
/// The key holds the raw header value: for secrets such as API keys, consider
/// hashing keys before they reach shared storage.
///
/// ```
/// use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::from_static("x-api-key");
/// let (req, ()) = http::Request::builder()
///     .header("x-api-key", http::HeaderValue::from_bytes(b"k\xff")?)
///     .body(())?
///     .into_parts();
/// assert_eq!(key.extract(&req).unwrap(), b"hdr:x-api-key:k\xff");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Creates the extractor for the header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }

    /// Creates the extractor for a header name known at compile time.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid, lowercase header name (see
    /// [`HeaderName::from_static`]).
    pub const fn from_static(name: &'static str) -> Self {
        Self {
            name: HeaderName::from_static(name),
        }
    }
}

impl KeyExtractor for HeaderKey {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let value = parts.headers.get(&self.name)?;
        if value.is_empty() {
            return None;
        }
        Some(Key::concat(&[
            b"hdr:",
            self.name.as_str().as_bytes(),
            b":",
            value.as_bytes(),
        ]))
    }

    /// `hdr:<name>:` and one byte.
    fn shortest_key(&self) -> Option<usize> {
        Some("hdr:".len() + self.name.as_str().len() + ":".len() + 1)
    }

    /// The key of a request whose header carries `value` (an API key, say):
    /// `hdr:`, the header name, `:` and the value's bytes. See
    /// [`KeyExtractor::keys_for`].
    ///
    /// # Errors
    ///
    /// [`KeyForError::Unreachable`] for an empty value (a request with an empty header
    /// has no key) and for bytes no header value can hold (control characters such as a
    /// line feed).
    ///
    /// ```
    /// use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor};
    ///
    /// let key = HeaderKey::from_static("x-api-key");
    /// assert_eq!(key.keys_for(b"trap")?, ["hdr:x-api-key:trap"]);
    /// assert!(key.keys_for(b"a\nb").is_err());
    /// # Ok::<(), tower_redis_ratelimit::key::KeyForError>(())
    /// ```
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        value::non_empty(value, "HeaderKey")?;
        if http::HeaderValue::from_bytes(value).is_err() {
            return Err(KeyForError::Unreachable {
                extractor: "HeaderKey",
                reason: "a header value cannot hold these bytes (control characters)",
            });
        }
        Ok(vec![Key::concat(&[
            b"hdr:",
            self.name.as_str().as_bytes(),
            b":",
            value,
        ])])
    }

    fn origin(&self) -> KeyOrigin {
        KeyOrigin::Client
    }
}

/// A value an earlier layer (e.g. authentication) put into the request
/// extensions, such as a user or tenant id.
///
/// The key is `ext:`, the extractor's [tag](Self::tag) (empty by default),
/// `:`, and the value's [`Display`](fmt::Display) output. `None` when the
/// extension is missing or displays as an empty string. The layer that
/// inserts the value must run before the rate limiter. When you combine
/// extractors of several extension types, give each a tag of its own, so that
/// user `42` and tenant `42` never share a key.
///
/// # Example
///
/// ```
/// use tower_redis_ratelimit::key::{ExtensionKey, KeyExtractor};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// impl std::fmt::Display for UserId {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "user-{}", self.0)
///     }
/// }
///
/// let key = ExtensionKey::<UserId>::new();
/// let (mut req, ()) = http::Request::new(()).into_parts();
/// assert_eq!(key.extract(&req), None);
/// req.extensions.insert(UserId(42));
/// assert_eq!(key.extract(&req).unwrap(), "ext::user-42");
/// assert_eq!(key.tag("user").extract(&req).unwrap(), "ext:user:user-42");
/// ```
pub struct ExtensionKey<T> {
    tag: &'static str,
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// Creates the extractor, with an empty tag.
    pub const fn new() -> Self {
        Self {
            tag: "",
            _marker: PhantomData,
        }
    }

    /// Tags the keys: `ext:<tag>:<value>`, to keep extractors of several
    /// extension types apart.
    ///
    /// # Panics
    ///
    /// When `tag` contains a `:` (which would make keys ambiguous).
    #[must_use]
    pub const fn tag(mut self, tag: &'static str) -> Self {
        let bytes = tag.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            assert!(
                bytes[i] != b':',
                "an `ExtensionKey` tag must not contain `:`"
            );
            i += 1;
        }
        self.tag = tag;
        self
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ExtensionKey<T> {}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ExtensionKey<{}>({:?})",
            std::any::type_name::<T>(),
            self.tag
        )
    }
}

impl<T> KeyExtractor for ExtensionKey<T>
where
    T: fmt::Display + Send + Sync + 'static,
{
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let value = parts.extensions.get::<T>()?;
        let mut key = Key::concat(&[b"ext:", self.tag.as_bytes(), b":"]);
        let tagged = key.len();
        write!(Writer(&mut key), "{value}").ok()?;
        (key.len() > tagged).then_some(key)
    }

    /// The key of a request whose extension displays as `value` (a user id, say):
    /// `ext:`, the [tag](Self::tag), `:` and the value. See [`KeyExtractor::keys_for`].
    ///
    /// # Errors
    ///
    /// [`KeyForError::Unreachable`] for an empty value (an extension that displays as
    /// nothing is no key) and for bytes that are not UTF-8 (`Display` writes text).
    ///
    /// ```
    /// use tower_redis_ratelimit::key::{ExtensionKey, KeyExtractor};
    ///
    /// let key = ExtensionKey::<String>::new().tag("user");
    /// assert_eq!(key.keys_for(b"carol")?, ["ext:user:carol"]);
    /// # Ok::<(), tower_redis_ratelimit::key::KeyForError>(())
    /// ```
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        value::non_empty(value, "ExtensionKey")?;
        value::text(value, "ExtensionKey", "`Display` writes UTF-8 text")?;
        Ok(vec![Key::concat(&[
            b"ext:",
            self.tag.as_bytes(),
            b":",
            value,
        ])])
    }
}

/// The request path (without the query string), e.g. `/users/42`; the key is
/// `path:` and the path.
///
/// `None` for requests without a path (such as
/// `CONNECT host:port`). Every distinct path gets its own limit; to limit per
/// route rather than per concrete path, use `MatchedPathKey` (feature
/// `axum`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathKey;

impl PathKey {
    /// Creates the extractor.
    pub const fn new() -> Self {
        Self
    }
}

impl KeyExtractor for PathKey {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let path = parts.uri.path();
        (!path.is_empty()).then(|| Key::concat(&[b"path:", path.as_bytes()]))
    }

    /// The key of a request for the path `value`: `path:` and the path. See
    /// [`KeyExtractor::keys_for`].
    ///
    /// # Errors
    ///
    /// [`KeyForError::Unreachable`] for anything that is not a request path by itself
    /// (`/users/42`, or `*`): an empty value, a query string, a host.
    ///
    /// ```
    /// use tower_redis_ratelimit::key::{PathKey, KeyExtractor};
    ///
    /// assert_eq!(PathKey.keys_for(b"/users/42")?, ["path:/users/42"]);
    /// assert!(PathKey.keys_for(b"/users?id=42").is_err());
    /// # Ok::<(), tower_redis_ratelimit::key::KeyForError>(())
    /// ```
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        value::non_empty(value, "PathKey")?;
        let not_a_path = KeyForError::Unreachable {
            extractor: "PathKey",
            reason: "it is not a request path",
        };
        match http::Uri::try_from(value) {
            Ok(uri) if uri.path().as_bytes() == value => Ok(vec![Key::concat(&[b"path:", value])]),
            _ => Err(not_a_path),
        }
    }

    fn origin(&self) -> KeyOrigin {
        KeyOrigin::Client
    }
}

/// axum's matched route template, e.g. `/users/{id}`: one limit per route;
/// the key is `route:` and the template.
///
/// Read from axum's `MatchedPath` request extension, which the router
/// inserts before running route layers and handlers; `None` when it is
/// absent (e.g. when the rate limiter wraps the whole router rather than
/// being added with `route_layer`, or for unmatched requests).
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatchedPathKey;

#[cfg(feature = "axum")]
impl MatchedPathKey {
    /// Creates the extractor.
    pub const fn new() -> Self {
        Self
    }
}

#[cfg(feature = "axum")]
impl KeyExtractor for MatchedPathKey {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .map(|path| Key::concat(&[b"route:", path.as_str().as_bytes()]))
    }

    /// The key of requests matched by the route template `value`: `route:` and the
    /// template. See [`KeyExtractor::keys_for`].
    ///
    /// # Errors
    ///
    /// [`KeyForError::Unreachable`] for a value that is not a route (text starting with
    /// `/`).
    ///
    /// ```
    /// use tower_redis_ratelimit::key::{MatchedPathKey, KeyExtractor};
    ///
    /// assert_eq!(MatchedPathKey.keys_for(b"/users/{id}")?, ["route:/users/{id}"]);
    /// # Ok::<(), tower_redis_ratelimit::key::KeyForError>(())
    /// ```
    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        let reason = "a route is text starting with `/`";
        let route = value::text(value, "MatchedPathKey", reason)?;
        if !route.starts_with('/') {
            return Err(KeyForError::Unreachable {
                extractor: "MatchedPathKey",
                reason,
            });
        }
        Ok(vec![Key::concat(&[b"route:", value])])
    }
}
