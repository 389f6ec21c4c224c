//! Hosts whose clocks run seconds off the fleet's (libfaketime on one process): every
//! decision other hosts must agree with is made by the fleet's clock, Redis's `TIME`
//! (src/clock.rs, and `grab.lua` itself), not by the host's own.

use std::time::Duration;

use chrono::Utc;

use seckill::Role;

use crate::support::*;

/// Sleeps until `at` by this (correct) clock.
async fn until(at: chrono::DateTime<Utc>) {
    if let Ok(wait) = (at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
}

/// An API host 3 s ahead and one 3 s behind, with a 1 s tolerance for `X-Client-Time`:
/// neither sells before `start_at` or after `end_at`, the one behind sells from the first
/// second, and both take a buyer's correct client time. (Before: the host ahead answered
/// `202` seconds early, the one behind seconds late.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_whose_clocks_run_off_open_and_close_the_sale_with_the_fleet() {
    let env = TestEnv::new("skew").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    let start = Utc::now() + chrono::Duration::seconds(6);
    let end = start + chrono::Duration::seconds(4);
    env.item(1, 10).window(start, end).on_sale(&server).await;
    let host = |offset: &str| {
        let mut command = seckill_with_clock(&env, offset);
        command
            .env("SECKILL_CLOCK_SKEW_MS", "1000")
            .args(["serve", "--roles", "api"]);
        serve(&mut command)
    };
    let (ahead_child, ahead, _, ahead_reader) = host("+3s");
    let (behind_child, behind, _, behind_reader) = host("-3s");
    let press = |server: &TestServer, user: u64| {
        let addr = server.addr;
        let (env, token) = (&env, env.token(user));
        async move {
            let (status, json) = buy(&env.http, addr, &token, 1).await;
            format!("{status} {}", json["code"].as_str().unwrap_or("-"))
        }
    };

    until(start - chrono::Duration::milliseconds(1500)).await;
    assert_eq!(
        press(&ahead, 1).await,
        "403 not_started",
        "the host 3 s ahead"
    );
    until(start + chrono::Duration::milliseconds(500)).await;
    assert_eq!(press(&behind, 2).await, "202 queued", "the host 3 s behind");
    assert_eq!(press(&ahead, 3).await, "202 queued", "the host 3 s ahead");
    until(end + chrono::Duration::milliseconds(500)).await;
    assert_eq!(press(&behind, 4).await, "403 ended", "the host 3 s behind");
    assert_eq!(press(&ahead, 5).await, "403 ended", "the host 3 s ahead");

    let users: Vec<u64> = env
        .orders(1)
        .await
        .iter()
        .map(|(_, user, _)| *user)
        .collect();
    env.wait_for_orders(&server, 1, 2, Duration::from_secs(10))
        .await;
    let mut users_now: Vec<u64> = env.orders(1).await.iter().map(|(_, u, _)| *u).collect();
    users_now.sort();
    assert_eq!(users_now, [2, 3], "orders (earlier look: {users:?})");
    stop_process(ahead_child, ahead_reader);
    stop_process(behind_child, behind_reader);
    server.stop().await;
}

/// A scheduler 3 s ahead cancels no order before its pay deadline (4 s): it claims due
/// deadlines by the fleet's clock, and the cancel itself is guarded by MySQL's
/// (`pay_deadline <= UTC_TIMESTAMP(3)`), so a scheduler that claims early only tries again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scheduler_whose_clock_runs_ahead_cancels_nothing_early() {
    let env = TestEnv::new("skew_deadline").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    env.item(1, 1).paying_within(4).on_sale(&server).await;
    let mut command = seckill_with_clock(&env, "+3s");
    command
        .env("SECKILL_SCHEDULER_POLL_MS", "200")
        .args(["serve", "--roles", "scheduler"]);
    let (child, _scheduler, _, reader) = serve(&mut command);

    let bought = std::time::Instant::now();
    let (status, json) = env.buy(&server, 1, 1).await;
    assert_eq!(status, 202, "{json}");
    let sn = json["order_sn"].as_str().unwrap().to_owned();
    env.wait_for_orders(&server, 1, 1, Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_millis(3_000).saturating_sub(bought.elapsed())).await;
    assert_eq!(
        env.order_status(&sn).await.as_deref(),
        Some("unpaid"),
        "3 s into a 4 s pay timeout"
    );
    eventually(
        Duration::from_secs(10),
        "the order cancelled at its deadline",
        || async {
            match env.order_status(&sn).await.as_deref() {
                Some("cancelled") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(
        bought.elapsed() >= Duration::from_secs(4),
        "cancelled early"
    );
    stop_process(child, reader);
    server.stop().await;
}
