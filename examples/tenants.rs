//! Limits for a multi-tenant API: per user, per plan, per merchant, stacked, and a trial
//! limit in shadow mode. On Redis when `REDIS_URL` is set, in-process otherwise.
//!
//! ```text
//! cargo run --example tenants --features admin                                   # in-process
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example tenants --features admin  # shared in Redis
//! ```
//!
//! An authentication layer turns `Authorization: Bearer <token>` into a [`UserId`] and a
//! [`Plan`] in the request extensions (tokens `free-token` and `paid-token`); the limits
//! read them from there:
//!
//! | route | limit | key |
//! |---|---|---|
//! | `GET /profile` | free plan 10/min, paid plan 1000/min: one layer, the plan chosen per request | user |
//! | `GET /search` | a burst of 3 (one more per second) and a daily quota of 100, stacked | user |
//! | `POST /payments` | 20/min | `x-merchant-id` header |
//! | `GET /reports` | 2 per second and 10 per day, one atomic pair: a request either counts against both or against neither (one script call on Redis) | `x-merchant-id` header |
//! | `GET /export?ms=N` | at most 2 in flight at once, across every instance on `REDIS_URL`: the export streams rows for N ms (default 1000), and holds its slot until the last row is sent | `x-merchant-id` header |
//! | all of the above but `/reports` and `/export` | 30/min in shadow mode: logged and counted, never enforced | user |
//!
//! An export's slot is a lease of `EXPORT_LEASE_MS` (default 10 000) on Redis, renewed
//! while the export runs: an instance that dies mid-export gives its slots back within
//! one lease.
//!
//! Try `curl -i -H 'authorization: Bearer free-token' http://127.0.0.1:3001/profile`.
//! `PORT` overrides the port (3001).
//!
//! With `ADMIN_TOKEN` set, the [admin router](tower_redis_ratelimit::admin) is mounted
//! under `/admin/ratelimit` for the requests that carry `authorization: Bearer
//! $ADMIN_TOKEN` (not the users' tokens): every limit above but the in-flight one, by
//! the value its requests carry (a user id, a merchant id). Block merchant `m1`'s
//! reports for a minute, see it listed, lift it:
//!
//! ```text
//! curl -X POST -H "authorization: Bearer $ADMIN_TOKEN" 'http://127.0.0.1:3001/admin/ratelimit/reports/m1/block?seconds=60'
//! curl -H "authorization: Bearer $ADMIN_TOKEN" http://127.0.0.1:3001/admin/ratelimit/blocked
//! curl -X POST -H "authorization: Bearer $ADMIN_TOKEN" http://127.0.0.1:3001/admin/ratelimit/reports/m1/reset
//! ```

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use tower::ServiceBuilder;
use tower_redis_ratelimit::key::{ExtensionKey, HeaderKey};
use tower_redis_ratelimit::AdminRouter;
use tower_redis_ratelimit::TokenBucketConfig;
use tower_redis_ratelimit::{Backend, ConfigError, Decision, ExtensionPlan, Plans};
use tower_redis_ratelimit::{InFlightConfig, LimitLayer, LimitSet};
use tower_redis_ratelimit::{PeriodConfig, UtcOffset};

/// The authenticated user, put into the request extensions by [`authenticate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserId(pub String);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The user's plan, put into the request extensions by [`authenticate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// 10 calls per minute on `/profile`.
    Free,
    /// 1000 calls per minute on `/profile`.
    Paid,
}

/// A stand-in for real authentication: two fixed bearer tokens.
pub async fn authenticate(mut req: Request, next: Next) -> Result<Response, StatusCode> {
    let token = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let (user, plan) = match token {
        Some("free-token") => ("user-free", Plan::Free),
        Some("paid-token") => ("user-paid", Plan::Paid),
        _ => return Err(StatusCode::UNAUTHORIZED),
    };
    req.extensions_mut().insert(UserId(user.to_owned()));
    req.extensions_mut().insert(plan);
    Ok(next.run(req).await)
}

