//! [`OutboundLayer`]: wraps a client so that each call waits for the shared limit.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{Outbound, Waiter};
use crate::cost::Cost;
use crate::key::{GlobalKey, KeyExtractor};
use crate::limiter::Limiter;

/// A tower [`Layer`] for clients: every call through the [`Outbound`] service it builds
/// waits (up to a maximum) until the limit admits it, then goes to the inner service.
///
/// The inner service takes `http::Request<B>` of any body `B` (a `hyper-util` client, a
/// `tonic` channel, a service of yours wrapping `reqwest`). The key is read from each
/// request's head by a [`KeyExtractor`], the same trait as the inbound layers' (the
/// default is [`GlobalKey`]: one limit for every call); a request it finds no key in
/// waits on [`GlobalKey`]'s key `global` too, since a client's call has no one to be
/// refused to. The cost comes from a [`Cost`] (the default is one unit per call; a
/// weighted cost reads a header, e.g. [`HeaderCost`](crate::HeaderCost) on
/// `x-max-tokens`, or an extension the caller set).
///
/// Cloning is cheap: clones, and every service they build, share one [`Waiter`] (one
/// queue per key in this process).
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderName, Request};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_redis_ratelimit::{
///     outbound::{OutboundLayer, Waiter}, Backend, HeaderCost, TokenBucketConfig,
///     TokenBucketLimiter,
/// };
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // The LLM API allows 10 000 tokens per minute; a request costs the `x-max-tokens`
/// // its caller set (one token without it).
/// let config = TokenBucketConfig::new(10_000, Duration::from_secs(60), 10_000);
/// let limiter = TokenBucketLimiter::new(&Backend::in_process(), "llm", config)?;
/// let layer = OutboundLayer::new(Waiter::new(limiter), Duration::from_secs(30))
///     .cost(HeaderCost::new(HeaderName::from_static("x-max-tokens"), 1));
/// let client = ServiceBuilder::new()
///     .layer(layer)
///     .service(service_fn(|req: Request<String>| async move {
///         Ok::<_, std::io::Error>(format!("{} tokens", req.headers()["x-max-tokens"].to_str().unwrap()))
///     }));
/// let request = Request::post("/v1/complete")
///     .header("x-max-tokens", "512")
///     .body(String::from("Hello"))?;
/// let answer = client.oneshot(request).await?;
/// assert_eq!(answer, "512 tokens");
/// # Ok(()) }
/// ```
pub struct OutboundLayer<L, K = GlobalKey, C = u32> {
    waiter: Waiter<L>,
    key: Arc<K>,
    cost: Arc<C>,
    max_wait: Duration,
}

impl<L> OutboundLayer<L> {
    /// A layer whose calls wait on `waiter`'s limit for at most `max_wait` each, all
    /// under one key ([`GlobalKey`]), one unit per call.
    pub fn new(waiter: Waiter<L>, max_wait: Duration) -> Self {
        Self {
            waiter,
            key: Arc::new(GlobalKey),
            cost: Arc::new(1u32),
            max_wait,
        }
    }
}

impl<L, K, C> OutboundLayer<L, K, C> {
    /// The key each call waits on, read from the request's head: any [`KeyExtractor`]
    /// (a [`HeaderKey`](crate::key::HeaderKey) naming the account the upstream limits
    /// per, a closure `Fn(&Parts) -> Option<T>`, [`GlobalKey`] for one limit). A request
    /// it finds no key in waits on [`GlobalKey`]'s key `global`.
    pub fn key<K2: KeyExtractor>(self, key: K2) -> OutboundLayer<L, K2, C> {
        OutboundLayer {
            waiter: self.waiter,
            key: Arc::new(key),
            cost: self.cost,
            max_wait: self.max_wait,
        }
    }

    /// The cost of each call, read from the request's head: any [`Cost`]
    /// (a `u32` for a fixed cost, [`HeaderCost`](crate::HeaderCost) or a closure
    /// `Fn(&Parts) -> u32`).
    pub fn cost<C2: Cost>(self, cost: C2) -> OutboundLayer<L, K, C2> {
        OutboundLayer {
            waiter: self.waiter,
            key: self.key,
            cost: Arc::new(cost),
            max_wait: self.max_wait,
        }
    }

    /// The longest a call waits for the limit before it fails with
    /// [`WaitError::TimedOut`](super::WaitError::TimedOut).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The waiter every service of this layer shares.
    pub fn waiter(&self) -> &Waiter<L> {
        &self.waiter
    }
}

impl<L, K, C> Clone for OutboundLayer<L, K, C> {
    fn clone(&self) -> Self {
        Self {
            waiter: self.waiter.clone(),
            key: Arc::clone(&self.key),
            cost: Arc::clone(&self.cost),
            max_wait: self.max_wait,
        }
    }
}

impl<L: Limiter, K, C> fmt::Debug for OutboundLayer<L, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboundLayer")
            .field("waiter", &self.waiter)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl<S, L, K, C> Layer<S> for OutboundLayer<L, K, C> {
    type Service = Outbound<S, L, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Outbound::new(
            inner,
            self.waiter.clone(),
            Arc::clone(&self.key),
            Arc::clone(&self.cost),
            self.max_wait,
        )
    }
}
