//! [`StreamLimit`]: a layer's limit for the messages of a long-lived connection
//! (WebSocket frames, server-sent events, gRPC stream messages), checked one by one
//! under the key of the request that opened it.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use super::{LimitLayer, MissingKey, Shared};
use crate::decision::{Decision, Policy, State};
use crate::key::{Key, KeyExtractor};
use crate::limiter::{DecisionFuture, Limiter};

/// A [`LimitLayer`]'s limit for the messages of one long-lived connection, made by
/// [`LimitLayer::stream`] from the request that opened it (a WebSocket upgrade, an SSE
/// request, a gRPC streaming call).
///
/// It holds the request's key and policy: every [`check`](Self::check) counts one
/// message (or `cost` units) against that key, so that the connections of one key share
/// one limit (five browser tabs of a user, one limit of N messages per second), on Redis
/// across every instance as in process. Each check is counted in the layer's
/// [metrics](crate::guide::metrics) as a request's decision is
/// (`ratelimit_requests_total` under the layer's policy). Cloning is cheap; the handle
/// has no type parameters, so it is stored in a connection's state as it is.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // 5 messages per second per user, across all their connections.
/// let messages = LimitLayer::builder(&Backend::in_process(), PeriodConfig::new(5, Duration::from_secs(1)))
///     .name("messages")
///     .key(HeaderKey::from_static("x-user"))
///     .build()?;
/// // The request that opened the connection (an upgrade request in a handler).
/// let (open, ()) = http::Request::get("/ws").header("x-user", "alice").body(())?.into_parts();
/// let alice = messages.stream(&open).expect("the request has a key");
/// assert_eq!(alice.key(), b"hdr:x-user:alice");
/// // A second connection of the same user shares the limit.
/// let tab = messages.stream(&open).expect("the request has a key");
/// for _ in 0..3 {
///     assert!(alice.check(NonZeroU32::MIN).await.is_admitted());
/// }
/// for _ in 0..2 {
///     assert!(tab.check(NonZeroU32::MIN).await.is_admitted());
/// }
/// let refused = alice.check(NonZeroU32::MIN).await;
/// assert!(!refused.is_admitted());
/// assert!(refused.retry_after.is_some());
/// // A request without the header has no key.
/// let (anonymous, ()) = http::Request::get("/ws").body(())?.into_parts();
/// assert!(messages.stream(&anonymous).is_none());
/// # Ok(()) }
/// ```
///
/// On a [shadow](super::LayerBuilder::shadow) layer a check over the limit is counted
/// as `shadow_rejected`, and answered as admitted (state
/// [`Allowed`](State::Allowed), no `retry_after`; the other figures are the limit's),
/// as a shadow layer serves every request: code that drops the messages refused drops
/// none.
#[derive(Clone)]
pub struct StreamLimit {
    shared: Arc<dyn StreamShared>,
    key: Key<'static>,
    policy: usize,
    /// The connection's priority class, when the layer has classes.
    priority: Option<f64>,
}

/// The part of a layer's [`Shared`] a [`StreamLimit`] asks, without its type
/// parameters.
trait StreamShared: Send + Sync + 'static {
    fn check(
        &self,
        policy: usize,
        key: &[u8],
        cost: NonZeroU32,
        priority: Option<f64>,
    ) -> DecisionFuture;
    fn record(&self, policy: usize, decision: &Decision);
    fn is_shadow(&self) -> bool;
    fn policy(&self, policy: usize) -> &Policy;
}

impl<L, K, C, R> StreamShared for Shared<L, K, C, R>
where
    L: Limiter,
    K: Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Send + Sync + 'static,
{
    fn check(
        &self,
        policy: usize,
        key: &[u8],
        cost: NonZeroU32,
        priority: Option<f64>,
    ) -> DecisionFuture {
        match priority {
            Some(priority) => self.limiter.check_priority(policy, key, cost, priority),
            None => self.limiter.check_policy(policy, key, cost),
        }
    }

    fn record(&self, policy: usize, decision: &Decision) {
        self.metrics.decision(policy, decision, self.options.shadow);
    }

    fn is_shadow(&self) -> bool {
        self.options.shadow
    }

    fn policy(&self, policy: usize) -> &Policy {
        &self.limiter.policies()[policy]
    }
}

