//! A private RabbitMQ node for fault tests (see `private.rs`), and `rabbitmqctl` for one.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::private::listening;
use super::{free_port, said, scratch, signal};

/// `dev/rabbit-cluster.sh`: the one definition of a node and of joining a cluster, which a
/// developer's local cluster uses too.
pub(super) const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dev/rabbit-cluster.sh");

/// `rabbitmqctl` for one node, for a failing test's report.
pub struct RabbitCtl(String);

impl RabbitCtl {
    /// What `rabbitmqctl` says, or why it could not; never asserts, so it may run while a
    /// test unwinds.
    pub fn tell(&self, args: &[&str]) -> String {
        match Command::new("rabbitmqctl")
            .args(["-q", "-n", &self.0])
            .args(args)
            .output()
        {
            Ok(done) => said(&done),
            Err(e) => format!("rabbitmqctl: {e}"),
        }
    }
}

/// A private RabbitMQ node (its own node name, ports, data and logs), started detached by
/// `dev/rabbit-cluster.sh node` as the `rabbitmq` account.
pub struct PrivateRabbit {
    pub port: u16,
    node: String,
    dist_port: u16,
    dir: PathBuf,
    /// The node's Erlang VM (what a crash kills).
    pid: Option<u32>,
}

impl PrivateRabbit {
    pub async fn start() -> Self {
        let mut rabbit = Self::prepare();
        rabbit.launch().await;
        rabbit
    }

    /// `n` private nodes joined into one cluster (the first is the one the others join).
    pub async fn cluster(n: usize) -> Vec<Self> {
        let mut nodes: Vec<Self> = (0..n).map(|_| Self::prepare()).collect();
        // One after the other: three Erlang VMs booting at once take the 2-core machine
        // from every other test for seconds.
        for node in &mut nodes {
            node.launch().await;
        }
        let (seed, others) = nodes.split_first().expect("at least one node");
        for node in others {
            let done = Command::new(SCRIPT)
                .args(["join", &node.node, &seed.node])
                .output()
                .expect("dev/rabbit-cluster.sh");
            assert!(
                done.status.success(),
                "dev/rabbit-cluster.sh join {} {}: {}",
                node.node,
                seed.node,
                said(&done)
            );
        }
        // `start_app` can return before the node has rejoined: a quorum queue declared
        // then gets fewer members.
        seed.ctl(&["await_online_nodes", &n.to_string(), "--timeout", "60"]);
        nodes
    }

    /// A node's place and ports, not started yet.
    fn prepare() -> Self {
        let dir = scratch("rabbit");
        let port = free_port();
        Self {
            port,
            node: format!("seckill-{port}@localhost"),
            dist_port: free_port(),
            dir,
            pid: None,
        }
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    async fn launch(&mut self) {
        let done = Command::new(SCRIPT)
            .arg("node")
            .arg(&self.dir)
            .arg(&self.node)
            .arg(format!("127.0.0.1:{}", self.port))
            .arg(self.dist_port.to_string())
            .output()
            .expect("dev/rabbit-cluster.sh");
        assert!(
            done.status.success(),
            "dev/rabbit-cluster.sh node: {}",
            said(&done)
        );
        listening(self.port, "private RabbitMQ", Duration::from_secs(60)).await;
        let pid = Command::new("rabbitmqctl")
            .args(["-n", &self.node, "eval", "list_to_integer(os:getpid())."])
            .output()
            .expect("rabbitmqctl");
        self.pid = String::from_utf8_lossy(&pid.stdout).trim().parse().ok();
        assert!(self.pid.is_some(), "the private node's pid: {pid:?}");
    }

    /// `rabbitmqctl` on this node: what it printed.
    pub fn ctl(&self, args: &[&str]) -> String {
        let done = Command::new("rabbitmqctl")
            .args(["-q", "-n", &self.node])
            .args(args)
            .output()
            .expect("rabbitmqctl");
        assert!(done.status.success(), "rabbitmqctl {args:?}: {done:?}");
        String::from_utf8_lossy(&done.stdout).into_owned()
    }

    /// `rabbitmqctl` for this node, apart from the node (which stops when dropped).
    pub fn ctl_handle(&self) -> RabbitCtl {
        RabbitCtl(self.node.clone())
    }

    /// SIGKILL to the node's VM: a crash.
    pub fn kill(&mut self) {
        if let Some(pid) = self.pid.take() {
            signal(pid, "KILL");
            // Gone once its AMQP port no longer answers.
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Starts the node again with its data: durable queues and persistent messages back.
    pub async fn restart(&mut self) {
        self.launch().await;
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
