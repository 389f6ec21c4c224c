//! Every row of the purchase table (docs/contract.md section 3) that this server answers today,
//! plus the reads.

use std::time::Duration;

use chrono::Utc;
use serde_json::{Value, json};

use seckill::Role;

use crate::support::*;

/// Sends a purchase with full control over its parts.
async fn raw(
    env: &TestEnv,
    server: &TestServer,
    token: Option<&str>,
    client_time: Option<&str>,
    body: &str,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut request = env
        .http
        .post(server.url("/api/flashbuy"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(time) = client_time {
        request = request.header("x-client-time", time);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, response.json().await.unwrap(), headers)
}

fn now_ms() -> String {
    Utc::now().timestamp_millis().to_string()
}

#[tokio::test]
async fn malformed_requests_get_400_naming_the_problem_and_touch_nothing() {
    let env = TestEnv::new("malformed").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 5).on_sale(&server).await;
    let token = env.token(1);
    let now = now_ms();
    let cases: &[(Option<&str>, &str, &str, &str)] = &[
        (Some(&now), "{\"item_id\": ", "bad_request", "request body"),
        (Some(&now), "", "bad_request", "JSON object"),
        (Some(&now), "[1]", "bad_request", "JSON object"),
        (
            Some(&now),
            "{\"item_id\": \"one\"}",
            "bad_request",
            "`item_id`",
        ),
        (Some(&now), "{\"item_id\": -1}", "bad_request", "`item_id`"),
        (
            Some(&now),
            "{\"item_id\": 0}",
            "bad_request",
            "between 1 and",
        ),
        (Some(&now), "{}", "bad_request", "missing field `item_id`"),
        (
            None,
            "{\"item_id\": 1}",
            "bad_request",
            "missing X-Client-Time",
        ),
        (
            Some("soon"),
            "{\"item_id\": 1}",
            "bad_request",
            "X-Client-Time is not a number",
        ),
        (
            Some("1"),
            "{\"item_id\": 1}",
            "clock_skew",
            "differs from server time",
        ),
    ];
    for (time, body, code, detail) in cases {
        let (status, json, headers) = raw(&env, &server, Some(&token), *time, body).await;
        assert_eq!(status, 400, "{body:?} {time:?}: {json}");
        assert_eq!(json["code"], *code, "{body:?}: {json}");
        let said = json["detail"].as_str().unwrap();
        assert!(
            said.contains(detail),
            "{body:?}: detail {said:?} should mention {detail:?}"
        );
        assert_eq!(
            headers["x-request-id"].to_str().unwrap(),
            json["trace_id"].as_str().unwrap()
        );
    }
    // Nothing was sold, nothing recorded.
    let stats = env.stats(&server, 1).await;
    assert_eq!(
        (stats["remaining"].as_u64(), stats["sold"].as_u64()),
        (Some(5), Some(0))
    );
    server.stop().await;
}

#[tokio::test]
async fn bad_tokens_get_401() {
    let env = TestEnv::new("tokens").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 5).on_sale(&server).await;
    let forged = seckill::testing::Jwt::new(&seckill::config::Secret::new("not-the-secret"))
        .mint(seckill::domain::UserId::new(1), Duration::from_secs(60))
        .unwrap();
    let expired = {
        let key =
            jsonwebtoken::EncodingKey::from_secret(env.settings.jwt_secret.expose().as_bytes());
        let now = Utc::now().timestamp();
        jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &json!({ "sub": "1", "exp": now - 600, "iat": now - 700 }),
            &key,
        )
        .unwrap()
    };
    let cases = [
        (None, "missing"),
        (Some(forged.as_str()), "signature"),
        (Some(expired.as_str()), "expired"),
        (Some("garbage"), "malformed"),
    ];
    for (token, detail) in cases {
        let (status, json, _) =
            raw(&env, &server, token, Some(&now_ms()), "{\"item_id\": 1}").await;
        assert_eq!(status, 401, "{detail}: {json}");
        assert_eq!(json["code"], "unauthorized");
        assert!(json["detail"].as_str().unwrap().contains(detail), "{json}");
    }
    server.stop().await;
}

