//! The storefront page (web/) in a real headless Chromium, served by nginx in front of a
//! real server: web/test/storefront.test.mjs drives the browser; this sets the sale up and
//! checks what reached MySQL. Screenshots land in target/storefront/.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use chrono::Utc;

use crate::support::*;

const WEB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/web");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_page_buys_with_one_click_debounces_a_double_click_and_shows_sold_out() {
    assert!(
        Path::new(WEB).join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed: run `npm ci` in web/ (dev/test.sh does)"
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: apt-get install chromium (dev/test.sh does), or set CHROMIUM"
    );

    let env = TestEnv::new("storefront").await;
    let server = env.server(ALL_ROLES).await;
    let now = Utc::now();
    env.item(901, 10).on_sale(&server).await;
    env.item(902, 1).on_sale(&server).await;
    assert_eq!(env.buy(&server, 99, 902).await.0, 202);
    env.item(903, 5)
        .window(
            now + chrono::Duration::hours(1),
            now + chrono::Duration::hours(2),
        )
        .put(&server)
        .await;
    env.warmup(&server, 903).await;
    // Shaped sales: between two waves (the one unit on sale bought), up to 3 per buyer,
    // and a draw taking entries for an hour.
    env.item(904, 2)
        .release(&[(now + chrono::Duration::hours(1), 1)])
        .on_sale(&server)
        .await;
    assert_eq!(env.buy(&server, 98, 904).await.0, 202);
    env.item(905, 10).per_user(3).on_sale(&server).await;
    env.item(906, 10)
        .draw(now + chrono::Duration::hours(1))
        .on_sale(&server)
        .await;
    let nginx = Nginx::start(server.addr, server.addr).await;

    let tokens = [1, 2, 3, 4, 5, 6].map(|user| env.token(user)).join(",");
    let payment_secret = env.settings.payment_secret[0].expose().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .args(["--test", "--test-concurrency=1", "test/"])
            .current_dir(WEB)
            .env("STOREFRONT_URL", nginx.url(""))
            .env("STOREFRONT_ITEMS", "901,902,903,904,905,906")
            .env("STOREFRONT_TOKENS", tokens)
            .env("STOREFRONT_PAYMENT_SECRET", &payment_secret)
            .env("CHROMIUM", chromium)
            .env(
                "STOREFRONT_SHOTS",
                concat!(env!("CARGO_MANIFEST_DIR"), "/target/storefront"),
            )
            .output()
            .expect("node (Node.js 20 or newer)")
    })
    .await
    .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "browser test failed:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("# pass 8"), "{report}");

    // What the clicks did: user 1 bought and paid, user 2's double click bought once, user
    // 4 bought once though the answer was lost, user 3 (sold out, not started) bought
    // nothing.
    env.wait_for_orders(&server, 901, 3, Duration::from_secs(20))
        .await;
    let mut orders = env.orders(901).await;
    orders.sort_by_key(|(_, user, _)| *user);
    let seen: Vec<(u64, &str)> = orders.iter().map(|(_, u, s)| (*u, s.as_str())).collect();
    assert_eq!(seen, [(1, "paid"), (2, "unpaid"), (4, "unpaid")]);
    assert_eq!(env.orders(902).await.len(), 1);
    assert!(env.orders(903).await.is_empty());
    // User 5 bought two of item 905 with two clicks; user 6 entered the draw, once.
    env.wait_for_orders(&server, 905, 2, Duration::from_secs(20))
        .await;
    let stats = env.stats(&server, 906).await;
    assert_eq!(stats["entries"], 1, "{stats}");
}
