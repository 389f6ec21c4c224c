//! Months of sales on one deployment: every ended sale leaves Redis once reconciled and
//! retained (`SECKILL_SALE_RETENTION_S`), and answers from MySQL after (docs/contract.md
//! §7 invariant 7).

use std::time::Duration;

use chrono::Utc;
use futures::{StreamExt, stream};
use seckill::config::Secret;
use serde_json::Value;

use crate::support::{ALL_ROLES, PrivateRedis, TestEnv, TestServer, eventually};

/// Sales per round (set up a few at a time), and rounds.
const SALES_PER_ROUND: u64 = 50;
const AT_ONCE: usize = 8;
const ROUNDS: u64 = 4;

/// Many short sales back to back — put, warm, sell (two won, one refused sold out, one
/// paid, one left to time out), end, reconcile, retire — on a private Redis, with two
/// schedulers retiring side by side: its key count and `used_memory_dataset` come back to
/// where they started, after having grown with the sales. Then a retired sale answers as
/// the contract says: `403 ended`, the item with what it left unsold, the buyers' orders
/// from MySQL, consistent stats.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consecutive_sales_leave_redis_where_it_started() {
    let env = TestEnv::new("retention").await;
    let redis = PrivateRedis::start().await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.redis_url = Secret::new(redis.url());
            s.sale_retention_s = 0;
            s.rate_per_user = 0;
        })
        .await;
    let second = env
        .server_with(&[seckill::Role::Scheduler], |s| {
            s.redis_url = Secret::new(redis.url());
            s.sale_retention_s = 0;
        })
        .await;
    // One sale first: what stays whatever the sales (the shop's status, the scripts
    // Redis caches) is in place before the count.
    sell(&env, &server, 1, Utc::now() + chrono::Duration::seconds(3)).await;
    wait_retired(&env, &server, 1).await;
    let (keys_before, memory_before) = (key_count(&redis).await, used_memory(&redis).await);

    let mut most_keys = 0;
    let mut last_round = Vec::new();
    for round in 0..ROUNDS {
        let ids: Vec<u64> = (1..=SALES_PER_ROUND)
            .map(|i| 1_000 * (round + 1) + i)
            .collect();
        let end_at = Utc::now() + chrono::Duration::seconds(10);
        stream::iter(&ids)
            .for_each_concurrent(AT_ONCE, |&id| sell(&env, &server, id, end_at))
            .await;
        most_keys = most_keys.max(key_count(&redis).await);
        for &id in &ids {
            wait_retired(&env, &server, id).await;
        }
        last_round = ids;
    }
    let keys_after = settled_key_count(&redis, keys_before).await;
    let memory_after = used_memory(&redis).await;
    eprintln!(
        "{} sales: keys {keys_before} → at most {most_keys} → {keys_after}; used_memory_dataset {memory_before} → {memory_after}",
        SALES_PER_ROUND * ROUNDS
    );
    assert!(
        most_keys > keys_before + SALES_PER_ROUND as i64,
        "the sales never showed in Redis: the test measures nothing"
    );
    // A little slack for allocator rounding; 200 sales held far more (keys above).
    assert!(
        memory_after <= memory_before + 64 * 1024,
        "used_memory_dataset {memory_before} → {memory_after} after every sale was retired"
    );

    // A retired sale still answers, from MySQL.
    let id = last_round[0];
    let (status, json) = env.buy(&server, 99, id).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (403, Some("ended")),
        "{json}"
    );
    let (status, item) = env.get(&server, &format!("/api/items/{id}"), None).await;
    assert_eq!(status, 200, "{item}");
    assert_eq!(item["status"], "ended", "{item}");
    assert_eq!(
        item["remaining"], 1,
        "the timed-out order's unit was unsold: {item}"
    );
    let (status, order) = env
        .get(&server, &format!("/api/items/{id}/my-order"), Some(1))
        .await;
    assert_eq!(
        (status, order["status"].as_str()),
        (200, Some("paid")),
        "{order}"
    );
    let sn = order["order_sn"].as_str().unwrap_or_default().to_owned();
    let (status, read) = env
        .get(&server, &format!("/api/orders/{sn}"), Some(1))
        .await;
    assert_eq!(
        (status, read["status"].as_str()),
        (200, Some("paid")),
        "{read}"
    );
    let (status, timed_out) = env
        .get(&server, &format!("/api/items/{id}/my-order"), Some(2))
        .await;
    assert_eq!(
        (status, timed_out["status"].as_str()),
        (200, Some("cancelled")),
        "{timed_out}"
    );
    let stats = env.stats(&server, id).await;
    assert_eq!(stats["consistent"], true, "{stats}");
    assert_eq!(
        (&stats["sold"], &stats["remaining"]),
        (&Value::from(1), &Value::from(1)),
        "{stats}"
    );
    assert!(stats["retired_at"].is_string(), "{stats}");
    let (status, report) = env
        .admin_post(&server, &format!("/admin/items/{id}/reconcile"))
        .await;
    assert_eq!(
        (status, &report["consistent"]),
        (200, &Value::Bool(true)),
        "{report}"
    );
    assert_eq!(
        key_count(&redis).await,
        keys_before,
        "reading a retired sale wrote to Redis"
    );
    second.stop().await;
    server.stop().await;
}

