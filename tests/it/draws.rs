//! Draws (`"mode": "draw"`): entries through the API until `draw_at`, the winners drawn by
//! rank from a seed committed in advance, a winner's cancelled unit passed to the next
//! entry by rank, and a draw cut off by a scheduler killed mid-way resumed without giving
//! anyone a second unit.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use redis::AsyncCommands;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use seckill::Role;
use seckill::domain::{BucketId, ItemId, UserId};
use seckill::testing::draw::rank;

use crate::history::quiet;
use crate::support::*;

/// The item's secret seed, as MySQL keeps it (the test plays a checker with the database's
/// key: it enters the crowd that did not press through the API, and predicts the winners).
async fn seed_of(env: &TestEnv, item: u64) -> String {
    let (seed,): (String,) = sqlx::query_as("SELECT draw_seed FROM items WHERE id = ?")
        .bind(item)
        .fetch_one(&env.db)
        .await
        .unwrap();
    seed
}

/// Enters users `from..to` straight into Redis, each in their home bucket with their rank:
/// what `enter.lua` would do for each of them, in bulk.
async fn enter_directly(
    env: &TestEnv,
    item: u64,
    buckets: u8,
    seed: &str,
    users: std::ops::Range<u64>,
) {
    let id = ItemId::new(item).unwrap();
    let keys = env.keys();
    let mut conn = env.redis.clone();
    // One pipeline per bucket: on a cluster, a pipeline's keys share one slot.
    let mut by_bucket: BTreeMap<BucketId, Vec<(u64, u64)>> = BTreeMap::new();
    for user in users.map(UserId::new) {
        let home = BucketId::home(id, user, buckets);
        by_bucket
            .entry(home)
            .or_default()
            .push((rank(seed, user).unwrap(), user.get()));
    }
    for (stock, entries) in by_bucket {
        for chunk in entries.chunks(5_000) {
            let () = conn
                .zadd_multiple(keys.entries(stock), chunk)
                .await
                .unwrap();
        }
    }
}

/// The `n` users of lowest rank among `users`.
fn lowest(seed: &str, users: impl Iterator<Item = u64>, n: usize) -> Vec<u64> {
    let mut ranked: Vec<(u64, u64)> = users
        .map(|u| (rank(seed, UserId::new(u)).unwrap(), u))
        .collect();
    ranked.sort_unstable_by(|(ra, ua), (rb, ub)| {
        ra.cmp(rb).then(ua.to_string().cmp(&ub.to_string()))
    });
    ranked.into_iter().take(n).map(|(_, u)| u).collect()
}

/// Live orders' users in MySQL.
async fn live_buyers(env: &TestEnv, item: u64) -> Vec<u64> {
    env.orders(item)
        .await
        .into_iter()
        .filter(|(_, _, status)| status != "cancelled")
        .map(|(_, user, _)| user)
        .collect()
}

/// `at` to the millisecond, as MySQL keeps a draw's time.
fn to_millis(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap()
}

