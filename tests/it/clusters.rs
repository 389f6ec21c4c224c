//! Beyond one machine: the server on a RabbitMQ cluster with quorum queues, a node of it
//! killed mid-burst. Every cluster is private, started by the test on spare ports.

use std::time::{Duration, Instant};

use futures::StreamExt;
use seckill::config::{QueueType, Role, Secret};

use crate::history::*;
use crate::support::*;

/// Three RabbitMQ nodes, the orders in a quorum queue (replicated on all three): the node
/// the server is connected to is killed mid-burst. The server moves to another node, the
/// queue keeps what it confirmed (a majority still stands), what was not confirmed goes
/// again from the Redis outbox — nothing lost, nothing written twice, invariants intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rabbitmq_node_killed_mid_burst_loses_nothing_with_quorum_queues() {
    let env = TestEnv::new("rabbit_cluster").await;
    let mut nodes = PrivateRabbit::cluster(3).await;
    let urls = nodes
        .iter()
        .map(PrivateRabbit::url)
        .collect::<Vec<_>>()
        .join(",");
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.amqp_url = Secret::new(&urls);
            s.queue_type = QueueType::Quorum;
        })
        .await;
    // Every node must hold a replica before one dies: a queue with two members loses its
    // majority with the first kill.
    let queue = env.topology().orders_queue;
    eventually(
        std::time::Duration::from_secs(20),
        "the orders queue on all three nodes",
        || async {
            let listed = nodes[1].ctl(&["list_queues", "name", "members"]);
            let line = listed.lines().find(|l| l.starts_with(&queue));
            match line {
                Some(l) if l.matches('@').count() == 3 => Ok(()),
                _ => Err(listed.clone()),
            }
        },
    )
    .await;
    // The server connects to the first node that answers: the first.
    let amqp = nodes[1].url();
    // This test failed about once in five full runs (orders stuck in the outbox, the
    // queue empty): on a failure, what the surviving node says of the queue.
    let _report = ReportOnFailure(nodes[1].ctl_handle());
    let fault = async { nodes[0].kill() };
    // Buyers notice nothing (purchases never wait for the broker); every order in MySQL
    // within 20 s of the kill (the server moving to another node; a loaded 2-core machine).
    let liveness = Liveness::unnoticed("RabbitMQ cluster node killed", Duration::from_secs(20));
    fault_mid_burst(&env, &server, &amqp, fault, &liveness).await;
    let queues = nodes[1].ctl(&["list_queues", "name", "type"]);
    let orders = format!("{}\tquorum", env.topology().orders_queue);
    assert!(queues.lines().any(|l| l.trim() == orders), "{queues}");
    server.stop().await;
}

/// This test's turn with the binary's shared Redis Cluster, and an environment on it.
struct Turn {
    cluster: &'static std::sync::Mutex<PrivateRedisCluster>,
    env: TestEnv,
    ports: Vec<u16>,
    dir: std::path::PathBuf,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

async fn turn(name: &str) -> Turn {
    let (cluster, turn) = PrivateRedisCluster::shared().await;
    let (seeds, ports, dir) = {
        let cluster = cluster.lock().unwrap();
        (cluster.seeds(), cluster.ports.clone(), cluster.dir())
    };
    Turn {
        cluster,
        env: TestEnv::on_redis_cluster(name, &seeds).await,
        ports,
        dir,
        _turn: turn,
    }
}

/// `WAIT 1`, and deadlines polled every 200 ms (a cluster sends no expiry events).
fn waiting_for_a_replica(settings: &mut seckill::Settings) {
    settings.redis_wait_replicas = 1;
    settings.scheduler_poll_ms = 200;
}

/// Kills the master on `port` and waits until the other nodes serve every slot (its
/// replica took over); the node starts again when the answer is dropped.
async fn lose_master(
    cluster: &'static std::sync::Mutex<PrivateRedisCluster>,
    port: u16,
    ports: &[u16],
    dir: &std::path::Path,
) -> Revive {
    // Built first: should anything after fail, the node still comes back.
    let revive = Revive { cluster, port };
    cluster.lock().unwrap().kill(port);
    let up: Vec<u16> = ports.iter().copied().filter(|p| *p != port).collect();
    whole(dir, &up).await;
    revive
}

/// Prints what a surviving RabbitMQ node says of queues and bindings when the test fails.
struct ReportOnFailure(RabbitCtl);

impl Drop for ReportOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "after the kill, node 2 says:\n{}\n{}",
                self.0.tell(&[
                    "list_queues",
                    "name",
                    "type",
                    "leader",
                    "members",
                    "online",
                    "messages"
                ]),
                self.0.tell(&[
                    "list_bindings",
                    "source_name",
                    "destination_name",
                    "routing_key"
                ]),
            );
        }
    }
}

