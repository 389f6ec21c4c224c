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
use seckill::domain::{ItemId, Stock, UserId};
use seckill::draw::rank::rank;

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
    let all: Vec<u64> = users.collect();
    for chunk in all.chunks(5_000) {
        let mut pipe = redis::pipe();
        for user in chunk {
            let user = UserId::new(*user);
            let home = Stock::home(id, user, buckets);
            pipe.zadd(keys.entries(home), user.get(), rank(seed, user))
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
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
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draw_gives_its_units_by_rank_and_passes_a_cancelled_one_on() {
    let env = TestEnv::new("draws_rank").await;
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    let draw_at = Utc::now() + chrono::Duration::seconds(6);
    let (status, body) = env
        .item(1, 50)
        .buckets(4)
        .draw(draw_at)
        .try_put(&server)
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(
        body["item"].get("draw_seed").is_none(),
        "the seed stays secret: {body}"
    );
    env.warmup(&server, 1).await;
    let (_, item) = env.get(&server, "/api/items/1", None).await;
    let commitment = item["draw_commitment"].as_str().unwrap().to_owned();
    assert_eq!(commitment.len(), 64, "{item}");
    assert!(item.get("draw_seed").is_none(), "{item}");

    // Entries through the API.
    let answers: Vec<(u16, Value)> = futures::stream::iter(1..=400u64)
        .map(|user| {
            let (env, server) = (&env, &server);
            async move { env.buy(server, user, 1).await }
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
    let (status, again) = env.buy(&server, 7, 1).await;
    assert_eq!(
        (status, again["code"].as_str(), again["entry_id"].as_str()),
        (200, Some("entered"), Some("1:7"))
    );
    let (status, mine) = env.get(&server, "/api/items/1/my-entry", Some(7)).await;
    assert_eq!(
        (status, mine["status"].as_str(), &mine["rank"]),
        (200, Some("entered"), &Value::Null),
        "{mine}"
    );
    assert_eq!(
        env.get(&server, "/api/items/1/my-entry", Some(100_000_000))
            .await
            .0,
        404
    );

    let seed = seed_of(&env, 1).await;
    enter_directly(&env, 1, 4, &seed, 401..100_001).await;
    let stats = env.stats(&server, 1).await;
    assert_eq!(stats["entries"], 100_000, "{stats}");

    until(draw_at).await;
    let (status, late) = env.buy(&server, 200_000, 1).await;
    assert_eq!(
        (status, late["code"].as_str()),
        (403, Some("ended")),
        "{late}"
    );
    let item = drawn(&env, &server, 1, Duration::from_secs(30)).await;
    let published = item["draw_seed"].as_str().unwrap();
    assert_eq!(published, seed);
    assert_eq!(
        hex::encode(Sha256::digest(hex::decode(&seed).unwrap())),
        commitment
    );

    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    let expected = lowest(&seed, 1..100_001, 51);
    let winners: HashSet<u64> = live_buyers(&env, 1).await.into_iter().collect();
    assert_eq!(
        winners,
        expected[..50].iter().copied().collect(),
        "the 50 lowest ranks win"
    );
    assert_eq!(
        item["draw_cutoff"].as_u64(),
        Some(rank(&seed, UserId::new(expected[49])))
    );
    env.assert_invariants(&server, 1, 50, &[]).await;

    // Each entrant learns how they fared.
    let winner = expected[0];
    let (_, mine) = env
        .get(&server, "/api/items/1/my-entry", Some(winner))
        .await;
    assert_eq!(mine["status"], "won", "{mine}");
    assert_eq!(
        mine["rank"].as_u64(),
        Some(rank(&seed, UserId::new(winner)))
    );
    let sn = mine["order_sn"].as_str().unwrap().to_owned();
    let (_, order) = env
        .get(&server, &format!("/api/orders/{sn}"), Some(winner))
        .await;
    assert_eq!(order["status"], "unpaid", "{order}");
    let loser = (1..=400).find(|u| !winners.contains(u)).unwrap();
    let (_, theirs) = env.get(&server, "/api/items/1/my-entry", Some(loser)).await;
    assert_eq!(theirs["status"], "not_drawn", "{theirs}");

    // A winner cancels: the unit passes to the 51st rank.
    let (status, body) = env
        .post_as(&server, &format!("/api/orders/{sn}/cancel"), winner)
        .await;
    assert_eq!(status, 200, "{body}");
    let next = expected[50];
    eventually(Duration::from_secs(15), "the unit passed on", || async {
        let (_, theirs) = env.get(&server, "/api/items/1/my-entry", Some(next)).await;
        if theirs["status"] == "won" {
            Ok(())
        } else {
            Err(theirs.to_string())
        }
    })
    .await;
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    let winners: HashSet<u64> = live_buyers(&env, 1).await.into_iter().collect();
    assert!(winners.contains(&next) && !winners.contains(&winner));
    assert_eq!(winners.len(), 50);
    env.assert_invariants(&server, 1, 50, &[]).await;
    let (_, mine) = env
        .get(&server, "/api/items/1/my-entry", Some(winner))
        .await;
    assert_eq!(
        mine["order_sn"].as_str(),
        Some(sn.as_str()),
        "a winner is given a unit once: {mine}"
    );
}

/// 3,000 units over 2 buckets among 30,000 entries; the scheduler drawing them is killed
/// (SIGKILL) mid-draw and another takes over: every unit is given once, each to one of the
/// 3,000 lowest ranks, nobody twice.
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
        for stock in Stock::all(id, 2) {
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
    drop(second);
}
