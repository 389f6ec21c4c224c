//! The waiting room (`"queue"` on an item): the pre-queue ordered by a rank anyone can
//! recompute from the published seed, arrivals behind it in Redis's order, admission
//! bounded by the units unsold, passes checked on the purchase path, a unit that comes
//! back going to the next in line, `sold_out` for everyone once nothing can come back.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use seckill::Role;

use crate::history::quiet;
use crate::support::*;

/// The item every test here sells (each in its own namespace).
pub(crate) const ITEM: u64 = 1;

fn queue_path(tail: &str) -> String {
    format!("/api/items/{ITEM}/queue{tail}")
}

/// `POST …/queue` as `user`, with a body when given.
pub(crate) async fn join(
    env: &TestEnv,
    server: &TestServer,
    user: u64,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = env
        .http
        .post(server.url(&queue_path("")))
        .bearer_auth(env.token(user));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// `GET …/queue/me` as `user`.
/// (A buyer may ask five times a second: polled faster, it waits its turn on `429`.)
pub(crate) async fn me(env: &TestEnv, server: &TestServer, user: u64) -> Value {
    loop {
        let (status, json) = env.get(server, &queue_path("/me"), Some(user)).await;
        if status == 429 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        assert_eq!(status, 200, "{json}");
        return json;
    }
}

/// `POST /api/flashbuy` as `user` with `pass` (none: no header).
pub(crate) async fn buy_with(
    env: &TestEnv,
    server: &TestServer,
    user: u64,
    pass: Option<&str>,
) -> (u16, Value) {
    let mut request = env.purchase(server, user, ITEM);
    if let Some(pass) = pass {
        request = request.header("x-queue-pass", pass);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The operators' figures of the queue.
pub(crate) async fn figures(env: &TestEnv, server: &TestServer) -> Value {
    let (status, json) = env
        .admin_get(server, &format!("/admin/items/{ITEM}/queue"))
        .await;
    assert_eq!(status, 200, "{json}");
    json
}

/// A pre-queue rank as a buyer checks it from the published seed: the first six bytes of
/// HMAC-SHA256(seed bytes, user id in decimal). Computed here, not by the server's code.
pub(crate) fn rank(seed_hex: &str, user: u64) -> u64 {
    let seed = hex::decode(seed_hex).unwrap();
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&seed).unwrap();
    mac.update(user.to_string().as_bytes());
    let digest = mac.finalize().into_bytes();
    digest[..6]
        .iter()
        .fold(0, |rank, b| (rank << 8) | u64::from(*b))
}

/// Whether SHA-256(`<challenge>:<nonce>`) begins with `bits` zero bits (the contract's
/// proof-of-work, computed here, not by the server's code).
pub(crate) fn solves(challenge: &str, nonce: &str, bits: u32) -> bool {
    let digest = Sha256::digest(format!("{challenge}:{nonce}").as_bytes());
    let zeros: u32 = digest
        .iter()
        .scan(true, |all_zero_so_far, byte| {
            let counted = all_zero_so_far.then_some(byte.leading_zeros());
            *all_zero_so_far = *byte == 0;
            counted
        })
        .sum();
    zeros >= bits
}

/// Those `me` says are admitted, with their passes.
pub(crate) async fn admitted(
    env: &TestEnv,
    server: &TestServer,
    users: impl Iterator<Item = u64>,
) -> BTreeMap<u64, String> {
    let mut passes = BTreeMap::new();
    for user in users {
        let seen = me(env, server, user).await;
        if seen["state"] == "admitted" {
            passes.insert(user, seen["pass"].as_str().unwrap().to_owned());
        }
    }
    passes
}

/// The whole life of a queued sale of 5 units: 20 buyers in the pre-queue, 5 arrivals
/// after the start; exactly the 5 lowest ranks let in, and no more while they hold the
/// units; the pass bought with, refused without; a cancelled unit to the next by rank;
/// everybody still waiting told `sold_out` once all five are paid.
#[tokio::test]
async fn a_queued_sale_lets_in_by_rank_as_far_as_the_stock_goes() {
    let env = &TestEnv::new("waitroom").await;
    let server = env
        .server(&[Role::Api, Role::Consumer, Role::Scheduler])
        .await;
    let start = Utc::now() + chrono::Duration::seconds(4);
    env.item(ITEM, 5)
        .window(start, start + chrono::Duration::hours(1))
        .queued(json!({ "admit_per_s": 1000, "opens_before_s": 600 }))
        .on_sale(&server)
        .await;

    // Before the start: a commitment, no seed; places by rank so far; the same place again.
    let (_, item) = env.get(&server, &format!("/api/items/{ITEM}"), None).await;
    let commitment = item["queue_commitment"].as_str().unwrap().to_owned();
    assert!(item.get("queue_seed").is_none(), "{item}");
    for user in 1..=20 {
        if user == 11 {
            // The scheduler steps the line meanwhile (every 200 ms): the pre-queue stays
            // open until someone is let in.
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        let (status, joined) = join(env, &server, user, None).await;
        assert_eq!(
            (status, &joined["state"]),
            (200, &json!("waiting")),
            "{joined}"
        );
    }
    let (status, again) = join(env, &server, 7, None).await;
    assert_eq!((status, &again["again"]), (200, &json!(true)), "{again}");
    let (status, refused) = buy_with(env, &server, 3, None).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (403, Some("queue_required")),
        "{refused}"
    );

    // From the start: the seed, which the commitment named; arrivals behind everyone.
    tokio::time::sleep_until(
        tokio::time::Instant::now() + (start - Utc::now()).to_std().unwrap_or_default(),
    )
    .await;
    for user in 21..=25 {
        let (status, joined) = join(env, &server, user, None).await;
        assert_eq!(status, 200, "{joined}");
    }
    let (_, item) = env.get(&server, &format!("/api/items/{ITEM}"), None).await;
    let seed = item["queue_seed"].as_str().unwrap().to_owned();
    assert_eq!(
        hex::encode(Sha256::digest(hex::decode(&seed).unwrap())),
        commitment
    );
    let mut by_rank: Vec<u64> = (1..=20).collect();
    by_rank.sort_by_key(|user| (rank(&seed, *user), *user));
    let order: Vec<u64> = by_rank.iter().copied().chain(21..=25).collect();

    // Exactly the five lowest ranks are let in, and nobody more while they hold the units.
    eventually(Duration::from_secs(10), "five let in", || async {
        let figures = figures(env, &server).await;
        match figures["admitted"].as_u64() {
            Some(5) => Ok(()),
            _ => Err(figures.to_string()),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let passes = admitted(env, &server, 1..=25).await;
    let first: HashSet<u64> = order[..5].iter().copied().collect();
    assert_eq!(passes.keys().copied().collect::<HashSet<_>>(), first);
    let waiting = me(env, &server, order[5]).await;
    assert_eq!(
        (waiting["state"].as_str(), waiting["position"].as_u64()),
        (Some("waiting"), Some(1)),
        "{waiting}"
    );
    let last = me(env, &server, 25).await;
    assert_eq!(last["position"].as_u64(), Some(20), "{last}");

    // A pass buys for its holder alone, and once (per_user 1).
    let (holder, pass) = passes.iter().next().map(|(u, p)| (*u, p.clone())).unwrap();
    let (status, refused) = buy_with(env, &server, order[5], Some(&pass)).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (403, Some("pass_invalid")),
        "{refused}"
    );
    let (status, refused) = buy_with(env, &server, holder, Some("1.2.3.00")).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (403, Some("pass_invalid")),
        "{refused}"
    );
    let mut won = BTreeMap::new();
    for (user, pass) in &passes {
        let (status, bought) = buy_with(env, &server, *user, Some(pass)).await;
        assert_eq!(status, 202, "{bought}");
        won.insert(*user, bought["order_sn"].as_str().unwrap().to_owned());
    }
    // Spent: its one unit bought (with a key that won, the win's `202` again).
    let (status, again) = buy_with(env, &server, holder, Some(&pass)).await;
    assert_eq!(
        (status, again["code"].as_str()),
        (403, Some("pass_used")),
        "{again}"
    );
    env.wait_for_orders(&server, ITEM, 5, Duration::from_secs(20))
        .await;
    eventually(Duration::from_secs(5), "the passes done", || async {
        let seen = me(env, &server, holder).await;
        match seen["state"].as_str() {
            Some("done") => Ok(()),
            _ => Err(seen.to_string()),
        }
    })
    .await;
    // Every unit in an unpaid order: those waiting learn when it will be known.
    let held = eventually(Duration::from_secs(5), "units held until", || async {
        let seen = me(env, &server, order[5]).await;
        seen["units_held_until"]
            .as_str()
            .map(str::to_owned)
            .ok_or(seen.to_string())
    })
    .await;
    assert!(
        held.parse::<DateTime<Utc>>().unwrap() > Utc::now() + chrono::Duration::seconds(1700),
        "{held}"
    );
    assert_eq!(figures(env, &server).await["admitted"], 5);

    // A cancel gives a unit back: the next by rank gets it, not the fastest presser.
    let (cancelled_user, cancelled_sn) = won.iter().next().map(|(u, s)| (*u, s.clone())).unwrap();
    let (status, body) = env
        .post_as(
            &server,
            &format!("/api/orders/{cancelled_sn}/cancel"),
            cancelled_user,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, refused) = buy_with(env, &server, 25, None).await;
    assert_eq!(status, 403, "{refused}");
    let sixth = eventually(Duration::from_secs(5), "the sixth let in", || async {
        let seen = me(env, &server, order[5]).await;
        match seen["pass"].as_str() {
            Some(pass) => Ok(pass.to_owned()),
            None => Err(seen.to_string()),
        }
    })
    .await;
    assert_eq!(me(env, &server, order[6]).await["state"], "waiting");
    // The cancelling buyer's pass bought what it allows: the unit back is not theirs to
    // take again (`410` until this instance's catalogue sees it back on sale).
    let cancelled_pass = &passes[&cancelled_user];
    eventually(Duration::from_secs(5), "the spent pass refused", || async {
        match buy_with(env, &server, cancelled_user, Some(cancelled_pass)).await {
            (403, refused) if refused["code"] == "pass_used" => Ok(()),
            (410, _) => Err("sold out, as this instance saw it".to_owned()),
            (status, body) => panic!("a spent pass answered {status} {body}"),
        }
    })
    .await;
    let (status, bought) = buy_with(env, &server, order[5], Some(&sixth)).await;
    assert_eq!(status, 202, "{bought}");
    won.remove(&cancelled_user);
    won.insert(order[5], bought["order_sn"].as_str().unwrap().to_owned());
    env.wait_for_orders(&server, ITEM, 6, Duration::from_secs(20))
        .await;

    // All five paid: nothing can come back, and everyone waiting hears so within 2 s.
    for sn in won.values() {
        let (status, paid) = env.pay(&server, sn).await;
        assert_eq!(status, 200, "{paid}");
    }
    let paid_at = std::time::Instant::now();
    eventually(Duration::from_secs(3), "sold out for all", || async {
        for user in &order[6..] {
            let seen = me(env, &server, *user).await;
            if seen["state"] != "sold_out" {
                return Err(format!("user {user}: {seen}"));
            }
        }
        Ok(())
    })
    .await;
    assert!(
        paid_at.elapsed() < Duration::from_secs(3),
        "{:?}",
        paid_at.elapsed()
    );
    let report = figures(env, &server).await;
    assert_eq!(
        (
            report["admitted"].as_u64(),
            report["bought"].as_u64(),
            report["sold_out"].as_bool()
        ),
        (Some(6), Some(6), Some(true)),
        "{report}"
    );
    let all: Vec<String> = won.into_values().chain([cancelled_sn]).collect();
    env.assert_invariants(&server, ITEM, 5, &all).await;
    server.stop().await;
}

/// Settings are checked field by field; once buyers wait, the queue and `start_at` stay.
#[tokio::test]
async fn queue_settings_are_named_when_wrong_and_fixed_once_buyers_wait() {
    let env = &TestEnv::new("waitset").await;
    let server = env.server(&[Role::Api]).await;
    for (queue, field) in [
        (json!({ "admit_per_s": 0 }), "admit_per_s"),
        (json!({ "admit_per_s": 10, "pass_ttl_s": 5 }), "pass_ttl_s"),
        (json!({ "admit_per_s": 10, "pow_bits": 40 }), "pow_bits"),
        (
            json!({ "admit_per_s": 10, "opens_before_s": 100000 }),
            "opens_before_s",
        ),
    ] {
        let (status, json) = env.item(ITEM, 5).queued(queue).try_put(&server).await;
        assert_eq!(status, 400, "{json}");
        assert!(json["detail"].as_str().unwrap().contains(field), "{json}");
    }
    let start = Utc::now() + chrono::Duration::minutes(10);
    let window = (start, start + chrono::Duration::hours(1));
    let queued = json!({ "admit_per_s": 10, "opens_before_s": 3600 });
    env.item(ITEM, 5)
        .window(window.0, window.1)
        .queued(queued.clone())
        .put(&server)
        .await;
    // Nobody waits yet: it may still move.
    let moved = (start + chrono::Duration::seconds(1), window.1);
    env.item(ITEM, 5)
        .window(moved.0, moved.1)
        .queued(queued.clone())
        .put(&server)
        .await;
    let (status, joined) = join(env, &server, 9, None).await;
    assert_eq!(status, 200, "{joined}");
    for (spec, field) in [
        (env.item(ITEM, 5).window(moved.0, moved.1), "queue"),
        (
            env.item(ITEM, 5)
                .window(window.0, window.1)
                .queued(queued.clone()),
            "start_at",
        ),
    ] {
        let (status, json) = spec.try_put(&server).await;
        assert_eq!(
            (status, json["code"].as_str()),
            (409, Some("queue_fixed")),
            "{json}"
        );
        assert!(json["detail"].as_str().unwrap().contains(field), "{json}");
    }
    // The rate may change while they wait.
    let faster = json!({ "admit_per_s": 50, "opens_before_s": 3600 });
    let (status, json) = env
        .item(ITEM, 5)
        .window(moved.0, moved.1)
        .queued(faster)
        .try_put(&server)
        .await;
    assert_eq!(status, 200, "{json}");
    server.stop().await;
}

/// Before the pre-queue opens: `403 queue_not_open`; an item without a queue has none.
#[tokio::test]
async fn a_queue_opens_at_its_time_and_only_where_there_is_one() {
    let env = &TestEnv::new("waitopen").await;
    let server = env.server(&[Role::Api]).await;
    let start = Utc::now() + chrono::Duration::minutes(30);
    env.item(ITEM, 5)
        .window(start, start + chrono::Duration::hours(1))
        .queued(json!({ "admit_per_s": 10, "opens_before_s": 60 }))
        .put(&server)
        .await;
    let (status, json) = join(env, &server, 1, None).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (403, Some("queue_not_open")),
        "{json}"
    );
    let (status, json) = env.get(&server, &queue_path("/me"), Some(1)).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (404, Some("not_in_queue")),
        "{json}"
    );
    env.item(2, 5).put(&server).await;
    let (status, json) = env.get(&server, "/api/items/2/queue/me", Some(1)).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (404, Some("queue_not_found")),
        "{json}"
    );
    server.stop().await;
}