/// The whole server on a private Redis Cluster (3 masters, 3 replicas): a burst with the
/// total check and the invariants; unpaid orders timing out and their units selling
/// again; warm-ups (a second one refused, a forced one after a pause); reconciliation;
/// a breaker and a closed shop refusing purchases. Every script and pipeline keeps to
/// one slot, or this fails with CROSSSLOT.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_server_runs_on_a_redis_cluster() {
    let Turn { env, .. } = &turn("redis_cluster").await;
    let server = env
        .server_with(ALL_ROLES, |s| s.scheduler_poll_ms = 200)
        .await;

    // A burst: 600 units, 2,000 buyers.
    env.item(1, 600).on_sale(&server).await;
    let answered = std::sync::atomic::AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let ledger = crowd(env, 1, 1..2_001, &at, &answered).await;
    assert_eq!(ledger.won.len(), 600, "{:?}", ledger.answers);
    quiet(
        env,
        &server,
        1,
        &amqp_url(),
        std::time::Duration::from_secs(30),
    )
    .await;
    total_check(env, &server, 1, 600, &ledger).await;

    // Warm-ups: a second one is refused; paused, a forced one keeps every holder.
    let (status, json) = env.admin_post(&server, "/admin/items/1/warmup").await;
    assert_eq!(
        (status, json["code"].as_str()),
        (409, Some("already_loaded")),
        "{json}"
    );
    assert_eq!(env.admin_post(&server, "/admin/items/1/pause").await.0, 200);
    let (status, json) = env
        .admin_post(&server, "/admin/items/1/warmup?force=true")
        .await;
    assert_eq!((status, json["held"].as_u64()), (200, Some(600)), "{json}");
    assert_eq!(
        env.admin_post(&server, "/admin/items/1/resume").await.0,
        200
    );
    let (status, json) = env.admin_post(&server, "/admin/items/1/reconcile").await;
    assert_eq!(
        (status, json["consistent"].as_bool()),
        (200, Some(true)),
        "{json}"
    );

    // Unpaid orders time out; their units sell again.
    env.item(2, 20).paying_within(1).on_sale(&server).await;
    let second = crowd(env, 2, 1..21, &at, &answered).await;
    assert_eq!(second.won.len(), 20);
    eventually(std::time::Duration::from_secs(15), "units back", || async {
        let stats = env.stats(&server, 2).await;
        if stats["remaining"] == 20 && stats["orders"]["cancelled"] == 20 {
            Ok(())
        } else {
            Err(stats.to_string())
        }
    })
    .await;
    // "Sold out" is cleared on every instance within a second (CONTRACT §7), not at once.
    eventually(
        std::time::Duration::from_secs(3),
        "the cancelled buyer buys again",
        || async {
            match env.buy(&server, 1, 2).await {
                (202, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // A breaker, then a closed shop, refuse purchases; both undone.
    let circuit = env
        .admin(
            reqwest::Method::POST,
            &server,
            "/admin/circuit/open?item=2&level=2",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(circuit.status(), 200);
    eventually(
        std::time::Duration::from_secs(3),
        "the breaker obeyed",
        || async {
            match env.buy(&server, 30, 2).await {
                (503, json) if json["code"] == "circuit_open" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    env.admin(
        reqwest::Method::POST,
        &server,
        "/admin/circuit/close?item=2",
    )
    .send()
    .await
    .unwrap();
    let shop = env
        .admin(reqwest::Method::PUT, &server, "/admin/shops/1/status")
        .json(&serde_json::json!({"open": false, "reason": "cluster test"}))
        .send()
        .await
        .unwrap();
    assert_eq!(shop.status(), 200);
    eventually(
        std::time::Duration::from_secs(3),
        "the shop closed",
        || async {
            match env.buy(&server, 31, 2).await {
                (503, json) if json["code"] == "shop_closed" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    server.stop().await;
}

/// What a Redis failover mid-burst did to a sale: units sold more than once (live orders
/// beyond the total) and `202`s with no row.
struct Failover {
    /// When the master was killed.
    began: Instant,
    /// How long after the kill the cluster was whole again: the killed node back as the
    /// promoted master's replica (restarted once the first crowd had gone).
    whole_at: Duration,
    oversold: usize,
    lost: usize,
    answers: std::collections::BTreeMap<String, u64>,
}

/// A sale of 300 units on the shared cluster: 1,000 buyers, the master serving the item
/// killed (SIGKILL) after 150 answers, its replica taking over, the killed node back as a
/// replica; then a second crowd buys what is left, and the outcome is counted.
async fn failover_mid_burst(wait_replicas: u32) -> (Turn, TestServer, Ledger, Failover) {
    let on = turn("redis_failover").await;
    let Turn {
        cluster,
        env,
        ports,
        dir,
        ..
    } = &on;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.redis_wait_replicas = wait_replicas;
            s.scheduler_poll_ms = 200;
        })
        .await;
    env.item(1, 300).on_sale(&server).await;
    let master = cluster.lock().unwrap().master_of(&env.item_keys(1).meta);
    let answered = std::sync::atomic::AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let (mut ledger, began) = tokio::join!(
        crowd(env, 1, 1..1_001, &at, &answered),
        mid_burst(&answered, 150, async {
            cluster.lock().unwrap().kill(master)
        }),
    );
    // The replica took over: every slot served again by the nodes still up.
    let up: Vec<u16> = ports.iter().copied().filter(|p| *p != master).collect();
    whole(dir, &up).await;
    cluster.lock().unwrap().restart(master);
    whole(dir, ports).await;
    let whole_at = began.elapsed();
    // Everyone presses again once the replica serves the item: what is left sells.
    ledger.merge(crowd(env, 1, 1..1_201, &at, &answered).await);
    ask_uncertain(env, &server, 1, &mut ledger).await;
    // Every order that reached Redis's outbox on the surviving node is in MySQL (without
    // WAIT the item itself may be gone with the dead master: nothing stricter can hold).
    let queue = env.topology().orders_queue;
    eventually(
        std::time::Duration::from_secs(60),
        "orders landed",
        || async {
            let stats = env.stats(&server, 1).await;
            let depth = queue_depth_on(&amqp_url(), &queue).await;
            if stats["pending"] == 0 && depth == Some(0) {
                Ok(())
            } else {
                Err(format!("{stats} queue {depth:?}"))
            }
        },
    )
    .await;
    let rows = env.orders(1).await;
    let live = rows.iter().filter(|(_, _, s)| s != "cancelled").count();
    let in_mysql: std::collections::HashSet<&str> =
        rows.iter().map(|(sn, _, _)| sn.as_str()).collect();
    let failover = Failover {
        began,
        whole_at,
        oversold: live.saturating_sub(300),
        lost: ledger
            .won
            .iter()
            .filter(|sn| !in_mysql.contains(sn.as_str()))
            .count(),
        answers: ledger.answers.clone(),
    };
    (on, server, ledger, failover)
}

/// What buyers may hear while a master fails over (docs/faults.md's row).
const ALLOWED_THROUGH_A_FAILOVER: &[&str] = &[
    "202 queued",
    "409 duplicate",
    "410 sold_out",
    "503 unavailable",
    "503 circuit_open",
];

/// With `SECKILL_REDIS_WAIT_REPLICAS=1` a master failover mid-burst loses no `202` and
/// sells no unit twice: a unit is answered, and its order published, only once a replica
/// holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_master_killed_mid_burst_with_wait_loses_nothing_and_oversells_nothing() {
    let (on, server, mut ledger, failover) = failover_mid_burst(1).await;
    let env = &on.env;
    eprintln!(
        "failover with WAIT 1: {:?}; oversold {}, lost {}; the cluster whole again {:?} after the kill",
        failover.answers, failover.oversold, failover.lost, failover.whole_at
    );
    // docs/faults.md: until the promoted master has a replica again (the killed node,
    // restarted once the first crowd has gone) buyers hear `503 unavailable` (`refuse`
    // holds its bucket back), or `503 circuit_open` while the automatic breaker is tripped
    // by the failing Redis, and their order named or sold out; no `503` once the cluster
    // is whole (allowed: 2 s for the replica watcher to look, on a loaded 2-core machine),
    // and every order in MySQL within 15 s of it (the second crowd included).
    let liveness = Liveness {
        fault: "Redis Cluster master killed (WAIT 1)",
        allowed: ALLOWED_THROUGH_A_FAILOVER,
        trouble_within: failover.whole_at + Duration::from_secs(2),
        drained_within: failover.whole_at + Duration::from_secs(15),
    };
    after_fault(
        env,
        &server,
        300,
        &amqp_url(),
        failover.began,
        &mut ledger,
        &liveness,
    )
    .await;
    assert_eq!((failover.oversold, failover.lost), (0, 0));
    server.stop().await;
}

/// Without `WAIT`, by hand: `cargo test clusters::failover_without_wait -- --ignored
/// --nocapture` runs the same failover five times and prints what was sold twice or
/// lost. It asserts what docs/faults.md's row says of it: on one host, with the replica
/// a few milliseconds behind, no run lost or oversold anything, and buyers heard only the
/// answers the row with `WAIT` allows — a run that loses one fails, and the row must change.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, run by hand"]
async fn failover_without_wait() {
    for run in 1..=5 {
        let (_on, server, _ledger, failover) = failover_mid_burst(0).await;
        eprintln!(
            "failover without WAIT, run {run}: {:?}; oversold {}, lost {}",
            failover.answers, failover.oversold, failover.lost
        );
        assert_eq!(
            (failover.oversold, failover.lost),
            (0, 0),
            "run {run}: docs/faults.md says none of five runs lost or oversold"
        );
        let odd: Vec<&String> = failover
            .answers
            .keys()
            .filter(|a| !ALLOWED_THROUGH_A_FAILOVER.contains(&a.as_str()))
            .collect();
        assert!(odd.is_empty(), "run {run}: answers {odd:?}");
        server.stop().await;
    }
}

/// The sale shapes on the cluster, each as on one Redis: more than one per buyer with
/// retried keys (over 4 buckets), keys alone, waves over 2 buckets, and a draw by rank
/// over 4 buckets (items 1–4 of one namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sale_shapes_work_on_a_redis_cluster() {
    let Turn { env, .. } = &turn("redis_shapes").await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.scheduler_poll_ms = 200;
            s.rate_per_user = 0;
            // The shapes' exact answers, not the instance's own breaker: a crowd of 960 on
            // the cluster, with the suite's other tests on two cores, made purchases slow
            // enough to trip it in 2 of 7 runs, and the waves that followed heard `503
            // circuit_open` for its 5 s (the breaker has tests of its own).
            s.breaker_auto = false;
        })
        .await;
    crate::shapes::per_user_with_retried_keys(env, &server, 1).await;
    crate::shapes::idempotency_keys(env, &server, 2).await;
    crate::shapes::waves(env, &server, 3).await;
    crate::draws::draw_by_rank(env, &server, 4).await;
}

/// A hot item over 8 buckets on the cluster (their hash tags put them on several
/// masters), with `WAIT 1` (loans between buckets wait for their lender's replica too): a
/// crowd buys every unit exactly once, one per user, with the total check and the
/// invariants; stats and reconciliation add up across the buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_item_over_eight_buckets_sells_on_several_masters() {
    let Turn { cluster, env, .. } = &turn("redis_buckets").await;
    let server = env.server_with(ALL_ROLES, waiting_for_a_replica).await;
    env.item(1, 400).buckets(8).on_sale(&server).await;
    let keys = seckill::testing::Keys::new(&env.settings.namespace);
    let masters: std::collections::BTreeSet<u16> =
        seckill::domain::BucketId::all(seckill::domain::ItemId::new(1).unwrap(), 8)
            .map(|stock| cluster.lock().unwrap().master_of(&keys.bucket(stock).meta))
            .collect();
    eprintln!("8 buckets on the masters {masters:?}");

    let answered = std::sync::atomic::AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let mut ledger = crowd(env, 1, 1..1_201, &at, &answered).await;
    // Everyone presses again (a 503 while replicas lag is answered by the second press),
    // and newcomers take whatever is left.
    ledger.merge(crowd(env, 1, 1..1_201, &at, &answered).await);
    ledger.merge(crowd(env, 1, 1_201..1_601, &at, &answered).await);
    ask_uncertain(env, &server, 1, &mut ledger).await;
    quiet(
        env,
        &server,
        1,
        &amqp_url(),
        std::time::Duration::from_secs(30),
    )
    .await;
    total_check(env, &server, 1, 400, &ledger).await;
    assert_eq!(env.orders(1).await.len(), 400, "{:?}", ledger.answers);
    let (status, json) = env.admin_post(&server, "/admin/items/1/reconcile").await;
    assert_eq!(
        (status, json["consistent"].as_bool(), json["sold"].as_u64()),
        (200, Some(true), Some(400)),
        "{json}"
    );
    server.stop().await;
}

/// With `WAIT 1`, a crowd of 100 connections on an item of one bucket — every win on one
/// master, each waiting for its replica — hears `202` for every unit and never `503`: the
/// wins on a master share their `WAIT`s (group commit) instead of queueing behind each
/// other past the limit (before, 408–523 of 1,000 winners heard `503`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_a_crowd_on_one_master_hears_202_for_every_unit() {
    let Turn { cluster, env, .. } = &turn("redis_wait_crowd").await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.redis_wait_replicas = 1;
            s.rate_per_user = 0;
            s.scheduler_poll_ms = 200;
        })
        .await;
    env.item(1, 1_000).on_sale(&server).await;
    let master = cluster.lock().unwrap().master_of(&env.item_keys(1).meta);
    let waits = || {
        let stats = cluster
            .lock()
            .unwrap()
            .ask(master, &["INFO", "commandstats"]);
        stats
            .lines()
            .find_map(|line| line.strip_prefix("cmdstat_wait:calls="))
            .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let waits_before = waits();
    let answered = std::sync::atomic::AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let mut ledger = crowd_of(env, 1, 1..3_001, &at, &answered, 100).await;
    let shared = waits() - waits_before;
    eprintln!("1,000 wins on one master shared {shared} WAITs");
    // A WAIT per win was what queued; grouped, a crowd's wins share far fewer.
    assert!(shared < 500, "{shared} WAITs for 1,000 wins");
    // Everyone presses again: winners hear their order named, the others sold out.
    ledger.merge(crowd_of(env, 1, 1..3_001, &at, &answered, 100).await);
    let refused: u64 = ledger
        .answers
        .iter()
        .filter(|(answer, _)| answer.starts_with('5') || answer.as_str() == "transport")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        (ledger.won.len(), refused),
        (1_000, 0),
        "{:?}",
        ledger.answers
    );
    quiet(
        env,
        &server,
        1,
        &amqp_url(),
        std::time::Duration::from_secs(30),
    )
    .await;
    total_check(env, &server, 1, 1_000, &ledger).await;
    server.stop().await;
}

