//! A key extractor of your own: one limit per API key, read from
//! `Authorization: Bearer <key>`, with admin actions by the API key's value.
//!
//! ```text
//! cargo run --example custom_key
//! curl -i -H 'authorization: Bearer k1' http://127.0.0.1:3000/   # 3 per minute per API key
//! curl -i http://127.0.0.1:3000/                                 # no key: 401
//! ```
//!
//! An extractor reads the request's head (`http::request::Parts`), never its body, so
//! one extractor serves every body type and every layer (inbound, in-flight,
//! outbound). Give its keys a tag of your own (`bearer:`), so that they never equal a
//! built-in extractor's (`ip:…`, `hdr:…`), and say what a client's value becomes
//! (`keys_for`), so that operators can reset, block or peek a client by its API key.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::{header::AUTHORIZATION, request::Parts, StatusCode};
use axum::{routing::get, Router};
use tower_redis_ratelimit::key::{Key, KeyExtractor, KeyForError, KeyOrigin};
use tower_redis_ratelimit::{Backend, MissingKey};
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

/// The API key of `Authorization: Bearer <key>`, tagged `bearer:`.
#[derive(Debug, Clone, Copy)]
struct BearerKey;

impl KeyExtractor for BearerKey {
    fn extract<'r>(&self, parts: &'r Parts) -> Option<Key<'r>> {
        let token = parts
            .headers
            .get(AUTHORIZATION)?
            .as_bytes()
            .strip_prefix(b"Bearer ")?;
        (!token.is_empty()).then(|| Key::concat(&[b"bearer:", token]))
    }

    fn keys_for(&self, value: &[u8]) -> Result<Vec<Key<'static>>, KeyForError> {
        Ok(vec![Key::concat(&[b"bearer:", value])])
    }

    // The client chooses its key: a missing or unknown key is the client's doing.
    fn origin(&self) -> KeyOrigin {
        KeyOrigin::Client
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => Backend::builder().redis_url(url).build()?,
        Err(_) => Backend::in_process(),
    };
    let per_key = LimitLayer::builder(&backend, PeriodConfig::new(3, Duration::from_secs(60)))
        .name("api")
        .key(BearerKey)
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .build()?;

    // An operator's view of one client, by its API key (no turbofish, no storage key).
    let standing = per_key.peek_value("k1", NonZeroU32::MIN).await?;
    println!("k1 before any request: {standing:?}");

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(per_key);
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
