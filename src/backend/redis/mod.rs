//! The Redis side of a backend: one kept multiplexed connection (replaced by one
//! connection attempt at a time), scripts run by SHA under a deadline, and each outcome
//! judged by the breaker; the probe that runs from the first failure of a streak until
//! Redis answers again is `redis/probe.rs`.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use deadpool_redis::redis::{self, Script};
use tokio::sync::watch;

use self::call::Call;
use self::changes::{Changes, OnChange};
use self::conn::{lacks_functions, refused_library, Conn, Functions};
use self::connect::Connector;
use self::fault::{breaks_connection, ErrorLog, Fault, ScriptError, SUMMARY_INTERVAL};
use self::health::{Breaker, BreakerConfig, Outcome, RedisState};
use self::script::Scripts;
use self::time::TimeSource;

pub(crate) mod call;
pub(crate) mod changes;
pub(crate) mod conn;
pub(crate) mod connect;
pub(crate) mod credentials;
pub(crate) mod fault;
pub(crate) mod health;
pub(crate) mod probe;
pub(crate) mod script;
pub(crate) mod time;
pub(crate) mod url;

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the part between
/// the first `{` and the next `}`, when not empty), else of the whole key, modulo 16384.
#[cfg(feature = "cluster")]
fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

/// Without the `cluster` feature no connection goes to a cluster: one route.
#[cfg(not(feature = "cluster"))]
fn slot(_: &[u8]) -> u16 {
    0
}

/// A connection attempt: `None` while under way, then how it ended.
type Attempt = watch::Receiver<Option<Result<(), ScriptError>>>;

/// How long a connection attempt may take, at least: it runs in the background, so a
/// far Redis (a round trip near the call timeout) can still be connected to.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a connection attempt may take with a call timeout of `call_timeout`.
fn connect_timeout(call_timeout: Duration) -> Duration {
    call_timeout.saturating_mul(4).max(MIN_CONNECT_TIMEOUT)
}

/// How many keys' errors are remembered for [`RedisBackend::key_error`], at most.
const KEY_ERRORS_LOGGED: usize = 1024;

pub(crate) struct RedisBackend {
    connector: Connector,
    /// The connection checks run on, kept until it fails: checking a connection out per
    /// check would cost deadpool's `PING` round trip.
    conn: ArcSwapOption<Conn>,
    /// The connection attempt under way, if any: callers wait for it instead of each
    /// opening their own (no herd after a restart).
    connecting: Mutex<Option<Attempt>>,
    /// `<prefix>:probe`, the one key the probe writes.
    probe_key: String,
    call_timeout: Duration,
    /// Whether the backend's first connection attempt is still under way: checks wait
    /// for it up to the connect timeout, not the call timeout (connecting and loading
    /// the engine take several round trips, which a far Redis or a busy machine makes
    /// longer than a check on a warm connection).
    cold: AtomicBool,
    probe_interval: Duration,
    breaker: Breaker,
    probing: AtomicBool,
    /// The engine: its library is loaded on every new connection where the server has
    /// Redis Functions.
    engine: &'static Scripts,
    /// The clock the engine reads.
    time: TimeSource,
    /// The scripts checks have run, loaded on every new connection.
    scripts: ArcSwap<Vec<&'static Script>>,
    /// Whether the engine runs as Redis Functions: not known until a connection has
    /// loaded the library (on) or found the server without them (off); always off when
    /// the builder turned them off.
    functions: Functions,
    log: ErrorLog,
    /// Keys whose errors were logged lately (by hash), and when.
    key_errors: Mutex<HashMap<u128, std::time::Instant>>,
    /// The change channel and what the backend does with its messages.
    changes: Changes,
    /// Whether the connections go to a Redis Cluster (a call's keys must share a slot).
    cluster: bool,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redis")
            .field("connector", &self.connector)
            .field("call_timeout", &self.call_timeout)
            .field("probe_interval", &self.probe_interval)
            .field("state", &self.state())
            .finish()
    }
}

impl RedisBackend {
    pub(crate) fn new(
        connector: Connector,
        prefix: String,
        call_timeout: Duration,
        probe_interval: Duration,
        breaker: BreakerConfig,
        engine: Engine,
        on_change: OnChange,
    ) -> Self {
        let changes = Changes::new(
            &prefix,
            connector.clone(),
            connect_timeout(call_timeout),
            on_change,
        );
        let cluster = connector.is_cluster();
        Self {
            cluster,
            connector,
            conn: ArcSwapOption::empty(),
            connecting: Mutex::new(None),
            probe_key: format!("{prefix}:probe"),
            call_timeout,
            cold: AtomicBool::new(true),
            probe_interval,
            breaker: Breaker::new(breaker, call_timeout, prefix.clone()),
            probing: AtomicBool::new(false),
            engine: engine.scripts,
            time: engine.time,
            // The engine's script for the backend's clock, in use from the start: a first
            // connection made before any check (a start-up probe) loads it too.
            scripts: ArcSwap::from_pointee(vec![engine.scripts.get(engine.time)]),
            functions: Functions::new(engine.functions),
            log: ErrorLog::default(),
            key_errors: Mutex::default(),
            changes,
        }
    }

