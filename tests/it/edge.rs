//! nginx in front (nginx/seckill.conf, run by dev/nginx.sh): static files from nginx, the
//! API passed on with its request id and the client's address, the edge's limits, and a
//! burst that loses an instance halfway and loses nothing.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::support::*;

const NGINX_DETAIL: &str = "too many requests from this user or address";

/// A purchase through nginx: status, body and the `Retry-After` header.
async fn press(
    http: &reqwest::Client,
    nginx: SocketAddr,
    token: &str,
    item: u64,
) -> (u16, Value, Option<String>) {
    let response = buy_response(http, nginx, token, item).await;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        status,
        response.json().await.unwrap_or(Value::Null),
        retry_after,
    )
}

fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// A clone in a directory only its owner may enter (as under `/root`, or `mktemp -d`):
/// nginx's workers must still read the storefront.
#[tokio::test]
async fn nginx_serves_a_checkout_in_a_private_directory() {
    use std::os::unix::fs::PermissionsExt;
    let private = std::env::temp_dir().join(format!(
        "seckill-private-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    ));
    let checkout = private.join("seckill");
    for file in [
        "dev/nginx.sh",
        "dev/lib.sh",
        "nginx/seckill.conf",
        "nginx/seckill_proxy.conf",
        "web/index.html",
        "web/assets/app.js",
        "web/assets/style.css",
    ] {
        let to = checkout.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(format!("{}/{file}", env!("CARGO_MANIFEST_DIR")), &to).unwrap();
    }
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let upstream: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let nginx = Nginx::start_from(&checkout, upstream, upstream).await;
    let http = reqwest::Client::new();
    for path in ["/", "/assets/app.js?v=1", "/assets/style.css?v=1"] {
        let answer = http.get(nginx.url(path)).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{path} from {}", checkout.display());
    }
    drop(nginx);
    std::fs::remove_dir_all(&private).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nginx_serves_the_storefront_itself_and_passes_the_api_on() {
    let env = TestEnv::new("edge_static").await;
    // The server's own per-user limit is off: every 429 below is the edge's.
    let server = env.server_with(ALL_ROLES, |s| s.rate_per_user = 0).await;
    env.item(801, 5).on_sale(&server).await;
    let nginx = Nginx::start(server.addr, server.addr).await;

    // The page and its assets come from disk through nginx, with their cache policy; the
    // server does not even have such routes.
    let page = env.http.get(nginx.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["cache-control"], "no-cache");
    assert_eq!(page.text().await.unwrap(), repo_file("web/index.html"));
    let script = env
        .http
        .get(nginx.url("/assets/app.js?v=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(script.status(), 200);
    let cache = script.headers()["cache-control"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(cache.contains("max-age=31536000"), "{cache}");
    assert!(
        script.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("javascript")
    );
    assert_eq!(script.text().await.unwrap(), repo_file("web/assets/app.js"));
    let direct = env
        .http
        .get(server.url("/assets/app.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 404, "the server serves no static files");

    // A purchase through nginx; the client's request id goes through and comes back.
    let response = env
        .http
        .post(nginx.url("/api/flashbuy"))
        .bearer_auth(env.token(1))
        .header("x-client-time", Utc::now().timestamp_millis().to_string())
        .header("x-request-id", "edge-test-1")
        .json(&json!({ "item_id": 801 }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    assert_eq!(response.headers()["x-request-id"], "edge-test-1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["trace_id"], "edge-test-1");

    // Operators' calls work through nginx from this host.
    let stats: Value = env
        .http
        .get(nginx.url("/admin/items/801/stats"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["sold"], 1, "{stats}");

    // One user pressing 40 times at once: nginx lets the burst of 10 (and the rate) through
    // and answers the rest itself, in the API's shape.
    let token = env.token(2);
    let answers =
        futures::future::join_all((0..40).map(|_| press(&env.http, nginx.addr, &token, 801))).await;
    let limited: Vec<_> = answers.iter().filter(|(s, _, _)| *s == 429).collect();
    assert!(
        limited.len() >= 25,
        "{} of 40 limited: {answers:?}",
        limited.len()
    );
    for (_, body, retry_after) in &limited {
        assert_eq!(body["code"], "rate_limited");
        assert!(body["detail"].as_str().unwrap().contains(NGINX_DETAIL));
        assert!(body["trace_id"].as_str().is_some_and(|t| !t.is_empty()));
        assert_eq!(retry_after.as_deref(), Some("1"));
    }
    let through: Vec<u16> = answers
        .iter()
        .map(|(s, _, _)| *s)
        .filter(|s| *s != 429)
        .collect();
    assert_eq!(
        through.iter().filter(|s| **s == 202).count(),
        1,
        "{through:?}"
    );
    assert!(
        through.iter().all(|s| [202, 409].contains(s)),
        "{through:?}"
    );
}

/// A sale opens with hundreds of connections in one instant, from nginx or a crowd: the
/// kernel must hold them until the busy server accepts them. With the standard 128, the
/// rest of the SYNs were dropped, nginx's connects timed out after a second and it took
/// the instance out of rotation (503 "no server answered" on a loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_server_holds_a_crowds_connections_until_it_accepts_them() {
    let env = TestEnv::new("edge_backlog").await;
    let server = env.server(ALL_ROLES).await;
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{}", server.addr.port())])
        .output()
        .expect("ss (iproute2)");
    let listing = String::from_utf8_lossy(&out.stdout);
    // A listening socket's Send-Q is its backlog.
    let backlog: u32 = listing
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no listener in {listing:?}"));
    assert!(backlog >= 1024, "backlog {backlog}: {listing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_address_reaches_the_server_and_the_edge_limits_each_address() {
    let env = TestEnv::new("edge_ip").await;
    // The server limits purchases per client IP (1/s, bursts of 2), as nginx tells it;
    // its own limit of reads is off, so the reads' 429s below are the edge's.
    let server = env
        .server_with(ALL_ROLES, |s| {
            s.rate_per_user = 0;
            s.rate_per_ip = 1;
            s.read_rate_per_ip = 0;
        })
        .await;
    env.item(802, 50).on_sale(&server).await;
    let nginx = Nginx::start(server.addr, server.addr).await;

    // Six presses from 127.0.0.2 (six users): the server limits that address...
    let from_2 = client_from("127.0.0.2");
    let mut statuses = Vec::new();
    for user in 10..16 {
        let (status, body, _) = press(&from_2, nginx.addr, &env.token(user), 802).await;
        if status == 429 {
            assert_eq!(body["detail"], "rate limited", "the server's limit: {body}");
        }
        statuses.push(status);
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    // ...and not another one: it saw the clients' addresses, not nginx's.
    let (status, body, _) = press(&client_from("127.0.0.3"), nginx.addr, &env.token(20), 802).await;
    assert_eq!(status, 202, "{body}");

    // The edge's own per-address limit (loopback's 127.0.0.1 is exempt for load tests):
    // 1,000 requests from one address, 200 at a time, far over 200/s with bursts of 400.
    let from_4 = client_from("127.0.0.4");
    let url = nginx.url("/api/items/802");
    let answers: Vec<(u16, Value)> = futures::stream::iter(0..1000)
        .map(|_| {
            let (http, url) = (from_4.clone(), url.clone());
            async move {
                let response = http.get(url).send().await.unwrap();
                (
                    response.status().as_u16(),
                    response.json().await.unwrap_or(Value::Null),
                )
            }
        })
        .buffer_unordered(200)
        .collect()
        .await;
    let limited = answers.iter().filter(|(s, _)| *s == 429).count();
    assert!(limited >= 50, "{limited} of 1000 limited");
    let others: Vec<_> = answers
        .iter()
        .filter(|(s, body)| {
            *s != 200
                && !body["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains(NGINX_DETAIL))
        })
        .collect();
    assert!(others.is_empty(), "{others:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_through_nginx_loses_nothing_when_an_instance_dies() {
    let env = TestEnv::new("edge_burst").await;
    let (child_a, a, _lines_a, reader_a) = serve(seckill(&env).arg("serve"));
    let (mut child_b, b, lines_b, _reader_b) = serve(seckill(&env).arg("serve"));
    let nginx = Nginx::start(a.addr, b.addr).await;
    const UNITS: u32 = 600;
    const USERS: u64 = 3000;
    const IN_FLIGHT: usize = 32;
    env.item(803, UNITS).on_sale(&a).await;

    // 3,000 buyers through nginx, 32 at a time; a buyer whose answer is a 503 presses again
    // (as the page says to), up to five times. Instance B dies after 300 answers, while
    // units are still selling.
    let answered = Arc::new(AtomicU64::new(0));
    let burst = futures::stream::iter(1..=USERS)
        .map(|user| {
            let (http, nginx, token, answered) = (
                env.http.clone(),
                nginx.addr,
                env.token(user),
                answered.clone(),
            );
            async move {
                let mut last = (0, Value::Null);
                for _ in 0..5 {
                    let (status, body, _) = press(&http, nginx, &token, 803).await;
                    answered.fetch_add(1, Ordering::Relaxed);
                    last = (status, body);
                    if status != 503 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (user, last)
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>();
    let killer = async {
        eventually(Duration::from_secs(60), "300 answers", || async {
            let n = answered.load(Ordering::Relaxed);
            if n >= 300 {
                Ok(())
            } else {
                Err(format!("{n} answers"))
            }
        })
        .await;
        // At once: a look at B first (its /metrics) took long enough on a busy machine
        // for a third of the burst to pass before the kill.
        kill_hard(&mut child_b);
        answered.load(Ordering::Relaxed)
    };
    let (answers, at_kill) = tokio::join!(burst, killer);
    // B took its share of the traffic before it died: its log has units it sold.
    let sold_by_b = lines_b
        .lock()
        .unwrap()
        .iter()
        .any(|line| line.contains("\"redis_grab\"") && line.contains("\"won\""));
    assert!(sold_by_b, "B sold nothing");
    // B died mid-burst: most buyers pressed after it was gone.
    assert!(
        answered.load(Ordering::Relaxed) >= at_kill + 2000,
        "only {} answers after the kill",
        answered.load(Ordering::Relaxed) - at_kill
    );

    // Every buyer ends with an answer from the API. A won unit is a 202, or a 409 naming
    // the order when B sold it and died before answering and the buyer pressed again while
    // units remained; once sold out, pressing again answers 410 from memory (without
    // looking the buyer up) — and such a buyer finds the order with my-order, as the
    // storefront does: every unit sold, its buyer hears of it.
    let mut won = Vec::new();
    let mut told_sold_out = Vec::new();
    for (user, (status, body)) in &answers {
        match status {
            202 => won.push(body["order_sn"].as_str().unwrap().to_owned()),
            409 => {
                assert_eq!(body["code"], "duplicate", "{body}");
                won.push(body["order_sn"].as_str().unwrap().to_owned());
            }
            410 => {
                assert_eq!(body["code"], "sold_out");
                told_sold_out.push(*user);
            }
            other => panic!("unexpected answer {other}: {body}"),
        }
    }
    let mut found = 0;
    for user in told_sold_out {
        let mine = env
            .http
            .get(nginx.url("/api/items/803/my-order"))
            .bearer_auth(env.token(user))
            .send()
            .await
            .unwrap();
        if mine.status() == 200 {
            let order: Value = mine.json().await.unwrap();
            won.push(order["order_sn"].as_str().unwrap().to_owned());
            found += 1;
        }
    }
    assert_eq!(
        won.len(),
        UNITS as usize,
        "every unit's buyer knows their order ({found} found through my-order)"
    );

    // A (consumer and relay) writes every order, also those B won and never sent: every
    // unit is in MySQL, every order answered is there, and the stock adds up.
    env.wait_for_orders(&a, 803, UNITS as usize, Duration::from_secs(60))
        .await;
    env.assert_invariants(&a, 803, UNITS, &won).await;
    drop(nginx);
    stop_process(child_a, reader_a);
}
