//! Limits on the requests a service *sends*: each call waits (up to a maximum) until a
//! limit shared by every replica admits it, instead of being refused. For an upstream
//! API's quota (a payment provider's 100 requests per second per account, an LLM API's
//! tokens per minute, an SMS gateway's messages per sender), queue consumers and batch
//! jobs.
//!
//! [`Waiter::acquire`] waits on any [`Limiter`](crate::Limiter) (the same algorithms and
//! backends as the inbound layers: a token bucket in Redis, shared by every instance, or
//! in-process); [`OutboundLayer`] puts the wait in front of any tower client (a
//! `hyper-util` client, a `tonic` channel, a service wrapping `reqwest`), with the key
//! and a weighted cost read from each request's head by the same
//! [`KeyExtractor`](crate::key::KeyExtractor) and [`Cost`](crate::Cost) the inbound
//! layers use.
//!
//! # How the wait works
//!
//! - **Token buckets reserve: one call per request.** A waiter on a token bucket
//!   reserves its tokens at the earliest time they fit ([`Limiter::reserve`](crate::Limiter::reserve)): one
//!   Redis call moves the shared bucket on and says how long to wait, and the waiter
//!   sleeps until then. Instances sharing the bucket never race for the same token, so
//!   each admitted request costs one call, however many instances wait. When that time
//!   lies beyond the maximum wait, nothing is taken and the waiter fails at once
//!   ([`WaitError::TimedOut`]). A waiter dropped before its time gives its tokens back
//!   ([`Limiter::refund`](crate::Limiter::refund), one more call), so cancellation spends nothing.
//! - **Other limits: no polling.** A fixed or rolling window cannot be reserved ahead: a
//!   refused check says when the request could pass (`retry_after`, computed from the
//!   shared state); the waiter sleeps until then and checks once more, failing at once
//!   when that time lies beyond its maximum wait. Nothing is taken while it waits.
//! - **First in, first out per key.** In one process, the waiters on one key queue
//!   behind a fair lock; only the head reserves or checks, so a costly request is not
//!   overtaken forever by cheap ones. With a window, after an admission that used the
//!   last unit, the next head sleeps until the limiter's policy says a unit is back
//!   before it asks. A cost the limit can never admit fails at once
//!   ([`WaitError::ExceedsCapacity`]).
//! - **Redis down.** The limiter's [`FailurePolicy`](crate::FailurePolicy) applies as
//!   for inbound layers: `Fallback` waits on the in-process state (with its fallback
//!   share), `FailOpen` lets calls through, `FailClosed` fails them with
//!   [`WaitError::Unavailable`]. Choose it on the backend
//!   ([`BackendBuilder::failure_policy`](crate::BackendBuilder::failure_policy)).
//!
//! Compared with in-process waiting (governor's `until_ready`, rate-limiter-flexible's
//! `RateLimiterQueue`), the limit and the time to wake up come from the store every
//! instance shares.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use http::Request;
//! use http_body_util::Empty;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_redis_ratelimit::{
//!     key::HeaderKey, outbound::{OutboundError, OutboundLayer, WaitError, Waiter}, Backend,
//!     TokenBucketConfig, TokenBucketLimiter,
//! };
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Every replica shares the provider's 100 requests per second per account.
//! let backend = Backend::builder().redis_url("redis://127.0.0.1:6379").build()?;
//! let config = TokenBucketConfig::new(100, Duration::from_secs(1), 10);
//! let limiter = TokenBucketLimiter::new(&backend, "payments", config)?;
//! let layer = OutboundLayer::new(Waiter::new(limiter), Duration::from_secs(10))
//!     .key(HeaderKey::from_static("x-account"));
//! let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
//! let client = ServiceBuilder::new().layer(layer).service(client);
//!
//! let request = Request::get("http://127.0.0.1:3001/charge")
//!     .header("x-account", "m-42")
//!     .body(Empty::new())?;
//! match client.oneshot(request).await {
//!     Ok(response) => println!("{}", response.status()),
//!     Err(OutboundError::Wait(WaitError::TimedOut { .. })) => println!("busy: try later"),
//!     Err(error) => return Err(error.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! The `outbound` example runs an upstream that counts arrivals per second and clients
//! that share one limit through Redis.

mod error;
mod layer;
mod service;
mod waiter;

pub use self::error::{OutboundError, WaitError};
pub use self::layer::OutboundLayer;
pub use self::service::{Outbound, ResponseFuture};
pub use self::waiter::Waiter;

#[cfg(test)]
mod tests;
