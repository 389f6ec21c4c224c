//! The `seckill` binary as users run it: its commands, and `serve` as a process — JSON logs
//! with the request's span, and a clean stop on SIGTERM.

use std::time::Duration;

use serde_json::Value;

use seckill::domain::UserId;
use seckill::testing::Jwt;

use crate::support::*;

#[tokio::test]
async fn token_migrate_and_warmup_commands() {
    let env = TestEnv::new("cli").await;

    let out = seckill(&env)
        .args(["token", "--user", "42"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let jwt = Jwt::new(&env.settings.jwt_secret);
    let token = String::from_utf8(out.stdout).unwrap();
    assert_eq!(jwt.verify(token.trim()), Ok(UserId::new(42)));
    let out = seckill(&env)
        .args(["token", "--user", "10", "--count", "3"])
        .output()
        .unwrap();
    let users: Vec<UserId> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|t| jwt.verify(t).unwrap())
        .collect();
    assert_eq!(users, [10, 11, 12].map(UserId::new));

    // migrate creates the database and its tables.
    let fresh = format!("{}_m", env.settings.database_url.expose());
    let out = seckill(&env)
        .arg("migrate")
        .env("SECKILL_DATABASE_URL", &fresh)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pool = sqlx::MySqlPool::connect(&fresh).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar("SHOW TABLES")
        .fetch_all(&pool)
        .await
        .unwrap();
    for table in [
        "items",
        "orders",
        "shops",
        "shop_hours",
        "shop_exceptions",
        "shop_changes",
        "circuit_changes",
    ] {
        assert!(tables.iter().any(|t| t == table), "{tables:?}");
    }
    pool.close().await;

    // warmup loads once, and says why it will not load twice.
    let server = env.server(&[seckill::Role::Api]).await;
    env.item(9, 2_500).put(&server).await;
    let out = seckill(&env)
        .args(["warmup", "--item", "9"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["remaining"].as_u64(), report["sold"].as_u64()),
        (Some(2_500), Some(0))
    );
    let out = seckill(&env)
        .args(["warmup", "--item", "9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("already loaded") && said.contains("--force"),
        "{said}"
    );
    let out = seckill(&env)
        .args(["warmup", "--item", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    server.stop().await;
}

#[tokio::test]
async fn serve_logs_json_lines_with_the_request_span_and_stops_on_sigterm() {
    let env = TestEnv::new("process").await;
    let (child, server, lines, reader) = serve(seckill(&env).arg("serve"));

    env.item(1, 5).on_sale(&server).await;
    let (status, won) = env.buy(&server, 7, 1).await;
    assert_eq!(status, 202, "{won}");
    env.wait_for_orders(&server, 1, 1, Duration::from_secs(20))
        .await;

    stop_process(child, reader);

    let lines = lines.lock().unwrap();
    let logged: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let event = |message: &str| logged.iter().find(|l| l["message"] == message);
    let grab = event("redis_grab").expect("a redis_grab line");
    assert_eq!(grab["outcome"], "won");
    assert!(grab["duration_ms"].is_number());
    assert_eq!(grab["span"]["trace_id"], won["trace_id"]);
    assert_eq!(
        (
            grab["span"]["user_id"].as_u64(),
            grab["span"]["item_id"].as_u64()
        ),
        (Some(7), Some(1))
    );
    for stage in ["mq_publish", "mysql_insert"] {
        let line = event(stage).unwrap_or_else(|| {
            panic!(
                "a {stage} line in {:#?}",
                logged
                    .iter()
                    .map(|l| l["message"].clone())
                    .collect::<Vec<_>>()
            )
        });
        assert!(
            line["outcome"].is_string() && line["duration_ms"].is_number(),
            "{line}"
        );
    }
    assert!(event("stopped").is_some(), "a clean stop is logged");
}

#[tokio::test]
async fn a_redis_that_refuses_config_is_named_in_the_log_and_deadlines_still_pass() {
    let env = TestEnv::new("noconfig").await;
    let redis = PrivateRedis::start_with(&["--rename-command", "CONFIG", ""]).await;
    let (child, server, lines, reader) = serve(
        seckill(&env)
            .arg("serve")
            .env("SECKILL_REDIS_URL", redis.url())
            .env("SECKILL_SCHEDULER_POLL_MS", "200"),
    );
    env.item(1, 2).paying_within(1).on_sale(&server).await;
    let (status, won) = env.buy(&server, 7, 1).await;
    assert_eq!(status, 202, "{won}");
    let sn = won["order_sn"].as_str().unwrap().to_owned();
    // Polling does the work that expiry events would have woken it for.
    eventually(Duration::from_secs(10), "the order cancelled", || {
        let (env, sn) = (&env, sn.clone());
        async move {
            match env.order_status(&sn).await.as_deref() {
                Some("cancelled") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    stop_process(child, reader);
    let lines = lines.lock().unwrap();
    let warning = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| {
            l["level"] == "WARN"
                && l["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("keyspace notifications"))
        });
    let warning = warning.unwrap_or_else(|| panic!("no keyspace warning in {lines:#?}"));
    assert!(
        warning["message"]
            .as_str()
            .unwrap()
            .contains("SECKILL_SCHEDULER_POLL_MS"),
        "{warning}"
    );
}
