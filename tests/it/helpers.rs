//! The test harness: every test gets its own namespace (Redis keys, RabbitMQ exchanges and
//! queues) and its own MySQL database, starts real servers on port 0 against the machine's
//! Redis, MariaDB and RabbitMQ, and cleans everything up afterwards (also when it fails).

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde_json::{Value, json};
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use seckill::auth::Jwt;
use seckill::broker::Topology;
use seckill::config::Secret;
use seckill::domain::UserId;
use seckill::{Role, Server, Settings};

pub use crate::private::*;

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

/// A test's own connection to the Redis its servers use: one server, or a cluster.
#[derive(Clone)]
pub enum TestRedis {
    One(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl TestRedis {
    async fn connect(urls: &str) -> Self {
        let urls: Vec<&str> = urls.split(',').collect();
        if let [url] = urls.as_slice() {
            let conn = redis::Client::open(*url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap_or_else(|e| panic!("Redis at {url}: {e}"));
            Self::One(conn)
        } else {
            let conn = redis::cluster::ClusterClient::new(urls)
                .unwrap()
                .get_async_connection()
                .await
                .expect("the Redis Cluster");
            Self::Cluster(conn)
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
        settings.database_url = Secret::new(format!("{mysql_server}/{database}"));
        settings.redis_url = Secret::new(redis);
        settings.amqp_url = Secret::new(amqp_url());
        settings.http_addr = "127.0.0.1:0".parse().unwrap();
        settings.admin_token = Some(Secret::new(ADMIN_TOKEN));
        settings.jwt_secret = Secret::new(format!("secret-{namespace}"));

        let db = seckill::store::connect_mysql(settings.database_url.expose())
            .await
            .unwrap_or_else(|e| {
                panic!("MariaDB at {mysql_server} (see README: ./dev/services.sh): {e:#}")
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
            mysql_server: mysql_server.to_owned(),
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

    /// `PUT /admin/items/{id}` with a sale window open now for an hour.
    pub async fn create_item(&self, server: &TestServer, id: u64, total: u32) -> Value {
        self.create_item_paying_within(server, id, total, 1800)
            .await
    }

    /// [`TestEnv::create_item`] with a pay timeout.
    pub async fn create_item_paying_within(
        &self,
        server: &TestServer,
        id: u64,
        total: u32,
        pay_timeout_s: u32,
    ) -> Value {
        let now = Utc::now();
        self.put_item_paying_within(
            server,
            id,
            total,
            now - chrono::Duration::seconds(5),
            now + chrono::Duration::hours(1),
            pay_timeout_s,
        )
        .await
    }

    pub async fn put_item(
        &self,
        server: &TestServer,
        id: u64,
        total: u32,
        start_at: DateTime<Utc>,
        end_at: DateTime<Utc>,
    ) -> Value {
        self.put_item_paying_within(server, id, total, start_at, end_at, 1800)
            .await
    }

    /// [`TestEnv::put_item`] with a pay timeout.
    pub async fn put_item_paying_within(
        &self,
        server: &TestServer,
        id: u64,
        total: u32,
        start_at: DateTime<Utc>,
        end_at: DateTime<Utc>,
        pay_timeout_s: u32,
    ) -> Value {
        let response = self
            .admin(reqwest::Method::PUT, server, &format!("/admin/items/{id}"))
            .json(&json!({
                "name": format!("item {id}"),
                "shop_id": 1,
                "total": total,
                "start_at": start_at,
                "end_at": end_at,
                "price_cents": 1999,
                "pay_timeout_s": pay_timeout_s,
            }))
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "PUT item: {}",
            response.status()
        );
        response.json().await.unwrap()
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

    /// An item created and loaded, on sale now.
    pub async fn item_on_sale(&self, server: &TestServer, id: u64, total: u32) {
        self.create_item(server, id, total).await;
        self.warmup(server, id).await;
    }

    /// An item on sale now for an hour whose orders must be paid within `pay_timeout_s`.
    pub async fn item_paying_within(
        &self,
        server: &TestServer,
        id: u64,
        total: u32,
        pay_timeout_s: u32,
    ) {
        self.create_item_paying_within(server, id, total, pay_timeout_s)
            .await;
        self.warmup(server, id).await;
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

    /// Units on sale in Redis.
    pub async fn remaining(&self, item: u64) -> u64 {
        self.redis
            .clone()
            .llen(self.key(item, "tokens"))
            .await
            .unwrap()
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
        let deadline = Instant::now() + limit;
        loop {
            let stats = self.stats(server, item).await;
            let in_mysql = self.orders(item).await.len();
            if in_mysql == expected && stats["pending"] == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "after {limit:?}: {in_mysql} orders in MySQL (want {expected}); stats {stats}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// CONTRACT.md section 7, invariants 1 to 4, for a quiescent item: `won` are the order
    /// numbers of every `202` the test saw.
    pub async fn assert_invariants(
        &self,
        server: &TestServer,
        item: u64,
        total: u32,
        won: &[String],
    ) {
        let orders = self.orders(item).await;
        let live: Vec<_> = orders.iter().filter(|(_, _, s)| s != "cancelled").collect();
        // 1. No oversell.
        assert!(
            live.len() <= total as usize,
            "oversold: {} live orders for {total} units",
            live.len()
        );
        // 2. No double purchase.
        let users: HashSet<u64> = live.iter().map(|(_, u, _)| *u).collect();
        assert_eq!(users.len(), live.len(), "a user holds two live orders");
        // 3. Nothing lost: every 202 is exactly one row (order_sn is unique in MySQL).
        let in_mysql: HashSet<&str> = orders.iter().map(|(sn, _, _)| sn.as_str()).collect();
        let answered: HashSet<&str> = won.iter().map(String::as_str).collect();
        assert_eq!(
            answered.len(),
            won.len(),
            "an order number was answered twice"
        );
        let missing: Vec<_> = answered.difference(&in_mysql).collect();
        assert!(missing.is_empty(), "202s missing from MySQL: {missing:?}");
        // 4. Stock adds up: remaining tokens + unpaid + paid = total.
        let remaining = self.remaining(item).await;
        assert_eq!(
            remaining as usize + live.len(),
            total as usize,
            "stock does not add up"
        );
        let stats = self.stats(server, item).await;
        assert_eq!(stats["consistent"], true, "stats: {stats}");
        assert_eq!(stats["pending"], 0, "stats: {stats}");
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
    pub fn database_url_via(&self, proxy: SocketAddr) -> seckill::config::Secret {
        seckill::config::Secret::new(format!("mysql://root@{proxy}/{}", self.database))
    }

    pub fn key(&self, item: u64, what: &str) -> String {
        format!("{}:{{item:{item}}}:v1:{what}", self.namespace)
    }

    pub fn topology(&self) -> Topology {
        Topology::new(&self.namespace)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let (namespace, database, mysql_server) = (
            self.namespace.clone(),
            self.database.clone(),
            self.mysql_server.clone(),
        );
        // Async clean-up from a synchronous Drop: on a thread with its own runtime.
        let cleaned = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(cleanup(&namespace, &database, &mysql_server)))
        })
        .join();
        if !matches!(cleaned, Ok(Ok(()))) {
            eprintln!("test clean-up failed for {}", self.namespace);
        }
    }
}

async fn cleanup(namespace: &str, database: &str, mysql_server: &str) {
    // The test's database and any it made beside it (`{database}_…`).
    if let Ok(pool) = MySqlPool::connect(mysql_server).await {
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
    }
    if let Ok(mut redis) = redis::Client::open(redis_url()).and_then(|c| c.get_connection()) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{namespace}:*"))
            .query(&mut redis)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut redis);
        }
    }
    if let Ok(conn) = lapin::Connection::connect(&amqp_url(), Default::default()).await
        && let Ok(channel) = conn.create_channel().await
    {
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
        let _ = conn.close(200, "bye".into()).await;
    }
}

/// Messages ready in a queue (declared passively; `None` while it does not exist).
pub async fn queue_depth(queue: &str) -> Option<u32> {
    queue_depth_on(&amqp_url(), queue).await
}

/// [`queue_depth`] on another broker (a private one).
pub async fn queue_depth_on(amqp: &str, queue: &str) -> Option<u32> {
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

/// A running server.
pub struct TestServer {
    pub addr: SocketAddr,
    /// Set when the server has a separate admin listener.
    pub admin_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    /// A server this test did not start in-process (a child process, say).
    pub fn external(addr: SocketAddr) -> Self {
        Self {
            addr,
            admin_addr: None,
            shutdown: CancellationToken::new(),
            handle: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Graceful shutdown, as on SIGTERM; fails the test if the server reports an error.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(handle) = self.handle.take() {
            // Generous: on a loaded 2-core machine (private clusters booting beside) a
            // stop that waits for its publisher's confirms can take seconds; a hang cannot.
            tokio::time::timeout(Duration::from_secs(60), handle)
                .await
                .expect("server stops within 60 s")
                .expect("server task")
                .expect("server ends cleanly");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn buy(http: &reqwest::Client, addr: SocketAddr, token: &str, item: u64) -> (u16, Value) {
    let response = buy_response(http, addr, token, item).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A purchase's whole answer (for its headers).
pub async fn buy_response(
    http: &reqwest::Client,
    addr: SocketAddr,
    token: &str,
    item: u64,
) -> reqwest::Response {
    http.post(format!("http://{addr}/api/flashbuy"))
        .bearer_auth(token)
        .header("x-client-time", Utc::now().timestamp_millis().to_string())
        .json(&json!({ "item_id": item }))
        .send()
        .await
        .unwrap()
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

/// Waits (up to `limit`) until `check` gives `Some`, polling every 100 ms; panics with
/// `what` and the last value seen otherwise.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) => assert!(
                Instant::now() < deadline,
                "after {limit:?}, still not {what}: {last}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A free TCP port on loopback (for private server processes).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name} {pid}");
}

/// A TCP proxy in front of a real server, which a test can cut (open connections dropped,
/// new ones accepted and closed at once) and restore; it counts connection attempts.
pub struct TcpProxy {
    pub addr: SocketAddr,
    state: std::sync::Arc<ProxyState>,
    accept_loop: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProxyState {
    cut: std::sync::atomic::AtomicBool,
    attempts: std::sync::atomic::AtomicU64,
    /// Added to every answer from the target, in ms (a slow server, not a slow link: answers
    /// are delayed, not queued behind each other).
    delay_ms: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
    /// Bytes that, sent by a client, drop its connection instead of going through; and
    /// how many more times.
    drop_on: std::sync::Mutex<Option<(Vec<u8>, u32)>>,
}

impl ProxyState {
    /// Whether this chunk from a client is to be dropped with its connection.
    fn drops(&self, chunk: &[u8]) -> bool {
        let mut drop_on = self.drop_on.lock().unwrap();
        let Some((needle, times)) = drop_on.as_mut() else {
            return false;
        };
        if *times == 0 || !chunk.windows(needle.len()).any(|w| w == needle.as_slice()) {
            return false;
        }
        *times -= 1;
        true
    }
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = std::sync::Arc::new(ProxyState::default());
        let shared = state.clone();
        let accept_loop = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                shared.attempts.fetch_add(1, Ordering::SeqCst);
                if shared.cut.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection closed
                }
                let state = shared.clone();
                let forward = tokio::spawn(async move {
                    if let Ok(upstream) = tokio::net::TcpStream::connect(target).await {
                        forward(client, upstream, state).await;
                    }
                });
                shared.open.lock().unwrap().push(forward.abort_handle());
            }
        });
        Self {
            addr,
            state,
            accept_loop,
        }
    }

    pub fn cut(&self) {
        self.state
            .cut
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for connection in self.state.open.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// Delays every answer of the target by `delay` from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.state.delay_ms.store(
            delay.as_millis() as u64,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// The next `times` connections that send `needle` are dropped at that moment, the
    /// bytes never reaching the target: a call cut off at a chosen step.
    pub fn drop_connection_when_sent(&self, needle: &[u8], times: u32) {
        *self.state.drop_on.lock().unwrap() = Some((needle.to_vec(), times));
    }

    pub fn restore(&self) {
        self.state
            .cut
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Connections attempted through the proxy so far.
    pub fn attempts(&self) -> u64 {
        self.state
            .attempts
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Copies both ways; what comes back from the target goes through a delay line.
async fn forward(
    mut client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    state: std::sync::Arc<ProxyState>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut from_client, mut to_client) = client.split();
    let (mut from_upstream, mut to_upstream) = upstream.into_split();
    let state_in = state.clone();
    let (line_in, mut line_out) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let answers = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from_upstream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let delay = state.delay_ms.load(std::sync::atomic::Ordering::SeqCst);
            let due = Instant::now() + Duration::from_millis(delay);
            if line_in.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let deliver = async move {
        while let Some((due, bytes)) = line_out.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if to_client.write_all(&bytes).await.is_err() {
                break;
            }
        }
    };
    let requests = async {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from_client.read(&mut buf).await {
            if n == 0 || state_in.drops(&buf[..n]) {
                break;
            }
            if to_upstream.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = async { tokio::join!(answers, deliver) } => {}
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept_loop.abort();
        self.cut();
    }
}

/// The MariaDB server the tests use, as a socket address (for a proxy in front of it).
pub fn mysql_addr() -> SocketAddr {
    let url = url::Url::parse(&mysql_server_url()).unwrap();
    format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(3306))
        .parse()
        .unwrap()
}

/// The `seckill` binary with this environment's settings.
pub fn seckill(env: &TestEnv) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_seckill"));
    command.envs(env.vars()).env_remove("RUST_LOG");
    command
}

/// Starts `seckill serve …`, collecting its stdout lines; returns once it listens.
pub fn serve(
    command: &mut Command,
) -> (
    Child,
    TestServer,
    Arc<Mutex<Vec<String>>>,
    std::thread::JoinHandle<()>,
) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Collect stdout; hand over the bound address from the `listening` line.
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let (addr_tx, addr_rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(json) = serde_json::from_str::<Value>(&line)
                    && json["message"] == "listening"
                {
                    let _ = addr_tx.send(json["addr"].as_str().unwrap_or_default().to_owned());
                }
                lines.lock().unwrap().push(line);
            }
        })
    };
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a `listening` line");
    let server = TestServer::external(addr.parse().unwrap());
    (child, server, lines, reader)
}

/// Stops a `seckill serve` process as an operator would (SIGTERM) and checks it exits
/// cleanly; then waits for its log reader.
pub fn stop_process(mut child: Child, reader: std::thread::JoinHandle<()>) {
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    reader.join().unwrap();
}

/// A private nginx with `nginx/seckill.conf` (installed by `dev/nginx.sh`, as a developer
/// runs it) in front of two servers, on a spare port. Stopped on drop.
pub struct Nginx {
    pub addr: SocketAddr,
    child: Child,
    state: std::path::PathBuf,
}

impl Nginx {
    pub async fn start(api_1: SocketAddr, api_2: SocketAddr) -> Self {
        Self::start_from(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
            api_1,
            api_2,
        )
        .await
    }

    /// [`Nginx::start`] with the `dev/nginx.sh`, `nginx/` and `web/` of another checkout.
    pub async fn start_from(
        checkout: &std::path::Path,
        api_1: SocketAddr,
        api_2: SocketAddr,
    ) -> Self {
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let state = std::env::temp_dir().join(format!(
            "seckill-nginx-{}",
            ulid::Ulid::new().to_string().to_lowercase()
        ));
        let child = Command::new(checkout.join("dev/nginx.sh"))
            .args([
                addr.to_string(),
                api_1.to_string(),
                api_2.to_string(),
                state.display().to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("dev/nginx.sh");
        let nginx = Self { addr, child, state };
        eventually(Duration::from_secs(20), "nginx listening", || async {
            tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        nginx
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers and exits.
        signal(self.child.id(), "TERM");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

/// Sends SIGKILL to a process (an instance dying mid-sale).
pub fn kill_hard(child: &mut Child) {
    signal(child.id(), "KILL");
    let _ = child.wait();
}
