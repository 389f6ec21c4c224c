//! The fleet on hosts of its own (network namespaces on this machine, `dev/fleet-hosts.sh`):
//! nginx on an edge host, two API hosts, two worker hosts (consumer and scheduler), six
//! Redis hosts (a cluster of three masters and their replicas, each node on a host of its
//! own), three MariaDB hosts (a Galera cluster) and three RabbitMQ hosts (a cluster, quorum
//! queues); the test is the load generator and the checker, on the machine's own host.
//! Each fault cuts links between hosts during a live sale and heals them; after each, the
//! history check of `history.rs` (every `202` exactly one row, nothing sold twice, the
//! stock adding up). The stores start once; each sale has its own namespace and
//! database on them, and its own `seckill` processes.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use crate::history::{Liveness, after_fault, crowd, mid_burst};
use crate::support::*;

/// The Redis Cluster's hosts.
const REDIS: [&str; 6] = ["redis1", "redis2", "redis3", "redis4", "redis5", "redis6"];

/// The Galera cluster's hosts (the servers write through the first while it is ready).
const MYSQL: [&str; 3] = ["mysql1", "mysql2", "mysql3"];

/// The RabbitMQ cluster's hosts (the servers use the first while it answers).
const RABBIT: [&str; 3] = ["rabbit1", "rabbit2", "rabbit3"];

/// The hosts and their stores.
struct Fleet {
    hosts: Hosts,
    /// nginx on the edge host, in front of the API hosts' servers.
    edge: Nginx,
    galera: PrivateGalera,
    /// The Galera nodes' server URLs, comma-separated.
    mysql: String,
    redis: String,
    /// The RabbitMQ nodes' URLs, comma-separated (what the servers get, and where the
    /// checks look at the queue: the first node that answers).
    amqp: String,
}

impl Fleet {
    async fn start() -> Self {
        let mut names = REDIS.to_vec();
        names.extend(MYSQL);
        names.extend(RABBIT);
        names.extend(["edge", "api1", "api2", "worker1", "worker2"]);
        let mut hosts = Hosts::up(&names);
        // In front of each API host's server of the sale (each sale starts its own).
        let edge = Nginx::start_on(
            &hosts,
            "edge",
            SocketAddr::new(hosts.ip("api1"), FIRST_PORT),
            SocketAddr::new(hosts.ip("api2"), FIRST_PORT),
        )
        .await;
        let redis = hosts.redis_cluster(&REDIS).await;
        let galera = PrivateGalera::start_at(MYSQL.iter().map(|h| hosts.place(h)).collect()).await;
        let mysql = galera.urls().join(",");
        let amqp = hosts.rabbitmq_cluster(&RABBIT).await;
        Self {
            hosts,
            edge,
            galera,
            mysql,
            redis,
            amqp,
        }
    }

    /// A sale's world on the fleet's stores, and its servers (with `settings` beyond the
    /// environment's): API hosts 1 and 2 and worker hosts 1 and 2.
    async fn sale(&mut self, name: &str, settings: &[(&str, &str)]) -> (TestEnv, [TestServer; 2]) {
        self.sale_with(name, settings, ["consumer,scheduler"; 2])
            .await
    }

    /// [`Fleet::sale`] with the worker hosts' roles.
    async fn sale_with(
        &mut self,
        name: &str,
        settings: &[(&str, &str)],
        workers: [&str; 2],
    ) -> (TestEnv, [TestServer; 2]) {
        let env = TestEnv::on_stores(name, &self.mysql, &self.redis, &self.amqp).await;
        let api1 = fleet_server(&mut self.hosts, "api1", &env, "api", settings);
        let api2 = fleet_server(&mut self.hosts, "api2", &env, "api", settings);
        for (host, roles) in ["worker1", "worker2"].into_iter().zip(workers) {
            fleet_server(&mut self.hosts, host, &env, roles, settings);
        }
        (env, [api1, api2])
    }
}

