//! Guides: choosing an algorithm and a key, stacking limits, sets of limits decided
//! all or nothing, calendar windows (days, weeks and months in a time zone), limiters in your own code, counting by outcome, limits on usage, lockouts, hot keys, limits
//! from your own store, trying a limit in shadow mode, limits on outgoing requests, running behind a proxy, on Redis Cluster, when Redis fails, on gRPC, and
//! watching it all. This module has no items, only documentation.
//!
//! # Choosing an algorithm
//!
//! | you want | use | because |
//! |---|---|---|
//! | a quota per calendar period ("1000 per day, reset at midnight") | [`PeriodLimitLayer`](crate::PeriodLimitLayer) with a [`calendar`](crate::LayerBuilder::calendar) (a day, week or month in an IANA zone) or [`align`](crate::LayerBuilder::align) (a fixed UTC offset) | one counter per key; windows end at fixed times everybody can predict |
//! | an API rate that tolerates short bursts | [`TokenBucketLayer`](crate::TokenBucketLayer) | smooth: a steady `rate` with up to `burst` at once; weighted costs |
//! | "at most N in any minute", no matter when the minute starts | [`RollingWindowLayer`](crate::RollingWindowLayer) | no doubling at window edges, at the cost of one counter per bucket |
//! | several limits on one route | one layer each, [stacked](#stacked-limits) | each limit keeps its own algorithm and key |
//! | a limit per plan or tier | [`Plans`](crate::Plans) | one layer, the limit chosen per request |
//!
//! The fixed window is the cheapest and the easiest to explain, but a client can spend
//! its quota at the end of one window and again at the start of the next: twice the
//! quota within moments. When that matters, use the token bucket (which spreads
//! requests out) or the rolling window (which counts any window of the same length).
//! Every algorithm counts only admitted requests, so a refused request never makes a
//! client wait longer.
//!
//! # Choosing a key
//!
//! The key says whose limit a request counts against. Keys come from
//! [`key`](crate::key) extractors; prefer identities the client cannot change at will:
//!
//! - **per user**: let the authentication layer put the user into the request
//!   extensions and key on it with [`ExtensionKey`](crate::key::ExtensionKey). The
//!   authentication layer must run first (be the outer layer); a request without a user
//!   then has no key, and is answered by the [`MissingKey`](crate::MissingKey) setting
//!   (`400` by default).
//! - **per tenant, merchant or API key**: a header set or checked by your gateway, with
//!   [`HeaderKey`](crate::key::HeaderKey) (`x-merchant-id`, `x-api-key`).
//! - **per client address**: [`PeerIp`](crate::key::PeerIp), or
//!   [`ForwardedIp`](crate::key::ForwardedIp) [behind a proxy](#running-behind-a-proxy).
//! - **per plan**: the plan is not a key but a choice of limit: see [`Plans`](crate::Plans),
//!   which picks each request's limit (free plan 10 per minute, paid plan 1000) inside
//!   one layer, with each plan's policy in the response headers.
//!
//! The `tenants` example (`cargo run --example tenants`) does all of these on one axum
//! application.
//!
//! Keys are bytes, and every extractor starts its keys with a tag of its own (`ip:`,
//! `hdr:x-api-key:`, `ext::`, `path:`, `fn:` for closures; the [table](crate::key#tags)
//! lists them). So combining extractors is safe by construction: with
//! `HeaderKey::from_static("x-api-key").or(PeerIp::new())`, a client that sends
//! `x-api-key: 127.0.0.1` is counted under `hdr:x-api-key:127.0.0.1`, never under the
//! address `ip:127.0.0.1` of another client, and an API key cannot be chosen to drain
//! an address's quota. Header values that are not UTF-8 are used byte for byte, so two
//! different values are never one key.
//!
//! # Stacked limits
//!
//! Put one layer per limit on the route, for instance a burst limit and a daily quota.
//! The layers are checked from the outermost in, and each refuses on its own:
//!
//! - a request refused by an outer layer never reaches the inner layers, so it uses
//!   none of their quota;
//! - a request admitted by an outer layer and refused by an inner one has used one unit
//!   of the outer layers' limits (it was counted when they admitted it).
//!
//! So **put the short limit outermost** and the long one inside: a request refused by
//! the burst limit does not burn the daily quota, and a request refused by the daily
//! quota only spends a burst unit, which returns within seconds. (The other order would
//! let a client's burst of refused requests eat its daily quota.)
//!
//! Every admitted response lists each policy in one `RateLimit-Policy` and one
//! `RateLimit` header, outermost first; a refused one lists the policies that saw it,
//! and `Retry-After` holds the longest wait among them. The request extensions hold
//! the [`Decision`](crate::Decision) of the innermost layer, and
//! [`Decisions`](crate::Decisions) lists every layer's, outermost first.
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use tower::ServiceBuilder;
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, PeriodLimitLayer, TokenBucketLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let backend = Backend::in_process();
//! let key = || HeaderKey::from_static("x-api-key");
//! let burst = TokenBucketLayer::builder(&backend)
//!     .name("burst")
//!     .rate(5, Duration::from_secs(1))
//!     .burst(10)
//!     .key(key())
//!     .build()?;
//! let daily = PeriodLimitLayer::builder(&backend)
//!     .name("daily")
//!     .quota(10_000)
//!     .period(Duration::from_secs(86_400))
//!     .key(key())
//!     .build()?;
//! // `ServiceBuilder` applies its layers top to bottom: `burst` is checked first.
//! // (With axum's `.layer(..).layer(..)` it is the other way round: the last is outermost.)
//! let app: Router = Router::new().route(
//!     "/search",
//!     get(|| async { "results" }).layer(ServiceBuilder::new().layer(burst).layer(daily)),
//! );
//! # let _ = app; Ok(()) }
//! ```
//!
//! ```text
//! RateLimit-Policy: "burst";q=10;w=2, "daily";q=10000;w=86400
//! RateLimit: "burst";r=9;t=1, "daily";r=9999;t=86400
//! ```
//!
//! # Several limits at once, all or nothing
//!
//! Stacked layers decide one by one, so an inner refusal has already spent the outer
//! limits. When several limits guard one key (2 per second *and* 10 per day per
//! merchant), a [`LimitSetLayer`](crate::LimitSetLayer) decides them together: on Redis
//! in one script call, where every limit first decides without writing and only when
//! all admit does each count the request; in process under a lock per key. A refusal
//! by any limit spends none. Mix any algorithms; each limit is the policy
//! `<set>.<limit>` in the headers, in the set's order. Use a set when the limits share
//! a key; stacked layers when the keys differ (per user *and* per merchant), putting
//! the short limit outermost.
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::key::HeaderKey;
//! use tower_redis_ratelimit::period::PeriodConfig;
//! use tower_redis_ratelimit::token_bucket::TokenBucketConfig;
//! use tower_redis_ratelimit::{Backend, LimitSetLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let reports = LimitSetLayer::builder(&Backend::in_process())
//!     .name("reports")
//!     .limit("burst", TokenBucketConfig::new(2, Duration::from_secs(1), 2))
//!     .limit("daily", PeriodConfig::new(10, Duration::from_secs(86_400)))
//!     .key(HeaderKey::from_static("x-merchant-id"))
//!     .build()?;
//! # let _ = reports; Ok(()) }
//! ```
//!
//! ```text
//! RateLimit-Policy: "reports.burst";q=2;w=1, "reports.daily";q=10;w=86400
//! RateLimit: "reports.burst";r=1;t=1, "reports.daily";r=9;t=86400
//! ```
//!
//! On Redis Cluster a set needs nothing more: its keys share the limited key's hash tag,
//! so one slot.
//!
//! # Calendar windows
//!
//! Quotas are sold per day in the customer's zone and per month on a plan, and a fixed
//! period gets both wrong: a day in `America/New_York` lasts 23 hours on 2026-03-08 and
//! 25 on 2026-11-01, a month 28 to 31 days. A [`Calendar`](crate::period::Calendar)
//! window is a local day, week (from the weekday you choose) or month in an IANA zone,
//! from local midnight to local midnight whatever the zone's offset does in between;
//! `RateLimit` and `Retry-After` count to its true end. The zone's name is checked when
//! the layer is built (an unknown zone is a `ConfigError` naming it). Check a zone's rules
//! with `cargo run --example calendar -- day America/New_York 2026-03-08` (the window's
//! start and end in UTC, and its 23 hours).
//!
//! 10 000 requests per month per merchant, months in UTC:
//!
//! ```
//! use tower_redis_ratelimit::{key::HeaderKey, period::Calendar, Backend, PeriodLimitLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let monthly = PeriodLimitLayer::builder(&Backend::in_process())
//!     .name("monthly")
//!     .quota(10_000)
//!     .calendar(Calendar::month("UTC"))
//!     .key(HeaderKey::from_static("x-merchant-id"))
//!     .build()?;
//! # let _ = monthly; Ok(()) }
//! ```
//!
//! 5 SMS codes per phone per day in the customer's zone: one plan per zone you serve
//! ([`Plans`](crate::Plans)), picked from the zone your authentication layer found (here
//! a header); a request from a zone not listed falls under the first plan. Each plan is
//! its own limit (`sms.America/New_York`), and a phone has one zone, so its count lives
//! in one place. Put the two limits of a plan in a [set](#several-limits-at-once-all-or-nothing)
//! to mix them: a day in the zone and a month, both spent only when both admit.
//!
//! ```
//! use http::request::Parts;
//! use tower_redis_ratelimit::key::HeaderKey;
//! use tower_redis_ratelimit::period::{Calendar, PeriodConfig};
//! use tower_redis_ratelimit::{Backend, LayerBuilder, Plans};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! const ZONES: [&str; 3] = ["America/New_York", "Europe/Berlin", "Asia/Kolkata"];
//! let zone = |parts: &Parts| {
//!     let zone = parts.headers.get("x-customer-zone")?.to_str().ok()?;
//!     ZONES.into_iter().find(|known| *known == zone)
//! };
//! let mut plans = Plans::new(zone);
//! for zone in ZONES {
//!     plans = plans.plan(zone, zone, PeriodConfig::calendar(5, Calendar::day(zone)));
//! }
//! let sms = LayerBuilder::new(&Backend::in_process(), plans)
//!     .name("sms")
//!     .key(HeaderKey::from_static("x-phone"))
//!     .build()?;
//! # let _ = sms; Ok(()) }
//! ```
//!
//! The windows are the same on both hosts. Each call sends the Redis script the
//! boundaries of three windows around the caller's clock (the one before, the current
//! one, the next), computed from the zone's rules with [jiff](https://docs.rs/jiff) and
//! cached until the window ends; the script picks the window of the time it reads (the
//! Redis server's, or the caller's with [`TimeSource::Caller`](crate::backend::TimeSource))
//! and the key expires at that window's end (`PXAT`). So with the server's clock, the
//! server decides which day a request falls in, even when the caller's clock is off by
//! seconds; with the callers' clocks, an edge is as precise as the clocks (see the table
//! in [clock steps](#clock-steps)). Zone rules come from the system's time zone database
//! (`/usr/share/zoneinfo`), or from the copy built into the crate where the system has
//! none: keep it current on every instance, since instances with different rules for a
//! zone disagree on its windows. The `RateLimit-Policy` header's `w` is the nominal
//! length: 86400 for a day, 604800 for a week, 2592000 (30 days) for a month.
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
//!
//! # Counting by outcome
//!
//! Some limits count only what happened: failed logins and password resets, or paid
//! exports that succeeded. [`count_if`](crate::LayerBuilder::count_if) with
//! [`CountIf::failures`](crate::service::CountIf::failures),
//! [`CountIf::successes`](crate::service::CountIf::successes) or your own predicate on
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
//! [`Usage`](crate::service::Usage): a response header, a trailer, the body's bytes, or a
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
//! produced (its bytes so far; a closure sees [`is_complete`](crate::service::Finished::is_complete)
//! false). A request whose actual cost cannot be read (no header, a stream cut before
//! its usage) keeps its estimate.
//!
//! **The bound.** Admission is decided on estimates, so the units spent exceed the limit
//! by at most the underestimates (actual minus estimate) of the requests admitted
//! before the limit was reached and still running then, across every instance sharing
//! the limit. The next requests pay it back before any is admitted: over time the limit
//! holds. The fallback decides with the same semantics in process (its share of the
//! limit). With the callers' clocks ([`TimeSource::Caller`](crate::backend::TimeSource)),
//! a caller reads a token bucket's debt beyond an empty bucket as an empty bucket: the
//! key is refused for at most a refill past what it owes, not for the whole debt.
//!
//! A set counts both kinds of limits at once:
//! [`requests`](crate::set::LimitSet::requests) adds a limit that counts requests (one
//! each, whatever the cost, never settled) next to [`limit`](crate::set::LimitSet::limit)s
//! that count cost. Requests and tokens per minute, as language-model APIs publish their
//! limits, are one atomic pair: a request refused by either spends neither. The
//! `llm_proxy` example is the whole gateway: it estimates the prompt's words plus
//! `max_tokens`, forwards the request, and settles to `usage.total_tokens` from the JSON
//! body or the last chunk of a Server-Sent Events stream:
//!
//! ```
//! use std::time::Duration;
//! use axum::extract::Request;
//! use tower_redis_ratelimit::key::HeaderKey;
//! use tower_redis_ratelimit::service::{Finished, Usage};
//! use tower_redis_ratelimit::token_bucket::TokenBucketConfig;
//! use tower_redis_ratelimit::{Backend, LimitSetLayer};
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
//! let llm = LimitSetLayer::builder(&Backend::in_process())
//!     .name("llm")
//!     .requests("rpm", TokenBucketConfig::new(60, minute, 60))
//!     .limit("tpm", TokenBucketConfig::new(10_000, minute, 10_000))
//!     .key(HeaderKey::from_static("authorization"))
//!     .cost(|req: &Request| req.extensions().get::<Estimate>().map_or(1, |e| e.0))
//!     .settle(Usage::body(64 * 1024, total_tokens))
//!     .build()?;
//! # let _ = llm; Ok(()) }
//! ```
//!
//! **Bytes.** [`Usage::bytes`](crate::service::Usage::bytes) counts a response body as
//! it streams: "10 MB per minute per tenant" is a limit of `10_000_000` with
//! `.settle(Usage::bytes())`. For request bodies,
//! [`Usage::request_bytes`](crate::service::Usage::request_bytes) settles to the bytes
//! the handler read, counted by a [`CountRequestBytes`](crate::service::CountRequestBytes)
//! layer inside the limit, with
//! [`HeaderCost::new(CONTENT_LENGTH, 1)`](crate::HeaderCost) as the estimate.
//!
//! A [shadow](crate::LayerBuilder::shadow) layer settles what its checks admitted, as it
//! counts them; the [metrics](crate::metrics) count the units settled
//! (`ratelimit_settled_units_total`, `charged` or `returned`). A settled request costs
//! two engine calls on Redis: its check, and its settlement after the response (none
//! when the actual cost equals the estimate); see `BENCHMARKS.md`.
//!
//! # Lockouts
//!
//! [`lockout(duration)`](crate::period::PeriodConfig::lockout) on a limit's settings
//! (and on a [`LimitSet`](crate::set::LimitSet)) turns its first refusal of a key into a
//! block of that key for `duration`, fail2ban-style: every check is refused until then,
//! spending nothing, with the lock's end as `Retry-After`, and a lock running is not
//! extended. Kept in Redis next to the limit's key, it holds on every instance;
//! [`reset`](crate::Limiter::reset) lifts it. With counting by outcome it locks out
//! after N failures (the `login` example: 5 failed logins in 15 minutes lock the user
//! out for 15 minutes, the right password included).
//!
//! # Hot keys: coalescing and leases
//!
//! One Redis round trip per request is the ceiling of an exact distributed limit. Two
//! things go past it:
//!
//! - **Coalescing** (on by default, exact;
//!   [`BackendBuilder::coalesce`](crate::BackendBuilder::coalesce)): while a check of a
//!   key waits for Redis, the checks of that key arriving meanwhile in this process
//!   queue and go together in one script call, decided in arrival order exactly as one
//!   call each. A hot key under many concurrent requests costs about two calls per round
//!   trip instead of one per request; a key with one request at a time costs what it
//!   did.
//! - **Leases** (opt-in, approximate; token buckets:
//!   [`TokenBucketConfig::lease`](crate::token_bucket::TokenBucketConfig::lease)): a
//!   check that goes to Redis takes a few tokens at once and this process answers the
//!   key's next checks from them. Leases shrink near the limit, where they are exact;
//!   over any window N instances admit at most the limit plus N × the lease size. Use
//!   them for high limits on many keys where a few extra requests per window do not
//!   matter, never for a login or payment limit. A [`block`](crate::Limiter::block) or
//!   [`reset`](crate::Limiter::reset) ends the lease of the instance that calls it at
//!   once; another instance may still answer its lease (at most its size, within its
//!   lifetime), then asks Redis and is refused by the block.
//!
//! # Limits from your own store
//!
//! When each merchant or user has a quota of their own, kept in your database or a
//! config service, wrap the algorithm's configuration in
//! [`DynamicLimits`](crate::dynamic::DynamicLimits) with a
//! [`LimitSource`](crate::dynamic::LimitSource): an async lookup from the layer's key to
//! a limit, or `None` for the configured default. A few keys with fixed limits are
//! better served by [`Plans`](crate::Plans); a limit per key that changes without a
//! deploy is this.
//!
//! - **Cost**: answers are cached in process for the [TTL](crate::dynamic::DynamicLimits::ttl)
//!   (30 s) in a bounded cache ([`max_keys`](crate::dynamic::DynamicLimits::max_keys),
//!   100 000), so a request pays no lookup except a key's very first. An answer older
//!   than the TTL keeps serving while one background lookup refreshes it; there is never
//!   more than one lookup per key in flight.
//! - **Freshness**: a changed quota applies within one TTL plus one lookup, without a
//!   restart. On Redis, the key's count carries over (a lowered quota refuses at once if
//!   the key already used more).
//! - **Failure**: a lookup that errs or outlasts the
//!   [`lookup_timeout`](crate::dynamic::DynamicLimits::lookup_timeout) (250 ms) follows
//!   [`OnSourceError`](crate::dynamic::OnSourceError): the last known limit (default),
//!   a fixed limit, or refusing with `429` and a `Retry-After`. The key is asked again
//!   after the [`error_ttl`](crate::dynamic::DynamicLimits::error_ttl), so a store that is
//!   down is not hammered. Choose `LastKnown` when being briefly generous is harmless,
//!   `Limit` for a conservative floor, `Refuse` when a quota must never be exceeded.
//! - **Headers**: `RateLimit-Policy` shows the limit that applied, under the layer's
//!   name; metrics stay under that one name.
//!
//! The `merchants` example serves payments limited per merchant from an in-memory
//! "database" a background task changes.
//!
//! # Shadow mode
//!
//! To try a new limit in production, build it with
//! [`shadow(true)`](crate::LayerBuilder::shadow): it checks and counts every request as
//! an enforcing layer would, records what it would have refused (an `info` event and
//! `ratelimit_requests_total{outcome="shadow_rejected"}`), and serves the request
//! anyway. It adds no headers and no [`Decision`](crate::Decision), so clients and
//! handlers cannot tell it is there, and it never makes a request wait for Redis. Give
//! it a name of its own: layers with the same name and algorithm share their counters.
//! When the numbers look right, remove `shadow(true)`.
//!
//! # In-flight limits
//!
//! A rate says how often; some work needs a cap on how much runs *at once*: exports,
//! report builds, server-sent-event streams, anything whose cost is its duration.
//! [`InFlightLimitLayer`](crate::InFlightLimitLayer) admits at most `slots` requests of
//! one key at a time across every instance on the Redis, and holds each request's slot
//! until its response body ends (or fails, or is dropped with a client that went
//! away), so a stream counts for as long as it streams:
//!
//! ```
//! use std::time::Duration;
//! use tower_redis_ratelimit::{key::HeaderKey, Backend, InFlightLimitLayer};
//!
//! # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
//! let exports = InFlightLimitLayer::builder(&Backend::in_process())
//!     .name("export")
//!     .slots(2)
//!     .lease(Duration::from_secs(10))
//!     .key(HeaderKey::from_static("x-merchant-id"))
//!     .build()?;
//! # let _ = exports; Ok(()) }
//! ```
//!
//! On Redis a slot is a lease that the running request renews (one call per key every
//! third of a lease, however many slots the instance holds on it), so the slots of a
//! process killed mid-request come back within one lease, without a sweeper. A refusal
//! is a `429` with `Retry-After: 1` by default (when a slot frees cannot be foreseen;
//! [`retry_after`](crate::in_flight::InFlightLayerBuilder::retry_after) changes it).
//! While Redis is out, the failure policy decides; the fallback gives each instance
//! its [share](crate::BackendBuilder::fallback_share) of the slots. Put an in-flight
//! limit next to a rate limit, not instead of one: it bounds concurrency, not volume.
//! The `tenants` example limits `GET /export` so; see the [`in_flight`](crate::in_flight)
//! module for the design and its costs (`BENCHMARKS.md`).
//!
//! # Outbound limits
//!
//! The layers above refuse what a service *receives*. For what it *sends* (an upstream
//! API's quota shared by every replica: a payment provider's requests per second per
//! account, an LLM API's tokens per minute), callers want to wait their turn, not fail:
//! wrap the client in an [`OutboundLayer`](crate::outbound::OutboundLayer), or call
//! [`Waiter::acquire`](crate::outbound::Waiter::acquire) from a queue consumer or a
//! batch job.
//!
//! - **Limit**: build a limiter on the Redis backend, named and keyed alike in every
//!   instance (the same prefix, name and key are the same Redis key). A token bucket
//!   with a burst of 1 spreads calls evenly, as most upstream quotas expect; the key is
//!   the unit the upstream limits (an account, a sender), the cost a closure on the
//!   request (tokens of a completion).
//! - **Maximum wait**: a call fails with
//!   [`WaitError::TimedOut`](crate::outbound::WaitError) once it cannot be admitted in
//!   time, at once when the shared state already says so. Set it below the caller's
//!   own timeout; a queue consumer can take a long one, a request handler a short one.
//! - **Cost**: on a token bucket each call reserves its slot in the shared bucket
//!   ([`Limiter::reserve`](crate::Limiter::reserve)) and sleeps until it: one Redis call
//!   per request, however many instances send. On a fixed or rolling window, waiters on
//!   one key queue in order in each process and only the head asks Redis, at the time
//!   the last refusal named: about one call per request with one instance sending, and
//!   one per instance per admission when several saturate one key. See
//!   `BENCHMARKS.md`.
//! - **Redis down**: the backend's [`FailurePolicy`](crate::FailurePolicy): `Fallback`
//!   waits on the in-process state (give it a [fallback
//!   share](crate::BackendBuilder::fallback_share) of `1/N` for N instances),
//!   `FailOpen` sends unlimited, `FailClosed` fails calls with
//!   [`WaitError::Unavailable`](crate::outbound::WaitError).
//!
//! The `outbound` example runs an upstream that counts arrivals per second and clients
//! that share one limit through Redis.
//!
//! # Running behind a proxy
//!
//! Behind a load balancer or reverse proxy every connection comes from the proxy, so
//! [`PeerIp`](crate::key::PeerIp) would put all clients under one key. Use
//! [`ForwardedIp`](crate::key::ForwardedIp) with the networks of your proxies: it
//! believes `Forwarded` / `X-Forwarded-For` only when the connection comes from one of
//! them, and then takes the nearest address in the chain that is not a trusted proxy.
//! Anything a client writes into those headers itself is ignored, so it cannot pick its
//! own key.
//!
//! - List every proxy hop you run (load balancer, ingress, CDN ranges), and nothing
//!   else: a trusted network that clients can reach directly lets them spoof.
//! - Read the header your proxies maintain: `X-Forwarded-For` by default (what nearly
//!   every proxy appends to), or RFC 7239 `Forwarded` with
//!   [`ForwardedIp::header`](crate::key::ForwardedIp::header). Avoid `Auto` unless your
//!   proxies strip the header they do not set: a client could otherwise send its own.
//! - IPv6 clients are grouped by their /64 by default, since one client usually owns a
//!   whole /64 and could otherwise rotate addresses around any limit; use
//!   `ipv6_prefix(56)` or `ipv6_prefix(48)` for networks that hand out larger prefixes,
//!   `ipv6_prefix(128)` for one limit per address. IPv4-mapped addresses
//!   (`::ffff:192.0.2.1`) are keyed as IPv4.
//! - Serve axum with `into_make_service_with_connect_info::<SocketAddr>()` so the peer
//!   address is known.
//!
//! ```
//! use tower_redis_ratelimit::key::{ForwardedHeader, ForwardedIp};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = ForwardedIp::from_strs(["10.0.0.0/8", "192.0.2.10"])?
//!     .header(ForwardedHeader::XForwardedFor)
//!     .ipv6_prefix(56);
//! # let _ = client; Ok(()) }
//! ```
//!
//! # Redis Cluster
//!
//! With the `cluster` feature, give the backend the nodes' URLs with
//! `BackendBuilder::redis_cluster_urls` (the backend connects itself, with
//! `TCP_NODELAY`), or a `deadpool_redis::cluster` pool with
//! `BackendBuilder::redis_cluster`. Every check is one script on one Redis key,
//! `<prefix>:{v1:<escaped key>}:<algorithm>:<name>` (the [layout](crate::backend#redis-keys)),
//! so it runs on the node that owns that key's slot; there are no cross-slot operations
//! and no hash tags to plan. The crate writes the hash tag itself: the braces hold the
//! layout version and the limited key, with any `{`, `}` or `%` in the key escaped
//! (`%7B`, `%7D`, `%25`), so a key's slot depends on the limited key alone. Keys spread
//! over the whole cluster by limited key, whatever braces a client puts into its key,
//! and every limit on one key (a burst limit and a daily quota, say) lives in one slot.
//! (A hot key is therefore hot on one node for all its limits.) Prefixes and names may
//! not contain `{` or `}`. The engine is loaded on every master (as a library of Redis
//! Functions on Redis 7 and later, else as a script) on first use and again after a
//! failover (`NOSCRIPT` and "Function not found" are handled).
//!
//! ```no_run
//! # #[cfg(feature = "cluster")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_redis_ratelimit::deadpool_redis::{cluster, Runtime};
//! use tower_redis_ratelimit::Backend;
//!
//! let pool = cluster::Config::from_urls(vec![
//!     "redis://10.0.0.1:6379".to_owned(),
//!     "redis://10.0.0.2:6379".to_owned(),
//!     "redis://10.0.0.3:6379".to_owned(),
//! ])
//! .create_pool(Some(Runtime::Tokio1))?;
//! let backend = Backend::builder().redis_cluster(pool).build()?;
//! # let _ = backend; Ok(()) }
//! # #[cfg(not(feature = "cluster"))]
//! # fn main() {}
//! ```
//!
//! # TLS, ACL users and Sentinel
//!
//! | deployment | how | tested here |
//! |---|---|---|
//! | TLS, custom CA, mutual TLS (feature `tls`, rustls: no system OpenSSL) | `redis_url("rediss://user:password@host:port")`, [`tls_ca_pem`](crate::BackendBuilder::tls_ca_pem), [`tls_client_auth_pem`](crate::BackendBuilder::tls_client_auth_pem) | single node, on a `redis-server` with a TLS port and certificates the test makes; TLS to a cluster is configured the same way but not tested |
//! | ACL user and password | in the URL | yes, with TLS |
//! | Short-lived tokens, rotating passwords (ElastiCache and MemoryDB IAM auth, Azure Entra ID) | [`credentials(provider)`](crate::BackendBuilder::credentials): an async function returning a user, a token and its expiry; new connections use current credentials, kept connections re-authenticate (`AUTH`) at three quarters of a token's lifetime | single node, on a `redis-server` whose ACL users and passwords the test changes under traffic: no failed decision, the same connection re-authenticated; a failing provider hands the decisions to the failure policy with one log line per 10 s. A three-master cluster: every node's connections move to the new user, and removing the old one fails no decision. Sentinel's master connection takes the provider the same way but is not tested with it |
//! | Redis Sentinel (feature `sentinel`) | [`redis_sentinel(master, sentinel_urls)`](crate::BackendBuilder::redis_sentinel), [`sentinel_master_auth`](crate::BackendBuilder::sentinel_master_auth) | a master, a replica and three sentinels; the master is killed under traffic |
//! | Valkey, Dragonfly, managed Redis | the same URLs; for servers that refuse `TIME` in scripts or answer it uselessly (Dragonfly returns 0, ElastiCache Serverless), [`time_source(TimeSource::Caller)`](crate::BackendBuilder::time_source) | not tested against Valkey, Dragonfly or any managed service (none is installed here). What is tested, on `redis-server`: in caller mode no script calls `TIME` (`INFO commandstats`), two instances share a limit exactly, the bounds below hold with two instances whose clocks differ, and a server clock an hour off changes nothing. Every script declares every key it touches in `KEYS` (checked by a unit test) |
//!
//! Credentials never reach logs or `Debug` output: the builder and the backend show the
//! kind of connection, not its URL; errors are what Redis said. Call
//! [`Backend::probe_redis`](crate::Backend::probe_redis) at start-up to fail or warn early
//! on a wrong password or certificate; otherwise a refused login is a server-wide fault:
//! the breaker opens, one `warn` says why, and the failure policies answer.
//!
//! With [`TimeSource::Caller`](crate::backend::TimeSource), every instance sends its own
//! clock, so instances whose clocks differ by up to `s` (their hosts' difference, plus
//! the time a check takes to reach Redis) bend each limit by at most `s`; every
//! instance on one Redis must use the same time source:
//!
//! | algorithm | a caller ahead by `s` | a caller behind by `s` |
//! |---|---|---|
//! | [fixed window](crate::period#clocks), not aligned | no effect: a window is the key's expiry, counted by the server | no effect |
//! | fixed window, [aligned](crate::period::PeriodConfig::align) or [calendar](crate::period::Calendar) | ends the windows it opens up to `s` early | opens one more window of at most `s` before its view of the edge: at most `(n + 1) × quota` across an edge with `n` distinct clocks; refused up to `s` past its view of the edge |
//! | [token bucket](crate::token_bucket#clocks) | takes up to `rate × s` tokens early: at most `burst + rate × (L + s)` over any span `L` (for `s` up to `max(refill time, 1 s)`) | sees up to `rate × s` fewer tokens: refused, and told to retry, up to `s` longer; the arrival time never moves back |
//! | [rolling window](crate::rolling#clocks) | forgets units up to `s` early: at most `limit` in any span of `(buckets - 1) × interval - s` | counts from the newest bucket (buckets never move back): a unit counts up to one window plus `s` |
//!
//! After a Sentinel failover, the counts the old master had not replicated yet are lost
//! with it: those keys may admit that many requests again. The backend notices the
//! failover when its connection to the old master fails, and asks the sentinels again on
//! the next connection; meanwhile the failure policies answer. A *manual* failover
//! (`SENTINEL FAILOVER`) leaves the old master running and writable: the backend keeps
//! using it until a call fails or the pool makes a new connection and the sentinels name
//! the new master (about 11 s in a test with the default settings), and what it counts
//! there meanwhile is lost when the old master becomes a replica (179 admissions under
//! load in that test). Those keys may admit that many requests again after the switch:
//! the same bound as an unreplicated count, for a longer while.
//!
//! # Configuration as data
//!
//! With the `serde` feature, the backend and the rules can come from a file or the
//! environment instead of code: the `config` module's `RulesConfig` (a `[backend]`
//! table and a list of `[[rules]]`) is a plain `serde` type, read by the loader of your
//! choice (`toml`, `serde_yaml`, `serde_json`, `figment`...). Unknown fields are errors,
//! durations are human strings (`"100ms"`, `"1day"`), and building goes through the
//! builders above, so a setting that cannot work is the same [`ConfigError`](crate::ConfigError)
//! at start-up. Every rule builds a layer of one type, whatever its algorithm and key;
//! `Rules::apply` stacks them on an axum router, the first rule outermost (see
//! [Stacked limits](#stacked-limits) for the order). `examples/rules.rs` serves an app
//! from `examples/rules.toml`.
//!
//! A rule is one limit of one algorithm with a fixed cost. What rules cannot express
//! yet, and takes code: lockouts, leases, counting by outcome (`count_if`), sets of
//! limits, per-plan and dynamic limits, and costs computed from the request. Build
//! those layers with the builders and stack them next to the rules' layers.
//!
//! ```
//! # #[cfg(feature = "serde")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{routing::get, Router};
//! use tower_redis_ratelimit::config::RulesConfig;
//!
//! let mut config: RulesConfig = toml::from_str(r#"
//!     [backend]
//!     prefix = "myapp"
//!     fallback_share = 0.25
//!
//!     [[rules]]
//!     name = "burst"
//!     key = { header = "x-api-key" }
//!     limit = { algorithm = "token_bucket", rate = 5, per = "1s", burst = 10 }
//!
//!     [[rules]]
//!     name = "daily"
//!     key = { header = "x-api-key" }
//!     limit = { algorithm = "period", quota = 10000, period = "1day", align = "UTC" }
//! "#)?;
//! // The environment overrides the file where you say so.
//! if let Ok(url) = std::env::var("REDIS_URL") {
//!     config.backend.url = Some(url);
//! }
//! let rules = config.build()?;
//! let app: Router = rules.apply(Router::new().route("/search", get(|| async { "results" })));
//! # let _ = app; Ok(()) }
//! # #[cfg(not(feature = "serde"))]
//! # fn main() {}
//! ```
//!
//! # Failure modes
//!
//! Redis fails partially more often than it fails cleanly: a slow reply, one key of the
//! wrong type, a server that answers `PING` but refuses writes, a far region. A check
//! never waits longer than the backend's [call timeout](crate::BackendBuilder::call_timeout)
//! (100 ms by default, waiting for a connection included), and no request is ever
//! answered with a server error because of Redis. Each failed call is sorted by what it
//! says about Redis:
//!
//! | fault | examples | what happens |
//! |---|---|---|
//! | transport | refused, reset, timed out, protocol error, no connection | that request is answered by its layer's failure policy; counts toward the breaker |
//! | server-wide | `OOM`, `READONLY`, `LOADING`, `BUSY`, `MASTERDOWN`, `CLUSTERDOWN`, a `NOSCRIPT` a reload did not cure | likewise |
//! | this key only | `WRONGTYPE` (something else wrote a limiter key), a script error caused by the stored value | that request alone is answered by its failure policy, and the key is logged (hashed) at most once per 10 s; never counts toward the breaker |
//!
//! The **breaker** judges Redis by traffic and by time, never by one event. It moves the
//! whole backend to its failure policies on whichever comes first:
//!
//! - the **ratio**: over the last 2 s, at least 20 calls were made and half of them
//!   failed ([`breaker_window`](crate::BackendBuilder::breaker_window),
//!   [`breaker_min_calls`](crate::BackendBuilder::breaker_min_calls),
//!   [`breaker_failure_ratio`](crate::BackendBuilder::breaker_failure_ratio));
//! - the **streak**: three failures in a row, with nothing answered between them, over
//!   at least twice the call timeout (200 ms), however far apart they are. Failures are
//!   failed calls and connection attempts, checks that gave up waiting for a connection
//!   attempt still under way (a Redis that accepts connections and never answers), and
//!   failed probes: from the first failure of a streak, the **probe** tries Redis every
//!   probe interval (500 ms), whatever the traffic, until Redis answers (which ends the
//!   streak) or the breaker opens.
//!
//! | traffic | when the backend moves to its failure policies (defaults) |
//! |---|---|
//! | quiet (a check every few seconds, or none) | at the third failure: within two probe intervals and two call timeouts (1.2 s) of the first failed check, whatever comes after it; at most three checks fail or wait for Redis |
//! | busy | within about three call timeouts (300 ms) of the outage, or as soon as half of 20 calls in 2 s failed; each concurrent caller waits for at most about three checks |
//!
//! From then on no check waits for Redis: each is answered by its layer's failure policy
//! at once. Errors that concern one key never count, nor do the answers of the failure
//! policies and of the deny cache, which make no call: the breaker cannot hold itself
//! open. While it is open, the probe runs every 500 ms: one round trip, a script that
//! writes one small key (`<prefix>:probe`), so a Redis that answers `PING` but refuses
//! writes stays judged unusable. When a probe succeeds, traffic **returns gradually**: a
//! tenth of the checks at first, all of them after 1 s
//! ([`recovery`](crate::BackendBuilder::recovery)), so a recovering Redis is not hit by
//! every instance's whole traffic at once. Every threshold is a
//! [`BackendBuilder`](crate::BackendBuilder) setting, validated when the backend is built.
//!
//! | what Redis does | what the crate does |
//! |---|---|
//! | a reply now and then held past the deadline (a slow command, a retransmission: the replies behind it wait too) | only the requests whose own call timed out are answered locally; no switch |
//! | a reply lost together with its connection (reset) | the call is retried once on a fresh connection within its deadline |
//! | one key holds a value of the wrong type | only that key's requests are answered by the failure policy; every other key stays on Redis |
//! | answers `PING` but refuses writes (`OOM` with `noeviction`, a `READONLY` replica, `LOADING`) | one switch to the failure policies, which stay until a probe's write succeeds; back on Redis within about a probe interval plus the recovery time once writes work |
//! | a round trip above half the call timeout (another zone or region) | stays on Redis as long as the round trip is below the call timeout: connections are made and scripts loaded in the background, apart from any request's deadline |
//! | down, restarted, partitioned | one switch when the breaker judges it (above: within 1.2 s of the first failed check for a quiet service), back within a probe interval plus the recovery time of Redis answering again |
//! | accepts connections and never answers, from start-up | the checks that wait for the first connection attempt give up at the call timeout and count toward the streak: one switch within 1.2 s of the first check giving up (1.3 s after it started; about 300 ms under load), then every check is answered by the failure policy at once while the probe keeps trying |
//! | many concurrent checks at a cold start or after a restart | one connection attempt at a time, shared by every waiting check (no herd) |
//!
//! The figures of each row, measured with a fault-injecting proxy, are in
//! `BENCHMARKS.md` (`cargo run --release --example chaos`).
//!
//! Logs stay quiet and useful: one `warn` when the breaker opens (with the fault and the
//! ratio or streak that opened it), one `info` when a probe succeeds and one when the
//! recovery is over, and repeated errors summarised in one `warn` at most every 10 s.
//! The [metrics](crate::metrics) count switches, time away from Redis (in seconds,
//! while the outage lasts), and failed calls by fault. [`Backend::redis_state`](crate::Backend::redis_state) and
//! [`Backend::redis_switches`](crate::Backend::redis_switches) tell where a backend
//! stands, for a health endpoint.
//!
//! The backend keeps one multiplexed connection and pipelines every check on it. A
//! backend built from a URL ([`redis_url`](crate::BackendBuilder::redis_url),
//! [`redis_cluster_urls`](crate::BackendBuilder::redis_cluster_urls)) sets `TCP_NODELAY`
//! on its sockets; a pool built with `deadpool_redis::Config` leaves it off, which costs
//! latency under concurrency.
//!
//! What a layer answers meanwhile is its [`FailurePolicy`](crate::FailurePolicy):
//!
//! | policy | while Redis is unreachable | choose it when |
//! |---|---|---|
//! | `Fallback` (default) | each instance limits with in-process state of the same algorithm | the limit protects your service: keep limiting, approximately |
//! | `FailOpen` | every request is admitted | availability matters more than the limit |
//! | `FailClosed` | every request is refused, retry after one probe interval | the limit guards something costly (SMS, payments) |
//!
//! With `Fallback`, N instances each admit the whole limit unless you set a
//! [fallback share](crate::BackendBuilder::fallback_share) of `1/N`. Counts made while
//! Redis was away are not merged back: after recovery, Redis's counts apply again.
//! Decisions say which store answered ([`Source`](crate::Source)), and the
//! [metrics](crate::metrics) count the decisions taken without Redis.
//!
//! The local deny cache ([`BackendBuilder::deny_cache`](crate::BackendBuilder::deny_cache))
//! remembers keys Redis refused until their retry time, but for at most its
//! [max age](crate::BackendBuilder::deny_cache_max_age) (1 s by default), so a client
//! hammering an exhausted limit costs Redis one call per second per instance, and a
//! block, a lockout's end or a reset made by another instance reaches this one's
//! answers within that second. A set refused from the deny cache lists every limit in
//! its headers, as Redis's refusal did.
//!
//! # Memory and key floods
//!
//! The in-process state (all of an in-process backend's limits, a Redis backend's
//! fallback) is bounded: at most
//! [`max_local_keys`](crate::BackendBuilder::max_local_keys) keys per backend, all
//! layers together (one million by default: under 256 MB whatever the flood; about
//! 100 bytes per fixed-window or token-bucket key, about 250 for a rolling window of
//! 10 buckets, which counts as two keys). A client that sends ever new keys (random API keys, say) cannot grow
//! it further: when full, keys seen only once are dropped first, so the keys being
//! limited keep their counts; each drop is counted in
//! [`ratelimit_local_evictions_total`](crate::metrics::LOCAL_EVICTIONS_TOTAL). Nothing
//! is swept: expired state is reset when its key comes back, so no request waits on a
//! sweep. Lower the bound on a small service, raise it if more keys than that are
//! active within your longest window; `BENCHMARKS.md` has the key-flood figures.
//!
//! # Clock steps
//!
//! On Redis every instance uses the Redis server's clock (`TIME`), which an NTP step or
//! a failover to a replica with another clock can move. The fixed and rolling windows
//! never admit more than their limit when that clock steps back, nor when it comes back;
//! a token bucket may give back up to one burst on a step back and its return (its key
//! knows the newest time it has seen only to within one refill: a known gap, see
//! [its clocks](crate::token_bucket#clocks)). A step forward at most ends a window (or
//! refills a bucket) early. Each key holds the newest time it has
//! seen: after a step back its time runs on from there at the server's rate (a skew
//! stored in the key's own value), and its state and expiry stay in its own time, so the
//! clock's return finds the key as it left it. The cost: a refusal never waits more than
//! one window (one refill for a token bucket, one period for a fixed window) at any
//! moment, and a key's Redis state outlives its expiry by the step while the clock is
//! behind. Blocks and lockouts are not held in a key's time: a block ends when its key
//! expires on the server's clock, so a step back lengthens a running block by the step
//! (and a step forward shortens it). In-process, time is the monotonic clock, which
//! never steps back. Each algorithm's module says exactly what a step does.
//!
//! # Upgrading
//!
//! During a rolling deploy, instances of two versions of the crate share one Redis. Both
//! decide every limit together, exactly, with no pause and no error:
//!
//! - every key carries the version of its layout in its hash tag (`{v1:…}`, see
//!   [Redis keys](crate::backend#redis-keys)), and every state written under one layout
//!   version is read alike by every release that writes it: a release may add to a
//!   state (a field another release ignores) but never change what a stored field means;
//! - a release that must change a state's meaning moves to the next layout version and
//!   its scripts read the previous version's key when theirs is missing (migrating it in
//!   the same call), while the older release, which never reads the new keys, goes on
//!   with its own until it is gone: two versions split a limit for the deploy at most,
//!   never admit beyond the sum of what each sees, and the changelog says so;
//! - each release's scripts are loaded under their own hash (`EVALSHA`) or library name
//!   (Redis Functions), so the two versions' engines live side by side.
//!
//! `scripts/two-versions` (part of `scripts/test`) proves it for the previous version
//! (the commit in `tests/upgrade/BASE`; the release checklist moves it to each release):
//! the previous version and this one take turns on the same keys (each reading the
//! other's states) and then run at once, on the server's clock and on the callers', for
//! a fixed window, a token bucket, a rolling window and a set; every limit admits
//! exactly its limit and every decision comes from Redis.
//!
//! # gRPC
//!
//! The same layers wrap a tonic server: `Server::builder().layer(limit)`. With the
//! `grpc` feature, refused calls get the gRPC answer (`RESOURCE_EXHAUSTED`, trailers-only,
//! with `RetryInfo` and `QuotaFailure` details), keys come from metadata with
//! [`HeaderKey`](crate::key::HeaderKey), and admitted calls carry the `RateLimit`
//! headers as initial metadata. See the `grpc` module and the `grpc`
//! example (`cargo run --example grpc --features grpc`), a health service that any
//! standard gRPC health client can exhaust.
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
//! let limit = PeriodLimitLayer::builder(&backend)
//!     .name("grpc")
//!     .quota(5)
//!     .period(Duration::from_secs(30))
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
//!
//! # Observability
//!
//! Every decision is a `tracing` event of target `tower_redis_ratelimit` (`trace` when
//! admitted, `debug` when refused, `info` for shadow refusals), with the policy, state,
//! wait and source, never the key. With the `metrics` feature, the layers count
//! requests by policy and outcome, near-limit requests, decisions taken without Redis,
//! Redis errors and latency; the [`metrics`](crate::metrics) module lists the names.
//!
//! # How the crate is built
//!
//! From the top down, each layer only uses the ones below it:
//!
//! | layer | modules | what it does |
//! |---|---|---|
//! | faces | `lib.rs`, `layers.rs`, [`config`](crate::config) | the layers users build (`PeriodLimitLayer`, ...), their settings, rules as data |
//! | the service | [`service`](crate::service) | one generic [`LimitService`](crate::LimitService) and its future: key, cost, check, then the inner service or the rejection |
//! | the client side | [`outbound`](crate::outbound) | a [`Waiter`](crate::outbound::Waiter) over any `Limiter` (one first-in, first-out queue per key, sleeping for the refusal's retry-after) and the layer that waits before calling a client |
//! | the edges | [`response`](crate::response), [`key`](crate::key) | what clients see (HTTP `429`, gRPC `RESOURCE_EXHAUSTED`, the `RateLimit` headers) and which bucket a request counts against |
//! | algorithms | [`period`](crate::period), [`token_bucket`](crate::token_bucket), [`rolling`](crate::rolling) | each a pure step (stored state, now, cost, settings) -> (state, decision), with two hosts: a Lua script and the in-process state |
//! | the backend | [`backend`](crate::backend), `local.rs`, `clock.rs` | where state lives: the Redis host (connection, breaker, probe, deny cache, key layout, time source) and the bounded in-process host |
//! | building blocks | [`ring`](crate::ring) | the pure ring of time buckets under the rolling-window limiter's in-process host and the breaker's [`RollingWindow`](crate::ring::RollingWindow); uses nothing else of the crate |
//!
//! Every algorithm implements [`Limiter`](crate::Limiter), the one thing the service
//! asks. An algorithm's two hosts are proven to decide alike by one table of scenarios
//! per algorithm (`tests/scenarios.rs`), run against the in-process host and against the
//! script on a real `redis-server` whose clock the test sets at each step.