#[tokio::test]
async fn the_sale_answers_win_duplicate_sold_out_and_window() {
    let env = TestEnv::new("answers").await;
    let server = env.server(ALL_ROLES).await;
    env.item(7, 2).on_sale(&server).await;

    let (status, first) = env.buy(&server, 1, 7).await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["code"], "queued");
    assert_eq!(first["item_id"], 7);
    let sn = first["order_sn"].as_str().unwrap().to_owned();
    assert!(sn.len() <= 40);

    // The same user again: 409 with the order they hold.
    let (status, again) = env.buy(&server, 1, 7).await;
    assert_eq!((status, again["code"].as_str()), (409, Some("duplicate")));
    assert_eq!(again["order_sn"], sn.as_str());

    let (status, second) = env.buy(&server, 2, 7).await;
    assert_eq!(status, 202, "{second}");
    let (status, third) = env.buy(&server, 3, 7).await;
    assert_eq!((status, third["code"].as_str()), (410, Some("sold_out")));

    // Unknown item; a sale in the future; a sale in the past.
    let (status, json) = env.buy(&server, 4, 999).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (404, Some("item_not_found"))
    );
    let now = Utc::now();
    env.item(8, 5)
        .window(
            now + chrono::Duration::hours(1),
            now + chrono::Duration::hours(2),
        )
        .put(&server)
        .await;
    env.warmup(&server, 8).await;
    let (status, json) = env.buy(&server, 4, 8).await;
    assert_eq!((status, json["code"].as_str()), (403, Some("not_started")));
    env.item(9, 5)
        .window(
            now - chrono::Duration::hours(2),
            now - chrono::Duration::hours(1),
        )
        .put(&server)
        .await;
    let (status, json) = env.buy(&server, 4, 9).await;
    assert_eq!((status, json["code"].as_str()), (403, Some("ended")));

    // The orders reach MySQL; the owner reads them, nobody else does.
    env.wait_for_orders(&server, 7, 2, Duration::from_secs(20))
        .await;
    let won = vec![sn.clone(), second["order_sn"].as_str().unwrap().to_owned()];
    env.assert_invariants(&server, 7, 2, &won).await;
    let (_, order) = env
        .get(&server, &format!("/api/orders/{sn}"), Some(1))
        .await;
    assert_eq!(order["status"], "unpaid", "{order}");
    assert_eq!(order["user_id"], 1);
    assert_eq!(order["item_id"], 7);
    for (user, path) in [
        (2, format!("/api/orders/{sn}")),
        (1, "/api/orders/7-01ARZ3NDEKTSV4RRFFQ69G5FAV".to_owned()),
        (1, "/api/orders/not-an-order".to_owned()),
    ] {
        let (status, json) = env.get(&server, &path, Some(user)).await;
        assert_eq!(
            (status, json["code"].as_str()),
            (404, Some("order_not_found")),
            "{path}"
        );
    }

    let (_, item) = env.get(&server, "/api/items/7", None).await;
    assert_eq!(item["status"], "sold_out", "{item}");
    assert_eq!(
        (item["total"].as_u64(), item["remaining"].as_u64()),
        (Some(2), Some(0))
    );
    server.stop().await;
}

