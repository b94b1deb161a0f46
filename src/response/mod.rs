//! What clients see: the rejection response and the `RateLimit` headers; the docs are on [`OnRejection`]. Split by concern: the [`Rejection`] a handler sees and the [`OnRejection`] trait (`rejection.rs`), the HTTP answers (`http.rs`), the gRPC answers (`grpc.rs`) and the headers (`headers.rs`).

#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub(crate) mod grpc;
mod headers;
mod http;
mod rejection;

pub(crate) use self::headers::{policy_header, HeaderParts, Ready};
#[cfg(feature = "admin")]
pub(crate) use self::headers::{RATELIMIT, RATELIMIT_POLICY};
pub(crate) use self::http::missing_key;
pub use self::http::{DefaultRejection, ProblemJson};
pub(crate) use self::rejection::ceil_secs;
pub use self::rejection::{OnRejection, Rejection};