/// With `WAIT 1` and every node up, a crowd hammering a one-bucket item of 1,000 units:
/// 5,000 users pressing 20,000 times on 100 connections, each again whatever they were
/// told. For its first second the item's master gives the replica watcher no `INFO` —
/// what a saturated host does to it (no answer within 500 ms), made certain here by
/// refusing the command on that node (ACL) — while its replica acknowledges every write.
/// Every press hears `202`, `409 duplicate` or `410 sold_out`, never `503`; 1,000 win;
/// the stats are consistent and the total check passes. (Before, a look without an
/// answer counted the master short at once: 1,534 and 1,686 presses heard `503` in two
/// runs. Without the ACL this crowd never kept `INFO` waiting 500 ms here, even beside
/// four CPU hogs: a debug build on this VM slows every node alike.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_a_crowd_pressing_on_with_every_node_up_hears_no_503() {
    let Turn { cluster, env, .. } = &turn("redis_wait_presses").await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.redis_wait_replicas = 1;
            s.rate_per_user = 0;
            s.scheduler_poll_ms = 200;
        })
        .await;
    env.item(1, 1_000).on_sale(&server).await;
    // The watcher has looked, and found the master in step.
    let stats = env.stats(&server, 1).await;
    assert_eq!(stats["replicas"]["short"], serde_json::json!([]), "{stats}");
    let master = cluster.lock().unwrap().master_of(&env.item_keys(1).meta);
    // Answered again whatever happens, for the tests after this one.
    struct Answer(&'static std::sync::Mutex<PrivateRedisCluster>, u16);
    impl Drop for Answer {
        fn drop(&mut self) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .ask(self.1, &["ACL", "SETUSER", "default", "+info"]);
        }
    }
    cluster
        .lock()
        .unwrap()
        .ask(master, &["ACL", "SETUSER", "default", "-info"]);
    let answer = Answer(cluster, master);
    let began = std::time::Instant::now();
    let (ledger, ()) = tokio::join!(pressing(env, 1, 5_000, 20_000, server.addr, 100), async {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        drop(answer);
    },);
    eprintln!(
        "20,000 presses in {:?}: {:?}",
        began.elapsed(),
        ledger.answers
    );
    let every_node_up = "a crowd with every node up";
    assert_answers(
        every_node_up,
        &["202 queued", "409 duplicate", "410 sold_out"],
        &ledger,
    );
    assert_eq!(ledger.won.len(), 1_000, "{:?}", ledger.answers);
    quiet(
        env,
        &server,
        1,
        &amqp_url(),
        std::time::Duration::from_secs(30),
    )
    .await;
    let stats = env.stats(&server, 1).await;
    assert_eq!(stats["consistent"], true, "{stats}");
    total_check(env, &server, 1, 1_000, &ledger).await;
    server.stop().await;
}

