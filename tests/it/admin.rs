//! The operators' API: authentication, item validation, warm-up, pause, stats.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

#[tokio::test]
async fn the_admin_api_wants_its_token() {
    let env = TestEnv::new("adminauth").await;
    let server = env.server(ALL_ROLES).await;
    for token in [None, Some("wrong"), Some("test-admin-tok")] {
        let mut request = env.http.get(server.url("/admin/items/1/stats"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{token:?}");
        assert_eq!(
            response.json::<Value>().await.unwrap()["code"],
            "unauthorized"
        );
    }
    server.stop().await;

    // No SECKILL_ADMIN_TOKEN: the admin API is closed, and says why.
    let server = env.server_with(ALL_ROLES, |s| s.admin_token = None).await;
    let response = env
        .admin(Method::GET, &server, "/admin/items/1/stats")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let json: Value = response.json().await.unwrap();
    assert!(
        json["detail"]
            .as_str()
            .unwrap()
            .contains("SECKILL_ADMIN_TOKEN"),
        "{json}"
    );
    server.stop().await;
}

#[tokio::test]
async fn items_are_validated() {
    let env = TestEnv::new("itemcheck").await;
    let server = env.server(ALL_ROLES).await;
    let good = json!({
        "name": "Phone", "shop_id": 3, "total": 10, "price_cents": 100,
        "start_at": "2030-01-01T10:00:00Z", "end_at": "2030-01-01T11:00:00Z",
    });
    let bad = [
        ("name", json!(""), "`name`"),
        ("total", json!(0), "`total`"),
        ("total", json!(-5), "`total`"),
        ("end_at", json!("2030-01-01T09:00:00Z"), "`end_at`"),
        ("start_at", json!("tomorrow"), "`start_at`"),
        ("pay_timeout_s", json!(0), "`pay_timeout_s`"),
        ("colour", json!("red"), "unknown field `colour`"),
    ];
    for (field, value, detail) in bad {
        let mut body = good.clone();
        body[field] = value;
        let response = env
            .admin(Method::PUT, &server, "/admin/items/5")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{field}");
        let json: Value = response.json().await.unwrap();
        assert!(
            json["detail"].as_str().unwrap().contains(detail),
            "{field}: {json}"
        );
    }
    let response = env
        .admin(Method::PUT, &server, "/admin/items/0")
        .json(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);

    let created = env
        .admin(Method::PUT, &server, "/admin/items/5")
        .json(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    assert_eq!(created["code"], "created");
    assert_eq!(
        created["item"]["pay_timeout_s"], 1800,
        "the default pay timeout"
    );
    let updated = env
        .admin(Method::PUT, &server, "/admin/items/5")
        .json(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(updated.status(), 200);
    assert_eq!(updated.json::<Value>().await.unwrap()["code"], "updated");

    // A new shop id creates the shop.
    let shops: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM shops WHERE id = 3")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(shops, 1);
    let (_, item) = env.get(&server, "/api/items/5", None).await;
    assert_eq!(
        (item["status"].as_str(), item["shop_id"].as_u64()),
        (Some("scheduled"), Some(3))
    );
    server.stop().await;
}

#[tokio::test]
async fn warmup_loads_once_verifies_and_reloads_only_when_safe() {
    let env = TestEnv::new("warmup").await;
    let server = env.server(ALL_ROLES).await;
    let missing = env
        .admin(Method::POST, &server, "/admin/items/77/warmup")
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    env.item(1, 25_000).put(&server).await;
    let report = env.warmup(&server, 1).await;
    assert_eq!(report["code"], "loaded");
    assert_eq!(
        (report["remaining"].as_u64(), report["sold"].as_u64()),
        (Some(25_000), Some(0))
    );

    let again = env
        .admin(Method::POST, &server, "/admin/items/1/warmup")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
    assert_eq!(
        again.json::<Value>().await.unwrap()["code"],
        "already_loaded"
    );

    for user in 1..=3 {
        assert_eq!(env.buy(&server, user, 1).await.0, 202);
    }
    // A live sale is never reloaded under the buyers' feet...
    let live = env
        .admin(Method::POST, &server, "/admin/items/1/warmup?force=true")
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 409);
    assert_eq!(live.json::<Value>().await.unwrap()["code"], "sale_live");

    // ...but paused, with a new total, it is: units held by orders stay held.
    env.admin(Method::POST, &server, "/admin/items/1/pause")
        .send()
        .await
        .unwrap();
    env.item(1, 10).put(&server).await;
    let reloaded = env
        .admin(Method::POST, &server, "/admin/items/1/warmup?force=true")
        .send()
        .await
        .unwrap();
    assert_eq!(reloaded.status(), 200);
    let reloaded: Value = reloaded.json().await.unwrap();
    assert_eq!(
        (reloaded["held"].as_u64(), reloaded["remaining"].as_u64()),
        (Some(3), Some(7)),
        "{reloaded}"
    );
    env.admin(Method::POST, &server, "/admin/items/1/resume")
        .send()
        .await
        .unwrap();
    // Buyers are remembered across the reload.
    assert_eq!(env.buy(&server, 1, 1).await.0, 409);
    env.wait_for_orders(&server, 1, 3, std::time::Duration::from_secs(20))
        .await;
    let stats = env.stats(&server, 1).await;
    assert_eq!(stats["consistent"], true, "{stats}");
    server.stop().await;
}

#[tokio::test]
async fn the_admin_api_can_listen_apart() {
    let env = TestEnv::new("adminaddr").await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.admin_addr = Some("127.0.0.1:0".parse().unwrap())
        })
        .await;
    // The main listener no longer serves /admin; the admin listener does.
    let response = env
        .admin(Method::GET, &server, "/admin/items/1/stats")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let admin = server.admin_addr.expect("an admin listener");
    let response = env
        .http
        .put(format!("http://{admin}/admin/items/1"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({
            "name": "x", "shop_id": 1, "total": 1, "price_cents": 1,
            "start_at": "2030-01-01T10:00:00Z", "end_at": "2030-01-01T11:00:00Z",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let purchase = env
        .http
        .get(format!("http://{admin}/api/items/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        purchase.status(),
        404,
        "the admin listener serves only /admin"
    );
    server.stop().await;
}

/// A warm-up that takes longer than a purchase's one-second budget answers with its
/// report: two million units (100 round trips of 20,000) to a Redis whose every answer the
/// test's proxy holds back 20 ms, so it surely takes over two seconds on any machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warmup_of_millions_of_units_is_not_cut_off_by_the_purchase_budget() {
    let env = TestEnv::new("bigwarmup").await;
    let proxy = TcpProxy::start(redis_addr()).await;
    let server = env
        .server_with(&[seckill::Role::Api], |s| {
            s.redis_url = seckill::config::Secret::new(format!("redis://{}", proxy.addr))
        })
        .await;
    env.item(1, 2_000_000).put(&server).await;
    proxy.set_delay(Duration::from_millis(20));
    let began = std::time::Instant::now();
    let report = env.warmup(&server, 1).await;
    let took = began.elapsed();
    assert_eq!(report["remaining"], 2_000_000, "{report}");
    assert!(
        took > Duration::from_secs(1),
        "the warm-up took {took:?}: within the purchase budget, it proves nothing"
    );
    eprintln!(
        "a warm-up of 2,000,000 units over HTTP, Redis 20 ms away, took {:.2} s",
        took.as_secs_f64()
    );
    server.stop().await;
}
