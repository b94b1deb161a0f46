//! The probe: from the first failure of a streak until Redis answers again (the breaker
//! open or not), one write script on the kept connection every probe interval, so that
//! Redis is judged by time whatever the traffic; and the start-up check that runs it
//! once ([`RedisBackend::verify`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use deadpool_redis::redis::Script;

use super::call::Call;
use super::fault::{Fault, ScriptError};
use super::health::{Outcome, RedisState};
use super::time::TimeSource;
use super::{By, RedisBackend};

/// The probe: one write, so a server that answers but refuses writes stays in fallback.
/// The probe's text.
pub(crate) const TEXT: &str = include_str!("probe.lua");

static PROBE: LazyLock<Script> = LazyLock::new(|| Script::new(TEXT));

/// The start-up check of a backend on the server's clock: a script that calls `TIME`,
/// as the engine does (some servers refuse it inside scripts).
pub(crate) const TIME_TEXT: &str = "return redis.call('TIME')\n";

static TIME_PROBE: LazyLock<Script> = LazyLock::new(|| Script::new(TIME_TEXT));

impl RedisBackend {
    /// Whether the probe has work: the breaker is open, or failures have come since
    /// Redis last answered.
    pub(super) fn needs_probe(&self) -> bool {
        self.state() == RedisState::Fallback || self.breaker.failing()
    }

    pub(super) fn start_probe(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(probe(Arc::downgrade(self), self.probe_interval));
            }
            // No runtime to probe from: try Redis again on the next check.
            Err(_) => {
                self.probing.store(false, Ordering::Release);
                if self.state() == RedisState::Fallback {
                    self.breaker.start_recovery();
                }
            }
        }
    }

    /// One probe: the write script on the kept connection, one round trip.
    async fn probe_once(self: &Arc<Self>) -> Result<(), ScriptError> {
        self.register(&PROBE);
        probed(self.call(&self.probe_call(), By::Probe).await?)
    }

    fn probe_call(&self) -> Call {
        let mut call = Call::new(&PROBE, 1, 2, self.probe_key.len() + 20);
        call.key(self.probe_key.as_bytes())
            .arg(self.probe_interval.as_millis().max(1000) as u64);
        call
    }

    /// Connects now (if no connection is kept) and runs the probe, with the connection
    /// attempt's deadline rather than a check's: whether checks can go to Redis, for a
    /// start-up check. The breaker is left as it is.
    pub(crate) async fn verify(self: &Arc<Self>) -> Result<(), ScriptError> {
        self.register(&PROBE);
        if self.time == TimeSource::Server {
            // (Before connecting: a new connection loads it with the others, so its first
            // call finds it.)
            self.register(&TIME_PROBE);
        }
        let call = self.probe_call();
        let timeout = self.connect_timeout();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut conn = match tokio::time::timeout_at(deadline, self.connection(By::Check)).await {
            Ok(conn) => conn?,
            // A TLS connection still not made most often waits for a handshake that a
            // plaintext server never answers: say so.
            Err(_) if self.connector.is_tls() => return Err(ScriptError::TlsHandshake(timeout)),
            Err(_) => return Err(ScriptError::Connecting(timeout)),
        };
        tokio::time::timeout_at(deadline, async {
            let reply = conn
                .script(&call, &self.functions)
                .await
                .map_err(|error| refused_probe(error.into()))?;
            probed(reply)?;
            if self.time == TimeSource::Server {
                let call = Call::new(&TIME_PROBE, 0, 0, 0);
                conn.script(&call, &self.functions)
                    .await
                    .map_err(|error| refused_time(error.into()))?;
            }
            Ok(())
        })
        .await
        .unwrap_or(Err(ScriptError::Timeout(timeout)))
    }
}

/// A refusal of the probe (a script that writes a key with a time to live) named with
/// its remedy, where the server's answer tells which.
fn refused_probe(error: ScriptError) -> ScriptError {
    if error.fault() == Fault::Transport {
        return error;
    }
    let said = error.to_string().to_ascii_lowercase();
    let (what, remedy) = if said.contains("evalsha") || said.contains("scripting") {
        (
            "Lua scripts (EVALSHA)",
            "every decision is one Lua script: give this user the scripting commands \
             (EVALSHA, EVAL, SCRIPT; FUNCTION and FCALL where the server has them), or use \
             an in-process backend",
        )
    } else if said.contains("syntax error") {
        (
            "SET with a time to live (PX) inside scripts",
            "every limit lives in keys that expire: a server without time-to-live options \
             cannot hold them (unsupported)",
        )
    } else {
        return error;
    };
    ScriptError::Refused {
        what,
        remedy,
        source: Box::new(error),
    }
}

/// A refusal of `TIME` inside scripts, with its remedy.
fn refused_time(error: ScriptError) -> ScriptError {
    if error.fault() == Fault::Transport {
        return error;
    }
    ScriptError::Refused {
        what: "TIME inside scripts",
        remedy: "build the backend with TimeSource::Caller (BackendBuilder::time_source): \
                 its scripts read the caller's clock and never call TIME",
        source: Box::new(error),
    }
}

/// Reads the probe's reply.
fn probed(reply: Vec<i64>) -> Result<(), ScriptError> {
    if reply.first() == Some(&1) {
        Ok(())
    } else {
        Err(ScriptError::Reply(reply))
    }
}

/// Probes Redis every `interval` while the backend needs it (the breaker is open, or a
/// streak of failures is under way), until a probe succeeds or the backend is dropped.
/// Probes start an interval apart, however long the last one took (up to the call
/// timeout), so that Redis is found again within an interval and a round trip.
/// Its failures count toward the streak while the breaker is closed, so that a quiet
/// service is judged within two probes of its first failure; its success ends a streak,
/// or starts the recovery.
async fn probe(weak: Weak<RedisBackend>, interval: Duration) {
    let mut failures = 0u64;
    let mut next = tokio::time::Instant::now() + interval;
    loop {
        tokio::time::sleep_until(next).await;
        next = tokio::time::Instant::now() + interval;
        let Some(backend) = weak.upgrade() else {
            return;
        };
        backend.breaker.count_away();
        if !backend.needs_probe() {
            backend.probing.store(false, Ordering::Release);
            // A failure between the test and the store found the probe running: go on.
            if !backend.needs_probe() || backend.probing.swap(true, Ordering::AcqRel) {
                return;
            }
            continue;
        }
        let result = backend.probe_once().await;
        let open = backend.state() == RedisState::Fallback;
        match result {
            Ok(()) if open => {
                backend.probing.store(false, Ordering::Release);
                backend.breaker.start_recovery();
                tracing::info!(
                    failed_probes = failures,
                    "redis answers again: moving checks back to redis"
                );
                // Close the recovery when it is over, also without checks to notice.
                let recovery = backend.breaker.recovery();
                drop(backend);
                tokio::time::sleep(recovery).await;
                if let Some(backend) = weak.upgrade() {
                    backend.state();
                }
                return;
            }
            Ok(()) => {
                backend.breaker.note(Outcome::Success);
            }
            Err(error) => {
                failures += 1;
                tracing::debug!(%error, fault = error.fault().label(), "redis probe failed");
                // Counted as a check's failure would be (nothing is judged while open).
                backend.count(&error);
            }
        }
    }
}
