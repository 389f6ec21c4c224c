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
    // A waiting room with a proof-of-work and one unit, which the buyer ahead (user 50,
    // joined through the API) holds; once the browser's buyer (user 7) waits, that buyer
    // cancels and the unit is the browser's turn.
    env.item(907, 1)
        .queued(serde_json::json!({ "admit_per_s": 100, "pow_bits": 8 }))
        .on_sale(&server)
        .await;
    let ahead = buy_ahead_in_line(&env, &server, 907, 50).await;
    let nginx = Nginx::start(server.addr, server.addr).await;

    let tokens = [1, 2, 3, 4, 5, 6, 7].map(|user| env.token(user)).join(",");
    let payment_secret = env.settings.payment_secret[0].expose().to_owned();
    let browser = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .args(["--test", "--test-concurrency=1", "test/"])
            .current_dir(WEB)
            .env("STOREFRONT_URL", nginx.url(""))
            .env("STOREFRONT_ITEMS", "901,902,903,904,905,906,907")
            .env("STOREFRONT_TOKENS", tokens)
            .env("STOREFRONT_PAYMENT_SECRET", &payment_secret)
            .env("CHROMIUM", chromium)
            .env(
                "STOREFRONT_SHOTS",
                concat!(env!("CARGO_MANIFEST_DIR"), "/target/storefront"),
            )
            .output()
            .expect("node (Node.js 20 or newer)")
    });
    // The buyer ahead cancels once the browser's buyer waits (the queued item is the
    // page's last test), or never, should the browser be done first.
    let mut browser = browser;
    let output = tokio::select! {
        output = &mut browser => output,
        () = cancel_once_waiting(&env, &server, 907, 7, 50, &ahead) => browser.await,
    };
    let output = output.unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "browser test failed:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("# pass 9"), "{report}");

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
    // User 7 bought item 907 in its turn; user 50's cancelled order gave it the unit.
    env.wait_for_orders(&server, 907, 2, Duration::from_secs(20))
        .await;
    let mut orders = env.orders(907).await;
    orders.sort_by_key(|(_, user, _)| *user);
    let seen: Vec<(u64, &str)> = orders.iter().map(|(_, u, s)| (*u, s.as_str())).collect();
    assert_eq!(seen, [(7, "unpaid"), (50, "cancelled")]);
}

/// `user` joins `item`'s line through the API, is let in and buys with the pass: the
/// order's number.
async fn buy_ahead_in_line(env: &TestEnv, server: &TestServer, item: u64, user: u64) -> String {
    let queue = format!("/api/items/{item}/queue");
    let (_, given) = env
        .get(server, &format!("{queue}/challenge"), Some(user))
        .await;
    let challenge = given["challenge"].as_str().unwrap().to_owned();
    let nonce = (0u64..)
        .map(|n| n.to_string())
        .find(|n| crate::waiting_room::solves(&challenge, n, 8))
        .unwrap();
    let joined = env
        .http
        .post(server.url(&queue))
        .bearer_auth(env.token(user))
        .json(&serde_json::json!({ "challenge": challenge, "nonce": nonce }))
        .send()
        .await
        .unwrap();
    assert_eq!(joined.status(), 200);
    let pass = eventually(
        Duration::from_secs(10),
        "the buyer ahead let in",
        || async {
            let (_, me) = env.get(server, &format!("{queue}/me"), Some(user)).await;
            me["pass"].as_str().map(str::to_owned).ok_or(me.to_string())
        },
    )
    .await;
    let bought = env
        .purchase(server, user, item)
        .header("x-queue-pass", pass)
        .send()
        .await
        .unwrap();
    assert_eq!(bought.status(), 202);
    let body: serde_json::Value = bought.json().await.unwrap();
    let sn = body["order_sn"].as_str().unwrap().to_owned();
    env.wait_for_orders(server, item, 1, Duration::from_secs(20))
        .await;
    sn
}

/// Once `waiting` waits in `item`'s line, `ahead` cancels `order_sn`.
async fn cancel_once_waiting(
    env: &TestEnv,
    server: &TestServer,
    item: u64,
    waiting: u64,
    ahead: u64,
    order_sn: &str,
) {
    loop {
        let (_, me) = env
            .get(
                server,
                &format!("/api/items/{item}/queue/me"),
                Some(waiting),
            )
            .await;
        if me["state"] == "waiting" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (status, body) = env
        .post_as(server, &format!("/api/orders/{order_sn}/cancel"), ahead)
        .await;
    assert_eq!(status, 200, "{body}");
}
