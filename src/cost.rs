//! How many units a request costs.

use http::request::Parts;

/// Chooses how many units (tokens, quota units) a request costs, from its head
/// ([`http::request::Parts`]: method, URI, headers, extensions), never its body, so one
/// cost serves every body type, inbound, in flight and outbound alike.
///
/// Implemented for closures `Fn(&Parts) -> u32`, so costs can depend on the route,
/// the method or a header. A cost of `0` makes the request free: it is neither checked
/// nor counted.
///
/// ```
/// use http::{request::Parts, Method};
///
/// // Writes cost five times as much as reads.
/// let cost = |parts: &Parts| if parts.method == Method::GET { 1 } else { 5 };
/// # fn takes<C: tower_redis_ratelimit::Cost>(_: C) {}
/// # takes(cost);
/// ```
pub trait Cost: Send + Sync + 'static {
    /// The cost in units of the request whose head is `parts`.
    fn cost(&self, parts: &Parts) -> u32;

    /// The cost of every request, when it is the same for all: what the layer builder
    /// checks against the limits' capacities. The default, `None`, checks nothing.
    #[doc(hidden)]
    fn fixed(&self) -> Option<u32> {
        None
    }
}

impl<F> Cost for F
where
    F: Fn(&Parts) -> u32 + Send + Sync + 'static,
{
    fn cost(&self, parts: &Parts) -> u32 {
        self(parts)
    }
}

/// A fixed cost: every request costs this many units (`1`, the layers' default, or
/// `.cost(5)` for an endpoint that costs five). A fixed cost above what a limit can
/// ever hold is refused when the layer is built ([`ConfigError::CostAboveCapacity`]);
/// a cost of zero makes every request free.
///
/// [`ConfigError::CostAboveCapacity`]: crate::ConfigError::CostAboveCapacity
impl Cost for u32 {
    fn cost(&self, _parts: &Parts) -> u32 {
        *self
    }

    fn fixed(&self) -> Option<u32> {
        Some(*self)
    }
}

/// The cost is a whole number in a request header (`Content-Length` for the bytes a
/// request sends, `x-max-tokens` for an estimate), or `default` when the header is
/// missing or not a number (larger numbers are cut to `u32::MAX`).
///
/// With [`LayerBuilder::settle`](crate::LayerBuilder::settle), it is the estimate the
/// check spends until the response says what the request really cost.
///
/// ```
/// use http::{header::CONTENT_LENGTH, Request};
/// use tower_redis_ratelimit::{Cost, HeaderCost};
///
/// let cost = HeaderCost::new(CONTENT_LENGTH, 1);
/// let (upload, ()) = Request::post("/").header("content-length", "2048").body(()).unwrap().into_parts();
/// assert_eq!(cost.cost(&upload), 2_048);
/// assert_eq!(cost.cost(&Request::new(()).into_parts().0), 1);
/// ```
#[derive(Debug, Clone)]
pub struct HeaderCost {
    name: http::HeaderName,
    default: u32,
}

impl HeaderCost {
    /// The cost in header `name`, else `default`.
    #[must_use]
    pub fn new(name: http::HeaderName, default: u32) -> Self {
        Self { name, default }
    }
}

impl Cost for HeaderCost {
    fn cost(&self, parts: &Parts) -> u32 {
        parts
            .headers
            .get(&self.name)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map_or(self.default, |cost| u32::try_from(cost).unwrap_or(u32::MAX))
    }
}