async fn until(moment: DateTime<Utc>) {
    let wait = (moment - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
}

/// Waits until the item shows its seed (the first round is done), and answers the item.
async fn drawn(env: &TestEnv, server: &TestServer, item: u64, limit: Duration) -> Value {
    eventually(limit, "the draw done", || async {
        let (_, body) = env.get(server, &format!("/api/items/{item}"), None).await;
        if body["draw_seed"].is_string() {
            Ok(body)
        } else {
            Err(body.to_string())
        }
    })
    .await
}

/// 100,000 entries (400 through the API, the rest straight into Redis) for 50 units over
/// 4 buckets: entries answer `202 entered`, again `200` with the same entry; the item
/// commits to its seed before and shows it after; the 50 lowest ranks win, each an order
/// as a purchase's; `my-entry` tells each entrant; after `draw_at` no entry is taken; a
/// winner's cancel passes the unit to the next entry by rank.
pub async fn draw_by_rank(env: &TestEnv, server: &TestServer, item: u64) {
    let draw_at = Utc::now() + chrono::Duration::seconds(12);
    let (status, body) = env
        .item(item, 50)
        .buckets(4)
        .draw(draw_at)
        .try_put(server)
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(
        body["item"].get("draw_seed").is_none(),
        "the seed stays secret: {body}"
    );
    env.warmup(server, item).await;
    let (_, shown) = env.get(server, &format!("/api/items/{item}"), None).await;
    let commitment = shown["draw_commitment"].as_str().unwrap().to_owned();
    assert_eq!(commitment.len(), 64, "{shown}");
    assert!(shown.get("draw_seed").is_none(), "{shown}");

    // Entries through the API.
    let answers: Vec<(u16, Value)> = futures::stream::iter(1..=400u64)
        .map(|user| {
            let (env, server) = (env, server);
            async move { env.buy(server, user, item).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut by_code: BTreeMap<String, u64> = BTreeMap::new();
    for (status, body) in &answers {
        *by_code
            .entry(format!("{status} {}", body["code"].as_str().unwrap_or("?")))
            .or_default() += 1;
    }
    assert_eq!(by_code, BTreeMap::from([("202 entered".into(), 400)]));
    let (status, again) = env.buy(server, 7, item).await;
    assert_eq!(
        (status, again["code"].as_str(), again["entry_id"].as_str()),
        (200, Some("entered"), Some(format!("{item}:7").as_str()))
    );
    let (status, mine) = env
        .get(server, &format!("/api/items/{item}/my-entry"), Some(7))
        .await;
    assert_eq!(
        (status, mine["status"].as_str(), &mine["rank"]),
        (200, Some("entered"), &Value::Null),
        "{mine}"
    );
    assert_eq!(
        env.get(
            server,
            &format!("/api/items/{item}/my-entry"),
            Some(100_000_000)
        )
        .await
        .0,
        404
    );

    let seed = seed_of(env, item).await;
    enter_directly(env, item, 4, &seed, 401..100_001).await;
    assert!(
        Utc::now() < draw_at,
        "entering took past draw_at: the draw may have missed some"
    );
    let stats = env.stats(server, item).await;
    assert_eq!(stats["entries"], 100_000, "{stats}");

    until(draw_at).await;
    let (status, late) = env.buy(server, 200_000, item).await;
    assert_eq!(
        (status, late["code"].as_str()),
        (403, Some("ended")),
        "{late}"
    );
    let shown = drawn(env, server, item, Duration::from_secs(30)).await;
    // The late press took nothing: no entry of theirs, none more counted.
    let (status, theirs) = env
        .get(
            server,
            &format!("/api/items/{item}/my-entry"),
            Some(200_000),
        )
        .await;
    assert_eq!(status, 404, "a press after draw_at entered: {theirs}");
    let stats = env.stats(server, item).await;
    assert_eq!(stats["entries"], 100_000, "{stats}");
    let published = shown["draw_seed"].as_str().unwrap();
    assert_eq!(published, seed);
    assert_eq!(
        hex::encode(Sha256::digest(hex::decode(&seed).unwrap())),
        commitment
    );

    quiet(env, server, item, &amqp_url(), Duration::from_secs(30)).await;
    let expected = lowest(&seed, 1..100_001, 51);
    let winners: HashSet<u64> = live_buyers(env, item).await.into_iter().collect();
    assert_eq!(
        winners,
        expected[..50].iter().copied().collect(),
        "the 50 lowest ranks win"
    );
    assert_eq!(
        shown["draw_cutoff"].as_u64(),
        Some(rank(&seed, UserId::new(expected[49])).unwrap())
    );
    env.assert_invariants(server, item, 50, &[]).await;

    // Each entrant learns how they fared.
    let winner = expected[0];
    let (_, mine) = env
        .get(server, &format!("/api/items/{item}/my-entry"), Some(winner))
        .await;
    assert_eq!(mine["status"], "won", "{mine}");
    assert_eq!(
        mine["rank"].as_u64(),
        Some(rank(&seed, UserId::new(winner)).unwrap())
    );
    let sn = mine["order_sn"].as_str().unwrap().to_owned();
    let (_, order) = env
        .get(server, &format!("/api/orders/{sn}"), Some(winner))
        .await;
    assert_eq!(order["status"], "unpaid", "{order}");
    let loser = (1..=400).find(|u| !winners.contains(u)).unwrap();
    let (_, theirs) = env
        .get(server, &format!("/api/items/{item}/my-entry"), Some(loser))
        .await;
    assert_eq!(theirs["status"], "not_drawn", "{theirs}");

    // A winner cancels: the unit passes to the 51st rank.
    let (status, body) = env
        .post_as(server, &format!("/api/orders/{sn}/cancel"), winner)
        .await;
    assert_eq!(status, 200, "{body}");
    let next = expected[50];
    eventually(Duration::from_secs(15), "the unit passed on", || async {
        let (_, theirs) = env
            .get(server, &format!("/api/items/{item}/my-entry"), Some(next))
            .await;
        if theirs["status"] == "won" {
            Ok(())
        } else {
            Err(theirs.to_string())
        }
    })
    .await;
    quiet(env, server, item, &amqp_url(), Duration::from_secs(30)).await;
    let winners: HashSet<u64> = live_buyers(env, item).await.into_iter().collect();
    assert!(winners.contains(&next) && !winners.contains(&winner));
    assert_eq!(winners.len(), 50);
    env.assert_invariants_cancelling(server, item, 50, &[], std::slice::from_ref(&sn))
        .await;
    let (_, mine) = env
        .get(server, &format!("/api/items/{item}/my-entry"), Some(winner))
        .await;
    assert_eq!(
        mine["order_sn"].as_str(),
        Some(sn.as_str()),
        "a winner is given a unit once: {mine}"
    );
}

/// [`draw_by_rank`] on one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draw_gives_its_units_by_rank_and_passes_a_cancelled_one_on() {
    let env = TestEnv::new("draws_rank").await;
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    draw_by_rank(&env, &server, 1).await;
}

/// 3,000 units over 2 buckets among 30,000 entries; the scheduler drawing them is killed
/// (SIGKILL) mid-draw and two others take over side by side: every unit is given once, each
/// to one of the 3,000 lowest ranks, nobody twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draw_cut_off_by_a_killed_scheduler_resumes_and_never_gives_twice() {
    let env = TestEnv::new("draws_crash").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    let draw_at = Utc::now() + chrono::Duration::seconds(3);
    env.item(1, 3_000)
        .buckets(2)
        .draw(draw_at)
        .on_sale(&server)
        .await;
    let seed = seed_of(&env, 1).await;
    enter_directly(&env, 1, 2, &seed, 1..30_001).await;

    let (mut first, _, _, reader) = serve(seckill(&env).args(["serve", "--roles", "scheduler"]));
    let keys = env.keys();
    let id = ItemId::new(1).unwrap();
    let given = || async {
        let mut conn = env.redis.clone();
        let mut n: u64 = 0;
        for stock in BucketId::all(id, 2) {
            n += conn.hlen::<_, u64>(keys.awarded(stock)).await.unwrap();
        }
        n
    };
    until(draw_at).await;
    eventually(Duration::from_secs(20), "the draw under way", || async {
        let n = given().await;
        if n >= 100 {
            Ok(())
        } else {
            Err(format!("{n} given"))
        }
    })
    .await;
    kill_hard(&mut first);
    let _ = reader.join();
    let at_kill = given().await;
    eprintln!("scheduler killed with {at_kill} of 3000 units given");
    assert!(
        at_kill < 3_000,
        "the draw finished before the kill: nothing was cut off"
    );

    let second = env.server(&[Role::Scheduler]).await;
    let third = env.server(&[Role::Scheduler]).await;
    let item = drawn(&env, &server, 1, Duration::from_secs(60)).await;
    assert_eq!(item["draw_seed"].as_str(), Some(seed.as_str()));
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(60)).await;
    let buyers = live_buyers(&env, 1).await;
    let unique: HashSet<u64> = buyers.iter().copied().collect();
    assert_eq!(
        (buyers.len(), unique.len()),
        (3_000, 3_000),
        "every unit once, nobody twice"
    );
    let expected: HashSet<u64> = lowest(&seed, 1..30_001, 3_000).into_iter().collect();
    assert_eq!(unique, expected, "the 3,000 lowest ranks");
    assert_eq!(given().await, 3_000);
    env.assert_invariants(&server, 1, 3_000, &[]).await;
    drop((second, third));
}

/// A measurement (`loadtest/draw.sh`; docs/benchmarks.md's figures): a million entries over 16
/// buckets, 1,000 units; how long entering them into Redis took, and the draw from
/// `draw_at` to the seed's publication and to the last order in MySQL, printed as one
/// line of JSON after `draw figures: ` for `loadtest/draw.sh`, which runs it (release
/// build) and writes the report. Asserts the winners, not the times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn a_million_entries() {
    let env = TestEnv::new("draws_million").await;
    let server = env.server(ALL_ROLES).await;
    let draw_at = Utc::now() + chrono::Duration::seconds(40);
    env.item(1, 1_000)
        .buckets(16)
        .draw(draw_at)
        .on_sale(&server)
        .await;
    let seed = seed_of(&env, 1).await;
    let memory = || async {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut env.redis.clone())
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse::<i64>().ok())
            .unwrap()
    };
    let before = memory().await;
    let began = std::time::Instant::now();
    enter_directly(&env, 1, 16, &seed, 1..1_000_001).await;
    let entered_in = began.elapsed();
    let entries_memory = memory().await - before;
    let stats = env.stats(&server, 1).await;
    assert_eq!(stats["entries"], 1_000_000, "{stats}");
    assert!(
        Utc::now() < draw_at,
        "entering took past draw_at: give it more time"
    );
    until(draw_at).await;
    let began = std::time::Instant::now();
    drawn(&env, &server, 1, Duration::from_secs(120)).await;
    let drawn_in = began.elapsed();
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(120)).await;
    let in_mysql = began.elapsed();
    let expected: HashSet<u64> = lowest(&seed, 1..1_000_001, 1_000).into_iter().collect();
    let winners: HashSet<u64> = live_buyers(&env, 1).await.into_iter().collect();
    assert_eq!(winners, expected, "the 1,000 lowest ranks");
    let secs = |d: Duration| (d.as_secs_f64() * 100.0).round() / 100.0;
    eprintln!(
        "draw figures: {}",
        json!({
            "entries": 1_000_000,
            "units": 1_000,
            "buckets": 16,
            "entered_s": secs(entered_in),
            "redis_memory_mb": entries_memory / 1_000_000,
            "seed_published_after_draw_at_s": secs(drawn_in),
            "orders_in_mysql_after_draw_at_s": secs(in_mysql),
            "winners_the_lowest_ranks": true,
        })
    );
}

