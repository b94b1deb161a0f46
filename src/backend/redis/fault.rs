//! What a failed Redis call says about Redis: the way to it failed (transport), Redis
//! cannot serve anyone right now (server-wide), or only this key is affected — sorted by
//! the client's error kinds and codes, never by messages (a script error's message is
//! read only for the code it wraps: see [`wrapped_code`]); and the log that summarises
//! repeated errors in one line at most every 10 s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
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
    /// A batch's item raised an error in the script (its key holds a value of another
    /// type, or one the script cannot parse): that item's own fault.
    #[error(
        "the script could not read this key's value (a value of another type, written by \
         something else?)"
    )]
    Unreadable,
    /// The server refused something the scripts need (found by the start-up probe):
    /// what, and the remedy.
    #[error("the server refuses {what} ({source}): {remedy}")]
    Refused {
        what: &'static str,
        remedy: &'static str,
        source: Box<ScriptError>,
    },
}

impl ScriptError {
    pub(crate) fn from_pool(error: deadpool_redis::PoolError) -> Self {
        match error {
            deadpool_redis::PoolError::Backend(error) => Self::Redis(error),
            other => Self::Pool(other.to_string()),
        }
    }

    /// The error code of Redis's reply (`CROSSSLOT`, `WRONGTYPE`, …), if Redis replied
    /// with an error.
    pub(crate) fn code(&self) -> Option<&str> {
        match self {
            Self::Redis(error) => error.code(),
            _ => None,
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
            Self::Reply(_) | Self::Unreadable => Fault::Key,
            Self::Refused { .. } => Fault::Server,
        }
    }
}

/// Sorts a Redis error by its kind and code, never by its message (but for the code a
/// script error wraps).
fn classify(error: &redis::RedisError) -> Fault {
    // A refused login may also close the connection: it concerns everyone.
    if error.kind() == ErrorKind::AuthenticationFailed {
        return Fault::Server;
    }
    if breaks_connection(error) {
        return Fault::Transport;
    }
    match error.kind() {
        // Redis before 7 wraps an error raised inside a script in a plain `ERR`: the code
        // it wraps tells (`-READONLY`, `-OOM`: every write fails, not this key's).
        // A command the script sent refused to this user (ACL): every key's call fails.
        ErrorKind::Server(ServerErrorKind::ResponseError)
            if error.detail().is_some_and(refused_in_script) =>
        {
            Fault::Server
        }
        ErrorKind::Server(ServerErrorKind::ResponseError) => {
            match error.detail().and_then(wrapped_code) {
                Some(code) => code_fault(code),
                // A script error (`ERR user_script:..`): the script met a stored value it
                // cannot read.
                None => Fault::Key,
            }
        }
        ErrorKind::Server(_) | ErrorKind::Extension => {
            error.code().map_or(Fault::Server, code_fault)
        }
        ErrorKind::UnexpectedReturnType => Fault::Key,
        ErrorKind::AuthenticationFailed => Fault::Server,
        _ => Fault::Transport,
    }
}

/// Whether a script's error says that the user may not run a command the script sent
/// (ACL), in the words of Redis 7 (`The user executing the script can't run this command
/// or subcommand`), Redis 6.2 (the same, wrapped) or Valkey 8 and later (`ACL failure in
/// script: … no permissions to run the 'time' command`).
pub(crate) fn refused_in_script(detail: &str) -> bool {
    detail.contains("can't run this command") || detail.contains("ACL failure in script")
}

/// What an error code says about Redis.
fn code_fault(code: &str) -> Fault {
    match code {
        // This key's value (`WRONGTYPE`, a script error), or this request alone.
        "WRONGTYPE" | "ERR" | "EXECABORT" | "CROSSSLOT" | "NOTBUSY" | "NOSUB" => Fault::Key,
        // LOADING, READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, NOSCRIPT (a reload did not
        // cure it), NOPERM, MOVED, ASK, OOM, BUSY, MISCONF, NOREPLICAS, NOAUTH, WRONGPASS
        // and the codes of servers we do not know: assume they concern everyone.
        _ => Fault::Server,
    }
}