impl<L, K, C, R> LimitLayer<L, K, C, R>
where
    L: Limiter,
    K: KeyExtractor,
    C: Send + Sync + 'static,
    R: Send + Sync + 'static,
{
    /// This layer's limit for the messages of the long-lived connection that `request`
    /// opens (a WebSocket upgrade, an SSE request, a gRPC streaming call): made once per
    /// connection, then [`check`](StreamLimit::check)ed once per message.
    ///
    /// The key is the request's, from the layer's own extractor (within
    /// [`max_key_len`](super::LayerBuilder::max_key_len)); a request without one is
    /// counted under the layer's [`MissingKey::Key`] when it has one, else there is no
    /// limit to check: `None` (whether to refuse the connection is the handler's call).
    /// A layer of several policies (a per-plan layer) applies the request's, as it would
    /// to the request itself, and so does a layer's [priority
    /// class](super::LayerBuilder::priority). Exemptions and costs of requests do not
    /// apply: every message is checked, at the cost its check says.
    pub fn stream(&self, request: &http::request::Parts) -> Option<StreamLimit> {
        let shared = &self.shared;
        let key = match shared.key.extract(request) {
            Some(key) if key.len() <= shared.options.max_key_len => key.into_owned(),
            _ => match &shared.options.missing_key {
                MissingKey::Key(key) => Key::concat(&[key.as_bytes()]),
                _ => return None,
            },
        };
        let count = shared.headers.len();
        let policy = if count > 1 {
            Some(shared.limiter.select(request)).filter(|&index| index < count)
        } else {
            None
        };
        Some(StreamLimit {
            shared: Arc::clone(shared) as Arc<dyn StreamShared>,
            key,
            policy: policy.unwrap_or(0),
            priority: shared
                .options
                .priority
                .as_ref()
                .map(|classes| (classes.0)(request)),
        })
    }
}

impl StreamLimit {
    /// Counts `cost` units (one message: [`NonZeroU32::MIN`]) against the connection's
    /// key under its policy, and says whether they fit; recorded in the layer's metrics.
    /// One round trip on Redis, answered at once in process; nothing is allocated
    /// beyond what the limiter's check allocates.
    pub async fn check(&self, cost: NonZeroU32) -> Decision {
        let check = self
            .shared
            .check(self.policy, &self.key, cost, self.priority);
        let mut decision = check.await;
        self.shared.record(self.policy, &decision);
        if self.shared.is_shadow() && !decision.is_admitted() {
            decision.state = State::Allowed;
            decision.retry_after = None;
            decision.rejected_by = None;
        }
        decision
    }

    /// The key the connection's messages are counted under, tag and all
    /// (`hdr:x-user:alice`).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The gRPC status that ends a server stream on `refused`, a refusal of this limit:
    /// `RESOURCE_EXHAUSTED` with `RetryInfo` and `QuotaFailure` details, as the layer
    /// answers a refused call (see [the gRPC guide](crate::guide::grpc)); tonic sends it in
    /// the stream's trailers. Feature `grpc`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use tower_redis_ratelimit::limit::Refused;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// let watch = LimitLayer::builder(&Backend::in_process(), PeriodConfig::new(2, Duration::from_secs(60)))
    ///     .name("watch")
    ///     .key(HeaderKey::from_static("x-user"))
    ///     .build()?;
    /// let (open, ()) = http::Request::get("/pkg.Svc/Watch").header("x-user", "alice").body(())?.into_parts();
    /// let limit = watch.stream(&open).expect("a user");
    /// let updates = futures_util::stream::repeat("update");
    /// // What a tonic server-streaming method returns: its messages, then the status.
    /// let replies = limit.clone().limit(updates, |_| 1, Refused::End)
    ///     .map(move |item| item.map_err(|refused| limit.status(&refused)));
    /// let replies: Vec<_> = replies.collect().await;
    /// assert_eq!(replies.len(), 3);
    /// assert_eq!(replies[2].as_ref().unwrap_err().code(), tonic::Code::ResourceExhausted);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "grpc")]
    pub fn status(&self, refused: &Decision) -> tonic::Status {
        crate::response::grpc::status(self.shared.policy(self.policy), refused)
    }