/// Two draws of one item at the very same time (no lock between them, as if two
/// schedulers' leases overlapped): 200 units among 5,000 entries, each given once, to the
/// 200 lowest ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_draws_at_once_give_nobody_twice() {
    let env = TestEnv::new("draws_twice").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    let draw_at = Utc::now() + chrono::Duration::seconds(2);
    env.item(1, 200)
        .buckets(2)
        .draw(draw_at)
        .on_sale(&server)
        .await;
    let seed = seed_of(&env, 1).await;
    enter_directly(&env, 1, 2, &seed, 1..5_001).await;
    until(draw_at).await;

    let redis = seckill::testing::RedisConns::new(env.settings.redis_url.expose()).unwrap();
    let keys = env.keys();
    let item = seckill::testing::items::get(&env.db, ItemId::new(1).unwrap())
        .await
        .unwrap()
        .unwrap();
    let (a, b) = tokio::join!(
        seckill::testing::draw::draw(&redis, &keys, &item),
        seckill::testing::draw::draw(&redis, &keys, &item)
    );
    let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
    assert_eq!(a.given + b.given, 200, "{a:?} {b:?}");

    // The orders go out through the relay, the scheduler role's (its own draw pass finds
    // nothing left to give).
    let _relay = env.server(&[Role::Scheduler]).await;
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    let buyers = live_buyers(&env, 1).await;
    let unique: HashSet<u64> = buyers.iter().copied().collect();
    assert_eq!((buyers.len(), unique.len()), (200, 200));
    let expected: HashSet<u64> = lowest(&seed, 1..5_001, 200).into_iter().collect();
    assert_eq!(unique, expected);
    env.assert_invariants(&server, 1, 200, &[]).await;
}