/// A `seckill` with `roles` on `host`, set up as every server of the fleet is: orders in
/// quorum queues, replicated over the three RabbitMQ nodes. (A scheduler started mid-test
/// without it once could not declare the queues.)
fn fleet_server(
    hosts: &mut Hosts,
    host: &str,
    env: &TestEnv,
    roles: &str,
    settings: &[(&str, &str)],
) -> TestServer {
    let mut settings = settings.to_vec();
    settings.push(("SECKILL_QUEUE_TYPE", "quorum"));
    hosts.seckill(host, env, roles, &settings)
}

/// A third of the buyers go through nginx on the edge host (which passes a server's answer
/// on, tries the other host when one does not take the connection, and answers `503` when
/// neither does); the rest alternate between the API hosts and press again at the other
/// after an answer that could not tell (as a load balancer's retry would).
fn route<'a>(
    apis: &'a [TestServer; 2],
    edge: &'a Nginx,
) -> impl Fn(u64, u32) -> SocketAddr + Sync + 'a {
    move |user, attempt| {
        if user % 3 == 0 {
            edge.addr
        } else {
            apis[((user + u64::from(attempt)) % 2) as usize].addr
        }
    }
}

/// Every fault of the fleet's subset, one sale each, on one fleet (its stores take half a
/// minute to start).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_loses_nothing_when_links_between_hosts_are_cut_and_healed() {
    let mut fleet = Fleet::start().await;
    for fault in FAULTS {
        fault.run(&mut fleet, 500).await;
    }
}

/// The faults, each one sale.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    RedisMasterCutOff,
    ApiCutOffFromRedis,
    ApiCutOffFromRabbitmq,
    WorkerCutOffFromMysql,
    SchedulerFrozen,
    GaleraNodeKilled,
    GaleraNodeCutOff,
    RabbitNodeCutOff,
}

const FAULTS: [Fault; 8] = [
    Fault::RedisMasterCutOff,
    Fault::ApiCutOffFromRedis,
    Fault::ApiCutOffFromRabbitmq,
    Fault::WorkerCutOffFromMysql,
    Fault::SchedulerFrozen,
    Fault::GaleraNodeKilled,
    Fault::GaleraNodeCutOff,
    Fault::RabbitNodeCutOff,
];

impl Fault {
    /// One sale with this fault, striking at a moment `after` picks (answers or rows
    /// written, kept inside the sale); the history check after it; then the sale's
    /// servers stop.
    async fn run(self, fleet: &mut Fleet, after: u64) {
        match self {
            Fault::RedisMasterCutOff => {
                let sale = partitioned_sale(fleet, "1", after.clamp(100, 1_500)).await;
                // docs/faults.md (the measured figures): `503 unavailable` on the cut-off
                // master's wins, pressing again reaches the new master; quiet once the old
                // master resyncs, or after a minute (a pending entry whose clean-up the
                // cut-off master took is checked against MySQL 60 s after its win).
                // Allowed: 20 s and 75 s.
                let liveness = Liveness {
                    fault: "Redis master cut off from its replica and the other masters (WAIT 1)",
                    allowed: &[
                        "202 queued",
                        "409 duplicate",
                        "410 sold_out",
                        "503 unavailable",
                    ],
                    trouble_within: Duration::from_secs(20),
                    drained_within: Duration::from_secs(75),
                };
                after_fault(
                    &sale.env,
                    &sale.apis[0],
                    PARTITIONED_UNITS,
                    &fleet.amqp,
                    sale.began,
                    &mut { sale.ledger },
                    &liveness,
                )
                .await;
            }
            // Its 500 units sell out after about 500 answers.
            Fault::ApiCutOffFromRedis => api_host_cut_off_from_redis(fleet, 50 + after % 200).await,
            Fault::ApiCutOffFromRabbitmq => api_host_cut_off_from_rabbitmq(fleet).await,
            Fault::WorkerCutOffFromMysql => {
                worker_host_cut_off_from_mysql_mid_drain(fleet, after.clamp(100, 2_000)).await
            }
            Fault::SchedulerFrozen => scheduler_host_frozen_holding_its_lease(fleet).await,
            Fault::GaleraNodeKilled => galera_node_lost(fleet, after.clamp(100, 1_000), true).await,
            Fault::GaleraNodeCutOff => {
                galera_node_lost(fleet, after.clamp(100, 1_000), false).await
            }
            Fault::RabbitNodeCutOff => rabbit_node_cut_off(fleet, after.clamp(100, 1_500)).await,
        }
        fleet.hosts.stop_servers();
    }
}

