//! Payment events applied per second against a running server (loadtest/payments.sh), beside
//! a yardstick in the same run: the owners' reads of the same orders
//! (`GET /api/orders/{sn}`, one MySQL lookup each). The orders are bought first and split
//! into rounds; each round reads its slice and pays it, the two in turn first (A B, B A, …),
//! so a drift of the machine weighs on both alike.
//!
//!   cargo run --release --example payments -- URL ADMIN_TOKEN PAYMENT_SECRET TOKENS_FILE ITEM ROUNDS
//!
//! Prints one JSON report on stdout.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

/// Requests in flight at once, as the rest of the load tests use.
const CONCURRENCY: usize = 64;

type Failure = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, admin, secret, tokens, item, rounds] = args.as_slice() else {
        return Err(
            "usage: payments URL ADMIN_TOKEN PAYMENT_SECRET TOKENS_FILE ITEM ROUNDS".into(),
        );
    };
    let item: u64 = item.parse()?;
    let rounds: usize = rounds.parse()?;
    let tokens: Vec<String> = std::fs::read_to_string(tokens)?
        .lines()
        .map(str::to_owned)
        .collect();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .build()?;

    let started = Instant::now();
    let bought: Vec<(String, String)> = futures::stream::iter(tokens)
        .map(|token| {
            let http = &http;
            async move {
                let now = chrono::Utc::now().timestamp_millis();
                let sent = http
                    .post(format!("{url}/api/flashbuy"))
                    .bearer_auth(&token)
                    .header("X-Client-Time", now.to_string())
                    .json(&json!({ "item_id": item }))
                    .send()
                    .await
                    .ok()?;
                let body: Value = sent.json().await.ok()?;
                Some((body["order_sn"].as_str()?.to_owned(), token))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .filter_map(|bought| async move { bought })
        .collect()
        .await;
    eprintln!("{} orders bought in {:?}", bought.len(), started.elapsed());
    wait_for_mysql(&http, url, admin, item).await?;

    let slice = bought.len() / rounds.max(1);
    let mut report = Vec::new();
    for (round, orders) in bought.chunks(slice.max(1)).take(rounds).enumerate() {
        let reads_first = round % 2 == 0;
        let (reads, events) = if reads_first {
            let reads = reads_per_s(&http, url, orders).await;
            (reads, events_per_s(&http, url, secret, orders).await?)
        } else {
            let events = events_per_s(&http, url, secret, orders).await?;
            (reads_per_s(&http, url, orders).await, events)
        };
        eprintln!("round {round}: {events:.0} events/s, {reads:.0} reads/s");
        report.push(json!({
            "round": round, "orders": orders.len(), "reads_first": reads_first,
            "events_per_s": events.round(), "reads_per_s": reads.round(),
            "ratio": (events / reads * 100.0).round() / 100.0,
        }));
    }
    let mut ratios: Vec<f64> = report.iter().filter_map(|r| r["ratio"].as_f64()).collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios.get(ratios.len() / 2).copied().unwrap_or_default();
    let summary = json!({
        "orders": bought.len(), "concurrency": CONCURRENCY, "rounds": report,
        "ratio_median": median,
        "ratio_range": [ratios.first(), ratios.last()],
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

/// Waits until no order of the item is still on its way to MySQL.
async fn wait_for_mysql(
    http: &reqwest::Client,
    url: &str,
    admin: &str,
    item: u64,
) -> Result<(), Failure> {
    for _ in 0..600 {
        let stats: Value = http
            .get(format!("{url}/admin/items/{item}/stats"))
            .bearer_auth(admin)
            .send()
            .await?
            .json()
            .await?;
        if stats["pending"] == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("orders still pending after a minute".into())
}

/// The owners read their orders: requests per second.
async fn reads_per_s(http: &reqwest::Client, url: &str, orders: &[(String, String)]) -> f64 {
    let started = Instant::now();
    futures::stream::iter(orders)
        .for_each_concurrent(CONCURRENCY, |(sn, token)| async move {
            let _ = http
                .get(format!("{url}/api/orders/{sn}"))
                .bearer_auth(token)
                .send()
                .await;
        })
        .await;
    orders.len() as f64 / started.elapsed().as_secs_f64()
}

/// The provider's `payment.succeeded` for each order, signed: events per second, each
/// answered `paid` (anything else fails the run).
async fn events_per_s(
    http: &reqwest::Client,
    url: &str,
    secret: &str,
    orders: &[(String, String)],
) -> Result<f64, Failure> {
    let started = Instant::now();
    let answers: Vec<Option<String>> = futures::stream::iter(orders)
        .map(|(sn, _)| async move {
            let body = json!({
                "event_id": format!("evt_bench_{sn}"), "type": "payment.succeeded",
                "order_sn": sn, "amount_cents": 1, "currency": "CNY",
                "occurred_at": chrono::Utc::now(), "provider_ref": format!("ch_bench_{sn}"),
            })
            .to_string();
            let t = chrono::Utc::now().timestamp();
            let header = seckill::testing::sign_payment(secret, t, body.as_bytes());
            let sent = http
                .post(format!("{url}/api/payments/events"))
                .header(seckill::testing::PAYMENT_SIGNATURE, header)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
                .ok()?;
            let answer: Value = sent.json().await.ok()?;
            answer["code"].as_str().map(str::to_owned)
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let took = started.elapsed().as_secs_f64();
    let paid = answers
        .iter()
        .filter(|a| a.as_deref() == Some("paid"))
        .count();
    if paid != orders.len() {
        return Err(format!("{paid} of {} events answered `paid`", orders.len()).into());
    }
    Ok(orders.len() as f64 / took)
}