    /// Whether checks call the engine as Redis Functions (`FCALL`) rather than by
    /// `EVALSHA`: unless the builder turned them off or a connection found the server
    /// without them. (A call built for `FCALL` before the first connection has asked the
    /// server goes by `EVALSHA` if the answer is "none": no `FCALL` ever reaches a server
    /// without Functions.)
    pub(crate) fn engine_functions(&self) -> bool {
        self.functions.fcall()
    }

    /// Where a call of `redis_key` goes, for batching (see `decide/batch.rs`): on Redis
    /// Cluster the key's slot, elsewhere 0 (one node).
    pub(crate) fn route(&self, redis_key: &[u8]) -> u16 {
        if !self.cluster {
            return 0;
        }
        slot(redis_key)
    }

    /// The deadline of one call, waiting for a connection included: the call timeout,
    /// but while the first connection attempt is under way as long as connecting may
    /// take, and then the call timeout (checks queued behind another's call wait as
    /// long).
    pub(crate) fn call_timeout(&self) -> Duration {
        if self.cold.load(Ordering::Relaxed) {
            self.connect_timeout() + self.call_timeout
        } else {
            self.call_timeout
        }
    }

    pub(crate) fn probe_interval(&self) -> Duration {
        self.probe_interval
    }

    pub(crate) fn state(&self) -> RedisState {
        self.breaker.state()
    }

    pub(crate) fn switches(&self) -> u64 {
        self.breaker.switches()
    }

    pub(crate) fn is_healthy(&self) -> bool {
        self.state() == RedisState::Healthy
    }

    /// Whether this check goes to Redis (see [`Breaker::admit`]).
    pub(crate) fn admit(&self) -> bool {
        self.breaker.admit()
    }

    /// Runs a script by SHA (loading it on `NOSCRIPT`) under the call timeout, waiting
    /// for a connection if there is none, and records the outcome.
    pub(crate) async fn eval(self: &Arc<Self>, call: &Call) -> Result<Vec<i64>, ScriptError> {
        self.eval_checks(call, 1).await
    }

    /// [`eval`](Self::eval) of a call that decides `checks` checks (a batch): its
    /// outcome counts once per check toward the breaker, as their own calls would have.
    pub(crate) async fn eval_checks(
        self: &Arc<Self>,
        call: &Call,
        checks: usize,
    ) -> Result<Vec<i64>, ScriptError> {
        self.register(call.script());
        let result = self.call(call, By::Check).await;
        match &result {
            Ok(_) => {
                for _ in 0..checks {
                    self.breaker.record(Outcome::Success);
                }
            }
            Err(error) => {
                self.log.error(error.fault(), error);
                for _ in 0..checks {
                    self.count(error);
                }
            }
        }
        result
    }

