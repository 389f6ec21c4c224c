//! Warm-ups that must not sell a unit twice: after Redis lost an item's state while orders
//! were still on their way to MySQL, and two at once; and orders MySQL lost (a failover to
//! an asynchronous replica) written back by the reconciliation.

use std::time::Duration;

use futures::future::join_all;
use redis::AsyncCommands;
use serde_json::Value;

use seckill::Role;

use crate::support::*;

/// Buys as each user in turn: the order numbers of the `202`s, and every answer's code.
async fn buy_each(
    env: &TestEnv,
    server: &TestServer,
    item: u64,
    users: impl IntoIterator<Item = u64>,
) -> (Vec<String>, Vec<(u64, u16, Value)>) {
    let mut won = Vec::new();
    let mut answers = Vec::new();
    for user in users {
        let (status, json) = env.buy(server, user, item).await;
        if status == 202 {
            won.push(json["order_sn"].as_str().unwrap().to_owned());
        }
        answers.push((user, status, json));
    }
    (won, answers)
}

/// Redis loses the item while its orders wait in RabbitMQ (no consumer runs): the
/// warm-up refuses a live sale, then — paused — refuses while orders wait in the queue,
/// then rebuilds from MySQL once they landed; buyers keep their orders and nobody buys
/// twice, and no unit is sold twice. This is the recovery procedure of docs/operations.md.
#[tokio::test]
async fn a_warmup_after_redis_lost_the_item_waits_for_the_orders_in_flight() {
    let env = TestEnv::new("rebuild").await;
    let api = env.server(&[Role::Api, Role::Scheduler]).await;
    env.item(1, 20).on_sale(&api).await;
    let (first, _) = buy_each(&env, &api, 1, 1..=8).await;
    assert_eq!(first.len(), 8);
    // Confirmed by RabbitMQ (out of the outbox), waiting in its queue.
    eventually(Duration::from_secs(10), "orders in the queue", || async {
        let stats = env.stats(&api, 1).await;
        let queued = queue_depth(&env.topology().orders_queue).await;
        if env.confirmed(1).await == 8 && queued.is_some_and(|n| n > 0) {
            Ok(())
        } else {
            Err(format!("{stats} queue {queued:?}"))
        }
    })
    .await;

    env.lose_redis_state().await;
    // The buyer did nothing wrong: not "not started" but "unavailable".
    let (status, json) = env.buy(&api, 9, 1).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("unavailable")),
        "{json}"
    );

    // A live sale is not rebuilt under the buyers' feet.
    let (status, json) = env.admin_post(&api, "/admin/items/1/warmup").await;
    assert_eq!(
        (status, json["code"].as_str()),
        (409, Some("sale_live")),
        "{json}"
    );

    // Paused: the eight orders still wait in RabbitMQ, so MySQL is not the whole truth.
    assert_eq!(env.admin_post(&api, "/admin/items/1/pause").await.0, 200);
    let (status, json) = env.admin_post(&api, "/admin/items/1/warmup").await;
    assert_eq!(
        (status, json["code"].as_str()),
        (409, Some("orders_in_flight")),
        "{json}"
    );
    assert!(json["detail"].as_str().unwrap().contains("queue"), "{json}");
    assert_eq!(env.orders(1).await.len(), 0, "nothing landed yet");

    // A consumer drains the queue; now the rebuild loads what MySQL leaves.
    let consumer = env.server(&[Role::Consumer]).await;
    let (status, report) = env.admin_post(&api, "/admin/items/1/warmup").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["rebuilt"], true, "{report}");
    assert_eq!(
        (report["held"].as_u64(), report["remaining"].as_u64()),
        (Some(8), Some(12)),
        "{report}"
    );
    assert_eq!(env.admin_post(&api, "/admin/items/1/resume").await.0, 200);

    // The eight keep their orders (409 names each), and twelve more units sell.
    let (again, answers) = buy_each(&env, &api, 1, 1..=8).await;
    assert!(again.is_empty(), "a buyer won twice: {answers:?}");
    for ((_, status, json), sn) in answers.iter().zip(&first) {
        assert_eq!(
            (*status, json["order_sn"].as_str()),
            (409, Some(sn.as_str()))
        );
    }
    let (more, answers) = buy_each(&env, &api, 1, 9..=30).await;
    assert_eq!(more.len(), 12, "{answers:?}");
    let won: Vec<String> = first.into_iter().chain(more).collect();
    env.wait_for_orders(&api, 1, 20, Duration::from_secs(20))
        .await;
    env.assert_invariants(&api, 1, 20, &won).await;
    consumer.stop().await;
    api.stop().await;
}