/// The lease of an export's slot: `EXPORT_LEASE_MS` milliseconds, 10 000 by default (or
/// when it is not a number).
pub fn export_lease() -> Duration {
    let ms = std::env::var("EXPORT_LEASE_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(10_000);
    Duration::from_millis(ms)
}

/// The whole application, limited on `backend`, with an export's lease from
/// [`export_lease`].
///
/// # Errors
///
/// A [`ConfigError`] if a limit is misconfigured.
pub fn app(backend: &Backend) -> Result<Router, ConfigError> {
    app_with_export_lease(backend, export_lease())
}

/// The whole application, limited on `backend`, an export's slot a lease of
/// `export_lease`.
///
/// # Errors
///
/// A [`ConfigError`] if a limit is misconfigured (a zero lease).
pub fn app_with_export_lease(
    backend: &Backend,
    export_lease: Duration,
) -> Result<Router, ConfigError> {
    Ok(build(backend, export_lease)?.0)
}

/// The whole application (as [`app`]), with the admin router under `/admin/ratelimit`
/// for the requests that carry `authorization: Bearer <admin_token>`: outside the
/// users' authentication and every limit, so an operator is never limited out of
/// lifting a block.
///
/// # Errors
///
/// A [`ConfigError`] if a limit is misconfigured.
pub fn app_with_admin(backend: &Backend, admin_token: &str) -> Result<Router, ConfigError> {
    let (app, admin) = build(backend, export_lease())?;
    let token: Arc<str> = admin_token.into();
    let admin = admin
        .into_router()
        .layer(middleware::from_fn_with_state(token, require_token));
    Ok(app.nest("/admin/ratelimit", admin))
}

/// Answers `401` to a request that does not carry `authorization: Bearer <token>`.
async fn require_token(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    let sent = request
        .headers()
        .get("authorization")
        .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "));
    // Compared in a time that does not depend on where the bytes differ.
    let same = sent.is_some_and(|sent| {
        sent.len() == token.len()
            && sent
                .iter()
                .zip(token.as_bytes())
                .fold(0, |differ, (a, b)| differ | (a ^ b))
                == 0
    });
    if same {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, "admin token required\n").into_response()
    }
}

/// The whole application and the admin router of its limits (not mounted).
fn build(backend: &Backend, export_lease: Duration) -> Result<(Router, AdminRouter), ConfigError> {
    let minute = Duration::from_secs(60);
    let user = || ExtensionKey::<UserId>::new();

    // One layer, two plans: each request is checked against its plan's limit, and its
    // `RateLimit-Policy` header names that plan ("profile.free" or "profile.paid").
    let plans = Plans::new(ExtensionPlan::<Plan>::new())
        .plan(Plan::Free, "free", PeriodConfig::new(10, minute))
        .plan(Plan::Paid, "paid", PeriodConfig::new(1_000, minute));
    let per_plan = LimitLayer::builder(backend, plans)
        .name("profile")
        .key(user())
        .build()?;

    // Stacked: the burst limit must be the outer layer (checked first), so a request it
    // refuses never reaches, and never uses, the daily quota.
    let burst = LimitLayer::builder(
        backend,
        TokenBucketConfig::new(1, Duration::from_secs(1), 3),
    )
    .name("search-burst")
    .key(user())
    .build()?;
    let daily = LimitLayer::builder(
        backend,
        PeriodConfig::new(100, Duration::from_secs(86_400)).align(UtcOffset::UTC),
    )
    .name("search-daily")
    .key(user())
    .build()?;

    let per_merchant = LimitLayer::builder(backend, PeriodConfig::new(20, minute))
        .name("payments")
        .key(HeaderKey::from_static("x-merchant-id"))
        .build()?;

    // A limit under trial: never rejects, adds no headers, and logs (`info`) and counts
    // (`outcome="shadow_rejected"`) the requests it would have refused.
    let trial = LimitLayer::builder(backend, TokenBucketConfig::new(30, minute, 30))
        .name("trial")
        .key(user())
        .shadow(true)
        .build()?;

    // An atomic pair: both limits decided at once, all or nothing (a request refused by
    // the burst does not use the daily quota, and the other way round), listed in the
    // `RateLimit` headers burst first. The only limit of its route: one script call.
    let reports = LimitLayer::builder(
        backend,
        LimitSet::new()
            .limit(
                "burst",
                TokenBucketConfig::new(2, Duration::from_secs(1), 2),
            )
            .limit("daily", PeriodConfig::new(10, Duration::from_secs(86_400))),
    )
    .name("reports")
    .key(HeaderKey::from_static("x-merchant-id"))
    .build()?;

    // Every limit by the value its requests carry (not the in-flight one: a slot is
    // given back by its request, never by an operator). The plans are one limit,
    // named by the first plan's policy (`profile.free`).
    let admin = AdminRouter::new()
        .limit(&per_plan)
        .limit(&burst)
        .limit(&daily)
        .limit(&per_merchant)
        .limit(&trial)
        .limit(&reports);

    let per_user = Router::new()
        .route("/profile", get(report).layer(per_plan))
        // `ServiceBuilder` runs its layers top to bottom: `burst`, then `daily`.
        .route(
            "/search",
            get(report).layer(ServiceBuilder::new().layer(burst).layer(daily)),
        )
        .route("/payments", post(report).layer(per_merchant))
        .layer(trial);
    // At most 2 exports of one merchant at once, across every instance: a slot is held
    // until the export's last row is sent, renewed while it runs.
    let exports = LimitLayer::builder(backend, InFlightConfig::new(2).slot_ttl(export_lease))
        .name("export")
        .key(HeaderKey::from_static("x-merchant-id"))
        .build()?;

    let per_merchant_pair = Router::new()
        .route("/reports", get(merchant_report).layer(reports))
        .route("/export", get(export).layer(exports));
    let app = per_user
        .merge(per_merchant_pair)
        .layer(middleware::from_fn(authenticate));
    Ok((app, admin))
}

