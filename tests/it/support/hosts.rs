//! Hosts on one machine (`dev/fleet-hosts.sh`): each a network namespace with an address
//! on a bridge of the test's own, cut from another with `nft` and healed; the services of
//! a fleet started on them. The machine itself is the checker's host: it reaches every
//! host, and no host reaches it (or the machine's shared services). Everything made —
//! namespaces, links, processes — is removed on drop, also when a test fails.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::private::scratch;
use super::private_cluster::{self, create_cluster, master_serving};
use super::private_rabbit;
use super::{TestServer, eventually, serve};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dev/fleet-hosts.sh");

/// The port of the first `seckill` on a host (a second listens on the next, …).
pub const FIRST_PORT: u16 = 8080;

pub struct Hosts {
    net: u8,
    addresses: HashMap<String, IpAddr>,
    /// The stores' processes.
    services: Vec<Child>,
    /// `seckill` processes, stopped between sales: which host each runs on, and its log.
    servers: Vec<(String, Child, Log)>,
    dirs: Vec<PathBuf>,
}

/// A server's log lines, as collected by [`serve`].
type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

fn script(args: &[&str]) -> String {
    let done = Command::new(SCRIPT).args(args).output().expect(SCRIPT);
    assert!(
        done.status.success(),
        "dev/fleet-hosts.sh {args:?}: {}",
        super::said(&done)
    );
    String::from_utf8_lossy(&done.stdout).into_owned()
}

impl Hosts {
    /// Makes the hosts, on a bridge no other test uses.
    pub fn up(names: &[&str]) -> Self {
        let net = (100..=250u8)
            .find(|net| {
                !std::path::Path::new(&format!("/sys/class/net/skbr{net}")).exists()
                    && !std::path::Path::new(&format!("/sys/class/net/sk{net}-1")).exists()
                    && !std::path::Path::new(&format!("/run/netns/sk{net}-{}", names[0])).exists()
            })
            .expect("a free 10.77.x.0/24");
        let mut args = vec!["up".to_owned(), net.to_string()];
        args.extend(names.iter().map(|n| n.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Made before the hosts: its drop removes them even if making one fails.
        let mut hosts = Self {
            net,
            addresses: HashMap::new(),
            services: Vec::new(),
            servers: Vec::new(),
            dirs: Vec::new(),
        };
        hosts.addresses = script(&args)
            .lines()
            .filter_map(|line| line.split_once(' '))
            .map(|(host, address)| (host.to_owned(), address.parse().expect("an address")))
            .collect();
        hosts
    }

    pub fn ip(&self, host: &str) -> IpAddr {
        self.addresses[host]
    }

    /// The checker's host (the machine itself) on the hosts' bridge.
    pub fn checker(&self) -> IpAddr {
        IpAddr::from([10, 77, self.net, 1])
    }

    fn namespace(&self, host: &str) -> String {
        format!("sk{}-{host}", self.net)
    }

    /// Where a server on `host` runs: its address and namespace.
    pub fn place(&self, host: &str) -> (IpAddr, Option<String>) {
        (self.ip(host), Some(self.namespace(host)))
    }

    /// `program` to run on `host`.
    pub fn on(&self, host: &str, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace(host), program]);
        command
    }

    /// Drops everything between `host` and each of `others` (both ways), until
    /// [`Hosts::heal`].
    pub fn cut(&self, host: &str, others: &[&str]) {
        for other in others {
            script(&["cut", &self.net.to_string(), host, other]);
        }
    }

    pub fn heal(&self, host: &str, others: &[&str]) {
        for other in others {
            script(&["heal", &self.net.to_string(), host, other]);
        }
    }

