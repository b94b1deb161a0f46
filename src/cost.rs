//! How many units a request costs.

use http::Request;

/// Chooses how many units (tokens, quota units) a request costs.
///
/// Implemented for closures `Fn(&Request<B>) -> u32`, so costs can depend on the route,
/// the method or a header. A cost of `0` makes the request free: it is neither checked
/// nor counted.
///
/// ```
/// use http::{Method, Request};
///
/// // Writes cost five times as much as reads.
/// let cost = |req: &Request<()>| if req.method() == Method::GET { 1 } else { 5 };
/// # fn takes<C: tower_redis_ratelimit::Cost<()>>(_: C) {}
/// # takes(cost);
/// ```
pub trait Cost<B>: Send + Sync + 'static {
    /// The request's cost in units.
    fn cost(&self, req: &Request<B>) -> u32;
}

impl<B, F> Cost<B> for F
where
    F: Fn(&Request<B>) -> u32 + Send + Sync + 'static,
{
    fn cost(&self, req: &Request<B>) -> u32 {
        self(req)
    }
}

/// Every request costs one unit (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct UnitCost;

impl<B> Cost<B> for UnitCost {
    fn cost(&self, _req: &Request<B>) -> u32 {
        1
    }
}

/// Every request costs the same fixed number of units.
#[derive(Debug, Clone, Copy)]
pub struct FixedCost(pub u32);

impl<B> Cost<B> for FixedCost {
    fn cost(&self, _req: &Request<B>) -> u32 {
        self.0
    }
}