/// With `pow_bits`, a join costs a solved challenge bound to the user and the item.
#[tokio::test]
async fn a_join_may_cost_a_proof_of_work() {
    let env = &TestEnv::new("waitpow").await;
    let server = env.server(&[Role::Api]).await;
    env.item(ITEM, 5)
        .queued(json!({ "admit_per_s": 10, "pow_bits": 12 }))
        .on_sale(&server)
        .await;
    let (status, json) = join(env, &server, 1, None).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (403, Some("pow_failed")),
        "{json}"
    );
    let (status, given) = env.get(&server, &queue_path("/challenge"), Some(1)).await;
    assert_eq!(
        (status, given["pow_bits"].as_u64()),
        (200, Some(12)),
        "{given}"
    );
    let challenge = given["challenge"].as_str().unwrap();
    let solves = |nonce: &str| solves(challenge, nonce, 12);
    let nonce = (0u64..).map(|n| n.to_string()).find(|n| solves(n)).unwrap();
    let unsolved = (0u64..)
        .map(|n| n.to_string())
        .find(|n| !solves(n))
        .unwrap();
    let (status, json) = join(
        env,
        &server,
        1,
        Some(json!({ "challenge": challenge, "nonce": unsolved })),
    )
    .await;
    assert_eq!(
        (status, json["code"].as_str()),
        (403, Some("pow_failed")),
        "{json}"
    );
    // Another user's solution is not this user's.
    let (status, json) = join(
        env,
        &server,
        2,
        Some(json!({ "challenge": challenge, "nonce": nonce })),
    )
    .await;
    assert_eq!(
        (status, json["code"].as_str()),
        (403, Some("pow_failed")),
        "{json}"
    );
    let (status, json) = join(
        env,
        &server,
        1,
        Some(json!({ "challenge": challenge, "nonce": nonce })),
    )
    .await;
    assert_eq!(
        (status, json["state"].as_str()),
        (200, Some("waiting")),
        "{json}"
    );
    server.stop().await;
}

