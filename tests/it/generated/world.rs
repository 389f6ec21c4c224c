//! The system under test of a generated history: private stores (one Redis with a replica,
//! or the binary's Redis Cluster), a TCP proxy in front of RabbitMQ to cut, and `seckill
//! serve` as real processes — two API instances and a worker (consumer and scheduler) —
//! that a step may kill, start again with its clock off, or starve of a replica.

use std::cell::RefCell;
use std::process::Child;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use serde_json::{Value, json};

use crate::support::*;

use super::model::{Model, Stores};
use super::oracle::Oracle;

/// What the histories of one test share: a runtime, and the Redis side of the stores.
pub struct Context {
    pub rt: tokio::runtime::Runtime,
    redis: RedisSide,
}

enum RedisSide {
    One {
        master: PrivateRedis,
        replica: PrivateRedis,
    },
    Cluster {
        cluster: &'static std::sync::Mutex<PrivateRedisCluster>,
        dir: std::path::PathBuf,
        ports: Vec<u16>,
        /// This test's turn with the cluster, for all its histories.
        _turn: tokio::sync::MutexGuard<'static, ()>,
    },
}

thread_local! {
    /// The context of the histories running on this thread.
    pub static CONTEXT: RefCell<Option<Rc<Context>>> = const { RefCell::new(None) };
}

impl Context {
    pub fn new(stores: Stores) -> Rc<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("a runtime");
        let redis = rt.block_on(async {
            match stores {
                Stores::OneRedis => {
                    let master = PrivateRedis::start().await;
                    let port = master.port.to_string();
                    let replica = PrivateRedis::start_with(&[
                        "--replicaof",
                        "127.0.0.1",
                        &port,
                        "--repl-diskless-load",
                        "on-empty-db",
                    ])
                    .await;
                    RedisSide::One { master, replica }
                }
                Stores::Cluster => {
                    let (cluster, turn) = PrivateRedisCluster::shared().await;
                    let (dir, ports) = {
                        let cluster = cluster
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        (cluster.dir(), cluster.ports.clone())
                    };
                    RedisSide::Cluster {
                        cluster,
                        dir,
                        ports,
                        _turn: turn,
                    }
                }
            }
        });
        Rc::new(Self { rt, redis })
    }

    fn redis_url(&self) -> String {
        match &self.redis {
            RedisSide::One { master, .. } => master.url(),
            RedisSide::Cluster { cluster, .. } => cluster
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .seeds(),
        }
    }

    /// Waits until every replica is in step with its master (before a history, and after a
    /// thaw or a failover).
    async fn replicas_in_step(&self) {
        match &self.redis {
            RedisSide::One { replica, .. } => {
                eventually(Duration::from_secs(30), "the replica in step", || async {
                    let info = replica.cmd(&["INFO", "replication"]).await;
                    let info: String =
                        redis::FromRedisValue::from_redis_value(info).unwrap_or_default();
                    if info.contains("master_link_status:up") {
                        Ok(())
                    } else {
                        Err(info)
                    }
                })
                .await
            }
            RedisSide::Cluster { dir, ports, .. } => whole(dir, ports).await,
        }
    }

    /// The cluster's nodes (role, master, slots, flags) and each one's replication, for the
    /// report of a failing history; nothing on one Redis.
    fn cluster_report(&self) -> String {
        let RedisSide::Cluster { cluster, ports, .. } = &self.redis else {
            return String::new();
        };
        let cluster = cluster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut report = vec![cluster.ask(ports[0], &["CLUSTER", "NODES"])];
        for port in ports {
            let replication = cluster.ask(*port, &["INFO", "replication"]);
            let brief: Vec<&str> = replication
                .lines()
                .filter(|l| {
                    ["role:", "connected_slaves:", "slave", "master_link_status:"]
                        .iter()
                        .any(|p| l.starts_with(p))
                })
                .map(str::trim)
                .collect();
            report.push(format!("node {port}: {}", brief.join(" ")));
        }
        report.join("\n")
    }

    /// Freezes the replica of the master serving `key`; returns its port.
    fn freeze_replica_of(&self, key: &str) -> u16 {
        match &self.redis {
            RedisSide::One { replica, .. } => {
                replica.freeze();
                replica.port
            }
            RedisSide::Cluster { cluster, .. } => {
                let cluster = cluster
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let replica = cluster.replica_of(cluster.master_of(key));
                cluster.freeze(replica);
                replica
            }
        }
    }

    fn thaw(&self, port: u16) {
        match &self.redis {
            RedisSide::One { replica, .. } => replica.thaw(),
            RedisSide::Cluster { cluster, .. } => cluster
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .thaw(port),
        }
    }

    /// Kills the master serving `key`, waits for its replica to take over, and starts it
    /// again (it rejoins as a replica). Nothing on one Redis.
    async fn fail_over(&self, key: &str) {
        let RedisSide::Cluster {
            cluster,
            dir,
            ports,
            ..
        } = &self.redis
        else {
            return;
        };
        let master = {
            let mut cluster = cluster
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let master = cluster.master_of(key);
            cluster.kill(master);
            master
        };
        let up: Vec<u16> = ports.iter().copied().filter(|p| *p != master).collect();
        whole(dir, &up).await;
        cluster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .restart(master);
        whole(dir, ports).await;
    }
}