/// Two units, three buyers: user 1 pays, user 2's order times out, user 3 hears sold out.
async fn sell(env: &TestEnv, server: &TestServer, id: u64, end_at: chrono::DateTime<Utc>) {
    env.item(id, 2)
        .window(Utc::now() - chrono::Duration::seconds(1), end_at)
        .paying_within(1)
        .on_sale(server)
        .await;
    let (first, won) = env.buy(server, 1, id).await;
    assert_eq!(first, 202, "{won}");
    assert_eq!(env.buy(server, 2, id).await.0, 202);
    assert_eq!(env.buy(server, 3, id).await.0, 410);
    let sn = won["order_sn"].as_str().unwrap_or_default().to_owned();
    eventually(Duration::from_secs(10), "the order is written", || async {
        match env.order_status(&sn).await {
            Some(_) => Ok(()),
            None => Err("not yet".to_owned()),
        }
    })
    .await;
    let (status, paid) = env.pay(server, &sn).await;
    assert_eq!(
        (status, paid["code"].as_str()),
        (200, Some("paid")),
        "{paid}"
    );
}

/// Waits until the sale is retired and its Redis state cleared.
async fn wait_retired(env: &TestEnv, server: &TestServer, id: u64) {
    eventually(Duration::from_secs(30), "the sale is retired", || async {
        match stamp(env, id, "redis_cleared_at").await {
            Some(_) => Ok(()),
            None => Err(format!("{}", env.stats(server, id).await)),
        }
    })
    .await;
}

/// One of the item's time stamps in MySQL (`reconciled_at`, `retired_at`, …), if set.
async fn stamp(env: &TestEnv, id: u64, column: &str) -> Option<chrono::DateTime<Utc>> {
    let sql = format!("SELECT {column} FROM items WHERE id = ?");
    let (at,): (Option<chrono::DateTime<Utc>>,) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_one(&env.db)
        .await
        .expect("the item's row");
    at
}

/// The key count once the locks a retirement left behind have expired. A lock whose
/// release (or whose taking) Redis answered after the caller's time limit, as on a
/// loaded machine, is left to expire by itself (60 s): the only keys allowed to outlast
/// the retirement, and only until then.
async fn settled_key_count(redis: &PrivateRedis, before: i64) -> i64 {
    // Fewer is fine: a key counted before may have been short-lived (a lock, a wake-up).
    let now = key_count(redis).await;
    if now <= before {
        return now;
    }
    let redis::Value::Array(keys) = redis.cmd(&["KEYS", "*{item:*"]).await else {
        panic!("KEYS");
    };
    for key in keys {
        let redis::Value::BulkString(key) = key else {
            panic!("a key: {key:?}");
        };
        let key = String::from_utf8_lossy(&key).into_owned();
        let ttl = pttl(redis, &key).await;
        assert!(
            expiring(&key, ttl),
            "a retired sale left {key} behind (PTTL {ttl} ms)"
        );
    }
    eventually(
        Duration::from_secs(70),
        "the retirement's leftover locks expired",
        || async {
            let now = key_count(redis).await;
            if now <= before {
                Ok(now)
            } else {
                Err(format!("{before} → {now} keys"))
            }
        },
    )
    .await
}

