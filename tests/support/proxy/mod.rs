//! A fault-injecting TCP proxy between a client and a real `redis-server` on loopback.
//!
//! [`FaultProxy`] listens on `127.0.0.1:0` and forwards every connection to the upstream
//! port, chunk by chunk (whatever one `read` returns), injecting the faults real
//! deployments see: added latency, replies held past a deadline (head-of-line, like a
//! TCP retransmission), replies lost together with their connection, connection resets,
//! a blackhole (a partition: connections stay open, nothing moves) and refused
//! connections. The names follow Toxiproxy's toxics; the code is ours.
//!
//! Held and lost replies are picked per RESP reply, not per chunk: the server-to-client
//! stream is split at reply boundaries (RESP2 and RESP3), so "0.2% of replies" means
//! that also when a multiplexed connection gets many replies in one read. A held reply
//! and everything after it on its connection wait; the replies before it in the same
//! chunk are delivered on time.
//!
//! The proxy runs on its own thread with its own tokio runtime, so it keeps real time
//! whatever the test does: it works from `#[tokio::test]` of any flavour (a paused
//! clock included) and from plain threads. Every setting applies at once, to existing
//! connections too. Which replies are held or lost is decided by a small seeded PRNG, so
//! a run is reproducible for a given order of replies ([`FaultProxy::set_seed`]).
//!
//! Dropping the proxy stops its thread and closes every connection.
//!
//! ```ignore
//! let redis = RedisServer::start();
//! let proxy = FaultProxy::start(redis.port());
//! let backend = Backend::redis(proxy.pool());
//! proxy.set_latency(Duration::from_millis(35)); // 70 ms round trip
//! proxy.hold_replies(0.002, Duration::from_millis(150));
//! ```

mod resp;

use self::resp::ReplySplitter;

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::thread;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The seed of every new proxy's PRNG.
const DEFAULT_SEED: u64 = 0x5EED_CAFE_F00D_0011;
/// The size of one read (one chunk at most).
const CHUNK: usize = 16 * 1024;

/// A TCP proxy on `127.0.0.1:<port>` in front of a `redis-server` on loopback, with
/// faults switched on and off at run time. See the module docs.
pub(crate) struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("port", &self.port)
            .field("upstream_port", &self.shared.upstream_port)
            .field("faults", &*self.shared.faults.borrow())
            .field("connections", &self.connections())
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

/// The faults in force; every change is published through a `watch` channel, so a
/// connection waiting out a blackhole wakes up when it clears.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Faults {
    latency: Duration,
    hold_fraction: f64,
    hold: Duration,
    lose_fraction: f64,
    blackhole: bool,
    refuse: bool,
}

#[derive(Debug)]
struct Shared {
    upstream_port: u16,
    faults: watch::Sender<Faults>,
    /// Bumped by [`FaultProxy::reset_connections`]; every connection watches it.
    resets: watch::Sender<u64>,
    /// SplitMix64 state.
    rng: AtomicU64,
    accepted: AtomicU64,
    open: AtomicUsize,
    stats: Counters,
}

/// What the proxy forwarded and injected so far.
#[derive(Debug, Default)]
struct Counters {
    chunks_up: AtomicU64,
    chunks_down: AtomicU64,
    replies: AtomicU64,
    held: AtomicU64,
    lost: AtomicU64,
}

/// A snapshot of [`FaultProxy::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ProxyStats {
    /// Chunks read from clients (requests; one chunk may hold several).
    pub(crate) chunks_up: u64,
    /// Chunks read from the server (one chunk may hold several replies).
    pub(crate) chunks_down: u64,
    /// Complete replies read from the server, lost ones included.
    pub(crate) replies: u64,
    /// Replies held by [`FaultProxy::hold_replies`].
    pub(crate) held: u64,
    /// Replies lost by [`FaultProxy::lose_replies`].
    pub(crate) lost: u64,
}

impl Shared {
    fn faults(&self) -> Faults {
        *self.faults.borrow()
    }

    fn update(&self, change: impl FnOnce(&mut Faults)) {
        self.faults.send_modify(change);
    }

