//! What a failed Redis call says about Redis: the way to it failed (transport), Redis
//! cannot serve anyone right now (server-wide), or only this key is affected — sorted by
//! the client's error kinds and codes, never by messages.

use std::time::Duration;

use deadpool_redis::redis::{self, ErrorKind, ServerErrorKind};

/// What a failed call says about Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Fault {
    /// The way to Redis failed: refused, reset, timed out, a protocol error, no
    /// connection to be had. Counts toward the breaker.
    Transport,
    /// Redis answered that it cannot serve anyone right now (`OOM`, `READONLY`,
    /// `LOADING`, `BUSY`, `MASTERDOWN`, `CLUSTERDOWN`, a `NOSCRIPT` that a reload did not
    /// cure, a refused login). Counts toward the breaker.
    Server,
    /// Only this key is affected (`WRONGTYPE`, a script error caused by the stored
    /// value, a reply of the wrong shape). Decided by the failure policy for this request
    /// alone; never counts toward the breaker.
    Key,
}

impl Fault {
    /// The `kind` label of the error in metrics.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Self::Transport => "transport",
            Self::Server => "server",
            Self::Key => "key",
        }
    }
}

/// Why a Redis check could not be answered by Redis.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ScriptError {
    #[error("redis pool: {0}")]
    Pool(String),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis could not be connected to: {0}")]
    Connect(Box<ScriptError>),
    #[error("no connection to redis within {0:?}: still connecting")]
    Connecting(Duration),
    #[error(
        "no TLS handshake with redis within {0:?}: does the server speak TLS on this port? \
         (a rediss:// URL to a plaintext port never completes one)"
    )]
    TlsHandshake(Duration),
    #[error("unexpected script reply: {0:?}")]
    Reply(Vec<i64>),
}

impl ScriptError {
    pub(crate) fn from_pool(error: deadpool_redis::PoolError) -> Self {
        match error {
            deadpool_redis::PoolError::Backend(error) => Self::Redis(error),
            other => Self::Pool(other.to_string()),
        }
    }

    /// What this error says about Redis.
    pub(crate) fn fault(&self) -> Fault {
        match self {
            Self::Pool(_) | Self::Timeout(_) | Self::Connecting(_) | Self::TlsHandshake(_) => {
                Fault::Transport
            }
            Self::Connect(error) => match error.fault() {
                // A failed login or a loading server when connecting concerns everyone.
                Fault::Server | Fault::Key => Fault::Server,
                Fault::Transport => Fault::Transport,
            },
            Self::Redis(error) => classify(error),
            Self::Reply(_) => Fault::Key,
        }
    }
}

/// Sorts a Redis error by its kind and code, never by its message.
fn classify(error: &redis::RedisError) -> Fault {
    // A refused login may also close the connection: it concerns everyone.
    if error.kind() == ErrorKind::AuthenticationFailed {
        return Fault::Server;
    }
    if breaks_connection(error) {
        return Fault::Transport;
    }
    match error.kind() {
        ErrorKind::Server(kind) => match kind {
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::NoScript
            | ServerErrorKind::NoPerm
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask => Fault::Server,
            // A script error (`ERR user_script:..`): the script met a stored value it
            // cannot read.
            ServerErrorKind::ResponseError
            | ServerErrorKind::ExecAbort
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::NotBusy
            | ServerErrorKind::NoSub => Fault::Key,
            _ => Fault::Server,
        },
        ErrorKind::Extension => match error.code() {
            Some("WRONGTYPE") => Fault::Key,
            // OOM, BUSY, MISCONF, NOREPLICAS, NOAUTH, WRONGPASS and the codes of servers
            // we do not know: assume they concern everyone.
            _ => Fault::Server,
        },
        ErrorKind::UnexpectedReturnType => Fault::Key,
        ErrorKind::AuthenticationFailed => Fault::Server,
        _ => Fault::Transport,
    }
}

/// Whether a connection that returned `error` may be unusable now.
pub(super) fn breaks_connection(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_by_kind_and_code() {
        // Server replies (`WRONGTYPE`, `OOM`, `READONLY`) are sorted in tests/faults.rs,
        // against a real server.
        let io = ScriptError::Redis(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(io.fault(), Fault::Transport);
        assert_eq!(
            ScriptError::Timeout(Duration::ZERO).fault(),
            Fault::Transport
        );
        assert_eq!(ScriptError::Reply(vec![]).fault(), Fault::Key);
        assert_eq!(
            ScriptError::Connect(Box::new(ScriptError::Timeout(Duration::ZERO))).fault(),
            Fault::Transport
        );
    }
}
