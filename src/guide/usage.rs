//! Usage and settlement: counting by outcome, costs known after the response, lockouts.
//!
//! # Counting by outcome
//!
//! Some limits count only what happened: failed logins and password resets, or paid
//! exports that succeeded. [`count_if`](crate::LayerBuilder::count_if) with
//! [`CountIf::failures`](crate::limit::CountIf::failures),
//! [`CountIf::successes`](crate::limit::CountIf::successes) or your own predicate on
//! the status and headers decides once the response is known. A burst of concurrent
//! requests is checked before any of them has a response, so the layer still counts
//! each admitted request when it is checked (concurrent requests can never overshoot)
//! and refunds the ones whose response does not count, in the background: until the
//! refund lands, the limit errs on the side of refusing. With per-plan limits the units
//! go back under the plan that spent them; with dynamic limits, under the key's limit.
//! A request whose client goes away before the response (the response future is
//! dropped) keeps its units: without a response there is nothing to judge, and the
//! limit errs on the side of refusing.
//!
//! # Limits on usage
//!
//! Some costs are known only once the response has ended: the tokens a language model
//! produced, the bytes a download sent, the rows a query scanned.
//! [`settle(usage)`](crate::LayerBuilder::settle) limits them. The check spends an
//! estimate, the layer's [cost](crate::LayerBuilder::cost) (a closure, a header with
//! [`HeaderCost`](crate::HeaderCost), or what a middleware before the limit read from the
//! body). When the response body ends, the layer reads the actual cost with its
//! [`Usage`](crate::limit::Usage): a response header, a trailer, the body's bytes, or a
//! closure over the end of the finished body. Then **one engine call**
//! ([`Limiter::settle`](crate::Limiter::settle), on Redis and in process alike) settles
//! the difference in the background:
//!
//! - **less** than the estimate: the difference goes back, as a refund does;
//! - **more**: the extra is spent whatever the limit says, even past it. The key then
//!   *owes* it: every check is refused, its `Retry-After` saying when the debt is paid
//!   off, and where the key stands (`RateLimit` `r=0`) says so. A token bucket's debt is
//!   its TAT beyond a full burst ahead of now: the refill pays it off. A rolling window's
//!   is its count above the limit: it is paid off as the oldest buckets expire. A fixed
//!   window's is its count above the quota: **the window's end clears it**, because the
//!   next window starts afresh. With fixed windows, a request that ran far over its
//!   estimate costs the key the rest of its window, never more. Use a token bucket or a
//!   rolling window when every unit must be paid for.
//!
//! Never free, never charged twice: a body that ends settles once. So does a body that
//! fails, is dropped unread (a client gone mid-stream) or panics: it settles what it
//! produced (its bytes so far; a closure sees [`is_complete`](crate::limit::Finished::is_complete)
//! false). A request whose actual cost cannot be read (no header, a stream cut before
//! its usage) keeps its estimate.
//!
//! **The bound.** Admission is decided on estimates, so the units spent exceed the limit
//! by at most the underestimates (actual minus estimate) of the requests admitted
//! before the limit was reached and still running then, across every instance sharing
//! the limit. The next requests pay it back before any is admitted: over time the limit
//! holds. The fallback decides with the same semantics in process (its share of the
//! limit). With the callers' clocks ([`TimeSource::Caller`](crate::TimeSource)),
//! a caller reads a token bucket's debt beyond an empty bucket as an empty bucket: the
//! key is refused for at most a refill past what it owes, not for the whole debt.
//!
//! A set counts both kinds of limits at once:
//! [`requests`](crate::LimitSet::requests) adds a limit that counts requests (one
//! each, whatever the cost, never settled) next to [`limit`](crate::LimitSet::limit)s
//! that count cost. Requests and tokens per minute, as language-model APIs publish their
//! limits, are one atomic pair: a request refused by either spends neither. The
//! `llm_proxy` example is the whole gateway: it estimates the prompt's words plus
//! `max_tokens`, forwards the request, and settles to `usage.total_tokens` from the JSON
//! body or the last chunk of a Server-Sent Events stream:
//!
//! ```
//! use std::time::Duration;
//! use http::request::Parts;
//! use tower_redis_ratelimit::{
//!     key::HeaderKey, limit::{Finished, Usage}, Backend, LimitLayer, LimitSet, TokenBucketConfig,
//! };
//!
//! /// What a middleware before the limit read from the request body.
//! #[derive(Clone, Copy)]
//! struct Estimate(u32);
//!
//! /// `usage.total_tokens` of a JSON body, or of the last SSE chunk that has one.
//! fn total_tokens(finished: &Finished<'_>) -> Option<u64> {
//!     let text = String::from_utf8_lossy(finished.body());
//!     let usage = |json: &str| {
//!         serde_json::from_str::<serde_json::Value>(json).ok()?["usage"]["total_tokens"].as_u64()
//!     };
//!     usage(text.trim()).or_else(|| {
//!         text.lines().rev().filter_map(|l| l.strip_prefix("data:")).find_map(|l| usage(l.trim()))
//!     })
//! }
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let minute = Duration::from_secs(60);
//! let config = LimitSet::new()
//!     .requests("rpm", TokenBucketConfig::new(60, minute, 60))
//!     .limit("tpm", TokenBucketConfig::new(10_000, minute, 10_000));
//! let llm = LimitLayer::builder(&Backend::in_process(), config)
//!     .name("llm")
//!     .key(HeaderKey::from_static("authorization"))
//!     .cost(|parts: &Parts| parts.extensions.get::<Estimate>().map_or(1, |e| e.0))
//!     .settle(Usage::body(64 * 1024, total_tokens))
//!     .build()?;
//! # let _ = llm; Ok(()) }
//! ```
//!
//! **Bytes.** [`Usage::bytes`](crate::limit::Usage::bytes) counts a response body as
//! it streams: "10 MB per minute per tenant" is a limit of `10_000_000` with
//! `.settle(Usage::bytes())`. For request bodies,
//! [`Usage::request_bytes`](crate::limit::Usage::request_bytes) settles to the bytes
//! the handler read, counted by a [`CountRequestBytesLayer`](crate::limit::CountRequestBytesLayer)
//! layer inside the limit, with
//! [`HeaderCost::new(CONTENT_LENGTH, 1)`](crate::HeaderCost) as the estimate.
//!
//! A [shadow](crate::LayerBuilder::shadow) layer settles what its checks admitted, as it
//! counts them; the [metrics](crate::guide::metrics) count the units settled
//! (`ratelimit_settled_units_total`, `charged` or `returned`). A settled request costs
//! two engine calls on Redis: its check, and its settlement after the response (none
//! when the actual cost equals the estimate); see `benches/NOTES.md`.
//!
//! # Lockouts
//!
//! [`lockout(duration)`](crate::PeriodConfig::lockout) on a limit's settings
//! (and on a [`LimitSet`](crate::LimitSet)) turns its first refusal of a key into a
//! block of that key for `duration`, fail2ban-style: every check is refused until then,
//! spending nothing, with the lock's end as `Retry-After`, and a lock running is not
//! extended. Kept in Redis next to the limit's key, it holds on every instance;
//! [`reset`](crate::Limiter::reset) lifts it. With counting by outcome it locks out
//! after N failures (the `login` example: 5 failed logins in 15 minutes lock the user
//! out for 15 minutes, the right password included).
