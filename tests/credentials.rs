//! Rotating credentials: a real `redis-server` whose ACL users and passwords the test
//! changes while a backend with a credentials provider keeps deciding.

mod support;

use std::io::Write;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::RedisServer;
use tokio::time::Instant;
use tower_redis_ratelimit::Credentials;
use tower_redis_ratelimit::{Backend, ConfigError, Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
/// Tokens live this long: renewed every 600 ms.
const LIFETIME: Duration = Duration::from_millis(800);

/// The credentials the provider hands out, which the test changes, and how often it was
/// asked.
#[derive(Clone)]
struct Issuer {
    current: Arc<Mutex<Result<(String, String), String>>>,
    calls: Arc<AtomicU32>,
}

impl Issuer {
    fn new(user: &str, password: &str) -> Self {
        Self {
            current: Arc::new(Mutex::new(Ok((user.to_owned(), password.to_owned())))),
            calls: Arc::new(AtomicU32::new(0)),
        }
    }

    fn set(&self, credentials: Result<(&str, &str), &str>) {
        *self.current.lock().unwrap() = credentials
            .map(|(user, password)| (user.to_owned(), password.to_owned()))
            .map_err(str::to_owned);
    }

    fn backend(&self, redis: &RedisServer) -> Backend {
        let issuer = self.clone();
        support::backend_builder()
            .redis_url(redis.url())
            .deny_cache(0)
            // Generous: the test counts failed decisions, which a loaded machine's slow
            // round trip must not make.
            .call_timeout(Duration::from_secs(2))
            .probe_interval(Duration::from_millis(50))
            .recovery(Duration::from_millis(50))
            .credentials(move || {
                issuer.calls.fetch_add(1, Ordering::SeqCst);
                let current = issuer.current.lock().unwrap().clone();
                async move {
                    let (user, password) = current.map_err(std::io::Error::other)?;
                    Ok::<_, std::io::Error>(Credentials::new(user, password).expires_in(LIFETIME))
                }
            })
            .build()
            .unwrap()
    }
}

fn add_user(redis: &RedisServer, user: &str, password: &str) {
    let reply = redis.cmd(&[
        "ACL",
        "SETUSER",
        user,
        "on",
        &format!(">{password}"),
        "~*",
        "&*",
        "+@all",
    ]);
    assert_eq!(reply, "OK", "ACL SETUSER {user}: {reply}");
}

/// The ids of the server's clients authenticated as `user`, but for the backends'
/// change subscriptions (which authenticate alike).
fn clients_of(redis: &RedisServer, user: &str) -> Vec<String> {
    let needle = format!(" user={user} ");
    redis
        .cmd(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| line.contains(&needle) && !line.contains(" sub=1 "))
        .filter_map(|line| {
            line.split(' ')
                .next()?
                .strip_prefix("id=")
                .map(str::to_owned)
        })
        .collect()
}

/// Checks `limiter` every 2 ms until stopped; counts decisions and those not from Redis.
struct Traffic {
    stop: Arc<AtomicBool>,
    decisions: Arc<AtomicU64>,
    not_redis: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(limiter: PeriodLimiter) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let decisions = Arc::new(AtomicU64::new(0));
        let not_redis = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (stop, decisions, not_redis) = (stop.clone(), decisions.clone(), not_redis.clone());
            async move {
                while !stop.load(Ordering::SeqCst) {
                    let decision = limiter.check(b"tenant", ONE).await;
                    decisions.fetch_add(1, Ordering::SeqCst);
                    if decision.source != Source::Redis {
                        not_redis.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        });
        Self {
            stop,
            decisions,
            not_redis,
            task,
        }
    }

    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        (
            self.decisions.load(Ordering::SeqCst),
            self.not_redis.load(Ordering::SeqCst),
        )
    }
}

async fn until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn limiter(backend: &Backend) -> PeriodLimiter {
    PeriodLimiter::new(
        backend,
        "api",
        PeriodConfig::new(1_000_000, Duration::from_secs(60)),
    )
    .unwrap()
}

