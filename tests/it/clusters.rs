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
