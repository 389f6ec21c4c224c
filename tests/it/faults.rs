//! Redis failing: hung, gone, restarted with an empty script cache and no functions; and
//! the sold-out flag that spares Redis.

use std::time::{Duration, Instant};

use seckill::config::Secret;

use crate::support::*;

/// A server on a private Redis, item 1 on sale with 10 units, and user 1 holding one.
async fn on_private_redis(name: &str) -> (TestEnv, PrivateRedis, TestServer) {
    let env = TestEnv::new(name).await;
    let redis = PrivateRedis::start().await;
    let server = env
        .server_with(ALL_ROLES, |s| s.redis_url = Secret::new(redis.url()))
        .await;
    env.item(1, 10).on_sale(&server).await;
    assert_eq!(env.buy(&server, 1, 1).await.0, 202);
    (env, redis, server)
}

#[tokio::test]
async fn a_hung_or_dead_redis_turns_into_503_within_the_budget_and_readyz_names_it() {
    let (env, redis, server) = on_private_redis("redisdown").await;

    redis.freeze();
    let started = Instant::now();
    let (status, json) = env.buy(&server, 2, 1).await;
    let took = started.elapsed();
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("unavailable")),
        "{json}"
    );
    // The contract's budget is one second; the margin is for a loaded 2-core CI machine.
    assert!(took < Duration::from_millis(1500), "took {took:?}");

    let (status, ready) = env.get(&server, "/readyz", None).await;
    assert_eq!(status, 503);
    assert_eq!(ready["down"], serde_json::json!(["redis"]), "{ready}");
    assert_eq!(ready["dependencies"]["mysql"], "up");

    redis.thaw();
    eventually(Duration::from_secs(10), "recovered after thaw", || async {
        match env.buy(&server, 3, 1).await {
            (202, _) => Ok(()),
            (_, json) => Err(json.to_string()),
        }
    })
    .await;
    let (status, ready) = env.get(&server, "/readyz", None).await;
    assert_eq!((status, ready["code"].as_str()), (200, Some("ready")));

    // Gone altogether: still a quick 503, never a hang.
    drop(redis);
    let started = Instant::now();
    let (status, _) = env.buy(&server, 4, 1).await;
    assert_eq!(status, 503);
    assert!(started.elapsed() < Duration::from_millis(1500));
    server.stop().await;
}

/// The scripts and the purchase's Function gone from Redis (flushed; a Redis restarted
/// without its data, or a master added since, has neither): each is loaded again on its
/// next call, which answers as usual.
#[tokio::test]
async fn purchases_survive_a_flushed_script_cache_and_function_library() {
    let (env, redis, server) = on_private_redis("noscript").await;
    redis.cmd(&["SCRIPT", "FLUSH"]).await;
    let (status, json) = env.buy(&server, 2, 1).await;
    assert_eq!(status, 202, "after SCRIPT FLUSH: {json}");
    let (status, _) = env.buy(&server, 2, 1).await;
    assert_eq!(status, 409);
    redis.cmd(&["FUNCTION", "FLUSH"]).await;
    let (status, json) = env.buy(&server, 3, 1).await;
    assert_eq!(status, 202, "after FUNCTION FLUSH: {json}");
    let (status, json) = env.buy(&server, 3, 1).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (409, Some("duplicate")),
        "{json}"
    );
    server.stop().await;
}

