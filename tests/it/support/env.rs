//! One test's private world: its own namespace (Redis keys, RabbitMQ exchanges and
//! queues) and its own MySQL database on the machine's shared services, with the calls a
//! test makes of its servers; everything is removed on drop (also when the test fails).

use std::net::SocketAddr;
use std::time::Duration;

use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use seckill::config::Secret;
use seckill::domain::{BucketId, ItemId};
use seckill::testing::Jwt;
use seckill::testing::Topology;
use seckill::testing::{ItemKeys, Keys};
use seckill::{Role, Server, Settings};

use super::server::TestServer;
use super::shared::{TestRedis, amqp_url, init_logs, mysql_server_url, redis_url};

pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const ALL_ROLES: &[Role] = &[Role::Api, Role::Consumer, Role::Scheduler];

/// One test's private world.
pub struct TestEnv {
    pub settings: Settings,
    pub db: MySqlPool,
    /// The Redis the servers use (the shared one, or a private cluster).
    pub redis: TestRedis,
    pub http: reqwest::Client,
    pub(super) jwt: Jwt,
    pub(super) namespace: String,
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
        settings.payment_secret = vec![Secret::new(format!("pay-{namespace}"))];

        let db = seckill::testing::connect_mysql(settings.database_url.expose())
            .await
            .unwrap_or_else(|e| {
                panic!("MariaDB at {mysql_server} (see docs/testing.md: ./dev/services.sh): {e:#}")
            });
        seckill::testing::migrate(&db).await.expect("migrations");
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
            (
                "SECKILL_PAYMENT_SECRET",
                s.payment_secret
                    .iter()
                    .map(|secret| secret.expose())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
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

    /// An unsplit item's one bucket.
    pub fn bucket(&self, item: u64) -> BucketId {
        BucketId::whole(ItemId::new(item).expect("an item id"))
    }

    /// An unsplit item's Redis keys.
    pub fn item_keys(&self, item: u64) -> ItemKeys {
        self.keys().bucket(self.bucket(item))
    }

    pub fn topology(&self) -> Topology {
        Topology::new(&self.namespace)
    }

    /// An unsplit item's orders RabbitMQ confirmed that the consumer has not taken yet
    /// (src/outbox/mod.rs).
    pub async fn confirmed(&self, item: u64) -> u64 {
        redis::AsyncCommands::scard(
            &mut self.redis.clone(),
            self.keys().confirmed(self.bucket(item)),
        )
        .await
        .unwrap()
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