#[tokio::test]
async fn the_kept_connection_reauthenticates_before_expiry_and_no_decision_fails() {
    let redis = RedisServer::start();
    add_user(&redis, "app-blue", "blue-secret-1");
    let issuer = Issuer::new("app-blue", "blue-secret-1");
    let backend = issuer.backend(&redis);
    let limiter = limiter(&backend);
    assert_eq!(limiter.check(b"tenant", ONE).await.source, Source::Redis);
    support::subscribed_clients(&redis, 1).await;
    let kept = clients_of(&redis, "app-blue");
    assert_eq!(kept.len(), 1, "one kept connection as app-blue: {kept:?}");
    let traffic = Traffic::start(limiter.clone());

    // Rotate to another user (another password): within one renewal the kept
    // connection (the same client id) is authenticated as the new user.
    add_user(&redis, "app-green", "green-secret-2");
    issuer.set(Ok(("app-green", "green-secret-2")));
    until(
        "the kept connection re-authenticates",
        Duration::from_secs(5),
        || clients_of(&redis, "app-green") == kept,
    )
    .await;
    // The old user goes: Redis closes its connections (none left).
    assert_eq!(redis.cmd(&["ACL", "DELUSER", "app-blue"]), "1");
    // A password rotation of the same user, as IAM tokens do it.
    let reply = redis.cmd(&[
        "ACL",
        "SETUSER",
        "app-green",
        "resetpass",
        ">green-secret-3",
    ]);
    assert_eq!(reply, "OK");
    issuer.set(Ok(("app-green", "green-secret-3")));
    let auths = redis.command_calls("auth");
    until("the new password is used", Duration::from_secs(5), || {
        redis.command_calls("auth") > auths
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (decisions, not_redis) = traffic.stop().await;
    assert!(decisions > 50, "{decisions} decisions");
    assert_eq!(
        not_redis, 0,
        "{not_redis} of {decisions} decisions not from Redis"
    );
    assert_eq!(
        clients_of(&redis, "app-green"),
        kept,
        "still the same connection"
    );
    assert!(issuer.calls.load(Ordering::SeqCst) >= 3);
}

#[tokio::test]
async fn a_new_connection_authenticates_with_the_current_credentials() {
    let redis = RedisServer::start();
    add_user(&redis, "app-blue", "blue-secret-1");
    let issuer = Issuer::new("app-blue", "blue-secret-1");
    let backend = issuer.backend(&redis);
    let limiter = limiter(&backend);
    assert_eq!(limiter.check(b"tenant", ONE).await.source, Source::Redis);

    add_user(&redis, "app-green", "green-secret-2");
    issuer.set(Ok(("app-green", "green-secret-2")));
    until(
        "the kept connection re-authenticates",
        Duration::from_secs(5),
        || !clients_of(&redis, "app-green").is_empty(),
    )
    .await;
    // Every connection goes; the backend's next one must log in as app-green.
    redis.cmd(&["CLIENT", "KILL", "USER", "app-green"]);
    redis.cmd(&["ACL", "DELUSER", "app-blue"]);
    let start = Instant::now();
    while limiter.check(b"tenant", ONE).await.source != Source::Redis {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no decision from Redis"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(support::subscribed_clients(&redis, 1).await, 1);
    assert_eq!(clients_of(&redis, "app-green").len(), 1);
    // The change subscription was made again with the current credentials too.
    let clients = redis.cmd(&["CLIENT", "LIST"]);
    let subscribed = clients.lines().find(|line| line.contains(" sub=1 "));
    assert!(
        subscribed.is_some_and(|line| line.contains(" user=app-green ")),
        "{clients}"
    );
}

/// A tracing writer that keeps what is logged.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test]
async fn a_failing_provider_follows_the_failure_policy_and_logs_once() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::WARN)
        .finish();
    // The runtime of this test has one thread: every task logs through this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);

    let redis = RedisServer::start();
    add_user(&redis, "app-blue", "blue-secret-1");
    let issuer = Issuer::new("app-blue", "blue-secret-1");
    issuer.set(Err("the token service is down"));
    let backend = issuer.backend(&redis);
    let limiter = limiter(&backend);
    // Every new connection fails: the fallback answers (the default policy).
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let decision = limiter.check(b"tenant", ONE).await;
        assert_eq!(decision.source, Source::Fallback);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = issuer.calls.load(Ordering::SeqCst);
    assert!(asked >= 3, "the provider was asked {asked} times");
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines = logged
        .lines()
        .filter(|line| line.contains("backend::redis::credentials"))
        .count();
    assert_eq!(lines, 1, "one line per ten seconds:\n{logged}");
    assert!(logged.contains("the token service is down"), "{logged}");
    assert!(!logged.contains("blue-secret-1"), "{logged}");

    // The provider recovers: Redis answers again.
    issuer.set(Ok(("app-blue", "blue-secret-1")));
    let start = Instant::now();
    while limiter.check(b"tenant", ONE).await.source != Source::Redis {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "not back in Redis"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn credentials_with_a_pool_are_refused_when_built() {
    let error = support::backend_builder()
        .redis(
            deadpool_redis::Config::from_url("redis://127.0.0.1:1")
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .unwrap(),
        )
        .credentials(|| async { Ok::<_, std::io::Error>(Credentials::new("a", "b")) })
        .build()
        .unwrap_err();
    assert!(matches!(error, ConfigError::Conflict { .. }), "{error}");
    assert!(error.to_string().contains("pool"), "{error}");
}