/// In Redis a buyer who already holds the item's `per_user` orders is answered from their
/// record first, before the sale's state (contract section 8): a sale paused in Redis
/// behind the catalogue's back still tells them `409` with their order, while anyone else
/// hears `503 paused` from the script, and nothing is taken.
#[tokio::test]
async fn a_buyer_at_their_limit_hears_409_first_whatever_redis_says_of_the_sale() {
    let env = TestEnv::new("holder_first").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 5).on_sale(&server).await;
    let (status, won) = env.buy(&server, 1, 1).await;
    assert_eq!(status, 202, "{won}");
    env.set_meta(1, &[("paused", "1")]).await;

    let (status, again) = env.buy(&server, 1, 1).await;
    assert_eq!(
        (status, again["code"].as_str(), again["order_sn"].as_str()),
        (409, Some("duplicate"), won["order_sn"].as_str()),
        "{again}"
    );
    // User 1's order landed: only the presses below could move the stock.
    env.wait_for_orders(&server, 1, 1, Duration::from_secs(10))
        .await;
    let (status, other) = env.takes_nothing(1, env.buy(&server, 2, 1)).await;
    assert_eq!(
        (status, other["code"].as_str()),
        (503, Some("paused")),
        "{other}"
    );
    assert_eq!(env.remaining(1).await, 4, "units taken while paused");

    env.set_meta(1, &[("paused", "0")]).await;
    assert_eq!(env.buy(&server, 2, 1).await.0, 202);
    server.stop().await;
}

#[tokio::test]
async fn a_pending_order_reads_as_pending() {
    let env = TestEnv::new("pending").await;
    // No consumer: the order stays on its way to MySQL.
    let server = env.server(&[seckill::Role::Api]).await;
    env.item(1, 3).on_sale(&server).await;
    let (_, won) = env.buy(&server, 5, 1).await;
    let sn = won["order_sn"].as_str().unwrap();
    let (_, order) = env
        .get(&server, &format!("/api/orders/{sn}"), Some(5))
        .await;
    assert_eq!(order["status"], "pending", "{order}");
    assert_eq!(env.stats(&server, 1).await["pending"], 1);
    server.stop().await;
}

#[tokio::test]
async fn rate_limits_answer_429_with_retry_after() {
    let env = TestEnv::new("ratelimit").await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.rate_per_user = 1;
            s.rate_per_ip = 0;
        })
        .await;
    env.item(1, 100).on_sale(&server).await;
    // A burst of twice the rate passes (a win, then a duplicate); the next is refused.
    for expected in [202, 409] {
        assert_eq!(env.buy(&server, 1, 1).await.0, expected);
    }
    let response = env.purchase(&server, 1, 1).send().await.unwrap();
    assert_eq!(response.status(), 429);
    assert!(response.headers().contains_key("retry-after"));
    let json: Value = response.json().await.unwrap();
    assert_eq!(json["code"], "rate_limited");
    server.stop().await;

    // Per IP: the peer is loopback, a trusted proxy, so X-Forwarded-For names the client.
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.rate_per_user = 0;
            s.rate_per_ip = 1;
        })
        .await;
    let mut statuses = Vec::new();
    for user in 10..14 {
        let response = env
            .purchase(&server, user, 1)
            .header("x-forwarded-for", "203.0.113.7")
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [202, 202, 429, 429]);
    let status = env
        .purchase(&server, 20, 1)
        .header("x-forwarded-for", "203.0.113.8")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 202, "another client IP has its own allowance");
    server.stop().await;
}

#[tokio::test]
async fn a_paused_sale_answers_503_paused_until_resumed() {
    let env = TestEnv::new("paused").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 5).on_sale(&server).await;
    let paused = env
        .admin(reqwest::Method::POST, &server, "/admin/items/1/pause")
        .send()
        .await
        .unwrap();
    assert_eq!(paused.status(), 200);
    let response = env
        .takes_nothing(1, env.purchase(&server, 1, 1).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(response.json::<Value>().await.unwrap()["code"], "paused");
    let (_, item) = env.get(&server, "/api/items/1", None).await;
    assert_eq!(item["status"], "paused");

    env.admin(reqwest::Method::POST, &server, "/admin/items/1/resume")
        .send()
        .await
        .unwrap();
    let (status, json) = env.buy(&server, 1, 1).await;
    assert_eq!(status, 202, "{json}");
    server.stop().await;
}

