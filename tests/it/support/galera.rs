//! A private MariaDB Galera cluster (Debian's `galera-4`): each node a `mariadbd` with its
//! own data directory — on loopback with four spare ports each (SQL, group communication,
//! incremental and full state transfer by rsync), or on hosts of a fleet (network
//! namespaces, the standard ports) — killed on drop.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::private::{mariadb_data, mariadb_tmpdir};
use super::{eventually, free_port};

const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";
/// A silent node is suspected after 2 s (Galera's default: 5): until then the others'
/// commits wait for it, so a test would wait that long per fault. The rest keep Galera's
/// proportions: the remaining nodes have 5 s (`install_timeout`, by default half of
/// `inactive_timeout`) to agree on the new view. With `inactive_timeout` at 4 s they had
/// 2, and on a loaded machine the two left after a partition did not agree in time, each
/// fell back to a non-primary view of its own, and together they stayed non-primary —
/// MySQL refused every statement until the cut-off node came back (the soak's "minority
/// stall").
const QUICK: &str = "evs.keepalive_period=PT0.5S;evs.suspect_timeout=PT2S;\
                     evs.inactive_timeout=PT10S;evs.install_timeout=PT5S;\
                     evs.inactive_check_period=PT0.5S";

struct Node {
    /// Where it listens, and the namespace it runs in (none: this machine's loopback).
    address: IpAddr,
    netns: Option<String>,
    port: u16,
    gcomm: u16,
    ist: u16,
    sst: u16,
    dir: PathBuf,
    child: Option<Child>,
}

pub struct PrivateGalera {
    nodes: Vec<Node>,
}

impl PrivateGalera {
    /// `n` nodes on loopback in one primary component, the first bootstrapping it.
    pub async fn start(n: usize) -> Self {
        let loopback = IpAddr::from([127, 0, 0, 1]);
        Self::start_at((0..n).map(|_| (loopback, None)).collect()).await
    }

    /// A node at each of `places` (an address and, on a fleet's host, its namespace, where
    /// the standard ports are free).
    pub async fn start_at(places: Vec<(IpAddr, Option<String>)>) -> Self {
        let n = places.len();
        let mut cluster = Self {
            nodes: places
                .into_iter()
                .map(|(address, netns)| {
                    let dir = mariadb_data("galera");
                    let port = |standard| {
                        if netns.is_some() {
                            standard
                        } else {
                            free_port()
                        }
                    };
                    Node {
                        address,
                        port: port(3306),
                        gcomm: port(4567),
                        ist: port(4568),
                        sst: port(4444),
                        netns,
                        dir,
                        child: None,
                    }
                })
                .collect(),
        };
        cluster.launch(0, true).await;
        cluster.wait_until_joined(0, 1).await;
        for node in 1..n {
            cluster.launch(node, false).await;
        }
        for node in 0..n {
            cluster.wait_until_joined(node, n).await;
        }
        cluster
    }