    /// The next number of a SplitMix64 sequence (lock-free: one `fetch_add` per draw).
    fn next_u64(&self) -> u64 {
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `p` (never for `p <= 0`, always for `p >= 1`); draws only
    /// when the outcome is in doubt, so a proxy without faults uses no randomness.
    fn chance(&self, p: f64) -> bool {
        if p <= 0.0 || p.is_nan() {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        unit < p
    }
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of `127.0.0.1:<upstream_port>`,
    /// with no faults. Nothing is connected upstream until a client connects.
    ///
    /// # Panics
    ///
    /// If the thread, the runtime or the listener cannot be created.
    pub(crate) fn start(upstream_port: u16) -> FaultProxy {
        let (faults, _) = watch::channel(Faults::default());
        let (resets, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            upstream_port,
            faults,
            resets,
            rng: AtomicU64::new(DEFAULT_SEED),
            accepted: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            stats: Counters::default(),
        });
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel();
        let (port_tx, port_rx) = std_mpsc::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name(format!("fault-proxy-{upstream_port}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("could not build the proxy's tokio runtime");
                runtime.block_on(async move {
                    let listener = TcpListener::bind("127.0.0.1:0")
                        .await
                        .expect("could not bind the proxy on 127.0.0.1:0");
                    let port = listener.local_addr().expect("proxy address").port();
                    if port_tx.send(port).is_err() {
                        return;
                    }
                    accept_loop(listener, thread_shared, shutdown_rx).await;
                });
                // Dropping the runtime cancels every connection task, which closes
                // their sockets.
            })
            .expect("could not spawn the proxy thread");
        let port = port_rx
            .recv()
            .expect("the proxy thread died before it listened");
        FaultProxy {
            port,
            shared,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        }
    }

    /// The port the proxy listens on (on `127.0.0.1`).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>` of the proxy.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A fresh deadpool-redis pool whose connections go through the proxy (like
    /// `RedisServer::pool`).
    pub(crate) fn pool(&self) -> deadpool_redis::Pool {
        deadpool_redis::Config::from_url(self.url())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .expect("could not create a deadpool-redis pool")
    }

    /// Delivers every chunk, in both directions, `one_way` after the proxy read it (a
    /// round trip gains `2 * one_way`). Order is kept on each connection, also when the
    /// latency drops.
    pub(crate) fn set_latency(&self, one_way: Duration) {
        self.shared.update(|f| f.latency = one_way);
    }

    /// Holds that `fraction` of replies an extra `hold` (on top of the latency); later
    /// replies on the same connection wait behind a held one (head-of-line blocking, as
    /// after a TCP retransmission).
    pub(crate) fn hold_replies(&self, fraction: f64, hold: Duration) {
        self.shared.update(|f| {
            f.hold_fraction = fraction;
            f.hold = hold;
        });
    }

    /// Swallows that `fraction` of replies; the connection of a swallowed reply is then
    /// reset (replies before it are still delivered, nothing after it is), so the client
    /// sees the reply lost together with its connection.
    pub(crate) fn lose_replies(&self, fraction: f64) {
        self.shared.update(|f| f.lose_fraction = fraction);
    }

    /// Resets every open connection now (`SO_LINGER` 0, so both ends get an RST);
    /// chunks not yet delivered are dropped. New connections are unaffected.
    pub(crate) fn reset_connections(&self) {
        self.shared
            .resets
            .send_modify(|generation| *generation += 1);
    }

    /// While on, nothing is forwarded either way: chunks are held (and delivered, in
    /// order, once it is off), connections stay open, and new connections are accepted
    /// and blackholed too. Like a network partition that TCP rides out.
    pub(crate) fn blackhole(&self, on: bool) {
        self.shared.update(|f| f.blackhole = on);
    }

    /// While on, every new connection is closed (reset) as soon as it is accepted.
    /// Existing connections are unaffected.
    pub(crate) fn refuse(&self, on: bool) {
        self.shared.update(|f| f.refuse = on);
    }

    /// Turns every fault off: no latency, no held or lost replies, no blackhole (held
    /// chunks are delivered), no refusal.
    pub(crate) fn clear(&self) {
        self.shared.update(|f| *f = Faults::default());
    }

    /// Restarts the PRNG that picks held and lost replies from `seed`.
    pub(crate) fn set_seed(&self, seed: u64) {
        self.shared.rng.store(seed, Ordering::Relaxed);
    }

    /// Connections accepted so far (refused ones included).
    pub(crate) fn connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Chunks and replies forwarded, held and lost so far (on every connection).
    pub(crate) fn stats(&self) -> ProxyStats {
        let c = &self.shared.stats;
        ProxyStats {
            chunks_up: c.chunks_up.load(Ordering::Relaxed),
            chunks_down: c.chunks_down.load(Ordering::Relaxed),
            replies: c.replies.load(Ordering::Relaxed),
            held: c.held.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
        }
    }

    /// Connections open right now (client side accepted and not yet closed).
    pub(crate) fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((client, _)) = accepted else {
            // EMFILE and the like: back off a little instead of spinning.
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        if shared.faults().refuse {
            reset(&client);
            continue;
        }
        let open = OpenGuard::new(&shared);
        tokio::spawn(serve(client, Arc::clone(&shared), open));
    }
}

/// Counts a connection as open until dropped.
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.open.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(shared))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Closes a socket with an RST rather than a FIN once it is dropped.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Why a connection ended abnormally: it is reset on both sides.
#[derive(Debug)]
struct Reset;