/// With `WAIT 1` (policy `refuse`), a master is killed mid-burst and its replica takes
/// over with no replica of its own: nothing of the stock stays in limbo. Within 30 s
/// every unit is accounted (`pending` 0, stats consistent) and stats name the buckets
/// short of replicas; pressing again, buyers hear the truth (their order named, or `503`
/// while their bucket waits for a replica — never a false "sold out"), and the rest of
/// the stock sells. Once the killed node is back as a replica, the last units sell too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_left_without_replicas_leaves_no_unit_in_limbo() {
    let Turn {
        cluster,
        env,
        ports,
        dir,
        ..
    } = &turn("redis_alone").await;
    let server = env.server_with(ALL_ROLES, waiting_for_a_replica).await;
    const UNITS: u32 = 600;
    env.item(1, UNITS).buckets(8).on_sale(&server).await;
    let keys = env.keys();
    let item = seckill::domain::ItemId::new(1).unwrap();
    let master = cluster
        .lock()
        .unwrap()
        .master_of(&keys.bucket(seckill::domain::BucketId::new(item, 0)).meta);
    let answered = std::sync::atomic::AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    // Should this test fail, the node comes back for the tests after it.
    let revive = Revive {
        cluster,
        port: master,
    };
    let (mut ledger, _) = tokio::join!(
        crowd(env, 1, 1..1_001, &at, &answered),
        mid_burst(&answered, 150, async {
            cluster.lock().unwrap().kill(master)
        }),
    );
    let up: Vec<u16> = ports.iter().copied().filter(|p| *p != master).collect();
    whole(dir, &up).await;

    // Within 30 s: nothing pending, every unit accounted, the lonely buckets named.
    let stats = eventually(
        std::time::Duration::from_secs(30),
        "no unit in limbo",
        || async {
            let stats = env.stats(&server, 1).await;
            let short = stats["replicas"]["short"].as_array().map_or(0, Vec::len);
            if stats["pending"] == 0 && stats["consistent"] == true && short > 0 {
                Ok(stats)
            } else {
                Err(stats.to_string())
            }
        },
    )
    .await;
    assert_eq!(
        stats["replicas"]["expected_back"],
        serde_json::json!([]),
        "{stats}"
    );

    // Everyone presses again, and newcomers come: the healthy buckets sell out, the lonely
    // ones wait — no buyer is told "sold out" while they hold units.
    let mut again = crowd(env, 1, 1..2_001, &at, &answered).await;
    ask_uncertain(env, &server, 1, &mut again).await;
    let stats = env.stats(&server, 1).await;
    let false_sold_out = again.answers.get("410 sold_out").copied().unwrap_or(0);
    assert!(
        stats["remaining"].as_u64() > Some(0) && false_sold_out == 0,
        "{stats} {:?}",
        again.answers
    );
    ledger.merge(again);
    ask_uncertain(env, &server, 1, &mut ledger).await;
    eventually(
        std::time::Duration::from_secs(30),
        "orders landed",
        || async {
            let stats = env.stats(&server, 1).await;
            if stats["pending"] == 0 && stats["consistent"] == true {
                Ok(())
            } else {
                Err(stats.to_string())
            }
        },
    )
    .await;
    let sold = |stats: &serde_json::Value| {
        stats["orders"]["unpaid"].as_u64().unwrap_or(0)
            + stats["orders"]["paid"].as_u64().unwrap_or(0)
    };
    let before_the_replica = sold(&env.stats(&server, 1).await);
    eprintln!(
        "a master alone: {before_the_replica} of {UNITS} units sold while it had no replica; {:?}",
        ledger.answers
    );

    // The killed node comes back, as the lonely master's replica: the last units sell.
    drop(revive);
    whole(dir, ports).await;
    ledger.merge(crowd(env, 1, 1..3_001, &at, &answered).await);
    ask_uncertain(env, &server, 1, &mut ledger).await;
    quiet(
        env,
        &server,
        1,
        &amqp_url(),
        std::time::Duration::from_secs(30),
    )
    .await;
    total_check(env, &server, 1, UNITS, &ledger).await;
    assert_eq!(sold(&env.stats(&server, 1).await), u64::from(UNITS));
    // What buyers heard throughout: a sale, their order named, sold out, or `503` while
    // their bucket waited for a replica — nothing else.
    assert_answers(
        "a master left without replicas",
        &[
            "202 queued",
            "409 duplicate",
            "410 sold_out",
            "503 unavailable",
        ],
        &ledger,
    );
    server.stop().await;
}

