//! `seckill rehearse`: a rehearsal against a real server proves its outcome, and says NO GO
//! (exit 1) when an invariant is broken.

use std::process::Output;
use std::time::Instant;

use serde_json::Value;

use crate::support::*;

fn out_dir(env_name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "seckill-bench-{env_name}-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    ))
}

async fn bench(env: &TestEnv, server: &TestServer, args: &[&str], out: &std::path::Path) -> Output {
    let mut command = seckill(env);
    command
        .arg("rehearse")
        .args(["--target", &server.url("")])
        .args(["--out", out.to_str().unwrap()])
        .args(args);
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// Asserts that the bench said GO (exit 0), and each of `lines`.
fn said_go(output: &Output, lines: &[&str]) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in lines.iter().chain(&["GO: every invariant held"]) {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
}

/// The rehearsal of a hot item over four buckets, a fifth of the winners cancelling (their
/// units back in their buckets, sold again across them): every invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_rehearses_a_hot_item_over_buckets() {
    let env = TestEnv::new("bench_buckets").await;
    let server = env.server(ALL_ROLES).await;
    let out = out_dir("buckets");
    let output = bench(
        &env,
        &server,
        &[
            "--item",
            "704",
            "--units",
            "40",
            "--buckets",
            "4",
            "--users",
            "150",
            "--requests",
            "600",
            "--concurrency",
            "20",
            "--cancel-percent",
            "20",
        ],
        &out,
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in ["✔ 1.", "✔ 2.", "✔ 4.", "✔ 5.", "GO: every invariant held"] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    let sold = env.orders(704).await;
    assert!(sold.len() >= 40, "{} orders", sold.len());
    server.stop().await;
    let _ = std::fs::remove_dir_all(out);
}

/// A shaped sale: two per buyer, a third of the units in a wave two seconds in, presses
/// spread over four seconds: some buyers hold two, the wave sells, every invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_rehearses_a_shaped_sale() {
    let env = TestEnv::new("bench_shapes").await;
    let server = env.server(ALL_ROLES).await;
    let out = out_dir("shapes");
    #[rustfmt::skip]
    let args = [
        "--item", "705", "--units", "60", "--per-user", "2", "--release", "+2:20",
        "--users", "40", "--requests", "400", "--rate", "100", "--concurrency", "20",
    ];
    let output = bench(&env, &server, &args, &out).await;
    said_go(&output, &[]);
    let orders = env.orders(705).await;
    assert_eq!(
        orders.len(),
        60,
        "every unit sold, the wave's too: {orders:?}"
    );
    let mut per_user = std::collections::HashMap::<u64, u32>::new();
    for (_, user, _) in &orders {
        *per_user.entry(*user).or_default() += 1;
    }
    assert!(per_user.values().all(|n| *n <= 2), "{per_user:?}");
    assert!(per_user.values().any(|n| *n == 2), "{per_user:?}");
    server.stop().await;
    let _ = std::fs::remove_dir_all(out);
}

