//! Proxies: the client address behind load balancers and reverse proxies.
//!
//! # Running behind a proxy
//!
//! Behind a load balancer or reverse proxy every connection comes from the proxy, so
//! [`PeerIp`](crate::key::PeerIp) would put all clients under one key. Use
//! [`ForwardedIp`](crate::key::ForwardedIp) with the networks of your proxies: it
//! believes `Forwarded` / `X-Forwarded-For` only when the connection comes from one of
//! them, and then takes the nearest address in the chain that is not a trusted proxy.
//! Anything a client writes into those headers itself is ignored, so it cannot pick its
//! own key.
//!
//! - List every proxy hop you run (load balancer, ingress, CDN ranges), and nothing
//!   else: a trusted network that clients can reach directly lets them spoof.
//! - Read the header your proxies maintain: `X-Forwarded-For` by default (what nearly
//!   every proxy appends to), or RFC 7239 `Forwarded` with
//!   [`ForwardedIp::header`](crate::key::ForwardedIp::header). Avoid `Auto` unless your
//!   proxies strip the header they do not set: a client could otherwise send its own.
//! - IPv6 clients are grouped by their /64 by default, since one client usually owns a
//!   whole /64 and could otherwise rotate addresses around any limit; use
//!   `ipv6_prefix(56)` or `ipv6_prefix(48)` for networks that hand out larger prefixes,
//!   `ipv6_prefix(128)` for one limit per address. IPv4-mapped addresses
//!   (`::ffff:192.0.2.1`) are keyed as IPv4.
//! - Serve axum with `into_make_service_with_connect_info::<SocketAddr>()` so the peer
//!   address is known.
//!
//! ```
//! use tower_redis_ratelimit::key::{ForwardedHeader, ForwardedIp};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = ForwardedIp::from_strs(["10.0.0.0/8", "192.0.2.10"])?
//!     .header(ForwardedHeader::XForwardedFor)
//!     .ipv6_prefix(56);
//! # let _ = client; Ok(()) }
//! ```
