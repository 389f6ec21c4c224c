//! Protection: circuit breakers by hand and by themselves, load shedding.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::StreamExt;
use serde_json::Value;

use seckill::Role;
use seckill::config::Secret;

use crate::history::{Press, press};
use crate::support::*;

async fn circuit(env: &TestEnv, server: &TestServer, action: &str, query: &str) -> (u16, Value) {
    env.admin_post(server, &format!("/admin/circuit/{action}?{query}"))
        .await
}

/// `(old_level, new_level, source)` of the audit log, oldest first.
async fn audit_log(env: &TestEnv) -> Vec<(String, u8, u8, String, String, String)> {
    sqlx::query_as(
        "SELECT scope, old_level, new_level, source, actor, reason FROM circuit_changes ORDER BY id",
    )
    .fetch_all(&env.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn breaker_levels_hold_purchases_back_globally_and_per_item() {
    let env = &TestEnv::new("breakers").await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.breaker_throttle_rps = 2;
            s.breaker_auto = false;
        })
        .await;
    env.item(1, 100).on_sale(&server).await;
    env.item(2, 100).on_sale(&server).await;
    let (status, early) = env.buy(&server, 1, 1).await;
    assert_eq!(status, 202, "{early}");
    let early = early["order_sn"].as_str().unwrap().to_owned();

    // Operators only, sensible levels, known items.
    let response = env
        .http
        .post(server.url("/admin/circuit/open?level=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    for (query, status) in [
        ("level=0", 400),
        ("level=4", 400),
        ("item=99&level=2", 404),
        ("item=1&level=2&colour=red", 400),
    ] {
        let (got, json) = circuit(env, &server, "open", query).await;
        assert_eq!(got, status, "{query}: {json}");
    }

    // Level 1 on item 1: a trickle gets through, the rest hear 503 circuit_open at once.
    let (status, json) = circuit(
        env,
        &server,
        "open",
        "item=1&level=1&by=alice&reason=warming+up",
    )
    .await;
    assert_eq!(
        (status, json["code"].as_str()),
        (200, Some("opened")),
        "{json}"
    );
    assert_eq!(
        (json["level"].as_u64(), json["previous_level"].as_u64()),
        (Some(1), Some(0))
    );
    let mut answers = Vec::new();
    for user in 10..20 {
        answers.push(env.buy(&server, user, 1).await);
    }
    let admitted = answers.iter().filter(|(s, _)| *s == 202).count();
    assert!(
        (1..=4).contains(&admitted),
        "{admitted} admitted at 2/s: {answers:?}"
    );
    let (_, refused) = answers
        .iter()
        .find(|(s, _)| *s == 503)
        .expect("some refused");
    assert_eq!(
        (refused["code"].as_str(), refused["level"].as_u64()),
        (Some("circuit_open"), Some(1))
    );
    assert_eq!(refused["scope"], "item:1");
    // Item 2 is not held back.
    assert_eq!(env.buy(&server, 30, 2).await.0, 202);
    // What was admitted is in MySQL, so that nothing moves the stock but the refusals.
    env.wait_for_orders(&server, 1, 1 + admitted, Duration::from_secs(10))
        .await;
    env.wait_for_orders(&server, 2, 1, Duration::from_secs(10))
        .await;

    // Level 2: no purchases of item 1 (refused, they take nothing); its orders can still
    // be read and paid.
    circuit(env, &server, "open", "item=1&level=2").await;
    let response = env
        .takes_nothing(1, async {
            env.purchase(&server, 31, 1).send().await.unwrap()
        })
        .await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "5");
    let (status, _) = env.get(&server, "/api/items/1", None).await;
    assert_eq!(status, 200);
    let (status, json) = env
        .post_as(&server, &format!("/api/orders/{early}/pay"), 1)
        .await;
    assert_eq!(status, 200, "{json}");

    // Level 3: no order changes either.
    circuit(env, &server, "open", "item=1&level=3").await;
    let (status, json) = env
        .post_as(&server, &format!("/api/orders/{early}/cancel"), 1)
        .await;
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("circuit_open")),
        "{json}"
    );

    // The global breaker covers every item; closing restores sales.
    circuit(env, &server, "open", "level=2&reason=incident").await;
    let (status, json) = env.takes_nothing(2, env.buy(&server, 32, 2)).await;
    assert_eq!(
        (status, json["scope"].as_str()),
        (503, Some("global")),
        "{json}"
    );
    let (_, listed) = env.admin_get(&server, "/admin/circuit").await;
    assert_eq!(listed["global"]["level"], 2, "{listed}");
    assert_eq!(listed["global"]["source"], "manual", "{listed}");
    assert_eq!(listed["items"][0]["item_id"], 1, "{listed}");
    assert_eq!(listed["items"][0]["level"], 3, "{listed}");
    circuit(env, &server, "close", "").await;
    circuit(env, &server, "close", "item=1").await;
    assert_eq!(env.buy(&server, 33, 1).await.0, 202);
    assert_eq!(env.buy(&server, 34, 2).await.0, 202);

    // Every change is in the audit log, with who and why.
    let log = audit_log(env).await;
    let changes: Vec<(&str, u8, u8)> = log
        .iter()
        .map(|(s, o, n, ..)| (s.as_str(), *o, *n))
        .collect();
    assert_eq!(
        changes,
        vec![
            ("item:1", 0, 1),
            ("item:1", 1, 2),
            ("item:1", 2, 3),
            ("global", 0, 2),
            ("global", 2, 0),
            ("item:1", 3, 0)
        ]
    );
    assert_eq!(
        (log[0].3.as_str(), log[0].4.as_str(), log[0].5.as_str()),
        ("manual", "alice", "warming up")
    );
    assert_eq!(log[3].5, "incident");
    server.stop().await;
}