/// The error code an error raised inside a script wraps, as Redis before 7 reports it:
/// `Error running script (call to f_<sha>): @user_script:1: @user_script: 1: -READONLY
/// You can't write against a read only replica.` (the `ERR` code already taken off): the
/// script's name, then one or more places in the script, then the error reply the server
/// gave the script, with its `-`. `None` for any other error (a Lua error, or an error
/// reply without its `-`, as `WRONGTYPE` comes).
fn wrapped_code(detail: &str) -> Option<&str> {
    let (_, mut rest) = detail
        .strip_prefix("Error running script (call to ")?
        .split_once("): ")?;
    while let Some(after) = strip_place(rest) {
        rest = after;
    }
    let reply = rest.strip_prefix('-')?;
    let code = reply.split(' ').next().unwrap_or(reply);
    (!code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase())).then_some(code)
}

/// `text` without the place in a script it starts with (`@user_script:1: `,
/// `@user_script: 1: `, `user_script:1: `), if it starts with one.
fn strip_place(text: &str) -> Option<&str> {
    let (name, rest) = text.split_once(':')?;
    let name = name.strip_prefix('@').unwrap_or(name);
    let (line, rest) = rest.strip_prefix(' ').unwrap_or(rest).split_once(": ")?;
    let word = |s: &str, ok: fn(u8) -> bool| !s.is_empty() && s.bytes().all(ok);
    (word(name, |b| b.is_ascii_alphanumeric() || b == b'_') && word(line, |b| b.is_ascii_digit()))
        .then_some(rest)
}

/// Whether a connection that returned `error` may be unusable now.
pub(super) fn breaks_connection(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
}

/// How often repeated errors are summarised in the log, at most.
pub(super) const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// Repeated errors, summarised in one `warn` at most every [`SUMMARY_INTERVAL`].
#[derive(Debug, Default)]
pub(super) struct ErrorLog {
    transport: AtomicU64,
    server: AtomicU64,
    key: AtomicU64,
    /// When the last summary was written (ms since the process's first error).
    last_ms: AtomicU64,
}

static LOG_BASE: LazyLock<std::time::Instant> = LazyLock::new(std::time::Instant::now);

impl ErrorLog {
    pub(super) fn error(&self, fault: Fault, error: &ScriptError) {
        let counter = match fault {
            Fault::Transport => &self.transport,
            Fault::Server => &self.server,
            Fault::Key => &self.key,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let now = u64::try_from(LOG_BASE.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_ms.load(Ordering::Relaxed);
        let interval = SUMMARY_INTERVAL.as_millis() as u64;
        if (last != 0 && now.saturating_sub(last) < interval)
            || self
                .last_ms
                .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let (transport, server, key) = (
            self.transport.swap(0, Ordering::Relaxed),
            self.server.swap(0, Ordering::Relaxed),
            self.key.swap(0, Ordering::Relaxed),
        );
        let said = error.to_string();
        if refused_in_script(&said) {
            tracing::warn!(
                transport,
                server,
                key,
                last = %error,
                "redis errors since the last summary: this user may not run a command the \
                 scripts send (ACL); Backend::warm_up() names a refused TIME and its \
                 remedy (TimeSource::Caller)"
            );
            return;
        }
        tracing::warn!(
            transport,
            server,
            key,
            last = %error,
            "redis errors since the last summary"
        );
    }
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

    /// The error a server answers with `line` (without its `-` and `\r\n`).
    fn replied(line: &str) -> ScriptError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        ScriptError::Redis(value.extract_error().unwrap_err())
    }

    #[test]
    fn error_codes_are_sorted_as_sent() {
        for (line, fault) in [
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                Fault::Key,
            ),
            (
                "ERR user_script:1: attempt to compare nil with number",
                Fault::Key,
            ),
            (
                "READONLY You can't write against a read only replica.",
                Fault::Server,
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                Fault::Server,
            ),
            ("BUSY Redis is busy running a script.", Fault::Server),
            ("MASTERDOWN Link with MASTER is down", Fault::Server),
            (
                "LOADING Redis is loading the dataset in memory",
                Fault::Server,
            ),
            ("NOSCRIPT No matching script.", Fault::Server),
            ("SOMETHINGNEW from a server we do not know", Fault::Server),
        ] {
            assert_eq!(replied(line).fault(), fault, "{line}");
        }
    }

