//! # Metrics
//!
//! What the layers record with the [`metrics`](https://docs.rs/metrics) crate (feature
//! `metrics`): the names, their labels, and when they change.
//!
//! Every layer records into whatever recorder is installed (a Prometheus exporter, for
//! instance); without the `metrics` feature nothing is recorded and nothing is compiled
//! in. A layer registers its handles on the first request it sees, with the recorder
//! installed at that moment: install the recorder before serving.
//!
//! A Grafana dashboard and Prometheus alert rules for these metrics are described in
//! [Dashboard and alerts](crate::guide::operations#dashboard-and-alerts).
//!
//! | name | kind | labels | counts |
//! |---|---|---|---|
//! | `ratelimit_requests_total` | counter | `policy`, `outcome`; refusals also `limit` | every request a layer saw, by outcome (below); a refusal by the limit that refused it (below) |
//! | `ratelimit_near_limit_total` | counter | `policy` | admitted requests that left at most 10 % of the limit |
//! | `ratelimit_fallback_decisions_total` | counter | `policy`, `source` | decisions taken without Redis because it was unreachable: `source` is `fallback`, `fail_open` or `fail_closed` (the layer's [`FailurePolicy`](crate::FailurePolicy)) |
//! | `ratelimit_fallback_active` | gauge | `prefix` | `1` while a Redis backend (by key prefix) is away from Redis (its breaker open, or recovering), `0` otherwise |
//! | `ratelimit_redis_errors_total` | counter | `policy`, `kind` | failed Redis checks: `kind` is `transport` (refused, reset, timed out, no connection), `server` (`OOM`, `READONLY`, `LOADING`, … : Redis cannot serve anyone) or `key` (`WRONGTYPE`, a script error caused by a stored value: only this key) |
//! | `ratelimit_redis_switches_total` | counter | `prefix`, `to` | breaker transitions of a Redis backend: `to` is `fallback` (judged unusable), `recovering` (a probe succeeded) or `redis` (recovered) |
//! | `ratelimit_redis_fallback_seconds_total` | counter | `prefix` | time a Redis backend spent away from Redis (fallback and recovery), in whole seconds, counted while it lasts (every probe interval) and when it ends |
//! | `ratelimit_redis_duration_seconds` | histogram | `policy` | the time of each Redis check, pool wait included |
//! | `ratelimit_settled_units_total` | counter | `policy`, `direction` | units settled after responses ([`Usage`](crate::limit::Usage)): `direction` is `charged` (actual costs above the estimates) or `returned` (below) |
//! | `ratelimit_local_evictions_total` | counter | `prefix` | keys dropped from a backend's (by key prefix) full in-process state to make room for new ones (see [`max_local_keys`](crate::BackendBuilder::max_local_keys)) |
//!
//! The outcomes of `ratelimit_requests_total` exclude each other, so their sum is the
//! number of requests the layer saw (free requests, of cost zero, are not counted):
//!
//! | `outcome` | the request was |
//! |---|---|
//! | `admitted` | admitted |
//! | `rejected` | rejected by the limit |
//! | `shadow_rejected` | over the limit of a [shadow](crate::LayerBuilder::shadow) layer, and served anyway |
//! | `missing_key` | without a usable key, answered by the layer's [`MissingKey`](crate::MissingKey) setting |
//!
//! `policy` is the [policy name](crate::Policy::name): the layer's name, or
//! `<name>.<plan>` for a [per-plan](crate::limit::Plans) layer; every metric of a
//! layer is labelled so, a [set](crate::LimitSet)'s Redis calls and errors too (the
//! set decides in one call). A refusal (`rejected`, `shadow_rejected`) is also
//! labelled `limit`: the set's limit that refused it (`api.free.minute` beside
//! `api.free.day`: the limit whose numbers the response's headers lead with), or the
//! policy itself for a limit that is not a set and for a set's
//! [block](crate::Limiter::block). Keys are never labels (they are unbounded, and may
//! be secrets).
//!
//! The same events are `tracing` events of the `tower_redis_ratelimit` target: `trace`
//! for admitted requests, `debug` for rejections (and missing keys that the layer
//! allows or keys in its place, and keys a client did not send), `warn` for requests
//! refused for a key the server should have provided (at most one line per layer every
//! 10 s, with a count of the others; see [`KeyOrigin`](crate::key::KeyOrigin)), `info`
//! for shadow rejections.