/// Four warm-ups of one item at once, first load and forced reload: one loads, the others
/// answer `409 warmup_running` and change nothing; the stock is whole and no side list
/// is left behind.
#[tokio::test]
async fn two_warmups_at_once_never_wipe_or_shorten_the_stock() {
    let env = TestEnv::new("twowarm").await;
    let server = env.server(&[Role::Api]).await;
    const UNITS: u32 = 300_000;
    env.item(1, UNITS).put(&server).await;
    for path in ["/admin/items/1/warmup", "/admin/items/1/warmup?force=true"] {
        if path.contains("force") {
            assert_eq!(env.admin_post(&server, "/admin/items/1/pause").await.0, 200);
        }
        let answers = join_all((0..4).map(|_| env.admin_post(&server, path))).await;
        let loaded = answers.iter().filter(|(s, _)| *s == 200).count();
        let refused: Vec<_> = answers
            .iter()
            .filter(|(s, j)| *s == 409 && j["code"] == "warmup_running")
            .collect();
        assert_eq!((loaded, refused.len()), (1, 3), "{path}: {answers:?}");
        assert_eq!(env.remaining(1).await, u64::from(UNITS), "{path}");
        let mut redis = env.redis.clone();
        let side: Vec<String> = redis
            .keys(
                env.keys()
                    .loading(env.bucket(1), "*")
                    .tokens
                    .replace("tokens:", "*"),
            )
            .await
            .unwrap();
        assert!(side.is_empty(), "{side:?}");
    }
    server.stop().await;
}

/// Orders a MySQL failover to an asynchronous replica lost after the consumer committed and
/// acked them (rows deleted behind the server's back): the reconciliation writes them back
/// from the buyer records — number, user, place — and then has nothing more to write.
#[tokio::test]
async fn reconciliation_writes_back_orders_mysql_lost() {
    let env = TestEnv::new("writeback").await;
    let server = env
        .server_with(&[Role::Api, Role::Consumer], |s| s.rate_per_user = 0)
        .await;
    env.item(1, 10).per_user(2).on_sale(&server).await;
    let (mut won, _) = buy_each(&env, &server, 1, [1, 2, 3, 4, 4]).await;
    assert_eq!(won.len(), 5);
    env.wait_for_orders(&server, 1, 5, Duration::from_secs(20))
        .await;
    // User 2's order, and user 4's second (in place 1).
    let lost = [won[1].clone(), won[4].clone()];
    for sn in &lost {
        sqlx::query("DELETE FROM orders WHERE order_sn = ?")
            .bind(sn)
            .execute(&env.db)
            .await
            .unwrap();
    }

    let (status, report) = env.admin_post(&server, "/admin/items/1/reconcile").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["written_back"], 2, "{report}");
    assert_eq!(report["stale_buyers"], 0, "{report}");
    assert_eq!(report["consistent"], true, "{report}");
    let rows: Vec<(String, u64, u8, String)> = sqlx::query_as(
        "SELECT order_sn, user_id, slot, status FROM orders WHERE order_sn IN (?, ?) ORDER BY user_id",
    )
    .bind(&lost[0])
    .bind(&lost[1])
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            (lost[0].clone(), 2, 0, "unpaid".to_owned()),
            (lost[1].clone(), 4, 1, "unpaid".to_owned()),
        ]
    );
    let (status, again) = env.admin_post(&server, "/admin/items/1/reconcile").await;
    assert_eq!(
        (status, again["written_back"].as_u64()),
        (200, Some(0)),
        "{again}"
    );
    // The buyer's order reads as theirs again.
    let (status, mine) = env.get(&server, "/api/items/1/my-order", Some(2)).await;
    assert_eq!(
        (status, mine["order_sn"].as_str()),
        (200, Some(lost[0].as_str())),
        "{mine}"
    );
    won.sort();
    env.assert_invariants(&server, 1, 10, &won).await;
}
