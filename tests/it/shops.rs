//! Shop status: seen everywhere within a second, bursts coalesced, one change at a time,
//! repaired from MySQL, still answered with stores down, and obeyed by purchases.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{Value, json};

use seckill::Role;
use seckill::config::Secret;
use seckill::testing::Keys;
use seckill::testing::shop_changes as changes;

use crate::support::*;

async fn set_status(env: &TestEnv, server: &TestServer, shop: u64, body: Value) -> (u16, Value) {
    let response = env
        .admin(
            reqwest::Method::PUT,
            server,
            &format!("/admin/shops/{shop}/status"),
        )
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn shop_open(env: &TestEnv, server: &TestServer, shop: u64) -> Value {
    let (status, json) = env
        .get(server, &format!("/api/shops/{shop}/status"), None)
        .await;
    assert_eq!(status, 200, "{json}");
    json["open"].clone()
}

/// A shop-cache fill counter of one process's `/metrics`.
async fn fills(env: &TestEnv, server: &TestServer) -> f64 {
    env.metrics_text(server)
        .await
        .lines()
        .filter(|l| l.starts_with("seckill_shop_cache_fills_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn closed_shops_sell_nothing_and_hours_exceptions_and_overrides_decide() {
    let env = &TestEnv::new("shopclosed").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 10).on_sale(&server).await;
    // A shop first seen through an item: open, no hours.
    assert_eq!(shop_open(env, &server, 1).await, true);
    let (status, json) = env.get(&server, "/api/shops/99/status", None).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (404, Some("shop_not_found"))
    );

    // Today is an exception in the shop's zone: closed all day.
    let today = chrono::Utc::now()
        .with_timezone(&chrono_tz::Asia::Shanghai)
        .date_naive();
    let hours = json!({
        "timezone": "Asia/Shanghai",
        "weekly": [{"weekday": 1, "open": "09:00", "close": "22:00"}],
        "exceptions": [{"date": today, "open": false}],
    });
    let response = env
        .admin(reqwest::Method::PUT, &server, "/admin/shops/1/hours")
        .json(&hours)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(shop_open(env, &server, 1).await, false);
    let (status, json) = env.takes_nothing(1, env.buy(&server, 1, 1)).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("shop_closed")),
        "{json}"
    );

    // An operator's override wins over the exception; clearing it gives the hours back.
    let (status, json) = set_status(
        env,
        &server,
        1,
        json!({"open": true, "reason": "late sale", "by": "carol"}),
    )
    .await;
    assert_eq!(
        (status, json["open"].as_bool()),
        (200, Some(true)),
        "{json}"
    );
    let (status, json) = env.buy(&server, 1, 1).await;
    assert_eq!(status, 202, "{json}");
    set_status(env, &server, 1, json!({"open": null})).await;
    assert_eq!(shop_open(env, &server, 1).await, false);

    // Bad input is named and changes nothing.
    for (path, body) in [
        ("hours", json!({"timezone": "Mars/Olympus"})),
        (
            "hours",
            json!({"timezone": "UTC", "weekly": [{"weekday": 9, "open": "09:00", "close": "10:00"}]}),
        ),
        (
            "status",
            json!({"open": false, "until": "2001-01-01T00:00:00Z"}),
        ),
        ("status", json!({"open": "yes"})),
    ] {
        let response = env
            .admin(
                reqwest::Method::PUT,
                &server,
                &format!("/admin/shops/1/{path}"),
            )
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{path} {body}");
    }
    // Every change is logged with who and why.
    let log: Vec<(String, bool, bool, String, String)> = sqlx::query_as(
        "SELECT what, old_open, new_open, actor, reason FROM shop_changes ORDER BY id",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(log.len(), 3, "{log:?}");
    assert_eq!(
        (log[0].0.as_str(), log[0].1, log[0].2),
        ("hours", true, false)
    );
    assert_eq!(
        log[1],
        (
            "status".into(),
            false,
            true,
            "carol".into(),
            "late sale".into()
        )
    );
    // Support staff can push the MySQL truth everywhere again.
    for (shop, status, code) in [(1, 200, "refreshed"), (99, 404, "shop_not_found")] {
        let response = env
            .admin(
                reqwest::Method::POST,
                &server,
                &format!("/admin/shops/{shop}/refresh"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status);
        let json: Value = response.json().await.unwrap();
        assert_eq!(json["code"], code, "{json}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_change_through_one_instance_reaches_another_within_a_second_and_bursts_coalesce() {
    let env = &TestEnv::new("shopspread").await;
    let a = env.server(ALL_ROLES).await;
    env.item(1, 10).on_sale(&a).await;
    // B is a process of its own, so its /metrics counts only its own cache fills.
    let (child, b_server, _lines, reader) = serve(seckill(env).args(["serve", "--roles", "api"]));
    let b = &b_server;
    assert_eq!(shop_open(env, b, 1).await, true);

    set_status(env, &a, 1, json!({"open": false})).await;
    let changed = Instant::now();
    eventually(
        Duration::from_secs(3),
        "B seeing the shop closed",
        || async move {
            match env.buy(b, 2, 1).await {
                (503, json) if json["code"] == "shop_closed" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(
        changed.elapsed() < Duration::from_millis(1500),
        "{:?}",
        changed.elapsed()
    );

    // Ten changes in a row cost B a handful of reloads, not ten or more.
    let before = fills(env, b).await;
    for i in 0..10 {
        set_status(env, &a, 1, json!({"open": i % 2 == 0})).await;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reloads = fills(env, b).await - before;
    // One for the burst, and at most two more as one-second cache entries run out.
    assert!(
        reloads <= 3.0,
        "B reloaded the shop {reloads} times for 10 changes"
    );
    assert_eq!(
        shop_open(env, b, 1).await,
        false,
        "B ends on the last change"
    );

    stop_process(child, reader);
    a.stop().await;
}

#[tokio::test]
async fn one_change_at_a_time_a_crashed_holder_expires_and_no_other_lock_is_released() {
    let env = &TestEnv::new("shoplock").await;
    let redis = seckill::testing::RedisConns::new(&redis_url()).unwrap();
    let keys = Keys::new(&env.settings.namespace);
    let first = changes::lock(&redis, &keys, 1)
        .await
        .unwrap()
        .expect("free");
    assert!(
        changes::lock(&redis, &keys, 1).await.unwrap().is_none(),
        "held"
    );
    assert!(
        changes::lock(&redis, &keys, 2).await.unwrap().is_some(),
        "per shop"
    );
    assert!(first.release(&redis).await.unwrap());
    // A holder that crashes never releases: its lock runs out by itself.
    let crashed = changes::lock(&redis, &keys, 1)
        .await
        .unwrap()
        .expect("free again");
    tokio::time::sleep(Duration::from_millis(5200)).await;
    let next = changes::lock(&redis, &keys, 1)
        .await
        .unwrap()
        .expect("expired");
    // The late holder's release does not take the new holder's lock.
    assert!(!crashed.release(&redis).await.unwrap());
    assert!(changes::lock(&redis, &keys, 1).await.unwrap().is_none());
    assert!(next.release(&redis).await.unwrap());

    // Through the API, two changes at once both land, one after the other.
    let server = env.server(&[Role::Api]).await;
    env.item(1, 5).on_sale(&server).await;
    let (one, two) = tokio::join!(
        set_status(env, &server, 1, json!({"open": false, "reason": "one"})),
        set_status(env, &server, 1, json!({"open": true, "reason": "two"})),
    );
    assert_eq!((one.0, two.0), (200, 200), "{one:?} {two:?}");
    let logged: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM shop_changes")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(logged, 2);
    server.stop().await;
}

#[tokio::test]
async fn the_repair_fixes_redis_from_mysql_and_reads_survive_stores_going_down() {
    let env = &TestEnv::new("shoprepair").await;
    let private = PrivateRedis::start().await;
    let proxy = TcpProxy::start(mysql_addr()).await;
    let url = format!("mysql://root@{}/{}", proxy.addr, env.settings.namespace);
    let redis_url = private.url();
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.redis_url = Secret::new(redis_url);
            s.database_url = Secret::new(url);
            s.shop_repair_every_s = 1;
        })
        .await;
    env.item(1, 5).on_sale(&server).await;
    set_status(
        env,
        &server,
        1,
        json!({"open": false, "reason": "inventory"}),
    )
    .await;
    let key = format!("{}:shop:v1:1", env.settings.namespace);
    let truth: String = private_get(&private, &key).await.expect("in Redis");

    // Deleted, then wrong: the repair puts MySQL's version back.
    for damage in [
        None,
        Some(
            r#"{"id":1,"hours":{"timezone":"UTC"},"override":null,"updated_at":"2020-01-01T00:00:00Z"}"#,
        ),
    ] {
        match damage {
            None => private.cmd(&["DEL", &key]).await,
            Some(wrong) => private.cmd(&["SET", &key, wrong]).await,
        };
        eventually(Duration::from_secs(5), "Redis repaired", || async {
            match private_get(&private, &key).await {
                Some(now) if now == truth => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }

    // Redis gone: MySQL answers. MySQL gone too: the last known status.
    private.freeze();
    assert_eq!(shop_open(env, &server, 1).await, false);
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(shop_open(env, &server, 1).await, false);
    private.thaw();
    proxy.restore();
    server.stop().await;
}

async fn private_get(redis: &PrivateRedis, key: &str) -> Option<String> {
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    conn.get(key).await.unwrap()
}

/// An emergency close whose Redis write fails: the answer says so (MySQL has it, Redis
/// not), the change is in the log all the same, another instance obeys it at once (told
/// through RabbitMQ, it reloads from MySQL), and Redis gets it as soon as it takes writes
/// again — not at the hourly repair.
#[tokio::test]
async fn a_shop_change_redis_did_not_take_is_no_silent_success_and_reaches_redis_later() {
    let env = &TestEnv::new("shopnoredis").await;
    let proxy = TcpProxy::start(redis_addr()).await;
    let a = env
        .server_with(ALL_ROLES, |s| {
            s.redis_url = Secret::new(format!("redis://{}", proxy.addr))
        })
        .await;
    let b = env.server(&[Role::Api]).await;
    env.item(1, 1_000).on_sale(&a).await;
    assert_eq!(env.buy(&b, 1, 1).await.0, 202);

    // Redis takes nothing for shop 1's value (its lock still works).
    let shop_key = format!("{}:shop:v1:1", env.settings.namespace);
    let set = format!("SET\r\n${}\r\n{shop_key}\r\n", shop_key.len());
    proxy.drop_connection_when_sent(set.as_bytes(), u32::MAX);
    let (status, json) =
        set_status(env, &a, 1, json!({"open": false, "reason": "fire drill"})).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("unavailable")),
        "{json}"
    );
    let detail = json["detail"].as_str().unwrap();
    assert!(
        detail.contains("MySQL") && detail.contains("Redis"),
        "{detail}"
    );
    let logged: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM shop_changes WHERE shop_id = 1 AND reason = 'fire drill'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(logged, 1, "the change is in the log");
    // A new buyer each try: one who bought while B had not heard yet would be told
    // "duplicate" ever after.
    let buyer = std::sync::atomic::AtomicU64::new(2);
    eventually(Duration::from_secs(2), "B refusing purchases", || async {
        let user = buyer.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match env.buy(&b, user, 1).await {
            (503, json) if json["code"] == "shop_closed" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let stale: Option<String> = env.redis.clone().get(&shop_key).await.unwrap();
    assert!(
        !stale.unwrap_or_default().contains("fire drill"),
        "Redis took it after all"
    );

    proxy.drop_connection_when_sent(b"-", 0);
    eventually(Duration::from_secs(5), "the change in Redis", || async {
        let text: Option<String> = env.redis.clone().get(&shop_key).await.unwrap();
        match text {
            Some(t) if t.contains("fire drill") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(shop_open(env, &b, 1).await, false);
    assert_eq!(env.buy(&b, 1_000_000, 1).await.1["code"], "shop_closed");
    b.stop().await;
    a.stop().await;
}
