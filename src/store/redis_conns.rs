//! Redis connections, to one server or to a Redis Cluster (several comma-separated URLs in
//! `SECKILL_REDIS_URL`: its seed nodes).
//!
//! One server: one multiplexed connection for the purchase path and a small pool for
//! everything else. A cluster: one cluster connection (redis-rs's, which routes each
//! command by its keys' slot, follows resharding and failovers, and keeps a multiplexed
//! connection per node) for both. Pub/sub goes to one node either way: in a cluster a
//! `PUBLISH` reaches the subscribers of every node.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::{PoolConfig, Runtime, Timeouts};
use futures::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, Value};
use tokio_util::sync::CancellationToken;

use super::STORE_TIMEOUT;
use super::replicas::{Nodes, Replicas, Replication, ShortOfReplicas, WaitRule};

#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("Redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("Redis command failed")]
    Command(#[from] redis::RedisError),
    #[error("no Redis connection available")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("Redis answered something unexpected: {0}")]
    Unexpected(String),
}

/// Runs one Redis call with the store time limit.
pub async fn timed<T, E>(call: impl Future<Output = Result<T, E>>) -> Result<T, RedisError>
where
    RedisError: From<E>,
{
    match tokio::time::timeout(STORE_TIMEOUT, call).await {
        Ok(result) => result.map_err(RedisError::from),
        Err(_) => Err(RedisError::Timeout(STORE_TIMEOUT)),
    }
}

/// Cheap to clone: it is part of every handler's state.
#[derive(Clone)]
pub struct RedisConns {
    servers: Arc<Servers>,
    /// The replicas writes must wait for (`SECKILL_REDIS_WAIT_REPLICAS` ≥ 1).
    replicas: Option<Arc<Replicas>>,
}

enum Servers {
    One {
        /// One multiplexed connection shared by every purchase: commands from all requests
        /// are pipelined on it, with no checkout and no PING per request (a pooled checkout
        /// costs a round trip, measured at about 40% of the purchase path).
        hot: ConnectionManager,
        /// Pooled connections for bulk and background work (warm-up, relay, consumer,
        /// stats), so that a large pipeline never queues ahead of purchases.
        pool: deadpool_redis::Pool,
        client: redis::Client,
    },
    Cluster {
        /// Boxed: it is large, and a single server has nothing like it.
        client: Box<ClusterClient>,
        /// Made at the first use, so a server starts while the cluster is down.
        conn: Renewable,
        /// The seed nodes, for pub/sub (any node will do).
        seeds: Vec<redis::Client>,
    },
}

impl RedisConns {
    /// Builds the connections without touching the network: a server starts while Redis is
    /// down and reports it on `/readyz`; each call then fails fast until Redis is back.
    /// Several comma-separated URLs are the seed nodes of a cluster.
    pub fn new(urls: &str) -> anyhow::Result<Self> {
        let urls: Vec<&str> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        let servers = match urls.as_slice() {
            [] => anyhow::bail!("no Redis URL"),
            [url] => one(url)?,
            seeds => Servers::Cluster {
                client: Box::new(
                    ClusterClient::builder(seeds.iter().copied())
                        .connection_timeout(Duration::from_millis(500))
                        .response_timeout(STORE_TIMEOUT)
                        .build()?,
                ),
                conn: Renewable::default(),
                seeds: seeds
                    .iter()
                    .map(|url| redis::Client::open(*url))
                    .collect::<Result<_, _>>()?,
            },
        };
        Ok(Self {
            servers: Arc::new(servers),
            replicas: None,
        })
    }