/// Two schedulers step one queue of 300 at 100 a second: everyone let in once, in the
/// line's order, and never more passes than units.
#[tokio::test]
async fn two_schedulers_let_each_buyer_in_once_in_order() {
    let env = &TestEnv::new("waittwo").await;
    let api = line_of_300_for_120(env).await;
    let one = env.server(&[Role::Scheduler]).await;
    let two = env.server(&[Role::Scheduler]).await;
    let_in_once_by_rank(env, &api).await;
    two.stop().await;
    one.stop().await;
    api.stop().await;
}

/// Scheduler processes SIGKILLed one after another while they let a line of 300 in at 100
/// a second, each as soon as it has let some in (its step is one script: a kill falls
/// between steps or loses one whole): the next scheduler goes on where the last stopped,
/// and still everyone is let in once, in the line's order, never beyond the units.
#[tokio::test]
async fn schedulers_killed_mid_admission_let_each_buyer_in_once_in_order() {
    let env = &TestEnv::new("waitkill").await;
    let api = line_of_300_for_120(env).await;
    let mut kills = 0;
    for until in [25, 60, 95] {
        let (mut child, _, _, reader) = serve(seckill(env).args(["serve", "--roles", "scheduler"]));
        eventually(Duration::from_secs(15), "some let in", || async {
            let admitted = figures(env, &api).await["admitted"].as_u64().unwrap_or(0);
            if admitted >= until {
                Ok(())
            } else {
                Err(format!("{admitted} let in"))
            }
        })
        .await;
        kill_hard(&mut child);
        let _ = reader.join();
        kills += 1;
    }
    let mid = figures(env, &api).await;
    assert!(
        mid["admitted"].as_u64() < Some(120),
        "the kills fell mid-admission: {mid} after {kills}"
    );
    let (last, _, _, reader) = serve(seckill(env).args(["serve", "--roles", "scheduler"]));
    let_in_once_by_rank(env, &api).await;
    stop_process(last, reader);
    api.stop().await;
}

