//! Payments by signed events (docs/contract.md, "Payments"): only the party that took the
//! money marks an order paid; its events are signed, recorded once, and follow the rules
//! for repeats, mismatches, late payments and refunds — against the real services.

use std::time::Duration;

use lapin::options::BasicGetOptions;
use seckill::Role;
use seckill::config::{LatePayment, Payments, Secret};
use serde_json::{Value, json};

use crate::history::quiet;
use crate::support::*;

/// Buys one unit for `user` and waits until its order is in MySQL: its number.
async fn bought(env: &TestEnv, server: &TestServer, user: u64, item: u64) -> String {
    let (status, body) = env.buy(server, user, item).await;
    assert_eq!(status, 202, "user {user}: {body}");
    let sn = body["order_sn"].as_str().unwrap().to_owned();
    eventually(Duration::from_secs(10), "the order in MySQL", || async {
        env.order_status(&sn)
            .await
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    sn
}

/// Sends `body` (raw) with the signature header `header`.
async fn send_raw(
    env: &TestEnv,
    server: &TestServer,
    header: Option<String>,
    body: String,
) -> (u16, Value) {
    let mut request = env
        .http
        .post(server.url("/api/payments/events"))
        .header("Content-Type", "application/json")
        .body(body);
    if let Some(header) = header {
        request = request.header(seckill::testing::PAYMENT_SIGNATURE, header);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn events_recorded(env: &TestEnv) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM payment_events")
        .fetch_one(&env.db)
        .await
        .unwrap()
}

fn code(answer: &(u16, Value)) -> (u16, Option<&str>) {
    (answer.0, answer.1["code"].as_str())
}

/// The buyer's `pay` is a checkout and pays nothing; only a signed event pays. Everything
/// else — no signature, a wrong secret, an old or future time, a body altered by one byte
/// after signing — is `401`, recorded nowhere, counted; secrets rotate.
#[tokio::test]
async fn only_a_signed_event_pays_and_anything_else_changes_nothing() {
    let env = TestEnv::new("pay_signed").await;
    let rotated = |s: &mut seckill::Settings| {
        s.payment_secret = vec![Secret::new("old-secret"), Secret::new("new-secret")];
    };
    let server = env.server_with(&[Role::Api, Role::Consumer], rotated).await;
    env.item(1, 5).on_sale(&server).await;
    let sn = bought(&env, &server, 1, 1).await;

    let (status, checkout) = env
        .post_as(&server, &format!("/api/orders/{sn}/pay"), 1)
        .await;
    assert_eq!(
        (status, checkout["code"].as_str()),
        (200, Some("checkout")),
        "{checkout}"
    );
    assert_eq!(checkout["amount_cents"], 1999, "{checkout}");
    assert_eq!(checkout["currency"], "CNY", "{checkout}");
    assert_eq!(checkout["payment_ref"], format!("pay-{sn}"), "{checkout}");
    assert!(checkout["pay_deadline"].is_string(), "{checkout}");
    assert_eq!(
        env.order_status(&sn).await.as_deref(),
        Some("unpaid"),
        "checkout paid nothing"
    );
    let (status, other) = env
        .post_as(&server, &format!("/api/orders/{sn}/pay"), 2)
        .await;
    assert_eq!(
        (status, other["code"].as_str()),
        (404, Some("order_not_found")),
        "{other}"
    );

    let event = env.payment("payment.succeeded", &sn);
    let body = event.to_string();
    let now = chrono::Utc::now().timestamp();
    let sign = |secret: &str, t: i64, body: &str| {
        Some(seckill::testing::sign_payment(secret, t, body.as_bytes()))
    };
    let mut altered = body.clone().into_bytes();
    let at = body.find("1999").unwrap();
    altered[at] = b'2';
    let altered = String::from_utf8(altered).unwrap();
    for (what, header, body) in [
        ("no signature", None, body.clone()),
        ("a wrong secret", sign("guessed", now, &body), body.clone()),
        (
            "301 s old",
            sign("new-secret", now - 301, &body),
            body.clone(),
        ),
        (
            "301 s ahead",
            sign("new-secret", now + 301, &body),
            body.clone(),
        ),
        ("one byte altered", sign("new-secret", now, &body), altered),
        ("a malformed header", Some("v1=00".to_owned()), body.clone()),
    ] {
        let answer = send_raw(&env, &server, header, body).await;
        assert_eq!(
            code(&answer),
            (401, Some("unauthorized")),
            "{what}: {}",
            answer.1
        );
        assert_eq!(
            env.order_status(&sn).await.as_deref(),
            Some("unpaid"),
            "{what}"
        );
    }
    assert_eq!(
        events_recorded(&env).await,
        0,
        "a refused event is recorded nowhere"
    );
    let response = env.http.get(server.url("/metrics")).send().await.unwrap();
    let metrics = response.text().await.unwrap();
    let namespace = format!("namespace=\"{}\"", env.settings.namespace);
    for reason in ["missing", "mismatch", "stale", "malformed"] {
        assert!(
            metrics.lines().any(
                |l| l.starts_with("seckill_payment_signature_failures_total")
                    && l.contains(&namespace)
                    && l.contains(&format!("reason=\"{reason}\""))
            ),
            "no failure counted for {reason}"
        );
    }

    // Either secret of the rotation signs; the same event again changes nothing.
    let old = send_raw(&env, &server, sign("old-secret", now, &body), body.clone()).await;
    assert_eq!(code(&old), (200, Some("paid")), "{}", old.1);
    assert_eq!(old.1["repeat"], false, "{}", old.1);
    let again = send_raw(&env, &server, sign("new-secret", now, &body), body.clone()).await;
    assert_eq!(code(&again), (200, Some("paid")), "{}", again.1);
    assert_eq!(again.1["repeat"], true, "{}", again.1);
    assert_eq!(events_recorded(&env).await, 1);
    assert_eq!(env.order_status(&sn).await.as_deref(), Some("paid"));
    let (status, paid) = env
        .post_as(&server, &format!("/api/orders/{sn}/pay"), 1)
        .await;
    assert_eq!(
        (status, paid["code"].as_str()),
        (409, Some("order_paid")),
        "{paid}"
    );
    // A body that is no event, well signed: 400 naming the field, nothing recorded.
    let bad = json!({"event_id": "e", "type": "payment.maybe"}).to_string();
    let answer = send_raw(&env, &server, sign("new-secret", now, &bad), bad).await;
    assert_eq!(code(&answer), (400, Some("bad_request")), "{}", answer.1);
    assert_eq!(events_recorded(&env).await, 1);
    env.assert_invariants(&server, 1, 5, std::slice::from_ref(&sn))
        .await;
    server.stop().await;
}

/// Repeats, events out of order, a wrong amount, a failure, a second charge and refunds:
/// each recorded once with what it did, the stock adding up throughout.
#[tokio::test]
async fn repeats_mismatches_refunds_and_second_charges_follow_their_rules() {
    let env = TestEnv::new("pay_rules").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    env.item(1, 5).on_sale(&server).await;
    let sn = bought(&env, &server, 1, 1).await;
    let remaining = env.remaining(1).await;

    // A charge's refund first (out of order): nothing to refund under it yet — and when
    // the charge itself is told of after, it was returned already: the order unpaid.
    let mut refund = env.payment("payment.refunded", &sn);
    refund["provider_ref"] = json!(format!("ch_early_{sn}"));
    let answer = env.payment_event(&server, &refund).await;
    assert_eq!(code(&answer), (200, Some("ignored")), "{}", answer.1);
    let mut early = env.payment("payment.succeeded", &sn);
    early["provider_ref"] = refund["provider_ref"].clone();
    let answer = env.payment_event(&server, &early).await;
    assert_eq!(
        code(&answer),
        (200, Some("already_refunded")),
        "{}",
        answer.1
    );
    assert_eq!(env.order_status(&sn).await.as_deref(), Some("unpaid"));
    // A wrong amount, a wrong currency: 422, recorded, the order unchanged.
    let mut cheap = env.payment("payment.succeeded", &sn);
    cheap["amount_cents"] = json!(1);
    cheap["provider_ref"] = json!(format!("ch_cheap_{sn}"));
    let answer = env.payment_event(&server, &cheap).await;
    assert_eq!(
        code(&answer),
        (422, Some("amount_mismatch")),
        "{}",
        answer.1
    );
    let mut euros = env.payment("payment.succeeded", &sn);
    euros["currency"] = json!("EUR");
    euros["provider_ref"] = json!(format!("ch_eur_{sn}"));
    let answer = env.payment_event(&server, &euros).await;
    assert_eq!(
        code(&answer),
        (422, Some("amount_mismatch")),
        "{}",
        answer.1
    );
    let answer = env.payment_event(&server, &cheap).await;
    assert_eq!(
        code(&answer),
        (422, Some("amount_mismatch")),
        "the repeat: {}",
        answer.1
    );
    assert_eq!(answer.1["repeat"], true);
    let failed = env.payment("payment.failed", &sn);
    let answer = env.payment_event(&server, &failed).await;
    assert_eq!(code(&answer), (200, Some("noted")), "{}", answer.1);
    assert_eq!(env.order_status(&sn).await.as_deref(), Some("unpaid"));

    let paid = env.payment("payment.succeeded", &sn);
    assert_eq!(
        code(&env.payment_event(&server, &paid).await),
        (200, Some("paid"))
    );
    // The same charge under another event id: nothing more.
    let mut same_charge = env.payment("payment.succeeded", &sn);
    same_charge["provider_ref"] = paid["provider_ref"].clone();
    let answer = env.payment_event(&server, &same_charge).await;
    assert_eq!(code(&answer), (200, Some("already_paid")), "{}", answer.1);
    // A second charge: owed back, listed until the provider reports it refunded.
    let mut second = env.payment("payment.succeeded", &sn);
    second["provider_ref"] = json!(format!("ch_second_{sn}"));
    let answer = env.payment_event(&server, &second).await;
    assert_eq!(code(&answer), (200, Some("charged_twice")), "{}", answer.1);
    // Owed back: the two charges of the wrong amount, and the second charge.
    let owed = |due: &Value| -> Vec<(String, String)> {
        due["charges"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let text = |field: &str| c[field].as_str().unwrap_or_default().to_owned();
                (text("reason"), text("provider_ref"))
            })
            .collect()
    };
    let (_, due) = env.admin_get(&server, "/admin/payments/refunds-due").await;
    let second_ref = second["provider_ref"].as_str().unwrap().to_owned();
    assert_eq!(owed(&due).len(), 3, "{due}");
    assert!(
        owed(&due).contains(&("charged_twice".to_owned(), second_ref)),
        "{due}"
    );
    let mut second_back = env.payment("payment.refunded", &sn);
    second_back["provider_ref"] = second["provider_ref"].clone();
    let answer = env.payment_event(&server, &second_back).await;
    assert_eq!(code(&answer), (200, Some("settled")), "{}", answer.1);
    let (_, due) = env.admin_get(&server, "/admin/payments/refunds-due").await;
    assert_eq!(owed(&due).len(), 2, "{due}");
    assert!(
        owed(&due).iter().all(|(why, _)| why == "amount_mismatch"),
        "{due}"
    );
    assert_eq!(env.order_status(&sn).await.as_deref(), Some("paid"));

    // A partial refund is recorded, not acted on; the rest of the price, refunded after
    // it, makes the whole, which returns the unit.
    let mut part = env.payment("payment.refunded", &sn);
    part["amount_cents"] = json!(500);
    let answer = env.payment_event(&server, &part).await;
    assert_eq!(code(&answer), (200, Some("partial_refund")), "{}", answer.1);
    assert_eq!(env.remaining(1).await, remaining);
    let answer = env.payment_event(&server, &refund).await;
    assert_eq!(
        code(&answer),
        (200, Some("ignored")),
        "the early refund again: {}",
        answer.1
    );
    let mut rest = env.payment("payment.refunded", &sn);
    rest["amount_cents"] = json!(1999 - 500);
    let answer = env.payment_event(&server, &rest).await;
    assert_eq!(code(&answer), (200, Some("refunded")), "{}", answer.1);
    assert_eq!(env.order_status(&sn).await.as_deref(), Some("refunded"));
    assert_eq!(
        env.remaining(1).await,
        remaining + 1,
        "the unit back on sale"
    );
    let (status, shown) = env
        .get(&server, &format!("/api/orders/{sn}"), Some(1))
        .await;
    assert_eq!(
        (status, shown["status"].as_str()),
        (200, Some("refunded")),
        "{shown}"
    );
    // The buyer may buy again: the refunded order holds no unit.
    let again = bought(&env, &server, 1, 1).await;
    assert_eq!(events_recorded(&env).await, 11);
    let stats = env.stats(&server, 1).await;
    assert_eq!(stats["orders"]["refunded"], 1, "{stats}");
    env.assert_invariants(&server, 1, 5, &[sn, again]).await;
    server.stop().await;
}

/// Under `honour` (the default), a payment for an order its deadline cancelled takes a
/// unit again while one is on sale (`revived`: paid), and is owed back once none is
/// (`refund_due`: listed, announced on RabbitMQ through the outbox, shown to the buyer).
#[tokio::test]
async fn a_late_payment_is_honoured_while_a_unit_is_left_and_owed_back_after() {
    let env = TestEnv::new("pay_late").await;
    let (_conn, channel, queue) = listen_for_events(&env, "refund-due", "order.refund_due").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 2).paying_within(1).on_sale(&server).await;
    let late_one = bought(&env, &server, 1, 1).await;
    let late_two = bought(&env, &server, 2, 1).await;
    eventually(
        Duration::from_secs(15),
        "both cancelled, units back",
        || async {
            let one = env.order_status(&late_one).await;
            let two = env.order_status(&late_two).await;
            match (one.as_deref(), two.as_deref(), env.remaining(1).await) {
                (Some("cancelled"), Some("cancelled"), 2) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    // The units back clear "sold out" on every instance within a second: pressed again.
    let third = eventually(
        Duration::from_secs(5),
        "user 3 buys a unit back",
        || async {
            match env.buy(&server, 3, 1).await {
                (202, body) => Ok(body["order_sn"].as_str().unwrap_or_default().to_owned()),
                (status, body) => Err(format!("{status} {body}")),
            }
        },
    )
    .await;
    env.wait_for_orders(&server, 1, 3, Duration::from_secs(10))
        .await;

    let answer = env.pay(&server, &late_one).await;
    assert_eq!(code(&answer), (200, Some("revived")), "{}", answer.1);
    assert_eq!(env.order_status(&late_one).await.as_deref(), Some("paid"));
    assert_eq!(env.remaining(1).await, 0);
    let answer = env.pay(&server, &late_two).await;
    assert_eq!(code(&answer), (200, Some("refund_due")), "{}", answer.1);
    assert_eq!(
        env.order_status(&late_two).await.as_deref(),
        Some("refund_due")
    );
    let (status, shown) = env
        .get(&server, &format!("/api/orders/{late_two}"), Some(2))
        .await;
    assert_eq!(
        (status, shown["status"].as_str()),
        (200, Some("refund_due")),
        "{shown}"
    );
    let (_, due) = env.admin_get(&server, "/admin/payments/refunds-due").await;
    assert_eq!(due["charges"][0]["order_sn"], late_two, "{due}");
    assert_eq!(due["charges"][0]["reason"], "refund_due", "{due}");
    // The same charge told of again (another event id): owed once.
    let again = env.payment("payment.succeeded", &late_two);
    let answer = env.payment_event(&server, &again).await;
    assert_eq!(
        code(&answer),
        (200, Some("already_recorded")),
        "{}",
        answer.1
    );
    // Part of it returned: recorded, still owed.
    let mut part = env.payment("payment.refunded", &late_two);
    part["amount_cents"] = json!(1);
    let answer = env.payment_event(&server, &part).await;
    assert_eq!(code(&answer), (200, Some("partial_refund")), "{}", answer.1);
    let (_, due) = env.admin_get(&server, "/admin/payments/refunds-due").await;
    assert_eq!(due["charges"].as_array().map(Vec::len), Some(1), "{due}");
    let announced = eventually(Duration::from_secs(10), "order.refund_due sent", || async {
        let got = channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap();
        got.map(|m| serde_json::from_slice::<Value>(&m.data).unwrap())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;
    assert_eq!(announced["order_sn"], late_two, "{announced}");
    assert_eq!(announced["amount_cents"], 1999, "{announced}");
    let outbox: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM event_outbox")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(outbox, 0, "sent and confirmed: gone from the outbox");
    // The operator refunds the rest with the provider: the parts make the whole, off the
    // list, the order refunded.
    let mut rest = env.payment("payment.refunded", &late_two);
    rest["amount_cents"] = json!(1999 - 1);
    let answer = env.payment_event(&server, &rest).await;
    assert_eq!(code(&answer), (200, Some("settled")), "{}", answer.1);
    assert_eq!(
        env.order_status(&late_two).await.as_deref(),
        Some("refunded")
    );
    let stats = env.stats(&server, 1).await;
    assert_eq!(stats["remaining"], 0, "{stats}");
    assert_eq!(stats["orders"]["paid"], 1, "{stats}");
    assert_eq!(stats["orders"]["unpaid"], 1, "{stats}");
    env.assert_invariants(&server, 1, 2, &[late_one, late_two, third])
        .await;
    server.stop().await;
}

/// Under `refund`, every late payment is owed back: one for an order already cancelled
/// (no unit taken), and one for an order past its deadline that no scheduler cancelled
/// yet (its unit goes back now).
#[tokio::test]
async fn under_the_refund_rule_a_late_payment_is_owed_back_and_takes_no_unit() {
    let env = TestEnv::new("pay_refund_rule").await;
    let refund = |s: &mut seckill::Settings| s.late_payment = LatePayment::Refund;
    let api = env.server_with(&[Role::Api, Role::Consumer], refund).await;
    env.item(1, 3).paying_within(1).on_sale(&api).await;
    let overdue = bought(&env, &api, 1, 1).await;
    let cancelled = bought(&env, &api, 2, 1).await;
    let (status, body) = env
        .post_as(&api, &format!("/api/orders/{cancelled}/cancel"), 2)
        .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(env.remaining(1).await, 2);

    let answer = env.pay(&api, &overdue).await;
    assert_eq!(code(&answer), (200, Some("refund_due")), "{}", answer.1);
    assert_eq!(
        env.order_status(&overdue).await.as_deref(),
        Some("refund_due")
    );
    assert_eq!(env.remaining(1).await, 3, "its unit back on sale");
    let answer = env.pay(&api, &cancelled).await;
    assert_eq!(code(&answer), (200, Some("refund_due")), "{}", answer.1);
    assert_eq!(env.remaining(1).await, 3, "no unit taken");
    let (_, due) = env.admin_get(&api, "/admin/payments/refunds-due").await;
    assert_eq!(due["charges"].as_array().map(Vec::len), Some(2), "{due}");
    env.assert_invariants(&api, 1, 3, &[overdue, cancelled])
        .await;
    api.stop().await;
}

/// A payment for an order still on its way to MySQL (the consumer down) lands the order
/// first and pays it; a charge for no known order is recorded and owed back until
/// refunds naming it add up to it.
#[tokio::test]
async fn a_payment_for_an_order_on_its_way_pays_it_and_one_for_no_order_is_owed_back() {
    let env = TestEnv::new("pay_pending").await;
    let api = env.server(&[Role::Api]).await;
    env.item(1, 3).on_sale(&api).await;
    let (status, body) = env.buy(&api, 1, 1).await;
    assert_eq!(status, 202, "{body}");
    let sn = body["order_sn"].as_str().unwrap().to_owned();
    let answer = env.pay(&api, &sn).await;
    assert_eq!(code(&answer), (200, Some("paid")), "{}", answer.1);
    assert_eq!(env.order_status(&sn).await.as_deref(), Some("paid"));

    let nobody = format!("1-{}", ulid::Ulid::new());
    let answer = env.pay(&api, &nobody).await;
    assert_eq!(
        code(&answer),
        (404, Some("order_not_found")),
        "{}",
        answer.1
    );
    let (_, due) = env.admin_get(&api, "/admin/payments/refunds-due").await;
    assert_eq!(due["charges"][0]["reason"], "order_not_found", "{due}");
    // The operator returns that charge (in two parts): settled, off the list. A refund
    // naming no charge owed and no order is recorded as for no order.
    let mut part = env.payment("payment.refunded", &nobody);
    part["amount_cents"] = json!(999);
    let answer = env.payment_event(&api, &part).await;
    assert_eq!(code(&answer), (200, Some("partial_refund")), "{}", answer.1);
    let (_, due) = env.admin_get(&api, "/admin/payments/refunds-due").await;
    assert_eq!(due["charges"].as_array().map(Vec::len), Some(1), "{due}");
    let mut rest = env.payment("payment.refunded", &nobody);
    rest["amount_cents"] = json!(1999 - 999);
    let answer = env.payment_event(&api, &rest).await;
    assert_eq!(code(&answer), (200, Some("settled")), "{}", answer.1);
    let (_, due) = env.admin_get(&api, "/admin/payments/refunds-due").await;
    assert_eq!(due["charges"].as_array().map(Vec::len), Some(0), "{due}");
    let stray = env.payment("payment.refunded", &format!("1-{}", ulid::Ulid::new()));
    let answer = env.payment_event(&api, &stray).await;
    assert_eq!(
        code(&answer),
        (404, Some("order_not_found")),
        "{}",
        answer.1
    );
    let consumer = env.server(&[Role::Consumer]).await;
    env.wait_for_orders(&api, 1, 1, Duration::from_secs(10))
        .await;
    env.assert_invariants(&api, 1, 3, &[sn]).await;
    consumer.stop().await;
    api.stop().await;
}

/// `SECKILL_PAYMENTS=trust_buyer` brings the buyer's own `pay` back for development, and
/// refuses to start beside a real JWT secret.
#[tokio::test]
async fn trusting_the_buyer_runs_only_on_the_development_secret() {
    let env = TestEnv::new("pay_trust").await;
    let mut settings = env.settings.clone();
    settings.payments = Payments::TrustBuyer;
    let refused = seckill::Server::build(settings, &[Role::Api]).await;
    let why = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        why.contains("trust_buyer"),
        "started with a real JWT secret: {why}"
    );
}

/// `seckill pay` signs and sends a `payment.succeeded` for the item's price, as a
/// provider would.
#[tokio::test]
async fn seckill_pay_pays_an_order_as_a_provider_would() {
    let env = TestEnv::new("pay_cli").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    env.item(1, 2).on_sale(&server).await;
    let sn = bought(&env, &server, 1, 1).await;
    // Awaited, not blocking: the server answering it runs on this test's runtime.
    let pay = |order: &str| {
        let mut command = tokio::process::Command::from(seckill(&env));
        command.args(["pay", "--order", order, "--url", &server.url("")]);
        command
    };
    let output = pay(&sn).output().await.unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        said.starts_with("200 ") && said.contains("\"paid\""),
        "{said}"
    );
    assert_eq!(env.order_status(&sn).await.as_deref(), Some("paid"));
    let output = pay("nonsense").output().await.unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("not an order number"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    server.stop().await;
}

/// Sends a payment event until it is answered other than `503` (as a provider retries).
async fn pay_until_answered(env: &TestEnv, server: &TestServer, event: &Value) -> (u16, Value) {
    for _ in 0..40 {
        let answer = env.payment_event(server, event).await;
        if answer.0 != 503 {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.payment_event(server, event).await
}

/// 1,000 orders paid at their deadline: each payment races the deadline's cancel, half of
/// them their buyer's cancel too, and 300 newcomers buy the units coming back meanwhile.
/// Every order ends exactly one way — paid (in time, or revived late) or owed back — its
/// answers saying the same, every event recorded once, and the stock adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_payments_racing_deadlines_and_cancels_each_end_one_way() {
    use futures::StreamExt;
    let env = TestEnv::new("pay_burst").await;
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    env.item(1, 1000).paying_within(3).on_sale(&server).await;
    let won: Vec<(u64, String)> = futures::stream::iter(1..=1000u64)
        .map(|user| {
            let (env, server) = (&env, &server);
            async move {
                let (status, body) = env.buy(server, user, 1).await;
                assert_eq!(status, 202, "user {user}: {body}");
                (user, body["order_sn"].as_str().unwrap().to_owned())
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    env.wait_for_orders(&server, 1, 1000, Duration::from_secs(30))
        .await;
    let deadline: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT MIN(pay_deadline) FROM orders WHERE item_id = 1")
            .fetch_one(&env.db)
            .await
            .unwrap();
    let start = (deadline - chrono::Utc::now() - chrono::Duration::milliseconds(300))
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(start).await;

    let payments = futures::stream::iter(won.clone())
        .map(|(user, sn)| {
            let (env, server) = (&env, &server);
            async move {
                let event = env.payment("payment.succeeded", &sn);
                let cancel = async {
                    if user % 2 == 0 {
                        let path = format!("/api/orders/{sn}/cancel");
                        Some(env.post_as(server, &path, user).await.0)
                    } else {
                        None
                    }
                };
                let (paid, cancelled) =
                    tokio::join!(pay_until_answered(env, server, &event), cancel);
                (sn, paid, cancelled)
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>();
    let newcomers = futures::stream::iter(2001..=2300u64)
        .map(|user| {
            let (env, server) = (&env, &server);
            async move {
                tokio::time::sleep(Duration::from_millis(user % 50 * 40)).await;
                let (status, body) = env.buy(server, user, 1).await;
                (status, body["order_sn"].as_str().map(str::to_owned))
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>();
    let (outcomes, bought) = tokio::join!(payments, newcomers);

    let mut ways: std::collections::BTreeMap<String, u64> = Default::default();
    for (sn, (status, body), cancel) in &outcomes {
        let code = body["code"].as_str().unwrap_or_default();
        let stored = env.order_status(sn).await.unwrap_or_default();
        let expected = match (*status, code, cancel) {
            (200, "paid", None | Some(409 | 503)) | (200, "revived", _) => "paid",
            (200, "refund_due", _) => "refund_due",
            other => panic!("order {sn}: the payment and the cancel answered {other:?}"),
        };
        assert_eq!(stored, expected, "order {sn}: {code}, cancel {cancel:?}");
        *ways
            .entry(format!("{code}, cancel {cancel:?}"))
            .or_default() += 1;
    }
    let (refused, sold): (Vec<_>, Vec<_>) = bought.iter().partition(|(status, _)| *status == 410);
    eprintln!(
        "1,000 payments at the deadline: {ways:?}; newcomers: {} bought, {} sold out",
        sold.len(),
        refused.len()
    );
    let events: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payment_events")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(events, 1000, "every event recorded once");
    let owed: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM orders WHERE item_id = 1 AND status = 'refund_due'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    let (_, due) = env.admin_get(&server, "/admin/payments/refunds-due").await;
    assert_eq!(
        due["charges"].as_array().map(Vec::len),
        Some(owed as usize),
        "{due}"
    );
    let mut all: Vec<String> = won.into_iter().map(|(_, sn)| sn).collect();
    for (status, sn) in &bought {
        match (status, sn) {
            (202, Some(sn)) => all.push(sn.clone()),
            (410, None) => {}
            other => panic!("a newcomer heard {other:?}"),
        }
    }
    // The newcomers' orders go unpaid: the check waits for their deadlines, as one
    // cancelled between its read of MySQL and its read of Redis would count twice.
    eventually(
        Duration::from_secs(30),
        "the newcomers' orders timed out",
        || async {
            let unpaid: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM orders WHERE item_id = 1 AND status = 'unpaid'",
            )
            .fetch_one(&env.db)
            .await
            .map_err(|e| e.to_string())?;
            if unpaid == 0 {
                Ok(())
            } else {
                Err(format!("{unpaid} unpaid"))
            }
        },
    )
    .await;
    quiet(&env, &server, 1, &amqp_url(), Duration::from_secs(30)).await;
    env.assert_invariants(&server, 1, 1000, &all).await;
    server.stop().await;
}

/// Sends `events` at `first` (32 at once), and whatever it did not answer — its process
/// killed after `kill_after` answers — to `then`, as a provider retries: every answer in
/// the end (a transport failure or a `503` is sent again).
async fn stream_through_a_kill(
    env: &TestEnv,
    events: &[Value],
    first: &TestServer,
    then: &TestServer,
    kill_after: u64,
    doomed: &mut std::process::Child,
) -> Vec<(u16, Value)> {
    use futures::StreamExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    let answered = AtomicU64::new(0);
    let killed = std::sync::atomic::AtomicBool::new(false);
    let send = |event: &Value| {
        let (answered, killed) = (&answered, &killed);
        let event = event.clone();
        async move {
            for attempt in 0..100 {
                let at = if attempt == 0 && !killed.load(Ordering::Relaxed) {
                    first
                } else {
                    then
                };
                let sent = env
                    .signed_payment(at, &event)
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
                if let Ok(response) = sent {
                    let status = response.status().as_u16();
                    let body: Value = response.json().await.unwrap_or(Value::Null);
                    if status != 503 {
                        answered.fetch_add(1, Ordering::Relaxed);
                        return (status, body);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("never answered: {event}")
        }
    };
    let stream = futures::stream::iter(events)
        .map(send)
        .buffer_unordered(32)
        .collect::<Vec<_>>();
    let kill = async {
        while answered.load(Ordering::Relaxed) < kill_after {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        kill_hard(doomed);
        killed.store(true, Ordering::Relaxed);
    };
    let (answers, ()) = tokio::join!(stream, kill);
    answers
}

/// An API process killed (SIGKILL) in the middle of a stream of payment events, twice:
/// 400 payments, then 200 refunds (each giving a unit back through Redis). The provider
/// sends what was not answered to the other instance, and then every event once more:
/// each is recorded once, each order ends one way, the units of the refunded come back
/// (a refund cut off between MySQL and Redis by the kill: by the cut-off sweep), and the
/// stock adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_api_killed_mid_stream_of_events_records_each_once_and_loses_no_unit() {
    use futures::StreamExt;
    let env = TestEnv::new("pay_crash_api").await;
    let survivor = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    env.item(1, 400).on_sale(&survivor).await;
    let won: Vec<String> = futures::stream::iter(1..=400u64)
        .map(|user| {
            let (env, survivor) = (&env, &survivor);
            async move {
                let (status, body) = env.buy(survivor, user, 1).await;
                assert_eq!(status, 202, "{body}");
                body["order_sn"].as_str().unwrap().to_owned()
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    env.wait_for_orders(&survivor, 1, 400, Duration::from_secs(30))
        .await;

    let payments: Vec<Value> = won
        .iter()
        .map(|sn| env.payment("payment.succeeded", sn))
        .collect();
    let (mut doomed, a, _lines, _reader) = serve(seckill(&env).args(["serve", "--roles", "api"]));
    let answers = stream_through_a_kill(&env, &payments, &a, &survivor, 100, &mut doomed).await;
    for (status, body) in &answers {
        assert_eq!(
            (*status, body["code"].as_str()),
            (200, Some("paid")),
            "{body}"
        );
    }
    let refunds: Vec<Value> = won[..200]
        .iter()
        .map(|sn| env.payment("payment.refunded", sn))
        .collect();
    let (mut doomed, a, _lines, _reader) = serve(seckill(&env).args(["serve", "--roles", "api"]));
    let answers = stream_through_a_kill(&env, &refunds, &a, &survivor, 50, &mut doomed).await;
    for (status, body) in &answers {
        assert_eq!(
            (*status, body["code"].as_str()),
            (200, Some("refunded")),
            "{body}"
        );
    }
    // The provider delivers everything once more: the same answers, nothing changed.
    for event in payments.iter().chain(&refunds) {
        let (status, body) = env.payment_event(&survivor, event).await;
        assert_eq!(
            (status, body["repeat"].as_bool()),
            (200, Some(true)),
            "{body}"
        );
    }
    let events: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payment_events")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(events, 600, "every event recorded once");
    // A refund cut off between MySQL and Redis is finished by the cut-off sweep (5 s).
    eventually(
        Duration::from_secs(20),
        "the refunded units back",
        || async {
            match env.remaining(1).await {
                200 => Ok(()),
                other => Err(format!("{other} on sale")),
            }
        },
    )
    .await;
    let stats = env.stats(&survivor, 1).await;
    assert_eq!(
        (
            stats["orders"]["paid"].as_u64(),
            stats["orders"]["refunded"].as_u64()
        ),
        (Some(200), Some(200)),
        "{stats}"
    );
    env.assert_invariants(&survivor, 1, 400, &won).await;
    survivor.stop().await;
}

/// `order.refund_due` leaves through the outbox: late payments owed back while no
/// scheduler can reach RabbitMQ, that scheduler killed, another one started — every event
/// arrives (at least once, under its message id), and the outbox empties.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refund_due_events_survive_a_scheduler_killed_before_it_could_send_them() {
    let env = TestEnv::new("pay_crash_scheduler").await;
    let (_conn, channel, queue) =
        listen_for_events(&env, "refund-due-crash", "order.refund_due").await;
    let refund = |s: &mut seckill::Settings| s.late_payment = LatePayment::Refund;
    let api = env.server_with(&[Role::Api, Role::Consumer], refund).await;
    env.item(1, 50).paying_within(1).on_sale(&api).await;
    let mut sns = Vec::new();
    for user in 1..=50 {
        sns.push(bought(&env, &api, user, 1).await);
    }
    // A scheduler that cannot reach RabbitMQ: it holds what it would send.
    let (mut blind, _, _lines, _reader) = serve(
        seckill(&env)
            .args(["serve", "--roles", "scheduler"])
            .env("SECKILL_AMQP_URL", "amqp://guest:guest@127.0.0.1:9/%2f"),
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for sn in &sns {
        let answer = pay_until_answered(&env, &api, &env.payment("payment.succeeded", sn)).await;
        assert_eq!(code(&answer), (200, Some("refund_due")), "{}", answer.1);
    }
    let queued: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM event_outbox")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(queued, 50, "held in the outbox");
    kill_hard(&mut blind);
    let scheduler = env.server(&[Role::Scheduler]).await;
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    eventually(
        Duration::from_secs(20),
        "every order.refund_due arrived",
        || {
            let (seen, channel, queue) = (&seen, &channel, &queue);
            async move {
                while let Some(message) = channel
                    .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                    .await
                    .unwrap()
                {
                    let body: Value = serde_json::from_slice(&message.data).unwrap();
                    let sn = body["order_sn"].as_str().unwrap_or_default().to_owned();
                    seen.lock().unwrap().insert(sn);
                }
                match seen.lock().unwrap().len() {
                    50 => Ok(()),
                    n => Err(format!("{n} arrived")),
                }
            }
        },
    )
    .await;
    eventually(Duration::from_secs(10), "the outbox empty", || async {
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM event_outbox")
            .fetch_one(&env.db)
            .await
            .unwrap();
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} left"))
        }
    })
    .await;
    let seen = seen.into_inner().unwrap();
    assert!(sns.iter().all(|sn| seen.contains(sn)), "{seen:?}");
    env.assert_invariants(&api, 1, 50, &sns).await;
    scheduler.stop().await;
    api.stop().await;
}

/// A buyer's repeated cancel of an order a late payment is reviving right now: the payment
/// holds the order's row from before it takes a unit until MySQL says `paid` (played here
/// by the test: the row locked, a unit taken into the buyer's record, then `paid`). The
/// cancel waits for the row and answers `409 order_paid`; the unit stays taken. (Before:
/// the cancel read `cancelled` without the lock, gave the unit back and answered `200` —
/// the paid order's unit on sale again, found by a review.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeated_cancel_waits_for_a_revival_in_flight_and_gives_nothing_back() {
    use redis::AsyncCommands;
    let env = TestEnv::new("pay_revive_race").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    env.item(1, 2).on_sale(&server).await;
    let sn = bought(&env, &server, 1, 1).await;
    let cancel = format!("/api/orders/{sn}/cancel");
    assert_eq!(env.post_as(&server, &cancel, 1).await.0, 200);
    assert_eq!(env.remaining(1).await, 2);

    let (tx, buyer) = revival_in_flight(&env, &sn).await;
    let mut redis = env.redis.clone();

    let repeated = async { env.post_as(&server, &cancel, 1).await };
    let paid = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        revived(tx, &sn).await;
    };
    let ((status, body), ()) = tokio::join!(repeated, paid);
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("order_paid")),
        "{body}"
    );
    assert_eq!(
        env.remaining(1).await,
        1,
        "the revived order's unit stays taken"
    );
    let held: Option<String> = redis.hget(&buyer, "1").await.unwrap();
    assert_eq!(held.as_deref(), Some(sn.as_str()));
    env.assert_invariants(&server, 1, 2, std::slice::from_ref(&sn))
        .await;
    server.stop().await;
}

/// A forced warm-up while a late payment is reviving an order (its row locked, its unit
/// taken in Redis, `paid` not committed yet) counts that order among the holders: it waits
/// for the payment's commit and loads one unit less. Before, it read the order as
/// cancelled and loaded its unit again — three units held of two once the payment
/// committed.
#[tokio::test]
async fn a_warm_up_waits_for_a_revival_in_flight_and_counts_its_unit() {
    use redis::AsyncCommands;
    let env = TestEnv::new("pay_revive_warmup").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    env.item(1, 2).on_sale(&server).await;
    let sn = bought(&env, &server, 1, 1).await;
    let cancel = format!("/api/orders/{sn}/cancel");
    assert_eq!(env.post_as(&server, &cancel, 1).await.0, 200);
    assert_eq!(env.remaining(1).await, 2);

    let (tx, buyer) = revival_in_flight(&env, &sn).await;
    let mut redis = env.redis.clone();
    // As `revive.lua` does: the order recorded as changing, until the payment commits.
    let ending = env.keys().ending(env.bucket(1));
    let _: () = redis.zadd(&ending, &sn, 1).await.unwrap();

    // The operator pauses the sale and reloads it meanwhile.
    assert_eq!(env.admin_post(&server, "/admin/items/1/pause").await.0, 200);
    let reload = async {
        env.admin_post(&server, "/admin/items/1/warmup?force=true")
            .await
    };
    let paid = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        revived(tx, &sn).await;
        let _: () = env.redis.clone().zrem(&ending, &sn).await.unwrap();
    };
    let ((status, report), ()) = tokio::join!(reload, paid);
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        env.remaining(1).await,
        1,
        "the revived order holds its unit: {report}"
    );
    let held: Option<String> = redis.hget(&buyer, "1").await.unwrap();
    assert_eq!(held.as_deref(), Some(sn.as_str()), "its buyer record");
    assert_eq!(
        env.admin_post(&server, "/admin/items/1/resume").await.0,
        200
    );
    env.assert_invariants(&server, 1, 2, std::slice::from_ref(&sn))
        .await;
    server.stop().await;
}

/// Refunds of one charge add up whatever their order: parts that came before the charge
/// was told of return it (`already_refunded`, the order stays unpaid), a part before it
/// and the rest after refund it; for no order, a refund first leaves nothing owed and a
/// charge told of twice is owed once; a refund naming another order settles nothing.
#[tokio::test]
async fn refunds_in_parts_and_out_of_order_add_up() {
    let env = TestEnv::new("pay_parts").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    env.item(1, 5).on_sale(&server).await;
    let refund = |sn: &str, cents: u64| {
        let mut event = env.payment("payment.refunded", sn);
        event["amount_cents"] = json!(cents);
        event
    };
    let owed = || async {
        let (_, due) = env.admin_get(&server, "/admin/payments/refunds-due").await;
        due["charges"].as_array().cloned().unwrap_or_default()
    };

    // Both parts before the charge: each recorded only, then the charge is returned.
    let first = bought(&env, &server, 1, 1).await;
    for cents in [1000, 999] {
        let answer = env.payment_event(&server, &refund(&first, cents)).await;
        assert_eq!(code(&answer), (200, Some("ignored")), "{}", answer.1);
    }
    let answer = env.pay(&server, &first).await;
    assert_eq!(
        code(&answer),
        (200, Some("already_refunded")),
        "{}",
        answer.1
    );
    assert_eq!(env.order_status(&first).await.as_deref(), Some("unpaid"));

    // A part before the charge, the rest after it: refunded, the unit back.
    let second = bought(&env, &server, 2, 1).await;
    let answer = env.payment_event(&server, &refund(&second, 1000)).await;
    assert_eq!(code(&answer), (200, Some("ignored")), "{}", answer.1);
    assert_eq!(code(&env.pay(&server, &second).await), (200, Some("paid")));
    let remaining = env.remaining(1).await;
    let answer = env.payment_event(&server, &refund(&second, 999)).await;
    assert_eq!(code(&answer), (200, Some("refunded")), "{}", answer.1);
    assert_eq!(
        env.remaining(1).await,
        remaining + 1,
        "the unit back on sale"
    );

    // No such order: its refund first, then the charge — nothing owed.
    let nobody = format!("1-{}", ulid::Ulid::new());
    let answer = env.payment_event(&server, &refund(&nobody, 1999)).await;
    assert_eq!(
        code(&answer),
        (404, Some("order_not_found")),
        "{}",
        answer.1
    );
    let answer = env.pay(&server, &nobody).await;
    assert_eq!(
        code(&answer),
        (200, Some("already_refunded")),
        "{}",
        answer.1
    );
    assert!(owed().await.is_empty(), "{:?}", owed().await);
    // Another order nobody has, its charge told of twice: owed once.
    let stray = format!("1-{}", ulid::Ulid::new());
    let charge = env.payment("payment.succeeded", &stray);
    let answer = env.payment_event(&server, &charge).await;
    assert_eq!(
        code(&answer),
        (404, Some("order_not_found")),
        "{}",
        answer.1
    );
    let mut again = env.payment("payment.succeeded", &stray);
    again["provider_ref"] = charge["provider_ref"].clone();
    let answer = env.payment_event(&server, &again).await;
    assert_eq!(
        code(&answer),
        (200, Some("already_recorded")),
        "{}",
        answer.1
    );
    assert_eq!(owed().await.len(), 1, "{:?}", owed().await);
    // A refund naming that charge but another order settles nothing.
    let mut elsewhere = refund(&first, 1999);
    elsewhere["provider_ref"] = charge["provider_ref"].clone();
    let answer = env.payment_event(&server, &elsewhere).await;
    assert_eq!(code(&answer), (200, Some("ignored")), "{}", answer.1);
    assert_eq!(owed().await.len(), 1, "still owed: {:?}", owed().await);

    env.wait_for_orders(&server, 1, 2, Duration::from_secs(10))
        .await;
    env.assert_invariants(&server, 1, 5, &[first, second]).await;
    server.stop().await;
}

/// Under `refund`, a payment that came in time for an order its buyer cancelled revives
/// it, even when its tries wait past the deadline for the unit to be free (a cancel still
/// giving it back, held here by the test): it is judged by when it came, not by the
/// moment of the try that took the unit. Before, the retry after the deadline read the
/// order overdue and owed the charge back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_in_time_waiting_past_the_deadline_is_judged_by_when_it_came() {
    use redis::AsyncCommands;
    let env = TestEnv::new("pay_came_in_time").await;
    let refund = |s: &mut seckill::Settings| s.late_payment = LatePayment::Refund;
    let api = env.server_with(&[Role::Api, Role::Consumer], refund).await;
    env.item(1, 3).paying_within(2).on_sale(&api).await;
    let sn = bought(&env, &api, 1, 1).await;
    let (status, body) = env
        .post_as(&api, &format!("/api/orders/{sn}/cancel"), 1)
        .await;
    assert_eq!(status, 200, "{body}");
    let deadline: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT pay_deadline FROM orders WHERE order_sn = ?")
            .bind(&sn)
            .fetch_one(&env.db)
            .await
            .unwrap();
    let until =
        |at: chrono::DateTime<chrono::Utc>| (at - chrono::Utc::now()).to_std().unwrap_or_default();
    // The cancel's record stands again: the payment's tries find the unit busy.
    let ending = env.keys().ending(env.bucket(1));
    let mut redis = env.redis.clone();
    let _: () = redis.zadd(&ending, &sn, 1).await.unwrap();

    tokio::time::sleep(until(deadline - chrono::Duration::milliseconds(300))).await;
    let paid = async { env.pay(&api, &sn).await };
    let freed = async {
        tokio::time::sleep(until(deadline + chrono::Duration::milliseconds(200))).await;
        let _: () = env.redis.clone().zrem(&ending, &sn).await.unwrap();
    };
    let (answer, ()) = tokio::join!(paid, freed);
    assert_eq!(code(&answer), (200, Some("revived")), "{}", answer.1);
    assert_eq!(env.order_status(&sn).await.as_deref(), Some("paid"));
    assert_eq!(env.remaining(1).await, 2, "its unit taken again");
    env.assert_invariants(&api, 1, 3, std::slice::from_ref(&sn))
        .await;
    api.stop().await;
}

/// An item keeps its price once it was loaded: every order's payment is judged against
/// it. A `PUT` (alone or in bulk) with another price answers `409 price_fixed` naming
/// `price_cents` and changes nothing, and the order taken before pays at the price it was
/// taken at; an item never loaded changes its price freely. Before, the `PUT` answered
/// `200` and that payment `422 amount_mismatch`, owed back, its order left to time out.
#[tokio::test]
async fn a_loaded_item_keeps_its_price() {
    let env = TestEnv::new("pay_price_fixed").await;
    let server = env.server(&[Role::Api, Role::Consumer]).await;
    env.item(1, 5).on_sale(&server).await;
    let sn = bought(&env, &server, 1, 1).await;
    let put = |body: Value| {
        let env = &env;
        let server = &server;
        async move {
            let response = env
                .admin(reqwest::Method::PUT, server, "/admin/items/1")
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let mut dearer = env.item(1, 5).body();
    dearer["price_cents"] = json!(2999);
    let (status, body) = put(dearer.clone()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("price_fixed")),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("`price_cents`") && detail.contains("1999"),
        "{body}"
    );
    dearer["id"] = json!(1);
    let bulk = env
        .admin(reqwest::Method::PUT, &server, "/admin/items")
        .json(&json!({ "items": [dearer] }))
        .send()
        .await
        .unwrap();
    let status = bulk.status().as_u16();
    let body: Value = bulk.json().await.unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("price_fixed")),
        "{body}"
    );
    let (_, shown) = env.get(&server, "/api/items/1", None).await;
    assert_eq!(shown["price_cents"], 1999, "{shown}");
    let answer = env.pay(&server, &sn).await;
    assert_eq!(code(&answer), (200, Some("paid")), "{}", answer.1);

    // Never loaded: its price is free to change.
    let mut later = env
        .item(2, 5)
        .window(
            chrono::Utc::now() + chrono::Duration::hours(1),
            chrono::Utc::now() + chrono::Duration::hours(2),
        )
        .body();
    let created = env
        .admin(reqwest::Method::PUT, &server, "/admin/items/2")
        .json(&later)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    later["price_cents"] = json!(2999);
    let changed = env
        .admin(reqwest::Method::PUT, &server, "/admin/items/2")
        .json(&later)
        .send()
        .await
        .unwrap();
    assert_eq!(changed.status().as_u16(), 200);
    env.assert_invariants(&server, 1, 5, std::slice::from_ref(&sn))
        .await;
    server.stop().await;
}

/// A late payment's transaction under way, as `apply.rs` runs it for user 1's cancelled
/// order `sn` of item 1: the row locked, then a unit taken into the buyer's record.
/// Returns the transaction and that record's key.
async fn revival_in_flight(
    env: &TestEnv,
    sn: &str,
) -> (sqlx::Transaction<'static, sqlx::MySql>, String) {
    use redis::AsyncCommands;
    let mut tx = env.db.begin().await.unwrap();
    let _: String = sqlx::query_scalar("SELECT status FROM orders WHERE order_sn = ? FOR UPDATE")
        .bind(sn)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let keys = env.item_keys(1);
    let mut redis = env.redis.clone();
    let _: Option<String> = redis.lpop(&keys.tokens, None).await.unwrap();
    let buyer = keys
        .buyer_orders(seckill::domain::UserId::new(1))
        .to_owned();
    let _: () = redis.hset(&buyer, "1", sn).await.unwrap();
    (tx, buyer)
}

/// The revival's end: MySQL says `paid`.
async fn revived(mut tx: sqlx::Transaction<'static, sqlx::MySql>, sn: &str) {
    sqlx::query(
        "UPDATE orders SET status = 'paid', lapsed_at = updated_at,
                revived_at = UTC_TIMESTAMP(3), cancel_reason = NULL
         WHERE order_sn = ?",
    )
    .bind(sn)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}