    /// Makes writes that must be held by replicas wait for them (`rule.replicas` ≥ 1; 0
    /// changes nothing): see [`RedisConns::replicas_for`].
    pub fn waiting_for(mut self, rule: WaitRule) -> Self {
        if rule.replicas == 0 {
            return self;
        }
        let nodes = match &*self.servers {
            Servers::One { client, .. } => Nodes::One(client.get_connection_info().clone()),
            Servers::Cluster { seeds, .. } => {
                let seeds: Vec<redis::ConnectionInfo> = seeds
                    .iter()
                    .map(|seed| seed.get_connection_info().clone())
                    .collect();
                // Every node is reached as the first seed's URL says (password, TLS).
                let Some(template) = seeds.first().cloned() else {
                    return self;
                };
                Nodes::Cluster { template, seeds }
            }
        };
        self.replicas = Some(Arc::new(Replicas::new(rule, nodes)));
        self
    }

    /// The wait rule, when replicas are asked for.
    pub fn wait_rule(&self) -> Option<&WaitRule> {
        self.replicas.as_deref().map(Replicas::rule)
    }

    /// Taken *before* a write whose replicas must hold it (a grab, a loan, a claim), on
    /// the master serving `key`'s slot; [`Replication::held`] after the write waits for
    /// them. Refused at once, with no unit to take back, while that master has fewer
    /// replicas in step than asked for (under the `refuse` policy).
    pub async fn replicas_for(&self, key: &str) -> Result<Replication, ShortOfReplicas> {
        match &self.replicas {
            Some(replicas) => replicas.before_write(key).await,
            None => Ok(Replication::none()),
        }
    }

    /// Whether the master serving `key` has no replica a failover could promote (none
    /// connected, or the cluster lists none that has not failed): then nothing but the
    /// loss of that master itself can undo its writes. False when no replicas are asked
    /// for.
    pub async fn alone(&self, key: &str) -> bool {
        match &self.replicas {
            Some(replicas) => replicas.alone(key).await,
            None => false,
        }
    }

    /// Whether the master serving `key` has fewer replicas in step than asked for.
    pub async fn short_of_replicas(&self, key: &str) -> bool {
        match &self.replicas {
            Some(replicas) => replicas.short(key).await,
            None => false,
        }
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(*self.servers, Servers::Cluster { .. })
    }

    /// The connection for the purchase path.
    pub async fn hot(&self) -> Result<RedisConn, RedisError> {
        match &*self.servers {
            Servers::One { hot, .. } => Ok(RedisConn::One(hot.clone())),
            Servers::Cluster { .. } => self.cluster().await,
        }
    }

    /// A connection for background work.
    pub async fn bulk(&self) -> Result<RedisConn, RedisError> {
        match &*self.servers {
            Servers::One { pool, .. } => Ok(RedisConn::Pooled(pool.get().await?)),
            Servers::Cluster { .. } => self.cluster().await,
        }
    }

    async fn cluster(&self) -> Result<RedisConn, RedisError> {
        let Servers::Cluster { client, conn, .. } = &*self.servers else {
            return Err(RedisError::Unexpected("not a cluster".into()));
        };
        Ok(RedisConn::Cluster(conn.get(client).await?))
    }

    /// The database number of the URL (keyspace notification channels name it; a
    /// cluster has only database 0).
    pub fn db(&self) -> i64 {
        match &*self.servers {
            Servers::One { client, .. } => client.get_connection_info().redis_settings().db(),
            Servers::Cluster { .. } => 0,
        }
    }

    /// A pub/sub connection: to the server, or to the first seed node that answers.
    pub async fn pubsub(&self) -> Result<redis::aio::PubSub, RedisError> {
        match &*self.servers {
            Servers::One { client, .. } => timed(client.get_async_pubsub()).await,
            Servers::Cluster { seeds, .. } => {
                let mut last = None;
                for seed in seeds {
                    match timed(seed.get_async_pubsub()).await {
                        Ok(pubsub) => return Ok(pubsub),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| RedisError::Unexpected("no seed node".into())))
            }
        }
    }