/// Every unit of a split item accounted right now: stats consistent, nothing pending, and
/// remaining (over all buckets) + unpaid + paid = total. Returns the stats.
async fn stock_adds_up(
    env: &TestEnv,
    server: &TestServer,
    item: u64,
    total: u32,
) -> serde_json::Value {
    eventually(
        std::time::Duration::from_secs(30),
        "the stock adding up",
        || async {
            let stats = env.stats(server, item).await;
            let counted = stats["remaining"].as_u64().unwrap_or(0)
                + stats["orders"]["unpaid"].as_u64().unwrap_or(0)
                + stats["orders"]["paid"].as_u64().unwrap_or(0);
            if stats["pending"] == 0 && stats["consistent"] == true && counted == u64::from(total) {
                Ok(stats)
            } else {
                Err(stats.to_string())
            }
        },
    )
    .await
}

/// No unit sold twice and no buyer holding two: live orders within the total, one per
/// user, every `202` a row.
async fn sold_once(env: &TestEnv, item: u64, total: u32, ledger: &Ledger) {
    let rows = env.orders(item).await;
    let live: Vec<_> = rows.iter().filter(|(_, _, s)| s != "cancelled").collect();
    let users: std::collections::HashSet<u64> = live.iter().map(|(_, u, _)| *u).collect();
    let in_mysql: std::collections::HashSet<&str> =
        rows.iter().map(|(sn, _, _)| sn.as_str()).collect();
    let lost: Vec<&String> = ledger
        .won
        .iter()
        .filter(|sn| !in_mysql.contains(sn.as_str()))
        .collect();
    assert!(
        live.len() <= total as usize,
        "{} live orders for {total} units",
        live.len()
    );
    assert_eq!(users.len(), live.len(), "a user holds two live orders");
    assert!(lost.is_empty(), "202s with no row: {lost:?}");
}

/// A split item force-reloaded as its sale opens, with a crowd pressing from the first
/// moment: the warm-up holds every bucket back before its decisive read, so no bucket
/// sells its old units while another already has its new share (before, the late buckets
/// sold, then failed their swap, and loans slipped past the guard). A whole load, nothing
/// sold twice, the stock adding up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_item_force_reloaded_as_its_sale_opens_sells_nothing_twice() {
    let Turn { env, .. } = &turn("redis_reload_opening").await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.rate_per_user = 0;
            s.scheduler_poll_ms = 200;
        })
        .await;
    const UNITS: u32 = 200_000;
    let later = chrono::Utc::now() + chrono::Duration::minutes(10);
    let item = || env.item(1, UNITS).buckets(8);
    item()
        .window(later, later + chrono::Duration::hours(1))
        .on_sale(&server)
        .await;
    // The window moves: the sale opens in a moment, reloaded just before.
    let opens = chrono::Utc::now() + chrono::Duration::milliseconds(1_500);
    item()
        .window(opens, opens + chrono::Duration::hours(1))
        .put(&server)
        .await;
    let until = |at: chrono::DateTime<chrono::Utc>| async move {
        if let Ok(wait) = (at - chrono::Utc::now()).to_std() {
            tokio::time::sleep(wait).await;
        }
    };
    let reload = async {
        // Far enough ahead that a busy 2-core machine still starts it before the opening
        // (30 ms was not, with the whole suite running); the load of 200,000 units takes
        // longer than that, so the sale still opens mid-load.
        until(opens - chrono::Duration::milliseconds(150)).await;
        let started = std::time::Instant::now();
        let answer = env
            .admin_post(&server, "/admin/items/1/warmup?force=true")
            .await;
        (answer, started.elapsed())
    };
    let answered = std::sync::atomic::AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let pressing = async {
        until(opens).await;
        crowd_of(env, 1, 1..2_001, &at, &answered, 100).await
    };
    let (((status, json), took), mut ledger) = tokio::join!(reload, pressing);
    eprintln!(
        "reload as the sale opens: {status} in {took:?}; {:?}",
        ledger.answers
    );
    assert_eq!(status, 200, "{json}");
    ask_uncertain(env, &server, 1, &mut ledger).await;
    quiet(
        env,
        &server,
        1,
        &amqp_url(),
        std::time::Duration::from_secs(30),
    )
    .await;
    stock_adds_up(env, &server, 1, UNITS).await;
    sold_once(env, 1, UNITS, &ledger).await;
    server.stop().await;
}