/// An API and consumer instance, and a queued sale of 120 units starting in 3 s at 100 a
/// second, with users 1 to 300 in its pre-queue.
async fn line_of_300_for_120(env: &TestEnv) -> TestServer {
    let api = env.server(&[Role::Api, Role::Consumer]).await;
    let start = Utc::now() + chrono::Duration::seconds(3);
    env.item(ITEM, 120)
        .window(start, start + chrono::Duration::hours(1))
        .queued(json!({ "admit_per_s": 100 }))
        .on_sale(&api)
        .await;
    let api_ref = &api;
    futures::future::join_all((1..=300).map(|user| async move {
        let (status, json) = join(env, api_ref, user, None).await;
        assert_eq!(status, 200, "{json}");
    }))
    .await;
    api
}

/// The line of [`line_of_300_for_120`] once its schedulers are done: exactly the 120
/// lowest ranks by the published seed let in, each once (a pass each, 120 outstanding,
/// holding 120 units, and no more let in after), the next by rank first in line.
async fn let_in_once_by_rank(env: &TestEnv, api: &TestServer) {
    let report = eventually(Duration::from_secs(15), "120 let in", || async {
        let report = figures(env, api).await;
        match report["admitted"].as_u64() {
            Some(120) => Ok(report),
            _ => Err(report.to_string()),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after = figures(env, api).await;
    assert_eq!(
        (
            after["admitted"].as_u64(),
            after["passes_outstanding"].as_u64(),
            after["reserved_units"].as_u64()
        ),
        (Some(120), Some(120), Some(120)),
        "no pass beyond the stock: {report} then {after}"
    );
    let (_, item) = env.get(api, &format!("/api/items/{ITEM}"), None).await;
    let seed = item["queue_seed"].as_str().unwrap();
    let mut order: Vec<u64> = (1..=300).collect();
    order.sort_by_key(|user| (rank(seed, *user), *user));
    let passes = admitted(env, api, 1..=300).await;
    assert_eq!(
        passes.keys().copied().collect::<HashSet<_>>(),
        order[..120].iter().copied().collect::<HashSet<_>>()
    );
    let next = me(env, api, order[120]).await;
    assert_eq!(next["position"].as_u64(), Some(1), "{next}");
}

/// Nobody is let in while no pass could buy: with the item's breaker at level 2, then the
/// global one, then its shop closed by an operator, the line stands still for 1.5 s each
/// time (at 4 a second it would have moved six places); once each is lifted it moves on.
/// (Before, admission went on, and the passes of those let in ran out unable to buy.)
#[tokio::test]
async fn nobody_is_let_in_while_a_breaker_or_the_shop_refuses_purchases() {
    let env = &TestEnv::new("waithold").await;
    let server = env.server(ALL_ROLES).await;
    env.item(ITEM, 40)
        .queued(json!({ "admit_per_s": 4 }))
        .on_sale(&server)
        .await;
    for user in 1..=40 {
        let (status, json) = join(env, &server, user, None).await;
        assert_eq!(status, 200, "{json}");
    }
    let srv = &server;
    let let_in = || async move { figures(env, srv).await["admitted"].as_u64().unwrap_or(0) };
    let moves_past = |from: u64| async move {
        eventually(Duration::from_secs(5), "the line moving", || async {
            let now = let_in().await;
            if now > from {
                Ok(now)
            } else {
                Err(format!("{now} let in"))
            }
        })
        .await
    };
    let circuit = |action: &'static str, query: &'static str| async move {
        let (status, json) = env
            .admin_post(srv, &format!("/admin/circuit/{action}?{query}"))
            .await;
        assert_eq!(status, 200, "{json}");
    };
    let shop = |body: Value| async move {
        let response = env
            .admin(reqwest::Method::PUT, srv, "/admin/shops/1/status")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    };
    let stands_still = |what: &'static str| async move {
        // The step under way when the hold came may still let one in.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = let_in().await;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(let_in().await, held, "let in while {what}");
        held
    };
    let mut at = moves_past(0).await;
    circuit("open", "item=1&level=2&reason=a+test").await;
    at = stands_still("the item's breaker refused purchases")
        .await
        .max(at);
    circuit("close", "item=1").await;
    at = moves_past(at).await;
    circuit("open", "level=3&reason=a+test").await;
    at = stands_still("the global breaker refused purchases")
        .await
        .max(at);
    circuit("close", "").await;
    at = moves_past(at).await;
    shop(json!({"open": false, "reason": "a test"})).await;
    at = stands_still("the shop was closed").await.max(at);
    shop(json!({"open": null})).await;
    moves_past(at).await;
    // A breaker at level 1 lets purchases trickle through: the line moves.
    circuit("open", "item=1&level=1&reason=a+test").await;
    let throttled = let_in().await;
    moves_past(throttled).await;
    server.stop().await;
}

/// A reload may not leave fewer units than the live passes reserve: with 5 passes out on
/// 10 units, a lower `total` of 4 applied by a forced warm-up is refused (`409 over_held`
/// naming the passes' 5), 6 is loaded; the 5 then buy with their passes. (Before, the
/// reload loaded 4 units under 5 passes: one pass could not buy.) The line, held while the
/// reload counts the passes, goes on after it: a sixth buyer is let in to the sixth unit.
#[tokio::test]
async fn a_reload_leaves_the_units_the_live_passes_reserve() {
    let env = &TestEnv::new("waitreload").await;
    let server = env.server(ALL_ROLES).await;
    let start = Utc::now() - chrono::Duration::seconds(1);
    let end = start + chrono::Duration::hours(1);
    let item = |total| {
        env.item(ITEM, total)
            .window(start, end)
            .queued(json!({ "admit_per_s": 1000 }))
    };
    item(10).on_sale(&server).await;
    for user in 1..=5 {
        join(env, &server, user, None).await;
    }
    let passes = eventually(Duration::from_secs(10), "5 let in", || async {
        let passes = admitted(env, &server, 1..=5).await;
        match passes.len() {
            5 => Ok(passes),
            n => Err(format!("{n} let in")),
        }
    })
    .await;
    assert_eq!(env.admin_post(&server, "/admin/items/1/pause").await.0, 200);
    item(4).put(&server).await;
    let (status, body) = env
        .admin_post(&server, "/admin/items/1/warmup?force=true")
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("over_held")),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("at least 5") && detail.contains("5 reserved by the waiting room"),
        "{detail}"
    );
    item(6).put(&server).await;
    let (status, body) = env
        .admin_post(&server, "/admin/items/1/warmup?force=true")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        env.admin_post(&server, "/admin/items/1/resume").await.0,
        200
    );
    // The reload held the line while it counted the passes, and let it go: a newcomer is
    // let in to the sixth unit at once (the hold would last two minutes otherwise).
    join(env, &server, 6, None).await;
    eventually(Duration::from_secs(10), "the sixth let in", || async {
        match me(env, &server, 6).await {
            seen if seen["state"] == "admitted" => Ok(()),
            seen => Err(seen.to_string()),
        }
    })
    .await;
    let mut won = Vec::new();
    for (user, pass) in &passes {
        let (status, body) = eventually(Duration::from_secs(5), "the sale resumed", || async {
            match buy_with(env, &server, *user, Some(pass)).await {
                (503, body) => Err(body.to_string()),
                answer => Ok(answer),
            }
        })
        .await;
        assert_eq!(status, 202, "user {user}: {body}");
        won.push(body["order_sn"].as_str().unwrap().to_owned());
    }
    quiet(env, &server, ITEM, &amqp_url(), Duration::from_secs(30)).await;
    env.assert_invariants(&server, ITEM, 6, &won).await;
    server.stop().await;
}