/// Whether `key`, with `ttl` ms to live, is gone already or a warm-up's or a
/// reconciliation's lock that will expire by itself (see [`settled_key_count`]).
fn expiring(key: &str, ttl: i64) -> bool {
    // -2: gone already (it expired between being listed and being asked about).
    ttl == -2
        || [":warming", ":reconciling"]
            .iter()
            .any(|l| key.ends_with(l))
            && (1..=60_000).contains(&ttl)
}

/// `PTTL key`: ms to live, -1 for none, -2 for no such key.
async fn pttl(redis: &PrivateRedis, key: &str) -> i64 {
    match redis.cmd(&["PTTL", key]).await {
        redis::Value::Int(ms) => ms,
        other => panic!("PTTL: {other:?}"),
    }
}

/// The keys of `item` a retirement must have deleted: all but the locks left to expire.
async fn lasting_item_keys(redis: &PrivateRedis, item: u64) -> Vec<String> {
    let mut lasting = Vec::new();
    for key in item_keys(redis, item).await {
        if !expiring(&key, pttl(redis, &key).await) {
            lasting.push(key);
        }
    }
    lasting
}

async fn key_count(redis: &PrivateRedis) -> i64 {
    match redis.cmd(&["DBSIZE"]).await {
        redis::Value::Int(n) => n,
        other => panic!("DBSIZE: {other:?}"),
    }
}

/// `used_memory_dataset`: `used_memory` less Redis's overhead (client buffers, which grow
/// with the connections the server's pools opened under load; the key tables' own size,
/// which Redis shrinks at its leisure; the script cache) — what the data itself holds.
async fn used_memory(redis: &PrivateRedis) -> u64 {
    let info = match redis.cmd(&["INFO", "memory"]).await {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO memory: {other:?}"),
    };
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory_dataset:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory_dataset in {info}"))
}