/// A paused split item reloaded (`?force=true`, as the procedures in docs/operations.md do) while its
/// buyers cancel: cancels wait while the warm-up holds the buckets back, and their units
/// come back after it, to the buyer records it rebuilt. A whole load (before, a release
/// between the decisive read and a bucket's swap failed it `409 raced` half-way, with
/// nothing to say the item was half-loaded), and every unit back on sale.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_split_item_reloads_whole_while_its_buyers_cancel() {
    let Turn { env, .. } = &turn("redis_reload_cancels").await;
    let server = env
        .server_with(ALL_ROLES, |s| s.scheduler_poll_ms = 200)
        .await;
    const UNITS: u32 = 40_000;
    env.item(1, UNITS).buckets(8).on_sale(&server).await;
    let answered = std::sync::atomic::AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let ledger = crowd(env, 1, 1..301, &at, &answered).await;
    assert_eq!(ledger.won.len(), 300, "{:?}", ledger.answers);
    quiet(
        env,
        &server,
        1,
        &amqp_url(),
        std::time::Duration::from_secs(30),
    )
    .await;
    assert_eq!(env.admin_post(&server, "/admin/items/1/pause").await.0, 200);
    let orders = env.orders(1).await;
    let cancelling = futures::stream::iter(&orders)
        .map(|(sn, user, _)| {
            let env = &env;
            let server = &server;
            async move {
                env.post_as(server, &format!("/api/orders/{sn}/cancel"), *user)
                    .await
                    .0
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<u16>>();
    let reload = async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        env.admin_post(&server, "/admin/items/1/warmup?force=true")
            .await
    };
    let (cancels, (status, json)) = tokio::join!(cancelling, reload);
    assert!(cancels.iter().all(|s| *s == 200), "{cancels:?}");
    assert_eq!(status, 200, "{json}");
    assert_eq!(
        env.admin_post(&server, "/admin/items/1/resume").await.0,
        200
    );
    let stats = stock_adds_up(env, &server, 1, UNITS).await;
    assert_eq!(stats["remaining"], UNITS, "{stats}");
    server.stop().await;
}

/// Starts a killed node of the shared cluster again when dropped.
struct Revive {
    cluster: &'static std::sync::Mutex<PrivateRedisCluster>,
    port: u16,
}

impl Drop for Revive {
    fn drop(&mut self) {
        let mut cluster = self.cluster.lock().unwrap_or_else(|e| e.into_inner());
        cluster.restart(self.port);
    }
}

/// Without `WAIT`, a master fails over to a replica that lacks the last sales (its link
/// was cut, so it had nothing after it), while their orders wait in RabbitMQ (no consumer
/// runs). The procedure in docs/operations.md — pause, `warmup?force=true`, resume — must see the
/// failover: the promoted replica has been up for long, but it is not the server that
/// took the load, so the warm-up rebuilds from MySQL once every order on its way has
/// landed (`409 orders_in_flight` until a consumer runs). Before, it ran as a plain
/// reload: those orders were not counted, their units sold again, their buyers bought
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_without_wait_is_rebuilt_by_the_readme_procedure() {
    let Turn {
        cluster,
        env,
        ports,
        dir,
        ..
    } = &turn("redis_failover_rebuild").await;
    let edge = [Role::Api, Role::Scheduler];
    let server = env.server_with(&edge, |s| s.scheduler_poll_ms = 200).await;
    const UNITS: u32 = 300;
    env.item(1, UNITS).on_sale(&server).await;
    let master = cluster.lock().unwrap().master_of(&env.item_keys(1).meta);
    let answered = std::sync::atomic::AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let mut ledger = crowd(env, 1, 1..101, &at, &answered).await;

    // The master's replica is cut off: the next sales live on the master alone.
    cluster.lock().unwrap().cut_replicas_off(master);
    let cut_off = crowd(env, 1, 101..201, &at, &answered).await;
    assert_eq!(cut_off.won.len(), 100, "{:?}", cut_off.answers);
    ledger.merge(cut_off);
    let revive = lose_master(cluster, master, ports, dir).await;

    // The procedure in docs/operations.md. Right after the failover the server may not
    // have the new master's address yet: its `503` is asked again, as an operator would.
    eventually(std::time::Duration::from_secs(15), "paused", || async {
        match env.admin_post(&server, "/admin/items/1/pause").await {
            (200, _) => Ok(()),
            (status, body) => Err(format!("{status} {body}")),
        }
    })
    .await;
    // Asked again, as docs/operations.md says, while a consumer started at the first
    // `orders_in_flight` drains the queue (a warm-up waits 5 s for an empty queue, and
    // on a busy machine the drain may take longer).
    let mut consumer = None;
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let report = loop {
        let (status, json) = env
            .admin_post(&server, "/admin/items/1/warmup?force=true")
            .await;
        match (status, json["code"].as_str()) {
            (200, _) => break json,
            (409, Some("orders_in_flight")) if std::time::Instant::now() < give_up => {
                if consumer.is_none() {
                    consumer = Some(env.server(&[Role::Consumer]).await);
                }
            }
            _ => panic!("warm-up: {status} {json}"),
        }
    };
    assert_eq!(report["rebuilt"], true, "{report}");
    if consumer.is_none() {
        consumer = Some(env.server(&[Role::Consumer]).await);
    }
    assert_eq!(
        env.admin_post(&server, "/admin/items/1/resume").await.0,
        200
    );
    let resumed = Instant::now();
    // Everyone presses again, newcomers too: what is left sells, once — buyers hear a
    // sale, their order named or sold out, and every order is in MySQL within 15 s of the
    // resume (a crowd of 600, on a loaded 2-core machine).
    ledger.merge(crowd(env, 1, 1..601, &at, &answered).await);
    let liveness = Liveness {
        fault: "a failover without WAIT, after the procedure",
        allowed: &["202 queued", "409 duplicate", "410 sold_out"],
        trouble_within: Duration::ZERO,
        drained_within: Duration::from_secs(15),
    };
    after_fault(
        env,
        &server,
        UNITS,
        &amqp_url(),
        resumed,
        &mut ledger,
        &liveness,
    )
    .await;
    sold_once(env, 1, UNITS, &ledger).await;
    drop(revive);
    whole(dir, ports).await;
    if let Some(consumer) = consumer {
        consumer.stop().await;
    }
    server.stop().await;
}

/// With `WAIT 1`, a unit lent between two buckets on different masters, while the home
/// bucket's replica is cut off: the lender forgets its loan only once the home master's
/// replicas hold the unit's arrival. The home master then fails over to that replica
/// (which never heard of the arrival) — the loan is still recorded, so the unit goes back
/// to its lender. (Before, the lender forgot it at once, and the unit was on neither
/// list: one unit short for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_loan_is_forgotten_only_once_the_home_masters_replicas_hold_it() {
    use seckill::domain::{BucketId, ItemId, UserId};
    let Turn {
        cluster,
        env,
        ports,
        dir,
        ..
    } = &turn("redis_loan_failover").await;
    let server = env.server_with(ALL_ROLES, waiting_for_a_replica).await;
    // An item of two buckets on two masters, one unit each.
    let keys = env.keys();
    let master_of = |id: u64, bucket: u8| {
        let stock = BucketId::new(ItemId::new(id).unwrap(), bucket);
        cluster.lock().unwrap().master_of(&keys.bucket(stock).meta)
    };
    let (id, home_master) = (1..200)
        .find_map(|id| {
            let home = master_of(id, 0);
            (home != master_of(id, 1)).then_some((id, home))
        })
        .expect("an item whose buckets are on two masters");
    env.item(id, 2).buckets(2).on_sale(&server).await;
    let item = ItemId::new(id).unwrap();
    let mut at_home = (1..).filter(|u| BucketId::home(item, UserId::new(*u), 2).index == 0);
    let (first, second) = (at_home.next().unwrap(), at_home.next().unwrap());
    eventually(
        std::time::Duration::from_secs(10),
        "the first buyer's unit",
        || async {
            match env.buy(&server, first, id).await {
                (202 | 409, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    // Its order in MySQL and out of `pending` first: a clean-up the failover lost would
    // leave a stale entry for the pending sweep (a minute later), counted twice till then.
    env.wait_for_orders(&server, id, 1, std::time::Duration::from_secs(10))
        .await;

    // The home master's replica is cut off. The home bucket is empty: the second buyer's
    // press borrows the other bucket's unit (or is refused first, once the server sees
    // the replica gone). It cannot be confirmed either way.
    cluster.lock().unwrap().cut_replicas_off(home_master);
    let (status, json) = env.buy(&server, second, id).await;
    assert_ne!(status, 202, "{json}");
    drop(lose_master(cluster, home_master, ports, dir).await);
    whole(dir, ports).await;
    // Every unit accounted: the first buyer's, and the one lent, back with its lender.
    let stats = stock_adds_up(env, &server, id, 2).await;
    assert_eq!(stats["remaining"], 1, "{stats}");
    server.stop().await;
}
/// A master whose replica is stuck (alive, linked, acknowledging nothing): with `WAIT 1`,
/// a server under `SECKILL_REDIS_WAIT_POLICY=refuse` answers `503` and takes no unit
/// there; one under `degrade` sells on and counts what it sold without the replica. Once
/// the replica moves again, the refusing server sells again, and every unit is
/// accounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_short_of_replicas_refuses_or_degrades_as_told() {
    let Turn {
        cluster,
        env,
        ports,
        dir,
        ..
    } = &turn("redis_wait_policy").await;
    let refusing = env
        .server_with(ALL_ROLES, |s| s.redis_wait_replicas = 1)
        .await;
    let degrading = env
        .server_with(&[Role::Api], |s| {
            s.redis_wait_replicas = 1;
            s.redis_wait_policy = seckill::config::WaitPolicy::Degrade;
            s.rate_per_user = 0;
        })
        .await;
    const UNITS: u32 = 10;
    env.item(1, UNITS).on_sale(&refusing).await;
    assert_eq!(env.buy(&refusing, 1, 1).await.0, 202);
    let master = cluster.lock().unwrap().master_of(&env.item_keys(1).meta);
    let replica = cluster.lock().unwrap().replica_of(master);
    // Thawed whatever happens, for the tests after this one.
    struct Thaw(&'static std::sync::Mutex<PrivateRedisCluster>, u16);
    impl Drop for Thaw {
        fn drop(&mut self) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .thaw(self.1);
        }
    }
    cluster.lock().unwrap().freeze(replica);
    let thaw = Thaw(cluster, replica);
    // Refused before the grab once the watcher sees the replica behind (its last
    // acknowledgement over 2 s old); a win in between is given back. Nothing taken.
    eventually(
        std::time::Duration::from_secs(10),
        "the bucket named short of replicas",
        || async {
            let (status, json) = env.buy(&refusing, 2, 1).await;
            let stats = env.stats(&refusing, 1).await;
            if status == 503 && stats["replicas"]["short"] == serde_json::json!([0]) {
                Ok(())
            } else {
                Err(format!("{status} {json} {stats}"))
            }
        },
    )
    .await;
    // The one who holds a unit is told so, even now.
    let (status, json) = env.buy(&refusing, 1, 1).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (409, Some("duplicate")),
        "{json}"
    );
    // Sold without the replica, and counted.
    let (status, json) = env.buy(&degrading, 3, 1).await;
    assert_eq!(status, 202, "{json}");
    let metrics = env.metrics_text(&degrading).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("seckill_redis_wait_total") && l.contains("degraded")),
        "{metrics}"
    );
    // The replica moves again: sales again.
    drop(thaw);
    whole(dir, ports).await;
    eventually(
        std::time::Duration::from_secs(10),
        "a sale again",
        || async {
            match env.buy(&refusing, 2, 1).await {
                (202, _) => Ok(()),
                other => Err(format!(
                    "{other:?}; the master says {}",
                    cluster
                        .lock()
                        .unwrap()
                        .ask(master, &["INFO", "replication"])
                )),
            }
        },
    )
    .await;
    let stats = stock_adds_up(env, &refusing, 1, UNITS).await;
    assert_eq!(stats["remaining"], UNITS - 3, "{stats}");
    degrading.stop().await;
    refusing.stop().await;
}