#[tokio::test]
async fn sold_out_is_answered_from_memory_everywhere_and_forgotten_when_units_return() {
    let env = TestEnv::new("soldout").await;
    let redis = PrivateRedis::start().await;
    let private = |s: &mut seckill::Settings| s.redis_url = Secret::new(redis.url());
    let a = env.server_with(ALL_ROLES, private).await;
    let b = env.server_with(&[seckill::Role::Api], private).await;
    env.item(1, 2).on_sale(&a).await;
    assert_eq!(env.buy(&a, 1, 1).await.0, 202);
    assert_eq!(env.buy(&a, 2, 1).await.0, 202);
    assert_eq!(env.buy(&a, 3, 1).await.0, 410);

    // B learns "sold out" without selling anything itself.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (_, item) = env.get(&b, "/api/items/1", None).await;
        if item["status"] == "sold_out" {
            break;
        }
        assert!(Instant::now() < deadline, "B never learned: {item}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // With Redis hung, both still answer 410 at once: no round trip was needed.
    redis.freeze();
    for server in [&a, &b] {
        let (status, json) = env.buy(server, 4, 1).await;
        assert_eq!(
            (status, json["code"].as_str()),
            (410, Some("sold_out")),
            "{json}"
        );
    }
    redis.thaw();

    // Units come back (the operator raises the total and reloads): every instance sells again.
    let admin = |path: &str| env.admin(reqwest::Method::POST, &a, path).send();
    admin("/admin/items/1/pause").await.unwrap();
    env.item(1, 5).put(&a).await;
    assert_eq!(
        admin("/admin/items/1/warmup?force=true")
            .await
            .unwrap()
            .status(),
        200
    );
    admin("/admin/items/1/resume").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (status, json) = env.buy(&b, 5, 1).await;
        if status == 202 {
            break;
        }
        assert!(Instant::now() < deadline, "B still refuses: {json}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.stop().await;
    a.stop().await;
}

/// `grab.lua` checks everything before its first write: a sale window in the meta that
/// is not a number refuses the purchase and takes no unit (a script never rolls back).
#[tokio::test]
async fn a_corrupt_meta_refuses_the_purchase_without_taking_a_unit() {
    use redis::AsyncCommands;
    let env = TestEnv::new("badmeta").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 5).on_sale(&server).await;
    let mut redis = env.redis.clone();
    let meta = env.item_keys(1).meta;
    let start_ms: String = redis.hget(&meta, "start_ms").await.unwrap();
    env.set_meta(1, &[("start_ms", "garbage")]).await;
    let (status, json) = env.buy(&server, 1, 1).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("unavailable")),
        "{json}"
    );
    assert_eq!(env.remaining(1).await, 5, "a unit was taken");
    let pending: u64 = redis.hlen(env.item_keys(1).pending).await.unwrap();
    assert_eq!(pending, 0);
    env.set_meta(1, &[("start_ms", &start_ms)]).await;
    assert_eq!(env.buy(&server, 1, 1).await.0, 202);
    server.stop().await;
}

/// `WAIT 1` on one Redis server with one replica (no cluster): a win is answered once the
/// replica holds it; while the replica is stuck (frozen), purchases are refused before
/// the grab and take nothing; thawed, the sale goes on — every unit accounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_one_server_sells_only_what_its_replica_holds() {
    let env = TestEnv::new("wait_one_server").await;
    let master = PrivateRedis::start().await;
    let master_port = master.port.to_string();
    // Loading the master's copy straight from the socket: nothing written to disk here.
    let replica = PrivateRedis::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &master_port,
        "--repl-diskless-load",
        "on-empty-db",
    ])
    .await;
    eventually(Duration::from_secs(10), "the replica in step", || async {
        let info = replica.cmd(&["INFO", "replication"]).await;
        let info: String = redis::FromRedisValue::from_redis_value(info).unwrap_or_default();
        if info.contains("master_link_status:up") {
            Ok(())
        } else {
            Err(info)
        }
    })
    .await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.redis_url = Secret::new(master.url());
            s.redis_wait_replicas = 1;
        })
        .await;
    env.item(1, 10).on_sale(&server).await;
    assert_eq!(env.buy(&server, 1, 1).await.0, 202);

    replica.freeze();
    eventually(Duration::from_secs(10), "a refusal", || async {
        let (status, json) = env.buy(&server, 2, 1).await;
        let stats = env.stats(&server, 1).await;
        if status == 503 && stats["replicas"]["short"] == serde_json::json!([0]) {
            Ok(())
        } else {
            Err(format!("{status} {json} {stats}"))
        }
    })
    .await;
    replica.thaw();
    eventually(Duration::from_secs(10), "a sale again", || async {
        match env.buy(&server, 2, 1).await {
            (202, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    env.wait_for_orders(&server, 1, 2, Duration::from_secs(10))
        .await;
    let stats = env.stats(&server, 1).await;
    assert_eq!(
        (stats["remaining"].as_u64(), stats["consistent"].as_bool()),
        (Some(8), Some(true)),
        "{stats}"
    );
    server.stop().await;
}