#[tokio::test]
async fn every_answer_is_json_with_a_request_id() {
    let env = TestEnv::new("reqid").await;
    let server = env.server(ALL_ROLES).await;
    let response = env
        .http
        .get(server.url("/api/items/12345"))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(response.headers()["x-request-id"], "abc-123");
    let json: Value = response.json().await.unwrap();
    assert_eq!(
        (json["code"].as_str(), json["trace_id"].as_str()),
        (Some("item_not_found"), Some("abc-123"))
    );

    let response = env
        .http
        .get(server.url("/no/such/route"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let id = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let json: Value = response.json().await.unwrap();
    assert_eq!(json["trace_id"], id.as_str());
    assert_eq!(json["code"], "not_found");

    // A wrong method: JSON too, and the methods that would do.
    let response = env
        .http
        .get(server.url("/api/flashbuy"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "POST");
    let json: Value = response.json().await.unwrap();
    assert_eq!(json["code"], "method_not_allowed");
    assert!(json["trace_id"].is_string());
    server.stop().await;
}

/// `GET /api/items/{id}/my-order`: a buyer who lost their `202` finds the order — while
/// it is pending, once it is in MySQL, after the sell-out, and after cancelling it (the
/// latest); a user without one hears `404`; it is limited like purchases.
#[tokio::test]
async fn my_order_finds_the_buyers_order_whatever_became_of_the_answer() {
    let env = TestEnv::new("myorder").await;
    // No consumer yet: the order stays pending.
    let api = env
        .server_with(&[Role::Api, Role::Scheduler], |s| s.rate_per_user = 2)
        .await;
    env.item(1, 1).on_sale(&api).await;
    let (_, won) = env.buy(&api, 1, 1).await;
    let sn = won["order_sn"].as_str().unwrap().to_owned();
    let (status, json) = env.get(&api, "/api/items/1/my-order", Some(1)).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(
        (
            json["order_sn"].as_str(),
            json["status"].as_str(),
            json["user_id"].as_u64()
        ),
        (Some(sn.as_str()), Some("pending"), Some(1)),
        "{json}"
    );
    // Sold out (another buyer found it so): pressing again says 410, but the order is there.
    assert_eq!(env.buy(&api, 5, 1).await.0, 410);
    assert_eq!(env.buy(&api, 1, 1).await.0, 410);
    let (status, json) = env.get(&api, "/api/items/1/my-order", Some(2)).await;
    assert_eq!(
        (status, json["code"].as_str()),
        (404, Some("order_not_found")),
        "{json}"
    );
    assert_eq!(env.get(&api, "/api/items/1/my-order", None).await.0, 401);
    // Limited like a purchase (2/s, bursts of 4), on a budget of its own.
    let answers =
        futures::future::join_all((0..8).map(|_| env.get(&api, "/api/items/1/my-order", Some(3))))
            .await;
    assert!(answers.iter().any(|(s, _)| *s == 429), "{answers:?}");

    let consumer = env.server(&[Role::Consumer]).await;
    env.wait_for_orders(&api, 1, 1, Duration::from_secs(10))
        .await;
    let (_, json) = env.get(&api, "/api/items/1/my-order", Some(1)).await;
    assert_eq!(
        (json["order_sn"].as_str(), json["status"].as_str()),
        (Some(sn.as_str()), Some("unpaid"))
    );
    let (status, _) = env
        .post_as(&api, &format!("/api/orders/{sn}/cancel"), 1)
        .await;
    assert_eq!(status, 200);
    let (_, json) = env.get(&api, "/api/items/1/my-order", Some(1)).await;
    assert_eq!(
        (json["order_sn"].as_str(), json["status"].as_str()),
        (Some(sn.as_str()), Some("cancelled"))
    );
    consumer.stop().await;
    api.stop().await;
}