/// A retirement cut off halfway — MySQL says retired, some keys deleted, the rest, the
/// index entry and the marks still there — is finished by the next pass whatever the
/// retention; a sale with an order still unpaid in MySQL is not retired until it is not.
/// (Locks a loaded machine left to expire may outlast it: `expiring`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retirement_cut_off_halfway_is_finished_and_an_unfinished_sale_waits() {
    let env = TestEnv::new("retire_resume").await;
    let redis = PrivateRedis::start().await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.redis_url = Secret::new(redis.url());
            s.sale_retention_s = 3_600;
            s.rate_per_user = 0;
        })
        .await;
    let end_at = Utc::now() + chrono::Duration::seconds(3);
    sell(&env, &server, 1, end_at).await;
    sell(&env, &server, 2, end_at).await;
    for id in [1, 2] {
        eventually(Duration::from_secs(30), "reconciled", || async {
            let at = stamp(&env, id, "reconciled_at").await;
            at.map(drop).ok_or_else(|| "not yet".to_owned())
        })
        .await;
    }
    // At least the meta and a buyer shard: the cut-off below deletes the meta, so a
    // buyer shard is what the resumed retirement must still find.
    let left = item_keys(&redis, 1).await;
    assert!(left.len() >= 2, "the sale left nothing to retire: {left:?}");

    // Item 1: cut off after its record and two of its keys.
    sqlx::query("UPDATE items SET retired_at = UTC_TIMESTAMP(3), unsold = 1 WHERE id = 1")
        .execute(&env.db)
        .await
        .unwrap();
    let keys = env.keys().bucket(seckill::domain::BucketId::whole(
        seckill::domain::ItemId::new(1).unwrap(),
    ));
    redis.cmd(&["DEL", &keys.meta, &keys.tokens]).await;
    // Item 2: due (reconciled long ago), but an order of it unpaid in MySQL.
    sqlx::query("UPDATE items SET reconciled_at = UTC_TIMESTAMP(3) - INTERVAL 2 HOUR WHERE id = 2")
        .execute(&env.db)
        .await
        .unwrap();
    sqlx::query("UPDATE orders SET status = 'unpaid' WHERE item_id = 2 AND status = 'paid'")
        .execute(&env.db)
        .await
        .unwrap();

    wait_retired(&env, &server, 1).await;
    assert_eq!(
        lasting_item_keys(&redis, 1).await,
        Vec::<String>::new(),
        "item 1's keys left behind"
    );
    let index = env.keys().items_index();
    assert_eq!(
        redis.cmd(&["SISMEMBER", &index, "1"]).await,
        redis::Value::Int(0)
    );
    // A new window for the retired sale, by a PUT and by a bulk call, writes nothing of it
    // back to Redis (it is a live sale again once loaded: a forced warm-up).
    let now = Utc::now();
    let reopened = env
        .item(1, 2)
        .window(now, now + chrono::Duration::hours(1))
        .paying_within(1);
    reopened.put(&server).await;
    let mut bulk = env
        .item(1, 2)
        .window(now, now + chrono::Duration::hours(2))
        .paying_within(1)
        .body();
    bulk["id"] = 1.into();
    let response = env
        .admin(reqwest::Method::PUT, &server, "/admin/items")
        .json(&serde_json::json!({ "items": [bulk] }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    assert_eq!(
        lasting_item_keys(&redis, 1).await,
        Vec::<String>::new(),
        "a PUT of the retired item 1 wrote its state back"
    );
    // Several passes later, item 2 still waits for its unpaid order.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let retired = stamp(&env, 2, "retired_at").await;
    assert!(retired.is_none(), "retired with an order unpaid");
    assert!(item_keys(&redis, 2).await.len() >= 2);
    sqlx::query("UPDATE orders SET status = 'paid' WHERE item_id = 2 AND status = 'unpaid'")
        .execute(&env.db)
        .await
        .unwrap();
    wait_retired(&env, &server, 2).await;
    assert_eq!(
        lasting_item_keys(&redis, 2).await,
        Vec::<String>::new(),
        "item 2's keys left behind"
    );
    let stats = env.stats(&server, 2).await;
    assert_eq!(stats["consistent"], true, "{stats}");
    server.stop().await;
}

/// Keys of one item (bucket 0) in the private Redis.
async fn item_keys(redis: &PrivateRedis, item: u64) -> Vec<String> {
    let pattern = format!("*{{item:{item}}}*");
    match redis.cmd(&["KEYS", &pattern]).await {
        redis::Value::Array(keys) => keys
            .iter()
            .map(|key| match key {
                redis::Value::BulkString(name) => String::from_utf8_lossy(name).into_owned(),
                other => format!("{other:?}"),
            })
            .collect(),
        other => panic!("KEYS: {other:?}"),
    }
}

/// The retention pass read its due list, then, before it got to the items, each became a
/// live sale again: item 1 by a `PUT` moving its end an hour on (which resets its
/// reconciliation), item 2 — a retirement cut off halfway, MySQL saying retired and
/// nothing deleted yet — by a new window and a forced warm-up. The pass's step, run by
/// hand on what it read, retires neither: each keeps its units, buyer records and meta,
/// sells on (a buyer who paid is still refused, a new one buys the unit left and the
/// order reaches MySQL), and its stats add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sale_reopened_after_the_due_list_was_read_is_not_retired() {
    use seckill::testing::retire::{Retirement, due_for_retirement, retire};

    let env = TestEnv::new("retire_reopened").await;
    // The server's own pass retires nothing in this test (an hour's retention): the test
    // runs the pass's step by hand, with none.
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.sale_retention_s = 3_600;
            s.rate_per_user = 0;
        })
        .await;
    let end_at = Utc::now() + chrono::Duration::seconds(3);
    sell(&env, &server, 1, end_at).await;
    sell(&env, &server, 2, end_at).await;
    for id in [1, 2] {
        eventually(Duration::from_secs(30), "reconciled", || async {
            let at = stamp(&env, id, "reconciled_at").await;
            at.map(drop).ok_or_else(|| "not yet".to_owned())
        })
        .await;
        assert_eq!(
            env.remaining(id).await,
            1,
            "the timed-out order's unit is back"
        );
    }
    // Item 2: a retirement cut off after recording it, before deleting anything.
    sqlx::query("UPDATE items SET retired_at = UTC_TIMESTAMP(3), unsold = 1 WHERE id = 2")
        .execute(&env.db)
        .await
        .unwrap();

    // The pass reads its due list (a retention of 0: both are due)…
    let due = due_for_retirement(&env.db, Duration::ZERO, 200)
        .await
        .unwrap();
    let read = [1, 2].map(|id| seckill::domain::ItemId::new(id).unwrap());
    assert!(read.iter().all(|id| due.contains(id)), "{due:?}");

    // … then item 1 is reopened: its end an hour on.
    let now = Utc::now();
    env.item(1, 2)
        .window(
            now - chrono::Duration::minutes(1),
            now + chrono::Duration::hours(1),
        )
        .put(&server)
        .await;
    assert!(stamp(&env, 1, "reconciled_at").await.is_none());
    // And item 2 is loaded again, on sale from a few seconds on (a forced warm-up of a
    // sale on sale is refused).
    let opens = now + chrono::Duration::seconds(3);
    env.item(2, 2)
        .window(opens, now + chrono::Duration::hours(1))
        .put(&server)
        .await;
    let (status, report) = env
        .admin_post(&server, "/admin/items/2/warmup?force=true")
        .await;
    assert_eq!(status, 200, "{report}");
    assert!(stamp(&env, 2, "retired_at").await.is_none());

    // The pass gets to them, with what it read.
    let redis = seckill::testing::RedisConns::new(env.settings.redis_url.expose()).unwrap();
    let keys = env.keys();
    for id in read {
        let outcome = retire(&env.db, &redis, &keys, id, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Retirement::NotDue,
            "item {id}: a live sale again, and retired"
        );
    }

    if let Ok(wait) = (opens - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
    for id in [1, 2] {
        let meta = env.item_keys(id).meta;
        let exists: bool = redis::AsyncCommands::exists(&mut env.redis.clone(), &meta)
            .await
            .unwrap();
        assert!(exists, "item {id}: its meta was deleted");
        assert_eq!(env.remaining(id).await, 1, "item {id}: its unit left");
        assert!(stamp(&env, id, "retired_at").await.is_none(), "item {id}");
        // The buyer who paid holds their place; a new buyer gets the unit left.
        let (status, json) = env.buy(&server, 1, id).await;
        assert_eq!(
            (status, json["code"].as_str()),
            (409, Some("duplicate")),
            "item {id}: the buyer who paid: {json}"
        );
        let (status, won) = env.buy(&server, 4, id).await;
        assert_eq!(status, 202, "item {id}: a new buyer: {won}");
        assert_eq!(env.buy(&server, 5, id).await.0, 410, "item {id}");
        let sn = won["order_sn"].as_str().unwrap_or_default().to_owned();
        eventually(Duration::from_secs(10), "the order is written", || async {
            match env.order_status(&sn).await {
                Some(_) => Ok(()),
                None => Err("not yet".to_owned()),
            }
        })
        .await;
        let stats = env.stats(&server, id).await;
        assert_eq!(stats["consistent"], true, "item {id}: {stats}");
    }
    server.stop().await;
}

