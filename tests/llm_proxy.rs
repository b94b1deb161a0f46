//! The `llm_proxy` example's two modes, served as the example serves them on free
//! loopback ports: the stand-in model answers JSON and Server-Sent Events as specified;
//! the gateway settles each request to its `usage.total_tokens` (from the JSON body or
//! the last SSE chunk), refuses a key that owes tokens with the right `Retry-After`, and
//! counts requests per minute apart from tokens; in process and on a real Redis.

mod support;

#[path = "../examples/llm_proxy.rs"]
#[allow(dead_code)]
mod llm_proxy;

use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use support::RedisServer;
use tower_redis_ratelimit::TokenBucketConfig;
use tower_redis_ratelimit::{Backend, Limiter};
use tower_redis_ratelimit::{LimitSet, SetLimiter};

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

struct Caller {
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
}

/// A response's status, `Retry-After` and body.
struct Answer {
    status: StatusCode,
    retry_after: Option<u64>,
    body: String,
}

impl Caller {
    fn new(addr: SocketAddr) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            url: format!("http://{addr}{}", llm_proxy::PATH),
        }
    }

    async fn post(&self, key: Option<&str>, completion: Option<u64>, body: Value) -> Answer {
        let mut request = Request::post(&self.url).header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        if let Some(tokens) = completion {
            request = request.header("x-test-completion-tokens", tokens.to_string());
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = self.client.request(request).await.unwrap();
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            retry_after,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }
}

fn chat(content: &str, max_tokens: Option<u64>, stream: bool) -> Value {
    let mut body = json!({
        "model": "stand-in",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}],
    });
    if let Some(max) = max_tokens {
        body["max_tokens"] = json!(max);
    }
    if stream {
        body["stream"] = json!(true);
    }
    body
}

#[tokio::test]
async fn the_upstream_answers_json_and_events_as_specified() {
    let upstream = Caller::new(serve(llm_proxy::upstream_app()).await);
    // 2 + 3 prompt words; 20 completion tokens from max_tokens.
    let answer = upstream
        .post(None, None, chat("hello there world", Some(20), false))
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    let json: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        json["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 20, "total_tokens": 25})
    );
    // The header wins over max_tokens; 16 without either.
    let answer = upstream
        .post(None, Some(7), chat("hi", Some(20), false))
        .await;
    let json: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(json["usage"]["total_tokens"], 10);
    let answer = upstream.post(None, None, chat("hi", None, false)).await;
    let json: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(json["usage"]["completion_tokens"], 16);

    // 25 tokens streamed: 3 chunks, the usage, [DONE].
    let answer = upstream.post(None, Some(25), chat("hi", None, true)).await;
    assert_eq!(answer.status, StatusCode::OK);
    let events: Vec<&str> = answer
        .body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(events.len(), 5, "{}", answer.body);
    assert_eq!(events[4], "data: [DONE]");
    let last: Value = serde_json::from_str(events[3].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(last["usage"]["total_tokens"], 28);
    let first: Value = serde_json::from_str(events[0].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(
        first["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        10
    );
}

/// The tokens `key` has left against the proxy's tokens per minute (1 000), through a
/// set of the same name holding its `tpm` limit alone: the same limit.
async fn tokens(backend: &Backend, key: &str) -> u64 {
    let tpm = TokenBucketConfig::new(1_000, Duration::from_secs(60), 1_000);
    let limiter = SetLimiter::new(backend, "llm", LimitSet::new().limit("tpm", tpm)).unwrap();
    let key = format!("hdr:authorization:Bearer {key}");
    limiter.settle(key.as_bytes(), 0).unwrap().await.remaining
}

/// Waits until the background settlement has brought `key`'s tokens to 1 000 less
/// `spent`, plus what the bucket refilled since the first request (`since`: one token
/// every 60 ms, however slow the machine).
async fn tokens_left(backend: &Backend, key: &str, spent: u64, since: Instant) {
    let mut last = 0;
    let mut expected = 0..=0;
    for _ in 0..300 {
        last = tokens(backend, key).await;
        let refilled = u64::try_from(since.elapsed().as_millis() / 60).unwrap_or(u64::MAX);
        expected = 1_000 - spent..=(1_000 - spent + refilled + 1).min(1_000);
        if expected.contains(&last) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{key}: {last} tokens left, never within {expected:?}");
}

async fn gateway(backend: Backend) {
    let upstream = serve(llm_proxy::upstream_app()).await;
    let url = llm_proxy::completions_url(&format!("http://{upstream}")).unwrap();
    let proxy = Caller::new(serve(llm_proxy::proxy_app(&backend, url, 5, 1_000).unwrap()).await);

    // No key: refused before the upstream.
    let answer = proxy.post(None, None, chat("hi", None, false)).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);

    // 5 prompt words + max_tokens 100 reserved; 40 completion tokens used: 45 spent.
    let since = Instant::now();
    let answer = proxy
        .post(
            Some("k1"),
            Some(40),
            chat("hello there world", Some(100), false),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let json: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(json["usage"]["total_tokens"], 45);
    tokens_left(&backend, "k1", 45, since).await;

    // Streamed: 2 + 1 prompt words, 300 tokens streamed, 256 reserved (no max_tokens):
    // settled from the last chunk to 303.
    let answer = proxy
        .post(Some("k1"), Some(300), chat("hi", None, true))
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.body.ends_with("data: [DONE]\n\n"), "{}", answer.body);
    tokens_left(&backend, "k1", 45 + 303, since).await;

    // 13 reserved, 2 003 used: the key owes about 1 350 tokens, paid off by the refill
    // (1 000 a minute) in about 81 s.
    let answer = proxy
        .post(Some("k1"), Some(2_000), chat("hi", Some(10), false))
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    let mut refused = None;
    for _ in 0..300 {
        let answer = proxy
            .post(Some("k1"), None, chat("hi", Some(1), false))
            .await;
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(answer);
            break;
        }
        // The settlement lands in the background: until then, the debt is not known.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = refused.expect("a key in debt is refused");
    let retry = refused.retry_after.expect("with Retry-After");
    assert!((75..=85).contains(&retry), "Retry-After {retry}");

    // Requests per minute: 5, whatever their tokens; another key.
    for i in 0..5 {
        let answer = proxy
            .post(Some("k2"), Some(1), chat("hi", Some(1), false))
            .await;
        assert_eq!(answer.status, StatusCode::OK, "request {i}");
    }
    let answer = proxy
        .post(Some("k2"), Some(1), chat("hi", Some(1), false))
        .await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    // One request back every 12 s.
    let retry = answer.retry_after.unwrap();
    assert!((11..=12).contains(&retry), "Retry-After {retry}");
}

#[tokio::test]
async fn the_gateway_settles_tokens_in_process() {
    gateway(Backend::in_process()).await;
}

#[tokio::test]
async fn the_gateway_settles_tokens_on_redis() {
    let redis = RedisServer::start();
    gateway(redis.uncached_backend()).await;
}