    async fn call(self: &Arc<Self>, call: &Call, by: By) -> Result<Vec<i64>, ScriptError> {
        let used = self.conn.load_full();
        let waiting = AtomicBool::new(false);
        let call = async {
            if let Some(conn) = &used {
                match Conn::clone(conn).script(call, &self.functions).await {
                    Ok(reply) => return Ok(reply),
                    // The kept connection died while Redis may be fine (a restart, an
                    // idle timeout on the way): forget it, unless another check already
                    // replaced it, and try once more on a new one within the deadline.
                    Err(error) if breaks_connection(&error) => {
                        self.conn.compare_and_swap(&used, None);
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            waiting.store(true, Ordering::Relaxed);
            let mut conn = self.connection(by).await?;
            waiting.store(false, Ordering::Relaxed);
            Ok(conn.script(call, &self.functions).await?)
        };
        let deadline = self.call_timeout();
        match tokio::time::timeout(deadline, call).await {
            Ok(result) => result,
            // Still waiting for a connection attempt that has not failed (a far Redis
            // takes more than a deadline to connect to): the attempt judges Redis when it
            // ends, this call does not.
            Err(_) if waiting.load(Ordering::Relaxed) => Err(ScriptError::Connecting(deadline)),
            // A reply held up on the connection (a slow command, a retransmission) holds
            // up every reply behind it: a new connection is made in the background, with
            // the scripts loaded (the call may have been cut between a `NOSCRIPT` and the
            // script's loading), and takes over when it is ready; meanwhile checks stay
            // on this one.
            Err(_) => {
                if used.is_some() {
                    drop(self.connect(by));
                }
                Err(ScriptError::Timeout(deadline))
            }
        }
    }

    /// Sends `pipe`, plain commands on one key (the list of blocked keys: see
    /// `decide/listing.rs`), on the kept connection (or the one a connection
    /// attempt brings), within the time a connection attempt may take: each command's
    /// reply. Its outcome is not judged by the breaker: these commands are no check's,
    /// and a refusal of them (an ACL without the key) says nothing of Redis's health.
    pub(crate) async fn commands(
        self: &Arc<Self>,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<redis::Value>, ScriptError> {
        let run = async {
            let mut conn = self.connection(By::Probe).await?;
            Ok(conn.pipeline(pipe).await?)
        };
        tokio::time::timeout(self.connect_timeout(), run)
            .await
            .unwrap_or(Err(ScriptError::Timeout(self.connect_timeout())))
    }

    /// Remembers `script` as one to load on every new connection.
    fn register(&self, script: &'static Script) {
        if self.scripts.load().iter().any(|s| std::ptr::eq(*s, script)) {
            return;
        }
        self.scripts.rcu(|scripts| {
            let mut scripts = Vec::clone(scripts);
            if !scripts.iter().any(|s| std::ptr::eq(*s, script)) {
                scripts.push(script);
            }
            scripts
        });
    }

    fn connect_timeout(&self) -> Duration {
        connect_timeout(self.call_timeout)
    }

    /// The kept connection, or the one the connection attempt under way (started here
    /// if there is none) brings.
    async fn connection(self: &Arc<Self>, by: By) -> Result<Conn, ScriptError> {
        if let Some(conn) = self.conn.load_full() {
            return Ok(Conn::clone(&conn));
        }
        let mut attempt = self.connect(by);
        let done = attempt
            .wait_for(Option::is_some)
            .await
            .map_err(|_| ScriptError::Pool("the connection attempt was dropped".into()))?;
        match &*done {
            Some(Err(error)) => Err(ScriptError::Connect(Box::new(error.clone()))),
            _ => self
                .conn
                .load_full()
                .map(|conn| Conn::clone(&conn))
                .ok_or_else(|| ScriptError::Pool("the new connection was dropped".into())),
        }
    }

    /// The connection attempt under way, or a new one in the background.
    fn connect(self: &Arc<Self>, by: By) -> Attempt {
        let mut slot = self.connecting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(attempt) = &*slot {
            if attempt.borrow().is_none() {
                return attempt.clone();
            }
        }
        let (done, attempt) = watch::channel(None);
        *slot = Some(attempt.clone());
        drop(slot);
        let this = Arc::clone(self);
        let timeout = self.connect_timeout();
        tokio::spawn(async move {
            let connect = async {
                let conn = this.connector.connect(timeout).await?;
                // The engine as Redis Functions, where the server has them (Redis 7 and
                // later): loaded once per server, checked on every new connection (a
                // failover may reach another server). Its answer tells, before any check
                // is sent on this connection, whether checks go by `FCALL` or by
                // `EVALSHA`. A new connection may reach a new server (a restart, a
                // failover): the scripts in use are loaded too, in the same round trip
                // (sent together on the multiplexed connection), before any check needs
                // them, so that concurrent checks do not each meet `NOSCRIPT` and load
                // them again. The engine's script is among them unless the server is
                // known to have Functions: while that is not known (a backend's first
                // connection), beside the library, so that a server without them needs
                // no second round trip before its first check.
                let functions = this.functions.fcall();
                let skip_engine = this.functions.is_on();
                let in_use = this.scripts.load_full();
                let scripts: Vec<&Script> = in_use
                    .iter()
                    .copied()
                    .filter(|script| !(skip_engine && this.engine.holds(script)))
                    .collect();
                let (library, loaded) = conn
                    .prepare(functions.then(|| this.engine.library()), &scripts)
                    .await;
                match library {
                    Some(Ok(())) => this.functions.on(),
                    // Redis before 7, `FUNCTION` renamed away or denied.
                    Some(Err(error)) if lacks_functions(&error) => {
                        if refused_library(&error) {
                            tracing::warn!(
                                %error,
                                "the server has Redis Functions but refused the engine's \
                                 library: the engine runs by EVALSHA, at a higher cost per \
                                 call (please report it, with the server's version)"
                            );
                        }
                        this.functions.off(&error);
                    }
                    // The way failed, or the server cannot serve anyone right now: its
                    // Functions are still to be learned.
                    Some(Err(error)) => {
                        tracing::debug!(%error, "loading the engine's functions failed");
                    }
                    None => {}
                }
                // Then, in one more round trip, the scripts first used while the
                // connection was being made (the probe's, when the checks waiting for it
                // failed), whose first call would otherwise cost a `NOSCRIPT`, a load and
                // a second call: more than a deadline with a far Redis (and the engine's,
                // on a server just found without Functions, were it not loaded yet).
                let functions = this.functions.fcall();
                let late: Vec<&Script> = this
                    .scripts
                    .load()
                    .iter()
                    .copied()
                    .filter(|script| {
                        let loaded = scripts.iter().any(|s| std::ptr::eq(*s, *script));
                        let in_library = functions && this.engine.holds(script);
                        !loaded && !in_library
                    })
                    .collect();
                let loaded = match (loaded, late.is_empty()) {
                    (Ok(()), false) => conn.prepare(None, &late).await.1,
                    (loaded, _) => loaded,
                };
                if let Err(error) = loaded {
                    tracing::debug!(%error, "loading a script on a new connection failed");
                }
                Ok::<_, ScriptError>(conn)
            };
            let result = match tokio::time::timeout(timeout, connect).await {
                Ok(Ok(conn)) => {
                    this.conn.store(Some(Arc::new(conn)));
                    // Redis is reachable: the change subscription, once, beside it.
                    this.changes.start();
                    match by {
                        By::Check => this.breaker.record(Outcome::Success),
                        By::Probe => this.breaker.note(Outcome::Success),
                    };
                    Ok(())
                }
                Ok(Err(error)) => Err(error),
                Err(_) => Err(ScriptError::Timeout(timeout)),
            };
            // Whatever its outcome, the first attempt has ended: the checks after it are
            // held to the call timeout.
            this.cold.store(false, Ordering::Relaxed);
            if let Err(error) = &result {
                // One failure per attempt, whatever number of checks waited for it; the
                // probe's attempts count toward the streak only, as the probe does.
                this.judge(error.fault(), error, by == By::Check);
            }
            done.send_replace(Some(result));
        });
        attempt
    }

    /// Counts a failed call (a check's or the probe's); opens the breaker when the
    /// failures say Redis is unusable.
    fn count(self: &Arc<Self>, error: &ScriptError) {
        let fault = error.fault();
        match error {
            _ if fault == Fault::Key => {}
            // The connection attempt this check waited for judged it when it failed.
            ScriptError::Connect(_) => {}
            // The connection attempt this check waited for is still under way after a
            // whole call timeout: Redis is far, or accepts connections and never answers.
            // Time tells which (the streak), not the number of checks that waited (the
            // ratio would judge a far Redis's first connection under load).
            ScriptError::Connecting(_) => self.judge(fault, error, false),
            _ => self.judge(fault, error, true),
        }
    }

    /// Counts a failure toward the breaker (toward its ratio too with `ratio`); opens it
    /// when the failures say Redis is unusable. The first failure of a streak starts the
    /// probe, which keeps judging Redis while no check does.
    fn judge(self: &Arc<Self>, fault: Fault, error: &ScriptError, ratio: bool) {
        let trip = if ratio {
            self.breaker.record(Outcome::Failure)
        } else {
            self.breaker.note(Outcome::Failure)
        };
        match trip {
            Some(trip) => {
                tracing::warn!(
                    fault = fault.label(),
                    %error,
                    reason = %trip,
                    "redis judged unusable: answering by the failure policies until a probe succeeds"
                );
                // Whatever connection was kept, the probe and the checks after recovery
                // use a fresh one.
                self.conn.store(None);
                self.start_probe();
            }
            None if self.breaker.failing() => self.start_probe(),
            None => {}
        }
    }

    /// Logs an error that concerns one key, at most once per key per summary interval,
    /// with the key hashed (keys may be secrets).
    pub(crate) fn key_error(&self, key_hash: u128, error: &ScriptError) {
        let now = std::time::Instant::now();
        let mut seen = self.key_errors.lock().unwrap_or_else(|e| e.into_inner());
        if seen
            .get(&key_hash)
            .is_some_and(|at| now.duration_since(*at) < SUMMARY_INTERVAL)
        {
            return;
        }
        if seen.len() >= KEY_ERRORS_LOGGED {
            seen.retain(|_, at| now.duration_since(*at) < SUMMARY_INTERVAL);
            if seen.len() >= KEY_ERRORS_LOGGED {
                return;
            }
        }
        seen.insert(key_hash, now);
        drop(seen);
        tracing::warn!(
            key_hash = format_args!("{:016x}", key_hash as u64),
            %error,
            "redis error for one key: answering it by the failure policy"
        );
    }
}

/// The engine a backend runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Engine {
    /// Its scripts.
    pub(crate) scripts: &'static Scripts,
    /// The clock its checks read: the script of that clock is in use from the start.
    pub(crate) time: TimeSource,
    /// Whether it may run as Redis Functions where the server has them.
    pub(crate) functions: bool,
}

/// Who makes a call or a connection attempt: a check (judged by the breaker's ratio and
/// streak) or the probe (judged by the streak only: it runs by time, not by traffic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum By {
    Check,
    Probe,
}
