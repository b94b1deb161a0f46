//! Rotating credentials: a [`CredentialsProvider`] the backend asks for a user and a
//! password or token before each new connection and again before the token expires, so
//! that every connection it keeps re-authenticates (`AUTH`) in time.
//!
//! One refresher per backend asks the provider (at three quarters of a token's lifetime)
//! and hands the new credentials to every connection; redis-rs sends the `AUTH` on each
//! connection, pipelined with its checks, so no decision fails at the switch.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use deadpool_redis::redis::{self, ErrorKind, RedisError};
use futures_util::stream::{self, Stream};
use tokio::sync::{watch, Mutex};

use crate::error::BoxError;

/// What a [`CredentialsProvider`] answers: an ACL user and its password or token, and
/// when the token expires (if it does).
///
/// Its `Debug` output never shows the password.
///
/// ```
/// use std::time::Duration;
/// use tower_redis_ratelimit::Credentials;
///
/// let credentials = Credentials::new("limiter", "token-from-iam")
///     .expires_in(Duration::from_secs(15 * 60));
/// assert_eq!(credentials.username(), "limiter");
/// assert!(!format!("{credentials:?}").contains("token-from-iam"));
/// ```
#[derive(Clone)]
pub struct Credentials {
    username: String,
    password: String,
    expires_at: Option<SystemTime>,
}

impl Credentials {
    /// The ACL user `username` (`"default"` for a `requirepass` password) with `password`
    /// (or token), valid until further notice.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
            expires_at: None,
        }
    }

    /// The token is valid until `at` (wall-clock time): the backend asks for new
    /// credentials at three quarters of its lifetime and re-authenticates every
    /// connection with them.
    #[must_use]
    pub fn expires_at(mut self, at: SystemTime) -> Self {
        self.expires_at = Some(at);
        self
    }

    /// The token is valid for `lifetime` from now (see [`expires_at`](Self::expires_at)).
    #[must_use]
    pub fn expires_in(self, lifetime: Duration) -> Self {
        self.expires_at(SystemTime::now() + lifetime)
    }

    /// The ACL user.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// When the token expires, if it does.
    pub fn expiry(&self) -> Option<SystemTime> {
        self.expires_at
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Where short-lived Redis credentials come from (AWS ElastiCache and MemoryDB IAM
/// tokens, Azure Entra ID tokens, a secrets manager): see
/// [`BackendBuilder::credentials`](crate::BackendBuilder::credentials).
///
/// Any `Fn() -> impl Future<Output = Result<Credentials, E>>` is a provider:
///
/// ```no_run
/// use std::time::Duration;
/// use tower_redis_ratelimit::{Credentials, Backend};
///
/// async fn fetch_token() -> Result<String, std::io::Error> {
///     // Ask your cloud's SDK for a token.
///     Ok("token".to_owned())
/// }
///
/// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
/// let backend = Backend::builder()
///     .redis_url("rediss://my-cache.example.com:6379")
///     .credentials(|| async {
///         let token = fetch_token().await?;
///         Ok::<_, std::io::Error>(
///             Credentials::new("limiter", token).expires_in(Duration::from_secs(15 * 60)),
///         )
///     })
///     .build()?;
/// # Ok(()) }
/// ```
pub trait CredentialsProvider: Send + Sync + 'static {
    /// Fresh credentials. An error keeps the connections on their current credentials
    /// (asked again with a backoff, logged at most every ten seconds) and fails a new
    /// connection, which the layers' [failure policy](crate::FailurePolicy) answers for.
    fn credentials(
        &self,
    ) -> impl Future<Output = Result<Credentials, Box<dyn std::error::Error + Send + Sync>>> + Send;
}

impl<F, Fut, E> CredentialsProvider for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Credentials, E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn credentials(&self) -> impl Future<Output = Result<Credentials, BoxError>> + Send {
        let future = self();
        async move { future.await.map_err(Into::into) }
    }
}

/// A [`CredentialsProvider`] behind a `dyn`: its future boxed.
pub(crate) trait BoxedProvider: Send + Sync + 'static {
    fn credentials(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Credentials, BoxError>> + Send + '_>>;
}