/// A sale whose units Redis lost (every key of it gone) while an order of it was paid: its
/// stock cannot be counted, and its stats say it does not add up before it is retired and
/// after — retiring it does not make up the units Redis had. (Before, the retirement
/// recorded `total − paid` as unsold, and the stats of the retired sale said `consistent`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sale_whose_units_redis_lost_is_not_retired_as_adding_up() {
    let env = TestEnv::new("retire_lost").await;
    let redis = PrivateRedis::start().await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.redis_url = Secret::new(redis.url());
            s.sale_retention_s = 0;
            s.rate_per_user = 0;
        })
        .await;
    env.item(1, 3)
        .window(
            Utc::now() - chrono::Duration::seconds(1),
            Utc::now() + chrono::Duration::seconds(4),
        )
        .paying_within(1)
        .on_sale(&server)
        .await;
    let (status, won) = env.buy(&server, 1, 1).await;
    assert_eq!(status, 202, "{won}");
    let sn = won["order_sn"].as_str().unwrap_or_default().to_owned();
    eventually(Duration::from_secs(10), "the order is written", || async {
        match env.order_status(&sn).await {
            Some(_) => Ok(()),
            None => Err("not yet".to_owned()),
        }
    })
    .await;
    let (status, paid) = env.pay(&server, &sn).await;
    assert_eq!(
        (status, paid["code"].as_str()),
        (200, Some("paid")),
        "{paid}"
    );
    for key in item_keys(&redis, 1).await {
        redis.cmd(&["DEL", &key]).await;
    }
    let stats = env.stats(&server, 1).await;
    assert_eq!(
        (&stats["loaded"], &stats["consistent"]),
        (&Value::Bool(false), &Value::Bool(false)),
        "{stats}"
    );

    wait_retired(&env, &server, 1).await;
    let stats = env.stats(&server, 1).await;
    assert!(stats["retired_at"].is_string(), "{stats}");
    assert_eq!(
        (&stats["orders"]["paid"], &stats["consistent"]),
        (&Value::from(1), &Value::Bool(false)),
        "{stats}"
    );
    server.stop().await;
}