    /// Redis 6.2 wraps the error a script's write met in a plain `ERR`: the code inside
    /// it judges (these lines are Redis 6.2.5's own).
    /// A command refused to this user inside a script (ACL), in the words of Redis 7.0,
    /// Redis 6.2 and Valkey 9.1 (each seen from `redis-cli`): every key's call fails alike.
    #[test]
    fn a_command_refused_inside_a_script_concerns_everyone() {
        for line in [
            "ERR The user executing the script can't run this command or subcommand script: \
             104ae65debf45156ded1e8e613705534c8e62c17, on @user_script:1.",
            "ERR Error running script (call to f_104ae65debf45156ded1e8e613705534c8e62c17): \
             @user_script:1: @user_script: 1: The user executing the script can't run this \
             command or subcommand",
            "ERR ACL failure in script: User nt has no permissions to run the 'time' command \
             script: on @user_script:1.",
        ] {
            assert_eq!(replied(line).fault(), Fault::Server, "{line}");
        }
        // A Lua error of the script's own is still the key's.
        assert_eq!(
            replied("ERR user_script:12: attempt to compare nil with number").fault(),
            Fault::Key
        );
    }

    #[test]
    fn a_script_error_is_judged_by_the_code_it_wraps() {
        let wrapped = |inner: &str| {
            format!(
                "ERR Error running script (call to f_756928dd1246249109cfe8475bfa267e967ea948): \
                 @user_script:1: @user_script: 1: {inner}"
            )
        };
        for (inner, fault) in [
            (
                "-READONLY You can't write against a read only replica.",
                Fault::Server,
            ),
            (
                "-OOM command not allowed when used memory > 'maxmemory'.",
                Fault::Server,
            ),
            ("-BUSY Redis is busy running a script.", Fault::Server),
            (
                "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
                Fault::Server,
            ),
            (
                "-NOREPLICAS Not enough good replicas to write.",
                Fault::Server,
            ),
            (
                "-WRONGTYPE Operation against a key holding the wrong kind of value",
                Fault::Key,
            ),
            ("-ERR something about this call", Fault::Key),
            // As Redis 6.2 reports them: the stored value's fault.
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                Fault::Key,
            ),
            ("Unknown Redis command called from Lua script", Fault::Key),
            ("-", Fault::Key),
            ("-lower case is not a code", Fault::Key),
        ] {
            assert_eq!(replied(&wrapped(inner)).fault(), fault, "{inner}");
        }
        // One place, or none.
        for line in [
            "ERR Error running script (call to f_0): @user_script:3: -READONLY You can't write.",
            "ERR Error running script (call to f_0): -OOM command not allowed",
        ] {
            assert_eq!(replied(line).fault(), Fault::Server, "{line}");
        }
        // A Lua error, whatever its text.
        for line in [
            "ERR Error running script (call to f_0): @user_script:1: user_script:1: attempt to perform arithmetic on a nil value",
            "ERR Error running script (call to f_0): @user_script:1: user_script:1: plain -READONLY",
            "ERR user_script:1: -READONLY not wrapped by a script's error",
        ] {
            assert_eq!(replied(line).fault(), Fault::Key, "{line}");
        }
    }
}
