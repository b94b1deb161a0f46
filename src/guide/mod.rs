//! The user guide: how to choose, combine, deploy and operate the limits, one page per
//! topic. These modules have no items, only documentation; every example in them is a
//! doc test.
//!
//! The item docs say what each type and setting does; the guide says which to pick and
//! why, and what happens around them (proxies, Redis deployments and failures, upgrades).
//! Start with [algorithms] and [keys]; the other pages stand alone.
//!
//! | page | chapters | covers |
//! |---|---|---|
//! | [algorithms] | Choosing an algorithm | fixed window, token bucket or rolling window; one layer per limit or per plan |
//! | [keys] | Choosing a key; Limits from your own store | whose limit a request counts against (user, tenant, address, plan), and a limit per key looked up in your database |
//! | [stacking] | Stacked limits; Several limits at once, all or nothing; Exemptions | a burst limit and a daily quota on one route: which goes outermost, sets decided together, requests that never count (preflights, health checks) and the limit's place beside a CORS layer |
//! | [calendar] | Calendar windows | a local day, week or month of an IANA zone, daylight saving time included |
//! | [limiters] | Limiters in your own code | `check`, `peek`, `refund`, `reset` and `block` from jobs and admin tools; per-message limits of WebSocket, SSE and gRPC streams (`LimitLayer::stream`), and streams limited item by item (`StreamLimit::limit`) |
//! | [usage] | Counting by outcome; Limits on usage; Lockouts | counting failures or successes only, settling costs known once the response has ended (tokens, bytes), fail2ban-style lockouts |
//! | [shaping] | Waiting instead of refusing; Priority classes | requests that wait their turn instead of a `429`, and critical, standard and sheddable traffic sharing one limit |
//! | [in_flight] | In-flight limits | at most N requests of one key at once, held until the response body ends |
//! | [outbound] | Outbound limits | waiting for a turn before calling an upstream whose quota every replica shares |
//! | [proxies] | Running behind a proxy | the client address behind load balancers and reverse proxies, without spoofing |
//! | [deployments] | Redis Cluster; TLS, ACL users and Sentinel; Hot keys: coalescing and leases; Redis keys; Blocks on Redis; One name, one limit | Redis Cluster, TLS, rotating credentials, Sentinel, managed servers and the callers' clocks, keys hotter than one round trip per request, and the keys the crate writes |
//! | [failure_modes] | Failure modes; Memory and key floods; Clock steps | what a check does when Redis is slow, refuses writes or is gone, the breaker, the failure policies, bounded memory, clock steps |
//! | [grpc] | gRPC | the same layers on a tonic server, and why authentication goes before the limit |
//! | [operations] | Shadow mode; Configuration as data; Changes on every instance; Listing what is blocked; The admin flow end to end; Upgrading; Observability | trying a limit without enforcing it, rules from a file, resets and blocks reaching every instance, what is blocked now, an operator's block, listing and lift on two instances, rolling upgrades, logs and metrics |
//! | [metrics] | Metrics | the counters and histograms the layers record, their labels, and the matching log events |
//! | [architecture] | How the crate is built | the crate's layers and modules, from the top down |

pub mod algorithms;
pub mod architecture;
pub mod calendar;
pub mod deployments;
pub mod failure_modes;
pub mod grpc;
pub mod in_flight;
pub mod keys;
pub mod limiters;
pub mod metrics;
pub mod operations;
pub mod outbound;
pub mod proxies;
pub mod shaping;
pub mod stacking;
pub mod usage;
