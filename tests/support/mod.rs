//! Test support: a throw-away `redis-server` (or a small Redis Cluster) per test.
//!
//! Every [`RedisServer`] runs on its own free loopback port with its own
//! temporary directory, so tests can run in parallel and never touch a Redis
//! that happens to be running on the machine (for example Debian's service on
//! port 6379). Dropping the handle kills the process and removes the directory;
//! if the test is failing, the tail of the server log is printed first.
//!
//! The binaries are `$REDIS_SERVER` / `$REDIS_CLI` if set, otherwise
//! `redis-server` / `redis-cli` from `PATH` (`scripts/test` installs them).
//!
//! Included by each integration test file with `mod support;`, so not every
//! item is used by every test crate.
#![allow(dead_code)]

pub(crate) mod http;
pub(crate) mod proxy;
pub(crate) mod sentinel;

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis;

/// How long a freshly spawned server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cluster may take to report `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `redis-cli --cluster create` may run.
const CLUSTER_CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// Fresh ports tried when the chosen one turns out to be taken.
const PORT_ATTEMPTS: usize = 5;
/// Connect/read/write timeout of the raw RESP helpers.
const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of server log printed when a test panics.
const LOG_TAIL_LINES: usize = 50;
/// Cluster bus port = client port + this; both must be valid and free.
const CLUSTER_BUS_OFFSET: u16 = 10_000;

const NOT_FOUND_HINT: &str = "run scripts/test, which installs it";

// ---------------------------------------------------------------------------
// Ports, directories, binaries
// ---------------------------------------------------------------------------

/// A loopback port that was free a moment ago (bind `127.0.0.1:0`, read the
/// port, release it). Another process may grab it before it is used again;
/// [`RedisServer::start`] retries with a new port when that happens.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("could not bind 127.0.0.1:0 to find a free port")
}

/// A free port `p` such that `p + 10000` (the cluster bus port) is free too.
fn free_cluster_port() -> u16 {
    for _ in 0..200 {
        let port = free_port();
        let Some(bus) = port.checked_add(CLUSTER_BUS_OFFSET) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return port;
        }
    }
    panic!("could not find a free port pair (p, p + {CLUSTER_BUS_OFFSET}) for a cluster node");
}

const TEMP_PREFIX: &str = "tower-redis-ratelimit-";

/// Removes temp dirs left behind by test processes that no longer exist
/// (e.g. killed by a nextest timeout before `Drop` could run). Only dirs with
/// our prefix whose owning pid is gone are touched; runs once per process.
fn sweep_stale_temp_dirs() {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| {
        if !Path::new("/proc/self").exists() {
            return;
        }
        let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TEMP_PREFIX)) else {
                continue;
            };
            // <kind>-<pid>-<counter>-<nanos>
            let Some(pid) = rest.split('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    });
}

/// Creates a fresh, unique directory under the system temp dir.
pub(crate) fn make_temp_dir(kind: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    sweep_stale_temp_dirs();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = format!(
        "{TEMP_PREFIX}{kind}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
    );
    let dir = std::env::temp_dir().join(name);
    fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("could not create temp dir {}: {e}", dir.display()));
    dir
}

pub(crate) fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

/// Sends a signal by name (`STOP`, `CONT`, ...) through the shell's `kill`
/// builtin, which exists even where procps' `kill` binary is not installed.
fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("sh")
        .args([
            "-c",
            "kill -s \"$1\" \"$2\"",
            "sh",
            signal,
            &pid.to_string(),
        ])
        .status()
        .unwrap_or_else(|e| panic!("could not run `kill -s {signal} {pid}`: {e}"));
    assert!(
        status.success(),
        "`kill -s {signal} {pid}` failed: {status}"
    );
}

