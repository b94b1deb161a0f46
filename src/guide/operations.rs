//! Operations: shadow mode, configuration as data, rolling upgrades, observability.
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
//! [Stacked limits](crate::guide::stacking#stacked-limits) for the order). `examples/rules.rs` serves an app
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
//! # Observability
//!
//! Every decision is a `tracing` event of target `tower_redis_ratelimit` (`trace` when
//! admitted, `debug` when refused, `info` for shadow refusals), with the policy, state,
//! wait and source, never the key. With the `metrics` feature, the layers count
//! requests by policy and outcome, near-limit requests, decisions taken without Redis,
//! Redis errors and latency; the [`metrics`](crate::metrics) module lists the names.
