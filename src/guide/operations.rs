//! Operations: shadow mode, configuration as data, changes on every instance, listing
//! what is blocked, the admin flow end to end, rolling upgrades, observability, a
//! dashboard and alerts.
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
//! environment instead of code: `RulesConfig` (a `[backend]`
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
//! use tower_redis_ratelimit::RulesConfig;
//!
//! let config: RulesConfig = toml::from_str(r#"
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
//! // The environment overrides the file where you say so, through the backend's builder.
//! let mut backend = config.backend.builder()?;
//! if let Ok(url) = std::env::var("REDIS_URL") {
//!     backend = backend.redis_url(url);
//! }
//! let rules = config.build_on(&backend.build()?)?;
//! let app: Router = rules.apply(Router::new().route("/search", get(|| async { "results" })));
//! # let _ = app; Ok(()) }
//! # #[cfg(not(feature = "serde"))]
//! # fn main() {}
//! ```
//!
//! # Changes on every instance
//!
//! An administrator's [reset](crate::Limiter::reset) (which also lifts a block),
//! [block](crate::Limiter::block) or [unblock](crate::Limiter::unblock) (which keeps the
//! count), made on any instance,
//! reaches every instance sharing the Redis at once, while each keeps refusing
//! exhausted keys from its local [deny cache](crate::BackendBuilder::deny_cache) and
//! answering from its [leases](crate::TokenBucketConfig::lease):
//!
//! - the engine's script that makes the change also publishes the changed key on the
//!   channel `<prefix>:changes` (a `PUBLISH` in the same call, so the message leaves
//!   Redis with the change; on a Redis Cluster a `PUBLISH` reaches the subscribers of
//!   every node);
//! - every Redis backend keeps one connection subscribed to that channel, made as its
//!   check connection is (the same URL, TLS, credentials and their rotation, the
//!   master a Sentinel names, one node of a cluster), in RESP3; it is opened in the
//!   background after the first check connection, answers a `PING` every second, and
//!   is made again with a backoff (0.1 s doubling to 5 s) when it fails;
//! - a message makes the backend forget its cached refusal of the key and end its
//!   lease of the key (the lease's units are forgotten), so the next check of the key
//!   goes to Redis: within about one Redis round trip of the change (measured in
//!   `benches/NOTES.md`: from a reset on one instance to the first admission on another).
//!   No check waits for the subscription or pays for it.
//!
//! When the subscription is down (a partition, a restart, a user without the right to
//! the channel: `&<prefix>:changes` in an ACL), changes reach an instance as they did
//! without it: its deny cache answers a refusal for at most its
//! [max age](crate::BackendBuilder::deny_cache_max_age) (1 s by default), and a lease
//! lasts at most its lifetime. When the subscription is made again, the instance
//! forgets every cached refusal, since changes made meanwhile were not heard. A
//! backend built on a pool of yours ([`Backend::redis`](crate::Backend::redis),
//! [`BackendBuilder::redis_cluster`](crate::BackendBuilder::redis_cluster)) subscribes
//! through the pool's URL given to
//! [`subscription_url`](crate::BackendBuilder::subscription_url) (deadpool-redis does
//! not tell a pool's address, and the pool's connections cannot take messages); without
//! it there is no subscription, and the max age is the bound.
//!
//! A [dynamic limit](crate::DynamicLimits) that changes in your store is applied by each
//! instance when its cache looks the key up again (within the cache's TTL), and from
//! then on a refusal cached under the old limit is not answered: the next check goes
//! to Redis under the new limit.
//!
//! # Listing what is blocked
//!
//! [`Limiter::blocked(max)`](crate::Limiter::blocked) lists the keys a limit refuses
//! now because of a [block](crate::Limiter::block) or a
//! [lockout](crate::PeriodConfig::lockout), soonest end first: each
//! [`Blocked`](crate::Blocked) names the limit, the key and when its block ends; a
//! layer's [`blocked`](crate::LimitLayer::blocked) also names the client's value (the
//! API key `trap` of `hdr:x-api-key:trap`), and the [admin router](crate::AdminRouter) serves
//! it as `GET /blocked`.
//!
//! Its cost is bounded whatever the keyspace: blocks are rare, so each limit keeps a
//! small list of its blocked keys beside them, and a listing reads that list alone,
//! never `SCAN` or `KEYS`.
//!
//! - On Redis the list is a sorted set per limit, `<prefix>:blocked:<algorithm>:<name>`
//!   (a set's: `<prefix>:blocked:set:…`, as its block key), each member a blocked key
//!   scored by its block's end (Unix ms). A listing is one
//!   `ZRANGEBYSCORE … (now +inf WITHSCORES LIMIT 0 max` (`max` at most 10 000). The
//!   crate writes it from Rust, in a call of its own: after a handle's block or reset
//!   that Redis made (`ZADD` or `ZREM`, before the handle answers), and after a check
//!   that Redis refused with a lockout (in the background: no check waits for it or
//!   fails with it); each write first drops the entries that have ended, so the set
//!   holds about the blocks running now. An ACL user needs the key
//!   (`~<prefix>:blocked:*`) for it to be written and read; a failed write is a `warn`
//!   at most once a minute per limit.
//! - In process the list is a registry of the blocked keys themselves, per limit (at
//!   most 10 000 running at once are listed), checked against the blocks when listed.
//!
//! The block's own key stays the truth and the list is advisory. On Redis it is written
//! in a separate call (on Redis Cluster the list lives in a slot of its own, apart from
//! the keys' hash tags), so it may lag a lockout by that call, miss a block whose write
//! failed, and keep listing until its end a block whose key was evicted or deleted, or
//! a lockout lifted on another instance before its own write landed. A block made while Redis was unreachable holds in process only (it refuses
//! while the fallback answers) and is not listed from Redis; a listing while Redis does
//! not answer is an error ([`AdminError::Listing`](crate::AdminError::Listing)), never a guess.
//!
//! # A caller's usage
//!
//! Customers should not have to infer their standing from `429`s. The layers an
//! [`AdminRouter`](crate::AdminRouter) knows also serve a route for the callers
//! themselves, [`usage_router`](crate::AdminRouter::usage_router): `GET /` answers every
//! limit of the request's own key (each layer's extractor finds it, each plan layer
//! picks the request's plan, a set lists each of its limits) with `limit`, `used`,
//! `remaining` (left now), `reset_s` and `window_s`, and the `RateLimit` headers,
//! from peeks of the limits that enforce: nothing is spent. Mount it outside the
//! layers and behind the same authentication as the API (the key is the caller's).
//!
//! ```text
//! curl -H 'x-api-key: k_pro1' http://127.0.0.1:3000/rate_limit
//! # {"limits":[{"name":"api.pro.minute","algorithm":"fixed_window","limit":600,"used":5,"remaining":595,"reset_s":60,"window_s":60}, …]}
//! ```
//!
//! # The keys refused most
//!
//! A key is never a metric label (keys are unbounded, and may be secrets), so the
//! metrics say how much a limit refuses, not whom. A layer's
//! [`denied(max)`](crate::LimitLayer::denied) says whom: the keys it refused most in
//! the last 5 to 10 minutes, each with its policy, the client's value where the
//! extractor names it, and its count of refusals; the [admin router](crate::AdminRouter)
//! serves it as `GET /denied?max=N`. Each instance counts its own refusals in a sketch
//! of fixed memory (space-saving, 256 counters per policy): a count is at most
//! `error` above the truth, `error` at most the window's refusals over 256, and every
//! key refused more often than that is listed. Ask every instance (behind a load
//! balancer, each one's admin port) to see the fleet's offenders.
//!
//! # The admin flow end to end
//!
//! The `admin`, `login` and `tenants` examples mount the [admin router](crate::AdminRouter)
//! under `/admin/ratelimit`, behind a bearer token (`ADMIN_TOKEN`). Two instances of the
//! `admin` example on one Redis, an API key blocked through one, seen listed, lifted,
//! and admitted again on the other:
//!
//! ```text
//! export REDIS_URL=redis://127.0.0.1:6379 ADMIN_TOKEN=s3cret
//! PORT=3001 cargo run --example admin --features admin &
//! PORT=3002 cargo run --example admin --features admin &
//! curl -X POST -H "authorization: Bearer $ADMIN_TOKEN" 'http://127.0.0.1:3001/admin/ratelimit/api/trap/block?seconds=3600'
//! curl -s -o /dev/null -w '%{http_code}\n' -H 'x-api-key: trap' http://127.0.0.1:3002/   # 429
//! curl -H "authorization: Bearer $ADMIN_TOKEN" http://127.0.0.1:3002/admin/ratelimit/blocked
//! # {"blocked":[{"key":"hdr:x-api-key:trap","limit":"api","policy":"api","remaining_ms":3599…,"until_ms":…,"value":"trap"}]}
//! curl -X POST -H "authorization: Bearer $ADMIN_TOKEN" http://127.0.0.1:3002/admin/ratelimit/api/trap/unblock
//! curl -s -o /dev/null -w '%{http_code}\n' -H 'x-api-key: trap' http://127.0.0.1:3001/   # 200
//! ```
//!
//! In the `login` example a user locked out after five failed logins is listed the same
//! way (`"limit":"login","value":"alice"`) and lifted with
//! `POST /admin/ratelimit/login/alice/reset`; in the `tenants` example a merchant's
//! reports pair is `POST /admin/ratelimit/reports/m1/block?seconds=60`.
//!
//! # Upgrading
//!
//! During a rolling deploy, instances of two versions of the crate share one Redis. Both
//! decide every limit together, exactly, with no pause and no error:
//!
//! - every key carries the version of its layout in its hash tag (`{v1:…}`, see
//!   [Redis keys](crate::guide::deployments#redis-keys)), and every state written under one layout
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
//! One exception, for blocked keys only: the marks that let a check read one key per
//! limit (see [Blocks on Redis](crate::guide::deployments#blocks-on-redis)) add 2^52 to a blocked
//! fixed window's count, which a release from before them reads as a count. Such an
//! instance refuses a key whose block has ended until the key's window ends (unless a
//! newer instance wrote the key first); and a newer instance may miss a block that an
//! older one wrote, until the key's limits refuse or a fixed window starts. Neither
//! ever admits beyond a limit.
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
//! admitted, `debug` when refused, `info` for shadow refusals), with the fields below,
//! the state and the wait, never the key. The layer also records the fields on the
//! caller's span (the request's, where the span declares them: tower-http's
//! `TraceLayer` with a `make_span_with` of your own), so the request's trace says how
//! the limit decided:
//!
//! | field | value |
//! |---|---|
//! | `rate_limit.decision` | `admitted`, `rejected` or `shadow_rejected` |
//! | `rate_limit.policy` | the policy that decided (`api`; a plan's `api.pro`) |
//! | `rate_limit.rejected_by` | on a refusal, the limit that refused: a set's limit (`api.minute`), else the policy |
//! | `rate_limit.source` | who answered: `redis`, `fallback` (Redis unreachable), `deny_cache`, `lease`, `in_process`, `fail_open`, `fail_closed` |
//! | `rate_limit.shadow` | whether the layer is a [shadow](crate::LayerBuilder::shadow) one |
//!
//! ```
//! use axum::{body::Body, routing::get, Router};
//! use tower_http::trace::TraceLayer;
//! use tracing::field::Empty;
//!
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "ok" }))
//!     // .layer(your limit layer)
//!     .layer(TraceLayer::new_for_http().make_span_with(|_: &http::Request<Body>| {
//!         tracing::info_span!(
//!             "request",
//!             rate_limit.decision = Empty,
//!             rate_limit.policy = Empty,
//!             rate_limit.rejected_by = Empty,
//!             rate_limit.source = Empty,
//!             rate_limit.shadow = Empty,
//!         )
//!     }));
//! ```
//!
//! With stacked layers the span holds the decision recorded last: the innermost
//! layer's, or the one that refused. Nothing is recorded, and nothing allocated, where
//! no subscriber listens. With the `metrics` feature, the layers count
//! requests by policy and outcome, near-limit requests, decisions taken without Redis,
//! Redis errors and latency; the [`metrics`](crate::guide::metrics) module lists the names.
//!
//! # Dashboard and alerts
//!
//! The repository has a Grafana dashboard and Prometheus alert rules for these metrics
//! (they are not in the published package: copy them from the repository):
//!
//! - `ops/grafana/ratelimit.json`: import it in Grafana (Dashboards, New, Import) and
//!   pick the Prometheus data source for its `datasource` variable. Its panels: refusals
//!   by policy and by the limit that refused (a [set](crate::LimitSet)'s member), admitted
//!   requests, the refusal ratio, the fallback gauge, decisions taken without Redis, the
//!   Redis check's p99 and p50, breaker switches, Redis errors by kind, and near-limit
//!   requests.
//! - `ops/prometheus/ratelimit.rules.yml`: list it under `rule_files:` in
//!   `prometheus.yml` (`promtool check rules` checks it; `promtool test rules
//!   ops/prometheus/ratelimit.rules.test.yml` fires each alert on made-up series).
//!   Each threshold is stated in its annotations; adjust them to your traffic.
//!
//! | alert | fires when | means |
//! |---|---|---|
//! | `RateLimitFallbackActive` (critical) | `ratelimit_fallback_active` is 1 for 30 s | a Redis backend decides in process: each instance counts alone, so a limit of N is N per instance (or the failure policy answers) |
//! | `RateLimitHighRefusalRatio` (warning) | over 25 % of a policy's requests are refused for 10 min, at 1 request/s or more | an abusive client, or a limit too low for the traffic: the dashboard names the refusing limit |
//! | `RateLimitRedisLatencyHigh` (warning) | the p99 of a Redis check is over 50 ms for 5 min | half the default call timeout: requests wait on Redis, and near the timeout checks fail and the breaker opens |
//! | `RateLimitBreakerFlapping` (warning) | more than 3 switches to the fallback in 15 min | Redis comes and goes (failovers, timeouts): the limits move between shared and per-instance counts |
//! | `RateLimitRedisErrors` (warning) | over 0.1 failed Redis calls/s for 5 min, by kind | `transport`: Redis unreachable or slow; `server`: `OOM`, `READONLY`, `LOADING`; `key`: another program wrote the limiter's keys |
//! | `RateLimitNearLimit` (info) | over half of a policy's admitted requests leave at most 10 % of the limit for 15 min | clients live at the edge of the limit: refusals are near, or the limit is too low |
//!
//! A backend registers its switches counters at 0 when it is built, so `increase()`
//! counts a process's first switch too; the errors counters appear at their first
//! increment, which `increase()` and `rate()` do not count (a series that starts at 1
//! has not increased). `tests/prometheus.rs` runs a real Prometheus on both files, against an app on
//! a real Redis: every panel's query returns data, every rule evaluates, and
//! `RateLimitFallbackActive` fires once Redis is killed.