/// The query of `GET /export`.
#[derive(Debug, serde::Deserialize)]
pub struct ExportQuery {
    /// How long the export runs, in milliseconds (default 1000).
    pub ms: Option<u64>,
}

/// An export that works for `ms` milliseconds, streaming a row every 100 ms.
async fn export(Query(query): Query<ExportQuery>) -> axum::body::Body {
    let ms = query.ms.unwrap_or(1_000);
    axum::body::Body::new(Rows {
        next: 0,
        until: tokio::time::Instant::now() + Duration::from_millis(ms),
        sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
    })
}

/// The rows of an export: `row <n>` every 100 ms until `until`, then `done`.
struct Rows {
    next: u64,
    until: tokio::time::Instant,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Rows {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.next == u64::MAX {
            return Poll::Ready(None);
        }
        std::task::ready!(self.sleep.as_mut().poll(cx));
        let now = tokio::time::Instant::now();
        let row = if now >= self.until {
            self.next = u64::MAX;
            "done\n".to_owned()
        } else {
            let row = format!("row {}\n", self.next);
            self.next += 1;
            let next = (now + Duration::from_millis(100)).min(self.until);
            self.sleep.as_mut().reset(next);
            row
        };
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(row)))))
    }
}

/// Tells the merchant where it stands against the tighter of its two limits.
async fn merchant_report(Extension(decision): Extension<Decision>) -> String {
    format!(
        "report: {:?}, {} of {} left\n",
        decision.state, decision.remaining, decision.limit
    )
}

/// Tells the client where it stands (the innermost enforcing layer's decision).
async fn report(
    Extension(user): Extension<UserId>,
    Extension(decision): Extension<Decision>,
) -> String {
    format!(
        "{user}: {:?}, {} of {} left\n",
        decision.state, decision.remaining, decision.limit
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
            // (Not the URL: it may hold a password.)
            println!("limits are kept in Redis (REDIS_URL)");
            Backend::builder()
                .redis_url(url)
                .prefix("tenants")
                .build()?
        }
        Err(_) => {
            println!("REDIS_URL is not set: limits are kept in this process");
            Backend::in_process()
        }
    };
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse()?,
        Err(_) => 3001,
    };
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    println!(
        "serving on http://{addr}\n\
         try: for i in $(seq 12); do curl -s -H 'authorization: Bearer free-token' http://{addr}/profile; done\n\
         and: for i in 1 2 3; do curl -s -H 'authorization: Bearer free-token' -H 'x-merchant-id: m1' 'http://{addr}/export?ms=3000' & done; wait"
    );
    // `ADMIN_TOKEN` is never printed: the lines below read it from the shell.
    let app = match std::env::var("ADMIN_TOKEN") {
        Ok(token) => {
            println!(
                "admin: curl -X POST -H \"authorization: Bearer $ADMIN_TOKEN\" 'http://{addr}/admin/ratelimit/reports/m1/block?seconds=60'\n\
                 admin: curl -H \"authorization: Bearer $ADMIN_TOKEN\" http://{addr}/admin/ratelimit/blocked\n\
                 admin: curl -X POST -H \"authorization: Bearer $ADMIN_TOKEN\" http://{addr}/admin/ratelimit/reports/m1/reset"
            );
            app_with_admin(&backend, &token)?
        }
        Err(_) => {
            println!("ADMIN_TOKEN is not set: no admin endpoints");
            app(&backend)?
        }
    };
    axum::serve(listener, app).await?;
    Ok(())
}
