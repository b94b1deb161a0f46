//! Keys: whose limit a request counts against, and limits per key from your own store.
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
//!   [`ForwardedIp`](crate::key::ForwardedIp) [behind a proxy](crate::guide::proxies#running-behind-a-proxy).
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
//! # Keys that are secrets
//!
//! A key is written into Redis as the extractor made it: an API key, a bearer token
//! from `Authorization` or a client address is readable by anyone who can `SCAN` the
//! server, `MONITOR` it or read a dump or a replica. [`.hashed(secret)`](crate::key::KeyExtractor::hashed)
//! replaces each key by `h:` and a keyed BLAKE3 hash of it (128 bits, 34 bytes), so
//! Redis holds none of the client's bytes, and without the secret a key cannot even be
//! tested against a guess (an unkeyed hash of an IPv4 address is reversed by trying
//! the 2³² of them). Admin by value keeps working ([`keys_for`](crate::key::KeyExtractor::keys_for)
//! hashes the value the same way); a listing of what is blocked shows the hashed key
//! and no value. It does not hide the values from this process, which hashes them, nor
//! from whoever holds the secret; give every instance sharing a limit the same secret
//! (from your secret store), and know that a new secret starts every count afresh.
//!
//! ```
//! use tower_redis_ratelimit::key::{HeaderKey, KeyExtractor, PeerIp};
//!
//! let secret = std::env::var("RATELIMIT_KEY_SECRET").unwrap_or_else(|_| "dev only".into());
//! let key = HeaderKey::from_static("authorization").or(PeerIp::new()).hashed(secret);
//! # let _ = key;
//! ```
//!
//! # Limits from your own store
//!
//! When each merchant or user has a quota of their own, kept in your database or a
//! config service, wrap the algorithm's configuration in
//! [`DynamicLimits`](crate::DynamicLimits) with a
//! [`LimitSource`](crate::LimitSource): an async lookup from the layer's key to
//! a limit, or `None` for the configured default. A few keys with fixed limits are
//! better served by [`Plans`](crate::Plans); a limit per key that changes without a
//! deploy is this.
//!
//! - **Cost**: answers are cached in process for the [TTL](crate::DynamicLimits::ttl)
//!   (30 s) in a bounded cache ([`max_keys`](crate::DynamicLimits::max_keys),
//!   100 000), so a request pays no lookup except a key's very first. An answer older
//!   than the TTL keeps serving while one background lookup refreshes it; there is never
//!   more than one lookup per key in flight.
//! - **Freshness**: a changed quota applies within one TTL plus one lookup, without a
//!   restart. On Redis, the key's count carries over (a lowered quota refuses at once if
//!   the key already used more).
//! - **Failure**: a lookup that errs or outlasts the
//!   [`lookup_timeout`](crate::DynamicLimits::lookup_timeout) (250 ms) follows
//!   [`OnSourceError`](crate::OnSourceError): the last known limit (default),
//!   a fixed limit, or refusing with `429` and a `Retry-After`. The key is asked again
//!   after the [`error_ttl`](crate::DynamicLimits::error_ttl), so a store that is
//!   down is not hammered. Choose `LastKnown` when being briefly generous is harmless,
//!   `Limit` for a conservative floor, `Refuse` when a quota must never be exceeded.
//! - **Headers**: `RateLimit-Policy` shows the limit that applied, under the layer's
//!   name; metrics stay under that one name.
//!
//! The `merchants` example serves payments limited per merchant from an in-memory
//! "database" a background task changes.
