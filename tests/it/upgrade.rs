//! A rolling upgrade mid-sale: servers of a previous key layout and of this one selling
//! the same item side by side, as during a deploy (docs/operations.md, "Upgrading
//! mid-sale").
//!
//! Each previous layout is kept as its purchase script (`tests/it/previous/<what it wrote>/`,
//! as that release composed it). An old API instance is played by this test running the old
//! `grab.lua` against the live keys and leaving its orders in the outbox — as one that won
//! and was then stopped by the deploy before publishing: the new scheduler's relay must
//! send them. Both previous releases are proven, so a deploy that skips one is covered too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::Script;
use seckill::domain::{BUYER_SHARDS, BucketId, ItemId, OrderPlaced, OrderSn, UserId};

use crate::support::*;

/// A previous release whose servers may still sell during a deploy, named after what it
/// wrote that this one does not.
#[derive(Clone, Copy)]
enum Previous {
    /// Up to 2026-12-02: every buyer also went into a sorted set `buyers`, and each sale
    /// was counted in the meta's `sold`.
    BuyersSet,
    /// Up to commit 5c24ba2 (2026-12-03): each sale was still counted in the meta's `sold`.
    SoldCounter,
}

impl Previous {
    /// Its purchase, composed as its server composed it (`lib/waves.lua` was the same in
    /// both).
    fn grab(self) -> Script {
        Script::new(match self {
            Previous::BuyersSet => concat!(
                include_str!("previous/waves.lua"),
                include_str!("previous/buyers-set/places.lua"),
                include_str!("previous/buyers-set/grab.lua")
            ),
            Previous::SoldCounter => concat!(
                include_str!("previous/waves.lua"),
                include_str!("previous/sold-counter/places.lua"),
                include_str!("previous/sold-counter/grab.lua")
            ),
        })
    }
}

/// What a server of the previous layout answered: `won` with the new order's number,
/// `duplicate` with the one the buyer holds, or another outcome.
struct OldAnswer {
    outcome: String,
    order_sn: String,
}

/// A purchase by a server of a previous layout: its keys, its arguments, its script.
async fn old_server_buys(
    env: &TestEnv,
    previous: Previous,
    script: &Script,
    item: u64,
    user: u64,
) -> OldAnswer {
    let keys = env.item_keys(item);
    let user = UserId::new(user);
    let item_id = ItemId::new(item).unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    let order = OrderPlaced {
        order_sn: OrderSn::generate(BucketId::whole(item_id), false),
        item_id,
        user_id: user,
        created_at_ms: now,
        pay_deadline_ms: now + 1_800_000,
        slot: 0,
    };
    let mut call = script.prepare_invoke();
    call.key(&keys.meta).key(&keys.tokens);
    if let Previous::BuyersSet = previous {
        let shard = user.shard(BUYER_SHARDS);
        call.key(format!(
            "{}:{{item:{item}}}:v1:buyers:{shard}",
            env.keys().namespace()
        ));
    }
    call.key(keys.buyer_orders(user))
        .key(&keys.pending)
        .key(&keys.outbox)
        .arg(user.get())
        .arg(order.order_sn.as_str())
        .arg(serde_json::to_string(&order).unwrap())
        .arg("");
    if let Previous::SoldCounter = previous {
        // `per_user` as its catalogue had it.
        call.arg(1);
    }
    let (outcome, detail): (String, String) =
        call.invoke_async(&mut env.redis.clone()).await.unwrap();
    let order_sn = match outcome.as_str() {
        "won" => order.order_sn.to_string(),
        _ => detail,
    };
    OldAnswer { outcome, order_sn }
}

/// 300 units sold by a new server and an old one in turns, over the same buyers: each
/// must see the other's buyer records (a buyer who won on one hears `409 duplicate` with
/// that order on the other), then both at once to the end. Then some of the old server's
/// buyers cancel through the new one and their units sell again. Every unit is sold once,
/// nobody holds two, every win reaches MySQL once — the old server's too, which it left in
/// the outbox and only the new relay sends — and the stock adds up.
#[tokio::test]
async fn a_sale_keeps_selling_through_new_servers_beside_ones_writing_a_buyers_set() {
    keeps_selling_beside(Previous::BuyersSet, "upgrade_buyers").await;
}

/// The same beside servers of the release just before this one.
#[tokio::test]
async fn a_sale_keeps_selling_through_new_servers_beside_ones_counting_sold() {
    keeps_selling_beside(Previous::SoldCounter, "upgrade_sold").await;
}