/// `PUT /admin/items/{id}` with `body`: its status and answer.
async fn put_item(env: &TestEnv, server: &TestServer, id: u64, body: &Value) -> (u16, Value) {
    let response = env
        .admin(reqwest::Method::PUT, server, &format!("/admin/items/{id}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// What anyone and an operator see of the item: `GET /api/items/{id}` and its stats
/// (without their requests' `trace_id`).
async fn seen(env: &TestEnv, server: &TestServer, item: u64) -> (Value, Value) {
    let (status, mut shown) = env.get(server, &format!("/api/items/{item}"), None).await;
    assert_eq!(status, 200, "{shown}");
    let mut stats = env.stats(server, item).await;
    for answer in [&mut shown, &mut stats] {
        answer.as_object_mut().unwrap().remove("trace_id");
    }
    (shown, stats)
}

/// Asserts a `409` with `code` whose detail names `field`.
fn refused(answer: &(u16, Value), code: &str, field: &str) {
    let (status, body) = answer;
    assert_eq!(
        (*status, body["code"].as_str()),
        (409, Some(code)),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(&format!("`{field}`")), "{body}");
}

/// Pause, `warmup?force=true`, resume: how an operator reloads an item.
async fn reload(env: &TestEnv, server: &TestServer, item: u64) {
    for (path, want) in [
        (format!("/admin/items/{item}/pause"), 200),
        (format!("/admin/items/{item}/warmup?force=true"), 200),
        (format!("/admin/items/{item}/resume"), 200),
    ] {
        let (status, body) = env.admin_post(server, &path).await;
        assert_eq!(status, want, "{path}: {body}");
    }
}

/// An item keeps its mode once it was loaded: a live sale with five buyers switched to a
/// draw, and a loaded draw (no entry yet) switched to a sale, are each `409 mode_fixed`
/// naming `mode`, and change nothing (the item as shown and its stats alike); an item
/// never loaded changes its mode freely.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_loaded_item_keeps_its_mode() {
    let env = TestEnv::new("draws_mode").await;
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    let now = Utc::now();
    let (start, end) = (
        now - chrono::Duration::seconds(5),
        now + chrono::Duration::hours(1),
    );
    let sale = || env.item(1, 10).window(start, end);
    sale().on_sale(&server).await;
    let mut won = Vec::new();
    for user in 1..=5 {
        let (status, body) = env.buy(&server, user, 1).await;
        assert_eq!(status, 202, "{body}");
        won.push(body["order_sn"].as_str().unwrap().to_owned());
    }
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    let before = seen(&env, &server, 1).await;
    let as_draw = sale().draw(now + chrono::Duration::minutes(1)).body();
    refused(
        &put_item(&env, &server, 1, &as_draw).await,
        "mode_fixed",
        "mode",
    );
    let mut in_bulk = as_draw.clone();
    in_bulk["id"] = 1.into();
    let bulk = env
        .admin(reqwest::Method::PUT, &server, "/admin/items")
        .json(&serde_json::json!({ "items": [in_bulk] }))
        .send()
        .await
        .unwrap();
    let status = bulk.status().as_u16();
    refused(&(status, bulk.json().await.unwrap()), "mode_fixed", "mode");
    assert_eq!(
        seen(&env, &server, 1).await,
        before,
        "a refused PUT changes nothing"
    );
    // The sale goes on as a sale: a buyer cannot buy twice, a new one can buy.
    assert_eq!(env.buy(&server, 1, 1).await.0, 409);
    let (status, body) = env.buy(&server, 6, 1).await;
    assert_eq!(status, 202, "{body}");
    won.push(body["order_sn"].as_str().unwrap().to_owned());
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    env.assert_invariants(&server, 1, 10, &won).await;

    let draw = || {
        env.item(2, 10)
            .window(start, end)
            .draw(now + chrono::Duration::minutes(1))
    };
    draw().on_sale(&server).await;
    let before = seen(&env, &server, 2).await;
    let as_sale = env.item(2, 10).window(start, end).body();
    refused(
        &put_item(&env, &server, 2, &as_sale).await,
        "mode_fixed",
        "mode",
    );
    assert_eq!(seen(&env, &server, 2).await, before);
    assert_eq!(
        draw().try_put(&server).await.0,
        200,
        "the same mode is fine"
    );

    let never_loaded = env.item(3, 10).window(start, end);
    assert_eq!(never_loaded.try_put(&server).await.0, 201);
    let as_draw = never_loaded.draw(now + chrono::Duration::minutes(1));
    assert_eq!(as_draw.try_put(&server).await.0, 200);
    assert_eq!(put_item(&env, &server, 3, &sale().body()).await.0, 200);
}

/// A sale never loaded switched to a draw while its first warm-up runs: the `PUT` checked
/// the mode before the load, and writes after it. An item keeps its mode once loaded, so
/// one of them must give way — the warm-up (`409 warmup_running`) or the `PUT` (`409
/// mode_fixed`) — never both `200`, leaving a draw whose units were loaded, and could be
/// sold, as a first-come sale. (Both answered `200`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mode_switch_racing_the_first_warm_up_never_lands_after_it() {
    let env = TestEnv::new("draws_mode_race").await;
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    let now = Utc::now();
    let (start, end) = (
        now - chrono::Duration::seconds(5),
        now + chrono::Duration::hours(1),
    );
    let sale = env.item(1, 10).window(start, end);
    assert_eq!(sale.try_put(&server).await.0, 201);
    let as_draw = sale.draw(now + chrono::Duration::minutes(1));
    let (env, server) = (&env, &server);
    let shop = env.hold_shop_row().await;
    let warm_up = async move {
        env.until_an_item_write_waits().await;
        let answer = env.admin_post(server, "/admin/items/1/warmup").await;
        shop.rollback().await.unwrap();
        answer
    };
    let ((put, put_body), (warmed, warmed_body)) = tokio::join!(as_draw.try_put(server), warm_up);
    eprintln!("PUT as a draw: {put} {put_body}\nwarm-up: {warmed} {warmed_body}");
    assert!(
        put == 409 || warmed == 409,
        "the mode changed after the item was loaded: PUT {put} {put_body}, warm-up {warmed} {warmed_body}"
    );
}

/// A live sale with five buyers made a draw behind the server's back (its record and meta
/// changed as a `PUT` racing the item's warm-up could, or a server of an earlier release
/// did), its buyers among the entries: the draw passes over every entry whose user holds
/// an order — the unit goes to the next entry by rank — so nobody holds two where
/// `per_user` is 1, and the units go to the lowest ranks among the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draw_never_gives_a_buyer_a_second_unit() {
    let env = TestEnv::new("draws_buyers").await;
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    env.item(1, 10).on_sale(&server).await;
    for user in 1..=5 {
        let (status, body) = env.buy(&server, user, 1).await;
        assert_eq!(status, 202, "{body}");
    }
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;

    // A seed under which a buyer ranks among the five lowest of the twenty entries.
    let seed = (0u8..=255)
        .map(|n| hex::encode([n; 32]))
        .find(|seed| lowest(seed, 1..21, 5).iter().any(|user| *user <= 5))
        .unwrap();
    let draw_at = to_millis(Utc::now() + chrono::Duration::seconds(4));
    sqlx::query("UPDATE items SET draw_at = ?, draw_seed = ? WHERE id = 1")
        .bind(draw_at)
        .bind(&seed)
        .execute(&env.db)
        .await
        .unwrap();
    reload(&env, &server, 1).await;
    enter_directly(&env, 1, 1, &seed, 1..21).await;
    assert!(Utc::now() < draw_at, "entering took past draw_at");

    until(draw_at).await;
    drawn(&env, &server, 1, Duration::from_secs(30)).await;
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    env.assert_invariants(&server, 1, 10, &[]).await;
    let mut expected: Vec<u64> = (1..=5).chain(lowest(&seed, 6..21, 5)).collect();
    let mut holders = live_buyers(&env, 1).await;
    expected.sort_unstable();
    holders.sort_unstable();
    assert_eq!(
        holders, expected,
        "the buyers once each, and the five lowest ranks among the others"
    );
    let passed = lowest(&seed, 1..21, 5)
        .into_iter()
        .find(|user| *user <= 5)
        .unwrap();
    let (_, theirs) = env
        .get(&server, "/api/items/1/my-entry", Some(passed))
        .await;
    assert_eq!(theirs["status"], "not_drawn", "{theirs}");
}