/// A scheduler's step whose stock was read before a forced warm-up held the line lets
/// nobody in, even once the hold is over: that stock may be the one the reload replaced,
/// and the reload counted the passes without it. (The step's script run by hand, as the
/// scheduler runs it, with no scheduler beside: a stock read, a hold and its end, then
/// the step — before, it let 3 in on the old stock.)
#[tokio::test]
async fn a_step_on_a_stock_read_before_a_reload_lets_nobody_in() {
    let env = &TestEnv::new("waitgen").await;
    let api = env.server(&[Role::Api, Role::Consumer]).await;
    let start = Utc::now() - chrono::Duration::seconds(1);
    env.item(ITEM, 10)
        .window(start, start + chrono::Duration::hours(1))
        .queued(json!({ "admit_per_s": 10 }))
        .on_sale(&api)
        .await;
    for user in 1..=5 {
        join(env, &api, user, None).await;
    }
    let keys = seckill::testing::Keys::new(&env.settings.namespace)
        .queue(seckill::domain::ItemId::new(ITEM).unwrap());
    let mut redis = env.redis.clone();
    let rules = seckill::testing::StepRules {
        start_ms: start.timestamp_millis(),
        end_ms: (start + chrono::Duration::hours(1)).timestamp_millis(),
        admit_per_s: 10,
        pass_ttl_ms: 300_000,
        per_user: 1,
        held: false,
    };
    let step = |reloads: u64| {
        let (keys, mut redis) = (keys.clone(), env.redis.clone());
        async move {
            let before = seckill::testing::BeforeStock { sold: 0, reloads };
            seckill::testing::queue_step(&mut redis, &keys, rules, 10, before)
                .await
                .unwrap()
                .map_or(0, |stepped| stepped.admitted)
        }
    };
    // The warm-ups so far (each holds the line while it loads), as a step reads them
    // before the stock.
    let gen_of = |state: &std::collections::HashMap<String, String>| -> u64 {
        state.get("reload_gen").map_or(0, |g| g.parse().unwrap())
    };
    let state: std::collections::HashMap<String, String> =
        redis::AsyncCommands::hgetall(&mut redis, &keys.state)
            .await
            .unwrap();
    let before = gen_of(&state);
    // The first step starts the rate's clock; half a second later 5 are due.
    assert_eq!(step(before).await, 0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reserved = seckill::testing::hold_for_reload(&mut redis, &keys)
        .await
        .unwrap();
    assert_eq!(reserved, 0);
    assert_eq!(
        step(before + 1).await,
        0,
        "nobody while the reload holds the line"
    );
    seckill::testing::free_after_reload(&mut redis, &keys)
        .await
        .unwrap();
    // Each time with half a second's allowance (a step that lets nobody in drops it).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        step(before).await,
        0,
        "a stock read before the hold lets nobody in"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(step(before + 1).await > 0, "a stock read after it does");
    api.stop().await;
}

/// The stream pushes a waiting buyer's place, then the admission with the pass.
#[tokio::test]
async fn the_stream_pushes_the_place_then_the_pass() {
    let env = &TestEnv::new("waitsse").await;
    let api = env.server(&[Role::Api, Role::Consumer]).await;
    env.item(ITEM, 1)
        .queued(json!({ "admit_per_s": 1000 }))
        .on_sale(&api)
        .await;
    for user in 1..=2 {
        join(env, &api, user, None).await;
    }
    let response = env
        .http
        .get(api.url(&queue_path("/me/events")))
        .bearer_auth(env.token(2))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    // Nobody is let in before a scheduler runs: the first event is the place.
    let scheduler = env.server(&[Role::Scheduler]).await;
    let mut response = response;
    let mut text = String::new();
    let mut events: Vec<Value> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(deadline, response.chunk()).await {
        text.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data:")) {
                events.push(serde_json::from_str(data.trim()).unwrap());
            }
        }
        // User 1 takes the only unit, then cancels: user 2 is let in.
        if events.len() == 1 && events[0]["state"] == "waiting" {
            let pass = eventually(Duration::from_secs(5), "user 1 let in", || async {
                let seen = me(env, &api, 1).await;
                seen["pass"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or(seen.to_string())
            })
            .await;
            let (status, bought) = buy_with(env, &api, 1, Some(&pass)).await;
            assert_eq!(status, 202, "{bought}");
            let sn = bought["order_sn"].as_str().unwrap().to_owned();
            env.wait_for_orders(&api, ITEM, 1, Duration::from_secs(10))
                .await;
            let (status, body) = env
                .post_as(&api, &format!("/api/orders/{sn}/cancel"), 1)
                .await;
            assert_eq!(status, 200, "{body}");
        }
    }
    let states: Vec<&str> = events.iter().filter_map(|e| e["state"].as_str()).collect();
    assert_eq!(states.first(), Some(&"waiting"), "{events:?}");
    assert_eq!(states.last(), Some(&"admitted"), "{events:?}");
    assert!(events.last().unwrap()["pass"].is_string(), "{events:?}");
    scheduler.stop().await;
    api.stop().await;
}

