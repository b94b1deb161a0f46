//! The crate's layout: its layers and modules, from the top down.
//!
//! # How the crate is built
//!
//! From the top down, each layer only uses the ones below it:
//!
//! | layer | modules | what it does |
//! |---|---|---|
//! | faces | `lib.rs` (the flat root: every config, limiter, rejection and error), `layers.rs`, `config/` ([`RulesConfig`](crate::RulesConfig)) | the layers users build ([`LimitLayer::builder`](crate::LimitLayer::builder) with an algorithm's config), rules as data |
//! | the inbound limit | [`limit`](crate::limit) | one generic [`Limit`](crate::Limit) and its future: key, cost, check, then the inner service or the rejection |
//! | the client side | [`outbound`](crate::outbound) | a [`Waiter`](crate::outbound::Waiter) over any `Limiter` (one first-in, first-out queue per key, sleeping for the refusal's retry-after) and the layer that waits before calling a client |
//! | the edges | `response/` ([`OnRejection`](crate::OnRejection)), [`key`](crate::key) | what clients see (HTTP `429`, gRPC `RESOURCE_EXHAUSTED`, the `RateLimit` headers) and which bucket a request counts against |
//! | algorithms | `period/` ([`PeriodConfig`](crate::PeriodConfig)), `token_bucket/` ([`TokenBucketConfig`](crate::TokenBucketConfig)), `rolling/` ([`RollingConfig`](crate::RollingConfig)), `set.rs` ([`LimitSet`](crate::LimitSet); how a set decides in `set/hosts.rs`), crate-private modules whose types the root re-exports | each a pure step (stored state, now, cost, settings) -> (state, decision), with two hosts: a Lua script and the in-process state |
//! | deciding | `backend/decide/` | a check's journey top-down in `check.rs` (route, lease, breaker, deny cache, coalescing, engine call, conclusion, failure policy), its steps beside it (`leased.rs`, `reply.rs`, `queued.rs`, `call.rs`, `policy.rs`) and the handles' operations beside it (`operate.rs`); the engine's text (`engine.rs`, which places the Lua's sections) and its wire format (`protocol.rs`), the deny cache, coalescing, leases, blocks and the Redis key layout |
//! | the backend | `backend/` ([`Backend`](crate::Backend), its builder), `backend/redis/`, `local.rs` (its per-key states in `local/slot.rs`), `clock.rs` | where state lives: the Redis connection and its judgement (URLs, TLS, Sentinel, credentials, connections, the breaker and its probe, fault kinds, the scripts' clock), knowing nothing of deciding, and the bounded in-process host |
//! | building blocks | `ring/` (crate-private) | the pure ring of time buckets under the rolling-window limiter's in-process host and the breaker's `RollingWindow`; uses nothing else of the crate |
//!
//! Imports run one way, down this table; `scripts/modgraph` prints the module graph of
//! `src/` and fails on a cycle (CI runs it).
//!
//! Every algorithm implements [`Limiter`](crate::Limiter), the one thing the service
//! asks. An algorithm's two hosts are proven to decide alike by one table of scenarios
//! per algorithm (`tests/scenarios.rs`), run against the in-process host and against the
//! script on a real `redis-server` whose clock the test sets at each step.
//!
//! # The engine's text
//!
//! Each algorithm's Redis step is one Lua file beside its Rust (`period/period.lua`,
//! `token_bucket/token_bucket.lua`, `rolling/rolling.lua`), in two sections: `fast`, its
//! part of the fast path (the common check in the fewest commands), and `general`, its
//! state read, step and save for the general engine. `backend/decide/fast.lua` holds the
//! fast path's check and the entry every call runs; `backend/decide/engine.lua` reads a
//! call's head and limits and is the general engine (every operation, every case).
//! `engine.rs` places the sections (`locals`, `fast`, `entry`, `general`, `return`) so
//! that a call by `EVALSHA` that the fast path decides never builds the general engine.
//! Every word the two sides share (the operations, the head, the limits' letters, the
//! reply layouts) is defined once in `protocol.rs`, whose tests read the Lua files and
//! fail when they disagree with it.