    /// `stream`'s items, each [`check`](Self::check)ed at `cost(&item)` units (0: not
    /// checked, passed on) before it is passed on; an item the limit refuses is dropped,
    /// delayed or ends the stream, as `refused` says. Items are checked one at a time,
    /// in order, as they are pulled: a slow consumer is never charged ahead.
    ///
    /// The stream's items are `Ok`; its last one is `Err` with the refusal when it ends
    /// on one ([`Refused::End`], or [`Refused::Delay`] for an item that can never fit),
    /// for the caller to turn into its protocol's error (a tonic `Status` of
    /// `RESOURCE_EXHAUSTED`, sent in the trailers; an SSE event; a WebSocket close frame).
    /// Every check is counted in the layer's metrics, and rate-limit metadata is the
    /// caller's to send: nothing is attached per item. While Redis is unreachable the
    /// checks are answered by the layer's failure policy, as requests are.
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use tower_redis_ratelimit::limit::Refused;
    /// use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 1 000 bytes a minute per user, across all their streams.
    /// let bytes = LimitLayer::builder(&Backend::in_process(), PeriodConfig::new(1_000, Duration::from_secs(60)))
    ///     .name("bytes")
    ///     .key(HeaderKey::from_static("x-user"))
    ///     .build()?;
    /// let (open, ()) = http::Request::get("/feed").header("x-user", "alice").body(())?.into_parts();
    /// let chunks = futures_util::stream::iter(vec![vec![0u8; 600], vec![0; 300], vec![0; 200]]);
    /// let limited = bytes.stream(&open).expect("a user").limit(chunks, |chunk| chunk.len() as u32, Refused::End);
    /// let sent: Vec<_> = limited.collect().await;
    /// assert_eq!(sent.len(), 3);
    /// assert!(sent[0].is_ok() && sent[1].is_ok());
    /// let refused = sent[2].as_ref().unwrap_err();
    /// assert_eq!(refused.remaining, 100);
    /// # Ok(()) }
    /// ```
    pub fn limit<S, F>(
        self,
        stream: S,
        cost: F,
        refused: Refused,
    ) -> impl futures_util::Stream<Item = Result<S::Item, Decision>> + Send + 'static
    where
        S: futures_util::Stream + Send + 'static,
        S::Item: Send,
        F: Fn(&S::Item) -> u32 + Send + 'static,
    {
        use futures_util::StreamExt;
        let state = Some((self, Box::pin(stream), cost));
        futures_util::stream::unfold(state, move |state| async move {
            let (limit, mut stream, cost) = state?;
            loop {
                let item = stream.next().await?;
                let Some(units) = NonZeroU32::new(cost(&item)) else {
                    return Some((Ok(item), Some((limit, stream, cost))));
                };
                loop {
                    let decision = limit.check(units).await;
                    if decision.is_admitted() {
                        return Some((Ok(item), Some((limit, stream, cost))));
                    }
                    match (refused, decision.retry_after) {
                        (Refused::Drop, _) => break,
                        (Refused::Delay, Some(wait)) => tokio::time::sleep(wait).await,
                        (Refused::Delay | Refused::End, _) => return Some((Err(decision), None)),
                    }
                }
            }
        })
    }
}

/// What a [limited stream](StreamLimit::limit) does with an item its limit refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// Drops the item and goes on with the next one (a feed that may lose ticks).
    Drop,
    /// Holds the item until its limit admits it, checked again at each refusal's
    /// `retry_after`, and the items behind it with it: the stream slows to the limit
    /// (backpressure). An item that can never fit (a cost above the limit) ends the
    /// stream, as [`End`](Self::End) does. Needs a tokio runtime with its timer.
    Delay,
    /// Ends the stream: its last item is `Err` with the refusal.
    End,
}

impl fmt::Debug for StreamLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamLimit")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("policy", &self.shared.policy(self.policy).name())
            .field("shadow", &self.shared.is_shadow())
            .finish()
    }
}