impl<P: CredentialsProvider> BoxedProvider for P {
    fn credentials(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Credentials, BoxError>> + Send + '_>> {
        Box::pin(CredentialsProvider::credentials(self))
    }
}

/// A token is renewed after this share of its lifetime.
const RENEW_AT: f64 = 0.75;
/// The first wait after a provider error; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// At most one log line per this interval for a failing provider.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Credentials as fetched, with the time to renew them.
#[derive(Clone)]
struct Fetched {
    auth: redis::BasicAuth,
    /// When to ask for new ones (`None`: never).
    renew_at: Option<Instant>,
}

impl Fetched {
    fn new(credentials: Credentials) -> Self {
        let now = Instant::now();
        let renew_at = credentials.expires_at.map(|expiry| {
            let lifetime = expiry.duration_since(SystemTime::now()).unwrap_or_default();
            now + lifetime.mul_f64(RENEW_AT)
        });
        Self {
            auth: redis::BasicAuth::new(credentials.username, credentials.password),
            renew_at,
        }
    }

    /// Still good for a new connection: not yet at its renewal time.
    fn is_fresh(&self) -> bool {
        self.renew_at.is_none_or(|at| Instant::now() < at)
    }
}

/// The backend's credentials: the provider, the current credentials, and a log that
/// says at most every ten seconds that the provider fails.
struct Shared {
    provider: Box<dyn BoxedProvider>,
    current: watch::Sender<Option<Fetched>>,
    /// One fetch at a time: connections made together share it.
    fetching: Mutex<()>,
    /// Whether the refresher runs.
    refreshing: std::sync::atomic::AtomicBool,
    failures: AtomicU64,
    last_log: std::sync::Mutex<Option<Instant>>,
}

/// Rotating credentials for the connections one backend makes (cheap to clone).
#[derive(Clone)]
pub(crate) struct Rotation(Arc<Shared>);

impl fmt::Debug for Rotation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rotation").finish_non_exhaustive()
    }
}

impl Rotation {
    pub(crate) fn new(provider: Box<dyn BoxedProvider>) -> Self {
        Self(Arc::new(Shared {
            provider,
            current: watch::Sender::new(None),
            fetching: Mutex::new(()),
            refreshing: std::sync::atomic::AtomicBool::new(false),
            failures: AtomicU64::new(0),
            last_log: std::sync::Mutex::new(None),
        }))
    }
}

impl Shared {
    /// Credentials for a new connection: the current ones while fresh, else new ones
    /// from the provider.
    async fn fresh(&self) -> Result<Fetched, BoxError> {
        if let Some(current) = self.current.borrow().clone().filter(Fetched::is_fresh) {
            return Ok(current);
        }
        let _one = self.fetching.lock().await;
        if let Some(current) = self.current.borrow().clone().filter(Fetched::is_fresh) {
            return Ok(current);
        }
        self.fetch().await
    }

    /// Asks the provider and publishes what it answers to every connection.
    async fn fetch(&self) -> Result<Fetched, BoxError> {
        match self.provider.credentials().await {
            Ok(credentials) => {
                let fetched = Fetched::new(credentials);
                self.failures.store(0, Ordering::Relaxed);
                self.current.send_replace(Some(fetched.clone()));
                Ok(fetched)
            }
            Err(error) => {
                self.failed(&error);
                Err(error)
            }
        }
    }

    /// Logs a provider failure, at most once per [`LOG_EVERY`] with the count since.
    fn failed(&self, error: &BoxError) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last_log.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|at| at.elapsed() < LOG_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        tracing::warn!(
            failures,
            "the Redis credentials provider failed ({failures} time(s) in a row; at most one \
             line per 10 s): kept connections stay on their credentials, new connections \
             fail and the failure policy answers until it succeeds: {error}"
        );
    }
}