/// An operator's work goes on while the item's replica is frozen (alive, its socket open,
/// answering nothing): a `PUT` of an item that exists is written under its lock, which it
/// must let go of without waiting on a node that holds nothing of it — a mode change
/// refused (`409 mode_fixed`), then two `PUT`s in a row answer `200`, a pause and a
/// resume too, and a bulk `PUT` of three items twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_writes_items_while_a_replica_is_frozen() {
    let Turn { cluster, env, .. } = &turn("redis_frozen_admin").await;
    let server = env
        .server_with(ALL_ROLES, |s| s.redis_wait_replicas = 1)
        .await;
    env.item(1, 10).on_sale(&server).await;
    let master = cluster.lock().unwrap().master_of(&env.item_keys(1).meta);
    let replica = cluster.lock().unwrap().replica_of(master);
    struct Thaw(&'static std::sync::Mutex<PrivateRedisCluster>, u16);
    impl Drop for Thaw {
        fn drop(&mut self) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .thaw(self.1);
        }
    }
    cluster.lock().unwrap().freeze(replica);
    let _thaw = Thaw(cluster, replica);
    let draw = chrono::Utc::now() + chrono::Duration::seconds(30);
    let (status, json) = env.item(1, 10).draw(draw).try_put(&server).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (409, Some("mode_fixed")),
        "{json}"
    );
    for total in [11, 12] {
        let (status, json) = env.item(1, total).try_put(&server).await;
        assert_eq!(status, 200, "PUT total {total}: {json}");
    }
    for action in ["pause", "resume"] {
        let (status, json) = env
            .admin_post(&server, &format!("/admin/items/1/{action}"))
            .await;
        assert_eq!(status, 200, "{action}: {json}");
    }
    let items: Vec<serde_json::Value> = (2..5)
        .map(|id| {
            let mut body = env.item(id, 5).body();
            body["id"] = serde_json::json!(id);
            body
        })
        .collect();
    for _ in 0..2 {
        let response = env
            .admin(reqwest::Method::PUT, &server, "/admin/items")
            .json(&serde_json::json!({ "items": items }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{:?}", response.text().await);
    }
    server.stop().await;
}

/// A waiting room on the cluster with `WAIT 1`, its item over 2 buckets: the queue's master
/// is killed while buyers are being let in. Every pass a buyer saw before the kill is still
/// theirs after it (admissions are shown only once a replica holds them), admission goes on
/// in rank order to exactly as many buyers as there are units, and each buys with their pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_room_keeps_every_pass_it_showed_through_a_failover() {
    use crate::waiting_room::{ITEM, admitted, buy_with, figures, join, rank};
    let Turn {
        cluster,
        env,
        ports,
        dir,
        ..
    } = &turn("redis_queue").await;
    let running = env.server_with(ALL_ROLES, waiting_for_a_replica).await;
    // Room for 300 joins (each waiting for its replica) on a loaded 2-core machine before
    // the pre-queue closes.
    let start = chrono::Utc::now() + chrono::Duration::seconds(20);
    env.item(ITEM, 60)
        .buckets(2)
        .window(start, start + chrono::Duration::hours(1))
        .queued(serde_json::json!({ "admit_per_s": 20 }))
        .on_sale(&running)
        .await;
    let server = &running;
    futures::stream::iter(1..=300u64)
        .for_each_concurrent(32, |user| async move {
            let (status, joined) = join(env, server, user, None).await;
            assert_eq!(status, 200, "{joined}");
        })
        .await;
    assert!(chrono::Utc::now() < start, "the joins took past the start");
    // While buyers are being let in (20 a second), the queue's master dies.
    eventually(Duration::from_secs(40), "ten let in", || async {
        let report = figures(env, server).await;
        match report["admitted"].as_u64() {
            Some(n) if n >= 10 => Ok(()),
            _ => Err(report.to_string()),
        }
    })
    .await;
    let before = admitted(env, server, 1..=300).await;
    let state = format!("{}:{{queue:{ITEM}}}:v1:state", env.settings.namespace);
    let master = cluster.lock().unwrap().master_of(&state);
    cluster.lock().unwrap().kill(master);
    let up: Vec<u16> = ports.iter().copied().filter(|p| *p != master).collect();
    whole(dir, &up).await;
    cluster.lock().unwrap().restart(master);
    whole(dir, ports).await;

    let after = eventually(Duration::from_secs(30), "sixty let in", || async {
        let report = figures(env, server).await;
        if report["admitted"].as_u64() != Some(60) {
            return Err(report.to_string());
        }
        let passes = admitted(env, server, 1..=300).await;
        if passes.len() == 60 {
            Ok(passes)
        } else {
            Err(format!("{} passes shown; {report}", passes.len()))
        }
    })
    .await;
    for (user, pass) in &before {
        assert_eq!(
            after.get(user),
            Some(pass),
            "user {user}'s pass, shown before the kill"
        );
    }
    let (_, item) = env.get(server, &format!("/api/items/{ITEM}"), None).await;
    let seed = item["queue_seed"].as_str().unwrap();
    let mut order: Vec<u64> = (1..=300).collect();
    order.sort_by_key(|user| (rank(seed, *user), *user));
    let first: std::collections::HashSet<u64> = order[..60].iter().copied().collect();
    assert_eq!(
        after
            .keys()
            .copied()
            .collect::<std::collections::HashSet<_>>(),
        first
    );
    let report = figures(env, server).await;
    assert_eq!(report["reserved_units"].as_u64(), Some(60), "{report}");

    // Each buys with their pass (pressing again on a `503`, as a storefront does).
    let mut won = Vec::new();
    for (user, pass) in &after {
        let sn = eventually(
            Duration::from_secs(10),
            "a purchase with a pass",
            || async {
                match buy_with(env, server, *user, Some(pass)).await {
                    (202, bought) => Ok(bought["order_sn"].as_str().unwrap().to_owned()),
                    (status, body) => Err(format!("{status} {body}")),
                }
            },
        )
        .await;
        won.push(sn);
    }
    env.wait_for_orders(server, ITEM, 60, Duration::from_secs(30))
        .await;
    env.assert_invariants(server, ITEM, 60, &won).await;
    running.stop().await;
}