    /// The nodes' server URLs, comma-separated (tests add their database to each).
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|n| self.url(n)).collect()
    }

    pub fn url(&self, node: usize) -> String {
        let node = &self.nodes[node];
        format!("mysql://root@{}:{}", node.address, node.port)
    }

    pub fn addr(&self, node: usize) -> std::net::SocketAddr {
        (self.nodes[node].address, self.nodes[node].port).into()
    }

    async fn launch(&mut self, node: usize, bootstrap: bool) {
        let members: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{}:{}", n.address, n.gcomm))
            .collect();
        let n = &self.nodes[node];
        let mut args = vec![
            "--no-defaults".to_owned(),
            format!("--datadir={}", n.dir.join("data").display()),
            format!("--port={}", n.port),
            format!("--bind-address={}", n.address),
            format!("--socket={}", n.dir.join("mysqld.sock").display()),
            format!("--pid-file={}", n.dir.join("mysqld.pid").display()),
            format!("--log-error={}", n.dir.join("error.log").display()),
            mariadb_tmpdir(&n.dir),
            "--user=mysql".to_owned(),
            "--skip-grant-tables".to_owned(),
            // No reverse look-up of each client's address: on a host with no reachable
            // resolver it took seconds per connection, and a node answered nothing.
            "--skip-name-resolve".to_owned(),
            "--innodb-buffer-pool-size=64M".to_owned(),
            "--binlog-format=ROW".to_owned(),
            "--innodb-autoinc-lock-mode=2".to_owned(),
            "--wsrep-on=ON".to_owned(),
            format!("--wsrep-provider={PROVIDER}"),
            format!("--wsrep-cluster-address=gcomm://{}", members.join(",")),
            format!("--wsrep-node-address={}:{}", n.address, n.gcomm),
            format!(
                "--wsrep-provider-options=gmcast.listen_addr=tcp://{a}:{};ist.recv_addr={a}:{};{QUICK}",
                n.gcomm,
                n.ist,
                a = n.address
            ),
            format!("--wsrep-sst-receive-address={}:{}", n.address, n.sst),
            "--wsrep-sst-method=rsync".to_owned(),
            format!("--wsrep-node-name=node{node}"),
        ];
        if bootstrap {
            args.push("--wsrep-new-cluster".to_owned());
        }
        let mut command = match &n.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, "mariadbd"]);
                command
            }
            None => Command::new("mariadbd"),
        };
        let child = command
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd on PATH");
        let addr = (n.address, n.port);
        self.nodes[node].child = Some(child);
        // Generous: a node restarted on a busy 2-core machine recovers its data first.
        eventually(
            Duration::from_secs(120),
            "a Galera node listening",
            || async move {
                tokio::net::TcpStream::connect(addr)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .await;
    }

    /// Waits until `node` is ready and synced in a primary component of `size` nodes —
    /// and so is every other node (a donor of a state transfer is not, until it is over).
    pub async fn wait_until_joined(&self, node: usize, size: usize) {
        let nodes: Vec<usize> = if size == 1 {
            vec![node]
        } else {
            (0..self.nodes.len()).collect()
        };
        for node in nodes {
            let url = self.url(node);
            // Generous: a node that rejoins may need a full state transfer (rsync),
            // slow on a 2-core machine busy with other tests.
            eventually(
                Duration::from_secs(120),
                &format!("Galera node {node} ready and synced among {size}"),
                || async {
                    let status = self.status(&url).await?;
                    let expected = ("ON", "Primary", size.to_string(), "Synced");
                    if (
                        status.0.as_str(),
                        status.1.as_str(),
                        status.2.clone(),
                        status.3.as_str(),
                    ) == expected
                    {
                        Ok(())
                    } else {
                        Err(format!(
                            "{status:?}; its log ends:\n{}",
                            self.log_tail(node, 8)
                        ))
                    }
                },
            )
            .await;
        }
    }

    /// A node's `wsrep_ready`, `wsrep_cluster_status`, `wsrep_cluster_size`,
    /// `wsrep_local_state_comment`.
    pub async fn node_status(
        &self,
        node: usize,
    ) -> Result<(String, String, String, String), String> {
        self.status(&self.url(node)).await
    }

    async fn status(&self, url: &str) -> Result<(String, String, String, String), String> {
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT UPPER(VARIABLE_NAME), VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
             WHERE VARIABLE_NAME IN ('WSREP_READY', 'WSREP_CLUSTER_STATUS', 'WSREP_CLUSTER_SIZE', \
             'WSREP_LOCAL_STATE_COMMENT')",
        )
        .fetch_all(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
        let value = |name: &str| {
            rows.iter()
                .find(|(n, _)| n == name)
                .map_or(String::new(), |(_, v)| v.clone())
        };
        Ok((
            value("WSREP_READY"),
            value("WSREP_CLUSTER_STATUS"),
            value("WSREP_CLUSTER_SIZE"),
            value("WSREP_LOCAL_STATE_COMMENT"),
        ))
    }

    /// The last `lines` lines of a node's error log, for a failure's message.
    pub fn log_tail(&self, node: usize, lines: usize) -> String {
        let log = std::fs::read(self.nodes[node].dir.join("error.log")).unwrap_or_default();
        let log = String::from_utf8_lossy(&log);
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Cuts a node off from the others' group communication (`gmcast.isolate`), as a
    /// partition would: it stays up and answers, outside the primary component (1047).
    pub async fn isolate(&self, node: usize, isolated: bool) {
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(&self.url(node))
            .await
            .unwrap();
        let option = format!("gmcast.isolate={}", u8::from(isolated));
        sqlx::query("SET GLOBAL wsrep_provider_options = ?")
            .bind(option)
            .execute(&mut conn)
            .await
            .unwrap();
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.nodes[node].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed node again: it rejoins and catches up by state transfer.
    pub async fn restart(&mut self, node: usize) {
        self.launch(node, false).await;
        self.wait_until_joined(node, self.nodes.len()).await;
    }
}

impl Drop for PrivateGalera {
    fn drop(&mut self) {
        for node in 0..self.nodes.len() {
            self.kill(node);
            let _ = std::fs::remove_dir_all(&self.nodes[node].dir);
        }
    }
}