/// Renews the credentials at their renewal time, for as long as the backend lives.
async fn refresh(shared: Weak<Shared>) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let Some(renew_at) = shared.upgrade().and_then(|shared| {
            let current = shared.current.borrow();
            current.as_ref().map(|current| current.renew_at)
        }) else {
            return;
        };
        // Credentials without expiry are never renewed.
        let Some(renew_at) = renew_at else { return };
        tokio::time::sleep_until(renew_at).await;
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let fetched = {
            let _one = strong.fetching.lock().await;
            if strong
                .current
                .borrow()
                .as_ref()
                .is_some_and(Fetched::is_fresh)
            {
                Ok(())
            } else {
                strong.fetch().await.map(drop)
            }
        };
        drop(strong);
        match fetched {
            Ok(()) => backoff = MIN_BACKOFF,
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

fn auth_error(error: &BoxError) -> RedisError {
    RedisError::from((
        ErrorKind::AuthenticationFailed,
        "the credentials provider failed",
        error.to_string(),
    ))
}

impl redis::StreamingCredentialsProvider for Rotation {
    /// The credentials for a new connection first (fetched if the current ones are due
    /// for renewal), then every renewal.
    fn subscribe(
        &self,
    ) -> Pin<Box<dyn Stream<Item = redis::RedisResult<redis::BasicAuth>> + Send + 'static>> {
        let shared = Arc::clone(&self.0);
        if !shared.refreshing.swap(true, Ordering::AcqRel) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(refresh(Arc::downgrade(&shared)));
            } else {
                shared.refreshing.store(false, Ordering::Release);
            }
        }
        let changes = shared.current.subscribe();
        Box::pin(stream::unfold(
            (shared, changes, true),
            |(shared, mut changes, first)| async move {
                if first {
                    let item = match shared.fresh().await {
                        Ok(fetched) => Ok(fetched.auth),
                        Err(error) => Err(auth_error(&error)),
                    };
                    changes.mark_unchanged();
                    return Some((item, (shared, changes, false)));
                }
                loop {
                    changes.changed().await.ok()?;
                    let next = changes.borrow_and_update().clone();
                    if let Some(fetched) = next {
                        return Some((Ok(fetched.auth), (shared, changes, false)));
                    }
                }
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use redis::StreamingCredentialsProvider as _;
    use std::sync::atomic::AtomicU32;

    fn counting(lifetime: Option<Duration>) -> (Rotation, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&calls);
        let rotation = Rotation::new(Box::new(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let credentials = Credentials::new("app", format!("token-{n}"));
                Ok::<_, std::io::Error>(match lifetime {
                    Some(lifetime) => credentials.expires_in(lifetime),
                    None => credentials,
                })
            }
        }));
        (rotation, calls)
    }

    #[test]
    fn passwords_never_show_in_debug() {
        let shown = format!("{:?}", Credentials::new("app", "hunter2"));
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[tokio::test]
    async fn connections_made_together_share_one_fetch() {
        let (rotation, calls) = counting(Some(Duration::from_secs(60)));
        let mut a = rotation.subscribe();
        let mut b = rotation.subscribe();
        let first = a.next().await.unwrap().unwrap();
        let second = b.next().await.unwrap().unwrap();
        assert_eq!(first.password(), "token-1");
        assert_eq!(second.password(), "token-1");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_are_renewed_before_they_expire_and_every_connection_hears_of_it() {
        let (rotation, calls) = counting(Some(Duration::from_secs(100)));
        let mut a = rotation.subscribe();
        let mut b = rotation.subscribe();
        assert_eq!(a.next().await.unwrap().unwrap().password(), "token-1");
        assert_eq!(b.next().await.unwrap().unwrap().password(), "token-1");
        // Renewed at three quarters of the lifetime (the paused clock jumps there).
        let renewed = a.next().await.unwrap().unwrap();
        assert_eq!(renewed.password(), "token-2");
        assert_eq!(b.next().await.unwrap().unwrap().password(), "token-2");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn credentials_without_expiry_are_asked_once() {
        let (rotation, calls) = counting(None);
        let mut a = rotation.subscribe();
        assert_eq!(a.next().await.unwrap().unwrap().password(), "token-1");
        let mut b = rotation.subscribe();
        assert_eq!(b.next().await.unwrap().unwrap().password(), "token-1");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failing_provider_fails_the_new_connection() {
        let rotation = Rotation::new(Box::new(|| async {
            Err::<Credentials, _>(std::io::Error::other("the token service is down"))
        }));
        let error = rotation.subscribe().next().await.unwrap().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::AuthenticationFailed);
        assert!(
            error.to_string().contains("token service is down"),
            "{error}"
        );
    }
}