async fn keeps_selling_beside(previous: Previous, namespace: &str) {
    let env = TestEnv::new(namespace).await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 300).on_sale(&server).await;
    let old = previous.grab();
    let mut won: HashMap<u64, String> = HashMap::new();

    // 1. The old server sells to users 1–100.
    for user in 1..=100 {
        let answer = old_server_buys(&env, previous, &old, 1, user).await;
        assert_eq!(answer.outcome, "won", "old server, user {user}");
        won.insert(user, answer.order_sn);
    }
    // 2. The new server: users 1–100 hold the old server's orders, 101–200 win.
    for user in 1..=200 {
        let (status, json) = env.buy(&server, user, 1).await;
        if user <= 100 {
            assert_eq!(
                (status, json["code"].as_str(), json["order_sn"].as_str()),
                (409, Some("duplicate"), Some(won[&user].as_str())),
                "new server, user {user}"
            );
        } else {
            assert_eq!(status, 202, "new server, user {user}: {json}");
            won.insert(user, json["order_sn"].as_str().unwrap().to_owned());
        }
    }
    // 3. The old server again: users 101–200 hold the new server's orders, 201–250 win.
    for user in 101..=250 {
        let answer = old_server_buys(&env, previous, &old, 1, user).await;
        if user <= 200 {
            assert_eq!(
                (answer.outcome.as_str(), answer.order_sn.as_str()),
                ("duplicate", won[&user].as_str()),
                "old server, user {user}"
            );
        } else {
            assert_eq!(answer.outcome, "won", "old server, user {user}");
            won.insert(user, answer.order_sn);
        }
    }
    // 4. Both at once over users 251–400 (in opposite orders, so they meet): the last 50
    // units, each once, nobody twice.
    let new_side = async {
        let mut wins = Vec::new();
        for user in 251..=400u64 {
            let (status, json) = env.buy(&server, user, 1).await;
            match status {
                202 => wins.push((user, json["order_sn"].as_str().unwrap().to_owned())),
                409 | 410 => {}
                other => panic!("new server, user {user}: {other} {json}"),
            }
        }
        wins
    };
    let old_side = async {
        let mut wins = Vec::new();
        for user in (251..=400u64).rev() {
            let answer = old_server_buys(&env, previous, &old, 1, user).await;
            if answer.outcome == "won" {
                wins.push((user, answer.order_sn));
            }
        }
        wins
    };
    let (new_wins, old_wins) = tokio::join!(new_side, old_side);
    assert_eq!(
        new_wins.len() + old_wins.len(),
        50,
        "the last 50 units, each once"
    );
    for (user, sn) in new_wins.into_iter().chain(old_wins) {
        assert!(won.insert(user, sn).is_none(), "user {user} won twice");
    }

    // 5. Buyers of the old server cancel through the new one: the place the old script
    // recorded is freed, and the unit comes back and sells again to a newcomer.
    env.wait_for_orders(&server, 1, 300, Duration::from_secs(30))
        .await;
    let mut cancelled = Vec::new();
    for user in 1..=10u64 {
        let sn = &won[&user];
        let (status, json) = env
            .post_as(&server, &format!("/api/orders/{sn}/cancel"), user)
            .await;
        assert_eq!(status, 200, "cancel of {sn} by {user}: {json}");
        cancelled.push(sn.clone());
    }
    let mut resold = Vec::new();
    let mut newcomer = 1_000u64;
    let give_up = Instant::now() + Duration::from_secs(15);
    while resold.len() < 10 {
        assert!(
            Instant::now() < give_up,
            "{} of 10 cancelled units sold again",
            resold.len()
        );
        let (status, json) = env.buy(&server, newcomer, 1).await;
        match status {
            202 => {
                resold.push(json["order_sn"].as_str().unwrap().to_owned());
                newcomer += 1;
            }
            // Not back on every instance's shelf yet (within half a second).
            410 => tokio::time::sleep(Duration::from_millis(100)).await,
            other => panic!("newcomer {newcomer}: {other} {json}"),
        }
    }

    let answered: Vec<String> = won.into_values().chain(resold).collect();
    env.wait_for_orders(&server, 1, 310, Duration::from_secs(30))
        .await;
    env.assert_invariants_cancelling(&server, 1, 300, &answered, &cancelled)
        .await;
}