/// Once drawn, a draw is final: a `PUT` moving `draw_at` or making it a sale is `409
/// draw_fixed` naming the field, and changes nothing; a larger `total` and a forced
/// warm-up give the new units to the next entries by rank, keep the seed and take no
/// entry; and should its time move anyway (the record changed behind the server's back),
/// `enter.lua` takes no entry once the draw was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drawn_draw_takes_no_entry_and_keeps_its_seed() {
    let env = TestEnv::new("draws_final").await;
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    let now = Utc::now();
    let (start, end) = (
        now - chrono::Duration::seconds(5),
        now + chrono::Duration::hours(1),
    );
    let draw_at = now + chrono::Duration::seconds(4);
    let item = |total| env.item(1, total).window(start, end).draw(draw_at);
    item(10).on_sale(&server).await;
    let seed = seed_of(&env, 1).await;
    enter_directly(&env, 1, 1, &seed, 1..31).await;
    until(draw_at).await;
    let shown = drawn(&env, &server, 1, Duration::from_secs(30)).await;
    assert_eq!(shown["draw_seed"].as_str(), Some(seed.as_str()));
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    let before = seen(&env, &server, 1).await;

    let later = env
        .item(1, 10)
        .window(start, end)
        .draw(now + chrono::Duration::minutes(30))
        .body();
    refused(
        &put_item(&env, &server, 1, &later).await,
        "draw_fixed",
        "draw_at",
    );
    let as_sale = env.item(1, 10).window(start, end).body();
    refused(
        &put_item(&env, &server, 1, &as_sale).await,
        "draw_fixed",
        "mode",
    );
    assert_eq!(
        seen(&env, &server, 1).await,
        before,
        "a refused PUT changes nothing"
    );
    let (status, late) = env.buy(&server, 1_000, 1).await;
    assert_eq!(
        (status, late["code"].as_str()),
        (403, Some("ended")),
        "{late}"
    );

    // Two units more, loaded by a forced warm-up: ranks 11 and 12 win them.
    let (status, body) = item(12).try_put(&server).await;
    assert_eq!(status, 200, "{body}");
    reload(&env, &server, 1).await;
    let (status, late) = env.buy(&server, 1_001, 1).await;
    assert_eq!(
        (status, late["code"].as_str()),
        (403, Some("ended")),
        "{late}"
    );
    let expected = lowest(&seed, 1..31, 12);
    eventually(Duration::from_secs(15), "ranks 11 and 12 won", || async {
        let mut holders = live_buyers(&env, 1).await;
        holders.sort_unstable();
        let mut want = expected.clone();
        want.sort_unstable();
        if holders == want {
            Ok(())
        } else {
            Err(format!("{holders:?}"))
        }
    })
    .await;
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    let (shown, stats) = seen(&env, &server, 1).await;
    assert_eq!(shown["draw_seed"].as_str(), Some(seed.as_str()));
    assert_eq!(shown["draw_commitment"], before.0["draw_commitment"]);
    assert_eq!(stats["entries"], 30, "{stats}");
    env.assert_invariants(&server, 1, 12, &[]).await;

    // The record moved behind the server's back, copied to Redis and the catalogues by a
    // pause and a resume, and a winner's unit back on the list (the draw pass waits for
    // the new time): enter.lua still takes no entry.
    sqlx::query("UPDATE items SET draw_at = ? WHERE id = 1")
        .bind(to_millis(now + chrono::Duration::minutes(30)))
        .execute(&env.db)
        .await
        .unwrap();
    for path in ["/admin/items/1/pause", "/admin/items/1/resume"] {
        assert_eq!(env.admin_post(&server, path).await.0, 200);
    }
    let (_, mine) = env
        .get(&server, "/api/items/1/my-entry", Some(expected[0]))
        .await;
    let sn = mine["order_sn"].as_str().unwrap().to_owned();
    let cancel = format!("/api/orders/{sn}/cancel");
    assert_eq!(env.post_as(&server, &cancel, expected[0]).await.0, 200);
    eventually(Duration::from_secs(5), "the entry refused", || async {
        let (status, body) = env.buy(&server, 1_002, 1).await;
        if (status, body["code"].as_str()) == (403, Some("ended")) {
            Ok(())
        } else {
            Err(format!("{status} {body}"))
        }
    })
    .await;
    assert_eq!(env.stats(&server, 1).await["entries"], 30);
}

