//! gRPC: the same layers on a tonic server.
//!
//! # gRPC
//!
//! The same layers wrap a tonic server: `Server::builder().layer(limit)`. With the
//! `grpc` feature, refused calls get the gRPC answer (`RESOURCE_EXHAUSTED`, trailers-only,
//! with `RetryInfo` and `QuotaFailure` details), keys come from metadata with
//! [`HeaderKey`](crate::key::HeaderKey), and admitted calls carry the `RateLimit`
//! headers as initial metadata. See the `grpc` example
//! (`cargo run --example grpc --features grpc`), a health service that any standard
//! gRPC health client can exhaust.
//!
//! With this feature, the built-in rejections ([`DefaultRejection`](crate::DefaultRejection)
//! and [`ProblemJson`](crate::ProblemJson)) answer gRPC calls with a gRPC status
//! instead of an HTTP 429, which a gRPC client could only report as a transport error:
//!
//! - HTTP 200, *trailers-only* (the status travels in the response headers, with no
//!   body), `content-type: application/grpc`;
//! - `grpc-status: 8` (`RESOURCE_EXHAUSTED`) and a `grpc-message`;
//! - `grpc-status-details-bin`: a `google.rpc.Status` carrying a `google.rpc.RetryInfo`
//!   with the retry delay (omitted when waiting cannot help, see
//!   [`State::ExceedsCapacity`](crate::State::ExceedsCapacity)) and a `google.rpc.QuotaFailure` naming the policy;
//! - the `RateLimit-Policy`, `RateLimit` and `Retry-After` headers, as extra metadata.
//!
//! A call without a usable key gets the gRPC code matching the layer's
//! [`MissingKey::Reject`](crate::MissingKey::Reject) status (`400` becomes
//! `INVALID_ARGUMENT`, `401` `UNAUTHENTICATED`, `403` `PERMISSION_DENIED`, `429`
//! `RESOURCE_EXHAUSTED`, `503` `UNAVAILABLE`, anything else `UNKNOWN`). Admitted calls
//! carry `RateLimit-Policy` and `RateLimit` as initial metadata.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, LimitLayer, PeriodConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = PeriodConfig::new(100, Duration::from_secs(60));
//! let limit = LimitLayer::builder(&Backend::in_process(), config)
//!     .name("grpc")
//!     .key(HeaderKey::from_static("x-api-key"))
//!     .build()?;
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! let router = tonic::transport::Server::builder()
//!     .layer(limit)
//!     .add_service(health);
//! // router.serve("127.0.0.1:50051".parse()?).await?;
//! # let _ = router; Ok(()) }
//! ```
//!
//! A client reads the details with `tonic_types::StatusExt`:
//!
//! ```
//! use std::time::Duration;
//! use tonic_types::StatusExt;
//!
//! fn backoff(status: &tonic::Status) -> Option<Duration> {
//!     if status.code() != tonic::Code::ResourceExhausted {
//!         return None;
//!     }
//!     status.get_details_retry_info()?.retry_delay
//! }
//! # let _ = backoff;
//! ```
//!
//! [`PeerIp`](crate::key::PeerIp) reads tonic's `TcpConnectInfo` (with the `grpc`
//! feature), so calls without an API key can be limited per client address, as in the
//! `grpc` example.
//!
//! **Authentication goes before the limit.** To limit per authenticated client with
//! [`ExtensionKey`](crate::key::ExtensionKey), the interceptor that puts the client into
//! the request extensions must run first: add it as a server layer ahead of the limit,
//! `Server::builder().layer(InterceptorLayer::new(auth)).layer(limit)` (tonic's server
//! layers run in the order they are added). tonic's usual
//! `Service::with_interceptor(service, auth)` wraps only the service, so it runs *after*
//! every server layer: the limit finds no client in any call and refuses them all with
//! `INVALID_ARGUMENT` (the [missing-key](crate::MissingKey) status; the layer logs a
//! `warn` line naming this cause). The `grpc` example does it this way:
//!
//! ```ignore
//! fn authenticate(mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
//!     if let Some(key) = request.metadata().get("x-api-key") {
//!         let client = Client(key.to_str().map_err(|_| tonic::Status::unauthenticated("bad key"))?.to_owned());
//!         request.extensions_mut().insert(client);
//!     }
//!     Ok(request)
//! }
//!
//! let limit = LimitLayer::builder(&backend, PeriodConfig::new(5, Duration::from_secs(30)))
//!     .name("grpc")
//!     .key(ExtensionKey::<Client>::new().tag("client").or(PeerIp::new()))
//!     .build()?;
//! tonic::transport::Server::builder()
//!     .layer(tonic::service::InterceptorLayer::new(authenticate)) // first: finds the client
//!     .layer(limit)                                                // then: limits it
//!     .add_service(health)
//!     .serve(addr)
//!     .await?;
//! ```
//!
//! The same holds for axum and tower: an authentication layer must wrap the limit (in
//! axum, `.layer(limit).layer(auth)`: the last layer added runs first).