/// A pass left unused runs out: its buyer hears `expired` and `403 pass_expired`, and
/// the unit it reserved goes to the next in line. (Passes last 30 s at least: this test
/// waits that long.)
#[tokio::test]
async fn an_unused_pass_expires_and_its_place_goes_to_the_next() {
    let env = &TestEnv::new("waitexp").await;
    let server = env
        .server(&[Role::Api, Role::Consumer, Role::Scheduler])
        .await;
    env.item(ITEM, 2)
        .queued(json!({ "admit_per_s": 1000, "pass_ttl_s": 30 }))
        .on_sale(&server)
        .await;
    // Arrivals after the start: let in in the order they joined.
    for user in 1..=4 {
        let (status, joined) = join(env, &server, user, None).await;
        assert_eq!(status, 200, "{joined}");
    }
    let passes = eventually(Duration::from_secs(10), "two let in", || async {
        let passes = admitted(env, &server, 1..=4).await;
        if passes.len() == 2 {
            Ok(passes)
        } else {
            Err(format!("{passes:?}"))
        }
    })
    .await;
    assert_eq!(passes.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
    let (status, bought) = buy_with(env, &server, 1, Some(&passes[&1])).await;
    assert_eq!(status, 202, "{bought}");
    let expires: DateTime<Utc> = me(env, &server, 2).await["pass_expires_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(me(env, &server, 3).await["state"], "waiting");
    // User 2's purchase took its pass's unit and was cut off before it said what became of
    // it (its process killed): the unit stays reserved until the pass runs out, no longer.
    let keys = seckill::testing::Keys::new(&env.settings.namespace)
        .queue(seckill::domain::ItemId::new(ITEM).unwrap());
    let taken: i64 = seckill::testing::lua::QUEUE_TAKE
        .key(&keys.held)
        .arg(2)
        .invoke_async(&mut env.redis.clone())
        .await
        .unwrap();
    assert_eq!(taken, 1);

    let left = (expires - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(left + Duration::from_millis(100)).await;
    let (status, refused) = buy_with(env, &server, 2, Some(&passes[&2])).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (403, Some("pass_expired")),
        "{refused}"
    );
    let seen = me(env, &server, 2).await;
    assert_eq!(seen["state"], "expired", "{seen}");
    // Its reservation outlives it by a few seconds (hosts' clocks differ): then user 3.
    let third = eventually(Duration::from_secs(10), "user 3 let in", || async {
        let seen = me(env, &server, 3).await;
        seen["pass"]
            .as_str()
            .map(str::to_owned)
            .ok_or(seen.to_string())
    })
    .await;
    assert_eq!(me(env, &server, 4).await["state"], "waiting");
    assert_eq!(me(env, &server, 1).await["state"], "done");
    let (status, bought3) = buy_with(env, &server, 3, Some(&third)).await;
    assert_eq!(status, 202, "{bought3}");
    let report = figures(env, &server).await;
    assert_eq!(
        (
            report["admitted"].as_u64(),
            report["expired"].as_u64(),
            report["bought"].as_u64()
        ),
        (Some(3), Some(1), Some(2)),
        "{report}"
    );
    env.wait_for_orders(&server, ITEM, 2, Duration::from_secs(20))
        .await;
    let won: Vec<String> = [bought, bought3]
        .iter()
        .map(|b| b["order_sn"].as_str().unwrap().to_owned())
        .collect();
    env.assert_invariants(&server, ITEM, 2, &won).await;
    server.stop().await;
}
