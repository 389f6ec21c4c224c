//! Beyond one machine: the server on a RabbitMQ cluster with quorum queues, a node of it
//! killed mid-burst. Every cluster is private, started by the test on spare ports.

use seckill::config::{QueueType, Secret};

use crate::helpers::*;
use crate::history::*;

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
    // The server connects to the first node that answers: the first.
    let amqp = nodes[1].url();
    let fault = async { nodes[0].kill() };
    fault_mid_burst(&env, &server, &amqp, "RabbitMQ cluster node killed", fault).await;
    let queues = nodes[1].ctl(&["list_queues", "name", "type"]);
    let orders = format!("{}\tquorum", env.topology().orders_queue);
    assert!(queues.lines().any(|l| l.trim() == orders), "{queues}");
    server.stop().await;
}

/// The whole server on a private Redis Cluster (3 masters, 3 replicas): a burst with the
/// total check and the invariants; unpaid orders timing out and their units selling
/// again; warm-ups (a second one refused, a forced one after a pause); reconciliation;
/// a breaker and a closed shop refusing purchases. Every script and pipeline keeps to
/// one slot, or this fails with CROSSSLOT.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_server_runs_on_a_redis_cluster() {
    let cluster = PrivateRedisCluster::start(3).await;
    let env = TestEnv::on_redis_cluster("redis_cluster", &cluster.seeds()).await;
    let server = env
        .server_with(ALL_ROLES, |s| s.scheduler_poll_ms = 200)
        .await;

    // A burst: 600 units, 2,000 buyers.
    env.item_on_sale(&server, 1, 600).await;
    let answered = std::sync::atomic::AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let ledger = crowd(&env, 1, 1..2_001, &at, &answered).await;
    assert_eq!(ledger.won.len(), 600, "{:?}", ledger.answers);
    quiet(
        &env,
        &server,
        1,
        &amqp_url(),
        std::time::Duration::from_secs(30),
    )
    .await;
    total_check(&env, &server, 1, 600, &ledger).await;

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
    env.item_paying_within(&server, 2, 20, 1).await;
    let second = crowd(&env, 2, 1..21, &at, &answered).await;
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
    assert_eq!(
        env.buy(&server, 1, 2).await.0,
        202,
        "the cancelled buyer buys again"
    );

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