/// A `seckill serve` child process.
pub struct Proc {
    roles: &'static str,
    child: Child,
    pub server: TestServer,
    /// Its log lines (JSON), for the report of a failing history.
    lines: Arc<Mutex<Vec<String>>>,
}

/// The system under test of one history.
pub struct World {
    ctx: Rc<Context>,
    pub env: TestEnv,
    rabbit: TcpProxy,
    pub apis: [Proc; 2],
    worker: Proc,
    vars: Vec<(&'static str, String)>,
    pub http: reqwest::Client,
    /// The item as the last `PUT` the server took.
    pub record: Value,
    /// The total the last warm-up loaded.
    pub loaded_total: u32,
    /// A frozen replica's port.
    frozen: Option<u16>,
    pub rabbit_cut: bool,
    pub oracle: Oracle,
    /// Each step and what came of it, for the report of a failure.
    pub log: Vec<String>,
}

/// The one item of a history.
pub const ITEM: u64 = 1;

impl World {
    pub fn start(model: &Model) -> Self {
        let ctx = CONTEXT.with(|c| c.borrow().clone().expect("a history context"));
        let shape = &model.shape;
        let (env, rabbit) = ctx.rt.block_on(async {
            ctx.replicas_in_step().await;
            let rabbit = TcpProxy::start(amqp_addr()).await;
            let env = TestEnv::on_stores(
                "history",
                &mysql_server_url(),
                &ctx.redis_url(),
                &format!("amqp://guest:guest@{}/%2f", rabbit.addr),
            )
            .await;
            (env, rabbit)
        });
        let vars = vec![
            (
                "SECKILL_REDIS_WAIT_REPLICAS",
                shape.wait_replicas.to_string(),
            ),
            ("SECKILL_SCHEDULER_POLL_MS", "200".to_owned()),
            // A killed worker's deadlines come back within seconds, not half a minute.
            ("SECKILL_SCHEDULER_LEASE_MS", "3000".to_owned()),
        ];
        let apis = [
            start(&env, "api", &vars, None),
            start(&env, "api", &vars, None),
        ];
        let worker = start(&env, "consumer,scheduler", &vars, None);
        let began = Utc::now();
        let mut record = json!({
            "name": "a generated history's item",
            "shop_id": 1,
            "total": shape.total,
            "start_at": began - chrono::Duration::seconds(5),
            "end_at": began + chrono::Duration::hours(1),
            "price_cents": 1999,
            "pay_timeout_s": shape.pay_timeout_s,
            "buckets": shape.buckets,
            "per_user": shape.per_user,
            "release": [],
        });
        if let Some(draw_in_s) = shape.draw_in_s {
            record["mode"] = json!("draw");
            record["draw_at"] = json!(began + chrono::Duration::seconds(draw_in_s.into()));
        }
        if shape.queue {
            // Let in as fast as a history presses; passes as short as they may be.
            record["queue"] = json!({ "admit_per_s": 50, "pass_ttl_s": 30 });
        }
        if let Some(wave) = shape.wave {
            record["release"] = json!([{
                "at": began + chrono::Duration::seconds(wave.at_s.into()),
                "units": wave.units.min(shape.total),
            }]);
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client");
        let world = Self {
            ctx,
            env,
            rabbit,
            apis,
            worker,
            vars,
            http,
            record,
            loaded_total: shape.total,
            frozen: None,
            rabbit_cut: false,
            oracle: Oracle::new(shape.total, shape.per_user),
            log: Vec::new(),
        };
        let (put, warmed) = world.block_on(async {
            let w = &world;
            let put = w.put_record(&w.record).await;
            let warmed = w
                .admin(
                    reqwest::Method::POST,
                    &format!("/admin/items/{ITEM}/warmup"),
                )
                .await;
            (put, warmed)
        });
        assert!(
            put.0 == 201 && warmed.0 == 200,
            "the history's item: {put:?} {warmed:?}"
        );
        world
    }

    /// The runtime and stores the history runs on.
    pub fn context(&self) -> Rc<Context> {
        self.ctx.clone()
    }

    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.ctx.rt.block_on(future)
    }

    /// The API instance a step goes to.
    pub fn api(&self, i: u8) -> &TestServer {
        &self.apis[usize::from(i) % 2].server
    }

