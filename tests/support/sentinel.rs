//! A Redis Sentinel group for tests: one master, one replica and three sentinels, each
//! on a free loopback port, with short failure detection (500 ms) so a failover takes a
//! few seconds. Dropping the group kills every process and removes its directory.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{free_port, make_temp_dir, raw_cmd, redis_server_bin, RedisServer};

/// The name the sentinels know the master by.
pub(crate) const MASTER_NAME: &str = "limits";
/// How long the group may take to form, and a failover to complete.
const SETTLE: Duration = Duration::from_secs(20);

/// One master, one replica, three sentinels (quorum two).
pub(crate) struct SentinelGroup {
    pub(crate) master: RedisServer,
    pub(crate) replica: RedisServer,
    sentinels: Vec<(u16, Child)>,
    dir: PathBuf,
}

impl std::fmt::Debug for SentinelGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelGroup")
            .field("master", &self.master.port())
            .field("replica", &self.replica.port())
            .field("sentinels", &self.ports())
            .finish()
    }
}

fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < SETTLE, "{what}: not within {SETTLE:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

impl SentinelGroup {
    /// Starts the group and waits until the sentinels watch the master, know the
    /// replica and each other.
    pub(crate) fn start() -> SentinelGroup {
        let master = RedisServer::start();
        let replica = RedisServer::start_with(vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            master.port().to_string(),
        ]);
        eventually("the replica syncs", || {
            replica
                .cmd(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        let dir = make_temp_dir("sentinel");
        let mut group = SentinelGroup {
            master,
            replica,
            sentinels: Vec::new(),
            dir,
        };
        for _ in 0..3 {
            group.spawn_sentinel();
        }
        for port in group.ports() {
            eventually("a sentinel knows the others and the replica", || {
                let known = |what: &str| {
                    raw_cmd(port, &["SENTINEL", what, MASTER_NAME])
                        .map(|reply| reply.render())
                        .unwrap_or_default()
                };
                known("sentinels").matches("runid").count() == 2
                    && known("replicas").contains("runid")
            });
        }
        group
    }

    fn spawn_sentinel(&mut self) {
        let port = free_port();
        let conf = self.dir.join(format!("sentinel-{port}.conf"));
        let log = self.dir.join(format!("sentinel-{port}.log"));
        fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {log}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 500\n\
                 sentinel failover-timeout {MASTER_NAME} 3000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = self.dir.display(),
                log = log.display(),
                master = self.master.port(),
            ),
        )
        .expect("could not write a sentinel config");
        let child = Command::new(redis_server_bin())
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("could not start redis-server --sentinel");
        self.sentinels.push((port, child));
        eventually("a sentinel answers PING", || {
            raw_cmd(port, &["PING"]).is_ok_and(|reply| reply.render() == "PONG")
        });
    }

    /// The sentinels' ports.
    pub(crate) fn ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(port, _)| *port).collect()
    }

    /// `redis://127.0.0.1:<port>` of each sentinel.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.ports()
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    /// The port of the master the sentinels name now.
    pub(crate) fn master_port(&self) -> u16 {
        let reply = raw_cmd(
            self.ports()[0],
            &["SENTINEL", "get-master-addr-by-name", MASTER_NAME],
        )
        .expect("a sentinel answers")
        .render();
        reply
            .lines()
            .nth(1)
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no master address in {reply:?}"))
    }

    /// Waits until the sentinels name a master other than the one on `old_port`.
    pub(crate) fn wait_failover(&self, old_port: u16) -> u16 {
        eventually("the sentinels fail over", || self.master_port() != old_port);
        self.master_port()
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for (port, child) in &mut self.sentinels {
            if thread::panicking() {
                let log = self.dir.join(format!("sentinel-{port}.log"));
                eprintln!(
                    "--- sentinel {port} log ---\n{}",
                    fs::read_to_string(log).unwrap_or_default()
                );
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
