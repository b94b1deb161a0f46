//! Outbound limits: clients that wait for one limit shared through Redis, and an
//! upstream that counts what reaches it.
//!
//! ```text
//! cargo run --example outbound -- upstream                 # terminal 1
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example outbound -- client   # terminals 2 and 3
//! curl http://127.0.0.1:3001/stats
//! ```
//!
//! `upstream` serves `127.0.0.1:$PORT` (default 3001): every request but `GET /stats`
//! is an arrival, counted per second since the first one; `GET /stats` answers
//! `{"per_second": [...], "total": n}`.
//!
//! `client` sends `REQUESTS` (default 200) `GET`s to `UPSTREAM_URL` (default
//! `http://127.0.0.1:3001/`) all at once through an [`OutboundLayer`] over a
//! `hyper-util` client, limited to `RATE` per second (default 20, `BURST` 1) under one
//! key on the Redis at `REDIS_URL` (in-process without it); each waits up to
//! `MAX_WAIT_SECS` (default 30). It prints how many succeeded, gave up (waited longer
//! than the maximum) or failed, and exits (with status 1 if any did not succeed). Two
//! clients on one Redis share the limit: the upstream never sees more than `RATE` plus
//! the burst in any second.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{Method, Uri};
use axum::routing::any;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_redis_ratelimit::outbound::{OutboundError, OutboundLayer, Waiter};
use tower_redis_ratelimit::Backend;
use tower_redis_ratelimit::{TokenBucketConfig, TokenBucketLimiter};

/// What the upstream saw: arrivals per second since the first one.
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    inner: Mutex<(Option<Instant>, Vec<u64>)>,
}

impl Arrivals {
    fn record(&self) {
        let mut inner = self.inner.lock().expect("not poisoned");
        let (first, per_second) = &mut *inner;
        let first = *first.get_or_insert_with(Instant::now);
        let second = usize::try_from(first.elapsed().as_secs()).unwrap_or(usize::MAX);
        if per_second.len() <= second {
            per_second.resize(second + 1, 0);
        }
        per_second[second] += 1;
    }

    /// Arrivals in each second since the first one.
    pub(crate) fn per_second(&self) -> Vec<u64> {
        self.inner.lock().expect("not poisoned").1.clone()
    }

    /// `{"per_second": [...], "total": n}`
    pub(crate) fn json(&self) -> String {
        let per_second = self.per_second();
        let total: u64 = per_second.iter().sum();
        let list: Vec<String> = per_second.iter().map(u64::to_string).collect();
        format!(
            "{{\"per_second\": [{}], \"total\": {total}}}\n",
            list.join(", ")
        )
    }
}

/// The upstream: `GET /stats`, and every other request counted as an arrival.
pub(crate) fn upstream(arrivals: Arc<Arrivals>) -> Router {
    async fn handle(method: Method, uri: Uri, State(arrivals): State<Arc<Arrivals>>) -> String {
        if method == Method::GET && uri.path() == "/stats" {
            return arrivals.json();
        }
        arrivals.record();
        "ok\n".to_owned()
    }
    Router::new()
        .route("/", any(handle))
        .route("/{*path}", any(handle))
        .with_state(arrivals)
}

/// What one client run does.
#[derive(Debug, Clone)]
pub(crate) struct ClientSettings {
    pub(crate) upstream_url: String,
    pub(crate) requests: usize,
    pub(crate) rate: u64,
    pub(crate) burst: u64,
    pub(crate) max_wait: Duration,
}

/// How a client run went.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Sent, and answered with a success status.
    pub(crate) succeeded: usize,
    /// Not sent: the limit would not admit them within the maximum wait.
    pub(crate) gave_up: usize,
    /// Sent and failed (an error, or a status other than success).
    pub(crate) failed: usize,
}

/// Sends `settings.requests` GETs at once through the outbound layer on `backend`.
///
/// # Errors
///
/// An invalid rate, burst or URL.
pub(crate) async fn client(
    backend: &Backend,
    settings: &ClientSettings,
) -> Result<Summary, Box<dyn std::error::Error>> {
    let config = TokenBucketConfig::new(settings.rate, Duration::from_secs(1), settings.burst);
    let limiter = TokenBucketLimiter::new(backend, "outbound", config)?;
    let uri: Uri = settings.upstream_url.parse()?;
    // One limit per upstream (the authority each request is sent to), whichever
    // instance sends: the key `fn:upstream:127.0.0.1:3001`.
    let layer = OutboundLayer::new(Waiter::new(limiter), settings.max_wait).key(
        |parts: &http::request::Parts| {
            let authority = parts.uri.authority()?;
            Some(format!("upstream:{authority}"))
        },
    );
    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let client = ServiceBuilder::new().layer(layer).service(http);

    let tasks: Vec<_> = (0..settings.requests)
        .map(|_| {
            let client = client.clone();
            let uri = uri.clone();
            tokio::spawn(async move {
                let request = http::Request::get(uri).body(Empty::new())?;
                let response = client.oneshot(request).await?;
                let status = response.status();
                response.into_body().collect().await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(status.is_success())
            })
        })
        .collect();
    let mut summary = Summary::default();
    for task in tasks {
        match task.await? {
            Ok(true) => summary.succeeded += 1,
            Err(error)
                if error
                    .downcast_ref::<OutboundError<hyper_util::client::legacy::Error>>()
                    .is_some_and(|e| e.wait_error().is_some()) =>
            {
                summary.gave_up += 1;
            }
            Ok(false) | Err(_) => summary.failed += 1,
        }
    }
    Ok(summary)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map_err(|_| format!("{name}={value:?} is not a valid number")),
        Err(_) => Ok(default),
    }
}

async fn run_upstream() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = env_or("PORT", 3001)?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, upstream(Arc::default())).await?;
    Ok(())
}

async fn run_client() -> Result<bool, Box<dyn std::error::Error>> {
    let settings = ClientSettings {
        upstream_url: std::env::var("UPSTREAM_URL")
            .unwrap_or_else(|_| "http://127.0.0.1:3001/".to_owned()),
        requests: env_or("REQUESTS", 200)?,
        rate: env_or("RATE", 20)?,
        burst: env_or("BURST", 1)?,
        max_wait: Duration::from_secs(env_or("MAX_WAIT_SECS", 30)?),
    };
    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => {
            let backend = Backend::builder()
                .redis_url(url)
                .prefix("outbound")
                .build()?;
            if let Err(error) = backend.warm_up().await {
                eprintln!("warning: {error}; waiting on the in-process fallback");
            }
            println!("the limit is shared in Redis");
            backend
        }
        Err(_) => {
            println!("REDIS_URL is not set: the limit is kept in this process");
            Backend::in_process()
        }
    };
    println!(
        "sending {} requests to {} at {}/s (burst {}), waiting up to {:?} each",
        settings.requests, settings.upstream_url, settings.rate, settings.burst, settings.max_wait
    );
    let start = Instant::now();
    let summary = client(&backend, &settings).await?;
    println!(
        "{} succeeded, {} gave up, {} failed in {:.1} s",
        summary.succeeded,
        summary.gave_up,
        summary.failed,
        start.elapsed().as_secs_f64()
    );
    Ok(summary.succeeded == settings.requests)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::args().nth(1).as_deref() {
        Some("upstream") => run_upstream().await,
        Some("client") => {
            if !run_client().await? {
                std::process::exit(1);
            }
            Ok(())
        }
        _ => Err("usage: cargo run --example outbound -- upstream|client".into()),
    }
}
