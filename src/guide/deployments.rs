//! Redis deployments: Cluster, TLS, ACL users, Sentinel, managed servers, hot keys, and
//! the keys the crate writes.
//!
//! # Redis Cluster
//!
//! With the `cluster` feature, give the backend the nodes' URLs with
//! `BackendBuilder::redis_cluster_urls` (the backend connects itself, with
//! `TCP_NODELAY`), or a `deadpool_redis::cluster` pool with
//! `BackendBuilder::redis_cluster`. Every check is one script on the keys of one hash
//! slot: its limits' keys, `<prefix>:{v1:<escaped key>}:<algorithm>:<name>` (one, or a
//! set's members; the [layout](#redis-keys)), and the key's block,
//! `<prefix>:{v1:<escaped key>}:block:...`, so it runs on the node that owns that slot;
//! no script touches two slots and there are no hash tags to plan. (The list of a
//! limit's blocked keys, `<prefix>:blocked:...`, is outside every hash tag and written
//! by calls of its own beside a block.) The crate writes the hash tag itself: the braces hold the
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
//! use tower_redis_ratelimit::{deadpool_redis::{cluster, Runtime}, Backend};
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
//! | Valkey, Dragonfly, Garnet, managed Redis | the same URLs; for servers that refuse `TIME` in scripts (reported of ElastiCache Serverless; [`warm_up`](crate::Backend::warm_up) names the refusal), [`time_source(TimeSource::Caller)`](crate::BackendBuilder::time_source) | Redis 6.2, 7.0, 8.0 and Valkey 8.0, 9.1 by `scripts/matrix` (the README's support table); the others by construction: the scripts are one dialect of Lua 5.1 and 5.4 with portable commands and every key written `KEYS[i]` in each call (`tests/dialect.rs`: luacheck, and the engine's arithmetic run by `lua5.1`, `lua5.4` and Redis alike). In caller mode no script calls `TIME` (`INFO commandstats`), two instances share a limit exactly, the bounds below hold with two instances whose clocks differ, and a server clock an hour off changes nothing |
//!
//! Credentials never reach logs or `Debug` output: the builder and the backend show the
//! kind of connection, not its URL; errors are what Redis said. Call
//! [`Backend::warm_up`](crate::Backend::warm_up) at start-up to fail or warn early
//! on a wrong password or certificate; otherwise a refused login is a server-wide fault:
//! the breaker opens, one `warn` says why, and the failure policies answer.
//!
//! With [`TimeSource::Caller`](crate::TimeSource), every instance sends its own
//! clock, so instances whose clocks differ by up to `s` (their hosts' difference, plus
//! the time a check takes to reach Redis) bend each limit by at most `s`; every
//! instance on one Redis must use the same time source:
//!
//! | algorithm | a caller ahead by `s` | a caller behind by `s` |
//! |---|---|---|
//! | [fixed window](crate::PeriodConfig#clocks), not aligned | no effect: a window is the key's expiry, counted by the server | no effect |
//! | fixed window, [aligned](crate::PeriodConfig::align) or [calendar](crate::Calendar) | ends the windows it opens up to `s` early | opens one more window of at most `s` before its view of the edge: at most `(n + 1) × quota` across an edge with `n` distinct clocks; refused up to `s` past its view of the edge |
//! | [token bucket](crate::TokenBucketConfig#clocks) | takes up to `rate × s` tokens early: at most `burst + rate × (L + s)` over any span `L` (for `s` up to `max(refill time, 1 s)`) | sees up to `rate × s` fewer tokens: refused, and told to retry, up to `s` longer; the arrival time never moves back |
//! | [rolling window](crate::RollingConfig#clocks) | forgets units up to `s` early: at most `limit` in any span of `(buckets - 1) × interval - s` | counts from the newest bucket (buckets never move back): a unit counts up to one window plus `s` |
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
//! # Hot keys and busy nodes: coalescing, batching and leases
//!
//! One Redis round trip per request is the ceiling of an exact distributed limit. Three
//! things go past it:
//!
//! - **Coalescing** (on by default, exact;
//!   [`BackendBuilder::coalesce`](crate::BackendBuilder::coalesce)): while a check of a
//!   key waits for Redis, the checks of that key arriving meanwhile in this process
//!   queue and go together in one script call, decided in arrival order exactly as one
//!   call each. A hot key under many concurrent requests costs about two calls per round
//!   trip instead of one per request; a key with one request at a time costs what it
//!   did.
//! - **Batching** (on by default, exact;
//!   [`BackendBuilder::batch_after`](crate::BackendBuilder::batch_after)): the same idea
//!   across keys. Once two calls of a limiter are in flight to a Redis node, its checks
//!   of other keys queue, and when one of those calls returns they go together in one
//!   script call, which decides each exactly as its own call would. Redis pays a call's
//!   fixed cost once per batch, so at high load it decides more checks per second (the
//!   figures are in `benches/NOTES.md`); below that load every check makes its own call at
//!   once. On Redis Cluster only keys of one slot go together.
//! - **Leases** (opt-in, approximate; token buckets:
//!   [`TokenBucketConfig::lease`](crate::TokenBucketConfig::lease)): a
//!   check that goes to Redis takes a few tokens at once and this process answers the
//!   key's next checks from them. Leases shrink near the limit, where they are exact;
//!   over any window N instances admit at most the limit plus N × the lease size. Use
//!   them for high limits on many keys where a few extra requests per window do not
//!   matter, never for a login or payment limit. A [`block`](crate::Limiter::block) or
//!   [`reset`](crate::Limiter::reset) ends the lease of the instance that calls it at
//!   once; another instance may still answer its lease (at most its size, within its
//!   lifetime), then asks Redis and is refused by the block.
//!
//! # Redis keys
//!
//! Each limited key of each limiter is one Redis key (a string for the fixed window and
//! the token bucket, a hash for the rolling window, a sorted set of leases for an
//! [in-flight](crate::in_flight) limit), laid out as (layout version 1):
//!
//! ```text
//! <prefix>:{v1:<escaped key>}:<algorithm>:<name>
//! ```
//!
//! - `<prefix>` is the backend's [prefix](crate::BackendBuilder::prefix) (default `ratelimit`);
//! - `v1` is the version of this layout: a later layout gets another version, so it can
//!   never read (or be read as) this one's state;
//! - `<escaped key>` is the key's bytes (as the [key extractor](crate::key) made them,
//!   tag included) with `%` written `%25`, `{` written `%7B` and `}` written `%7D`, every
//!   other byte (`:`, bytes that are not UTF-8, ...) kept as it is;
//! - `<algorithm>` is `period`, `token`, `rolling` or `inflight`, and `<name>` the limiter's
//!   [name](crate::LayerBuilder::name).
//!
//! For example, the `sms` fixed-window limit of the client with API key `k1` is
//! `ratelimit:{v1:hdr:x-api-key:k1}:period:sms`.
//!
//! The limits of a [set](crate::LimitSet) and the blocks of every limit have places of their
//! own after the hash tag:
//!
//! ```text
//! <prefix>:{v1:<escaped key>}:set:<set name length>:<set name>:<algorithm>:<limit>
//! <prefix>:{v1:<escaped key>}:block:<the limit key's part after `}:`>
//! ```
//!
//! so the `daily` limit of the set `reports` is `…}:set:7:reports:period:daily`, the
//! block of the `login` limit is `…}:block:period:login` and a set's block is its first
//! limit's (`…}:block:set:7:reports:token:burst`). A per-plan layer's plan `free` of
//! layer `api` is the limiter named `api.free` (a handle of that name reaches it).
//!
//! No two (prefix, algorithm, name, key) tuples share a Redis key, whatever bytes they
//! hold: prefixes and names contain no `{` or `}` (checked when they are built), so the
//! first `{` ends the prefix; the escaped key contains no `{` or `}`, so the first `}`
//! ends it; the algorithm contains no `:`, so the name is the rest. `set` and `block`
//! are not algorithms, a set's name is length-prefixed and what follows `block:` is a
//! whole limit's part, so no set limit, block or name (`n:block`, `x.y`, ...) ever
//! reaches another limit's key.
//!
//! The part in braces is a Redis Cluster hash tag: a key's slot is determined by
//! `v1:` and the escaped key alone, so keys spread over the whole cluster by limited key,
//! and the keys of every limit on one limited key share a slot (what a script that
//! checks several limits of one request at once needs). The tag is never empty, not even
//! for the empty key.
//!
//! Every script declares every key it touches in `KEYS`, as Redis Cluster, Dragonfly
//! and managed servers require, and writes it `KEYS[i]` in each command (cluster
//! proxies such as Alibaba Cloud's read the script's text): a check declares its limits'
//! keys (one, or a set's) and the key's block, all in the limited key's hash slot, and
//! reads only its limits' keys unless the key is blocked (see [blocks](#blocks-on-redis));
//! the health probe only
//! `<prefix>:probe`. A reset or a block also publishes the limit's key on the channel
//! `<prefix>:changes` (not a key), to which every backend built from URLs subscribes
//! (see [Changes on every instance](crate::guide::operations#changes-on-every-instance)):
//! an ACL user needs `&<prefix>:changes` for changes to reach every instance at once;
//! without it they still do within the deny cache's max age.
//!
//! Each limit also keeps the list of its blocked keys, for
//! [`Limiter::blocked`](crate::Limiter::blocked), in a key of its own outside every hash
//! tag (on Redis Cluster, in a slot of its own), written by the crate in calls of its
//! own beside the blocks (see [Listing what is
//! blocked](crate::guide::operations#listing-what-is-blocked)):
//!
//! ```text
//! <prefix>:blocked:<the limit key's part after `}:`>
//! ```
//!
//! a sorted set of the blocked keys (the key's bytes, unescaped) scored by their
//! blocks' ends in Unix milliseconds: `ratelimit:blocked:period:login`, a set's
//! `ratelimit:blocked:set:7:reports:token:burst`.
//!
//! # Blocks on Redis
//!
//! A block (a [`block`](crate::Limiter::block), or a lockout) is its own key,
//! `…}:block:…`, which holds it until it ends: the engine reads it on every call that
//! is not a plain admission. So that the common check reads each limit's key and
//! nothing else (one key fewer per decision, which is what a large keyspace makes
//! Redis pay for), the call that blocks a key also *marks* its limits' keys: a token
//! bucket's value gets a last word `b` (`"<TAT> <skew> <floor> b"`; a key that held
//! nothing is marked too, `"- 0 - b"`), a rolling window's hash a field `b`, a fixed
//! window's count 2^52 more. A marked key is one the fast path (and the fast
//! settlement of one limit, which a layer counting usage makes after each response)
//! leaves to the general engine, which reads the block. Marks live at least as long as the block; any call
//! that writes while the key is blocked marks again, and the first one after the block
//! has ended takes them off (and deletes a block ending that very millisecond, which a
//! step of the server's clock back would otherwise bring back unmarked). A fixed window that starts during a block starts on an
//! empty key, so the fast path reads the block whenever it starts a window. So a token
//! bucket's or a rolling window's state lives at least until the block ends (a fixed
//! window's keeps its window's end): this shows only when the server's clock steps
//! forward past the state's own expiry during a block, where the state is kept instead
//! of forgotten (`tests/model.rs` models it).
//!
//! What this costs a blocked key: the call that blocks it writes each limit's key once
//! more, its checks run the general engine (as refusals do), and the first call after
//! the block writes each limit's key once more.
//!
//! What a rolling deploy from a version before marks costs, for blocked keys only
//! (limits hold exactly either way; the two-version test runs without blocks):
//! - a block or lockout written by an instance of the earlier version is seen by the
//!   new instances only on keys whose limits run the general engine (a refusal, a new
//!   fixed window), and so is a block whose marks an earlier instance's write dropped
//!   (a refund or a settlement of a blocked key rewrites a token bucket without its
//!   mark; any write of a rolling window deletes its field `b`);
//! - instances of the earlier version read every mark without error, but a marked
//!   fixed window's count means more to them: after the block has ended they refuse the
//!   key until its window ends, unless a new instance has written the key first (which
//!   takes the mark off). This is the one state whose meaning marks change (see
//!   [Upgrading](crate::guide::operations#upgrading)).
//!
//! The list of each limit's blocked keys (`<prefix>:blocked:…`, above) is apart from
//! the blocks and their marks: a listing never reads a limit's or a block's key.
//!
//! # One name, one limit
//!
//! Every limiter of one name and algorithm on one backend is the same limit: layers and
//! handles built with that name share its Redis keys and, in process (and in the
//! fallback), its in-process state, blocks included. Only the limit's settings are the
//! limiter's own: give two different limits two names. Which clock the scripts read
//! (the server's `TIME`, or the caller's clock passed as an argument) is
//! [`BackendBuilder::time_source`](crate::BackendBuilder::time_source).