/// `FLEET_MINUTES` (default 60) of sale after sale on one fleet, each with a fault from
/// [`FAULTS`] (or those named in `FLEET_FAULTS`, comma-separated, e.g.
/// `GaleraNodeCutOff,GaleraNodeKilled`) picked at random at a random moment, the history
/// check after each; prints the rounds of each kind, and on a failure the end of every
/// Galera node's log. `FLEET_SOAK=1 FLEET_MINUTES=60 cargo test --test it
/// fleet::soak -- --ignored --nocapture` (docs/testing.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "an hour long: FLEET_SOAK=1, see docs/testing.md"]
async fn soak() {
    assert_eq!(
        std::env::var("FLEET_SOAK").as_deref(),
        Ok("1"),
        "the soak runs with FLEET_SOAK=1"
    );
    let minutes: u64 = std::env::var("FLEET_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(60);
    let faults: Vec<Fault> = match std::env::var("FLEET_FAULTS") {
        Ok(names) => FAULTS
            .into_iter()
            .filter(|f| names.split(',').any(|n| n.trim() == format!("{f:?}")))
            .collect(),
        Err(_) => FAULTS.to_vec(),
    };
    assert!(!faults.is_empty(), "FLEET_FAULTS names none of {FAULTS:?}");
    let until = Instant::now() + Duration::from_secs(minutes * 60);
    let mut fleet = Fleet::start().await;
    let mut rounds: std::collections::BTreeMap<String, u64> = Default::default();
    while Instant::now() < until {
        let random = ulid::Ulid::new().random();
        let fault = faults[(random % faults.len() as u128) as usize];
        let after = 50 + (random >> 8) as u64 % 1_000;
        eprintln!(
            "soak: round {}: {fault:?} after {after}",
            rounds.values().sum::<u64>() + 1
        );
        let round = std::panic::AssertUnwindSafe(fault.run(&mut fleet, after));
        if let Err(failure) = futures::FutureExt::catch_unwind(round).await {
            eprintln!("soak: {}", fleet.hosts.server_warnings(40));
            for (node, host) in MYSQL.iter().enumerate() {
                eprintln!(
                    "soak: {host} ({:?}), its log ends:\n{}",
                    fleet.galera.node_status(node).await,
                    fleet.galera.log_tail(node, 30)
                );
            }
            for host in RABBIT {
                // A node that stopped answering AMQP once went unexplained: its own view.
                let status = fleet
                    .hosts
                    .rabbitmqctl(host, &["-t", "10", "cluster_status"]);
                eprintln!("soak: {host}'s cluster status: {status:?}");
            }
            eprintln!("soak: failed after {rounds:?}");
            std::panic::resume_unwind(failure);
        }
        *rounds.entry(format!("{fault:?}")).or_default() += 1;
        eprintln!("soak: rounds so far {rounds:?}; lost 0, unexpected 0");
    }
    eprintln!(
        "soak: {minutes} min, {} rounds {rounds:?}: every history check passed (lost 0, unexpected 0)",
        rounds.values().sum::<u64>()
    );
}

/// API host 1 loses Redis for two seconds mid-burst: its purchases answer `503` within
/// the one-second budget (no answer slower than 1.5 s), buyers press again at host 2, and
/// after the heal nothing was sold twice and every `202` is one row.
async fn api_host_cut_off_from_redis(fleet: &mut Fleet, after: u64) {
    let (env, apis) = fleet.sale("fleet_redis", &[]).await;
    const UNITS: u32 = 500;
    env.item(1, UNITS).on_sale(&apis[0]).await;
    let answered = AtomicU64::new(0);
    let at = route(&apis, &fleet.edge);
    let hosts = &fleet.hosts;
    // A buyer of its own presses at host 1 throughout the cut.
    const PROBE: u64 = 900_000;
    let slowest = std::sync::Mutex::new(Duration::ZERO);
    let timed = async {
        // Host 1's answers during the cut, timed one by one.
        let began = mid_burst(&answered, after, async {
            hosts.cut("api1", &REDIS);
        })
        .await;
        while began.elapsed() < Duration::from_secs(2) {
            let sent = Instant::now();
            let (status, json) = env.buy(&apis[0], PROBE, 1).await;
            assert_eq!(status, 503, "host 1 cut off from Redis: {json}");
            let took = sent.elapsed();
            let mut slowest = slowest.lock().unwrap();
            *slowest = (*slowest).max(took);
        }
        hosts.heal("api1", &REDIS);
        began
    };
    let (mut ledger, began) = tokio::join!(crowd(&env, 1, 1..1_501, &at, &answered), timed);
    // A press cut off after Redis ran it may have won: the probe cannot tell either.
    ledger.uncertain.insert(PROBE);
    let slowest = *slowest.lock().unwrap();
    assert!(
        slowest < Duration::from_millis(1500),
        "host 1 answered a purchase in {slowest:?} while cut off from Redis"
    );
    eprintln!("fleet: host 1 cut off from Redis answered 503 within {slowest:?}");
    // docs/faults.md (the measured figures): host 1's purchases `503` during the 2 s cut,
    // pressing again at host 2 sells. Allowed: the last `503` within
    // 4 s of the cut (the cut and a 1.5 s answer), the orders within 20 s.
    let liveness = Liveness {
        fault: "API host cut off from Redis",
        allowed: &[
            "202 queued",
            "409 duplicate",
            "410 sold_out",
            "503 unavailable",
        ],
        trouble_within: Duration::from_secs(4),
        drained_within: Duration::from_secs(20),
    };
    after_fault(
        &env,
        &apis[0],
        UNITS,
        &fleet.amqp,
        began,
        &mut ledger,
        &liveness,
    )
    .await;
}

/// API host 1 loses RabbitMQ (not Redis): 300 buyers pressing there all win, their orders
/// waiting in the outbox; after the heal every one reaches MySQL once.
async fn api_host_cut_off_from_rabbitmq(fleet: &mut Fleet) {
    let (env, apis) = fleet.sale("fleet_rabbit", &[]).await;
    const UNITS: u32 = 300;
    env.item(1, UNITS).on_sale(&apis[0]).await;
    fleet.hosts.cut("api1", &RABBIT);
    let began = Instant::now();
    let answered = AtomicU64::new(0);
    let only_host_1 = |_: u64, _: u32| apis[0].addr;
    let mut ledger = crowd(&env, 1, 1..301, &only_host_1, &answered).await;
    assert_eq!(
        ledger.won.len(),
        UNITS as usize,
        "host 1 without RabbitMQ still sells: {:?}",
        ledger.answers
    );
    fleet.hosts.heal("api1", &RABBIT);
    // docs/faults.md (the measured figures): nothing for buyers. Allowed: every order in
    // MySQL within 6 s of the cut.
    let liveness = Liveness::unnoticed("API host cut off from RabbitMQ", Duration::from_secs(6));
    after_fault(
        &env,
        &apis[0],
        UNITS,
        &fleet.amqp,
        began,
        &mut ledger,
        &liveness,
    )
    .await;
}

/// The worker hosts lose MySQL while it drains 4,000 orders (cut once some hundreds are
/// written, so a batch's commit is in flight or its answer lost), for three seconds:
/// afterwards every order is in MySQL exactly once.
async fn worker_host_cut_off_from_mysql_mid_drain(fleet: &mut Fleet, after: u64) {
    let (env, apis) = fleet.sale("fleet_mysql", &[]).await;
    const UNITS: u32 = 4_000;
    env.item(1, UNITS).on_sale(&apis[0]).await;
    let answered = AtomicU64::new(0);
    let at = route(&apis, &fleet.edge);
    let hosts = &fleet.hosts;
    let cut = async {
        written_at_least(&env, after).await;
        hosts.cut("worker1", &MYSQL);
        hosts.cut("worker2", &MYSQL);
        let began = Instant::now();
        let written = env.order_count(1).await;
        assert!(
            written < u64::from(UNITS),
            "drained before the cut ({written})"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        hosts.heal("worker1", &MYSQL);
        hosts.heal("worker2", &MYSQL);
        began
    };
    let (mut ledger, began) = tokio::join!(crowd(&env, 1, 1..4_001, &at, &answered), cut);
    // docs/faults.md (the measured figures): nothing for buyers. Allowed: every order in
    // MySQL within 12 s of the cut.
    let liveness = Liveness::unnoticed(
        "worker host cut off from MySQL mid-drain",
        Duration::from_secs(12),
    );
    after_fault(
        &env,
        &apis[0],
        UNITS,
        &fleet.amqp,
        began,
        &mut ledger,
        &liveness,
    )
    .await;
}

/// The lease of the schedulers of [`scheduler_host_frozen_holding_its_lease`].
const LEASE_MS: u64 = 3_000;

/// 500 orders fall due at once (a 3 s pay timeout) and worker host 1, the only scheduler,
/// freezes (SIGSTOP) as they do — holding leases, mid-pass; a scheduler starts on host 2
/// and takes over once the leases run out, and host 1 wakes after it did: every order is
/// cancelled once, every unit back once, and none later than a lease (and a little) after
/// its deadline.
async fn scheduler_host_frozen_holding_its_lease(fleet: &mut Fleet) {
    let lease = LEASE_MS.to_string();
    let settings = [
        ("SECKILL_SCHEDULER_LEASE_MS", lease.as_str()),
        ("SECKILL_SCHEDULER_POLL_MS", "200"),
    ];
    let (env, apis) = fleet
        .sale_with("fleet_lease", &settings, ["consumer,scheduler", "consumer"])
        .await;
    const UNITS: u32 = 500;
    env.item(1, UNITS).paying_within(3).on_sale(&apis[0]).await;
    let answered = AtomicU64::new(0);
    let at = route(&apis, &fleet.edge);
    let mut ledger = crowd(&env, 1, 1..501, &at, &answered).await;
    assert_eq!(ledger.won.len(), UNITS as usize, "{:?}", ledger.answers);
    // A deadline can be kept only once its order is in MySQL (the consumer schedules it
    // then): when the broker is slow, orders land after their deadline, and the lease's
    // promise counts from there. By MySQL's clock, which also stamped the cancels.
    let landed: chrono::NaiveDateTime =
        eventually(Duration::from_secs(30), "every order in MySQL", || async {
            let (rows, now): (i64, chrono::NaiveDateTime) =
                sqlx::query_as("SELECT COUNT(*), UTC_TIMESTAMP(3) FROM orders WHERE item_id = 1")
                    .fetch_one(&env.db)
                    .await
                    .unwrap();
            if rows == i64::from(UNITS) {
                Ok(now)
            } else {
                Err(format!("{rows}"))
            }
        })
        .await;
    // Frozen while it holds leases on due deadlines (its claim is in Redis). A claim is
    // held for tens of milliseconds: looked for every 5 ms (every 100 ms missed both the
    // reminders' and the deadlines' claims once).
    let leased = env.keys().leased(env.bucket(1));
    let looking = Instant::now();
    loop {
        let held: u64 = redis::AsyncCommands::zcard(&mut env.redis.clone(), &leased)
            .await
            .unwrap();
        if held > 0 {
            break;
        }
        assert!(
            looking.elapsed() < Duration::from_secs(20),
            "worker 1 took no lease within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fleet.hosts.freeze("worker1", true);
    let began = Instant::now();
    let at_freeze = cancelled(&env).await;
    fleet_server(&mut fleet.hosts, "worker2", &env, "scheduler", &settings);
    // Its start (migrations, the stores) counts against the deadlines too.
    eprintln!(
        "fleet: the second scheduler listening {} ms after the freeze",
        began.elapsed().as_millis()
    );
    tokio::time::sleep(Duration::from_millis(2 * LEASE_MS).saturating_sub(began.elapsed())).await;
    fleet.hosts.freeze("worker1", false);
    eprintln!("fleet: worker host 1 frozen with {at_freeze} of {UNITS} orders cancelled");
    eventually(Duration::from_secs(30), "every order cancelled", || async {
        let cancelled = cancelled(&env).await;
        if cancelled == u64::from(UNITS) {
            Ok(())
        } else {
            Err(format!("{cancelled}"))
        }
    })
    .await;
    let (late_ms, late_landed_ms): (i64, i64) = sqlx::query_as(
        "SELECT CAST(MAX(TIMESTAMPDIFF(MICROSECOND, GREATEST(pay_deadline, ?), updated_at)) \
         / 1000 AS SIGNED), \
         CAST(MAX(TIMESTAMPDIFF(MICROSECOND, pay_deadline, ?)) / 1000 AS SIGNED) \
         FROM orders WHERE item_id = 1",
    )
    .bind(landed)
    .bind(landed)
    .fetch_one(&env.db)
    .await
    .unwrap();
    eprintln!(
        "fleet: the latest cancel came {late_ms} ms after its deadline, or after its order \
         reached MySQL where that was later (every order was there {late_landed_ms} ms after \
         the earliest deadline)"
    );
    assert!(
        late_ms <= LEASE_MS as i64 + 2_000,
        "a deadline missed by {late_ms} ms, more than a lease ({LEASE_MS} ms) and 2 s"
    );
    // Every unit back exactly once: nothing is held, and the stock adds up to the total.
    // Then the top-up crowd buys them again — paid within half an hour from here on (and
    // both API hosts know it), lest their orders time out under the checks.
    env.item(1, UNITS).paying_within(1_800).put(&apis[0]).await;
    eventually(Duration::from_secs(10), "the new pay timeout", || async {
        let (_, item) = env.get(&apis[1], "/api/items/1", None).await;
        if item["pay_timeout_s"] == 1_800 {
            Ok(())
        } else {
            Err(item.to_string())
        }
    })
    .await;
    // docs/faults.md: nothing for buyers; the latest cancel within the lease (asserted
    // above). Allowed for the whole way back: 30 s.
    let liveness = Liveness::unnoticed(
        "scheduler host frozen holding its lease",
        Duration::from_secs(30),
    );
    after_fault(
        &env,
        &apis[0],
        UNITS,
        &fleet.amqp,
        began,
        &mut ledger,
        &liveness,
    )
    .await;
}

/// The item's orders cancelled by the deadline pass.
async fn cancelled(env: &TestEnv) -> u64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM orders WHERE item_id = 1 AND status = 'cancelled' \
         AND cancel_reason = 'timeout'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    n as u64
}

/// Units of a [`partitioned_sale`].
const PARTITIONED_UNITS: u32 = 2_000;

/// A sale through a Redis partition, and what its buyers were told.
struct PartitionedSale {
    env: TestEnv,
    apis: [TestServer; 2],
    ledger: crate::history::Ledger,
    began: Instant,
}

/// The Redis master of the sale's item cut off from every other Redis host (its replica and
/// the other masters) after `after` answers of a burst, while the API hosts still reach
/// it, until the cluster fails it over; then healed. With `WAIT 1` (`wait`) no acknowledged
/// win may be lost and no unit sold twice: what the cut-off master took alone was never
/// confirmed.
async fn partitioned_sale(fleet: &mut Fleet, wait: &str, after: u64) -> PartitionedSale {
    let (env, apis) = fleet
        .sale("fleet_partition", &[("SECKILL_REDIS_WAIT_REPLICAS", wait)])
        .await;
    env.item(1, PARTITIONED_UNITS).on_sale(&apis[0]).await;
    let hosts = &fleet.hosts;
    let master = hosts
        .redis_master_of(REDIS[0], &env.item_keys(1).meta)
        .expect("the item's master");
    let others: Vec<&str> = REDIS.iter().copied().filter(|h| *h != master).collect();
    let answered = AtomicU64::new(0);
    let at = route(&apis, &fleet.edge);
    let partition = async {
        let began = mid_burst(&answered, after, async {
            hosts.cut(&master, &others);
        })
        .await;
        eventually(
            Duration::from_secs(30),
            "the master failed over",
            || async {
                match hosts.redis_master_of(others[0], &env.item_keys(1).meta) {
                    Some(now) if now != master => Ok(()),
                    now => Err(format!("master {now:?}")),
                }
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        hosts.heal(&master, &others);
        eprintln!(
            "fleet: {master} cut off, failed over, healed after {:?}",
            began.elapsed()
        );
        began
    };
    let (ledger, began) = tokio::join!(crowd(&env, 1, 1..6_001, &at, &answered), partition);
    drop(at);
    hosts.redis_cluster_whole(&REDIS).await;
    PartitionedSale {
        env,
        apis,
        ledger,
        began,
    }
}

/// Without `WAIT`, what a partitioned Redis master loses, over `FLEET_ROUNDS` (default 5)
/// sales: acknowledged wins with no order, and units sold twice, printed for the fault
/// matrix (docs/faults.md). After the heal a second crowd of new buyers presses: the
/// promoted master still lists the units the cut-off master sold after the cut, and sells
/// them again (a first crowd that sold out before the failover leaves it to them). It
/// asserts what that row says: every `202` became a row (lost 0) in every round — what is
/// oversold is the measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement for docs/faults.md"]
async fn a_redis_partition_without_wait_measured() {
    let rounds: u64 = std::env::var("FLEET_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let mut fleet = Fleet::start().await;
    for round in 1..=rounds {
        let mut sale = partitioned_sale(&mut fleet, "0", 500).await;
        let answered = AtomicU64::new(0);
        let at = route(&sale.apis, &fleet.edge);
        let after_heal = crowd(&sale.env, 1, 6_001..12_001, &at, &answered).await;
        drop(at);
        sale.ledger.merge(after_heal);
        crate::history::ask_uncertain(&sale.env, &sale.apis[0], 1, &mut sale.ledger).await;
        // Long enough for every order on its way to land (no quiescence to wait for:
        // with writes lost the counts may never agree).
        tokio::time::sleep(Duration::from_secs(15)).await;
        let tally = crate::history::tally(&sale.env, 1, PARTITIONED_UNITS, &sale.ledger).await;
        eprintln!(
            "without WAIT, round {round}: lost {}, unexpected {}, oversold {}",
            tally.lost.len(),
            tally.unexpected.len(),
            tally.oversold
        );
        assert!(
            tally.lost.is_empty(),
            "round {round}: docs/faults.md says every 202 became a row"
        );
        fleet.hosts.stop_servers();
    }
}

/// The Galera node the servers write through (the first listed) lost mid-drain of 4,000
/// orders, once `after` are written: `killed` (SIGKILL), else cut off from the other two
/// nodes (a minority: it answers 1047) while every other host still reaches it. Purchases
/// go on, the writers move to the next node, every order lands once; then the node is
/// back (restarted, or healed) and in step before the next sale.
async fn galera_node_lost(fleet: &mut Fleet, after: u64, killed: bool) {
    let (env, apis) = fleet.sale("fleet_galera", &[]).await;
    const UNITS: u32 = 4_000;
    env.item(1, UNITS).on_sale(&apis[0]).await;
    let answered = AtomicU64::new(0);
    let at = route(&apis, &fleet.edge);
    let (hosts, galera) = (&fleet.hosts, &mut fleet.galera);
    let fault = async {
        written_at_least(&env, after).await;
        if killed {
            galera.kill(0);
        } else {
            hosts.cut(MYSQL[0], &MYSQL[1..]);
        }
        let began = Instant::now();
        let written = env.order_count(1).await;
        assert!(
            written < u64::from(UNITS),
            "drained before the fault ({written})"
        );
        began
    };
    let (mut ledger, began) = tokio::join!(crowd(&env, 1, 1..4_001, &at, &answered), fault);
    let name = if killed {
        "the Galera node written through killed mid-drain"
    } else {
        "the Galera node written through cut off from the other two mid-drain"
    };
    // docs/faults.md (the measured figures): nothing for buyers. Allowed: every order in
    // MySQL within 12 s of a kill, 30 s of a cut.
    let drained_within = Duration::from_secs(if killed { 12 } else { 30 });
    let liveness = Liveness::unnoticed(name, drained_within);
    after_fault(
        &env,
        &apis[0],
        UNITS,
        &fleet.amqp,
        began,
        &mut ledger,
        &liveness,
    )
    .await;
    fleet.hosts.stop_servers();
    if killed {
        fleet.galera.restart(0).await;
    } else {
        fleet.hosts.heal(MYSQL[0], &MYSQL[1..]);
        fleet.galera.wait_until_joined(0, MYSQL.len()).await;
    }
}

/// The RabbitMQ node the servers use (the first listed) cut off from the other two mid-burst,
/// every other host still reaching it: it pauses (`pause_minority`) and drops its
/// clients, who move to another node; healed after 5 s, it rejoins. Nothing lost, nothing
/// written twice.
async fn rabbit_node_cut_off(fleet: &mut Fleet, after: u64) {
    let (env, apis) = fleet.sale("fleet_rabbit_node", &[]).await;
    const UNITS: u32 = 2_000;
    env.item(1, UNITS).on_sale(&apis[0]).await;
    let answered = AtomicU64::new(0);
    let at = route(&apis, &fleet.edge);
    let hosts = &fleet.hosts;
    let cut = async {
        let began = mid_burst(&answered, after, async {
            hosts.cut(RABBIT[0], &RABBIT[1..]);
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        hosts.heal(RABBIT[0], &RABBIT[1..]);
        began
    };
    let (mut ledger, began) = tokio::join!(crowd(&env, 1, 1..4_001, &at, &answered), cut);
    // Back in the cluster before the checks look at the queue through it.
    eventually(
        Duration::from_secs(60),
        "the RabbitMQ node back",
        || async {
            hosts
                .rabbitmqctl(RABBIT[0], &["await_online_nodes", "3", "--timeout", "5"])
                .map(|_| ())
        },
    )
    .await;
    // docs/faults.md (the measured figures): nothing for buyers, every unit sold. Allowed:
    // every order in MySQL within 15 s of the cut.
    let liveness = Liveness::unnoticed(
        "a RabbitMQ node cut off from the other two (minority) mid-burst",
        Duration::from_secs(15),
    );
    after_fault(
        &env,
        &apis[0],
        UNITS,
        &fleet.amqp,
        began,
        &mut ledger,
        &liveness,
    )
    .await;
}

/// Waits (up to a minute) until MySQL holds at least `rows` orders of item 1: the moment a
/// mid-drain fault strikes.
async fn written_at_least(env: &TestEnv, rows: u64) {
    eventually(Duration::from_secs(60), "orders being written", || async {
        let written = env.order_count(1).await;
        if written >= rows {
            Ok(())
        } else {
            Err(format!("{written}"))
        }
    })
    .await;
}
