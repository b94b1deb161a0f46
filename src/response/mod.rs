//! What clients see: the rejection response and the `RateLimit` headers.
//!
//! Rejections are `429 Too Many Requests` by default ([`DefaultRejection`]); swap in
//! [`ProblemJson`] or any closure that turns a [`Rejection`] into a response. With the
//! `grpc` feature both built-in rejections answer gRPC calls with a gRPC status instead
//! (see the `grpc` module). Whatever the response, the service adds `Retry-After`
//! (when waiting helps) and the IETF draft headers
//! `RateLimit-Policy: "name";q=<quota>;w=<seconds>` and
//! `RateLimit: "name";r=<remaining>;t=<seconds>`.
//!
//! # Stacked limits
//!
//! When several layers limit one request, each adds its policy to the same two headers,
//! which then hold one list item per policy, outermost layer first:
//!
//! ```text
//! RateLimit-Policy: "burst";q=10;w=1, "daily";q=1000;w=86400
//! RateLimit: "burst";r=9;t=1, "daily";r=998;t=51840
//! ```
//!
//! A request refused by an outer layer never reaches the inner ones, so its headers
//! list the outer policies only; `Retry-After` holds the longest wait of the refusing
//! policies. See [the guide](crate::guide::stacking#stacked-limits) for which limit to put
//! outermost.
//!
//! The module is split by concern: the [`Rejection`] a handler sees and the
//! [`OnRejection`] trait (`rejection.rs`), the HTTP answers (`http.rs`), the gRPC answers
//! (`grpc.rs`, feature `grpc`) and the `RateLimit` headers (`headers.rs`); none of them
//! imports this file, so they form no circle.

#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc;
mod headers;
mod http;
mod rejection;

pub(crate) use self::headers::{policy_header, HeaderParts, Ready};
pub use self::headers::{RATELIMIT, RATELIMIT_POLICY};
pub(crate) use self::http::missing_key;
pub use self::http::{DefaultRejection, ProblemJson};
pub use self::rejection::{MissingKeyRejection, OnRejection, Rejection};
