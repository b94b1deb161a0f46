//! A login endpoint that only counts failures and locks a user out after five of them:
//! `POST /login` with `{"user": "...", "password": "..."}`. On Redis when `REDIS_URL` is
//! set (every process on that Redis shares the counts and the lockout), in-process
//! otherwise.
//!
//! ```text
//! cargo run --example login --features admin                                   # in-process, port 3000
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example login --features admin  # shared in Redis
//! ```
//!
//! The one account is `alice` / `wonderland`. A successful login answers `200` and never
//! spends the quota; a wrong password answers `401` and counts. Five failures within 15
//! minutes lock that user out: the next attempt (even with the right password) and every
//! one after it for 15 minutes get `429 Too Many Requests` with `Retry-After`. Other users
//! are not affected. `PORT` overrides the port (3000).
//!
//! With `ADMIN_TOKEN` set, the [admin router](tower_redis_ratelimit::admin) is mounted
//! under `/admin/ratelimit`, answering only requests with `authorization: Bearer
//! $ADMIN_TOKEN`: list who is locked out, and unlock a user by name:
//!
//! ```text
//! curl -H "authorization: Bearer $ADMIN_TOKEN" http://127.0.0.1:3000/admin/ratelimit/blocked
//! curl -X POST -H "authorization: Bearer $ADMIN_TOKEN" http://127.0.0.1:3000/admin/ratelimit/login/alice/reset
//! ```
//!
//! How: the body's `user` is put into the request extensions before the limit, the key
//! is [`ExtensionKey<LoginUser>`], [`CountIf::failures`] refunds the logins that
//! succeed, and the limit's [`lockout`](PeriodConfig::lockout) turns its first refusal
//! into a 15-minute lock kept next to the count.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use serde::Deserialize;
use tower_redis_ratelimit::key::ExtensionKey;
use tower_redis_ratelimit::limit::CountIf;
use tower_redis_ratelimit::AdminRouter;
use tower_redis_ratelimit::PeriodConfig;
use tower_redis_ratelimit::{Backend, ConfigError, LimitLayer};

/// The window in which failures count, and how long a lockout lasts.
const FIFTEEN_MINUTES: Duration = Duration::from_secs(15 * 60);
/// The failures a user may have within the window.
const FAILURES: u64 = 5;
/// The largest login body read.
const MAX_BODY: usize = 16 * 1024;

/// A login attempt, as posted.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct LoginForm {
    user: String,
    password: String,
}

/// The user a login attempt is for: the rate-limit key.
#[derive(Debug, Clone)]
pub(crate) struct LoginUser(String);

impl fmt::Display for LoginUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads the JSON body and puts the attempt (and its user) into the extensions, so the
/// limit can key on the user; `400` for a body that is not a login form.
async fn read_form(req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return (StatusCode::BAD_REQUEST, "unreadable body\n").into_response();
    };
    let Ok(form) = serde_json::from_slice::<LoginForm>(&bytes) else {
        return (
            StatusCode::BAD_REQUEST,
            "expected {\"user\": \"...\", \"password\": \"...\"}\n",
        )
            .into_response();
    };
    parts.extensions.insert(LoginUser(form.user.clone()));
    parts.extensions.insert(form);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Checks the password of the one account.
async fn login(Extension(form): Extension<LoginForm>) -> (StatusCode, String) {
    if form.user == "alice" && form.password == "wonderland" {
        (StatusCode::OK, format!("welcome, {}\n", form.user))
    } else {
        (
            StatusCode::UNAUTHORIZED,
            "wrong user or password\n".to_owned(),
        )
    }
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

/// The login app on `backend`, and the admin router of its limit (not mounted).
fn build(backend: &Backend) -> Result<(Router, AdminRouter), ConfigError> {
    let failures = LimitLayer::builder(
        backend,
        PeriodConfig::new(FAILURES, FIFTEEN_MINUTES).lockout(FIFTEEN_MINUTES),
    )
    .name("login")
    .key(ExtensionKey::<LoginUser>::new())
    .count_if(CountIf::failures())
    .build()?;
    let admin = AdminRouter::new().limit(&failures);
    let app = Router::new()
        .route("/login", post(login).layer(failures))
        .layer(middleware::from_fn(read_form));
    Ok((app, admin))
}

/// The login app on `backend`.
///
/// # Errors
///
/// A [`ConfigError`] if the limit is misconfigured.
pub(crate) fn app(backend: &Backend) -> Result<Router, ConfigError> {
    Ok(build(backend)?.0)
}

/// The login app on `backend`, with the admin router under `/admin/ratelimit` for the
/// requests that carry `authorization: Bearer <admin_token>` (outside the login form's
/// reading and the limit: an operator is never locked out of unlocking a user).
///
/// # Errors
///
/// A [`ConfigError`] if the limit is misconfigured.
pub(crate) fn app_with_admin(backend: &Backend, admin_token: &str) -> Result<Router, ConfigError> {
    let (app, admin) = build(backend)?;
    let token: Arc<str> = admin_token.into();
    let admin = admin
        .into_router()
        .layer(middleware::from_fn_with_state(token, require_token));
    Ok(app.nest("/admin/ratelimit", admin))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => {
            // (Not the URL: it may hold a password.)
            println!("counts and lockouts are kept in Redis (REDIS_URL)");
            Backend::builder().redis_url(url).prefix("login").build()?
        }
        Err(_) => {
            println!("REDIS_URL is not set: counts and lockouts are kept in this process");
            Backend::in_process()
        }
    };
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse()?,
        Err(_) => 3000,
    };
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    println!(
        "serving on http://{addr}\n\
         try: for i in $(seq 7); do curl -s -i -X POST -H 'content-type: application/json' \
         -d '{{\"user\": \"alice\", \"password\": \"guess\"}}' http://{addr}/login | head -1; done"
    );
    // `ADMIN_TOKEN` is never printed: the lines below read it from the shell.
    let app = match std::env::var("ADMIN_TOKEN") {
        Ok(token) => {
            println!(
                "admin: curl -H \"authorization: Bearer $ADMIN_TOKEN\" http://{addr}/admin/ratelimit/blocked\n\
                 admin: curl -X POST -H \"authorization: Bearer $ADMIN_TOKEN\" http://{addr}/admin/ratelimit/login/alice/reset"
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