/// The scheduler state letter of a process (`R`, `S`, `T`, ...), if `/proc`
/// is available.
fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// Waits (up to 2 s) until the process is, or is no longer, stopped.
fn wait_stopped(pid: u32, stopped: bool) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match process_state(pid) {
            None => return, // no /proc: nothing to wait on
            Some(state) if (state == 'T') == stopped => return,
            Some(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

fn read_lossy_from(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut file) = File::open(path) {
        if io::Seek::seek(&mut file, io::SeekFrom::Start(offset)).is_ok() {
            let _ = file.read_to_end(&mut bytes);
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------
// Commands (the `redis` crate's blocking client)
// ---------------------------------------------------------------------------

/// A decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...` (without the leading `-`)
    Error(String),
    /// `:42`
    Int(i64),
    /// `$3\r\nfoo` (lossily decoded as UTF-8)
    Bulk(String),
    /// `$-1` or `*-1`
    Nil,
    /// `*N ...`
    Array(Vec<Reply>),
}

impl Reply {
    /// The text rendering used by [`RedisServer::cmd`]: simple strings and
    /// bulk strings as-is, integers as digits, errors with their leading `-`
    /// (so they cannot be mistaken for data), nil as `(nil)`, arrays as their
    /// rendered elements joined with `\n` (nested arrays are flattened).
    pub(crate) fn render(&self) -> String {
        match self {
            Reply::Simple(s) | Reply::Bulk(s) => s.clone(),
            Reply::Error(e) => format!("-{e}"),
            Reply::Int(i) => i.to_string(),
            Reply::Nil => "(nil)".to_owned(),
            Reply::Array(items) => items
                .iter()
                .map(Reply::render)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// The integer value, if this is an integer reply.
    pub(crate) fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

impl From<redis::Value> for Reply {
    fn from(value: redis::Value) -> Self {
        match value {
            redis::Value::Nil => Reply::Nil,
            redis::Value::Int(i) => Reply::Int(i),
            redis::Value::Okay => Reply::Simple("OK".to_owned()),
            redis::Value::SimpleString(s) => Reply::Simple(s),
            redis::Value::BulkString(bytes) => {
                Reply::Bulk(String::from_utf8_lossy(&bytes).into_owned())
            }
            redis::Value::Array(items) | redis::Value::Set(items) => {
                Reply::Array(items.into_iter().map(Reply::from).collect())
            }
            redis::Value::ServerError(error) => Reply::Error(format!(
                "{} {}",
                error.code(),
                error.details().unwrap_or_default()
            )),
            other => Reply::Bulk(format!("{other:?}")),
        }
    }
}

/// Sends one command on a fresh connection to `127.0.0.1:port` (the `redis` crate's
/// blocking client, without its `CLIENT SETINFO`, so a command is one request) and
/// returns the reply; an error reply is `Ok(Reply::Error(..))`, a failure to reach the
/// server an `io::Error`.
fn command(port: u16, args: &[&str], timeout: Duration) -> io::Result<Reply> {
    let info = redis::IntoConnectionInfo::into_connection_info(format!("redis://127.0.0.1:{port}"))
        .map_err(io::Error::other)?;
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let client =
        redis::Client::open(info.set_redis_settings(settings)).map_err(io::Error::other)?;
    let mut conn = client
        .get_connection_with_timeout(timeout)
        .map_err(io::Error::other)?;
    conn.set_read_timeout(Some(timeout))
        .map_err(io::Error::other)?;
    conn.set_write_timeout(Some(timeout))
        .map_err(io::Error::other)?;
    let (name, rest) = args.split_first().expect("a command");
    match redis::cmd(name).arg(rest).query::<redis::Value>(&mut conn) {
        Ok(value) => Ok(Reply::from(value)),
        Err(error) if error.code().is_some() => Ok(Reply::Error(format!(
            "{} {}",
            error.code().unwrap_or_default(),
            error.detail().unwrap_or_default()
        ))),
        Err(error) => Err(io::Error::other(error)),
    }
}

/// Sends one command to `127.0.0.1:port` and returns the reply (5 s timeouts).
pub(crate) fn raw_cmd(port: u16, args: &[&str]) -> io::Result<Reply> {
    command(port, args, CMD_TIMEOUT)
}

/// `PING` with short timeouts; true only on `PONG`.
fn ping(port: u16) -> bool {
    matches!(
        command(port, &["PING"], Duration::from_millis(500)),
        Ok(Reply::Simple(pong)) if pong == "PONG"
    )
}

// ---------------------------------------------------------------------------
// One redis-server process
// ---------------------------------------------------------------------------

/// Why a spawn attempt did not produce a ready server.
enum SpawnError {
    /// The port was taken by someone else: try another one (or wait).
    PortInUse,
    /// The binary could not be spawned at all (there is no log to show).
    NoBinary(String),
    /// Anything else: the message explains; the log is added by the caller.
    Fatal(String),
}

#[derive(Debug)]
struct Node {
    port: u16,
    dir: PathBuf,
    log_path: PathBuf,
    stdio_path: PathBuf,
    /// Extra arguments (cluster mode), appended after the common ones.
    extra_args: Vec<String>,
    /// Extra environment of the process (the clock shim).
    env: Vec<(String, String)>,
    child: Option<Child>,
    paused: bool,
}

impl Node {
    fn new(port: u16, dir: &Path, name: &str, extra_args: Vec<String>) -> Self {
        Node {
            port,
            dir: dir.to_owned(),
            log_path: dir.join(format!("{name}.log")),
            stdio_path: dir.join(format!("{name}.stdio")),
            extra_args,
            env: Vec::new(),
            child: None,
            paused: false,
        }
    }

    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &self.dir.to_string_lossy(),
            "--logfile",
            &self.log_path.to_string_lossy(),
            "--daemonize",
            "no",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// Spawns the process and waits until it answers `PING`.
    fn spawn(&mut self) -> Result<(), SpawnError> {
        assert!(self.child.is_none(), "redis-server is already running");
        let log_offset = file_len(&self.log_path);
        let stdio_offset = file_len(&self.stdio_path);
        let stdio = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stdio_path)
            .map_err(|e| SpawnError::Fatal(format!("cannot open {:?}: {e}", self.stdio_path)))?;
        let stdio_err = stdio
            .try_clone()
            .map_err(|e| SpawnError::Fatal(format!("cannot dup stdio file: {e}")))?;
        let bin = redis_server_bin();
        let child = Command::new(&bin)
            .args(self.args())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stdio_err)
            .spawn()
            .map_err(|e| {
                SpawnError::NoBinary(format!(
                    "redis-server not found: {NOT_FOUND_HINT} (could not spawn `{bin}`: {e})"
                ))
            })?;
        self.child = Some(child);
        self.paused = false;

        match self.wait_ready(log_offset, stdio_offset) {
            Ok(()) => Ok(()),
            Err(err) => {
                self.kill();
                Err(err)
            }
        }
    }

    fn wait_ready(&mut self, log_offset: u64, stdio_offset: u64) -> Result<(), SpawnError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let pid = self.pid().expect("spawned");
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                let output = format!(
                    "{}{}",
                    read_lossy_from(&self.log_path, log_offset),
                    read_lossy_from(&self.stdio_path, stdio_offset),
                );
                if output.contains("Address already in use") {
                    return Err(SpawnError::PortInUse);
                }
                return Err(SpawnError::Fatal(format!(
                    "redis-server on port {} exited during startup ({status})",
                    self.port
                )));
            }
            // Make sure the PONG comes from our process, not from someone
            // else who grabbed the port (our process would then be exiting).
            if ping(self.port) && self.answers_as(pid) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(SpawnError::Fatal(format!(
                    "redis-server on port {} did not answer PING within {READY_TIMEOUT:?}",
                    self.port
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers_as(&self, pid: u32) -> bool {
        match raw_cmd(self.port, &["INFO", "server"]) {
            Ok(Reply::Bulk(info)) => info
                .lines()
                .any(|l| l.trim() == format!("process_id:{pid}")),
            _ => false,
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL and reap. No-op if not running.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    fn pause(&mut self) {
        let pid = self.pid().expect("redis-server is not running");
        send_signal(pid, "STOP");
        wait_stopped(pid, true);
        self.paused = true;
    }

    fn resume(&mut self) {
        let pid = self.pid().expect("redis-server is not running");
        send_signal(pid, "CONT");
        wait_stopped(pid, false);
        self.paused = false;
    }

    fn log(&self) -> String {
        let log = read_lossy(&self.log_path);
        let stdio = read_lossy(&self.stdio_path);
        if stdio.trim().is_empty() {
            log
        } else {
            format!("{log}\n--- stdout/stderr ---\n{stdio}")
        }
    }

    fn print_log_tail(&self) {
        eprintln!(
            "---- last {LOG_TAIL_LINES} lines of redis-server log (port {}, {}) ----\n{}\n---- end of redis-server log ----",
            self.port,
            self.log_path.display(),
            tail(&self.log(), LOG_TAIL_LINES),
        );
    }

    fn with_log(&self, msg: &str) -> String {
        format!(
            "{msg}\n---- redis-server log ({}) ----\n{}\n---- end of redis-server log ----",
            self.log_path.display(),
            self.log()
        )
    }

    fn fatal(&self, msg: &str) -> ! {
        panic!("{}", self.with_log(msg))
    }
}

/// Starts a node on a fresh port, retrying a few times if the port is taken.
/// On failure, the error message includes the server log.
fn start_node(
    dir: &Path,
    pick_port: fn() -> u16,
    make: impl Fn(u16, &Path) -> Node,
) -> Result<Node, String> {
    let mut last_port = 0;
    for _ in 0..PORT_ATTEMPTS {
        let mut node = make(pick_port(), dir);
        last_port = node.port;
        match node.spawn() {
            Ok(()) => return Ok(node),
            Err(SpawnError::PortInUse) => continue,
            Err(SpawnError::Fatal(msg)) => return Err(node.with_log(&msg)),
            Err(SpawnError::NoBinary(msg)) => return Err(msg),
        }
    }
    Err(format!(
        "redis-server could not bind a free port after {PORT_ATTEMPTS} attempts (last: {last_port})"
    ))
}

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// A standalone `redis-server` on a free loopback port, owned by one test.
#[derive(Debug)]
pub(crate) struct RedisServer {
    node: Node,
}

impl RedisServer {
    /// Spawns a server on a free port and waits until it answers `PING`.
    ///
    /// Panics (with the server log) if it does not come up within ~10 s.
    pub(crate) fn start() -> RedisServer {
        Self::start_with(Vec::new())
    }

    /// Like [`start`](RedisServer::start), with more arguments for `redis-server`
    /// (e.g. `--tls-port`, `--user`, `--replicaof`), appended after the harness's own.
    pub(crate) fn start_with(extra_args: Vec<String>) -> RedisServer {
        let dir = make_temp_dir("redis");
        match start_node(&dir, free_port, |port, dir| {
            Node::new(port, dir, "redis", extra_args.clone())
        }) {
            Ok(node) => RedisServer { node },
            Err(msg) => {
                let _ = fs::remove_dir_all(&dir);
                panic!("{msg}");
            }
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.node.port
    }

    /// `redis://127.0.0.1:<port>`
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.node.port)
    }

    /// The server's temporary directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.node.dir
    }

    /// The current process id, if running.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// True while the process has not exited (a paused server is running).
    pub(crate) fn is_running(&mut self) -> bool {
        self.node.is_running()
    }

    /// A fresh deadpool-redis pool for this server.
    pub(crate) fn pool(&self) -> deadpool_redis::Pool {
        deadpool_redis::Config::from_url(self.url())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("could not create a deadpool-redis pool")
    }

    /// A Redis backend on this server without the deny cache, so that every check runs
    /// its script.
    pub(crate) fn uncached_backend(&self) -> tower_redis_ratelimit::Backend {
        tower_redis_ratelimit::Backend::builder()
            .redis(self.pool())
            .deny_cache(0)
            .build()
            .expect("a valid backend")
    }

    /// The server log so far (across restarts), plus anything it printed on
    /// stdout/stderr.
    pub(crate) fn log(&self) -> String {
        self.node.log()
    }

    /// SIGKILL the server and reap it (no-op if it is not running). Clients
    /// see the connection drop / refused connections until [`restart`].
    ///
    /// [`restart`]: RedisServer::restart
    pub(crate) fn kill(&mut self) {
        self.node.kill();
    }

    /// Starts the server again on the same port (killing it first if it is
    /// still running) and waits until it answers `PING`. The data set is empty
    /// afterwards (no persistence).
    pub(crate) fn restart(&mut self) {
        self.node.kill();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.node.spawn() {
                Ok(()) => return,
                // Someone grabbed our port in the meantime: wait for it.
                Err(SpawnError::PortInUse) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100));
                }
                Err(SpawnError::PortInUse) => self.node.fatal(&format!(
                    "could not restart redis-server: port {} stays in use",
                    self.node.port
                )),
                Err(SpawnError::Fatal(msg)) => self.node.fatal(&msg),
                Err(SpawnError::NoBinary(msg)) => panic!("{msg}"),
            }
        }
    }

    /// SIGSTOP the server: connections are still accepted by the kernel, but
    /// nothing is answered until [`resume`](RedisServer::resume). Use it to
    /// simulate a hung Redis and exercise timeouts.
    pub(crate) fn pause(&mut self) {
        self.node.pause();
    }

    /// SIGCONT a paused server; queued commands are then answered.
    pub(crate) fn resume(&mut self) {
        self.node.resume();
    }

    /// `SCRIPT FLUSH`: forget all cached Lua scripts, so the next `EVALSHA`
    /// gets `NOSCRIPT`.
    pub(crate) fn flush_scripts(&self) {
        let reply = self.cmd(&["SCRIPT", "FLUSH"]);
        assert_eq!(reply, "OK", "SCRIPT FLUSH failed: {reply}");
    }

    /// Sends one command on a fresh blocking connection and returns the
    /// reply rendered as text (see [`Reply::render`]): e.g.
    /// `cmd(&["PTTL", "k"])` -> `"994"`, `cmd(&["GET", "missing"])` ->
    /// `"(nil)"`, `cmd(&["KEYS", "*"])` -> `"a\nb"`, errors -> `"-ERR ..."`.
    ///
    /// Panics if the server cannot be reached (use [`try_cmd`] for that).
    ///
    /// [`try_cmd`]: RedisServer::try_cmd
    pub(crate) fn cmd(&self, args: &[&str]) -> String {
        self.cmd_reply(args).render()
    }

    /// How many times the server ran `command` (lower case, e.g. `evalsha`, `ping`),
    /// from `INFO commandstats`.
    pub(crate) fn command_calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        self.cmd(&["INFO", "commandstats"])
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().expect("a number of calls"))
    }

    /// Like [`cmd`](RedisServer::cmd), returning the decoded reply.
    pub(crate) fn cmd_reply(&self, args: &[&str]) -> Reply {
        raw_cmd(self.node.port, args).unwrap_or_else(|e| {
            panic!(
                "redis command {args:?} on port {} failed: {e}",
                self.node.port
            )
        })
    }

    /// Like [`cmd`](RedisServer::cmd), but returns I/O errors (connection
    /// refused, timeout) instead of panicking.
    pub(crate) fn try_cmd(&self, args: &[&str]) -> io::Result<String> {
        raw_cmd(self.node.port, args).map(|r| r.render())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if thread::panicking() {
            self.node.print_log_tail();
        }
        self.node.kill();
        let _ = fs::remove_dir_all(&self.node.dir);
    }
}