    /// `method path` with the admin token, at the first API: status, code and body
    /// (status 0: no answer).
    pub async fn admin(&self, method: reqwest::Method, path: &str) -> (u16, String, Value) {
        let sent = self
            .http
            .request(method, self.api(0).url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await;
        answer(sent).await
    }

    pub async fn put_record(&self, record: &Value) -> (u16, String, Value) {
        let sent = self
            .http
            .put(self.api(0).url(&format!("/admin/items/{ITEM}")))
            .bearer_auth(ADMIN_TOKEN)
            .json(record)
            .send()
            .await;
        answer(sent).await
    }

    /// `GET /admin/items/1/stats` (Null when it does not answer).
    pub async fn stats(&self) -> Value {
        self.admin(reqwest::Method::GET, &format!("/admin/items/{ITEM}/stats"))
            .await
            .2
    }

    /// An API instance killed with SIGKILL and started again (on a new port).
    pub fn kill_api(&mut self, i: u8) {
        let i = usize::from(i) % 2;
        kill_hard(&mut self.apis[i].child);
        self.apis[i] = start(&self.env, "api", &self.vars, None);
    }

    /// An API instance started again with its host clock `seconds` off.
    pub fn clock_off(&mut self, i: u8, seconds: i8) {
        let i = usize::from(i) % 2;
        kill_hard(&mut self.apis[i].child);
        let offset = format!("{seconds:+}s");
        self.apis[i] = start(&self.env, "api", &self.vars, Some(&offset));
    }

    pub fn kill_worker(&mut self) {
        kill_hard(&mut self.worker.child);
        self.worker = start(&self.env, self.worker.roles, &self.vars, None);
    }

    pub fn freeze_replica(&mut self) {
        if self.frozen.is_none() {
            let key = self.env.item_keys(ITEM).meta;
            self.frozen = Some(self.ctx.freeze_replica_of(&key));
        }
    }

    pub fn thaw_replica(&mut self) {
        if let Some(port) = self.frozen.take() {
            self.ctx.thaw(port);
            let ctx = self.ctx.clone();
            self.block_on(ctx.replicas_in_step());
        }
    }

    pub fn replica_frozen(&self) -> bool {
        self.frozen.is_some()
    }

    pub fn fail_over(&mut self) {
        let key = self.env.item_keys(ITEM).meta;
        let ctx = self.ctx.clone();
        self.block_on(ctx.fail_over(&key));
    }

    pub fn cut_rabbit(&mut self) {
        self.rabbit.cut();
        self.rabbit_cut = true;
    }

    pub fn restore_rabbit(&mut self) {
        self.rabbit.restore();
        self.rabbit_cut = false;
    }

    /// Every fault healed: the replica thawed, RabbitMQ reachable.
    pub fn heal(&mut self) {
        self.thaw_replica();
        self.restore_rabbit();
    }

    /// The item's buckets in Redis and, on the cluster, its nodes: for the report of a
    /// history that failed to sell what it had.
    pub fn stores_report(&self) -> String {
        let buckets = self.block_on(self.env.buckets_report(ITEM));
        format!("{buckets}\n{}", self.ctx.cluster_report())
    }

    /// The processes' last warnings and errors, each named, for the report of a failure.
    pub fn warnings(&self) -> Vec<String> {
        let named = [
            ("api 0", &self.apis[0]),
            ("api 1", &self.apis[1]),
            ("worker", &self.worker),
        ];
        named
            .into_iter()
            .flat_map(|(name, proc)| {
                proc.warnings(20)
                    .into_iter()
                    .map(move |line| format!("{name}: {line}"))
            })
            .collect()
    }

    /// Every fault healed, the processes killed (the history's check is done), the
    /// environment cleaned up.
    pub fn stop(mut self) {
        self.heal();
    }
}

impl Drop for World {
    /// Also when a step failed: nothing frozen or cut is left to the next history (which
    /// waits for the replica itself).
    fn drop(&mut self) {
        if let Some(port) = self.frozen.take() {
            self.ctx.thaw(port);
        }
        self.rabbit.restore();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Killed already, when a step killed it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(
    env: &TestEnv,
    roles: &'static str,
    vars: &[(&'static str, String)],
    clock: Option<&str>,
) -> Proc {
    let mut command = match clock {
        Some(offset) => seckill_with_clock(env, offset),
        None => seckill(env),
    };
    command
        .args(["serve", "--roles", roles])
        .envs(vars.iter().cloned());
    let (child, server, lines, _reader) = serve(&mut command);
    Proc {
        roles,
        child,
        server,
        lines,
    }
}

impl Proc {
    /// Its last warnings and errors, at most `n`.
    fn warnings(&self, n: usize) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let mut said: Vec<String> = lines
            .iter()
            .rev()
            .filter(|line| line.contains("\"level\":\"WARN") || line.contains("\"level\":\"ERROR"))
            // The AMQP client's own complaints about a cut line repeat what the server says.
            .filter(|line| !line.contains("\"target\":\"lapin"))
            .take(n)
            .cloned()
            .collect();
        said.reverse();
        said
    }
}

/// A response as a step records it: status (0 when none came), `code`, body.
pub async fn answer(sent: reqwest::Result<reqwest::Response>) -> (u16, String, Value) {
    match sent {
        Err(_) => (0, "no answer".to_owned(), Value::Null),
        Ok(response) => {
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            let code = body["code"].as_str().unwrap_or("-").to_owned();
            (status, code, body)
        }
    }
}
