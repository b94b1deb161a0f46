//! Limiters in your own code: check, peek, refund, reset and block outside a layer.
//!
//! # Limiters in your own code
//!
//! Every built-in limiter (and a [`SetLimiter`](crate::set::SetLimiter)) is a handle
//! for background jobs, websockets, queue consumers and admin tools, with the same
//! state as the layers built from the same name and algorithm on the same backend (on
//! Redis and in process alike: see [one name, one limit](crate::backend#one-name-one-limit));
//! each call is one round trip on Redis, or answered in process:
//!
//! | call | does |
//! |---|---|
//! | [`check(key, cost)`](crate::Limiter::check) | counts `cost` if it fits |
//! | [`peek(key, cost)`](crate::Limiter::peek) | what `check` would say, spending nothing |
//! | [`refund(key, cost)`](crate::Limiter::refund) | gives units back (never beyond the limit) |
//! | [`reset(key)`](crate::Limiter::reset) | forgets the key and lifts its block |
//! | [`block(key, duration)`](crate::Limiter::block) | refuses the key for a while, on every instance |
//!
//! `peek`, `refund`, `reset` and `block` return `Option<Check>`: `None` for a limiter
//! that cannot (your own, unless it implements them). A per-plan layer's limiter
//! ([`PlanLimiter`](crate::service::PlanLimiter)) resets and blocks a key under every
//! plan and peeks and refunds under the first plan ([`plan`](crate::service::PlanLimiter::plan)
//! gives one plan's limiter); a dynamic layer's limiter
//! ([`DynamicLimiter`](crate::dynamic::DynamicLimiter)) answers under the key's known
//! limit (the default one until the source was asked).
//!
//! A block or a reset made on one instance reaches the other instances' answers at once
//! on Redis, except where another instance answers a refusal from its local deny cache:
//! there, within the deny cache's
//! [max age](crate::BackendBuilder::deny_cache_max_age) (1 s by default). In process
//! (and in the fallback), blocks and resets reach only this process.
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use tower_redis_ratelimit::period::{PeriodConfig, PeriodLimiter};
//! use tower_redis_ratelimit::{Backend, Limiter};
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
