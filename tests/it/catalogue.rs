//! A big sale day's set-up: operators' scripts creating and warming up many items at once.

use futures::StreamExt;
use serde_json::json;

use crate::support::*;

/// Eight operators' scripts at once on a fresh database, each creating items of shops no
/// one has seen (two scripts share each new shop) and warming each up right after, half
/// of them through a second instance: every `PUT` answers `201`, every warm-up `200`
/// (MySQL deadlocked some of these `PUT`s into `500`s, and their warm-ups into `404`s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_scripts_create_and_warm_up_items_without_failing_on_each_other() {
    let env = TestEnv::new("catalogue_scripts").await;
    let first = env.server(ALL_ROLES).await;
    let second = env.server(&[seckill::Role::Api]).await;
    let now = chrono::Utc::now();
    let scripts = futures::stream::iter(0..8u64).map(|script| {
        let env = &env;
        let (first, second) = (&first, &second);
        async move {
            let mut failures = Vec::new();
            for n in 0..25u64 {
                let id = 1_000 + script * 100 + n;
                let body = json!({
                    "name": format!("item {id}"),
                    "shop_id": 500 + script / 2 + n % 3,
                    "total": 10,
                    "start_at": now,
                    "end_at": now + chrono::Duration::hours(1),
                    "price_cents": 100,
                });
                let put = env
                    .admin(reqwest::Method::PUT, first, &format!("/admin/items/{id}"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                if put.status() != 201 {
                    failures.push(format!("PUT {id}: {}", put.status()));
                    continue;
                }
                let other = if n % 2 == 0 { first } else { second };
                let (status, json) = env
                    .admin_post(other, &format!("/admin/items/{id}/warmup"))
                    .await;
                if status != 200 {
                    failures.push(format!("warm-up {id}: {status} {json}"));
                }
            }
            failures
        }
    });
    let failures: Vec<String> = scripts
        .buffer_unordered(8)
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    assert!(failures.is_empty(), "{failures:#?}");
    second.stop().await;
    first.stop().await;
}

/// Two instances with 3,000 items on sale beside the one that sells (more buckets than a
/// refresh reads in one tick): B learns "sold out" from A within a second (with Redis
/// then hung, B still answers `410` from memory); a unit put back without an announcement
/// (a lost message) is seen within a few seconds by B's refresh going round the catalogue;
/// a pause through A is obeyed by B within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_catalogue_still_spreads_sold_out_returns_and_pauses_within_bounds() {
    use redis::AsyncCommands;
    use seckill::config::Secret;
    use std::time::{Duration, Instant};

    let env = TestEnv::new("catalogue_large").await;
    let redis = crate::support::PrivateRedis::start().await;
    let private = |s: &mut seckill::Settings| s.redis_url = Secret::new(redis.url());
    let a = env.server_with(ALL_ROLES, private).await;
    let b = env.server_with(&[seckill::Role::Api], private).await;
    env.item(1, 2).on_sale(&a).await;
    sqlx::query(
        "INSERT INTO items (id, shop_id, name, total, price_cents, start_at, end_at)
         SELECT seq, 1, CONCAT('filler ', seq), 10, 100, UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE,
                UTC_TIMESTAMP(3) + INTERVAL 1 HOUR
         FROM seq_10_to_3009",
    )
    .execute(&env.db)
    .await
    .unwrap();
    // Both instances hold the fillers (an unknown id would be looked up on its own).
    tokio::time::sleep(Duration::from_secs(1)).await;

    assert_eq!(env.buy(&a, 1, 1).await.0, 202);
    assert_eq!(env.buy(&a, 2, 1).await.0, 202);
    assert_eq!(env.buy(&a, 3, 1).await.0, 410);
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.freeze();
    let (status, json) = env.buy(&b, 4, 1).await;
    redis.thaw();
    assert_eq!(
        (status, json["code"].as_str()),
        (410, Some("sold_out")),
        "B did not learn the sell-out within a second: {json}"
    );

    // A unit back in Redis that nobody announces: B's refresh finds it by itself.
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = conn
        .rpush(env.item_keys(1).tokens, "unannounced")
        .await
        .unwrap();
    let started = Instant::now();
    eventually(
        Duration::from_secs(10),
        "B sells the unannounced unit",
        || async {
            match env.buy(&b, 5, 1).await {
                (202, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    eprintln!("an unannounced unit was seen after {:?}", started.elapsed());

    // A pause through A: B refuses within a second.
    let paused = env
        .admin(reqwest::Method::POST, &a, "/admin/items/1/pause")
        .send()
        .await
        .unwrap();
    assert_eq!(paused.status(), 200);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // From B's memory: Redis (whose copy of the rules says paused too) is hung.
    redis.freeze();
    let (status, json) = env.buy(&b, 6, 1).await;
    redis.thaw();
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("paused")),
        "{json}"
    );
    b.stop().await;
    a.stop().await;
}

/// The bulk calls: 1,000 items written in one `PUT /admin/items` and loaded in one `POST
/// /admin/items/warmup`, every item's outcome named; a bad item refuses the whole call
/// (naming it) and writes nothing; a second warm-up and a changed split are refused per
/// item while the rest goes through; the items sell at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bulk_calls_write_and_load_a_thousand_items_and_name_each_outcome() {
    let env = TestEnv::new("catalogue_bulk").await;
    let server = env.server(ALL_ROLES).await;
    let now = chrono::Utc::now();
    let item = |id: u64, total: u32, buckets: u8| {
        json!({
            "id": id,
            "name": format!("item {id}"),
            "shop_id": 1 + id % 5,
            "total": total,
            "start_at": now - chrono::Duration::minutes(1),
            "end_at": now + chrono::Duration::hours(1),
            "price_cents": 100,
            "buckets": buckets,
        })
    };
    let put = |items: Vec<serde_json::Value>| {
        env.admin(reqwest::Method::PUT, &server, "/admin/items")
            .json(&json!({ "items": items }))
            .send()
    };

    // A bad item refuses the call, naming it, and writes nothing.
    let bad = put(vec![item(5, 10, 1), item(6, 0, 1)]).await.unwrap();
    assert_eq!(bad.status(), 400);
    let body: serde_json::Value = bad.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("items[1]")),
        "{body}"
    );
    assert!(env.orders(5).await.is_empty());
    let (status, _) = env.get(&server, "/api/items/5", None).await;
    assert_eq!(status, 404, "a refused call wrote item 5");

    // Every tenth item split over three buckets (the bulk warm-up loads those fresh too).
    let buckets = |id: u64| if id.is_multiple_of(10) { 3 } else { 1 };
    let written = put((10..1_010).map(|id| item(id, 5, buckets(id))).collect())
        .await
        .unwrap();
    assert_eq!(written.status(), 200);
    let body: serde_json::Value = written.json().await.unwrap();
    assert_eq!(
        (body["created"].as_u64(), body["updated"].as_u64()),
        (Some(1_000), Some(0))
    );

    let twice = env
        .admin(reqwest::Method::POST, &server, "/admin/items/warmup")
        .json(&json!({ "ids": [10, 11, 10] }))
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), 400);
    let body: serde_json::Value = twice.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("item 10 is listed twice")),
        "{body}"
    );

    let ids: Vec<u64> = (10..1_010).collect();
    let loaded = env
        .admin(reqwest::Method::POST, &server, "/admin/items/warmup")
        .json(&json!({ "ids": ids }))
        .send()
        .await
        .unwrap();
    assert_eq!(loaded.status(), 200);
    let body: serde_json::Value = loaded.json().await.unwrap();
    let refused: Vec<&serde_json::Value> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["code"] != "loaded")
        .collect();
    assert_eq!(body["loaded"].as_u64(), Some(1_000), "{refused:?}");
    // Each bucket holds its share, and MySQL says loaded.
    let keys = seckill::testing::Keys::new(&env.settings.namespace);
    let mut redis = env.redis.clone();
    for id in [10u64, 11, 1_000] {
        let mut units = 0;
        for bucket in 0..buckets(id) {
            let stock =
                seckill::domain::BucketId::new(seckill::domain::ItemId::new(id).unwrap(), bucket);
            let listed: u64 = redis::AsyncCommands::llen(&mut redis, keys.bucket(stock).tokens)
                .await
                .unwrap();
            units += listed;
        }
        assert_eq!(units, 5, "item {id}");
    }
    let (unloaded,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM items WHERE id BETWEEN 10 AND 1009 AND loaded_at IS NULL",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(unloaded, 0);

    // Per item: a second load is refused, the others are not held up.
    let again = env
        .admin(reqwest::Method::POST, &server, "/admin/items/warmup")
        .json(&json!({ "ids": [10, 3_000] }))
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = again.json().await.unwrap();
    let codes: Vec<&str> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["already_loaded", "item_not_found"], "{body}");
    // A loaded item cannot change its split; the other items of the call are written.
    let changed = put(vec![item(11, 5, 4), item(12, 7, 1)]).await.unwrap();
    let body: serde_json::Value = changed.json().await.unwrap();
    let codes: Vec<&str> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["buckets_fixed", "updated"], "{body}");

    assert_eq!(env.buy(&server, 1, 1_009).await.0, 202);
    for user in 1..=5 {
        assert_eq!(
            env.buy(&server, user, 1_000).await.0,
            202,
            "user {user}, split item"
        );
    }
    assert_eq!(env.buy(&server, 6, 1_000).await.0, 410);
    server.stop().await;
}