/// A `PUT` giving a retired sale a new window with a wave to come writes nothing of it to
/// Redis, as one without waves does (a forced warm-up loads it again): the write that holds
/// a raised wave back in Redis while the record is written puts the record's rules back
/// after it only where the sale lives. (It wrote a meta of rules alone for the retired
/// sale, as `PUT`s did before retirement checked the row.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_sale_given_a_wave_gets_nothing_back_in_redis() {
    let env = TestEnv::new("retire_wave_put").await;
    let server = env
        .server_with(ALL_ROLES, |s| s.sale_retention_s = 3_600)
        .await;
    let now = Utc::now();
    env.item(1, 10)
        .window(
            now - chrono::Duration::hours(2),
            now - chrono::Duration::hours(1),
        )
        .put(&server)
        .await;
    // Retired as the pass leaves a sale never loaded: the record says so, and the meta its
    // creation wrote is gone.
    sqlx::query("UPDATE items SET retired_at = UTC_TIMESTAMP(3), unsold = 10 WHERE id = 1")
        .execute(&env.db)
        .await
        .unwrap();
    let meta = env.item_keys(1).meta;
    let () = redis::AsyncCommands::del(&mut env.redis.clone(), &meta)
        .await
        .unwrap();
    let reopened = env
        .item(1, 10)
        .window(now, now + chrono::Duration::hours(2))
        .release(&[(now + chrono::Duration::hours(1), 4)]);
    let (status, body) = reopened.try_put(&server).await;
    assert_eq!(status, 200, "{body}");
    let fields: std::collections::HashMap<String, String> =
        redis::AsyncCommands::hgetall(&mut env.redis.clone(), &meta)
            .await
            .unwrap();
    assert!(
        fields.is_empty(),
        "a PUT of the retired item wrote its meta back: {fields:?}"
    );
    server.stop().await;
}
