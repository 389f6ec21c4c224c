//! A MariaDB Galera cluster as the order store: `SECKILL_DATABASE_URL` lists its nodes,
//! comma-separated. Every node takes writes, but two servers writing the same rows through
//! two nodes meet only at commit, as certification failures; so the pool writes through
//! one node at a time and moves to the next when that one stops answering or leaves the
//! primary component (a node cut off into a minority answers every query with error 1047,
//! "WSREP has not yet prepared node for application use").
//!
//! Every instance prefers the node listed first: one that moved away (the node did not
//! answer a check in time, say, on a loaded host) moves back once the earlier node has
//! answered ready for [`BACK_AFTER_CHECKS`] checks in a row. Without that, instances that
//! moved on a brief fault of their own wrote through different nodes for good, and met as
//! certification failures on every row they shared.
//!
//! The move is the pool's own: new connections go to the chosen node
//! (`Pool::set_connect_options`), connections opened before the move are closed when next
//! taken or given back, and a connection is only ever opened to a node that is ready. A
//! statement cut off by the move fails like any MySQL error and is retried by its caller as
//! today (the order insert and every status change are idempotent); a commit that lost a
//! certification conflict answers 1213, which is retried like a deadlock.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::BoxFuture;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};
use sqlx::pool::PoolConnectionMetadata;
use sqlx::{ConnectOptions, Connection, MySqlPool};

/// How often the node written through is checked.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How long a node has to connect and answer a check.
const CHECK_WITHIN: Duration = Duration::from_secs(1);
/// Checks in a row (5 s) an earlier-listed node must answer ready before the pool moves
/// back to it: a node that flaps does not pull the pool to and fro.
const BACK_AFTER_CHECKS: u32 = 10;

/// The nodes, and which one is written through.
struct Nodes {
    nodes: Vec<MySqlConnectOptions>,
    /// The node written through, and when the pool moved to it.
    current: Mutex<(usize, Instant)>,
}

impl Nodes {
    fn current(&self) -> (usize, Instant) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a connection was opened after the pool last moved, so to the node written
    /// through.
    fn opened_since_move(&self, meta: &PoolConnectionMetadata) -> bool {
        meta.age < self.current().1.elapsed()
    }

    fn name(&self, node: usize) -> String {
        let options = &self.nodes[node];
        format!("{}:{}", options.get_host(), options.get_port())
    }
}