// ---------------------------------------------------------------------------
// RedisCluster
// ---------------------------------------------------------------------------

/// A Redis Cluster of N masters (no replicas) on free loopback ports, owned by
/// one test. All nodes share one temporary directory.
#[derive(Debug)]
pub(crate) struct RedisCluster {
    dir: PathBuf,
    nodes: Vec<Node>,
}

impl RedisCluster {
    /// Starts `masters` (at least 3) cluster-enabled nodes, joins them with
    /// `redis-cli --cluster create` and waits until every node reports
    /// `cluster_state:ok` and knows all the others (~20 s deadline).
    pub(crate) fn start(masters: usize) -> RedisCluster {
        assert!(
            masters >= 3,
            "Redis Cluster needs at least 3 masters, got {masters}"
        );
        let dir = make_temp_dir("cluster");
        let mut cluster = RedisCluster {
            dir: dir.clone(),
            nodes: Vec::with_capacity(masters),
        };
        for _ in 0..masters {
            let node = start_node(&dir, free_cluster_port, |port, dir| {
                let extra = vec![
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-config-file".to_owned(),
                    dir.join(format!("nodes-{port}.conf"))
                        .to_string_lossy()
                        .into_owned(),
                    "--cluster-node-timeout".to_owned(),
                    "5000".to_owned(),
                ];
                Node::new(port, dir, &format!("redis-{port}"), extra)
            })
            // Dropping `cluster` while unwinding kills the nodes started so far.
            .unwrap_or_else(|msg| panic!("{msg}"));
            cluster.nodes.push(node);
        }
        cluster.create();
        cluster.wait_ok();
        cluster
    }