/// A winner's award that Redis lost after the round recorded its cut-off in MySQL (a
/// failover that lost the last writes, the order not yet sent): the unit is back on the
/// list and the winner holds nothing; the next round gives it to that winner again, before
/// any rank above the cut-off, so the units still go to the lowest ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_award_goes_back_to_its_rank_first() {
    let env = TestEnv::new("draws_lost").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    let draw_at = Utc::now() + chrono::Duration::seconds(2);
    env.item(1, 5).draw(draw_at).on_sale(&server).await;
    let seed = seed_of(&env, 1).await;
    enter_directly(&env, 1, 1, &seed, 1..31).await;
    until(draw_at).await;

    // The first round, as the draw pass runs it, with nobody to send its orders yet.
    let redis = seckill::testing::RedisConns::new(env.settings.redis_url.expose()).unwrap();
    let keys = env.keys();
    let id = ItemId::new(1).unwrap();
    let item = seckill::testing::items::get(&env.db, id)
        .await
        .unwrap()
        .unwrap();
    let round = seckill::testing::draw::draw(&redis, &keys, &item)
        .await
        .unwrap()
        .unwrap();
    assert!(round.given == 5 && round.complete, "{round:?}");
    sqlx::query("UPDATE items SET draw_cutoff = ?, drawn_at = UTC_TIMESTAMP(3) WHERE id = 1")
        .bind(round.cutoff)
        .execute(&env.db)
        .await
        .unwrap();

    // Redis loses the award of the lowest rank: its record, its buyer record, its order
    // (pending, outbox) and the unit's LPOP.
    let expected = lowest(&seed, 1..31, 6);
    let lost = UserId::new(expected[0]);
    let bucket = BucketId::home(id, lost, 1);
    let item_keys = keys.bucket(bucket);
    let mut conn = env.redis.clone();
    let sn: String = conn.hget(keys.awarded(bucket), lost.get()).await.unwrap();
    let () = conn.hdel(keys.awarded(bucket), lost.get()).await.unwrap();
    let () = conn
        .hdel(item_keys.buyer_orders(lost), lost.get())
        .await
        .unwrap();
    let () = conn.hdel(&item_keys.pending, &sn).await.unwrap();
    let () = conn.zrem(&item_keys.outbox, &sn).await.unwrap();
    let () = conn.rpush(&item_keys.tokens, 1_000).await.unwrap();

    let _scheduler = env.server(&[Role::Scheduler]).await;
    eventually(Duration::from_secs(15), "the unit given again", || async {
        if env.remaining(1).await == 0 {
            Ok(())
        } else {
            Err("a unit listed".to_owned())
        }
    })
    .await;
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    let mut holders = live_buyers(&env, 1).await;
    holders.sort_unstable();
    let mut want = expected[..5].to_vec();
    want.sort_unstable();
    assert_eq!(
        holders, want,
        "the lost winner (rank 1) is given the unit again, not rank 6"
    );
    let (_, theirs) = env
        .get(&server, "/api/items/1/my-entry", Some(lost.get()))
        .await;
    assert_eq!(theirs["status"], "won", "{theirs}");
    env.assert_invariants(&server, 1, 5, &[]).await;
}

