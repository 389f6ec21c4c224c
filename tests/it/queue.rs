//! The way to MySQL: broker down, consumer down, redelivery, dead letters.

use std::time::{Duration, Instant};

use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Connection};
use seckill::Role;
use seckill::domain::{BucketId, ItemId, OrderPlaced, OrderSn, UserId};

use crate::support::*;

async fn buy_many(
    env: &TestEnv,
    server: &TestServer,
    item: u64,
    users: std::ops::Range<u64>,
) -> Vec<String> {
    let mut won = Vec::new();
    for user in users {
        let (status, json) = env.buy(server, user, item).await;
        assert_eq!(status, 202, "{json}");
        won.push(json["order_sn"].as_str().unwrap().to_owned());
    }
    won
}

async fn wait_for_depth(queue: &str, expected: u32) {
    let what = format!("{expected} messages in {queue}");
    eventually(Duration::from_secs(20), &what, || async {
        match queue_depth(queue).await {
            Some(depth) if depth == expected => Ok(()),
            depth => Err(format!("it holds {depth:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn with_the_broker_down_purchases_still_win_and_the_relay_delivers_them_later() {
    let env = TestEnv::new("brokerdown").await;
    // API node pointed at a port where no broker listens.
    let api = env
        .server_with(&[Role::Api], |s| {
            s.amqp_url = seckill::config::Secret::new(format!(
                "amqp://guest:guest@127.0.0.1:{}/%2f",
                free_port()
            ));
        })
        .await;
    env.item(1, 50).on_sale(&api).await;
    let won = buy_many(&env, &api, 1, 1..41).await;
    let stats = env.stats(&api, 1).await;
    assert_eq!(stats["pending"], 40, "{stats}");
    assert_eq!(stats["consistent"], true, "{stats}");
    let (status, ready) = env.get(&api, "/readyz", None).await;
    assert_eq!(status, 503);
    assert_eq!(ready["down"], serde_json::json!(["rabbitmq"]), "{ready}");

    // A worker node with a working broker: the relay sends the outbox, the consumer writes.
    let worker = env.server(&[Role::Scheduler, Role::Consumer]).await;
    env.wait_for_orders(&api, 1, 40, Duration::from_secs(30))
        .await;
    env.assert_invariants(&api, 1, 50, &won).await;
    let outbox: u64 = redis::AsyncCommands::zcard(&mut env.redis.clone(), env.item_keys(1).outbox)
        .await
        .unwrap();
    assert_eq!(outbox, 0);
    worker.stop().await;
    api.stop().await;
}

/// A broker node gone silent — its sockets open, nothing coming back, as when its host is
/// cut off or its VM paused — is left for the next node within seconds: orders won after
/// it went silent reach MySQL and the consumer's deliveries resume. (With RabbitMQ's own
/// 60 s heartbeat, and an unconfirmed publish only tried again on the same channel, the
/// servers waited two minutes on the silent node.)
#[tokio::test]
async fn a_broker_node_gone_silent_is_left_for_the_next_within_seconds() {
    let env = TestEnv::new("silentnode").await;
    // Node 1 is the test's broker through a proxy, node 2 the same broker directly.
    let node1 = TcpProxy::start(amqp_addr()).await;
    let urls = format!("amqp://guest:guest@{}/%2f,{}", node1.addr, amqp_url());
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.amqp_url = seckill::config::Secret::new(urls.clone())
        })
        .await;
    env.item(1, 60).on_sale(&server).await;
    let mut won = buy_many(&env, &server, 1, 1..21).await;
    env.wait_for_orders(&server, 1, 20, Duration::from_secs(20))
        .await;
    // From now on node 1 holds back every answer (its heartbeats too) and closes nothing.
    node1.set_delay(Duration::from_secs(3_600));
    let silent = Instant::now();
    won.extend(buy_many(&env, &server, 1, 21..61).await);
    env.wait_for_orders(&server, 1, 60, Duration::from_secs(60))
        .await;
    let took = silent.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the orders reached MySQL {took:?} after the node went silent"
    );
    eprintln!("a silent broker node: every order in MySQL {took:?} after it went silent");
    env.assert_invariants(&server, 1, 60, &won).await;
    server.stop().await;
}

#[tokio::test]
async fn with_the_consumer_down_orders_wait_in_the_queue_and_land_once_it_starts() {
    let env = TestEnv::new("consumerdown").await;
    let api = env.server(&[Role::Api, Role::Scheduler]).await;
    env.item(1, 30).on_sale(&api).await;
    let won = buy_many(&env, &api, 1, 1..31).await;
    // Every order confirmed by the broker (out of the outbox), none in MySQL: they
    // wait in the queue (in one or more messages: the publisher batches them).
    eventually(Duration::from_secs(20), "every order confirmed", || async {
        match env.confirmed(1).await {
            30 => Ok(()),
            confirmed => Err(format!("{confirmed} confirmed")),
        }
    })
    .await;
    assert!(queue_depth(&env.topology().orders_queue).await.unwrap() >= 1);
    assert!(env.orders(1).await.is_empty());
    assert_eq!(env.stats(&api, 1).await["pending"], 30);

    let consumer = env.server(&[Role::Consumer]).await;
    env.wait_for_orders(&api, 1, 30, Duration::from_secs(30))
        .await;
    env.assert_invariants(&api, 1, 30, &won).await;
    wait_for_depth(&env.topology().orders_queue, 0).await;
    consumer.stop().await;
    api.stop().await;
}

#[tokio::test]
async fn a_message_delivered_twice_writes_one_row_and_garbage_is_dead_lettered() {
    let env = TestEnv::new("redeliver").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 10).put(&server).await;
    let topology = env.topology();
    let order = order_of(9);
    let json = serde_json::to_vec(&order).unwrap();
    // A batch (as the publisher sends them) with one unreadable element.
    let other = order_of(10);
    let mixed = format!(
        "[{}, {{\"order_sn\": 5}}]",
        serde_json::to_string(&other).unwrap()
    );
    publish_raw(
        &env,
        &[&json[..], b"{not json", &json[..], mixed.as_bytes()],
    )
    .await;

    // Both unreadable messages are dead-lettered; the readable order of the mixed one lands.
    wait_for_depth(&topology.dead_queue, 2).await;
    let mut expected = vec![order.order_sn.to_string(), other.order_sn.to_string()];
    expected.sort();
    eventually(Duration::from_secs(10), "the order landed", || async {
        let mut orders: Vec<String> = env.orders(1).await.into_iter().map(|o| o.0).collect();
        orders.sort();
        assert!(
            orders.len() <= 2,
            "a redelivered message wrote a second row: {orders:?}"
        );
        if orders == expected && queue_depth(&topology.orders_queue).await == Some(0) {
            Ok(())
        } else {
            Err(format!("orders {orders:?}"))
        }
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn mysql_refuses_a_second_live_order_and_the_consumer_records_it_cancelled() {
    let env = TestEnv::new("twolive").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 10).put(&server).await;
    let topology = env.topology();
    // Two orders of one user for one item, as if Redis had lost its buyer records.
    let first = OrderPlaced {
        order_sn: OrderSn::generate(BucketId::whole(ItemId::new(1).unwrap()), false),
        item_id: ItemId::new(1).unwrap(),
        user_id: UserId::new(9),
        created_at_ms: 1_700_000_000_000,
        pay_deadline_ms: 1_700_000_600_000,
        slot: 0,
    };
    let second = OrderPlaced {
        order_sn: OrderSn::generate(BucketId::whole(ItemId::new(1).unwrap()), false),
        ..first.clone()
    };
    eventually(Duration::from_secs(10), "the queue declared", || async {
        queue_depth(&topology.orders_queue)
            .await
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    let conn = Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .basic_publish(
            topology.orders_exchange.as_str().into(),
            "order.placed".into(),
            BasicPublishOptions::default(),
            &serde_json::to_vec(&[&first, &second]).unwrap(),
            BasicProperties::default(),
        )
        .await
        .unwrap();
    let _ = conn.close(200, "bye".into()).await;

    let statuses = eventually(Duration::from_secs(10), "both orders written", || async {
        let mut statuses: Vec<String> = env.orders(1).await.into_iter().map(|o| o.2).collect();
        statuses.sort();
        if statuses.len() == 2 {
            Ok(statuses)
        } else {
            Err(format!("orders: {statuses:?}"))
        }
    })
    .await;
    // Both 202s have their row; the user holds one unit, not two; and the one written
    // cancelled says why, so that no judge takes it for a cancel (it is a lost 202).
    assert_eq!(statuses, ["cancelled", "unpaid"]);
    let reason: Option<String> = sqlx::query_scalar(
        "SELECT cancel_reason FROM orders WHERE item_id = 1 AND status = 'cancelled'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(reason.as_deref(), Some("refused"));
    server.stop().await;
}

#[tokio::test]
async fn with_mysql_down_sales_go_on_the_consumer_waits_without_spinning_and_catches_up() {
    let env = TestEnv::new("mysqldown").await;
    let proxy = TcpProxy::start(mysql_addr()).await;
    let database = env
        .settings
        .database_url
        .expose()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let through_proxy = format!("mysql://root@{}/{database}", proxy.addr);
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.database_url = seckill::config::Secret::new(&through_proxy)
        })
        .await;
    env.item(1, 20).on_sale(&server).await;
    let (_, first) = env.buy(&server, 1, 1).await;
    let first_sn = first["order_sn"].as_str().unwrap().to_owned();
    env.wait_for_orders(&server, 1, 1, Duration::from_secs(20))
        .await;

    proxy.cut();
    // Selling needs no MySQL.
    let mut won = vec![first_sn.clone()];
    won.extend(buy_many(&env, &server, 1, 2..12).await);
    let (status, ready) = env.get(&server, "/readyz", None).await;
    assert_eq!(
        (status, ready["down"].clone()),
        (503, serde_json::json!(["mysql"])),
        "{ready}"
    );
    // A read that needs MySQL answers 503 within the budget, not a hang.
    let started = Instant::now();
    let (status, json) = env
        .get(&server, &format!("/api/orders/{first_sn}"), Some(1))
        .await;
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("unavailable")),
        "{json}"
    );
    assert!(started.elapsed() < Duration::from_millis(1500));

    // While MySQL is gone the consumer retries with growing pauses, not in a busy loop
    // (the catalogue's refresh also tries every half second).
    let before = proxy.attempts();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let attempts = proxy.attempts() - before;
    assert!(
        attempts < 100,
        "{attempts} connection attempts in 4 s: a busy loop"
    );
    assert_eq!(
        env.orders(1).await.len(),
        1,
        "nothing can have been written"
    );

    proxy.restore();
    env.wait_for_orders(&server, 1, 11, Duration::from_secs(30))
        .await;
    env.assert_invariants(&server, 1, 20, &won).await;
    server.stop().await;
}

/// The order write retries the loser of a deadlock (a pay or cancel writing its pending
/// order while the consumer writes a batch holding it); that rests on recognising one.
/// Two transactions lock two rows in opposite orders: MySQL rolls one back, and its error
/// must read as a deadlock — and a plain failure must not.
#[tokio::test]
async fn a_deadlock_victim_is_recognised_for_a_retry() {
    let env = TestEnv::new("deadlock").await;
    sqlx::query("CREATE TABLE locks (id INT PRIMARY KEY, n INT NOT NULL)")
        .execute(&env.db)
        .await
        .unwrap();
    sqlx::query("INSERT INTO locks VALUES (1, 0), (2, 0)")
        .execute(&env.db)
        .await
        .unwrap();
    let bump = "UPDATE locks SET n = n + 1 WHERE id = ?";
    let mut first = env.db.begin().await.unwrap();
    let mut second = env.db.begin().await.unwrap();
    sqlx::query(bump)
        .bind(1)
        .execute(&mut *first)
        .await
        .unwrap();
    sqlx::query(bump)
        .bind(2)
        .execute(&mut *second)
        .await
        .unwrap();
    // Each now waits for the other's row; MySQL picks a victim at once.
    let (a, b) = tokio::join!(
        sqlx::query(bump).bind(2).execute(&mut *first),
        sqlx::query(bump).bind(1).execute(&mut *second),
    );
    let victim = match (a, b) {
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => seckill::testing::DbError::Sql(e),
        other => panic!("expected exactly one deadlock victim: {other:?}"),
    };
    // End both now: a transaction left open would hold its locks until the pool reuses
    // its connection (and block the test's own clean-up).
    first.rollback().await.unwrap();
    second.rollback().await.unwrap();
    assert!(victim.is_deadlock(), "{victim:?}");

    let refused = sqlx::query("INSERT INTO locks VALUES (1, 0)")
        .execute(&env.db)
        .await
        .unwrap_err();
    assert!(!seckill::testing::DbError::Sql(refused).is_deadlock());
}

/// Statements given up by their callers' time limits while MySQL still works on them (here
/// behind a row lock; on a Galera node cut off from its cluster, until it rejoins) do not
/// keep the pool's connections: a query that needs none of those rows is answered at once.
#[tokio::test]
async fn statements_cut_off_by_their_time_limit_leave_the_pool_free() {
    let env = TestEnv::new("pool_free").await;
    sqlx::query("CREATE TABLE held (id INT PRIMARY KEY, n INT NOT NULL)")
        .execute(&env.db)
        .await
        .unwrap();
    sqlx::query("INSERT INTO held VALUES (1, 0)")
        .execute(&env.db)
        .await
        .unwrap();
    let url = format!("{}/{}", mysql_server_url(), env.database());
    let mut holder = <sqlx::MySqlConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT n FROM held WHERE id = 1 FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();

    // As many updates as the pool has connections (16), each given up after 200 ms: MySQL
    // keeps each waiting for the lock (50 s by default), its answer owed on its connection.
    let given_up = futures::future::join_all((0..16).map(|_| {
        tokio::time::timeout(
            Duration::from_millis(200),
            sqlx::query("UPDATE held SET n = n + 1 WHERE id = 1").execute(&env.db),
        )
    }))
    .await;
    assert!(given_up.iter().all(Result::is_err), "{given_up:?}");

    // Within seconds the pool answers again, while the lock is still held.
    let answered = eventually(Duration::from_secs(5), "the pool answering", || async {
        sqlx::query_as::<_, (i64,)>("SELECT COUNT(*) FROM held")
            .fetch_one(&env.db)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(answered.0, 1);
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
}

/// Waits until the server has declared its queues, then publishes each body to the orders
/// exchange as the publisher would.
async fn publish_raw(env: &TestEnv, bodies: &[&[u8]]) {
    let topology = env.topology();
    eventually(
        Duration::from_secs(10),
        "the orders queue declared",
        || async {
            queue_depth(&topology.orders_queue)
                .await
                .map(|_| ())
                .ok_or_else(|| "not yet".to_owned())
        },
    )
    .await;
    let conn = Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    for body in bodies {
        channel
            .basic_publish(
                topology.orders_exchange.as_str().into(),
                "order.placed".into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let _ = conn.close(200, "bye".into()).await;
}

fn order_of(user: u64) -> OrderPlaced {
    OrderPlaced {
        order_sn: OrderSn::generate(BucketId::whole(ItemId::new(1).unwrap()), false),
        item_id: ItemId::new(1).unwrap(),
        user_id: UserId::new(user),
        created_at_ms: 1_700_000_000_000,
        pay_deadline_ms: 1_700_000_600_000,
        slot: 0,
    }
}

/// Orders that can never be written go to the dead-letter queue with the reason, and the
/// rest of their batch — even of their own message — lands: one MySQL refuses (here a
/// constraint, as a DBA might add), tried alone after its batch failed; and one whose pay
/// deadline is in the year 11476, which MariaDB would store as a zero date rather than
/// refuse. The consumer goes on.
#[tokio::test]
async fn orders_that_cannot_be_written_are_dead_lettered_with_the_reason_and_the_rest_lands() {
    let env = TestEnv::new("poison").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 10).put(&server).await;
    sqlx::query("ALTER TABLE orders ADD CONSTRAINT ck_no_666 CHECK (user_id <> 666)")
        .execute(&env.db)
        .await
        .unwrap();
    let refused = order_of(666);
    let late = OrderPlaced {
        pay_deadline_ms: 300_000_000_000_000,
        ..order_of(3)
    };
    let (one, two) = (order_of(1), order_of(2));
    let mixed = serde_json::to_vec(&[&one, &refused]).unwrap();
    let alone = serde_json::to_vec(&two).unwrap();
    let far = serde_json::to_vec(&late).unwrap();
    publish_raw(&env, &[&mixed, &alone, &far]).await;

    let mut expected = vec![one.order_sn.to_string(), two.order_sn.to_string()];
    expected.sort();
    eventually(
        Duration::from_secs(15),
        "the good orders in MySQL",
        || async {
            let mut orders: Vec<String> = env.orders(1).await.into_iter().map(|o| o.0).collect();
            orders.sort();
            if orders == expected {
                Ok(())
            } else {
                Err(format!("{orders:?}"))
            }
        },
    )
    .await;
    wait_for_depth(&env.topology().dead_queue, 2).await;

    // Each dead letter holds the orders set aside, and says why.
    let conn = Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let mut letters = Vec::new();
    while let Some(dead) = channel
        .basic_get(
            env.topology().dead_queue.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        let body: Vec<OrderPlaced> = serde_json::from_slice(&dead.delivery.data).unwrap();
        let reason = dead
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| match h.inner().get("x-seckill-reason") {
                Some(lapin::types::AMQPValue::LongString(r)) => {
                    Some(String::from_utf8_lossy(r.as_bytes()).into_owned())
                }
                _ => None,
            })
            .expect("a reason header");
        letters.push((body, reason));
    }
    let _ = conn.close(200, "bye".into()).await;
    letters.sort_by_key(|(body, _)| body[0].user_id.get());
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert_eq!(letters[0].0, vec![late]);
    assert!(letters[0].1.contains("outside the years"), "{letters:?}");
    assert_eq!(letters[1].0, vec![refused]);
    assert!(letters[1].1.contains("MySQL refused"), "{letters:?}");

    // Not stalled: a later order lands too.
    let later = order_of(4);
    publish_raw(&env, &[&serde_json::to_vec(&later).unwrap()]).await;
    eventually(
        Duration::from_secs(10),
        "a later order in MySQL",
        || async {
            match env.order_status(later.order_sn.as_str()).await {
                Some(_) => Ok(()),
                None => Err("not yet".to_owned()),
            }
        },
    )
    .await;
    server.stop().await;
}

/// One order twice in one batch (a message and its redelivered copy, say) is one row,
/// and the consumer does not cry "second live order".
#[tokio::test]
async fn an_order_twice_in_one_batch_is_one_row_and_no_false_alarm() {
    let env = TestEnv::new("twiceinbatch").await;
    let server = env.server(&[seckill::Role::Api]).await;
    env.item(1, 10).put(&server).await;
    let order = order_of(7);
    let twice = serde_json::to_vec(&[&order, &order]).unwrap();
    publish_raw(&env, &[&twice]).await;
    let (child, _consumer, lines, reader) =
        serve(seckill(&env).args(["serve", "--roles", "consumer"]));
    eventually(Duration::from_secs(15), "the order in MySQL", || async {
        match env.order_status(order.order_sn.as_str()).await {
            Some(_) => Ok(()),
            None => Err("not yet".to_owned()),
        }
    })
    .await;
    assert_eq!(env.orders(1).await.len(), 1);
    stop_process(child, reader);
    let alarms: Vec<String> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("second live order"))
        .cloned()
        .collect();
    assert!(alarms.is_empty(), "{alarms:?}");
    server.stop().await;
}

/// The relay's pending sweep walks a hash of 70,000 stale entries confirmed by the broker
/// long ago — more order numbers than one MySQL statement can name (65,535) — a page at a
/// time: the entries MySQL has (their clean-up was lost) are cleared, with their marks as
/// confirmed.
#[tokio::test]
async fn the_pending_sweep_pages_through_more_entries_than_one_query_can_name() {
    let env = TestEnv::new("bigsweep").await;
    let relay = stale_confirmed_orders(&env, 70_000).await;
    // The whole walk in one call; the scheduler's sweep walks a bucket's share a visit.
    let next = relay
        .sweep_pending(env.bucket(1), 0, usize::MAX)
        .await
        .expect("the sweep");
    assert_eq!(next, 0, "the walk ended");
    assert_eq!(pending_and_confirmed(&env).await, (0, 0));
}

/// A walk given a budget reads about that many entries and says where to go on; going on
/// from there, visit after visit, it ends having repaired every entry once.
#[tokio::test]
async fn the_pending_sweep_walks_a_pile_a_share_at_a_time() {
    let env = TestEnv::new("sweepshare").await;
    let relay = stale_confirmed_orders(&env, 5_000).await;
    let next = relay
        .sweep_pending(env.bucket(1), 0, 2_000)
        .await
        .expect("the sweep");
    assert_ne!(next, 0, "a walk of 5,000 stopped near 2,000");
    let (left, _) = pending_and_confirmed(&env).await;
    assert!(
        (1_000..=3_100).contains(&left),
        "{left} left after a share of 2,000"
    );
    let mut from = next;
    let mut visits = 1;
    while from != 0 {
        from = relay
            .sweep_pending(env.bucket(1), from, 2_000)
            .await
            .expect("the sweep");
        visits += 1;
        assert!(visits <= 5, "the walk did not end");
    }
    assert_eq!(pending_and_confirmed(&env).await, (0, 0));
}

/// `n` orders won two hours ago, written to MySQL, confirmed by the broker and still
/// pending in Redis (their clean-up lost), on item 1; and a relay to sweep them.
async fn stale_confirmed_orders(env: &TestEnv, n: u64) -> seckill::testing::Relay {
    use redis::AsyncCommands;
    use seckill::testing::{OrderStatus, insert_batch};
    let server = env.server(&[Role::Api]).await;
    env.item(1, 10).put(&server).await;
    server.stop().await;
    let long_ago = chrono::Utc::now().timestamp_millis() - 2 * 3600 * 1000;
    let orders: Vec<OrderPlaced> = (0..n)
        .map(|user| OrderPlaced {
            created_at_ms: long_ago,
            pay_deadline_ms: long_ago + 1_800_000,
            ..order_of(user)
        })
        .collect();
    let mut redis = env.redis.clone();
    for chunk in orders.chunks(1_000) {
        insert_batch(&env.db, chunk, OrderStatus::Unpaid)
            .await
            .unwrap();
        let fields: Vec<(String, String)> = chunk
            .iter()
            .map(|o| (o.order_sn.to_string(), serde_json::to_string(o).unwrap()))
            .collect();
        redis
            .hset_multiple::<_, _, _, ()>(env.item_keys(1).pending, &fields)
            .await
            .unwrap();
        let sns: Vec<&str> = fields.iter().map(|(sn, _)| sn.as_str()).collect();
        redis
            .sadd::<_, _, ()>(env.keys().confirmed(env.bucket(1)), &sns)
            .await
            .unwrap();
    }
    let namespace = &env.settings.namespace;
    seckill::testing::Relay {
        broker: seckill::testing::Broker::new(&amqp_url(), env.topology()),
        redis: seckill::testing::RedisConns::new(&redis_url()).unwrap(),
        db: env.db.clone(),
        keys: seckill::testing::Keys::new(namespace),
        meters: std::sync::Arc::new(seckill::testing::Meters::new(namespace)),
    }
}

/// Item 1's pending orders and confirms, counted in Redis.
async fn pending_and_confirmed(env: &TestEnv) -> (u64, u64) {
    use redis::AsyncCommands;
    let mut redis = env.redis.clone();
    let pending: u64 = redis.hlen(env.item_keys(1).pending).await.unwrap();
    let confirmed: u64 = redis
        .scard(env.keys().confirmed(env.bucket(1)))
        .await
        .unwrap();
    (pending, confirmed)
}

/// A confirm noted after the consumer wrote its order (RabbitMQ may deliver a message
/// before it confirms it) leaves the order in the bucket's `confirmed` set with nothing
/// pending: the safety sweep takes such members out and keeps those still pending.
#[tokio::test]
async fn confirms_noted_after_their_order_was_written_are_forgotten() {
    use redis::AsyncCommands;
    let env = TestEnv::new("lateconfirm").await;
    let server = env.server(&[Role::Api, Role::Scheduler]).await;
    env.item(1, 10).on_sale(&server).await;
    // Won just now: too young for the sweep's other repairs.
    let now = chrono::Utc::now().timestamp_millis();
    let still_pending = OrderPlaced {
        created_at_ms: now,
        pay_deadline_ms: now + 600_000,
        ..order_of(1)
    };
    let (written, also_written) = (order_of(2), order_of(3));
    let mut redis = env.redis.clone();
    let confirmed = env.keys().confirmed(env.bucket(1));
    redis
        .hset::<_, _, _, ()>(
            env.item_keys(1).pending,
            still_pending.order_sn.as_str(),
            serde_json::to_string(&still_pending).unwrap(),
        )
        .await
        .unwrap();
    redis
        .sadd::<_, _, ()>(
            &confirmed,
            [&still_pending, &written, &also_written]
                .map(|o| o.order_sn.as_str())
                .to_vec(),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "the late confirms forgotten",
        || async {
            let members: Vec<String> = env.redis.clone().smembers(&confirmed).await.unwrap();
            if members == [still_pending.order_sn.to_string()] {
                Ok(())
            } else {
                Err(format!("{members:?} confirmed"))
            }
        },
    )
    .await;
    server.stop().await;
}