    /// Listens on a pub/sub channel until shutdown, subscribing again whenever the
    /// connection is lost. `on_message` gets each message, and `None` after every
    /// (re)subscription: messages sent while nobody listened are lost, so the caller should
    /// look for itself then.
    pub async fn listen(
        &self,
        channel: &str,
        shutdown: &CancellationToken,
        mut on_message: impl FnMut(Option<&redis::Msg>),
    ) {
        while !shutdown.is_cancelled() {
            let subscribed = async {
                let mut pubsub = self.pubsub().await?;
                timed(pubsub.subscribe(channel)).await?;
                Ok::<_, RedisError>(pubsub)
            }
            .await;
            match subscribed {
                Ok(pubsub) => {
                    on_message(None);
                    let mut messages = pubsub.into_on_message();
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            message = messages.next() => match message {
                                Some(m) => on_message(Some(&m)),
                                None => break,
                            },
                        }
                    }
                }
                Err(e) => tracing::debug!(channel, error = %e, "cannot subscribe yet"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// `INFO server` of the server that holds `key` (on a cluster, the master of its slot).
    pub async fn server_info_of(&self, key: &str) -> Result<redis::InfoDict, RedisError> {
        let mut info = redis::cmd("INFO");
        info.arg("server");
        match self.bulk().await? {
            RedisConn::Cluster(mut conn) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let value = timed(conn.conn.route_command(info, routing)).await?;
                redis::InfoDict::from_redis_value(value)
                    .map_err(|e| RedisError::Unexpected(format!("INFO server: {e}")))
            }
            mut conn => timed(info.query_async(&mut conn)).await,
        }
    }

    /// `used_memory` and `maxmemory` (0: no limit) of every master, as `INFO memory`
    /// gives them.
    pub async fn memory_of_masters(&self) -> Result<Vec<(u64, u64)>, RedisError> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let dicts = match self.bulk().await? {
            RedisConn::Cluster(mut conn) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                match timed(conn.conn.route_command(info, routing)).await? {
                    Value::Map(by_node) => by_node.into_iter().map(|(_, v)| v).collect(),
                    other => vec![other],
                }
            }
            mut conn => vec![timed(info.query_async::<Value>(&mut conn)).await?],
        };
        dicts
            .into_iter()
            .map(|value| {
                let dict = redis::InfoDict::from_redis_value(value)
                    .map_err(|e| RedisError::Unexpected(format!("INFO memory: {e}")))?;
                let field = |name| dict.get::<u64>(name).unwrap_or(0);
                Ok((field("used_memory"), field("maxmemory")))
            })
            .collect()
    }

    /// Loads a script (its `code`) into the script cache of every server that may run it —
    /// one server, or every master of a cluster — for pipelines of its `EVALSHA`. Not
    /// redis-rs's `SCRIPT LOAD`, which a cluster connection sends to every node it knows,
    /// replicas included: one replica frozen (alive, answering nothing) would fail the load
    /// and whatever waits on it — the release of an item's write lock among them, which
    /// then expires only minutes later.
    pub async fn load_script(&self, code: &str) -> Result<(), RedisError> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(code);
        match self.bulk().await? {
            RedisConn::Cluster(mut conn) => {
                let masters = MultipleNodeRoutingInfo::AllMasters;
                let routing = RoutingInfo::MultiNode((masters, Some(ResponsePolicy::AllSucceeded)));
                timed(conn.conn.route_command(load, routing)).await?;
            }
            mut conn => {
                timed(load.query_async::<Value>(&mut conn)).await?;
            }
        }
        Ok(())
    }

    pub async fn ping(&self) -> Result<(), RedisError> {
        let mut conn = self.hot().await?;
        timed(redis::cmd("PING").query_async::<()>(&mut conn)).await
    }
}

fn one(url: &str) -> anyhow::Result<Servers> {
    let client = redis::Client::open(url)?;
    let hot = ConnectionManager::new_lazy_with_config(
        client.clone(),
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(STORE_TIMEOUT))
            .set_max_delay(Duration::from_secs(1)),
    )?;
    let mut config = deadpool_redis::Config::from_url(url);
    let mut pool = PoolConfig::new(16);
    pool.timeouts = Timeouts {
        wait: Some(STORE_TIMEOUT),
        create: Some(STORE_TIMEOUT),
        recycle: Some(STORE_TIMEOUT),
    };
    config.pool = Some(pool);
    let pool = config.create_pool(Some(Runtime::Tokio1))?;
    Ok(Servers::One { hot, pool, client })
}