/// Parses the URLs: each a MySQL URL naming the same database (the nodes hold one copy).
pub fn parse(urls: &[&str]) -> anyhow::Result<Vec<MySqlConnectOptions>> {
    let nodes = urls
        .iter()
        .enumerate()
        .map(|(i, url)| {
            MySqlConnectOptions::from_str(url).with_context(|| {
                format!(
                    "SECKILL_DATABASE_URL: URL {} of {} is not a MySQL URL",
                    i + 1,
                    urls.len()
                )
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let database = nodes[0].get_database().unwrap_or_default();
    if let Some(other) = nodes
        .iter()
        .find(|n| n.get_database().unwrap_or_default() != database)
    {
        anyhow::bail!(
            "SECKILL_DATABASE_URL: the URLs of a Galera cluster's nodes must name one database \
             ({database:?} and {:?})",
            other.get_database().unwrap_or_default()
        );
    }
    Ok(nodes)
}

/// A pool writing through the first ready node, moving to another whenever the one written
/// through is not ready; the watch runs until the pool is closed.
pub async fn connect(
    nodes: Vec<MySqlConnectOptions>,
    pool: MySqlPoolOptions,
) -> anyhow::Result<MySqlPool> {
    let mut first = None;
    let mut refusals = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        match ready_node(node).await {
            Ok(()) => {
                first = Some(i);
                break;
            }
            Err(why) => refusals.push(why),
        }
    }
    let Some(first) = first else {
        anyhow::bail!(
            "no node of the Galera cluster is ready: {}",
            refusals.join("; ")
        );
    };
    let nodes = Arc::new(Nodes {
        current: Mutex::new((first, Instant::now())),
        nodes,
    });
    let pool = pool
        .after_connect(|conn, _| {
            Box::pin(async move {
                ready(conn).await.map_err(sqlx::Error::Protocol)?;
                // Galera applies other nodes' writes after it certifies them: a read after
                // a move waits until this node has applied every write committed before it.
                sqlx::query("SET SESSION wsrep_sync_wait = 1")
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .before_acquire(opened_since_move(nodes.clone()))
        .after_release({
            let nodes = nodes.clone();
            move |conn, meta| {
                let fresh = nodes.opened_since_move(&meta);
                Box::pin(async move {
                    // One opened before the move is closed, its node not asked.
                    if !fresh {
                        return Ok(false);
                    }
                    super::given_back::answers_in_time(conn).await
                })
            }
        })
        .connect_with(nodes.nodes[first].clone())
        .await
        .with_context(|| format!("cannot connect to MySQL at {}", nodes.name(first)))?;
    tracing::info!(node = %nodes.name(first), nodes = nodes.nodes.len(), "writing through this node of the Galera cluster");
    tokio::spawn(watch(pool.clone(), nodes));
    Ok(pool)
}

/// [`Nodes::opened_since_move`] for `before_acquire`, which closes the connection otherwise.
fn opened_since_move(
    nodes: Arc<Nodes>,
) -> impl for<'c> Fn(
    &'c mut MySqlConnection,
    PoolConnectionMetadata,
) -> BoxFuture<'c, Result<bool, sqlx::Error>>
+ Send
+ Sync
+ 'static {
    move |_, meta| Box::pin(std::future::ready(Ok(nodes.opened_since_move(&meta))))
}

/// Checks the node written through every [`CHECK_EVERY`]; when it is not ready, moves the
/// pool to the next node (in the order listed) that is. While it is not the first listed,
/// checks the nodes listed before it too, and moves back to the first of them that stayed
/// ready for [`BACK_AFTER_CHECKS`] checks in a row.
async fn watch(pool: MySqlPool, nodes: Arc<Nodes>) {
    let count = nodes.nodes.len();
    let mut way_back = WayBack::default();
    while !pool.is_closed() {
        tokio::time::sleep(CHECK_EVERY).await;
        let (current, _) = nodes.current();
        let to = match ready_node(&nodes.nodes[current]).await {
            Err(why) => {
                let mut to = None;
                for next in (1..count).map(|step| (current + step) % count) {
                    if ready_node(&nodes.nodes[next]).await.is_ok() {
                        to = Some((next, why));
                        break;
                    }
                }
                to
            }
            Ok(()) => {
                let mut ready = Vec::with_capacity(current);
                for earlier in &nodes.nodes[..current] {
                    ready.push(ready_node(earlier).await.is_ok());
                }
                way_back.note(&ready).map(|back| {
                    (
                        back,
                        format!(
                            "{} ready again for {} checks in a row",
                            nodes.name(back),
                            BACK_AFTER_CHECKS
                        ),
                    )
                })
            }
        };
        if let Some((to, why)) = to {
            pool.set_connect_options(nodes.nodes[to].clone());
            *nodes.current.lock().unwrap_or_else(|e| e.into_inner()) = (to, Instant::now());
            way_back = WayBack::default();
            tracing::warn!(from = %nodes.name(current), to = %nodes.name(to), reason = %why, "writing through another node of the Galera cluster");
        }
    }
}

/// For the nodes listed before the one written through: how many checks in a row each
/// answered ready.
#[derive(Default)]
struct WayBack {
    streaks: Vec<u32>,
}

impl WayBack {
    /// Notes a check of the nodes listed before the one written through (`ready[i]`:
    /// whether node `i` answered ready). Returns the first of them ready for
    /// [`BACK_AFTER_CHECKS`] checks in a row, if one is.
    fn note(&mut self, ready: &[bool]) -> Option<usize> {
        self.streaks.resize(ready.len(), 0);
        for (streak, ready) in self.streaks.iter_mut().zip(ready) {
            *streak = if *ready { *streak + 1 } else { 0 };
        }
        self.streaks
            .iter()
            .position(|streak| *streak >= BACK_AFTER_CHECKS)
    }
}

/// Whether a node can be written through: it answers within [`CHECK_WITHIN`] and is ready
/// in the primary component; otherwise why not.
async fn ready_node(node: &MySqlConnectOptions) -> Result<(), String> {
    let name = format!("{}:{}", node.get_host(), node.get_port());
    let check = async {
        let mut conn = node.connect().await.map_err(|e| e.to_string())?;
        let outcome = ready(&mut conn).await;
        let _ = conn.close().await;
        outcome
    };
    match tokio::time::timeout(CHECK_WITHIN, check).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(why)) => Err(format!("{name}: {why}")),
        Err(_) => Err(format!("{name}: no answer within {CHECK_WITHIN:?}")),
    }
}

/// Whether the node a connection is on is a Galera node, ready, in the primary component.
async fn ready(conn: &mut MySqlConnection) -> Result<(), String> {
    let status: Vec<(String, String)> = sqlx::query_as(
        "SELECT UPPER(VARIABLE_NAME), VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
         WHERE VARIABLE_NAME IN ('WSREP_READY', 'WSREP_CLUSTER_STATUS')",
    )
    .fetch_all(conn)
    .await
    .map_err(|e| e.to_string())?;
    let value = |name: &str| {
        status
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    };
    match (value("WSREP_READY"), value("WSREP_CLUSTER_STATUS")) {
        ("ON", "Primary") => Ok(()),
        ("", "") => {
            Err("not a Galera node (several URLs must be one Galera cluster's nodes)".into())
        }
        (ready, component) => Err(format!(
            "not ready (wsrep_ready {ready}, cluster status {component})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_moves_back_to_an_earlier_node_once_it_stayed_ready() {
        let mut way_back = WayBack::default();
        // Written through node 2: node 0 is down, node 1 comes back.
        for _ in 1..BACK_AFTER_CHECKS {
            assert_eq!(way_back.note(&[false, true]), None);
        }
        // A single miss starts node 1's count again.
        assert_eq!(way_back.note(&[false, false]), None);
        for _ in 1..BACK_AFTER_CHECKS {
            assert_eq!(way_back.note(&[true, true]), None);
        }
        assert_eq!(
            way_back.note(&[true, true]),
            Some(0),
            "the first listed first"
        );
        // On the first node there is nothing to go back to.
        assert_eq!(WayBack::default().note(&[]), None);
    }
}
