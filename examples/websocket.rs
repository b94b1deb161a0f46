//! A chat-like WebSocket echo where each user may send 5 messages per second across all
//! their connections: five browser tabs of one user share one limit. On Redis when
//! `REDIS_URL` is set (the limit is then shared by every instance too), in process
//! otherwise; `PORT` overrides the port (3000).
//!
//! ```text
//! cargo run --example websocket                                   # in process
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example websocket  # shared in Redis
//! websocat 'ws://127.0.0.1:3000/ws?user=alice'                    # in two terminals
//! ```
//!
//! The user is the `x-user` header or, for a browser (which cannot set headers on a
//! WebSocket), the `user` query parameter: `?user=alice` and `x-user: alice` are the
//! same user. A connection without one is refused (`401`). A message over the limit is
//! answered `{"error":"rate_limited","retry_after_ms":N}` instead of its echo, and the
//! connection stays open.
//!
//! The limit is a [`LimitLayer`] that wraps no route: the upgrade request only gives the
//! connection its key ([`LimitLayer::stream`]), and each message is one check of it,
//! counted in the layer's metrics.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::StatusCode;
use tower_redis_ratelimit::{Backend, ConfigError, LimitLayer, PeriodConfig, StreamLimit};

/// Messages each user may send per second, across all their connections.
pub const MESSAGES_PER_SECOND: u64 = 5;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => Backend::builder()
            .redis_url(url)
            .prefix("websocket")
            .build()?,
        Err(_) => Backend::in_process(),
    };
    if let Err(error) = backend.warm_up().await {
        tracing::warn!(%error, "redis unreachable: limits are kept in this process until it answers");
    }
    let port: u16 = std::env::var("PORT").map_or(Ok(3000), |port| port.parse())?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    println!(
        "serving ws://{}/ws?user=NAME ({MESSAGES_PER_SECOND} messages/s per user)",
        listener.local_addr()?
    );
    axum::serve(listener, app(&backend)?).await?;
    Ok(())
}

/// The app: `GET /ws` upgrades to the echo, `MESSAGES_PER_SECOND` per user.
pub fn app(backend: &Backend) -> Result<Router, ConfigError> {
    app_with(
        backend,
        PeriodConfig::new(MESSAGES_PER_SECOND, Duration::from_secs(1)),
    )
}

/// The app with another limit of messages per user (the tests use a long window).
pub fn app_with(backend: &Backend, messages: PeriodConfig) -> Result<Router, ConfigError> {
    let messages = LimitLayer::builder(backend, messages)
        .name("ws.messages")
        .key(user)
        .build()?;
    Ok(Router::new().route(
        "/ws",
        get(move |upgrade: WebSocketUpgrade, request: Parts| {
            // Once per connection: the user's key (and policy), from the upgrade request.
            let limit = messages.stream(&request);
            async move {
                match limit {
                    Some(limit) => upgrade.on_upgrade(move |socket| echo(socket, limit)),
                    None => {
                        (StatusCode::UNAUTHORIZED, "a user is needed: ?user=NAME\n").into_response()
                    }
                }
            }
        }),
    ))
}

/// The user of a request: its `x-user` header, else its `user` query parameter.
fn user(request: &Parts) -> Option<String> {
    if let Some(user) = request.headers.get("x-user") {
        return user.to_str().ok().map(str::to_owned);
    }
    request
        .uri
        .query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix("user="))
        .filter(|user| !user.is_empty())
        .map(str::to_owned)
}

/// Echoes each text or binary message the user's limit admits; answers the others with
/// a `rate_limited` text frame, and keeps the connection open.
async fn echo(mut socket: WebSocket, limit: StreamLimit) {
    while let Some(Ok(message)) = socket.recv().await {
        if !matches!(message, Message::Text(_) | Message::Binary(_)) {
            // Pings are answered by axum; a close ends the loop with the stream.
            continue;
        }
        let decision = limit.check(NonZeroU32::MIN).await;
        let reply = if decision.is_admitted() {
            message
        } else {
            let retry_after_ms = decision.retry_after.unwrap_or_default().as_millis();
            Message::Text(
                format!(r#"{{"error":"rate_limited","retry_after_ms":{retry_after_ms}}}"#).into(),
            )
        };
        if socket.send(reply).await.is_err() {
            break;
        }
    }
}
