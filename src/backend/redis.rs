//! The Redis side of a backend: scripts run by SHA under a deadline, and the health
//! state with its single background probe.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use deadpool_redis::redis::{self, Cmd, ScriptInvocation};
use deadpool_redis::PoolError;

/// A single-node or cluster pool.
#[derive(Clone)]
pub(crate) enum RedisPool {
    Single(deadpool_redis::Pool),
    #[cfg(feature = "cluster")]
    Cluster(deadpool_redis::cluster::Pool),
}

impl fmt::Debug for RedisPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Self::Single(_) => "single",
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisPool")
            .field("kind", &kind)
            .field("status", &self.status())
            .finish()
    }
}

impl RedisPool {
    fn status(&self) -> deadpool_redis::Status {
        match self {
            Self::Single(pool) => pool.status(),
            #[cfg(feature = "cluster")]
            Self::Cluster(pool) => pool.status(),
        }
    }

    /// A multiplexed connection from the pool, detached from it: clones share one
    /// socket and pipeline requests, so one of them serves every concurrent check.
    async fn connection(&self) -> Result<Conn, PoolError> {
        Ok(match self {
            Self::Single(pool) => Conn::Single((*pool.get().await?).clone()),
            #[cfg(feature = "cluster")]
            Self::Cluster(pool) => Conn::Cluster((*pool.get().await?).clone()),
        })
    }

    async fn command(&self, cmd: &Cmd) -> Result<(), ScriptError> {
        match self {
            Self::Single(pool) => {
                let mut conn = pool.get().await?;
                Ok(cmd.query_async::<()>(&mut conn).await?)
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(pool) => {
                let mut conn = pool.get().await?;
                Ok(cmd.query_async::<()>(&mut conn).await?)
            }
        }
    }
}

/// A multiplexed connection (single node or cluster); cloning it is cheap.
#[derive(Clone)]
enum Conn {
    Single(redis::aio::MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    async fn script(
        &mut self,
        invocation: &ScriptInvocation<'static>,
    ) -> Result<Vec<i64>, redis::RedisError> {
        match self {
            Self::Single(conn) => invocation.invoke_async(conn).await,
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => invocation.invoke_async(conn).await,
        }
    }
}

/// Why a Redis check could not be answered by Redis.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScriptError {
    #[error("redis pool: {0}")]
    Pool(#[from] PoolError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("unexpected script reply: {0:?}")]
    Reply(Vec<i64>),
}

impl ScriptError {
    /// Whether the connection the check ran on may be unusable now.
    fn breaks_connection(&self) -> bool {
        match self {
            Self::Redis(error) => breaks_connection(error),
            Self::Timeout(_) => true,
            Self::Pool(_) | Self::Reply(_) => false,
        }
    }

    /// The `kind` label of the error in metrics.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Pool(_) => "pool",
            Self::Redis(_) => "redis",
            Self::Timeout(_) => "timeout",
            Self::Reply(_) => "reply",
        }
    }
}

/// Whether a connection that returned `error` may be unusable now.
fn breaks_connection(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
}

pub(crate) struct RedisBackend {
    pool: RedisPool,
    /// The connection checks run on, taken from the pool once and kept until it fails:
    /// checking a connection out per check would cost deadpool's `PING` round trip.
    conn: ArcSwapOption<Conn>,
    /// The backend's key prefix, naming it in metrics.
    prefix: String,
    call_timeout: Duration,
    probe_interval: Duration,
    healthy: AtomicBool,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redis")
            .field("pool", &self.pool)
            .field("call_timeout", &self.call_timeout)
            .field("probe_interval", &self.probe_interval)
            .field("healthy", &self.is_healthy())
            .finish()
    }
}

impl RedisBackend {
    pub(crate) fn new(
        pool: RedisPool,
        prefix: String,
        call_timeout: Duration,
        probe_interval: Duration,
    ) -> Self {
        Self {
            pool,
            conn: ArcSwapOption::empty(),
            prefix,
            call_timeout,
            probe_interval,
            healthy: AtomicBool::new(true),
        }
    }

    pub(crate) fn probe_interval(&self) -> Duration {
        self.probe_interval
    }

    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Runs a script by SHA (loading it on `NOSCRIPT`), pool wait included in the deadline.
    pub(crate) async fn eval(
        &self,
        invocation: &ScriptInvocation<'static>,
    ) -> Result<Vec<i64>, ScriptError> {
        let call = async {
            let kept = self.conn.load_full();
            if let Some(conn) = &kept {
                match Conn::clone(conn).script(invocation).await {
                    Ok(reply) => return Ok(reply),
                    // The kept connection died while Redis may be fine (a restart, an
                    // idle timeout on the way): forget it, unless another check already
                    // replaced it, and try once more on a new one within the deadline.
                    Err(error) if breaks_connection(&error) => {
                        self.conn.compare_and_swap(&kept, None);
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            let mut conn = self.pool.connection().await?;
            self.conn.store(Some(Arc::new(conn.clone())));
            Ok(conn.script(invocation).await?)
        };
        let result = match tokio::time::timeout(self.call_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(ScriptError::Timeout(self.call_timeout)),
        };
        if let Err(error) = &result {
            if error.breaks_connection() {
                // The next check takes a fresh connection from the pool.
                self.conn.store(None);
            }
        }
        result
    }

    /// Switches every limiter of this backend to its fallback and starts the one probe
    /// that switches them back. Only the first failure of an outage logs and probes.
    pub(crate) fn mark_unhealthy(self: &Arc<Self>, error: &ScriptError) {
        if !self.healthy.swap(false, Ordering::AcqRel) {
            return;
        }
        // Whatever connection was cached, the next check after recovery takes a new one.
        self.conn.store(None);
        tracing::warn!(%error, "redis unreachable: answering from the in-process fallback");
        crate::metrics::fallback_active(&self.prefix, true);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(probe(Arc::downgrade(self), self.probe_interval));
            }
            // No runtime to probe from: try Redis again on the next check.
            Err(_) => self.healthy.store(true, Ordering::Release),
        }
    }

    async fn ping(&self) -> Result<(), ScriptError> {
        let ping = redis::cmd("PING");
        match tokio::time::timeout(self.call_timeout, self.pool.command(&ping)).await {
            Ok(result) => result,
            Err(_) => Err(ScriptError::Timeout(self.call_timeout)),
        }
    }
}

/// Pings Redis every `interval` until it answers or the backend is dropped.
async fn probe(backend: Weak<RedisBackend>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(backend) = backend.upgrade() else {
            return;
        };
        match backend.ping().await {
            Ok(()) => {
                backend.healthy.store(true, Ordering::Release);
                crate::metrics::fallback_active(&backend.prefix, false);
                tracing::info!("redis reachable again: limits are back in redis");
                return;
            }
            Err(error) => tracing::debug!(%error, "redis health probe failed"),
        }
    }
}
