//! Failure modes: when Redis fails, when keys flood memory, when clocks step.
//!
//! # Failure modes
//!
//! Redis fails partially more often than it fails cleanly: a slow reply, one key of the
//! wrong type, a server that answers `PING` but refuses writes, a far region. A check
//! never waits longer than the backend's [call timeout](crate::BackendBuilder::call_timeout)
//! from its own arrival (100 ms by default, waiting for a connection included; a check
//! that queued for a later call, see [coalescing and
//! batching](crate::guide::deployments#hot-keys-and-busy-nodes-coalescing-batching-and-leases),
//! included), and no request is ever
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
//! | down, restarted, partitioned | one switch when the breaker judges it (above: within 1.2 s of the first failed check for a quiet service), back within a probe interval, a round trip and the recovery time of Redis answering again (1.5 s and a round trip by default: probes start a probe interval apart, however long the last one waited) |
//! | accepts connections and never answers, from start-up | the checks that wait for the backend's first connection attempt wait for it (a first connection takes several round trips, so they are not held to the call timeout) and are answered by the failure policy when it gives up, at the connect timeout (1 s by default); its failure starts the streak: one switch within 1.2 s of it (measured: 1.6 s after the first check; 1.2 s under load), then every check is answered by the failure policy at once while the probe keeps trying |
//! | many concurrent checks at a cold start or after a restart | one connection attempt at a time, shared by every waiting check (no herd) |
//!
//! The figures of each row, measured with a fault-injecting proxy, are in
//! `benches/NOTES.md` (`cargo bench --bench chaos`).
//!
//! Logs stay quiet and useful: one `warn` when the breaker opens (with the fault and the
//! ratio or streak that opened it), one `info` when a probe succeeds and one when the
//! recovery is over, and repeated errors summarised in one `warn` at most every 10 s.
//! The [metrics](crate::guide::metrics) count switches, time away from Redis (in seconds,
//! while the outage lasts), and failed calls by fault. [`Backend::redis_state`](crate::Backend::redis_state) and
//! [`Backend::redis_switches`](crate::Backend::redis_switches) tell where a backend
//! stands, for a health endpoint.
//!
//! The backend keeps one multiplexed connection and pipelines every check on it. A
//! backend built from a URL ([`redis_url`](crate::BackendBuilder::redis_url),
//! [`redis_cluster_urls`](crate::BackendBuilder::redis_cluster_urls)) sets `TCP_NODELAY`
//! on its sockets; a pool built with `deadpool_redis::Config` leaves it off, which costs
//! latency under concurrency: build your pool with it as
//! [`BackendBuilder::redis`](crate::BackendBuilder::redis) shows.
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
//! [fallback share](crate::BackendBuilder::fallback_share) of `1/N`. A share is rounded
//! down to whole units, and where it falls below one unit you choose
//! ([`fallback_rounding`](crate::BackendBuilder::fallback_rounding)): at least one per
//! instance (the default: every instance stays available, so 2 slots over 3 instances
//! may run 3 at once), or within the limit (such an instance refuses that limit until
//! Redis is back, so the fleet never admits above it). Counts made while
//! Redis was away are not merged back: after recovery, Redis's counts apply again.
//! Decisions say which store answered ([`Source`](crate::Source)), and the
//! [metrics](crate::guide::metrics) count the decisions taken without Redis.
//!
//! The local deny cache ([`BackendBuilder::deny_cache`](crate::BackendBuilder::deny_cache))
//! remembers keys Redis refused until their retry time, but for at most its
//! [max age](crate::BackendBuilder::deny_cache_max_age) (1 s by default), so a client
//! hammering an exhausted limit costs Redis one call per second per instance. A block
//! or a reset made by another instance reaches this one's deny cache and leases
//! within about a Redis round trip, by the change subscription (see
//! [Changes on every instance](crate::guide::operations#changes-on-every-instance));
//! while that subscription is down (Redis unreachable, or a backend on a pool of
//! yours without a [`subscription_url`](crate::BackendBuilder::subscription_url)),
//! within the max age, as a lockout's end always does. When
//! the subscription is made again, every cached refusal is forgotten. A set refused
//! from the deny cache lists every limit in its headers, as Redis's refusal did. A
//! cached refusal's wait is Redis's, counted down by this process's clock: where
//! Redis's clock stepped meanwhile, it may say to retry earlier than Redis would, by at
//! most its age in the cache, never later.
//!
//! # Memory and key floods
//!
//! The in-process state (all of an in-process backend's limits, a Redis backend's
//! fallback) is bounded: at most
//! [`max_local_keys`](crate::BackendBuilder::max_local_keys) keys per backend, all
//! layers together (one million by default: under 256 MB whatever the flood; about
//! 100 bytes per fixed-window or token-bucket key, about 250 for a rolling window of
//! 10 buckets, which counts as two keys). A client that sends ever new keys (random API keys, say) cannot grow
//! it further: when full, keys seen only once are dropped first, and keys back at their
//! full limit before keys that have spent some of it or are blocked, so the keys being
//! limited keep their counts (and a locked-out client cannot flood its lockout away)
//! while the store holds keys that carry nothing. Once only limited keys are left, the
//! least recently hit go, and such a key comes back with its full limit: size the bound
//! so that this does not happen. Each drop is counted in
//! `ratelimit_local_evictions_total` (see [`metrics`](crate::guide::metrics)). Nothing
//! is swept: expired state is reset when its key comes back, so no request waits on a
//! sweep. Lower the bound on a small service, raise it if more keys than that are
//! active within your longest window; `benches/NOTES.md` has the key-flood figures.
//!
//! # Clock steps
//!
//! On Redis every instance uses the Redis server's clock (`TIME`), which an NTP step or
//! a failover to a replica with another clock can move. The fixed and rolling windows
//! never admit more than their limit when that clock steps back, nor when it comes back;
//! a token bucket may give back up to one burst on a step back and its return (its key
//! knows the newest time it has seen only to within one refill: a known gap, see
//! [its clocks](crate::TokenBucketConfig#clocks)). A step forward at most ends a window (or
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
