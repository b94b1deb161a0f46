//! An LLM gateway: requests per minute and tokens per minute per API key, as one atomic
//! pair, each request settled to the tokens it really used once its response (JSON or a
//! stream of Server-Sent Events) ends. Two modes from one binary:
//!
//! ```text
//! PORT=8000 cargo run --example llm_proxy -- upstream          # a stand-in model server
//! UPSTREAM_URL=http://127.0.0.1:8000 cargo run --example llm_proxy -- proxy
//! ```
//!
//! **upstream** (`PORT`, default 8000): `POST /v1/chat/completions` takes `{"model",
//! "messages": [{"role", "content"}], "max_tokens"?, "stream"?}`. Prompt tokens are the
//! whitespace-separated words of every message's content; completion tokens are the
//! request header `x-test-completion-tokens` if present, else `max_tokens`, else 16.
//! Without `stream` it answers JSON with `"usage": {"prompt_tokens",
//! "completion_tokens", "total_tokens"}`; with `"stream": true`, Server-Sent Events: one
//! `data:` chunk per ten completion tokens, then a chunk carrying `usage`, then
//! `data: [DONE]`.
//!
//! **proxy** (`PORT`, default 3000; `UPSTREAM_URL`; `REDIS_URL` optional; `RPM`, default
//! 60; `TPM`, default 10 000): forwards to the upstream, keyed by the `authorization:
//! Bearer <key>` value. A request reserves its estimate (prompt words + `max_tokens`,
//! 256 when absent) of the tokens and one request, both or neither; when its response
//! ends, the tokens are settled to `usage.total_tokens` from the JSON body or the final
//! SSE chunk. Fewer go back; more are owed, and the key is refused until the refill has
//! paid them off. Either limit refusing answers `429` with `Retry-After`. A stream cut
//! short (the client gone before the usage chunk) keeps its estimate (the prompt and
//! `max_tokens`): never free.
//!
//! ```text
//! curl -i http://127.0.0.1:3000/v1/chat/completions -H 'authorization: Bearer k1' \
//!   -d '{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":50}'
//! ```

use std::convert::Infallible;
use std::future::Future as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tower_redis_ratelimit::key::HeaderKey;
use tower_redis_ratelimit::limit::{Finished, Usage};
use tower_redis_ratelimit::TokenBucketConfig;
use tower_redis_ratelimit::{Backend, ConfigError};
use tower_redis_ratelimit::{LimitLayer, LimitSet};

/// The path both modes serve.
pub(crate) const PATH: &str = "/v1/chat/completions";
/// The estimate of the completion when the request has no `max_tokens`.
pub(crate) const DEFAULT_MAX_TOKENS: u32 = 256;
/// The largest request body the proxy reads.
const MAX_REQUEST: usize = 1 << 20;
/// The body bytes the settlement reads (the end of a response: its usage).
const USAGE_TAIL: usize = 64 * 1024;

/// The prompt's tokens: the whitespace-separated words of every message's content.
pub(crate) fn prompt_tokens(request: &Value) -> u64 {
    request["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .filter_map(|m| m["content"].as_str())
                .map(|content| content.split_whitespace().count() as u64)
                .sum()
        })
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// upstream: a stand-in model server
// ---------------------------------------------------------------------------

/// The stand-in model server.
pub(crate) fn upstream_app() -> Router {
    Router::new().route(PATH, post(complete))
}

async fn complete(headers: HeaderMap, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "invalid JSON\n").into_response();
    };
    let prompt = prompt_tokens(&request);
    let completion = headers
        .get("x-test-completion-tokens")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .or_else(|| request["max_tokens"].as_u64())
        .unwrap_or(16);
    let model = request["model"].as_str().unwrap_or("stand-in").to_owned();
    let usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    });
    if request["stream"].as_bool() != Some(true) {
        let answer = json!({
            "id": "chatcmpl-stand-in",
            "object": "chat.completion",
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": words(completion)},
                "finish_reason": "stop",
            }],
            "usage": usage,
        });
        return ([("content-type", "application/json")], answer.to_string()).into_response();
    }
    // One chunk per ten tokens, then the usage, then [DONE], produced as the client reads.
    let mut events = Vec::new();
    let mut left = completion;
    while left > 0 {
        let tokens = left.min(10);
        left -= tokens;
        let chunk = json!({
            "id": "chatcmpl-stand-in",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": {"content": words(tokens)}}],
        });
        events.push(format!("data: {chunk}\n\n"));
    }
    let last = json!({
        "id": "chatcmpl-stand-in",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [],
        "usage": usage,
    });
    events.push(format!("data: {last}\n\n"));
    events.push("data: [DONE]\n\n".to_owned());
    let body = Events {
        events: events.into_iter(),
        pause: None,
    };
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        Body::new(body),
    )
        .into_response()
}

/// `n` words of a completion.
fn words(n: u64) -> String {
    vec!["token"; usize::try_from(n).unwrap_or(0)].join(" ")
}

/// Server-Sent Events, one a millisecond apart (a model produces them over time).
struct Events {
    events: std::vec::IntoIter<String>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for Events {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let pause = self
            .pause
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(1))));
        std::task::ready!(pause.as_mut().poll(cx));
        self.pause = None;
        Poll::Ready(
            self.events
                .next()
                .map(|event| Ok(Frame::data(Bytes::from(event)))),
        )
    }
}

// ---------------------------------------------------------------------------
// proxy: the gateway
// ---------------------------------------------------------------------------