/// A draw: the crowd's presses are entries for three seconds, the bench waits for the
/// draw and checks that the 30 units went to the lowest ranks (its sixth check).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_rehearses_a_draw() {
    let env = TestEnv::new("bench_draw").await;
    let server = env.server(ALL_ROLES).await;
    let out = out_dir("draw");
    #[rustfmt::skip]
    let args = [
        "--item", "706", "--units", "30", "--buckets", "2", "--draw", "3",
        "--users", "200", "--requests", "300", "--rate", "150", "--concurrency", "20",
    ];
    let output = bench(&env, &server, &args, &out).await;
    said_go(&output, &["✔ 6. a draw's units went to its lowest ranks"]);
    assert_eq!(env.orders(706).await.len(), 30);
    server.stop().await;
    let _ = std::fs::remove_dir_all(out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn it_rehearses_a_sale_and_proves_the_invariants() {
    let env = TestEnv::new("bench_ok").await;
    let server = env.server(ALL_ROLES).await;
    let out = out_dir("ok");
    let before = Instant::now();
    let output = bench(
        &env,
        &server,
        &[
            "--item",
            "701",
            "--units",
            "50",
            "--users",
            "200",
            "--requests",
            "600",
            "--concurrency",
            "20",
            "--cancel-percent",
            "20",
            "--start-at",
            "+1",
        ],
        &out,
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        before.elapsed().as_millis() >= 1000,
        "pressed before --start-at"
    );
    for line in [
        "✔ 1.",
        "✔ 2.",
        "✔ 3.",
        "✔ 4.",
        "✔ 5.",
        "GO: every invariant held",
        "p99.9",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }

    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["passed"], true);
    assert_eq!(report["presses"], 600);
    let count = |status: u64, code: &str| {
        report["answers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["status"] == status && a["code"] == code)
            .map_or(0, |a| a["count"].as_u64().unwrap())
    };
    // 50 units; the cancelled ones went back on sale, so more 202s than live orders.
    let won = report["won"].as_u64().unwrap();
    let cancelled = report["cancelled"].as_u64().unwrap();
    assert!(cancelled > 0, "{report}");
    assert_eq!(count(202, "queued"), won);
    assert!(count(410, "sold_out") > 0, "{report}");
    assert!(report["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    assert!(!report["timeline"].as_array().unwrap().is_empty());
    let svg = std::fs::read_to_string(out.join("report.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("Latency distribution"));

    // What MySQL says, independently of the bench.
    let orders = env.orders(701).await;
    let live = orders.iter().filter(|(_, _, s)| s != "cancelled").count() as u64;
    assert_eq!(orders.len() as u64, won);
    assert_eq!(live, won - cancelled);
    assert_eq!(live + env.remaining(701).await, 50);
    let _ = std::fs::remove_dir_all(out);
}

/// `--item` with `--units` on an item already on sale (a k6 run's set-up, say) sets it up
/// again: paused while it loads, the buyer's unit kept, on sale again after. (The forced
/// warm-up refused the live sale, leaving the new total in MySQL and the old stock in
/// Redis: NO GO.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rehearsal_sets_up_a_live_item_again() {
    let env = TestEnv::new("bench_again").await;
    let server = env.server(ALL_ROLES).await;
    env.item(703, 20).on_sale(&server).await;
    assert_eq!(env.buy(&server, 1, 703).await.0, 202);
    let out = out_dir("again");
    let output = bench(
        &env,
        &server,
        &["--item", "703", "--units", "80", "--requests", "0"],
        &out,
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("GO: every invariant held"), "{stdout}");
    let stats = env.stats(&server, 703).await;
    assert_eq!(
        (stats["total"].as_u64(), stats["remaining"].as_u64()),
        (Some(80), Some(79)),
        "{stats}"
    );
    // On sale again: another buyer wins.
    assert_eq!(env.buy(&server, 2, 703).await.0, 202);
    let _ = std::fs::remove_dir_all(out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rehearsal_says_no_go_when_the_stock_does_not_add_up() {
    let env = TestEnv::new("bench_broken").await;
    let server = env.server(ALL_ROLES).await;
    env.item(702, 20).on_sale(&server).await;
    // An order MySQL holds that Redis never sold: one unit too many.
    sqlx::query(
        "INSERT INTO orders (order_sn, item_id, user_id, status, created_at, pay_deadline) \
         VALUES ('702-FORGED', 702, 5000, 'paid', NOW(3), NOW(3))",
    )
    .execute(&env.db)
    .await
    .unwrap();

    let out = out_dir("broken");
    let output = bench(
        &env,
        &server,
        &[
            "--item",
            "702",
            "--users",
            "10",
            "--requests",
            "10",
            "--concurrency",
            "5",
        ],
        &out,
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("✘ 4. stock adds up"), "{stdout}");
    assert!(stdout.contains("NO GO"), "{stdout}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["passed"], false);
    let _ = std::fs::remove_dir_all(out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rehearsal_at_a_fixed_rate_retries_what_the_server_turns_away() {
    let env = TestEnv::new("bench_rate").await;
    // One purchase a second per user (bursts of two): five users pressing 40 times in
    // about 0.2 s are mostly told to wait.
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 1).await;
    let out = out_dir("rate");
    let output = bench(
        &env,
        &server,
        &[
            "--item",
            "703",
            "--units",
            "3",
            "--users",
            "5",
            "--requests",
            "40",
            "--rate",
            "200",
            "--retries",
            "2",
        ],
        &out,
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["rate"], 200);
    let retries = report["retries"].as_u64().unwrap();
    assert!(retries > 0, "{report}");
    assert_eq!(report["requests"].as_u64().unwrap(), 40 + retries);
    let limited = report["answers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["code"] == "rate_limited")
        .map_or(0, |a| a["count"].as_u64().unwrap());
    assert!(limited > 0, "{report}");
    assert_eq!(report["won"], 3, "{report}");
    assert_eq!(report["passed"], true);
    let _ = std::fs::remove_dir_all(out);
}
