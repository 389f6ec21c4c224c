//! A private Redis Cluster for fault tests (see `private.rs`), started once per test
//! binary and taken one test at a time, and the check that a cluster is whole.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::private::listening;
use super::{eventually, said, scratch, signal};

/// A private Redis Cluster: `masters` masters with one replica each, on spare ports below
/// 45,000 (each node's cluster bus is its port + 10,000).
pub struct PrivateRedisCluster {
    pub ports: Vec<u16>,
    dir: PathBuf,
    nodes: Vec<Child>,
}

/// The cluster the tests of this binary share (started once), and whose turn it is: the
/// tests take it one at a time, since one of them fails a master over.
static SHARED_CLUSTER: tokio::sync::OnceCell<std::sync::Mutex<PrivateRedisCluster>> =
    tokio::sync::OnceCell::const_new();
static CLUSTER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl PrivateRedisCluster {
    /// The binary's shared cluster (3 masters, 3 replicas), and this test's turn with it.
    /// Its processes end with the test binary (a watchdog sees to it).
    pub async fn shared() -> (
        &'static std::sync::Mutex<PrivateRedisCluster>,
        tokio::sync::MutexGuard<'static, ()>,
    ) {
        let turn = CLUSTER_TURN.lock().await;
        let cluster = SHARED_CLUSTER
            .get_or_init(|| async {
                let cluster = Self::start(3).await;
                cluster.watched();
                std::sync::Mutex::new(cluster)
            })
            .await;
        // Whole before each turn: a test that failed halfway may have left a node
        // restarting (its guard starts a killed node again, but nobody waits for it), and
        // the next test must not inherit that as a failure of its own.
        let (dir, ports) = {
            let cluster = cluster.lock().unwrap_or_else(|e| e.into_inner());
            (cluster.dir(), cluster.ports.clone())
        };
        whole(&dir, &ports).await;
        (cluster, turn)
    }

    /// Kills the nodes and removes the data once this test binary has exited (a static is
    /// never dropped).
    fn watched(&self) {
        // By their ports: a node restarted by a test has a pid of its own, and redis-server
        // retitles itself `redis-server 127.0.0.1:PORT [cluster]`.
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        let script = format!(
            "while kill -0 {me} 2>/dev/null; do sleep 1; done; pkill -9 -f '^redis-server 127.0.0.1:({ports}) '; rm -rf {dir}",
            me = std::process::id(),
            ports = ports.join("|"),
            dir = self.dir.display(),
        );
        // In the background of a shell that exits at once (so nothing is left unwaited).
        let started = Command::new("sh")
            .args(["-c", &format!("({script}) >/dev/null 2>&1 &")])
            .status()
            .expect("sh");
        assert!(started.success(), "the cluster's watchdog: {started}");
    }

    pub async fn start(masters: usize) -> Self {
        let dir = scratch("redis-cluster");
        let ports = cluster_ports(masters * 2);
        let nodes = ports.iter().map(|port| node(&dir, *port)).collect();
        let cluster = Self { ports, dir, nodes };
        for port in &cluster.ports {
            listening(*port, "cluster node", Duration::from_secs(10)).await;
        }
        let addresses: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        create_cluster(&addresses);
        cluster.wait_ok().await;
        cluster
    }

    /// The port of the master serving `key`'s slot now.
    pub fn master_of(&self, key: &str) -> u16 {
        let port = self.ports[0];
        let slot: u16 = cli(port, &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .unwrap();
        let nodes = cli(port, &["CLUSTER", "NODES"]);
        master_serving(&nodes, slot)
            .and_then(|(_, port)| port.parse().ok())
            .expect("a master for the slot")
    }

    /// The port of a replica of the master on `master`: one the master does not flag as
    /// failing. Waits up to 10 s for one: a replica thawed or restarted a moment ago is
    /// still `fail?` in the master's view until the cluster's gossip clears it (a history
    /// freezing a replica right after thawing it met that).
    pub fn replica_of(&self, master: u16) -> u16 {
        let id = cli(master, &["CLUSTER", "MYID"]).trim().to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let nodes = cli(master, &["CLUSTER", "NODES"]);
            let healthy = nodes.lines().find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                (fields.get(3) == Some(&id.as_str()) && !line.contains("fail"))
                    .then(|| fields[1].split(['@', ':']).nth(1)?.parse().ok())
                    .flatten()
            });
            match healthy {
                Some(port) => return port,
                None if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                None => panic!("no healthy replica of the master on {master}:\n{nodes}"),
            }
        }
    }

    /// Cuts the master on `port` off from its replicas for as long as it lives: it asks
    /// for a password they do not have (set with `CONFIG SET`, so gone after a restart)
    /// and drops their links, and what it takes from now on lives on it alone.
    pub fn cut_replicas_off(&self, master: u16) {
        cli(master, &["CONFIG", "SET", "requirepass", "cut-off"]);
        cli(
            master,
            &[
                "-a",
                "cut-off",
                "--no-auth-warning",
                "CLIENT",
                "KILL",
                "TYPE",
                "replica",
            ],
        );
    }

    /// SIGSTOP to the node on `port`: it keeps its links but does nothing (a stuck node).
    pub fn freeze(&self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).unwrap();
        signal(self.nodes[i].id(), "STOP");
    }

    /// SIGCONT to the node on `port`.
    pub fn thaw(&self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).unwrap();
        signal(self.nodes[i].id(), "CONT");
    }

    /// SIGKILL to the node on `port`.
    pub fn kill(&mut self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).unwrap();
        let _ = self.nodes[i].kill();
        let _ = self.nodes[i].wait();
    }

    /// Starts the node on `port` again (it rejoins, as a replica if it was failed over);
    /// [`PrivateRedisCluster::whole`] waits for the cluster to be whole again.
    pub fn restart(&mut self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).unwrap();
        self.nodes[i] = node(&self.dir, port);
    }

    async fn wait_ok(&self) {
        whole(&self.dir, &self.ports).await;
    }

    /// What `redis-cli` printed for `args` sent to the node on `port`.
    pub fn ask(&self, port: u16, args: &[&str]) -> String {
        cli(port, args)
    }

    /// Where the nodes keep their data and logs.
    pub fn dir(&self) -> PathBuf {
        self.dir.clone()
    }

    /// The nodes' URLs, comma-separated (what `SECKILL_REDIS_URL` takes).
    pub fn seeds(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for PrivateRedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until every node on `ports` (their data under `dir`) says the cluster is whole
/// (every slot served) and every replica among them is in step with its master. A node
/// that is not says why: its answers and the end of its log.
pub async fn whole(dir: &Path, ports: &[u16]) {
    for port in ports {
        // Generous: a node that rejoins after a kill loads its append-only file and syncs
        // in full from its new master, on a 2-core machine busy with other tests.
        eventually(
            Duration::from_secs(60),
            "the cluster whole",
            || async move {
                let info = cli(*port, &["CLUSTER", "INFO"]);
                let replication = cli(*port, &["INFO", "replication"]);
                let in_step = replication.contains("role:master")
                    || replication.contains("master_link_status:up");
                if info.contains("cluster_state:ok") && in_step {
                    Ok(())
                } else {
                    let log = std::fs::read_to_string(log_of(dir, *port)).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(15).collect();
                    Err(format!(
                        "node {port}: {info}\n{replication}\nits log, last lines first:\n{}",
                        tail.join("\n")
                    ))
                }
            },
        )
        .await;
    }
}

/// `dev/redis-cluster.sh`: the one definition of a cluster node and of making nodes one
/// cluster, which a developer's local cluster uses too.
pub(super) const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dev/redis-cluster.sh");

/// Makes the nodes at `addresses` (`host:port`) one cluster with a replica per master
/// (`dev/redis-cluster.sh create`; the first half become masters).
pub(super) fn create_cluster(addresses: &[String]) {
    let created = Command::new(SCRIPT)
        .arg("create")
        .args(addresses)
        .output()
        .expect("dev/redis-cluster.sh");
    assert!(
        created.status.success(),
        "dev/redis-cluster.sh create: {}",
        said(&created)
    );
}

/// The address (host, port) of the live master serving `slot`, as `CLUSTER NODES`
/// printed them.
pub(super) fn master_serving(nodes: &str, slot: u16) -> Option<(String, String)> {
    nodes
        .lines()
        .filter(|line| line.contains("master") && !line.contains("fail"))
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let address = fields.get(1)?.split('@').next()?;
            let (host, port) = address.rsplit_once(':')?;
            fields[8..]
                .iter()
                .filter_map(|range| {
                    let (from, to) = range.split_once('-').unwrap_or((range, range));
                    Some((from.parse::<u16>().ok()?, to.parse::<u16>().ok()?))
                })
                .any(|(from, to)| (from..=to).contains(&slot))
                .then(|| (host.to_owned(), port.to_owned()))
        })
}

/// Where the node on `port` logs.
fn log_of(dir: &Path, port: u16) -> PathBuf {
    dir.join(port.to_string()).join("redis.log")
}

/// A cluster node on `port`, its data under `dir` (`dev/redis-cluster.sh node`, which
/// becomes the node: the child is the node itself).
fn node(dir: &Path, port: u16) -> Child {
    Command::new(SCRIPT)
        .arg("node")
        .arg(dir.join(port.to_string()))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("dev/redis-cluster.sh")
}

/// `redis-cli -p port args…`: what it printed.
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `n` ports whose cluster bus ports (+10,000) are free too.
fn cluster_ports(n: usize) -> Vec<u16> {
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    loop {
        let base = 20_000 + (ulid::Ulid::new().random() % 20_000) as u16;
        let ports: Vec<u16> = (0..n as u16).map(|i| base + i).collect();
        if ports.iter().all(|p| free(*p) && free(p + 10_000)) {
            return ports;
        }
    }
}