/// A request's estimate of its tokens, put into its extensions by [`estimate`] (before
/// the limit, which spends it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Estimate(pub(crate) u32);

/// The tokens a finished response says it used: `usage.total_tokens` of the JSON
/// body, or of the last SSE chunk that carries a `usage`. `None` (the estimate stays
/// spent) when there is none, such as a stream cut short.
pub(crate) fn total_tokens(finished: &Finished<'_>) -> Option<u64> {
    let text = String::from_utf8_lossy(finished.body());
    let usage_of =
        |json: &str| serde_json::from_str::<Value>(json).ok()?["usage"]["total_tokens"].as_u64();
    if let Some(total) = usage_of(text.trim()) {
        return Some(total);
    }
    text.lines()
        .rev()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .find_map(usage_of)
}

/// Reads the request's JSON (at most 1 MiB) to estimate its tokens: prompt words plus
/// `max_tokens` (256 when absent).
async fn estimate(request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_REQUEST).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "request too large\n").into_response();
    };
    let Ok(json) = serde_json::from_slice::<Value>(&bytes) else {
        return (StatusCode::BAD_REQUEST, "invalid JSON\n").into_response();
    };
    let max_tokens = json["max_tokens"]
        .as_u64()
        .unwrap_or(u64::from(DEFAULT_MAX_TOKENS));
    let tokens = prompt_tokens(&json).saturating_add(max_tokens);
    parts
        .extensions
        .insert(Estimate(u32::try_from(tokens).unwrap_or(u32::MAX)));
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Where the proxy forwards.
#[derive(Clone)]
struct Upstream {
    url: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// The completions URL of the upstream at `base` (such as `http://127.0.0.1:8000`).
///
/// # Errors
///
/// When `base` is not a URL.
pub(crate) fn completions_url(base: &str) -> Result<Uri, http::uri::InvalidUri> {
    format!("{}{PATH}", base.trim_end_matches('/')).parse()
}

/// The gateway to the upstream's completions at `url` ([`completions_url`]), with `rpm`
/// requests and `tpm` tokens per minute per API key on `backend`.
///
/// # Errors
///
/// A [`ConfigError`] for a limit of 0.
pub(crate) fn proxy_app(
    backend: &Backend,
    url: Uri,
    rpm: u64,
    tpm: u64,
) -> Result<Router, ConfigError> {
    let minute = Duration::from_secs(60);
    // Requests and tokens per minute, both or neither; refilled continuously, so a key
    // that owes tokens is admitted again as soon as the refill has paid them off.
    let limits = LimitLayer::builder(
        backend,
        LimitSet::new()
            .requests("rpm", TokenBucketConfig::new(rpm, minute, rpm))
            .limit("tpm", TokenBucketConfig::new(tpm, minute, tpm)),
    )
    .name("llm")
    .key(HeaderKey::from_static("authorization"))
    .cost(|parts: &Parts| parts.extensions.get::<Estimate>().map_or(1, |e| e.0))
    .settle(Usage::body(USAGE_TAIL, total_tokens))
    .build()?;
    let upstream = Upstream {
        url,
        client: Client::builder(TokioExecutor::new()).build_http(),
    };
    Ok(Router::new()
        .route(PATH, post(forward).layer(limits))
        .layer(middleware::from_fn(estimate))
        .with_state(upstream))
}

/// Forwards the request to the upstream and streams its answer back.
async fn forward(State(upstream): State<Upstream>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_REQUEST).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let mut out = http::Request::post(upstream.url.clone());
    for name in ["content-type", "x-test-completion-tokens"] {
        if let Some(value) = parts.headers.get(name) {
            out = out.header(name, value);
        }
    }
    let out = out
        .header("content-type", HeaderValue::from_static("application/json"))
        .body(Full::new(body))
        .expect("a valid request");
    match upstream.client.request(out).await {
        Ok(answer) => answer.map(Body::new).into_response(),
        Err(error) => (StatusCode::BAD_GATEWAY, format!("upstream: {error}\n")).into_response(),
    }
}

fn env_u64(name: &str, default: u64) -> Result<u64, Box<dyn std::error::Error>> {
    match std::env::var(name) {
        Ok(value) => Ok(value.trim().parse()?),
        Err(_) => Ok(default),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_redis_ratelimit=info".into()),
        )
        .init();
    let mode = std::env::args().nth(1).unwrap_or_default();
    let (app, default_port) = match mode.as_str() {
        "upstream" => (upstream_app(), 8000),
        "proxy" => {
            let upstream = std::env::var("UPSTREAM_URL")
                .map_err(|_| "proxy mode needs UPSTREAM_URL (such as http://127.0.0.1:8000)")?;
            let backend = match std::env::var("REDIS_URL") {
                Ok(url) => Backend::builder().redis_url(url).prefix("llm").build()?,
                Err(_) => Backend::in_process(),
            };
            let (rpm, tpm) = (env_u64("RPM", 60)?, env_u64("TPM", 10_000)?);
            println!(
                "{rpm} requests and {tpm} tokens per minute per API key, limits {}",
                if backend.is_redis() {
                    "in Redis"
                } else {
                    "in this process"
                }
            );
            (
                proxy_app(&backend, completions_url(&upstream)?, rpm, tpm)?,
                3000,
            )
        }
        _ => return Err("usage: llm_proxy upstream|proxy".into()),
    };
    let port = u16::try_from(env_u64("PORT", default_port)?)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("{mode} listening on http://{addr}{PATH}");
    axum::serve(listener, app).await?;
    Ok(())
}