/// What `grab.lua` checks of a bucket's meta is also written packed into one field,
/// `rules` (`lua/lib/rules.lua`), by every writer: a warm-up (the single one and the bulk
/// one's fresh load), a pause and a resume, a `PUT` of a new window or limit, a forced
/// reload's fence and its lifting. A field written alone, as servers of earlier releases
/// write them, is packed by the safety sweep within seconds, also when the packed copy is
/// missing altogether; until then the grab reads a meta with no packed copy field by
/// field. A meta that is gone (a retired bucket) stays gone.
#[tokio::test]
async fn every_write_of_what_the_grab_checks_is_packed() {
    use redis::AsyncCommands;
    let env = TestEnv::new("packed_rules").await;
    let server = env.server(ALL_ROLES).await;
    let start = chrono::Utc::now() - chrono::Duration::seconds(5);
    let end = start + chrono::Duration::hours(2);
    let (start_ms, end_ms) = (start.timestamp_millis(), end.timestamp_millis());
    let meta = env.item_keys(1).meta;
    let mut redis = env.redis.clone();
    let rules = |meta: String| {
        let mut redis = env.redis.clone();
        async move {
            let packed: Option<String> = redis.hget(&meta, "rules").await.unwrap();
            packed.unwrap_or_default()
        }
    };

    env.item(1, 10).window(start, end).on_sale(&server).await;
    assert_eq!(
        rules(meta.clone()).await,
        format!("open {start_ms} {end_ms} 1 ")
    );
    assert_eq!(env.admin_post(&server, "/admin/items/1/pause").await.0, 200);
    assert_eq!(
        rules(meta.clone()).await,
        format!("paused {start_ms} {end_ms} 1 ")
    );
    assert_eq!(
        env.admin_post(&server, "/admin/items/1/resume").await.0,
        200
    );
    let later = end + chrono::Duration::hours(1);
    env.item(1, 10)
        .window(start, later)
        .per_user(3)
        .put(&server)
        .await;
    let later_ms = later.timestamp_millis();
    assert_eq!(
        rules(meta.clone()).await,
        format!("open {start_ms} {later_ms} 3 ")
    );
    // A reload (of a paused item): fenced, then swapped.
    assert_eq!(env.admin_post(&server, "/admin/items/1/pause").await.0, 200);
    let (status, json) = env
        .admin_post(&server, "/admin/items/1/warmup?force=true")
        .await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(
        rules(meta.clone()).await,
        format!("paused {start_ms} {later_ms} 3 ")
    );
    assert_eq!(
        env.admin_post(&server, "/admin/items/1/resume").await.0,
        200
    );

    // The bulk warm-up's fresh load.
    env.item(2, 10).window(start, end).put(&server).await;
    let loaded = env
        .admin(reqwest::Method::POST, &server, "/admin/items/warmup")
        .json(&serde_json::json!({ "ids": [2] }))
        .send()
        .await
        .unwrap();
    assert_eq!(loaded.status(), 200);
    let meta2 = env.item_keys(2).meta;
    assert_eq!(
        rules(meta2.clone()).await,
        format!("open {start_ms} {end_ms} 1 ")
    );

    // Written alone, as an earlier release writes: packed again by the sweep.
    let packed_within = |meta: String, want: String| {
        let rules = &rules;
        async move {
            let give_up = Instant::now() + Duration::from_secs(5);
            loop {
                let now = rules(meta.clone()).await;
                if now == want {
                    return;
                }
                assert!(Instant::now() < give_up, "rules {now:?}, want {want:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    redis
        .hset::<_, _, _, ()>(&meta, "fenced", "an old warm-up")
        .await
        .unwrap();
    packed_within(meta.clone(), format!("reloading {start_ms} {later_ms} 3 ")).await;
    redis.hdel::<_, _, ()>(&meta, "fenced").await.unwrap();
    packed_within(meta.clone(), format!("open {start_ms} {later_ms} 3 ")).await;
    redis.hdel::<_, _, ()>(&meta2, "rules").await.unwrap();
    packed_within(meta2.clone(), format!("open {start_ms} {end_ms} 1 ")).await;

    // A meta as servers before the packed form left it (no `rules`), paused by one of them
    // (in one step: the sweep packs either before or after): the grab reads the fields.
    let (status, json) = env.buy(&server, 7, 1).await;
    assert_eq!(status, 202, "{json}");
    let as_old: (i64, i64) = redis::pipe()
        .atomic()
        .hdel(&meta, "rules")
        .hset(&meta, "paused", "1")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(as_old, (1, 0));
    let (status, json) = env.buy(&server, 8, 1).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("paused")),
        "{json}"
    );
    let _: (i64, i64) = redis::pipe()
        .atomic()
        .hdel(&meta, "rules")
        .hset(&meta, "paused", "0")
        .query_async(&mut redis)
        .await
        .unwrap();
    let (status, json) = env.buy(&server, 8, 1).await;
    assert_eq!(status, 202, "{json}");

    redis.del::<_, ()>(&meta2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let exists: bool = redis.exists(&meta2).await.unwrap();
    assert!(!exists, "the sweep wrote a meta that was gone");
}
