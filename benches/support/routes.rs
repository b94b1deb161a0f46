//! The in-process routes the `loadtest` harness serves, shared with the `costs` harness
//! and the `service/*` benches so that all three measure the same router: `/unlimited`,
//! `/token/in-process` (the crate's defaults: headers and the `Decision` extension),
//! `/token/in-process/no-headers`, `/governor` and `/governor/headers`
//! (`tower_governor` 0.8 with the same quota and key, without and with its headers).
//! Included with `#[path]`, so not every item is used by every includer.
#![allow(dead_code)]

use std::time::Duration;

use axum::http::{HeaderValue, Request};
use axum::routing::get;
use axum::Router;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::{GovernorError, GovernorLayer};
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::{Backend, ConfigError};
use tower_redis_ratelimit::{LimitLayer, TokenBucketConfig};

/// The header every limited route is keyed by.
pub(crate) const API_KEY: &str = "x-api-key";

/// tower_governor's key: the `x-api-key` header, as `HeaderKey` reads it for our layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = HeaderValue;

    fn extract<T>(&self, req: &Request<T>) -> Result<HeaderValue, GovernorError> {
        req.headers()
            .get(API_KEY)
            .cloned()
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// Every route's handler.
pub(crate) async fn ok() -> &'static str {
    "ok"
}

/// The in-process token bucket of `rate` per second and burst `rate` on `backend`, with
/// or without headers and the `Decision` extension.
pub(crate) fn token_bucket(
    backend: &Backend,
    rate: u64,
    headers: bool,
) -> Result<
    tower_redis_ratelimit::LimitLayer<tower_redis_ratelimit::TokenBucketLimiter, HeaderKey>,
    ConfigError,
> {
    LimitLayer::builder(
        backend,
        TokenBucketConfig::new(rate, Duration::from_secs(1), rate),
    )
    .name("loadtest")
    .key(HeaderKey::from_static(API_KEY))
    .admitted_headers(headers)
    .decision_extension(headers)
    .build()
}

/// The in-process routes on `backend`, at `rate` per second and burst `rate` (rate at
/// least 1, at most 10⁹), and two that refuse every request after a key's first (one
/// per hour, burst 1): the crate's token bucket with its headers, and `tower_governor`'s.
pub(crate) fn router(backend: &Backend, rate: u64) -> Result<Router, Box<dyn std::error::Error>> {
    let builder = || {
        let mut config = GovernorConfigBuilder::default();
        config
            .per_nanosecond(1_000_000_000 / rate)
            .burst_size(u32::try_from(rate).unwrap_or(u32::MAX));
        config.key_extractor(ApiKey)
    };
    let governor = builder().finish().ok_or("invalid tower_governor quota")?;
    let governor_refused = {
        let mut config = GovernorConfigBuilder::default();
        config.per_second(3_600).burst_size(1);
        config
            .key_extractor(ApiKey)
            .finish()
            .ok_or("invalid tower_governor quota")?
    };
    // `use_headers` returns a builder of another type (it does not change this one).
    let governor_headers = builder()
        .use_headers()
        .finish()
        .ok_or("invalid tower_governor quota")?;
    Ok(Router::new()
        .route("/unlimited", get(ok))
        .route(
            "/token/in-process",
            get(ok).layer(token_bucket(backend, rate, true)?),
        )
        .route(
            "/token/in-process/no-headers",
            get(ok).layer(token_bucket(backend, rate, false)?),
        )
        .route(
            "/token/in-process/refused",
            get(ok).layer(
                LimitLayer::builder(
                    backend,
                    TokenBucketConfig::new(1, Duration::from_secs(3_600), 1),
                )
                .name("loadtest.refused")
                .key(HeaderKey::from_static(API_KEY))
                .build()?,
            ),
        )
        .route(
            "/governor/refused",
            get(ok).layer(GovernorLayer::new(governor_refused)),
        )
        .route("/governor", get(ok).layer(GovernorLayer::new(governor)))
        .route(
            "/governor/headers",
            get(ok).layer(GovernorLayer::new(governor_headers)),
        ))
}