    /// Freezes every process on `host` (SIGSTOP), as a host that stalls — a VM paused, a
    /// long GC — or, with `false`, lets them run again (SIGCONT).
    pub fn freeze(&self, host: &str, frozen: bool) {
        let pids = Command::new("ip")
            .args(["netns", "pids", &self.namespace(host)])
            .output()
            .expect("ip netns pids");
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let _ = Command::new("kill")
                .args([if frozen { "-STOP" } else { "-CONT" }, pid])
                .status();
        }
    }

    fn spawn(&mut self, mut command: Command) {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ip netns exec");
        self.services.push(child);
    }

    async fn listening(&self, host: &str, port: u16, what: &str, within: Duration) {
        let addr = (self.ip(host), port);
        eventually(within, &format!("{what} on {host}"), || async move {
            tokio::net::TcpStream::connect(addr)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await;
    }

    /// A Redis Cluster node on each of `hosts` (port 6379, bus 16379; as
    /// `dev/redis-cluster.sh` makes one), made one cluster with a replica per master — the
    /// first half masters, each on a host of its own: the seeds' URLs, comma-separated.
    pub async fn redis_cluster(&mut self, hosts: &[&str]) -> String {
        for host in hosts {
            let ip = self.ip(host).to_string();
            let dir = scratch("fleet-redis");
            let mut command = self.on(host, private_cluster::SCRIPT);
            command.arg("node").arg(&dir).args(["6379", &ip]);
            self.spawn(command);
            self.dirs.push(dir);
        }
        let mut addresses = Vec::new();
        for host in hosts {
            self.listening(host, 6379, "Redis Cluster node", Duration::from_secs(10))
                .await;
            addresses.push(format!("{}:6379", self.ip(host)));
        }
        create_cluster(&addresses);
        self.redis_cluster_whole(hosts).await;
        addresses
            .iter()
            .map(|a| format!("redis://{a}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until every node on `hosts` says the cluster is whole and is a master or a
    /// replica in step with its master.
    pub async fn redis_cluster_whole(&self, hosts: &[&str]) {
        for host in hosts {
            eventually(
                Duration::from_secs(60),
                "the cluster whole",
                || async move {
                    let info = self.redis_cli(host, &["CLUSTER", "INFO"]);
                    let replication = self.redis_cli(host, &["INFO", "replication"]);
                    let in_step = replication.contains("role:master")
                        || replication.contains("master_link_status:up");
                    if info.contains("cluster_state:ok") && in_step {
                        Ok(())
                    } else {
                        Err(format!("{host}: {info}\n{replication}"))
                    }
                },
            )
            .await;
        }
    }

    /// What `redis-cli` (on this machine) printed for `args` sent to the node on `host`.
    pub fn redis_cli(&self, host: &str, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", &self.ip(host).to_string(), "-p", "6379"])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The host of the Redis Cluster master serving `key`'s slot now (asking `via`), if one
    /// does (none between a master's failure and its replica's promotion).
    pub fn redis_master_of(&self, via: &str, key: &str) -> Option<String> {
        let slot: u16 = self
            .redis_cli(via, &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("a slot");
        let nodes = self.redis_cli(via, &["CLUSTER", "NODES"]);
        let (ip, _) = master_serving(&nodes, slot)?;
        self.addresses
            .iter()
            .find(|(_, address)| address.to_string() == ip)
            .map(|(host, _)| host.clone())
    }

    /// A RabbitMQ node on each of `hosts` (port 5672, node `seckill@HOST`), joined into
    /// one cluster that pauses a minority (`pause_minority`): the nodes' URLs,
    /// comma-separated.
    pub async fn rabbitmq_cluster(&mut self, hosts: &[&str]) -> String {
        for host in hosts {
            let dir = scratch("fleet-rabbit");
            // One after the other: three Erlang VMs booting at once take the 2-core
            // machine from everything else for seconds.
            let done = self
                .on(host, private_rabbit::SCRIPT)
                .arg("node")
                .arg(&dir)
                .arg(format!("seckill@{host}"))
                .arg(format!("{}:5672", self.ip(host)))
                .output()
                .expect("dev/rabbit-cluster.sh");
            assert!(
                done.status.success(),
                "dev/rabbit-cluster.sh node on {host}: {}",
                super::said(&done)
            );
            self.dirs.push(dir);
            self.listening(host, 5672, "RabbitMQ", Duration::from_secs(90))
                .await;
        }
        let seed = format!("seckill@{}", hosts[0]);
        for host in &hosts[1..] {
            let done = self
                .on(host, private_rabbit::SCRIPT)
                .env("RABBITMQ_CONF_ENV_FILE", "/dev/null")
                .args(["join", &format!("seckill@{host}"), &seed])
                .output()
                .expect("dev/rabbit-cluster.sh");
            assert!(
                done.status.success(),
                "dev/rabbit-cluster.sh join on {host}: {}",
                super::said(&done)
            );
        }
        self.rabbitmqctl(
            hosts[0],
            &[
                "await_online_nodes",
                &hosts.len().to_string(),
                "--timeout",
                "60",
            ],
        )
        .unwrap();
        hosts
            .iter()
            .map(|host| format!("amqp://guest:guest@{}:5672/%2f", self.ip(host)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `rabbitmqctl` for the node on `host`, run there: what it printed, or why it failed
    /// (a paused node does not answer).
    pub fn rabbitmqctl(&self, host: &str, args: &[&str]) -> Result<String, String> {
        let node = format!("seckill@{host}");
        let done = self
            .on(host, "rabbitmqctl")
            .env("RABBITMQ_CONF_ENV_FILE", "/dev/null")
            .args(["-q", "-n", &node])
            .args(args)
            .output()
            .expect("rabbitmqctl");
        if done.status.success() {
            Ok(String::from_utf8_lossy(&done.stdout).into_owned())
        } else {
            Err(format!(
                "rabbitmqctl {args:?} on {host}: {}",
                super::said(&done)
            ))
        }
    }

    /// `seckill serve` with `roles` on `host` (the environment's settings, listening on the
    /// host's address, port 8080 for its first server, 8081 for a second, …); the server,
    /// for the test to call.
    pub fn seckill(
        &mut self,
        host: &str,
        env: &super::TestEnv,
        roles: &str,
        settings: &[(&str, &str)],
    ) -> TestServer {
        let port =
            usize::from(FIRST_PORT) + self.servers.iter().filter(|(on, ..)| on == host).count();
        let mut command = self.on(host, env!("CARGO_BIN_EXE_seckill"));
        command
            .envs(env.vars())
            .envs(settings.iter().copied())
            .env_remove("RUST_LOG")
            .env("SECKILL_HTTP_ADDR", format!("{}:{port}", self.ip(host)))
            .args(["serve", "--roles", roles]);
        let (child, server, log, _reader) = serve(&mut command);
        self.servers.push((host.to_owned(), child, log));
        server
    }

    /// The last `lines` warnings and errors of each running `seckill`, for a failure's
    /// message.
    pub fn server_warnings(&self, lines: usize) -> String {
        let mut said = String::new();
        for (host, child, log) in &self.servers {
            let log = log.lock().unwrap_or_else(|e| e.into_inner());
            let warned: Vec<&String> = log
                .iter()
                .filter(|line| line.contains("\"WARN\"") || line.contains("\"ERROR\""))
                .collect();
            said += &format!("seckill {} on {host}, warnings:\n", child.id());
            for line in &warned[warned.len().saturating_sub(lines)..] {
                said += &format!("  {line}\n");
            }
        }
        said
    }

    /// Stops every `seckill` started on the hosts (SIGTERM, then waits).
    pub fn stop_servers(&mut self) {
        for (_, child, _) in &mut self.servers {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        for (_, child, _) in &mut self.servers {
            let _ = child.wait();
        }
        self.servers.clear();
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let servers = self.servers.iter_mut().map(|(_, child, _)| child);
        for child in servers.chain(&mut self.services) {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Also what a detached server left running in a namespace (RabbitMQ, epmd).
        let _ = Command::new(SCRIPT)
            .args(["down", &self.net.to_string()])
            .status();
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
