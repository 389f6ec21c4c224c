//! One test's private world: its own namespace (Redis keys, RabbitMQ exchanges and
//! queues) and its own MySQL database on the machine's shared services, with the calls a
//! test makes of its servers; everything is removed on drop (also when the test fails).

use std::net::SocketAddr;
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use serde_json::{Value, json};
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use seckill::auth::Jwt;
use seckill::broker::Topology;
use seckill::config::Secret;
use seckill::domain::{ItemId, Stock, UserId};
use seckill::invariants::{self, InRedis, Orders, Outcome};
use seckill::keys::{ItemKeys, Keys};
use seckill::orders::repo::OrderStatus;
use seckill::{Role, Server, Settings};

use super::server::{TestServer, buy};
use super::wait::eventually;

pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const ALL_ROLES: &[Role] = &[Role::Api, Role::Consumer, Role::Scheduler];

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
    async fn connect(urls: &str) -> Self {
        Self::try_connect(urls)
            .await
            .unwrap_or_else(|e| panic!("Redis at {urls}: {e}"))
    }

    /// One server's URL, or a cluster's nodes comma-separated.
    async fn try_connect(urls: &str) -> redis::RedisResult<Self> {
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

/// One test's private world.
pub struct TestEnv {
    pub settings: Settings,
    pub db: MySqlPool,
    /// The Redis the servers use (the shared one, or a private cluster).
    pub redis: TestRedis,
    pub http: reqwest::Client,
    jwt: Jwt,
    namespace: String,
    database: String,
    mysql_server: String,
}

impl TestEnv {
    pub async fn new(name: &str) -> Self {
        Self::on_mysql(name, &mysql_server_url()).await
    }

    /// [`TestEnv::new`] with its database on another MySQL server (a private one).
    pub async fn on_mysql(name: &str, mysql_server: &str) -> Self {
        Self::on(name, mysql_server, &redis_url()).await
    }

    /// [`TestEnv::new`] with its database on a Galera cluster (`nodes`: the servers' URLs):
    /// the servers, and the test's own checks, get one URL per node.
    pub async fn on_galera(name: &str, nodes: &[String]) -> Self {
        Self::on(name, &nodes.join(","), &redis_url()).await
    }

    /// [`TestEnv::new`] on stores of its own (a fleet's): a MySQL server, a Redis and a
    /// RabbitMQ by URL.
    pub async fn on_stores(name: &str, mysql_server: &str, redis: &str, amqp: &str) -> Self {
        let mut env = Self::on(name, mysql_server, redis).await;
        env.settings.amqp_url = Secret::new(amqp);
        env
    }

    /// [`TestEnv::new`] on a Redis Cluster (`seeds`: its nodes' URLs, comma-separated).
    pub async fn on_redis_cluster(name: &str, seeds: &str) -> Self {
        Self::on(name, &mysql_server_url(), seeds).await
    }

    async fn on(name: &str, mysql_server: &str, redis: &str) -> Self {
        init_logs();
        let suffix = ulid::Ulid::new().to_string().to_lowercase();
        let namespace = format!("t_{name}_{}", &suffix[16..]);
        let database = namespace.clone();
        let mut settings = Settings::from_env().expect("settings from the environment");
        settings.namespace = namespace.clone();
        // One URL per server (several: a Galera cluster's nodes), each naming the database.
        let urls: Vec<String> = mysql_server
            .split(',')
            .map(|server| format!("{server}/{database}"))
            .collect();
        settings.database_url = Secret::new(urls.join(","));
        settings.redis_url = Secret::new(redis);
        settings.amqp_url = Secret::new(amqp_url());
        settings.http_addr = "127.0.0.1:0".parse().unwrap();
        settings.admin_token = Some(Secret::new(ADMIN_TOKEN));
        settings.jwt_secret = Secret::new(format!("secret-{namespace}"));

        let db = seckill::store::connect_mysql(settings.database_url.expose())
            .await
            .unwrap_or_else(|e| {
                panic!("MariaDB at {mysql_server} (see docs/testing.md: ./dev/services.sh): {e:#}")
            });
        seckill::store::migrate(&db).await.expect("migrations");
        let redis = TestRedis::connect(redis).await;
        Self {
            jwt: Jwt::new(&settings.jwt_secret),
            settings,
            db,
            redis,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(512)
                .build()
                .unwrap(),
            namespace,
            database,
            // The clean-up drops the database through the first (Galera replicates it).
            mysql_server: mysql_server
                .split(',')
                .next()
                .unwrap_or_default()
                .to_owned(),
        }
    }

    pub async fn server(&self, roles: &[Role]) -> TestServer {
        self.server_with(roles, |_| {}).await
    }

    pub async fn server_with(
        &self,
        roles: &[Role],
        adjust: impl FnOnce(&mut Settings),
    ) -> TestServer {
        let mut settings = self.settings.clone();
        adjust(&mut settings);
        let server = Server::build(settings, roles).await.expect("server starts");
        let (addr, admin_addr) = (server.addr(), server.admin_addr());
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(server.run(shutdown.clone()));
        TestServer {
            addr,
            admin_addr,
            shutdown,
            handle: Some(handle),
        }
    }

    pub fn token(&self, user: u64) -> String {
        self.jwt
            .mint(UserId::new(user), Duration::from_secs(600))
            .unwrap()
    }

    pub async fn warmup(&self, server: &TestServer, id: u64) -> Value {
        let response = self
            .admin(
                reqwest::Method::POST,
                server,
                &format!("/admin/items/{id}/warmup"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "warmup");
        response.json().await.unwrap()
    }

    /// `POST path` as `user` (pay, cancel): status and JSON body.
    pub async fn post_as(&self, server: &TestServer, path: &str, user: u64) -> (u16, Value) {
        let response = self
            .http
            .post(server.url(path))
            .bearer_auth(self.token(user))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Status of an order in MySQL (`None`: not there).
    pub async fn order_status(&self, order_sn: &str) -> Option<String> {
        sqlx::query_scalar("SELECT status FROM orders WHERE order_sn = ?")
            .bind(order_sn)
            .fetch_optional(&self.db)
            .await
            .unwrap()
    }

    /// Units listed in Redis, over every bucket of the item (waves still to come among
    /// them).
    pub async fn remaining(&self, item: u64) -> u64 {
        self.in_redis(item).await.remaining
    }

    /// The item's units listed and orders pending in Redis, over its buckets (one command
    /// a key: a cluster's client follows a moved slot for those).
    pub async fn in_redis(&self, item: u64) -> InRedis {
        let (buckets,): (u8,) = sqlx::query_as("SELECT buckets FROM items WHERE id = ?")
            .bind(item)
            .fetch_one(&self.db)
            .await
            .unwrap();
        let keys = self.keys();
        let mut held = InRedis {
            remaining: 0,
            pending: 0,
        };
        for stock in Stock::all(ItemId::new(item).expect("an item id"), buckets) {
            let keys = keys.stock(stock);
            let listed: u64 = self.redis.clone().llen(keys.tokens).await.unwrap();
            let pending: u64 = self.redis.clone().hlen(keys.pending).await.unwrap();
            held.remaining += listed;
            held.pending += pending;
        }
        held
    }

    pub fn admin(
        &self,
        method: reqwest::Method,
        server: &TestServer,
        path: &str,
    ) -> reqwest::RequestBuilder {
        self.http
            .request(method, server.url(path))
            .bearer_auth(ADMIN_TOKEN)
    }

    /// The server's `/metrics` text.
    pub async fn metrics_text(&self, server: &TestServer) -> String {
        let response = self.http.get(server.url("/metrics")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    }

    /// `GET path` with the admin token: status and JSON body.
    pub async fn admin_get(&self, server: &TestServer, path: &str) -> (u16, Value) {
        let response = self
            .admin(reqwest::Method::GET, server, path)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// `POST path` with the admin token: status and JSON body.
    pub async fn admin_post(&self, server: &TestServer, path: &str) -> (u16, Value) {
        let response = self
            .admin(reqwest::Method::POST, server, path)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Deletes every Redis key of this test's namespace: what this deployment sees of a
    /// Redis that lost its data (the shared Redis itself is never flushed).
    pub async fn lose_redis_state(&self) {
        let mut redis = self.redis.clone();
        let keys: Vec<String> = redis.keys(format!("{}:*", self.namespace)).await.unwrap();
        if !keys.is_empty() {
            redis.del::<_, ()>(keys).await.unwrap();
        }
    }

    pub async fn stats(&self, server: &TestServer, id: u64) -> Value {
        self.admin(
            reqwest::Method::GET,
            server,
            &format!("/admin/items/{id}/stats"),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
    }

    /// `POST /api/flashbuy` as `user`.
    pub async fn buy(&self, server: &TestServer, user: u64, item: u64) -> (u16, Value) {
        buy(&self.http, server.addr, &self.token(user), item).await
    }

    /// A purchase request ready to send (token, client time, body), for tests that add to it.
    pub fn purchase(&self, server: &TestServer, user: u64, item: u64) -> reqwest::RequestBuilder {
        self.http
            .post(server.url("/api/flashbuy"))
            .bearer_auth(self.token(user))
            .header("x-client-time", Utc::now().timestamp_millis().to_string())
            .json(&json!({ "item_id": item }))
    }

    /// `GET path`, as `user` when given: status and JSON body.
    pub async fn get(&self, server: &TestServer, path: &str, user: Option<u64>) -> (u16, Value) {
        let mut request = self.http.get(server.url(path));
        if let Some(user) = user {
            request = request.bearer_auth(self.token(user));
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Orders in MySQL for an item.
    pub async fn orders(&self, item: u64) -> Vec<(String, u64, String)> {
        sqlx::query_as("SELECT order_sn, user_id, status FROM orders WHERE item_id = ?")
            .bind(item)
            .fetch_all(&self.db)
            .await
            .unwrap()
    }

    /// Waits (up to `limit`) until MySQL has `expected` orders for the item and nothing is
    /// pending in Redis.
    pub async fn wait_for_orders(
        &self,
        server: &TestServer,
        item: u64,
        expected: usize,
        limit: Duration,
    ) {
        eventually(limit, "every order in MySQL", || async {
            let stats = self.stats(server, item).await;
            let in_mysql = self.orders(item).await.len();
            if in_mysql == expected && stats["pending"] == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{in_mysql} orders in MySQL (want {expected}); stats {stats}"
                ))
            }
        })
        .await;
    }

    /// docs/contract.md section 7, invariants 1 to 4, for a quiescent item, judged by
    /// `seckill::invariants` (as `seckill rehearse` judges a rehearsal) from every row in
    /// MySQL and the stock in Redis: `won` are the order numbers of every `202` the test
    /// saw. Then the server's own stats must agree.
    pub async fn assert_invariants(
        &self,
        server: &TestServer,
        item: u64,
        total: u32,
        won: &[String],
    ) {
        let orders = self.order_facts(item, total, won).await;
        let stock = self.in_redis(item).await;
        let broken: Vec<_> = invariants::judge(&stock, &orders, won, &[], Duration::ZERO)
            .into_iter()
            .filter(|check| check.outcome == Outcome::Broken)
            .map(|check| format!("{}. {}: {}", check.number, check.name, check.detail))
            .collect();
        assert!(broken.is_empty(), "invariants broken: {broken:#?}");
        let stats = self.stats(server, item).await;
        assert_eq!(stats["consistent"], true, "stats: {stats}");
        assert_eq!(stats["pending"], 0, "stats: {stats}");
    }

    /// The item's orders in MySQL as `seckill::invariants` judges them: `total` units,
    /// `answered` the order numbers of every `202` seen.
    pub async fn order_facts(&self, item: u64, total: u32, answered: &[String]) -> Orders {
        let rows = self.orders(item).await;
        let (per_user,): (u8,) = sqlx::query_as("SELECT per_user FROM items WHERE id = ?")
            .bind(item)
            .fetch_one(&self.db)
            .await
            .unwrap();
        let rows = rows.iter().map(|(sn, user, status)| {
            let status = OrderStatus::try_from(status.clone()).expect("an order status");
            (sn.as_str(), *user, status)
        });
        Orders::from_rows(total.into(), per_user, rows, answered, &[])
    }

    /// This environment's settings as the variables a `seckill` process reads.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let s = &self.settings;
        vec![
            ("SECKILL_NAMESPACE", s.namespace.clone()),
            ("SECKILL_DATABASE_URL", s.database_url.expose().to_owned()),
            ("SECKILL_REDIS_URL", s.redis_url.expose().to_owned()),
            ("SECKILL_AMQP_URL", s.amqp_url.expose().to_owned()),
            ("SECKILL_JWT_SECRET", s.jwt_secret.expose().to_owned()),
            ("SECKILL_ADMIN_TOKEN", ADMIN_TOKEN.to_owned()),
            ("SECKILL_HTTP_ADDR", "127.0.0.1:0".to_owned()),
        ]
    }

    /// This test's database, reached through `proxy` (a [`TcpProxy`] in front of MariaDB).
    /// The test's database name.
    pub fn database(&self) -> &str {
        &self.database
    }

    pub fn database_url_via(&self, proxy: SocketAddr) -> seckill::config::Secret {
        seckill::config::Secret::new(format!("mysql://root@{proxy}/{}", self.database))
    }

    /// Every Redis key this test's servers use, as the server builds them.
    pub fn keys(&self) -> Keys {
        Keys::new(&self.namespace)
    }

    /// An unsplit item's whole stock.
    pub fn stock(&self, item: u64) -> Stock {
        Stock::whole(ItemId::new(item).expect("an item id"))
    }

    /// An unsplit item's Redis keys.
    pub fn item_keys(&self, item: u64) -> ItemKeys {
        self.keys().stock(self.stock(item))
    }

    pub fn topology(&self) -> Topology {
        Topology::new(&self.namespace)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // On the stores this environment used (a fleet's, a private cluster's, or the
        // machine's): a fleet soak once left hundreds of sales' quorum queues on its
        // RabbitMQ by cleaning up on the machine's broker instead.
        let stores = Stores {
            namespace: self.namespace.clone(),
            database: self.database.clone(),
            mysql: self.mysql_server.clone(),
            redis: self.settings.redis_url.expose().to_owned(),
            amqp: self.settings.amqp_url.expose().to_owned(),
        };
        // Async clean-up from a synchronous Drop: on a thread with its own runtime.
        let cleaned = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(cleanup(&stores)))
        })
        .join();
        if !matches!(cleaned, Ok(Ok(()))) {
            eprintln!("test clean-up failed for {}", self.namespace);
        }
    }
}

/// What a [`TestEnv`] made, and where: each store's URL (several, comma-separated, for a
/// cluster's nodes).
struct Stores {
    namespace: String,
    database: String,
    mysql: String,
    redis: String,
    amqp: String,
}

/// How long clean-up waits for one store's node (a fleet's node may be cut off).
const CLEANUP_WAIT: Duration = Duration::from_secs(5);

async fn cleanup(stores: &Stores) {
    let Stores {
        namespace,
        database,
        ..
    } = stores;
    // The test's database and any it made beside it (`{database}_…`), through the first
    // node that answers (a Galera cluster replicates the drop).
    for server in stores.mysql.split(',') {
        let Ok(Ok(pool)) = tokio::time::timeout(CLEANUP_WAIT, MySqlPool::connect(server)).await
        else {
            continue;
        };
        let like = format!("{}%", database.replace('_', "\\_"));
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE ?",
        )
        .bind(like)
        .fetch_all(&pool)
        .await
        .unwrap_or_default();
        for name in names {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS `{name}`"
            )))
            .execute(&pool)
            .await;
        }
        break;
    }
    let _ = tokio::time::timeout(CLEANUP_WAIT, delete_keys(&stores.redis, namespace)).await;
    for node in stores.amqp.split(',') {
        let connecting = lapin::Connection::connect(node, Default::default());
        let Ok(Ok(conn)) = tokio::time::timeout(CLEANUP_WAIT, connecting).await else {
            continue;
        };
        if let Ok(channel) = conn.create_channel().await {
            let t = Topology::new(namespace);
            for queue in [&t.orders_queue, &t.dead_queue] {
                let _ = channel
                    .queue_delete(queue.as_str().into(), Default::default())
                    .await;
            }
            for exchange in [&t.orders_exchange, &t.dead_exchange, &t.events_exchange] {
                let _ = channel
                    .exchange_delete(exchange.as_str().into(), Default::default())
                    .await;
            }
        }
        let _ = tokio::time::timeout(CLEANUP_WAIT, conn.close(200, "bye".into())).await;
        break;
    }
}

/// Deletes the namespace's keys: on one Redis, or on every master of a cluster (`urls`
/// comma-separated; KEYS asks every master, DEL splits by slot).
async fn delete_keys(urls: &str, namespace: &str) {
    let Ok(mut conn) = TestRedis::try_connect(urls).await else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{namespace}:*"))
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    if !keys.is_empty() {
        let _: Result<(), _> = redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
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

fn init_logs() {
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
