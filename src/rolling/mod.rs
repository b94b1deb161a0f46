//! The rolling-window algorithm: its config and its limiter; the semantics are on [`RollingConfig`].

pub(crate) mod counts;
mod limiter;
pub(crate) mod memory;

pub use self::limiter::{RollingConfig, RollingWindowLimiter};
