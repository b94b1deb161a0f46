//! [`OutboundLayer`]: wraps a client so that each call waits for the shared limit.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::{FixedKey, Outbound, Waiter};
use crate::cost::UnitCost;
use crate::limiter::Limiter;

/// A tower [`Layer`] for clients: every call through the [`Outbound`] service it builds
/// waits (up to a maximum) until the limit admits it, then goes to the inner service.
///
/// The request type is anything the inner service takes (an `http::Request` for a
/// `hyper-util` client or a `tonic` channel, your own type for a service wrapping
/// `reqwest`); the key comes from a [`RequestKey`](super::RequestKey) (the default is
/// one [`FixedKey`] for every call), the cost from a
/// [`RequestCost`](super::RequestCost) (the default is one unit per call).
///
/// Cloning is cheap: clones, and every service they build, share one [`Waiter`] (one
/// queue per key in this process).
///
/// ```
/// use std::time::Duration;
/// use http::Request;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_redis_ratelimit::outbound::{OutboundLayer, Waiter};
/// use tower_redis_ratelimit::token_bucket::{TokenBucketConfig, TokenBucketLimiter};
/// use tower_redis_ratelimit::Backend;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // The LLM API allows 10 000 tokens per minute; a request costs its `max_tokens`.
/// let config = TokenBucketConfig::new(10_000, Duration::from_secs(60), 10_000);
/// let limiter = TokenBucketLimiter::new(&Backend::in_process(), "llm", config)?;
/// let layer = OutboundLayer::new(Waiter::new(limiter), Duration::from_secs(30))
///     .cost(|req: &Request<u32>| *req.body());
/// let client = ServiceBuilder::new()
///     .layer(layer)
///     .service(service_fn(|req: Request<u32>| async move {
///         Ok::<_, std::io::Error>(format!("{} tokens", req.body()))
///     }));
/// let answer = client.oneshot(Request::new(512)).await?;
/// assert_eq!(answer, "512 tokens");
/// # Ok(()) }
/// ```
pub struct OutboundLayer<L, K = FixedKey, C = UnitCost> {
    waiter: Waiter<L>,
    key: Arc<K>,
    cost: Arc<C>,
    max_wait: Duration,
}

impl<L> OutboundLayer<L> {
    /// A layer whose calls wait on `waiter`'s limit for at most `max_wait` each, all
    /// under one key (the empty [`FixedKey`]), one unit per call.
    pub fn new(waiter: Waiter<L>, max_wait: Duration) -> Self {
        Self {
            waiter,
            key: Arc::new(FixedKey::default()),
            cost: Arc::new(UnitCost),
            max_wait,
        }
    }
}

impl<L, K, C> OutboundLayer<L, K, C> {
    /// The key each call waits on (a [`RequestKey`](super::RequestKey): a
    /// [`FixedKey`] or a closure on the request).
    pub fn key<K2>(self, key: K2) -> OutboundLayer<L, K2, C> {
        OutboundLayer {
            waiter: self.waiter,
            key: Arc::new(key),
            cost: self.cost,
            max_wait: self.max_wait,
        }
    }

    /// The cost of each call (a [`RequestCost`](super::RequestCost): `UnitCost`,
    /// `FixedCost` or a closure on the request).
    pub fn cost<C2>(self, cost: C2) -> OutboundLayer<L, K, C2> {
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
