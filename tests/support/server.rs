//! One `redis-server` process (`Node`, also used by the cluster), the [`RedisServer`]
//! a test owns, and a server under a clock the test controls.

use super::*;

// ---------------------------------------------------------------------------
// One redis-server process
// ---------------------------------------------------------------------------

/// Why a spawn attempt did not produce a ready server.
pub(super) enum SpawnError {
    /// The port was taken by someone else: try another one (or wait).
    PortInUse,
    /// The binary could not be spawned at all (there is no log to show).
    NoBinary(String),
    /// Anything else: the message explains; the log is added by the caller.
    Fatal(String),
}

#[derive(Debug)]
pub(super) struct Node {
    pub(super) port: u16,
    pub(super) dir: PathBuf,
    pub(super) log_path: PathBuf,
    pub(super) stdio_path: PathBuf,
    /// Extra arguments (cluster mode), appended after the common ones.
    pub(super) extra_args: Vec<String>,
    /// Extra environment of the process (the clock shim).
    pub(super) env: Vec<(String, String)>,
    pub(super) child: Option<Child>,
    pub(super) paused: bool,
}

impl Node {
    pub(super) fn new(port: u16, dir: &Path, name: &str, extra_args: Vec<String>) -> Self {
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

    pub(super) fn args(&self) -> Vec<String> {
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
    pub(super) fn spawn(&mut self) -> Result<(), SpawnError> {
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

    pub(super) fn wait_ready(
        &mut self,
        log_offset: u64,
        stdio_offset: u64,
    ) -> Result<(), SpawnError> {
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

    pub(super) fn answers_as(&self, pid: u32) -> bool {
        match raw_cmd(self.port, &["INFO", "server"]) {
            Ok(Reply::Bulk(info)) => info
                .lines()
                .any(|l| l.trim() == format!("process_id:{pid}")),
            _ => false,
        }
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(super) fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL and reap. No-op if not running.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    pub(super) fn pause(&mut self) {
        let pid = self.pid().expect("redis-server is not running");
        send_signal(pid, "STOP");
        wait_stopped(pid, true);
        self.paused = true;
    }

    pub(super) fn resume(&mut self) {
        let pid = self.pid().expect("redis-server is not running");
        send_signal(pid, "CONT");
        wait_stopped(pid, false);
        self.paused = false;
    }

    pub(super) fn log(&self) -> String {
        let log = read_lossy(&self.log_path);
        let stdio = read_lossy(&self.stdio_path);
        if stdio.trim().is_empty() {
            log
        } else {
            format!("{log}\n--- stdout/stderr ---\n{stdio}")
        }
    }

    pub(super) fn print_log_tail(&self) {
        eprintln!(
            "---- last {LOG_TAIL_LINES} lines of redis-server log (port {}, {}) ----\n{}\n---- end of redis-server log ----",
            self.port,
            self.log_path.display(),
            tail(&self.log(), LOG_TAIL_LINES),
        );
    }

    pub(super) fn with_log(&self, msg: &str) -> String {
        format!(
            "{msg}\n---- redis-server log ({}) ----\n{}\n---- end of redis-server log ----",
            self.log_path.display(),
            self.log()
        )
    }

    pub(super) fn fatal(&self, msg: &str) -> ! {
        panic!("{}", self.with_log(msg))
    }
}

/// The server's own words, in its start-up output, for a build without TLS asked to
/// listen on a TLS port; `None` when it says nothing of the kind.
fn no_tls(output: &str) -> Option<String> {
    let lines: Vec<&str> = output.lines().map(str::trim).collect();
    // Valkey 8+ and Redis 7.2+ built without TLS know the options, not the connection
    // type ("Missing implement of connection type tls", then this).
    if lines
        .iter()
        .any(|line| line.ends_with("Failed finding TLS support."))
    {
        return Some("Failed finding TLS support.".to_owned());
    }
    // Redis 6 and 7.0 built without TLS do not know the options: `>>> 'tls-port "6380"'`,
    // then "Bad directive or wrong number of arguments".
    lines.windows(2).find_map(|pair| {
        let option = pair[0].strip_prefix(">>> '")?.split_whitespace().next()?;
        (option.starts_with("tls-") && pair[1].starts_with("Bad directive"))
            .then(|| format!("{} ({option})", pair[1]))
    })
}

/// `redis-server 6.2.5`, `valkey-server 9.1.0`: the server binary's name and the version
/// it reports (`--version`), for a reason given before any server runs.
pub(crate) fn server_binary_version() -> String {
    let bin = redis_server_bin();
    let name = Path::new(&bin)
        .file_name()
        .map_or_else(|| bin.clone(), |name| name.to_string_lossy().into_owned());
    let version = Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let v = text.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
            Some(v.to_owned())
        })
        .unwrap_or_else(|| "(version unknown)".to_owned());
    format!("{name} {version}")
}

/// Starts a node on a fresh port, retrying a few times if the port is taken.
/// On failure, the error message includes the server log.
pub(super) fn start_node(
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

    /// Like [`start_with`](RedisServer::start_with), for arguments that open a TLS port
    /// (`--tls-port` ...): `Err` with the reason to [skip](super::skip) where the server's
    /// build has no TLS, as the server says when asked to listen on one (it exits at
    /// start-up: Valkey 8+ and Redis 7.2+ "Failed finding TLS support", Redis 6 "Bad
    /// directive" for `tls-port`). Any other failure to start panics as `start_with` does.
    pub(crate) fn start_with_tls(extra_args: Vec<String>) -> Result<RedisServer, String> {
        let dir = make_temp_dir("redis");
        let started = start_node(&dir, free_port, |port, dir| {
            Node::new(port, dir, "redis", extra_args.clone())
        });
        match started {
            Ok(node) => Ok(RedisServer { node }),
            Err(msg) => {
                let _ = fs::remove_dir_all(&dir);
                match no_tls(&msg) {
                    Some(words) => Err(format!(
                        "{} was built without TLS (asked to listen on --tls-port, it says: {words})",
                        server_binary_version()
                    )),
                    None => panic!("{msg}"),
                }
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

    /// A Redis backend on this server with the default settings but the call timeout,
    /// which is [`CALL_TIMEOUT`]: a test that asserts a check was decided by Redis
    /// must not see the failure policy answer because the machine was busy.
    pub(crate) fn backend(&self) -> tower_redis_ratelimit::Backend {
        super::backend_builder()
            .redis(self.pool())
            .call_timeout(CALL_TIMEOUT)
            .build()
            .expect("a valid backend")
    }

    /// [`RedisServer::backend`] without the deny cache, so that every check runs its
    /// script.
    pub(crate) fn uncached_backend(&self) -> tower_redis_ratelimit::Backend {
        super::backend_builder()
            .redis(self.pool())
            .call_timeout(CALL_TIMEOUT)
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

    /// `SCRIPT FLUSH`, and `FUNCTION FLUSH` where the server has Redis Functions: forget
    /// all cached Lua scripts and every library of functions, so the next `EVALSHA` gets
    /// `NOSCRIPT` and the next `FCALL` finds no function.
    pub(crate) fn flush_scripts(&self) {
        let reply = self.cmd(&["SCRIPT", "FLUSH"]);
        assert_eq!(reply, "OK", "SCRIPT FLUSH failed: {reply}");
        if self.has_functions() {
            let reply = self.cmd(&["FUNCTION", "FLUSH"]);
            assert_eq!(reply, "OK", "FUNCTION FLUSH failed: {reply}");
        }
    }

    /// Whether the server has Redis Functions (`FUNCTION` and `FCALL`: Redis 7 and
    /// later, Valkey), as it says itself (`COMMAND INFO`: a command it does not know,
    /// or one renamed away, is nil), not from its version.
    pub(crate) fn has_functions(&self) -> bool {
        self.has_command("function") && self.has_command("fcall")
    }

    /// Whether a backend built with the default engine path runs the engine as Redis
    /// Functions on this server: it has them, and `TOWER_REDIS_RATELIMIT_EVALSHA` does
    /// not force the `EVALSHA` path.
    pub(crate) fn runs_functions(&self) -> bool {
        self.has_functions() && !super::evalsha_forced()
    }

    /// Whether the server knows `command` under that name (`COMMAND INFO`).
    pub(crate) fn has_command(&self, command: &str) -> bool {
        has_command(self.node.port, command)
    }

    /// The server's name and version as `INFO server` gives them (`redis 6.2.5`,
    /// `valkey 8.0.1`), for a skipped test to say what it ran on.
    pub(crate) fn version(&self) -> String {
        let info = self.cmd(&["INFO", "server"]);
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
                .map(str::to_owned)
        };
        match field("server_name") {
            Some(name) => format!(
                "{name} {}",
                field(&format!("{name}_version")).unwrap_or_default()
            ),
            None => format!("redis {}", field("redis_version").unwrap_or_default()),
        }
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

    /// How many times the server ran `command` (lower case, e.g. `evalsha`, `ping`,
    /// `script|load`), from `INFO commandstats`. `evalsha` counts the engine's calls on
    /// either path: `EVALSHA` and `FCALL` (Redis Functions). A subcommand (`script|load`)
    /// on a server that counts whole commands only (Redis before 7) counts its command
    /// (`script`): every subcommand of it.
    pub(crate) fn command_calls(&self, command: &str) -> u64 {
        let stats = self.cmd(&["INFO", "commandstats"]);
        let calls = |command: &str| {
            let prefix = format!("cmdstat_{command}:calls=");
            stats
                .lines()
                .find_map(|line| line.strip_prefix(prefix.as_str()))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |calls| calls.parse::<u64>().expect("a number of calls"))
        };
        match command {
            "evalsha" => calls("evalsha") + calls("fcall"),
            _ => match command.split_once('|') {
                Some((parent, _)) if !self.counts_subcommands() => calls(parent),
                _ => calls(command),
            },
        }
    }

    /// Whether `INFO commandstats` counts subcommands apart (`cmdstat_script|load`):
    /// Redis 7 and later, and its forks (Valkey), as the server's version says.
    pub(crate) fn counts_subcommands(&self) -> bool {
        let info = self.cmd(&["INFO", "server"]);
        info.lines()
            .find_map(|line| line.trim().strip_prefix("redis_version:"))
            .and_then(|version| version.split('.').next()?.parse::<u32>().ok())
            .is_some_and(|major| major >= 7)
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
// Redis under a clock the test controls
// ---------------------------------------------------------------------------

/// The wall clock of one `redis-server` (an offset from real time, or a frozen time), set
/// at run time by the test.
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
    fn write(&self, time_us: i64, mode: i64) {
        use std::os::unix::fs::FileExt;
        let file = OpenOptions::new()
            .write(true)
            .open(&self.path)
            .expect("clock file");
        // The mode last: a shim that reads the new mode reads the new time too.
        file.write_all_at(&time_us.to_ne_bytes(), 0)
            .expect("write the clock time");
        file.write_all_at(&mode.to_ne_bytes(), 8)
            .expect("write the clock mode");
    }

    fn read(&self) -> (i64, i64) {
        let bytes = fs::read(&self.path).expect("clock file");
        let word =
            |i: usize| i64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        (word(0), word(1))
    }

    /// Sets the server's wall clock to real time plus `offset_us` (negative: behind).
    pub(crate) fn set_offset_us(&self, offset_us: i64) {
        self.write(offset_us, 0);
    }

    /// Stops the server's wall clock at `unix_us` (microseconds since the Unix epoch): it
    /// reads exactly that until the next call, so a script's `TIME` and its key expiries
    /// are the test's to choose.
    pub(crate) fn freeze_at(&self, unix_us: i64) {
        self.write(unix_us, 1);
    }

    /// Stops the server's wall clock at the real time now; from then on it moves only
    /// by [`ServerClock::step`], so blocks, lockouts and key expiries last what the test
    /// says in the server's time, however long the calls under them take.
    pub(crate) fn freeze_now(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch");
        self.freeze_at(i64::try_from(now.as_micros()).expect("fits"));
    }

    /// Steps the server's clock by `by_us` (an offset, or a frozen time).
    pub(crate) fn step_us(&self, by_us: i64) {
        let (time, mode) = self.read();
        self.write(time + by_us, mode);
    }

    /// Steps the server's clock by `by` ([`ServerClock::step_us`]).
    pub(crate) fn step(&self, by: Duration) {
        self.step_us(i64::try_from(by.as_micros()).expect("fits"));
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
        fs::write(&clock.path, [0u8; 16]).expect("write the clock file");
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
            Ok(node) => {
                let redis = RedisServer { node };
                redis.check_clock(&clock);
                (redis, clock)
            }
            Err(msg) => {
                let _ = fs::remove_dir_all(&dir);
                panic!("{msg}");
            }
        }
    }

    /// The shim governs the server's clock: frozen, `TIME` answers the frozen time, twice
    /// (a server that ignores `LD_PRELOAD`, a static binary, or one that adds a clock of its
    /// own to the wall clock's readings would fail every clock-step test in ways that
    /// look like the crate's; this says what it is). Leaves the clock at offset zero.
    fn check_clock(&self, clock: &ServerClock) {
        // 2030-01-01T00:00:00.123456Z
        const FROZEN_US: i64 = 1_893_456_000_123_456;
        clock.freeze_at(FROZEN_US);
        let readings: Vec<String> = (0..2).map(|_| self.cmd(&["TIME"])).collect();
        clock.set_offset_us(0);
        let expected = format!("{}\n{}", FROZEN_US / 1_000_000, FROZEN_US % 1_000_000);
        assert!(
            readings.iter().all(|time| *time == expected),
            "the clock shim does not govern {} ({}): frozen at {expected:?}, TIME said {readings:?}",
            self.version(),
            redis_server_bin(),
        );
    }
}