/// The direction of a pump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server: requests.
    Up,
    /// Server to client: replies.
    Down,
}

/// What the reading half of a pump hands to its writing half.
enum Item {
    /// Deliver these bytes at this instant (or later, while blackholed).
    Data(Instant, Vec<u8>),
    /// The source closed: half-close the destination.
    End,
    /// A reply was lost: reset the connection once everything before it is delivered.
    Lose,
}

async fn serve(mut client: TcpStream, shared: Arc<Shared>, _open: OpenGuard) {
    let mut resets = shared.resets.subscribe();
    let upstream = SocketAddr::from(([127, 0, 0, 1], shared.upstream_port));
    let mut server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(_) => {
            // Upstream down: the client sees its connection reset.
            reset(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let outcome = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let up = pump(client_read, server_write, Direction::Up, &shared);
        let down = pump(server_read, client_write, Direction::Down, &shared);
        tokio::select! {
            outcome = async { tokio::try_join!(up, down) } => outcome.map(|_| ()),
            _ = resets.changed() => Err(Reset),
        }
    };
    if outcome.is_err() {
        reset(&client);
        reset(&server);
    }
}

/// Forwards `src` to `dst` with the faults in force until `src` closes (`Ok`) or the
/// connection must be reset (`Err`).
async fn pump<R, W>(
    mut src: R,
    mut dst: W,
    direction: Direction,
    shared: &Shared,
) -> Result<(), Reset>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Item>();
    let read = async move {
        let mut last = Instant::now();
        let mut replies = ReplySplitter::default();
        loop {
            let mut buf = vec![0u8; CHUNK];
            let n = match src.read(&mut buf).await {
                Ok(0) => {
                    let _ = tx.send(Item::End);
                    return Ok(());
                }
                Ok(n) => n,
                Err(_) => return Err(Reset),
            };
            buf.truncate(n);
            let faults = shared.faults();
            let stats = &shared.stats;
            // Never overtake an earlier chunk (head-of-line, order kept).
            let mut at = (Instant::now() + faults.latency).max(last);
            if direction == Direction::Up {
                stats.chunks_up.fetch_add(1, Ordering::Relaxed);
                last = at;
                if tx.send(Item::Data(at, buf)).is_err() {
                    return Ok(());
                }
                continue;
            }
            stats.chunks_down.fetch_add(1, Ordering::Relaxed);
            // Bytes from `from` on are not handed to the writer yet.
            let mut from = 0;
            for start in replies.split(&buf) {
                stats.replies.fetch_add(1, Ordering::Relaxed);
                let lose = shared.chance(faults.lose_fraction);
                let hold = !lose && shared.chance(faults.hold_fraction);
                if !lose && !hold {
                    continue;
                }
                if start > from {
                    let _ = tx.send(Item::Data(at, buf[from..start].to_vec()));
                    from = start;
                }
                if lose {
                    stats.lost.fetch_add(1, Ordering::Relaxed);
                    let _ = tx.send(Item::Lose);
                    // The writer resets the connection; nothing more is read.
                    std::future::pending::<()>().await;
                }
                stats.held.fetch_add(1, Ordering::Relaxed);
                at += faults.hold;
            }
            last = at;
            buf.drain(..from);
            if !buf.is_empty() && tx.send(Item::Data(at, buf)).is_err() {
                return Ok(());
            }
        }
    };
    let write = async {
        let mut faults = shared.faults.subscribe();
        while let Some(item) = rx.recv().await {
            match item {
                Item::Data(at, bytes) => {
                    tokio::time::sleep_until(at).await;
                    if faults.wait_for(|f| !f.blackhole).await.is_err() {
                        return Err(Reset);
                    }
                    if dst.write_all(&bytes).await.is_err() {
                        return Err(Reset);
                    }
                }
                Item::End => {
                    let _ = dst.shutdown().await;
                    return Ok(());
                }
                Item::Lose => return Err(Reset),
            }
        }
        Ok(())
    };
    tokio::try_join!(read, write).map(|_| ())
}
