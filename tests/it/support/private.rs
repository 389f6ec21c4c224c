//! Private servers for fault tests, on spare ports and in their own data directories,
//! owned by the test that starts them — never the machine's shared Redis, MariaDB or
//! RabbitMQ. Each can be killed (SIGKILL: a crash, nothing flushed, nothing said) and
//! started again on the same port with the same data; each is killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{eventually, free_port, said, signal};

/// A fresh directory under the system's temp dir, removed by the owner's drop.
pub fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "seckill-{what}-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Hands a directory to a service account (the servers drop root to it).
pub(super) fn give_to(dir: &Path, user: &str) {
    let status = Command::new("chown")
        .args(["-R", &format!("{user}:{user}"), &dir.display().to_string()])
        .status()
        .expect("chown");
    assert!(
        status.success(),
        "chown {user} {}: the private MariaDB and RabbitMQ of the fault tests need root (as dev/test.sh and CI run)",
        dir.display()
    );
}

pub(super) async fn listening(port: u16, what: &str, within: Duration) {
    eventually(within, &format!("{what} listening on {port}"), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
}

/// A private `redis-server` on a spare port, for tests that stop, freeze or flush Redis.
pub struct PrivateRedis {
    pub port: u16,
    args: Vec<String>,
    /// Its data directory, when it keeps an append-only file.
    dir: Option<PathBuf>,
    child: Child,
}

impl PrivateRedis {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// With more `redis-server` options (`--rename-command CONFIG ""`, …), keeping nothing.
    pub async fn start_with(options: &[&str]) -> Self {
        let mut args: Vec<String> = ["--save", "", "--appendonly", "no"]
            .map(String::from)
            .to_vec();
        args.extend(options.iter().map(|o| o.to_string()));
        Self::launch(free_port(), args, None).await
    }

    /// Keeping an append-only file, fsynced as `appendfsync` says (`everysec`, `always`).
    pub async fn start_persistent(appendfsync: &str) -> Self {
        let dir = scratch("redis");
        let args = [
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            appendfsync,
            "--dir",
            &dir.display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        Self::launch(free_port(), args, Some(dir)).await
    }

    async fn launch(port: u16, args: Vec<String>, dir: Option<PathBuf>) -> Self {
        let child = Self::spawn(port, &args);
        let redis = Self {
            port,
            args,
            dir,
            child,
        };
        redis.wait_ready().await;
        redis
    }

    fn spawn(port: u16, args: &[String]) -> Child {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH")
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.ping().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "private redis-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await?;
        redis::cmd("PING").query_async(&mut conn).await
    }

    pub async fn cmd(&self, args: &[&str]) -> redis::Value {
        let mut conn = redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut conn).await.unwrap()
    }

    /// SIGSTOP: the process keeps its socket but answers nothing (a hung Redis).
    pub fn freeze(&self) {
        signal(self.child.id(), "STOP");
    }

    pub fn thaw(&self) {
        signal(self.child.id(), "CONT");
    }

    /// SIGKILL: a crash, with whatever its persistence had written.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port, with the same data.
    pub async fn restart(&mut self) {
        self.child = Self::spawn(self.port, &self.args);
        self.wait_ready().await;
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.thaw();
        self.kill();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A private RabbitMQ node (its own node name, ports, data and logs), started with
/// `rabbitmq-server -detached` as the `rabbitmq` account.
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
            for step in [
                vec!["stop_app"],
                vec!["join_cluster", seed.node.as_str()],
                vec!["start_app"],
            ] {
                let done = Command::new("rabbitmqctl")
                    .args(["-n", &node.node])
                    .args(&step)
                    .output()
                    .expect("rabbitmqctl");
                assert!(
                    done.status.success(),
                    "rabbitmqctl {step:?} on {}: {}",
                    node.node,
                    String::from_utf8_lossy(&done.stderr)
                );
            }
        }
        // `start_app` can return before the node has rejoined: a quorum queue declared
        // then gets fewer members.
        seed.ctl(&["await_online_nodes", &n.to_string(), "--timeout", "60"]);
        nodes
    }

    /// A node's files and ports, not started yet.
    fn prepare() -> Self {
        let dir = scratch("rabbit");
        let port = free_port();
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!("listeners.tcp.1 = 127.0.0.1:{port}\nloopback_users = none\n"),
        )
        .unwrap();
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        give_to(&dir, "rabbitmq");
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
        let status = Command::new("rabbitmq-server")
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.dir.join("enabled_plugins"),
            )
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("rabbitmq-server on PATH");
        assert!(status.success(), "rabbitmq-server -detached: {status}");
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