/// redis-rs's cluster connection, made at the first use and made anew once stuck.
///
/// After a master was killed and came back as a replica, one was seen to send nothing more
/// to any node: every call timed out, for minutes, until the process restarted. So each
/// call is watched, and a connection that has answered nothing for [`STUCK_FOR`] while
/// asked is dropped; the next call makes a new one, which reads the slots afresh.
#[derive(Default)]
struct Renewable {
    current: std::sync::RwLock<Option<Watched>>,
    making: tokio::sync::Mutex<()>,
}

/// Calls unanswered for this long, with no answer in between, mean a stuck connection.
const STUCK_FOR: Duration = Duration::from_secs(3);

impl Renewable {
    async fn get(&self, client: &ClusterClient) -> Result<Watched, RedisError> {
        if let Some(conn) = self.healthy() {
            return Ok(conn);
        }
        let _making = self.making.lock().await;
        if let Some(conn) = self.healthy() {
            return Ok(conn);
        }
        let conn = Watched {
            conn: timed(client.get_async_connection()).await?,
            waiting_since: Arc::default(),
        };
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    /// The current connection, unless there is none or it is stuck (then it is dropped).
    fn healthy(&self) -> Option<Watched> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        let conn = current.as_ref()?;
        if !conn.stuck() {
            return Some(conn.clone());
        }
        drop(current);
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(Watched::stuck) {
            tracing::warn!(
                "the Redis Cluster connection answered nothing for {STUCK_FOR:?}; making a new one"
            );
            *current = None;
        }
        None
    }
}

/// A cluster connection that notes when it was first asked without an answer since.
#[derive(Clone)]
pub struct Watched {
    conn: ClusterConnection,
    waiting_since: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl Watched {
    fn stuck(&self) -> bool {
        let since = self.waiting_since.lock().unwrap_or_else(|e| e.into_inner());
        since.is_some_and(|since| since.elapsed() >= STUCK_FOR)
    }

    fn asked(&self) {
        let mut since = self.waiting_since.lock().unwrap_or_else(|e| e.into_inner());
        since.get_or_insert_with(std::time::Instant::now);
    }

    /// Any answer from a node, an error reply included, shows the connection works.
    fn answered<T>(
        waiting_since: &std::sync::Mutex<Option<std::time::Instant>>,
        result: redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let heard = match &result {
            Ok(_) => true,
            Err(e) => !(e.is_timeout() || e.is_io_error() || e.is_connection_dropped()),
        };
        if heard {
            *waiting_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        result
    }
}

impl ConnectionLike for Watched {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.asked();
        let waiting_since = self.waiting_since.clone();
        let call = self.conn.req_packed_command(cmd);
        Box::pin(async move { Watched::answered(&waiting_since, call.await) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.asked();
        let waiting_since = self.waiting_since.clone();
        let call = self.conn.req_packed_commands(pipeline, offset, count);
        Box::pin(async move { Watched::answered(&waiting_since, call.await) })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// A connection of either kind; commands and pipelines go through it alike.
pub enum RedisConn {
    One(ConnectionManager),
    Pooled(deadpool_redis::Connection),
    Cluster(Watched),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::One(conn) => conn.req_packed_command(cmd),
            RedisConn::Pooled(conn) => conn.req_packed_command(cmd),
            RedisConn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::One(conn) => conn.req_packed_commands(pipeline, offset, count),
            RedisConn::Pooled(conn) => conn.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::One(conn) => conn.get_db(),
            RedisConn::Pooled(conn) => conn.get_db(),
            RedisConn::Cluster(conn) => conn.get_db(),
        }
    }
}
