//! A made connection and the engine's scripts run on it: by SHA (`EVALSHA`, the script
//! loaded again when the server lost it) or as Redis Functions (`FCALL`, the library
//! loaded again likewise), and what the server's answers say about its Functions.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

use deadpool_redis::redis::{self, ErrorKind, Script, ServerErrorKind};

use super::call::Call;
use super::fault::{Fault, ScriptError};
use super::script::Library;
use super::script::ReadReply;

/// A multiplexed connection (single node or cluster); cloning it is cheap.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(redis::aio::MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

/// How many times one call reloads a script or library the server lost before it
/// gives up (each reload is a round trip, all within the call's deadline).
const RELOADS: usize = 3;

/// The server does not have the script (`NOSCRIPT`).
fn no_script(error: &redis::RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

impl Conn {
    /// Runs a script call by SHA, loading the script on `NOSCRIPT` and calling again; an
    /// `FCALL`, loading the library when the server does not have it and calling again.
    /// An `FCALL` goes by `EVALSHA` instead where `functions` says the server has no
    /// Redis Functions (learned when the connection was made, before any check was
    /// sent), or when the server refuses it (`FCALL` renamed away or denied while
    /// `FUNCTION` is not: the backend then stops sending `FCALL`). A server that lost
    /// the script or the library (a flush, a failover to a server without them) gets it
    /// again and the call again, up to [`RELOADS`] times, so that a flush landing
    /// between a reload and the call again is ridden out too.
    pub(crate) async fn script(
        &mut self,
        call: &Call,
        functions: &Functions,
    ) -> Result<Vec<i64>, redis::RedisError> {
        if call.library.is_some() && !functions.fcall() {
            return self.evalsha(&call.as_evalsha(), call).await;
        }
        let mut reloads = 0;
        loop {
            match self.query(&call.cmd, call.read).await {
                Err(error) if reloads < RELOADS && no_script(&error) => {
                    self.load(call.script).await?;
                }
                Err(error)
                    if reloads < RELOADS && call.library.is_some() && function_missing(&error) =>
                {
                    if let Some(library) = call.library {
                        self.load_library(library).await?;
                    }
                }
                Err(error) if call.library.is_some() && fcall_refused(&error) => {
                    // (Not the error: an unknown command's repeats the call's keys.)
                    functions.off(&"the server refuses FCALL though it loaded the library");
                    return self.evalsha(&call.as_evalsha(), call).await;
                }
                result => return result,
            }
            reloads += 1;
        }
    }

    /// `cmd`, the `EVALSHA` of `call`, loading its script on `NOSCRIPT` and calling again.
    async fn evalsha(
        &mut self,
        cmd: &redis::Cmd,
        call: &Call,
    ) -> Result<Vec<i64>, redis::RedisError> {
        let mut reloads = 0;
        loop {
            match self.query(cmd, call.read).await {
                Err(error) if reloads < RELOADS && no_script(&error) => {
                    self.load(call.script).await?;
                }
                result => return result,
            }
            reloads += 1;
        }
    }

    /// Readies a new connection: `FUNCTION LOAD` of `library` (when given) and `SCRIPT
    /// LOAD` of each of `scripts`, sent together (the multiplexed connection pipelines
    /// them: one round trip). The library's answer, and the first script's error.
    pub(crate) async fn prepare(
        &self,
        library: Option<&Library>,
        scripts: &[&Script],
    ) -> (
        Option<Result<(), redis::RedisError>>,
        Result<(), redis::RedisError>,
    ) {
        let library = async {
            match library {
                Some(library) => Some(self.clone().load_library(library).await),
                None => None,
            }
        };
        let scripts = futures_util::future::join_all(scripts.iter().map(|script| {
            let mut conn = self.clone();
            async move { conn.load(script).await.map(drop) }
        }));
        let (library, scripts) = futures_util::future::join(library, scripts).await;
        (library, scripts.into_iter().collect())
    }

    /// `FUNCTION LOAD REPLACE` of `library`.
    pub(crate) async fn load_library(
        &mut self,
        library: &Library,
    ) -> Result<(), redis::RedisError> {
        let mut cmd = redis::cmd("FUNCTION");
        // `REPLACE`: a library of that name (another instance loaded it: the name carries
        // the text's hash) is the same library, replaced by itself rather than refused
        // with an error that monitoring would count.
        cmd.arg("LOAD").arg("REPLACE").arg(&library.text);
        let result: Result<redis::Value, _> = match self {
            Self::Single(conn) => cmd.query_async(conn).await,
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => cmd.query_async(conn).await,
        };
        result.map(drop)
    }

    /// Sends `pipe` (plain commands) and returns each command's reply.
    pub(crate) async fn pipeline(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<redis::Value>, redis::RedisError> {
        match self {
            Self::Single(conn) => pipe.query_async(conn).await,
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => pipe.query_async(conn).await,
        }
    }

    async fn query(
        &mut self,
        cmd: &redis::Cmd,
        read: ReadReply,
    ) -> Result<Vec<i64>, redis::RedisError> {
        let value: redis::Value = match self {
            Self::Single(conn) => cmd.query_async(conn).await?,
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => cmd.query_async(conn).await?,
        };
        read(value)
    }

    /// `SCRIPT LOAD`.
    pub(crate) async fn load(&mut self, script: &Script) -> Result<String, redis::RedisError> {
        match self {
            Self::Single(conn) => script.load_async(conn).await,
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => script.load_async(conn).await,
        }
    }
}

/// The server has no such function: the library is not loaded there (a new server, a
/// `FUNCTION FLUSH`).
fn function_missing(error: &redis::RedisError) -> bool {
    error.to_string().contains("Function not found")
}

/// The server does not know the command (`FCALL`, `FUNCTION` before Redis 7).
fn unknown_command(error: &redis::RedisError) -> bool {
    error.to_string().contains("unknown command")
}

/// The server refuses `FCALL` itself: it does not know it (renamed away), or this user
/// may not run it (`NOPERM … 'fcall' command`, not a key's `NOPERM`).
fn fcall_refused(error: &redis::RedisError) -> bool {
    unknown_command(error)
        || (error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
            && error.to_string().to_ascii_lowercase().contains("'fcall"))
}

/// Whether a server that answered `FUNCTION LOAD` with `error` has no Redis Functions
/// the engine can use: it does not know the command (Redis before 7, or `FUNCTION`
/// renamed away), this user may not run it (ACL), or it refused the library. Not when
/// the way to it failed or it cannot serve anyone right now (loading, out of memory, a
/// read-only replica, busy): that says nothing about its Functions.
pub(crate) fn lacks_functions(error: &redis::RedisError) -> bool {
    unknown_command(error)
        || error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || refused_library(error)
}

/// Whether a server that has Redis Functions refused the engine's library itself
/// (`ERR Error registering functions: …`): the library's text, not the server, is at
/// fault (`tests/dialect.rs` loads every library on each server of the matrix), so it is
/// worth a warning where a server without Functions is not.
pub(crate) fn refused_library(error: &redis::RedisError) -> bool {
    !unknown_command(error)
        && error.kind() != ErrorKind::Server(ServerErrorKind::NoPerm)
        && ScriptError::Redis(error.clone()).fault() == Fault::Key
}

/// Whether the engine runs as Redis Functions (`FCALL`) on the server, as far as the
/// backend knows: not known until a connection has asked the server (`FUNCTION LOAD`
/// when it is made), then on or off; always off when the builder turned them off.
#[derive(Debug)]
pub(crate) struct Functions(AtomicU8);

/// [`Functions`]: not known yet.
const FUNCTIONS_UNKNOWN: u8 = 0;
/// [`Functions`]: the engine runs as Redis Functions.
const FUNCTIONS_ON: u8 = 1;
/// [`Functions`]: the engine runs by `EVALSHA`.
const FUNCTIONS_OFF: u8 = 2;

impl Functions {
    /// Not known yet when `enabled`, else off.
    pub(crate) fn new(enabled: bool) -> Self {
        Self(AtomicU8::new(if enabled {
            FUNCTIONS_UNKNOWN
        } else {
            FUNCTIONS_OFF
        }))
    }

    /// Whether the server is known to have Functions (the engine's library loaded).
    pub(crate) fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed) == FUNCTIONS_ON
    }

    /// Whether engine calls go by `FCALL`: unless the server is known to have no
    /// Functions (or the builder turned them off).
    pub(crate) fn fcall(&self) -> bool {
        self.0.load(Ordering::Relaxed) != FUNCTIONS_OFF
    }

    /// The engine's library was loaded: the server has Functions (unless found
    /// otherwise meanwhile).
    pub(crate) fn on(&self) {
        let _ = self.0.compare_exchange(
            FUNCTIONS_UNKNOWN,
            FUNCTIONS_ON,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// The server has no Functions the engine can use (`reason` says why; never an
    /// error that repeats a call's keys): every engine call goes by `EVALSHA` from now
    /// on.
    pub(crate) fn off(&self, reason: &dyn fmt::Display) {
        if self.0.swap(FUNCTIONS_OFF, Ordering::Relaxed) != FUNCTIONS_OFF {
            tracing::info!(%reason, "redis without functions: the engine runs by EVALSHA");
        }
    }
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