/// A fresh directory (named for `what`) holding a new MariaDB data directory, `data`
/// (`mariadb-install-db`), owned by the server's account.
pub(super) fn mariadb_data(what: &str) -> PathBuf {
    let dir = scratch(what);
    give_to(&dir, "mysql");
    let installed = Command::new("mariadb-install-db")
        .args([
            "--no-defaults",
            &format!("--datadir={}", dir.join("data").display()),
            "--user=mysql",
            "--skip-test-db",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("mariadb-install-db on PATH");
    assert!(installed.success(), "mariadb-install-db: {installed}");
    dir
}

/// A private MariaDB server (`mariadb-install-db` data of its own, no grant tables: root
/// without a password, like the shared one).
pub struct PrivateMariaDb {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateMariaDb {
    pub async fn start() -> Self {
        let dir = mariadb_data("mariadb");
        let mut db = Self {
            port: free_port(),
            dir,
            child: None,
        };
        db.launch().await;
        db
    }

    /// The server's URL (tests add their database).
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }

    async fn launch(&mut self) {
        let child = Command::new("mariadbd")
            .args([
                "--no-defaults".to_owned(),
                format!("--datadir={}", self.dir.join("data").display()),
                format!("--port={}", self.port),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--socket={}", self.dir.join("mysqld.sock").display()),
                format!("--pid-file={}", self.dir.join("mysqld.pid").display()),
                format!("--log-error={}", self.dir.join("error.log").display()),
                "--user=mysql".to_owned(),
                "--skip-grant-tables".to_owned(),
                "--innodb-buffer-pool-size=64M".to_owned(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd on PATH");
        self.child = Some(child);
        listening(self.port, "private MariaDB", Duration::from_secs(30)).await;
    }

    /// SIGKILL: a crash (InnoDB recovers its log at the next start).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn restart(&mut self) {
        self.launch().await;
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

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

    /// The port of a replica of the master on `master`.
    pub fn replica_of(&self, master: u16) -> u16 {
        let id = cli(master, &["CLUSTER", "MYID"]).trim().to_owned();
        let nodes = cli(master, &["CLUSTER", "NODES"]);
        nodes
            .lines()
            .find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                (fields.get(3) == Some(&id.as_str()) && !line.contains("fail"))
                    .then(|| fields[1].split(['@', ':']).nth(1)?.parse().ok())
                    .flatten()
            })
            .expect("a replica of the master")
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

/// Makes the nodes at `addresses` (`host:port`) one cluster with a replica per master
/// (`redis-cli --cluster create`; the first half become masters).
pub(super) fn create_cluster(addresses: &[String]) {
    let created = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(addresses)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .expect("redis-cli on PATH");
    assert!(
        created.status.success(),
        "redis-cli --cluster create: {}",
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

/// A cluster node on `port`, its data under `dir` (the append-only file on: a node that
/// rejoins after a kill must not come back empty as a master).
fn node(dir: &Path, port: u16) -> Child {
    let data = dir.join(port.to_string());
    std::fs::create_dir_all(&data).unwrap();
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
        .args(["--cluster-config-file", "nodes.conf"])
        // A replica may always take over, however long it was cut off: the tests kill
        // masters on purpose, and `WAIT` says what a replica holds.
        .args(["--cluster-replica-validity-factor", "0"])
        .args(["--save", "", "--appendonly", "yes"])
        .args(["--dir", &data.display().to_string()])
        .args(["--logfile", &log_of(dir, port).display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on PATH")
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
