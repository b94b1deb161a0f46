//! What is blocked now: [`Blocked`], one key refused until a time by a
//! [block](crate::Limiter::block) or a lockout, and the [`Listing`] future of
//! [`Limiter::blocked`](crate::Limiter::blocked), which fails with an [`AdminError::Listing`].

use std::future::Future;
use std::pin::Pin;
use std::time::SystemTime;

use crate::error::AdminError;
use crate::key::Key;

/// A key blocked now: by [`Limiter::block`](crate::Limiter::block) (or a layer's
/// [`block_value`](crate::LimitLayer::block_value)), or locked out by a limit's lockout
/// after a refusal. Listed by [`Limiter::blocked`](crate::Limiter::blocked) and
/// [`LimitLayer::blocked`](crate::LimitLayer::blocked), soonest end first.
///
/// Its `Debug` shows the key's tag and length only, never its bytes (keys can be
/// secrets such as API keys), as [`Key`]'s does.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = PeriodConfig::new(60, Duration::from_secs(60));
/// let layer = LimitLayer::builder(&Backend::in_process(), config)
///     .name("api")
///     .key(HeaderKey::from_static("x-api-key"))
///     .build()?;
/// layer.block_value("trap", Duration::from_secs(3_600)).await?;
/// let blocked = layer.blocked(100).await?;
/// assert_eq!(blocked[0].limit, "api");
/// assert_eq!(blocked[0].key, "hdr:x-api-key:trap");
/// assert_eq!(blocked[0].value.as_ref().unwrap(), "trap");
/// assert!(blocked[0].until > SystemTime::now() + Duration::from_secs(3_500));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Blocked {
    /// The name of the limit that refuses the key: its policy name (`api`; a plan's
    /// `api.free`; a [set](crate::LimitSet)'s own name, whose block refuses every limit of
    /// the set).
    pub limit: String,
    /// The key the limit counts, tag and all (`hdr:x-api-key:trap`): what
    /// [`Limiter::reset`](crate::Limiter::reset) lifts.
    pub key: Key<'static>,
    /// The client's value the key was made from (`trap`), when the listing came through
    /// a layer whose extractor names it ([`LimitLayer::blocked`](crate::LimitLayer::blocked));
    /// `None` from a limiter alone, or when the extractor cannot say
    /// ([`KeyExtractor::keys_for`](crate::key::KeyExtractor::keys_for)).
    pub value: Option<Key<'static>>,
    /// When the block ends.
    pub until: SystemTime,
}

impl Blocked {
    /// `key` of the limit `limit`, blocked until `until`, its value unknown: for a
    /// [`Limiter`](crate::Limiter) of your own that lists its blocks.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use tower_redis_ratelimit::Blocked;
    ///
    /// let until = SystemTime::now() + Duration::from_secs(60);
    /// let blocked = Blocked::new("api", "fn:trap", until);
    /// assert_eq!(blocked.key, "fn:trap");
    /// assert_eq!(blocked.value, None);
    /// ```
    #[must_use]
    pub fn new(limit: impl Into<String>, key: impl Into<Key<'static>>, until: SystemTime) -> Self {
        Self {
            limit: limit.into(),
            key: key.into(),
            value: None,
            until,
        }
    }

    /// This entry with the client's `value` (see [`value`](Self::value)).
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use tower_redis_ratelimit::Blocked;
    ///
    /// let blocked = Blocked::new("api", "fn:trap", SystemTime::now()).with_value("trap");
    /// assert_eq!(blocked.value.unwrap(), "trap");
    /// ```
    #[must_use]
    pub fn with_value(mut self, value: impl Into<Key<'static>>) -> Self {
        self.value = Some(value.into());
        self
    }
}

/// The answer of [`Limiter::blocked`](crate::Limiter::blocked): a future of the keys
/// blocked now, soonest end first, or an [`AdminError::Listing`] when the store of the
/// list did not answer.
pub(crate) type Listing =
    Pin<Box<dyn Future<Output = Result<Vec<Blocked>, AdminError>> + Send + 'static>>;

/// The entries of every one of `listings`, soonest end first, at most `max` (the first
/// error, if any of them fails), each key once: a key listed by several (a block
/// written under every plan of a layer) keeps its latest end, and the limit that
/// listed that.
pub(crate) fn merged(listings: Vec<Listing>, max: usize) -> Listing {
    Box::pin(async move {
        let mut all: Vec<Blocked> = Vec::new();
        for listing in listings {
            for entry in listing.await? {
                match all.iter_mut().find(|seen| seen.key == entry.key) {
                    Some(seen) if seen.until < entry.until => *seen = entry,
                    Some(_) => {}
                    None => all.push(entry),
                }
            }
        }
        sort(&mut all);
        all.truncate(max);
        Ok(all)
    })
}

/// Sorts `entries` soonest end first (then by limit and key: one order for the same
/// entries, whichever store listed them).
pub(crate) fn sort(entries: &mut [Blocked]) {
    entries.sort_by(|a, b| {
        (a.until, &a.limit, a.key.as_bytes()).cmp(&(b.until, &b.limit, b.key.as_bytes()))
    });
}
