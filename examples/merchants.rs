//! Per-merchant quotas from your own store: each merchant's limit is looked up at
//! request time in a "database" (here an in-memory map that a background task
//! changes, as an admin changing plans would), cached for a few seconds.
//!
//! ```text
//! cargo run --example merchants                                   # in-process
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example merchants  # shared in Redis
//! ```
//!
//! | merchant (`x-merchant-id`) | quota per minute |
//! |---|---|
//! | `acme` | switches between 5 and 50 every 20 seconds |
//! | `globex` | 1000 |
//! | anyone else | the default, 20 |
//!
//! Try `curl -i -X POST -H 'x-merchant-id: acme' http://127.0.0.1:3002/payments` and
//! watch `RateLimit-Policy` follow the database (at most 5 seconds behind).
//! `PORT` overrides the port (3002).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Router};
use tower_redis_ratelimit::key::{HeaderKey, TaggedKey};
use tower_redis_ratelimit::PeriodConfig;
use tower_redis_ratelimit::{Backend, ConfigError, Decision, LimitLayer};
use tower_redis_ratelimit::{DynamicLimits, OnSourceError};

/// The merchants' quotas per minute, by merchant id; a stand-in for a database table.
#[derive(Debug, Clone, Default)]
pub struct Quotas(Arc<RwLock<HashMap<String, u64>>>);

impl Quotas {
    /// Sets a merchant's quota.
    pub fn set(&self, merchant: &str, quota: u64) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(merchant.to_owned(), quota);
    }

    /// The "query": a real one would be `SELECT quota FROM merchants WHERE id = $1`.
    async fn quota(&self, merchant: &str) -> Result<Option<u64>, std::io::Error> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        Ok(map.get(merchant).copied())
    }
}

/// The app: `POST /payments`, limited per merchant by its quota in `quotas`.
///
/// # Errors
///
/// A [`ConfigError`] if the limit is misconfigured.
pub fn app(backend: &Backend, quotas: Quotas) -> Result<Router, ConfigError> {
    // The source is asked with the merchant id the `x-merchant-id` header held (the
    // layer's key is `hdr:x-merchant-id:<id>`; `value` is the id alone).
    let source = move |key: TaggedKey<'_>| {
        let quotas = quotas.clone();
        let merchant = String::from_utf8_lossy(key.value()).into_owned();
        async move { quotas.quota(&merchant).await }
    };
    let limits = DynamicLimits::new(PeriodConfig::new(20, Duration::from_secs(60)), source)
        .ttl(Duration::from_secs(5))
        .max_keys(100_000)
        .lookup_timeout(Duration::from_millis(200))
        // The database is down: keep each merchant's last known quota.
        .on_error(OnSourceError::LastKnown);
    let per_merchant = LimitLayer::builder(backend, limits)
        .name("payments")
        .key(HeaderKey::from_static("x-merchant-id"))
        .build()?;
    Ok(Router::new().route("/payments", post(pay).layer(per_merchant)))
}

async fn pay(Extension(decision): Extension<Decision>) -> String {
    format!(
        "paid: {} of {} left this minute\n",
        decision.remaining, decision.limit
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_redis_ratelimit=info".into()),
        )
        .init();
    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("limits are kept in Redis");
            Backend::builder()
                .redis_url(url)
                .prefix("merchants")
                .build()?
        }
        Err(_) => {
            println!("REDIS_URL is not set: limits are kept in this process");
            Backend::in_process()
        }
    };
    let quotas = Quotas::default();
    quotas.set("acme", 5);
    quotas.set("globex", 1_000);
    // An admin changing acme's plan now and then.
    tokio::spawn({
        let quotas = quotas.clone();
        async move {
            let mut upgraded = false;
            loop {
                tokio::time::sleep(Duration::from_secs(20)).await;
                upgraded = !upgraded;
                let quota = if upgraded { 50 } else { 5 };
                quotas.set("acme", quota);
                println!("acme's quota is now {quota} per minute");
            }
        }
    });
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse()?,
        Err(_) => 3002,
    };
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    println!(
        "serving on http://{addr}\n\
         try: curl -i -X POST -H 'x-merchant-id: acme' http://{addr}/payments"
    );
    axum::serve(listener, app(&backend, quotas)?).await?;
    Ok(())
}