/// No unit passes on after `end_at` (by Redis's clock): a winner who cancels once the sale
/// ended leaves the unit on the list, and the next entry by rank stays `not_drawn` —
/// however long after its last read of the item the draw pass looks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_unit_passes_on_after_the_end() {
    let env = TestEnv::new("draws_end").await;
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    let now = Utc::now();
    let draw_at = now + chrono::Duration::seconds(3);
    let end_at = now + chrono::Duration::seconds(8);
    env.item(1, 3)
        .window(now - chrono::Duration::seconds(5), end_at)
        .draw(draw_at)
        .on_sale(&server)
        .await;
    let seed = seed_of(&env, 1).await;
    enter_directly(&env, 1, 1, &seed, 1..21).await;
    until(draw_at).await;
    drawn(&env, &server, 1, Duration::from_secs(30)).await;
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    let expected = lowest(&seed, 1..21, 4);

    until(end_at).await;
    let (_, mine) = env
        .get(&server, "/api/items/1/my-entry", Some(expected[0]))
        .await;
    let sn = mine["order_sn"].as_str().unwrap().to_owned();
    let (status, body) = env
        .post_as(&server, &format!("/api/orders/{sn}/cancel"), expected[0])
        .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_, next) = env
        .get(&server, "/api/items/1/my-entry", Some(expected[3]))
        .await;
    assert_eq!(
        next["status"], "not_drawn",
        "a unit passed on after end_at: {next}"
    );
    assert_eq!(env.remaining(1).await, 1);
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    assert_eq!(live_buyers(&env, 1).await.len(), 2);
    env.assert_invariants(&server, 1, 3, &[]).await;
}

