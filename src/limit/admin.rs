//! Admin actions by the client's value: a [`LimitLayer`]'s peek, reset, block, unblock and refund
//! of the keys its own extractor counts a value under ([`KeyExtractor::keys_for`]).

use std::num::NonZeroU32;
use std::time::Duration;

use super::LimitLayer;
use crate::blocked::Blocked;
use crate::decision::Decision;
use crate::denied::Denied;
use crate::error::AdminError;
use crate::key::{Key, KeyExtractor, KeyForError};
use crate::limiter::{DecisionFuture, Limiter};

impl From<KeyForError> for AdminError {
    fn from(error: KeyForError) -> Self {
        Self::Key(error)
    }
}

/// How many `:` of a blocked key [`LimitLayer::blocked`] tries a value after, at most:
/// tags end at the first two (`hdr:x-api-key:`, `ext:user:`), an `and:` pair names no
/// value; the bound keeps a key of many `:` from costing many resolutions.
const VALUE_STARTS: usize = 8;

/// Admin actions on what the operator knows: the client's value (its API key, user id,
/// address), resolved through this layer's own extractor to the key(s) it counts the
/// value under ([`KeyExtractor::keys_for`]), then the [`Limiter`]'s action on each.
///
/// Each action answers one `(key, decision)` per key, in the order of
/// [`keys_for`](Self::keys_for): one for most extractors, one per branch that can count
/// the value for an [`or`](crate::key::KeyExtractor::or) (every one is acted on). A
/// value no branch could ever count is an [`AdminError`], never an action on a key no
/// request is counted under. These act on every limit of the layer as the [`Limiter`]
/// methods of the same name do: a set's members, and every plan of a
/// [`Plans`](super::Plans) layer (a key's plan is not known from its value): `reset`,
/// `block` and `unblock` act under each plan, `peek` answers each plan's standing (one
/// entry per key per plan, in the order of the plans), and `refund`, which would give
/// the units back twice to a key that spent under two plans, needs the plan named
/// ([`refund_value_in`](Self::refund_value_in)).
impl<L: Limiter, K, C, R> LimitLayer<L, K, C, R> {
    /// The keys this layer counts a request carrying `value` under, exactly as its
    /// extractor would make them from such a request; see [`KeyExtractor::keys_for`].
    /// Keys longer than the layer's [`max_key_len`](super::LayerBuilder::max_key_len)
    /// are left out: the layer never counts them.
    ///
    /// # Errors
    ///
    /// A [`KeyForError`] when the extractor never counts `value`, or cannot say
    /// ([`KeyForError::TooLong`] when its every key is too long for the layer).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{
    ///     key::{HeaderKey, KeyExtractor, PeerIp}, Backend, LimitLayer, PeriodConfig,
    /// };
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(60, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
    ///     .build()?;
    /// assert_eq!(layer.keys_for("trap")?, ["hdr:x-api-key:trap"]);
    /// // An address sent as an API key is counted under the header's key.
    /// assert_eq!(
    ///     layer.keys_for("203.0.113.7")?,
    ///     ["hdr:x-api-key:203.0.113.7", "ip:203.0.113.7"]
    /// );
    /// # Ok(()) }
    /// ```
    pub fn keys_for(&self, value: impl AsRef<[u8]>) -> Result<Vec<Key<'static>>, KeyForError>
    where
        K: KeyExtractor,
    {
        crate::key::fitting(
            self.extractor().keys_for(value.as_ref())?,
            self.max_key_len(),
        )
    }

    /// What a check of `cost` by the client with `value` would answer now, spending
    /// nothing ([`Limiter::peek`]), for each key of [`keys_for`](Self::keys_for): on a
    /// [`Plans`](super::Plans) layer, under each plan in turn (the first plan's entries,
    /// then the next plan's), each entry's `limit` that plan's.
    ///
    /// # Errors
    ///
    /// [`AdminError::Key`] when the layer never counts `value`;
    /// [`AdminError::Unsupported`] when its limiter cannot peek.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(60, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     .build()?;
    /// let standing = layer.peek_value("trap", NonZeroU32::MIN).await?;
    /// assert_eq!(standing[0].0, "hdr:x-api-key:trap");
    /// // Nothing spent yet: a check would admit, leaving 59.
    /// assert!(standing[0].1.is_admitted());
    /// assert_eq!(standing[0].1.remaining, 59);
    /// # Ok(()) }
    /// ```
    pub async fn peek_value(
        &self,
        value: impl AsRef<[u8]>,
        cost: NonZeroU32,
    ) -> Result<Vec<(Key<'static>, Decision)>, AdminError>
    where
        K: KeyExtractor,
    {
        let mut answers = Vec::new();
        for index in 0..self.limiter().policies().len() {
            answers.extend(self.peek_value_at(index, value.as_ref(), cost).await?);
        }
        Ok(answers)
    }

    /// [`peek_value`](Self::peek_value) under the policy at `index` alone.
    pub(crate) async fn peek_value_at(
        &self,
        index: usize,
        value: &[u8],
        cost: NonZeroU32,
    ) -> Result<Vec<(Key<'static>, Decision)>, AdminError>
    where
        K: KeyExtractor,
    {
        let limiter = self.limiter();
        self.act(value, "peek", |key| limiter.peek_policy(index, key, cost))
            .await
    }

    /// Forgets the keys of the client with `value` ([`Limiter::reset`]): its count
    /// starts afresh and a block is lifted, on every instance sharing the store (on
    /// Redis, within about a round trip of the reset, or the deny cache's max age while
    /// an instance's change subscription is down: see [`Limiter::reset`]).
    ///
    /// # Errors
    ///
    /// [`AdminError::Key`] when the layer never counts `value` (nothing is reset);
    /// [`AdminError::Unsupported`] when its limiter cannot reset.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(60, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     .build()?;
    /// layer.block_value("trap", Duration::from_secs(3600)).await?;
    /// let reset = layer.reset_value("trap").await?;
    /// assert_eq!(reset[0].0, "hdr:x-api-key:trap");
    /// assert!(reset[0].1.is_admitted());
    /// # Ok(()) }
    /// ```
    pub async fn reset_value(
        &self,
        value: impl AsRef<[u8]>,
    ) -> Result<Vec<(Key<'static>, Decision)>, AdminError>
    where
        K: KeyExtractor,
    {
        let limiter = self.limiter();
        self.act(value.as_ref(), "reset", |key| limiter.reset(key))
            .await
    }

    /// Refuses the client with `value` for `duration` ([`Limiter::block`]), whatever
    /// its limit says, on every instance sharing the store; a later block replaces it
    /// and [`unblock_value`](Self::unblock_value) (or
    /// [`reset_value`](Self::reset_value), which forgets the count too) lifts it (on Redis, each within about a
    /// round trip on every instance, or the deny cache's max age while an instance's
    /// change subscription is down: see [`Limiter::block`]).
    ///
    /// # Errors
    ///
    /// [`AdminError::Key`] when the layer never counts `value` (nothing is blocked);
    /// [`AdminError::Unsupported`] when its limiter cannot block.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(60, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     .build()?;
    /// let blocked = layer.block_value("trap", Duration::from_secs(3600)).await?;
    /// assert!(!blocked[0].1.is_admitted());
    /// # Ok(()) }
    /// ```
    pub async fn block_value(
        &self,
        value: impl AsRef<[u8]>,
        duration: Duration,
    ) -> Result<Vec<(Key<'static>, Decision)>, AdminError>
    where
        K: KeyExtractor,
    {
        let limiter = self.limiter();
        self.act(value.as_ref(), "block", |key| limiter.block(key, duration))
            .await
    }

    /// Lifts the block of the client with `value` ([`Limiter::unblock`]), keeping what
    /// its limits have counted, on every instance sharing the store (as
    /// [`block_value`](Self::block_value) reaches them).
    ///
    /// # Errors
    ///
    /// [`AdminError::Key`] when the layer never counts `value`;
    /// [`AdminError::Unsupported`] when its limiter cannot unblock.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, Limiter, PeriodConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(60, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     .build()?;
    /// layer.limiter().check(b"hdr:x-api-key:trap", NonZeroU32::MIN).await;
    /// layer.block_value("trap", Duration::from_secs(3600)).await?;
    /// let unblocked = layer.unblock_value("trap").await?;
    /// // Admitted again, its one request still counted.
    /// assert!(unblocked[0].1.is_admitted());
    /// assert_eq!(unblocked[0].1.remaining, 59);
    /// # Ok(()) }
    /// ```
    pub async fn unblock_value(
        &self,
        value: impl AsRef<[u8]>,
    ) -> Result<Vec<(Key<'static>, Decision)>, AdminError>
    where
        K: KeyExtractor,
    {
        let limiter = self.limiter();
        self.act(value.as_ref(), "unblock", |key| limiter.unblock(key))
            .await
    }

    /// Gives `cost` units back to the client with `value` ([`Limiter::refund`]), on
    /// each of its keys.
    ///
    /// # Errors
    ///
    /// [`AdminError::Policy`] on a layer of several policies (a
    /// [`Plans`](super::Plans) layer: name the plan with
    /// [`refund_value_in`](Self::refund_value_in));
    /// [`AdminError::Key`] when the layer never counts `value`;
    /// [`AdminError::Unsupported`] when its limiter cannot refund.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, Limiter, PeriodConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(60, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     .build()?;
    /// layer.limiter().check(b"hdr:x-api-key:trap", NonZeroU32::MIN).await;
    /// let refunded = layer.refund_value("trap", NonZeroU32::MIN).await?;
    /// assert_eq!(refunded[0].1.remaining, 60);
    /// # Ok(()) }
    /// ```
    pub async fn refund_value(
        &self,
        value: impl AsRef<[u8]>,
        cost: NonZeroU32,
    ) -> Result<Vec<(Key<'static>, Decision)>, AdminError>
    where
        K: KeyExtractor,
    {
        let names = self.policy_names();
        if names.len() > 1 {
            return Err(AdminError::Policy {
                given: None,
                policies: names,
            });
        }
        self.refund_value_at(0, value.as_ref(), cost).await
    }

    /// [`refund_value`](Self::refund_value) under the policy named `policy` (`api.pro`):
    /// on a [`Plans`](super::Plans) layer, the plan whose keys spent the units (a key's
    /// plan cannot be known from its value, and a key that changed plans has spent
    /// under both).
    ///
    /// # Errors
    ///
    /// [`AdminError::Policy`] when the layer has no policy of that name; as
    /// [`refund_value`](Self::refund_value) otherwise.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{
    ///     key::HeaderKey, limit::Plans, AdminError, Backend, LimitLayer, PeriodConfig,
    /// };
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let minute = Duration::from_secs(60);
    /// let plans = Plans::new(|_: &http::request::Parts| None::<&str>)
    ///     .plan("free", "free", PeriodConfig::new(60, minute))
    ///     .plan("pro", "pro", PeriodConfig::new(600, minute));
    /// let layer = LimitLayer::builder(&Backend::in_process(), plans)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     .build()?;
    /// // Which plan? A refund does not guess.
    /// let error = layer.refund_value("k_pro1", NonZeroU32::MIN).await.unwrap_err();
    /// assert!(matches!(error, AdminError::Policy { .. }));
    /// let refunded = layer.refund_value_in("api.pro", "k_pro1", NonZeroU32::MIN).await?;
    /// assert_eq!(refunded[0].1.limit, 600);
    /// # Ok(()) }
    /// ```
    pub async fn refund_value_in(
        &self,
        policy: &str,
        value: impl AsRef<[u8]>,
        cost: NonZeroU32,
    ) -> Result<Vec<(Key<'static>, Decision)>, AdminError>
    where
        K: KeyExtractor,
    {
        let index = self.policy_index(policy)?;
        self.refund_value_at(index, value.as_ref(), cost).await
    }

    /// [`refund_value`](Self::refund_value) under the policy at `index`.
    async fn refund_value_at(
        &self,
        index: usize,
        value: &[u8],
        cost: NonZeroU32,
    ) -> Result<Vec<(Key<'static>, Decision)>, AdminError>
    where
        K: KeyExtractor,
    {
        let limiter = self.limiter();
        self.act(value, "refund", |key| {
            limiter.refund_policy(index, key, cost)
        })
        .await
    }

    /// The names of the layer's policies, default first.
    pub(crate) fn policy_names(&self) -> Vec<String> {
        let policies = self.limiter().policies().iter();
        policies.map(|policy| policy.name().to_owned()).collect()
    }

    /// The index of the policy named `policy`.
    pub(crate) fn policy_index(&self, policy: &str) -> Result<usize, AdminError> {
        let policies = self.limiter().policies();
        policies
            .iter()
            .position(|p| p.name() == policy)
            .ok_or_else(|| AdminError::Policy {
                given: Some(policy.to_owned()),
                policies: self.policy_names(),
            })
    }

    /// The keys this layer's limiter refuses now because of a block or a lockout
    /// ([`Limiter::blocked`]), soonest end first, at most `max`, each with the client's
    /// value it was made from when the layer's extractor names it: the value whose
    /// [`keys_for`](Self::keys_for) gives the key (`trap` for `hdr:x-api-key:trap`,
    /// `carol` for `ext:user:carol`, `2001:db8:1:2::/64` for an IPv6 client's
    /// `ip:2001:db8:1:2::/64`; `None` for a key no value of this layer gives, such as
    /// one blocked through [`Limiter::block`] by hand, or for an extractor that cannot
    /// say). Give the value to
    /// [`reset_value`](Self::reset_value) to lift the block.
    ///
    /// A listing reads a small list kept beside the blocks, never the keyspace: see
    /// [`Limiter::blocked`], and the guide's
    /// [Listing what is blocked](crate::guide::operations#listing-what-is-blocked) for
    /// how far it may lag the blocks themselves on Redis.
    ///
    /// # Errors
    ///
    /// [`AdminError::Listing`] when Redis does not answer; [`AdminError::Unsupported`]
    /// when the layer's limiter cannot list its blocked keys.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{
    ///     key::{HeaderKey, KeyExtractor, PeerIp}, Backend, LimitLayer, PeriodConfig,
    /// };
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(60, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
    ///     .build()?;
    /// layer.block_value("trap", Duration::from_secs(3_600)).await?;
    /// let blocked = layer.blocked(100).await?;
    /// assert_eq!(blocked.len(), 1);
    /// assert_eq!(blocked[0].key, "hdr:x-api-key:trap");
    /// assert_eq!(blocked[0].value.as_ref().unwrap(), "trap");
    /// // Lifted by that value.
    /// layer.reset_value("trap").await?;
    /// assert!(layer.blocked(100).await?.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn blocked(&self, max: usize) -> Result<Vec<Blocked>, AdminError>
    where
        K: KeyExtractor,
    {
        let listing = self
            .limiter()
            .blocked(max)
            .ok_or(AdminError::Unsupported { action: "list" })?;
        let mut listed = listing.await?;
        for entry in &mut listed {
            entry.value = self.value_of(&entry.key);
        }
        Ok(listed)
    }

    /// The keys this layer refused most in the last 5 to 10 minutes, most first, at most
    /// `max`: each with the policy that refused it, the client's value where the
    /// extractor names it (as [`blocked`](Self::blocked)), and its count of refusals.
    /// Answered by this instance, from what it refused (each instance counts its own
    /// refusals; ask each to see a fleet).
    ///
    /// A bounded sketch counts them (space-saving, 256 counters per policy: memory
    /// fixed whatever the number of keys refused): `count` is at least the key's true
    /// count and at most `error` above it, `error` is at most the window's refusals
    /// over 256, and every key refused more often than that is listed. A key is never a
    /// metric label: this is the way to see who is refused, by key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{Service, ServiceExt};
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = PeriodConfig::new(1, Duration::from_secs(60));
    /// let layer = LimitLayer::builder(&Backend::in_process(), config)
    ///     .name("api")
    ///     .key(HeaderKey::from_static("x-api-key"))
    ///     .build()?;
    /// let mut app = tower::ServiceBuilder::new().layer(layer.clone()).service_fn(
    ///     |_: http::Request<String>| async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) },
    /// );
    /// for _ in 0..3 {
    ///     let request = http::Request::builder().header("x-api-key", "k1").body(String::new())?;
    ///     app.ready().await?.call(request).await?;
    /// }
    /// let denied = layer.denied(10);
    /// assert_eq!(denied[0].key, "hdr:x-api-key:k1");
    /// assert_eq!(denied[0].value.as_ref().unwrap(), "k1");
    /// assert_eq!((denied[0].count, denied[0].error), (2, 0));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn denied(&self, max: usize) -> Vec<Denied>
    where
        K: KeyExtractor,
    {
        let now = std::time::Instant::now();
        let policies = self.limiter().policies();
        let mut denied: Vec<Denied> = self
            .shared
            .offenders
            .iter()
            .zip(policies)
            .flat_map(|(offenders, policy)| {
                offenders
                    .top(max, now)
                    .into_iter()
                    .map(|(key, count, error, since)| Denied {
                        limit: policy.name().to_owned(),
                        value: None,
                        key,
                        count,
                        error,
                        since,
                    })
            })
            .collect();
        denied.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.key.as_bytes().cmp(b.key.as_bytes()))
        });
        denied.truncate(max);
        for entry in &mut denied {
            entry.value = self.value_of(&entry.key);
        }
        denied
    }

    /// The client's value whose keys include `key`, if the extractor names one: the key
    /// itself, or what follows one of its first [`VALUE_STARTS`] `:` (a tag's end),
    /// longest first.
    fn value_of(&self, key: &[u8]) -> Option<Key<'static>>
    where
        K: KeyExtractor,
    {
        let starts = std::iter::once(0).chain(
            key.iter()
                .enumerate()
                .filter(|&(_, &b)| b == b':')
                .map(|(i, _)| i + 1)
                .take(VALUE_STARTS),
        );
        starts
            .map(|start| &key[start..])
            .filter(|value| !value.is_empty())
            .find(|value| {
                self.keys_for(value)
                    .is_ok_and(|keys| keys.iter().any(|k| k.as_bytes() == key))
            })
            .map(|value| Key::from(value.to_vec()))
    }

    /// Resolves `value` to its keys, starts `action` on each (all before awaiting any),
    /// and collects the decisions.
    async fn act(
        &self,
        value: &[u8],
        name: &'static str,
        action: impl Fn(&[u8]) -> Option<DecisionFuture>,
    ) -> Result<Vec<(Key<'static>, Decision)>, AdminError>
    where
        K: KeyExtractor,
    {
        let keys = self.keys_for(value)?;
        let checks = keys
            .iter()
            .map(|key| action(key).ok_or(AdminError::Unsupported { action: name }))
            .collect::<Result<Vec<_>, _>>()?;
        let mut decisions = Vec::with_capacity(keys.len());
        for (key, check) in keys.into_iter().zip(checks) {
            decisions.push((key, check.await));
        }
        Ok(decisions)
    }
}
