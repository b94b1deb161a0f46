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

mod cluster;
pub(crate) mod http;
pub(crate) mod logs;
pub(crate) mod monitor;
pub(crate) mod proxy;
pub(crate) mod sentinel;
mod server;
pub(crate) mod settle;
pub(crate) mod stack;

// Not every test crate uses every handle.
#[allow(unused_imports)]
pub(crate) use self::cluster::RedisCluster;
#[allow(unused_imports)]
pub(crate) use self::server::{RedisServer, ServerClock};

/// `Backend::builder()` on the engine path the environment asks for: with
/// `TOWER_REDIS_RATELIMIT_EVALSHA` set (to anything but the empty string), the engine
/// runs by `EVALSHA` even on servers with Redis Functions, so that a whole test file
/// can run on that path (`scripts/matrix` does, for `scenarios`). The library itself
/// reads no environment variable: this sets its hidden `engine_functions` switch.
pub(crate) fn backend_builder() -> tower_redis_ratelimit::BackendBuilder {
    tower_redis_ratelimit::Backend::builder().engine_functions(!evalsha_forced())
}

/// Whether `TOWER_REDIS_RATELIMIT_EVALSHA` forces the `EVALSHA` path (see
/// [`backend_builder`]).
pub(crate) fn evalsha_forced() -> bool {
    std::env::var_os("TOWER_REDIS_RATELIMIT_EVALSHA").is_some_and(|v| !v.is_empty())
}

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
/// The call timeout of the backends the harness builds ([`RedisServer::backend`]): long
/// enough that a busy CI machine never turns a check into the failure policy's answer
/// (the default, 100 ms, is for production, where a slow Redis must not hold requests).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Lines of server log printed when a test panics.
const LOG_TAIL_LINES: usize = 50;
/// Cluster bus port = client port + this; both must be valid and free.
const CLUSTER_BUS_OFFSET: u16 = 10_000;

const NOT_FOUND_HINT: &str = "run scripts/test, which installs it";

// ---------------------------------------------------------------------------
// Ports, directories, binaries
// ---------------------------------------------------------------------------

/// How many of `redis`'s clients are subscribed to a channel (the backends' change
/// subscriptions: a backend built from URLs makes one in the background after its
/// first connection), once at least `at_least` are or 5 s have passed.
pub(crate) async fn subscribed_clients(redis: &RedisServer, at_least: usize) -> usize {
    let start = Instant::now();
    loop {
        let list = redis.cmd(&["CLIENT", "LIST"]);
        let subscribed = list.lines().filter(|line| line.contains(" sub=1 ")).count();
        if subscribed >= at_least || start.elapsed() > Duration::from_secs(5) {
            return subscribed;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many clients of `redis` are subscribed to `channel`, once at least `at_least`
/// are or 5 s have passed.
pub(crate) async fn channel_subscribers(redis: &RedisServer, channel: &str, at_least: i64) -> i64 {
    let start = Instant::now();
    loop {
        let reply = redis.cmd(&["PUBSUB", "NUMSUB", channel]);
        let count = reply
            .lines()
            .last()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if count >= at_least || start.elapsed() > Duration::from_secs(5) {
            return count;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

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
// Skipping a test the server's build cannot run
// ---------------------------------------------------------------------------

/// The file `scripts/matrix` names for a run, where [`skip`] records each skip.
const SKIPS_ENV: &str = "TOWER_REDIS_RATELIMIT_TEST_SKIPS";

/// The one way a test skips: the server's build lacks what the test needs (a build
/// without TLS, a server without Redis Functions), as the server itself says when asked
/// (never its version string alone). The reason names the server and the missing piece;
/// nothing about the crate is ever a reason. Prints `skipped: <reason>`, and where
/// `$TOWER_REDIS_RATELIMIT_TEST_SKIPS` names a file (`scripts/matrix` sets it) appends
/// `<binary>\t<test>\t<reason>` to it, so that the matrix counts the test as skipped,
/// not passed, and prints the reason. The caller returns right after.
pub(crate) fn skip(reason: impl fmt::Display) {
    let reason = reason.to_string().replace(['\n', '\t'], " ");
    eprintln!("skipped: {reason}");
    let Some(path) = std::env::var_os(SKIPS_ENV) else {
        return;
    };
    // The binary (`tls`, from `target/debug/deps/tls-0123abcd`) and the test (libtest
    // names the thread that runs a test after it; nextest runs one test a process).
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.file_stem()?.to_str()?.to_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
            _ => stem,
        })
        .unwrap_or_else(|| "?".to_owned());
    let thread = thread::current();
    let test = thread.name().unwrap_or("?");
    let line = format!("{binary}\t{test}\t{reason}\n");
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| io::Write::write_all(&mut file, line.as_bytes()));
    if let Err(e) = written {
        panic!(
            "could not record the skip in {}: {e}",
            Path::new(&path).display()
        );
    }
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

/// Whether the server on `port` knows `command` under that name (`COMMAND INFO`: a
/// command it does not know, or one renamed away, is nil).
fn has_command(port: u16, command: &str) -> bool {
    match raw_cmd(port, &["COMMAND", "INFO", command]) {
        Ok(Reply::Array(items)) => !matches!(items.first(), None | Some(Reply::Nil)),
        Ok(other) => panic!("COMMAND INFO {command} on port {port}: {other}"),
        Err(e) => panic!("COMMAND INFO {command} on port {port} failed: {e}"),
    }
}

/// `PING` with short timeouts; true only on `PONG`.
fn ping(port: u16) -> bool {
    matches!(
        command(port, &["PING"], Duration::from_millis(500)),
        Ok(Reply::Simple(pong)) if pong == "PONG"
    )
}