    fn create(&self) {
        let out_path = self.dir.join("cluster-create.out");
        let out = File::create(&out_path).expect("cannot create cluster-create.out");
        let err = out.try_clone().expect("cannot dup cluster-create.out");
        let bin = redis_cli_bin();
        let mut child = Command::new(&bin)
            .arg("--cluster")
            .arg("create")
            .args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("redis-cli not found: {NOT_FOUND_HINT} (could not spawn `{bin}`: {e})")
            });
        let deadline = Instant::now() + CLUSTER_CREATE_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for redis-cli") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(50));
        };
        if status.is_some_and(|s| s.success()) {
            return;
        }
        let what = match status {
            Some(status) => format!("failed ({status})"),
            None => format!("timed out after {CLUSTER_CREATE_TIMEOUT:?}"),
        };
        self.fatal(&format!(
            "`redis-cli --cluster create` {what}:\n{}",
            read_lossy(&out_path)
        ));
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        let expected_nodes = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            let not_ready: Vec<(u16, String)> = self
                .nodes
                .iter()
                .filter_map(|node| {
                    let info = raw_cmd(node.port, &["CLUSTER", "INFO"])
                        .map(|r| r.render())
                        .unwrap_or_else(|e| e.to_string());
                    let ok = info.lines().any(|l| l.trim() == "cluster_state:ok")
                        && info.lines().any(|l| l.trim() == expected_nodes);
                    (!ok).then_some((node.port, info))
                })
                .collect();
            if not_ready.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let details: Vec<String> = not_ready
                    .iter()
                    .map(|(port, info)| format!("node {port}:\n{info}"))
                    .collect();
                self.fatal(&format!(
                    "cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT:?}\n{}",
                    details.join("\n")
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis://127.0.0.1:<port>` for every node.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The client port of every node.
    pub(crate) fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Sends one command to node `index` (no redirects are followed); see
    /// [`RedisServer::cmd`] for the rendering.
    pub(crate) fn cmd(&self, index: usize, args: &[&str]) -> String {
        let port = self.nodes[index].port;
        raw_cmd(port, args)
            .unwrap_or_else(|e| panic!("redis command {args:?} on port {port} failed: {e}"))
            .render()
    }

    /// The logs of all nodes, one after the other.
    pub(crate) fn log(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("---- node {} ----\n{}", n.port, n.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn fatal(&self, msg: &str) -> ! {
        panic!("{msg}\n{}\n---- end of cluster logs ----", self.log())
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let panicking = thread::panicking();
        for node in &mut self.nodes {
            if panicking {
                node.print_log_tail();
            }
            node.kill();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------
// Redis under a clock the test controls
// ---------------------------------------------------------------------------

/// The wall-clock offset of one `redis-server`, set at run time by the test.
///
/// The server runs with `clock_shim.c` (built here with `cc` once per test process) in
/// `LD_PRELOAD`: its `gettimeofday`, `clock_gettime(CLOCK_REALTIME)` and `time` (which
/// Redis's `TIME`, key expiry and scripts use) add the offset held in a file the shim maps
/// shared; monotonic clocks are untouched. No system-wide clock change. (libfaketime
/// cannot be used: it recurses into Debian's jemalloc-built redis-server at startup.)
#[derive(Debug)]
pub(crate) struct ServerClock {
    path: PathBuf,
}

impl ServerClock {
    /// Sets the server's wall clock to real time plus `offset_us` (negative: behind).
    pub(crate) fn set_offset_us(&self, offset_us: i64) {
        use std::os::unix::fs::FileExt;
        let file = OpenOptions::new()
            .write(true)
            .open(&self.path)
            .expect("clock file");
        file.write_all_at(&offset_us.to_ne_bytes(), 0)
            .expect("write the clock offset");
    }

    /// Steps the server's clock by `by_us` from its current offset.
    pub(crate) fn step_us(&self, by_us: i64) {
        let bytes = fs::read(&self.path).expect("clock file");
        let now = i64::from_ne_bytes(bytes[..8].try_into().expect("8 bytes"));
        self.set_offset_us(now + by_us);
    }
}

/// Builds the clock shim once per test process; the path of the shared library.
fn clock_shim() -> PathBuf {
    static SHIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = make_temp_dir("clockshim");
        let source = dir.join("clock_shim.c");
        fs::write(&source, include_str!("clock_shim.c")).expect("write clock_shim.c");
        let lib = dir.join("clock_shim.so");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let output = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(&source)
            .output()
            .unwrap_or_else(|e| panic!("could not run `{cc}` to build the clock shim: {e}"));
        assert!(
            output.status.success(),
            "building the clock shim failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        lib
    })
    .clone()
}

impl RedisServer {
    /// Like [`start`](Self::start), with a wall clock the test steps through the returned
    /// [`ServerClock`] (offset zero at first).
    pub(crate) fn start_with_clock() -> (RedisServer, ServerClock) {
        let shim = clock_shim();
        let dir = make_temp_dir("redis");
        let clock = ServerClock {
            path: dir.join("clock-offset"),
        };
        fs::write(&clock.path, 0i64.to_ne_bytes()).expect("write the clock file");
        let env = vec![
            ("LD_PRELOAD".to_owned(), shim.to_string_lossy().into_owned()),
            (
                "CLOCK_SHIM_FILE".to_owned(),
                clock.path.to_string_lossy().into_owned(),
            ),
        ];
        match start_node(&dir, free_port, |port, dir| {
            let mut node = Node::new(port, dir, "redis", Vec::new());
            node.env = env.clone();
            node
        }) {
            Ok(node) => (RedisServer { node }, clock),
            Err(msg) => {
                let _ = fs::remove_dir_all(&dir);
                panic!("{msg}");
            }
        }
    }
}
