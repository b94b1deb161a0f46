//! Outbound limits: waiting for a turn before calling an upstream.
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
//! Received requests can wait too: a layer built with
//! [`wait(max)`](crate::LayerBuilder::wait) holds a request that would be refused
//! until its `Retry-After` (at most `max` in all) and checks it again, instead of a
//! `429`. Unlike an outbound wait, which reserves its turn, an inbound waiter spends
//! nothing until it is admitted: a client that goes away while it waits has cost
//! nothing.
//!
//! - **Limit**: build a limiter on the Redis backend, named and keyed alike in every
//!   instance (the same prefix, name and key are the same Redis key). A token bucket
//!   with a burst of 1 spreads calls evenly, as most upstream quotas expect; the key is
//!   the unit the upstream limits (an account, a sender), the cost what a call spends
//!   (tokens of a completion). Both are read from the request's head by the inbound
//!   layers' own traits: a [`KeyExtractor`](crate::key::KeyExtractor) (the default,
//!   [`GlobalKey`](crate::key::GlobalKey), is one limit for every call; a call the
//!   extractor finds no key in waits on `GlobalKey`'s key `global` too) and a
//!   [`Cost`](crate::Cost) (a [`HeaderCost`](crate::HeaderCost) on a header the caller
//!   sets, or a closure on the head).
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
//!   `benches/NOTES.md`.
//! - **Redis down**: the backend's [`FailurePolicy`](crate::FailurePolicy): `Fallback`
//!   waits on the in-process state (give it a [fallback
//!   share](crate::BackendBuilder::fallback_share) of `1/N` for N instances),
//!   `FailOpen` sends unlimited, `FailClosed` fails calls with
//!   [`WaitError::Unavailable`](crate::outbound::WaitError).
//!
//! The `outbound` example runs an upstream that counts arrivals per second and clients
//! that share one limit through Redis.
