//! Limiters in your own code: check, peek, refund, reset and block outside a layer, and
//! the messages of long-lived connections.
//!
//! # Limiters in your own code
//!
//! Every built-in limiter (and a [`SetLimiter`](crate::SetLimiter)) is a handle
//! for background jobs, websockets, queue consumers and admin tools, with the same
//! state as the layers built from the same name and algorithm on the same backend (on
//! Redis and in process alike: see [one name, one limit](crate::guide::deployments#one-name-one-limit));
//! each call is one round trip on Redis, or answered in process:
//!
//! | call | does |
//! |---|---|
//! | [`check(key, cost)`](crate::Limiter::check) | counts `cost` if it fits |
//! | [`peek(key, cost)`](crate::Limiter::peek) | what `check` would say, spending nothing |
//! | [`refund(key, cost)`](crate::Limiter::refund) | gives units back (never beyond the limit) |
//! | [`reset(key)`](crate::Limiter::reset) | forgets the key and lifts its block |
//! | [`block(key, duration)`](crate::Limiter::block) | refuses the key for a while, on every instance |
//! | [`unblock(key)`](crate::Limiter::unblock) | lifts the key's block, keeping its count |
//! | [`blocked(max)`](crate::Limiter::blocked) | lists the keys blocked now (by a block or a lockout), with their ends |
//!
//! `peek`, `refund`, `reset`, `block` and `unblock` return `Option<DecisionFuture>`, `blocked` a
//! boxed future of the list in an `Option`: `None` for a limiter that cannot (your own,
//! unless it implements them). A listing reads a small list kept beside the blocks, never the keyspace (see
//! [Listing what is blocked](crate::guide::operations#listing-what-is-blocked)). A per-plan layer's limiter
//! ([`PlanLimiter`](crate::limit::PlanLimiter)) resets and blocks a key under every
//! plan and peeks and refunds under the first plan ([`plan`](crate::limit::PlanLimiter::plan)
//! gives one plan's limiter); a dynamic layer's limiter
//! ([`DynamicLimiter`](crate::DynamicLimiter)) answers under the key's known
//! limit (the default one until the source was asked).
//!
//! These calls take the key a layer counts, [tag](crate::key#tags) and all
//! (`hdr:x-api-key:trap`), not the client's value (`trap`): see below for acting by value.
//!
//! A block or a reset made on one instance reaches the other instances' answers on Redis
//! at once: the limit's state is in Redis, and the instance that made the change
//! publishes it, so that every other backend forgets its cached refusal of that key when
//! the message arrives (one pub/sub hop; see
//! [Changes on every instance](crate::guide::operations#changes-on-every-instance)).
//! Only while a backend's subscription is down does a refusal it cached stand for up to
//! the deny cache's [max age](crate::BackendBuilder::deny_cache_max_age) (1 s by
//! default). In process (and in the fallback), blocks and resets reach only this process.
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use tower_redis_ratelimit::{Backend, Limiter, PeriodConfig, PeriodLimiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let exports = PeriodLimiter::new(
//!     &Backend::in_process(),
//!     "exports",
//!     PeriodConfig::new(3, Duration::from_secs(3_600)),
//! )?;
//! let one = NonZeroU32::MIN;
//! let decision = exports.check(b"acme", one).await;
//! assert_eq!(decision.remaining, 2);
//! // The export failed: it does not count.
//! let decision = exports.refund(b"acme", one).expect("built-in").await;
//! assert_eq!(decision.remaining, 3);
//! # Ok(()) }
//! ```
//!
//! # Messages of long-lived connections
//!
//! WebSocket frames, server-sent events and gRPC stream messages are not requests: a
//! layer sees the request that opens the connection, never what flows over it. To limit
//! them per user across connections (five browser tabs of one user sharing one limit of
//! N messages per second), build a [`LimitLayer`](crate::LimitLayer) for the messages,
//! and make its [`StreamLimit`](crate::StreamLimit) from the opening request with
//! [`LimitLayer::stream`](crate::LimitLayer::stream), once per connection: the key comes
//! from the layer's own extractor (and a per-plan layer's policy from the request's plan),
//! `None` when the request has none. Each message is then one
//! [`check`](crate::StreamLimit::check), counted in the layer's
//! [metrics](crate::guide::metrics) as a request's decision is. The layer need not wrap
//! any route (wrapping the upgrade route would count the connection itself as one more
//! unit).
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//!
//! use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
//! use axum::response::IntoResponse;
//! use axum::{routing::get, Router};
//! use http::{request::Parts, StatusCode};
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig, StreamLimit};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! // 5 messages per second per user, across all their connections.
//! let messages = LimitLayer::builder(
//!     &Backend::in_process(),
//!     PeriodConfig::new(5, Duration::from_secs(1)),
//! )
//! .name("ws.messages")
//! .key(HeaderKey::from_static("x-user"))
//! .build()?;
//! let app: Router = Router::new().route(
//!     "/ws",
//!     get(move |upgrade: WebSocketUpgrade, request: Parts| {
//!         let limit = messages.stream(&request);
//!         async move {
//!             match limit {
//!                 Some(limit) => upgrade.on_upgrade(move |socket| echo(socket, limit)),
//!                 None => StatusCode::UNAUTHORIZED.into_response(),
//!             }
//!         }
//!     }),
//! );
//! # let _ = app;
//! # Ok(()) }
//!
//! async fn echo(mut socket: WebSocket, limit: StreamLimit) {
//!     while let Some(Ok(message)) = socket.recv().await {
//!         let decision = limit.check(NonZeroU32::MIN).await;
//!         let reply = if decision.is_admitted() {
//!             message
//!         } else {
//!             let ms = decision.retry_after.unwrap_or_default().as_millis();
//!             Message::Text(format!(r#"{{"error":"rate_limited","retry_after_ms":{ms}}}"#).into())
//!         };
//!         if socket.send(reply).await.is_err() {
//!             break;
//!         }
//!     }
//! }
//! ```
//!
//! The `websocket` example is this app, with the user also read from a `?user=` query
//! parameter (browsers set no headers on a WebSocket); `tests/streams.rs` runs it with
//! five real clients of one user, an SSE route whose events are checked the same way,
//! and a tonic server stream whose `StreamLimit` a tower layer before the service puts
//! into each call's extensions (gRPC metadata are headers). On a [shadow](crate::LayerBuilder::shadow) layer a check over the limit is
//! counted as `shadow_rejected` and answered as admitted.
//!
//! A stream the server produces (SSE events, a gRPC server stream, chunks of a
//! download) can be limited as a whole with [`StreamLimit::limit`](crate::StreamLimit::limit):
//! each item is checked at the cost a closure gives it (one message, its bytes) as it is
//! pulled, and a refused item is dropped, delayed until it fits (the stream slows to the
//! limit), or ends the stream with the refusal, as [`Refused`](crate::limit::Refused)
//! says. A gRPC stream ends with [`StreamLimit::status`](crate::StreamLimit::status)
//! (feature `grpc`): `RESOURCE_EXHAUSTED` with `RetryInfo` and `QuotaFailure`, in the
//! trailers, as a refused call gets. Rate-limit metadata is never attached per message.
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use tower_redis_ratelimit::limit::Refused;
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 3 ticks a minute per user, the rest dropped.
//! let ticks = LimitLayer::builder(&Backend::in_process(), PeriodConfig::new(3, Duration::from_secs(60)))
//!     .name("ticks")
//!     .key(HeaderKey::from_static("x-user"))
//!     .build()?;
//! let (open, ()) = http::Request::get("/ticks").header("x-user", "alice").body(())?.into_parts();
//! let source = futures_util::stream::iter(0..10);
//! let sent: Vec<_> = ticks.stream(&open).expect("a user").limit(source, |_| 1, Refused::Drop).collect().await;
//! assert_eq!(sent.len(), 3);
//! # Ok(()) }
//! ```
//!
//! Each check is one round trip on Redis (a token bucket's
//! [leases](crate::TokenBucketConfig::lease) take most of them off: `BENCHMARKS.md`
//! counts 1.0 Redis call per message at 1 000 messages a second, 0.05 with leases of
//! 20). While Redis is unreachable, the checks are answered by the layer's failure
//! policy, as requests are: the fallback counts the messages in process (this instance's
//! share of the limit), `FailOpen` admits them, `FailClosed` refuses them, so a
//! `Refused::End` stream ends at its next item and a `Refused::Delay` stream waits at the
//! probe's pace (500 ms by default) until Redis answers again.
//!
//! # Admin actions by the client's value
//!
//! An administrator knows the client's API key, user id or address, not the key the
//! layer counts it under. A layer resolves the value with its own extractor
//! ([`keys_for`](crate::LimitLayer::keys_for), as
//! [`KeyExtractor::keys_for`](crate::key::KeyExtractor::keys_for) makes it) and acts on
//! that key: [`peek_value`](crate::LimitLayer::peek_value),
//! [`reset_value`](crate::LimitLayer::reset_value) (which also lifts a block),
//! [`block_value`](crate::LimitLayer::block_value),
//! [`unblock_value`](crate::LimitLayer::unblock_value) (which keeps the count) and
//! [`refund_value`](crate::LimitLayer::refund_value), on any [`LimitLayer`](crate::LimitLayer)
//! (a set, a per-plan or a dynamic layer included: a per-plan layer acts under every
//! plan, since a value's plan is not known from the value, and a refund there names its
//! plan, [`refund_value_in`](crate::LimitLayer::refund_value_in)), and
//! [`in_flight_value`](crate::InFlightLimitLayer::in_flight_value) on an in-flight layer.
//! Each answers one `(key, decision)` per key: an `or` extractor can count a value under
//! several keys (an address sent as an API key is the header's key and the address's),
//! and every one is acted on. A value the layer never counts (`localhost` for a per-IP
//! layer) is an [`AdminError`](crate::AdminError), never a success on a key no
//! request is counted under.
//!
//! Extractors read the request's head, never its body, so these take no type parameter.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{
//!     key::{HeaderKey, KeyExtractor, PeerIp}, Backend, LimitLayer, PeriodConfig,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = PeriodConfig::new(60, Duration::from_secs(60));
//! let api = LimitLayer::builder(&Backend::in_process(), config)
//!     .name("api")
//!     .key(HeaderKey::from_static("x-api-key").or(PeerIp::new()))
//!     .build()?;
//! // Block the client with the API key `trap` for an hour, on every instance.
//! let blocked = api.block_value("trap", Duration::from_secs(3_600)).await?;
//! assert_eq!(blocked[0].0, "hdr:x-api-key:trap");
//! assert!(!blocked[0].1.is_admitted());
//! // Where it stands, then lift the block (its count kept).
//! assert!(!api.peek_value("trap", std::num::NonZeroU32::MIN).await?[0].1.is_admitted());
//! api.unblock_value("trap").await?;
//! // An address: the header's key and the address's key, both reset.
//! let reset = api.reset_value("203.0.113.7").await?;
//! assert_eq!(reset.len(), 2);
//! # Ok(()) }
//! ```
