//! Counting by outcome: a layer option that decides, once the response is known,
//! whether a request counts against its limit (only failed logins, only successful
//! exports).
//!
//! Every request is checked, and counted, before it runs: a burst of concurrent
//! requests is decided before any of them has a response, so counting only afterwards
//! would let the whole burst through. Instead the check reserves the request's units
//! as usual (concurrent requests can never overshoot the limit), and a request whose
//! response turns out not to count gets them back with a refund
//! ([`Limiter::refund`](crate::Limiter::refund)), in the background. Until that refund
//! lands, the reserved units count: the limit errs on the side of refusing. Refused
//! requests were never counted and are not refunded.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use http::{HeaderMap, StatusCode};

/// Which responses count against the limit; see the guide's
/// [Counting by outcome](crate::guide::usage#counting-by-outcome). A layer without one counts
/// every admitted request.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::{key::HeaderKey, limit::CountIf, Backend, LimitLayer, PeriodConfig};
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// // Password resets: only the failed attempts count, 5 per hour.
/// let config = PeriodConfig::new(5, Duration::from_secs(3_600));
/// let layer = LimitLayer::builder(&Backend::in_process(), config)
///     .name("reset")
///     .key(HeaderKey::from_static("x-account"))
///     .count_if(CountIf::failures())
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone)]
pub struct CountIf(Arc<Predicate>);

/// Whether a response (its status and headers) counts.
type Predicate = dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync;

impl CountIf {
    /// Counts the responses for which `counts(status, headers)` is true. An inner
    /// service's error counts as a `500 Internal Server Error` without headers.
    pub fn new(counts: impl Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(counts))
    }

    /// Counts failures only: a status of 400 or more (a wrong password's `401`, a
    /// server error).
    #[must_use]
    pub fn failures() -> Self {
        Self::new(|status, _| status.is_client_error() || status.is_server_error())
    }

    /// Counts successes only: a `2xx` status.
    #[must_use]
    pub fn successes() -> Self {
        Self::new(|status, _| status.is_success())
    }

    pub(crate) fn counts(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        (self.0)(status, headers)
    }
}

impl fmt::Debug for CountIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CountIf(..)")
    }
}

/// What a response future keeps to settle an admitted request after its response:
/// give its units back ([`CountIf`]), or settle them to what it really cost
/// ([`Usage`](super::Usage)).
#[derive(Debug)]
pub(crate) struct Settle {
    pub(crate) key: Box<[u8]>,
    pub(crate) cost: NonZeroU32,
    /// The policy the units were spent under (a plan's, for per-plan limits).
    pub(crate) policy: usize,
    /// A shadow layer's check still in flight: whether it admitted, once known.
    pub(crate) admitted: Option<tokio::sync::oneshot::Receiver<bool>>,
    /// The request body's bytes, when the layer settles to them.
    pub(crate) request_bytes: Option<Arc<super::counted::RequestBytes>>,
}
