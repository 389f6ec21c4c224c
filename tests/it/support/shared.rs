//! Where the machine's shared services are, a Redis connection to them (one server or a
//! cluster), a look at a queue's depth, and the tests' log set-up.

use std::net::SocketAddr;
use std::time::Duration;

/// Where the machine's shared services are (overridable like the server's own settings).
fn shared(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

pub fn redis_url() -> String {
    shared("SECKILL_REDIS_URL", "redis://127.0.0.1:6379")
}

pub fn mysql_server_url() -> String {
    shared("SECKILL_TEST_MYSQL", "mysql://root@127.0.0.1:3306")
}

/// The shared Redis as a socket address (for a proxy in front of it).
pub fn redis_addr() -> SocketAddr {
    let url = url::Url::parse(&redis_url()).unwrap();
    format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(6379))
        .parse()
        .unwrap()
}

pub fn amqp_url() -> String {
    shared("SECKILL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
}

/// The MariaDB server the tests use, as a socket address (for a proxy in front of it).
pub fn mysql_addr() -> SocketAddr {
    socket_addr(&mysql_server_url(), 3306)
}

/// The RabbitMQ the tests use, as a socket address (for a proxy in front of it).
pub fn amqp_addr() -> SocketAddr {
    socket_addr(&amqp_url(), 5672)
}

/// A store URL's host and port (`default_port` when it names none).
fn socket_addr(url: &str, default_port: u16) -> SocketAddr {
    let url = url::Url::parse(url).unwrap();
    format!(
        "{}:{}",
        url.host_str().unwrap(),
        url.port().unwrap_or(default_port)
    )
    .parse()
    .unwrap()
}

/// A test's own connection to the Redis its servers use: one server, or a cluster.
#[derive(Clone)]
pub enum TestRedis {
    One(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl TestRedis {
    pub(super) async fn connect(urls: &str) -> Self {
        Self::try_connect(urls)
            .await
            .unwrap_or_else(|e| panic!("Redis at {urls}: {e}"))
    }

    /// One server's URL, or a cluster's nodes comma-separated.
    pub(super) async fn try_connect(urls: &str) -> redis::RedisResult<Self> {
        let urls: Vec<&str> = urls.split(',').collect();
        if let [url] = urls.as_slice() {
            let client = redis::Client::open(*url)?;
            Ok(Self::One(client.get_multiplexed_async_connection().await?))
        } else {
            let client = redis::cluster::ClusterClient::new(urls)?;
            Ok(Self::Cluster(client.get_async_connection().await?))
        }
    }
}

impl redis::aio::ConnectionLike for TestRedis {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::One(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::One(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::One(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

/// Messages ready in a queue (declared passively; `None` while it does not exist).
pub async fn queue_depth(queue: &str) -> Option<u32> {
    queue_depth_on(&amqp_url(), queue).await
}

/// [`queue_depth`] on another broker (a private one), or on a cluster: `amqp` may list
/// its nodes comma-separated, and the first that answers tells.
pub async fn queue_depth_on(amqp: &str, queue: &str) -> Option<u32> {
    for node in amqp.split(',') {
        // Unknown after five seconds: the fleet soak's checker once waited forever on a
        // RabbitMQ node just healed from a partition, and in another soak one node could
        // not tell for a whole minute while the others could.
        let depth = tokio::time::timeout(Duration::from_secs(5), look_at_queue(node, queue))
            .await
            .ok()
            .flatten();
        if depth.is_some() {
            return depth;
        }
        eprintln!("queue depth: no answer from {node}");
    }
    None
}

async fn look_at_queue(amqp: &str, queue: &str) -> Option<u32> {
    let conn = lapin::Connection::connect(amqp, Default::default())
        .await
        .ok()?;
    let channel = conn.create_channel().await.ok()?;
    let declared = channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await;
    let _ = conn.close(200, "bye".into()).await;
    declared.ok().map(|q| q.message_count())
}

pub(super) fn init_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Quiet unless asked: `RUST_LOG=info cargo test` shows the servers' logs.
        if std::env::var("RUST_LOG").is_ok() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
    });
}