#[tokio::test]
async fn a_level_set_through_one_instance_is_obeyed_by_another_and_survives_a_restart() {
    let env = &TestEnv::new("breakershare").await;
    let no_auto = |s: &mut seckill::Settings| s.breaker_auto = false;
    let a = env.server_with(ALL_ROLES, no_auto).await;
    let b = env.server_with(&[Role::Api], no_auto).await;
    env.item(1, 100).on_sale(&a).await;
    assert_eq!(env.buy(&b, 1, 1).await.0, 202);

    circuit(env, &a, "open", "item=1&level=2").await;
    let set_at = Instant::now();
    let b_ref = &b;
    eventually(Duration::from_secs(3), "B refusing", || async move {
        match env.buy(b_ref, 2, 1).await {
            (503, json) if json["code"] == "circuit_open" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Announced on pub/sub, re-read every half second: well within a second here.
    assert!(
        set_at.elapsed() < Duration::from_secs(2),
        "{:?}",
        set_at.elapsed()
    );

    // A restarted instance obeys from its very first request, and takes nothing.
    b.stop().await;
    let b = env.server_with(&[Role::Api], no_auto).await;
    env.wait_for_orders(&a, 1, 1, Duration::from_secs(10)).await;
    let (status, json) = env.takes_nothing(1, env.buy(&b, 3, 1)).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (503, Some("circuit_open")),
        "{json}"
    );
    circuit(env, &a, "close", "item=1").await;
    let b_ref = &b;
    eventually(Duration::from_secs(3), "B selling again", || async move {
        match env.buy(b_ref, 4, 1).await {
            (202, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    b.stop().await;
    a.stop().await;
}

fn redis_addr() -> SocketAddr {
    let url = url::Url::parse(&redis_url()).unwrap();
    format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(6379))
        .parse()
        .unwrap()
}

/// Buyers pressing item 1 at `server`, `at_once` at a time, each press a new user from
/// `users`, `pause` between one's answer and their next press, until `stop` (or, for each,
/// until sold out): every answer (`202 queued`, `503 circuit_open`, …), with when it came.
async fn buyers_until(
    env: &TestEnv,
    server: &TestServer,
    users: &AtomicU64,
    at_once: usize,
    pause: Duration,
    stop: &AtomicBool,
) -> Vec<(Instant, String, Press)> {
    let http = &reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let one = async || {
        let mut heard = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let user = users.fetch_add(1, Ordering::SeqCst);
            let (label, answer) = press(env, http, 1, user, server.addr).await;
            let sold_out = label == "410 sold_out";
            heard.push((Instant::now(), label, answer));
            if sold_out {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        heard
    };
    futures::future::join_all((0..at_once).map(|_| one()))
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// The order numbers of the `202`s among `heard`.
fn wins(heard: &[(Instant, String, Press)]) -> Vec<String> {
    heard
        .iter()
        .filter_map(|(_, _, answer)| match answer {
            Press::Won(sn) => Some(sn.clone()),
            _ => None,
        })
        .collect()
}

/// When `at` came, against `healed`, for a message.
fn since_heal(at: Instant, healed: Instant) -> String {
    match at.checked_duration_since(healed) {
        Some(after) => format!("{after:?} after the heal"),
        None => format!("{:?} before the heal", healed - at),
    }
}

/// Instance A's Redis turns slow (a delay-line proxy in front of it), B's does not: A's own
/// automatic breaker trips (its refusals name it, `GET /admin/circuit` on B lists it with who
/// and why), B's buyers hear only `202` throughout; an operator's close undoes the trip;
/// once Redis is fast again A's breaker closes through half-open; and while the global
/// breaker is held by hand, A's automatic one never moves.
#[tokio::test]
async fn an_instance_trips_its_own_breaker_on_a_slow_redis_and_closes_it_through_half_open() {
    let env = &TestEnv::new("autotrip").await;
    let proxy = TcpProxy::start(redis_addr()).await;
    let redis = format!("redis://{}", proxy.addr);
    let server_b = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    let server_a = env
        .server_with(&[Role::Api], |s| {
            s.redis_url = Secret::new(redis);
            s.breaker_slow_ms = 100;
            s.breaker_min_requests = 5;
            s.breaker_window_s = 5;
            s.breaker_open_s = 1;
            s.breaker_probes = 3;
            s.breaker_throttle_rps = 50;
            s.rate_per_user = 0;
        })
        .await;
    let (a, b) = (&server_a, &server_b);
    env.item(1, 100_000).on_sale(b).await;
    let stop = AtomicBool::new(false);
    let b_users = AtomicU64::new(2_000_000);
    let at_b = buyers_until(env, b, &b_users, 2, Duration::from_millis(50), &stop);

    let mut user = 0u64;
    let mut won = Vec::new();
    let at_a = async {
        // Buys at A with new users until `done` says so; returns what it saw last.
        let mut buy_until = async |what: &str, done: &dyn Fn(u16, &Value) -> bool| {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                user += 1;
                let (status, json) = env.buy(a, user, 1).await;
                if status == 202 {
                    won.push(json["order_sn"].as_str().unwrap().to_owned());
                }
                if done(status, &json) {
                    return json;
                }
                assert!(
                    Instant::now() < deadline,
                    "never {what}: last {status} {json}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let tripped = |status: u16, json: &Value| status == 503 && json["code"] == "circuit_open";

        buy_until("a win", &|status, _| status == 202).await;
        proxy.set_delay(Duration::from_millis(200));
        let refused = buy_until("refused by the breaker", &tripped).await;
        let scope = refused["scope"].as_str().unwrap_or_default().to_owned();
        assert!(
            scope.starts_with("instance:") && refused["level"] == 2,
            "A's own breaker refuses: {refused}"
        );
        let (_, listed) = env.admin_get(b, "/admin/circuit").await;
        assert_eq!(listed["global"]["level"], 0, "{listed}");
        let own = &listed["instances"][0];
        assert_eq!(
            (
                own["scope"].as_str(),
                own["source"].as_str(),
                own["level"].as_u64()
            ),
            (Some(scope.as_str()), Some("auto"), Some(2)),
            "{listed}"
        );
        let instance = scope.trim_start_matches("instance:");
        assert_eq!(own["instance"], instance, "{listed}");
        assert_eq!(own["by"], format!("instance {instance}"), "{listed}");

        // An operator's close of the global breaker undoes the trip (it comes back only on
        // what A measures from then on).
        let (status, json) = circuit(env, b, "close", "by=carol&reason=redis+fine").await;
        assert_eq!(status, 200, "{json}");
        buy_until("a sale after the close by hand", &|status, _| status == 202).await;
        // Still slow: it trips again.
        buy_until("refused by the breaker again", &tripped).await;

        proxy.set_delay(Duration::ZERO);
        // Half-open lets probes through; good ones close it.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            buy_until("a probe", &|_, _| true).await;
            let (_, listed) = env.admin_get(b, "/admin/circuit").await;
            if listed["instances"] == serde_json::json!([]) {
                break;
            }
            assert!(Instant::now() < deadline, "the breaker never closed");
        }
        // The audit row follows the move in Redis by a moment.
        let changes = eventually(Duration::from_secs(3), "the close audited", || async {
            let changes: Vec<(String, u8, u8, String)> = audit_log(env)
                .await
                .into_iter()
                .map(|(scope, old, new, source, ..)| (scope, old, new, source))
                .collect();
            if changes.last().is_some_and(|c| (c.1, c.2) == (1, 0)) {
                Ok(changes)
            } else {
                Err(format!("{changes:?}"))
            }
        })
        .await;
        let moved = |old, new, source: &str| (scope.clone(), old, new, source.to_owned());
        assert_eq!(changes[0], moved(0, 2, "auto"), "{changes:?}");
        // The close by hand: the global breaker's row, then A's (open, or half-open if its
        // 1 s cool-down ran out first), then A tripping again.
        let by_hand = changes
            .iter()
            .position(|c| c.0 == "global")
            .expect("the close by hand audited");
        let undone = &changes[by_hand + 1];
        assert!(
            (undone.0.as_str(), undone.2, undone.3.as_str()) == (scope.as_str(), 0, "manual"),
            "{changes:?}"
        );
        assert_eq!(changes[by_hand + 2], moved(0, 2, "auto"), "{changes:?}");
        assert!(
            changes[by_hand..].contains(&moved(2, 1, "auto")),
            "through half-open: {changes:?}"
        );
        assert_eq!(changes.last(), Some(&moved(1, 0, "auto")), "{changes:?}");
        let audited = changes.len();
        let (status, json) = env.buy(a, 1_000_000, 1).await;
        assert_eq!(status, 202, "{json}");
        won.push(json["order_sn"].as_str().unwrap().to_owned());

        // A level held by hand is never overridden: with the global breaker at 1 and Redis
        // slow again, A's purchases go through the throttle and its own breaker stays out.
        circuit(env, b, "open", "level=1&by=bob&reason=holding").await;
        proxy.set_delay(Duration::from_millis(200));
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            user += 1;
            let (status, json) = env.buy(a, user, 1).await;
            match status {
                202 => won.push(json["order_sn"].as_str().unwrap().to_owned()),
                503 => assert_eq!(json["scope"], "global", "{json}"),
                _ => panic!("{status} {json}"),
            }
        }
        let (_, listed) = env.admin_get(b, "/admin/circuit").await;
        assert_eq!(
            (
                listed["global"]["source"].as_str(),
                listed["global"]["level"].as_u64()
            ),
            (Some("manual"), Some(1)),
            "{listed}"
        );
        assert_eq!(listed["instances"], serde_json::json!([]), "{listed}");
        assert_eq!(
            audit_log(env).await.len(),
            audited + 1,
            "only the hand-set level"
        );
        proxy.set_delay(Duration::ZERO);
        circuit(env, b, "close", "").await;
        stop.store(true, Ordering::SeqCst);
    };
    let (heard_b, ()) = tokio::join!(at_b, at_a);
    // B's Redis was never slow: nothing A measured held B's buyers back.
    assert!(heard_b.len() > 20, "{} presses at B", heard_b.len());
    for (_, label, _) in &heard_b {
        assert_eq!(label, "202 queued", "a buyer at B");
    }
    won.extend(wins(&heard_b));

    env.wait_for_orders(b, 1, won.len(), Duration::from_secs(20))
        .await;
    server_a.stop().await;
    server_b.stop().await;
}

/// Instance A is cut off from Redis for 2 s while buyers press at A and at B: A's answer
/// `503 unavailable` meanwhile. Once healed, what A measured while it could not reach Redis
/// trips no breaker — neither one every instance obeys (B's buyers never hear `503
/// circuit_open`) nor A's own (A's last `503` within 2 s of the heal) — and both sell every
/// unit. (The fleet's "API host cut off from Redis", on one machine.)
#[tokio::test]
async fn an_instance_cut_off_from_redis_trips_no_breaker_once_healed() {
    let env = &TestEnv::new("breakercut").await;
    let proxy = TcpProxy::start(redis_addr()).await;
    let redis = format!("redis://{}", proxy.addr);
    let server_b = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    let server_a = env
        .server_with(&[Role::Api], |s| {
            s.redis_url = Secret::new(redis);
            s.rate_per_user = 0;
        })
        .await;
    let (a, b) = (&server_a, &server_b);
    const UNITS: u32 = 2_000;
    env.item(1, UNITS).on_sale(b).await;
    let first = eventually(Duration::from_secs(5), "A selling", || async {
        match env.buy(a, 1, 1).await {
            (202, json) => Ok(json["order_sn"].as_str().unwrap().to_owned()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let mut won = vec![first];

    let users = AtomicU64::new(10);
    let stop = AtomicBool::new(false);
    let healed = AtomicBool::new(false);
    let pause = Duration::from_millis(100);
    // Buyers press at A and B throughout; while A is cut off a crowd piles up there too,
    // each press waiting out the one-second budget (as at a host whose link is down).
    let crowd_at_a = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.cut();
        let crowd = buyers_until(env, a, &users, 32, Duration::ZERO, &healed);
        let heal = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            proxy.restore();
            healed.store(true, Ordering::SeqCst);
            Instant::now()
        };
        let (crowd, at) = tokio::join!(crowd, heal);
        // A breaker tripped on what A measured while cut off would hold for its 5 s
        // cool-down, then go half-open.
        tokio::time::sleep(Duration::from_secs(7)).await;
        stop.store(true, Ordering::SeqCst);
        (crowd, at)
    };
    let (mut at_a, at_b, (crowd, healed)) = tokio::join!(
        buyers_until(env, a, &users, 1, pause, &stop),
        buyers_until(env, b, &users, 4, pause, &stop),
        crowd_at_a,
    );
    at_a.extend(crowd);
    let cut_off = at_a
        .iter()
        .filter(|(_, label, _)| label == "503 unavailable")
        .count();
    assert!(
        cut_off >= 20,
        "A's buyers heard {cut_off} × 503 unavailable"
    );
    for (at, label, _) in &at_b {
        assert_eq!(
            label,
            "202 queued",
            "a buyer at B, {}",
            since_heal(*at, healed)
        );
    }
    for (at, label, _) in &at_a {
        let late = at.checked_duration_since(healed) > Some(Duration::from_secs(2));
        assert!(
            label == "202 queued" || (label == "503 unavailable" && !late),
            "a buyer at A heard {label} {}",
            since_heal(*at, healed)
        );
    }
    let log = audit_log(env).await;
    assert!(log.is_empty(), "no breaker moved: {log:?}");
    let (_, listed) = env.admin_get(b, "/admin/circuit").await;
    assert_eq!(
        (&listed["global"]["level"], &listed["instances"]),
        (&serde_json::json!(0), &serde_json::json!([])),
        "{listed}"
    );
    // Both sell what is left, every unit.
    let until_sold_out = AtomicBool::new(false);
    let (more_a, more_b) = tokio::join!(
        buyers_until(env, a, &users, 8, Duration::ZERO, &until_sold_out),
        buyers_until(env, b, &users, 8, Duration::ZERO, &until_sold_out),
    );
    for (_, label, _) in more_a.iter().chain(&more_b) {
        assert!(
            label == "202 queued" || label == "410 sold_out",
            "the rest sold: {label}"
        );
    }
    let (after_a, after_b) = (wins(&more_a), wins(&more_b));
    assert!(
        !after_a.is_empty() && !after_b.is_empty(),
        "both sold: A {} B {}",
        after_a.len(),
        after_b.len()
    );
    for heard in [&at_a, &at_b] {
        won.extend(wins(heard));
    }
    won.extend(after_a);
    won.extend(after_b);
    // A purchase cut off after Redis ran it may have won unanswered: MySQL holds a row for
    // every unit either way.
    env.wait_for_orders(b, 1, UNITS as usize, Duration::from_secs(30))
        .await;
    assert_eq!(env.stats(b, 1).await["remaining"], 0);
    env.assert_invariants(b, 1, UNITS, &won).await;
    server_a.stop().await;
    server_b.stop().await;
}

#[tokio::test]
async fn purchases_beyond_the_limit_are_shed_at_once_and_nothing_is_lost() {
    let env = &TestEnv::new("shed").await;
    let proxy = TcpProxy::start(redis_addr()).await;
    let redis = format!("redis://{}", proxy.addr);
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.redis_url = Secret::new(redis);
            s.max_inflight = 4;
            s.breaker_auto = false;
        })
        .await;
    env.item(1, 1_000).on_sale(&server).await;
    proxy.set_delay(Duration::from_millis(300));

    let answers: Vec<(u16, Value, Duration)> = futures::stream::iter(1..=40u64)
        .map(|user| {
            let server = &server;
            async move {
                let started = Instant::now();
                let (status, json) = env.buy(server, user, 1).await;
                (status, json, started.elapsed())
            }
        })
        .buffer_unordered(40)
        .collect()
        .await;
    let won: Vec<String> = answers
        .iter()
        .filter(|(s, ..)| *s == 202)
        .map(|(_, json, _)| json["order_sn"].as_str().unwrap().to_owned())
        .collect();
    let shed: Vec<&(u16, Value, Duration)> = answers.iter().filter(|(s, ..)| *s == 503).collect();
    assert_eq!(won.len() + shed.len(), 40, "{answers:?}");
    assert!(won.len() >= 4, "the limit's worth succeed: {answers:?}");
    assert!(!shed.is_empty(), "the excess is shed: {answers:?}");
    for (_, json, took) in &shed {
        assert_eq!(json["code"], "unavailable", "{json}");
        // Shed before reaching Redis: faster than one Redis answer.
        assert!(*took < Duration::from_millis(300), "shed after {took:?}");
    }

    proxy.set_delay(Duration::ZERO);
    env.wait_for_orders(&server, 1, won.len(), Duration::from_secs(20))
        .await;
    env.assert_invariants(&server, 1, 1_000, &won).await;
    server.stop().await;
}

/// Unknown ids asked for without a token are remembered (not asked of MySQL again and
/// again): with MySQL gone, an id found unknown a few seconds ago is still `404`, not
/// `503`. A write forgets the answer at once, on this instance and on another.
#[tokio::test]
async fn unknown_ids_are_remembered_until_a_write_makes_them_known() {
    let env = TestEnv::new("unknownids").await;
    let proxy = TcpProxy::start(mysql_addr()).await;
    let database_url = env.database_url_via(proxy.addr);
    let a = env
        .server_with(ALL_ROLES, |s| s.database_url = database_url.clone())
        .await;
    let b = env
        .server_with(&[Role::Api], |s| s.database_url = database_url.clone())
        .await;
    for server in [&a, &b] {
        assert_eq!(env.get(server, "/api/items/424242", None).await.0, 404);
        assert_eq!(env.get(server, "/api/shops/4242/status", None).await.0, 404);
    }
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for server in [&a, &b] {
        let (status, json) = env.get(server, "/api/items/424242", None).await;
        assert_eq!(
            (status, json["code"].as_str()),
            (404, Some("item_not_found")),
            "{json}"
        );
        let (status, json) = env.get(server, "/api/shops/4242/status", None).await;
        assert_eq!(
            (status, json["code"].as_str()),
            (404, Some("shop_not_found")),
            "{json}"
        );
    }
    proxy.restore();

    // The item is created (with a new shop 4242) through A.
    let now = chrono::Utc::now();
    let created = env
        .admin(reqwest::Method::PUT, &a, "/admin/items/424242")
        .json(&serde_json::json!({
            "name": "new", "shop_id": 4242, "total": 5, "price_cents": 1,
            "start_at": now, "end_at": now + chrono::Duration::hours(1),
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    assert_eq!(env.get(&a, "/api/items/424242", None).await.0, 200);
    assert_eq!(env.get(&a, "/api/shops/4242/status", None).await.0, 200);
    eventually(
        Duration::from_secs(2),
        "B knowing the new item and shop",
        || async {
            let item = env.get(&b, "/api/items/424242", None).await.0;
            let shop = env.get(&b, "/api/shops/4242/status", None).await.0;
            if (item, shop) == (200, 200) {
                Ok(())
            } else {
                Err(format!("item {item}, shop {shop}"))
            }
        },
    )
    .await;
    b.stop().await;
    a.stop().await;
}

/// A flood of made-up ids, each a MySQL look-up, on a slow MySQL: the look-ups share a
/// few connections and the excess is told `503` at once, so a buyer paying meanwhile
/// still gets a connection and an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_unknown_ids_cannot_take_the_database_from_buyers() {
    let env = TestEnv::new("idflood").await;
    let proxy = TcpProxy::start(mysql_addr()).await;
    let database_url = env.database_url_via(proxy.addr);
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.database_url = database_url.clone();
            s.read_rate_per_ip = 0;
        })
        .await;
    env.item(1, 5).on_sale(&server).await;
    let (_, won) = env.buy(&server, 1, 1).await;
    let sn = won["order_sn"].as_str().unwrap().to_owned();
    env.wait_for_orders(&server, 1, 1, Duration::from_secs(10))
        .await;

    proxy.set_delay(Duration::from_millis(100));
    let flood = futures::stream::iter(1_000_000..1_000_300u64)
        .map(|id| {
            let (env, server) = (&env, &server);
            async move { env.get(server, &format!("/api/items/{id}"), None).await }
        })
        .buffer_unordered(300)
        .collect::<Vec<_>>();
    let pay = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        env.pay(&server, &sn).await
    };
    let (answers, (status, json)) = tokio::join!(flood, pay);
    assert_eq!(
        (status, json["code"].as_str()),
        (200, Some("paid")),
        "{json}"
    );
    let busy = answers.iter().filter(|(s, _)| *s == 503).count();
    let unknown = answers.iter().filter(|(s, _)| *s == 404).count();
    assert_eq!(busy + unknown, 300, "{answers:?}");
    assert!(busy > 0, "every look-up ran: nothing bounded them");
    server.stop().await;
}

/// Reads without a token are limited per client address; another address is not.
#[tokio::test]
async fn reads_without_a_token_are_limited_per_client_address() {
    let env = TestEnv::new("readrate").await;
    let server = env.server_with(ALL_ROLES, |s| s.read_rate_per_ip = 5).await;
    env.item(1, 5).on_sale(&server).await;
    let answers =
        futures::future::join_all((0..30).map(|_| env.get(&server, "/api/items/1", None))).await;
    let limited: Vec<_> = answers.iter().filter(|(s, _)| *s == 429).collect();
    assert!(limited.len() >= 15, "{answers:?}");
    assert!(limited.iter().all(|(_, j)| j["code"] == "rate_limited"));
    let response = env
        .http
        .get(server.url("/api/shops/1/status"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert!(response.headers().contains_key("retry-after"));
    let other = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let response = other.get(server.url("/api/items/1")).send().await.unwrap();
    assert_eq!(response.status(), 200, "another address has its own budget");
    server.stop().await;
}
