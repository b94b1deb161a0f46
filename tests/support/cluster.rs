//! A Redis Cluster of N masters on free loopback ports, owned by one test.

use super::server::{start_node, Node};
use super::*;

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

    /// Whether node `index` has Redis Functions (`FUNCTION` and `FCALL`), as it says
    /// itself (see [`RedisServer::has_functions`]).
    pub(crate) fn has_functions(&self, index: usize) -> bool {
        let port = self.nodes[index].port;
        has_command(port, "function") && has_command(port, "fcall")
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