/// A draw takes `draw_at` = `end_at` when not given one (the contract's default), and is
/// drawn then, after the sale's end: a `PUT` without `draw_at`, and one with it at
/// `end_at`, are taken; ten entrants through the API, three units; once the end has passed
/// the three lowest ranks win, `my-entry` shows each `won` with its order, the orders reach
/// MySQL, and `drawn_at` is recorded after `end_at`. A winner's cancel after the end does
/// not pass the unit on, not even in a round run on a record of the item read before the
/// draw (another scheduler's): the fourth rank stays `not_drawn`, the unit unsold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draw_at_the_end_is_drawn_then() {
    let env = TestEnv::new("draws_at_end").await;
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    let now = Utc::now();
    let end_at = now + chrono::Duration::seconds(4);
    let spec = env
        .item(1, 3)
        .window(now - chrono::Duration::seconds(5), end_at)
        .draw(end_at);
    let mut without = spec.body();
    without.as_object_mut().unwrap().remove("draw_at");
    let (status, answer) = put_item(&env, &server, 1, &without).await;
    assert_eq!(status, 201, "a draw without draw_at: {answer}");
    assert_eq!(
        answer["item"]["draw_at"]
            .as_str()
            .map(|at| at.parse::<DateTime<Utc>>().unwrap()),
        Some(to_millis(end_at)),
        "draw_at defaults to end_at: {answer}"
    );
    let (status, answer) = put_item(&env, &server, 1, &spec.body()).await;
    assert_eq!(status, 200, "a draw with draw_at at end_at: {answer}");
    env.warmup(&server, 1).await;

    for user in 1..=10 {
        let (status, body) = env.buy(&server, user, 1).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (202, Some("entered")),
            "{body}"
        );
    }
    assert!(Utc::now() < end_at, "entering took past end_at");
    // The item as a draw pass read it before the draw: a scheduler whose record is that old.
    let id = ItemId::new(1).unwrap();
    let stale = seckill::testing::items::get(&env.db, id)
        .await
        .unwrap()
        .unwrap();
    until(end_at).await;
    let shown = drawn(&env, &server, 1, Duration::from_secs(30)).await;
    let (drawn_at,): (DateTime<Utc>,) = sqlx::query_as("SELECT drawn_at FROM items WHERE id = 1")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert!(
        drawn_at >= to_millis(end_at),
        "drawn at {drawn_at}, before the end"
    );
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;

    let seed = seed_of(&env, 1).await;
    let expected = lowest(&seed, 1..11, 4);
    assert_eq!(
        shown["draw_cutoff"].as_u64(),
        Some(rank(&seed, UserId::new(expected[2])).unwrap()),
        "the cut-off is the third lowest rank: {shown}"
    );
    let orders = env.orders(1).await;
    let mut won = Vec::new();
    for &winner in &expected[..3] {
        let (_, mine) = env
            .get(&server, "/api/items/1/my-entry", Some(winner))
            .await;
        assert_eq!(mine["status"], "won", "{mine}");
        let sn = mine["order_sn"].as_str().unwrap().to_owned();
        assert!(
            orders
                .iter()
                .any(|(o, user, status)| *o == sn && *user == winner && status == "unpaid"),
            "the order {sn} of {winner} is not in MySQL: {orders:?}"
        );
        won.push(sn);
    }
    assert_eq!(orders.len(), 3, "{orders:?}");
    let (_, theirs) = env
        .get(&server, "/api/items/1/my-entry", Some(expected[3]))
        .await;
    assert_eq!(theirs["status"], "not_drawn", "{theirs}");

    // A winner cancels after the end: the unit stays unsold.
    let (status, body) = env
        .post_as(
            &server,
            &format!("/api/orders/{}/cancel", won[0]),
            expected[0],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Nor does a round on the record a draw pass read before the draw (another scheduler's).
    let redis = seckill::testing::RedisConns::new(env.settings.redis_url.expose()).unwrap();
    let round = seckill::testing::draw::draw(&redis, &env.keys(), &stale)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        round.given, 0,
        "a round on a record older than the first round gave after end_at"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_, next) = env
        .get(&server, "/api/items/1/my-entry", Some(expected[3]))
        .await;
    assert_eq!(
        next["status"], "not_drawn",
        "a unit passed on after end_at: {next}"
    );
    assert_eq!(env.remaining(1).await, 1);
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    assert_eq!(live_buyers(&env, 1).await.len(), 2);
    env.assert_invariants_cancelling(&server, 1, 3, &[], &won[..1])
        .await;
}
