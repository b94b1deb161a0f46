//! The change channel: the engine announces each reset and block of a key (unblocks
//! are resets) on `<prefix>:changes` (a `PUBLISH` in the same script call, so the
//! message leaves Redis with the change itself), and every Redis backend keeps one
//! connection subscribed to it, made by the same [`Connector`](super::connect::Connector)
//! as the check connection (TLS, credentials and their rotation, Sentinel, a cluster
//! node), in RESP3. What a message means to the deciding code (its deny cache, its
//! leases) is [`Backend`](crate::Backend)'s to say: it hands the connection one
//! callback, an [`OnChange`], as it hands it the engine's scripts.
//!
//! The subscription is made in the background after the backend's first check
//! connection, answers a `PING` every [`PING_INTERVAL`] (a connection that stops
//! answering is dropped), and is made again with a backoff
//! ([`FIRST_BACKOFF`] doubling to [`MAX_BACKOFF`]) when it fails; each time it is made
//! again the backend hears [`Change::Resumed`], since changes made meanwhile were not
//! heard. Until it is first made, and while it is down, the deny cache's max age bounds how long a change takes to
//! reach this instance, as without it. No check waits for it or touches it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection, PushInfo, PushKind, Value};
use futures_util::future::{self, Either};
use tokio::sync::mpsc;

use super::connect::Connector;

/// What the subscription heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change<'a> {
    /// The limit whose (first) Redis key this is was reset or blocked, here or on
    /// another instance.
    Key(&'a [u8]),
    /// The subscription was made again after it was lost: changes made meanwhile were
    /// not heard.
    Resumed,
}

/// What a backend does with what its subscription hears (given by [`Backend`](crate::Backend)).
pub(crate) type OnChange = Box<dyn Fn(Change<'_>) + Send + Sync>;

/// How often the subscribed connection is asked for a `PING`.
pub(crate) const PING_INTERVAL: Duration = Duration::from_secs(1);
/// The wait before the subscription is made again after its first failure.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A backend's change channel; its subscription runs until this is dropped (with the
/// backend).
pub(crate) struct Changes(Arc<Shared>);

/// What the subscription needs of its backend.
struct Shared {
    /// `<prefix>:changes`.
    channel: String,
    on_change: OnChange,
    /// The backend's connector, and how long a connection attempt may take.
    connector: Connector,
    connect_timeout: Duration,
    started: AtomicBool,
}

impl Changes {
    /// The channel of the keys under `prefix` (`<prefix>:changes`, the name the engine
    /// reads from each key), subscribed to with `connector`'s connections.
    pub(crate) fn new(
        prefix: &str,
        connector: Connector,
        connect_timeout: Duration,
        on_change: OnChange,
    ) -> Self {
        Self(Arc::new(Shared {
            channel: format!("{prefix}:changes"),
            on_change,
            connector,
            connect_timeout,
            started: AtomicBool::new(false),
        }))
    }

    /// Starts the subscription in the background, once (called when a check connection
    /// was made: never on a check's way).
    pub(crate) fn start(&self) {
        if self.0.started.swap(true, Ordering::Relaxed) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(subscription(Arc::downgrade(&self.0)));
            }
            Err(_) => self.0.started.store(false, Ordering::Relaxed),
        }
    }
}

/// The subscription until its backend is dropped: made, listened to, made again with a
/// backoff.
async fn subscription(backend: Weak<Shared>) {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 0_usize;
    // Whether the subscription is known down (said once per outage, at `info`).
    let mut down = false;
    // Whether a subscription was made before: only one made again missed changes that
    // the deny cache may hold (before the first one, the deny cache's max age bounds
    // them, as it does while the subscription is down; clearing then would drop the
    // refusals of a backend's first checks, at a time that depends on the connection).
    let mut made_before = false;
    loop {
        let (sender, mut messages) = mpsc::unbounded_channel();
        let made = {
            let Some(this) = backend.upgrade() else {
                return;
            };
            let timeout = this.connect_timeout;
            let subscribe = this
                .connector
                .subscribe(&this.channel, timeout, sender, attempt);
            match tokio::time::timeout(timeout, subscribe).await {
                Ok(made) => made,
                Err(_) => Err(redis::RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::TimedOut,
                ))),
            }
        };
        match made {
            // A user's pool: no way to make a connection of our own (see the guide).
            Ok(None) => return,
            Ok(Some(mut conn)) => {
                if down {
                    tracing::info!("the change subscription is back");
                    down = false;
                }
                backoff = FIRST_BACKOFF;
                match backend.upgrade() {
                    Some(this) if made_before => (this.on_change)(Change::Resumed),
                    Some(_) => {}
                    None => return,
                }
                made_before = true;
                listen(&backend, &mut conn, &mut messages).await;
                if backend.strong_count() == 0 {
                    return;
                }
                tracing::debug!("the change subscription was lost; making it again");
            }
            Err(error) => {
                if down {
                    tracing::debug!(%error, "the change subscription failed again");
                } else {
                    tracing::info!(
                        %error,
                        "the change subscription failed: changes made on other instances \
                         reach this one within the deny cache's max age until it is back"
                    );
                    down = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
            }
        }
        attempt = attempt.wrapping_add(1);
    }
}

/// Hands each message to the backend until the connection is lost (or stops answering
/// its `PING`) or the backend is dropped.
async fn listen(
    backend: &Weak<Shared>,
    conn: &mut MultiplexedConnection,
    messages: &mut mpsc::UnboundedReceiver<PushInfo>,
) {
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // (The first tick is at once: the subscription was just answered.)
    ping.tick().await;
    loop {
        let message = std::pin::pin!(messages.recv());
        let tick = std::pin::pin!(ping.tick());
        match future::select(message, tick).await {
            Either::Left((message, _)) => {
                let Some(message) = message else {
                    return;
                };
                match message.kind {
                    PushKind::Message => {
                        let Some(this) = backend.upgrade() else {
                            return;
                        };
                        // `[channel, payload]`: the payload is the changed key.
                        if let Some(Value::BulkString(key)) = message.data.last() {
                            (this.on_change)(Change::Key(key));
                        }
                    }
                    PushKind::Disconnection => return,
                    _ => {}
                }
            }
            Either::Right(_) => {
                let Some(this) = backend.upgrade() else {
                    return;
                };
                let deadline = this.connect_timeout;
                drop(this);
                let ping = redis::cmd("PING");
                let pong = ping.query_async::<Value>(conn);
                if !matches!(tokio::time::timeout(deadline, pong).await, Ok(Ok(_))) {
                    return;
                }
            }
        }
    }
}
