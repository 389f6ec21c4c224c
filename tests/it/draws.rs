//! Draws (`"mode": "draw"`): entries through the API until `draw_at`, the winners drawn by
//! rank from a seed committed in advance, a winner's cancelled unit passed to the next
//! entry by rank, and a draw cut off by a scheduler killed mid-way resumed without giving
//! anyone a second unit.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use redis::AsyncCommands;
use serde_json::Value;
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
            .push((rank(seed, user), user.get()));
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
    let mut ranked: Vec<(u64, u64)> = users.map(|u| (rank(seed, UserId::new(u)), u)).collect();
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
        Some(rank(&seed, UserId::new(expected[49])))
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
        Some(rank(&seed, UserId::new(winner)))
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

/// A measurement, by hand (docs/benchmarks.md, "A draw"): a million entries over 16
/// buckets, 1,000 units; how long entering them into Redis took, and the draw from
/// `draw_at` to the seed's publication and to the last order in MySQL.
/// `cargo test --release --test it draws::a_million_entries -- --ignored --nocapture`
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
    eprintln!(
        "1,000,000 entries written in {:.1} s; Redis used_memory +{} MB",
        began.elapsed().as_secs_f64(),
        (memory().await - before) / 1_000_000
    );
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
    eprintln!(
        "draw of 1,000 among 1,000,000: seed published {:.2} s after draw_at, every order in MySQL after {:.2} s",
        drawn_in.as_secs_f64(),
        began.elapsed().as_secs_f64()
    );
    let expected: HashSet<u64> = lowest(&seed, 1..1_000_001, 1_000).into_iter().collect();
    let winners: HashSet<u64> = live_buyers(&env, 1).await.into_iter().collect();
    assert_eq!(winners, expected);
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
