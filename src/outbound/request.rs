//! What the outbound layer reads from a request: the key it waits on and its cost.

use bytes::Bytes;

use crate::cost::{FixedCost, UnitCost};

/// Chooses the key an outgoing request waits on, for any request type.
///
/// Implemented for [`FixedKey`] (every request shares one limit) and for closures
/// `Fn(&Req) -> impl Into<Bytes>` (a `String`, a `Vec<u8>`, a `&'static str`), so the key
/// can be the account, tenant or sender the upstream limits per:
///
/// ```
/// use http::Request;
/// use tower_redis_ratelimit::outbound::RequestKey;
///
/// // One limit per merchant account, read from a header the caller sets.
/// let key = |req: &Request<()>| {
///     let account = req.headers().get("x-account").map(|v| v.as_bytes());
///     [b"acct:".as_slice(), account.unwrap_or_default()].concat()
/// };
/// let request = Request::builder().header("x-account", "m-42").body(()).unwrap();
/// assert_eq!(&key.key(&request)[..], b"acct:m-42");
/// ```
pub trait RequestKey<Req>: Send + Sync + 'static {
    /// The key of `request`; different bytes are different limits.
    fn key(&self, request: &Req) -> Bytes;
}

impl<Req, F, K> RequestKey<Req> for F
where
    F: Fn(&Req) -> K + Send + Sync + 'static,
    K: Into<Bytes>,
{
    fn key(&self, request: &Req) -> Bytes {
        self(request).into()
    }
}

/// One key for every request: the whole client shares one limit (the default, with
/// the empty key).
///
/// ```
/// use tower_redis_ratelimit::outbound::{FixedKey, RequestKey};
///
/// let key = FixedKey::from_static("payments-api");
/// assert_eq!(&RequestKey::<()>::key(&key, &())[..], b"payments-api");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FixedKey(Bytes);

impl FixedKey {
    /// A key from a static string, without allocating.
    #[must_use]
    pub const fn from_static(key: &'static str) -> Self {
        Self(Bytes::from_static(key.as_bytes()))
    }

    /// A key from any bytes.
    #[must_use]
    pub fn new(key: impl Into<Bytes>) -> Self {
        Self(key.into())
    }
}

impl<Req> RequestKey<Req> for FixedKey {
    fn key(&self, _request: &Req) -> Bytes {
        self.0.clone()
    }
}

/// Chooses how many units an outgoing request costs, for any request type.
///
/// Implemented for [`UnitCost`] (the default), [`FixedCost`] and closures
/// `Fn(&Req) -> u32`, so a cost can be weighted (the tokens an LLM request asks for, the
/// recipients of a message). A cost of `0` makes the request free: it neither waits nor
/// counts.
///
/// ```
/// use tower_redis_ratelimit::outbound::RequestCost;
///
/// struct Completion { max_tokens: u32 }
/// let cost = |req: &Completion| req.max_tokens;
/// assert_eq!(cost.cost(&Completion { max_tokens: 512 }), 512);
/// ```
pub trait RequestCost<Req>: Send + Sync + 'static {
    /// The request's cost in units.
    fn cost(&self, request: &Req) -> u32;
}

impl<Req, F> RequestCost<Req> for F
where
    F: Fn(&Req) -> u32 + Send + Sync + 'static,
{
    fn cost(&self, request: &Req) -> u32 {
        self(request)
    }
}

impl<Req> RequestCost<Req> for UnitCost {
    fn cost(&self, _request: &Req) -> u32 {
        1
    }
}

impl<Req> RequestCost<Req> for FixedCost {
    fn cost(&self, _request: &Req) -> u32 {
        self.0
    }
}
