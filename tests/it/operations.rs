//! Operations: `/metrics` tells what a burst did, and the Grafana dashboard asks only for
//! what the server exports.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use prometheus_parse::{Sample, Scrape, Value as Metric};
use serde_json::Value;

use crate::support::*;

async fn scrape(env: &TestEnv, server: &TestServer) -> (String, Scrape) {
    let response = env.http.get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = response.text().await.unwrap();
    let parsed = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text");
    (text, parsed)
}

/// The value of this test's series of `metric` whose labels include `labels`.
fn value(scrape: &Scrape, namespace: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let matching: Vec<&Sample> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && s.labels.get("namespace") == Some(namespace))
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(matching.len(), 1, "{metric}{labels:?}: {matching:?}");
    match &matching[0].value {
        Metric::Counter(v) | Metric::Gauge(v) | Metric::Untyped(v) => *v,
        other => panic!("{metric} is {other:?}"),
    }
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text_and_count_what_a_burst_did() {
    let env = &TestEnv::new("metrics").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 50).on_sale(&server).await;
    // 80 users, 100 requests: wins, duplicates and sold-outs.
    let answers: Vec<(u16, Value)> = futures::stream::iter((0..100u64).map(|i| 1 + i % 80))
        .map(|user| env.buy(&server, user, 1))
        .buffer_unordered(16)
        .collect()
        .await;
    let mut by_code: HashMap<String, u64> = HashMap::new();
    for (_, json) in &answers {
        *by_code
            .entry(json["code"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let won: Vec<String> = answers
        .iter()
        .filter(|(s, _)| *s == 202)
        .map(|(_, j)| j["order_sn"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(won.len(), 50);
    env.wait_for_orders(&server, 1, 50, Duration::from_secs(20))
        .await;
    env.assert_invariants(&server, 1, 50, &won).await;
    // One refresh of the gauges after the queue drained.
    tokio::time::sleep(Duration::from_millis(700)).await;

    let ns = env.settings.namespace.as_str();
    let (_, metrics) = scrape(env, &server).await;
    for (code, count) in &by_code {
        assert_eq!(
            value(&metrics, ns, "seckill_purchases_total", &[("code", code)]),
            *count as f64,
            "{code}"
        );
    }
    let funnel = |stage| value(&metrics, ns, "seckill_funnel_total", &[("stage", stage)]);
    assert_eq!(funnel("started"), 100.0);
    assert_eq!(funnel("won"), 50.0);
    assert_eq!(funnel("published"), 50.0);
    assert_eq!(funnel("written"), 50.0);
    assert_eq!(
        value(&metrics, ns, "seckill_purchase_duration_seconds_count", &[]),
        100.0
    );
    let grabs = value(
        &metrics,
        ns,
        "seckill_stage_duration_seconds_count",
        &[("stage", "redis_grab")],
    );
    assert!(grabs >= 50.0, "every win went through Redis: {grabs}");
    let item = [("item", "1")];
    assert_eq!(value(&metrics, ns, "seckill_stock_remaining", &item), 0.0);
    assert_eq!(value(&metrics, ns, "seckill_pending_orders", &item), 0.0);
    assert_eq!(value(&metrics, ns, "seckill_outbox_orders", &item), 0.0);
    // A deadline and a reminder per order.
    assert_eq!(
        value(&metrics, ns, "seckill_delay_queue_tasks", &item),
        100.0
    );
    assert_eq!(
        value(
            &metrics,
            ns,
            "seckill_breaker_level",
            &[("scope", "global")]
        ),
        0.0
    );
    server.stop().await;
}

/// Metric names a PromQL expression asks for.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("seckill_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.push(name);
    }
    names
}

fn exprs(json: &Value, found: &mut Vec<String>) {
    match json {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "definition", Value::String(e)) => found.push(e.clone()),
                    _ => exprs(value, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| exprs(v, found)),
        _ => {}
    }
}

#[tokio::test]
async fn the_dashboard_parses_and_asks_only_for_exported_metrics() {
    let path = format!(
        "{}/monitoring/grafana/dashboards/seckill.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .expect("the dashboard is JSON");
    let mut found = Vec::new();
    exprs(&dashboard["panels"], &mut found);
    exprs(&dashboard["templating"], &mut found);
    assert!(found.len() >= 8, "{found:?}");
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for wanted in ["answer", "Funnel", "p99", "Stock", "breakers"] {
        assert!(
            titles.iter().any(|t| t.contains(wanted)),
            "no {wanted} panel: {titles:?}"
        );
    }

    // What a server exports once it sold, published, wrote, scheduled, cancelled and
    // found a mismatch (a stray unit) in a reconciliation.
    let env = &TestEnv::new("dashboard").await;
    let server = env.server(ALL_ROLES).await;
    env.item(1, 5).on_sale(&server).await;
    let (status, json) = env.buy(&server, 1, 1).await;
    assert_eq!(status, 202, "{json}");
    env.wait_for_orders(&server, 1, 1, Duration::from_secs(20))
        .await;
    let sn = json["order_sn"].as_str().unwrap();
    // A waiting room, joined and stepped.
    env.item(2, 5)
        .queued(serde_json::json!({ "admit_per_s": 10 }))
        .on_sale(&server)
        .await;
    let joined = env
        .http
        .post(server.url("/api/items/2/queue"))
        .bearer_auth(env.token(1))
        .send()
        .await
        .unwrap();
    assert_eq!(joined.status(), 200);
    eventually(Duration::from_secs(10), "the buyer let in", || async {
        let (_, me) = env.get(&server, "/api/items/2/queue/me", Some(1)).await;
        match me["state"].as_str() {
            Some("admitted") => Ok(()),
            _ => Err(me.to_string()),
        }
    })
    .await;
    let (status, _) = env
        .post_as(&server, &format!("/api/orders/{sn}/cancel"), 1)
        .await;
    assert_eq!(status, 200);
    let _: () =
        redis::AsyncCommands::rpush(&mut env.redis.clone(), env.item_keys(1).tokens, "stray")
            .await
            .unwrap();
    let report = env
        .admin(reqwest::Method::POST, &server, "/admin/items/1/reconcile")
        .send()
        .await
        .unwrap();
    assert_eq!(report.status(), 200);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (text, _) = scrape(env, &server).await;
    let exported: HashSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("# TYPE ") || !l.starts_with('#'))
        .filter_map(|l| l.trim_start_matches("# TYPE ").split(['{', ' ']).next())
        .collect();
    let mut missing = Vec::new();
    for expr in &found {
        for name in metric_names(expr) {
            if !exported.contains(name.as_str()) {
                missing.push(name);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the dashboard asks for {missing:?}, not in:\n{text}"
    );
    server.stop().await;
}

/// Every metric an alerting rule asks for is one the server makes (a name in `src/`): a
/// rule on a misspelt metric would never fire.
#[test]
fn every_alert_asks_for_a_metric_the_server_makes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut made = HashSet::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                made.extend(
                    text.split('"')
                        .filter(|s| s.starts_with("seckill_"))
                        .map(str::to_owned),
                );
            }
        }
    }
    let rules = std::fs::read_to_string(root.join("monitoring/alerts.yml")).unwrap();
    let asked = metric_names(&rules);
    assert!(asked.len() >= 11, "{asked:?}");
    let unknown: Vec<&String> = asked.iter().filter(|n| !made.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "alerts ask for {unknown:?}, which the server never makes"
    );
}
