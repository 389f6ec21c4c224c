//! What buyers were told during a burst with a fault, and the total check against it:
//! a Jepsen-style history (every answer, reduced to what the check needs), crowds that
//! press again as real buyers do, and the check that every `202` is exactly one row and no
//! row is unexplained. Shared by the fault suite and the cluster tests.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;

use crate::support::*;

/// What the buyers were told: a Jepsen-style history, reduced to what the check needs.
#[derive(Default, Debug)]
pub struct Ledger {
    /// Order numbers answered `202`.
    pub won: Vec<String>,
    /// Order numbers a `409 duplicate` or the buyer's `my-order` named.
    pub named: HashSet<String>,
    /// Users who got an answer that cannot tell (a 5xx, a broken connection): their
    /// purchase may have won.
    pub uncertain: HashSet<u64>,
    /// Answers by status and code (`202 queued`, `503 unavailable`, `transport`, …).
    pub answers: BTreeMap<String, u64>,
    /// When buyers first and last got an answer that could not tell.
    trouble: Option<(Instant, Instant)>,
}

impl Ledger {
    pub fn merge(&mut self, other: Ledger) {
        self.won.extend(other.won);
        self.named.extend(other.named);
        self.uncertain.extend(other.uncertain);
        for (answer, n) in other.answers {
            *self.answers.entry(answer).or_default() += n;
        }
        if let Some((first, last)) = other.trouble {
            self.troubled(first);
            self.troubled(last);
        }
    }

    fn troubled(&mut self, at: Instant) {
        self.trouble = Some(match self.trouble {
            Some((first, last)) => (first.min(at), last.max(at)),
            None => (at, at),
        });
    }
}

/// A press's answer, as a buyer sees it.
pub enum Press {
    Won(String),
    Named(String),
    /// Sold out, not on sale: nothing more to try.
    Final,
    /// Try again shortly (rate limited, paused, a breaker).
    Later,
    /// No telling whether it won.
    Uncertain,
}

pub const PRESSES: u32 = 6;

/// One press of `user` at `addr`: its answer as a label (`202 queued`, `transport`, …)
/// and what it means to the buyer.
pub async fn press(
    env: &TestEnv,
    http: &reqwest::Client,
    item: u64,
    user: u64,
    addr: SocketAddr,
) -> (String, Press) {
    let sent = http
        .post(format!("http://{addr}/api/flashbuy"))
        .bearer_auth(env.token(user))
        .header(
            "x-client-time",
            chrono::Utc::now().timestamp_millis().to_string(),
        )
        .json(&serde_json::json!({ "item_id": item }))
        .send()
        .await;
    match sent {
        Err(_) => ("transport".to_owned(), Press::Uncertain),
        Ok(response) => {
            let status = response.status().as_u16();
            let json: Value = response.json().await.unwrap_or(Value::Null);
            let code = json["code"].as_str().unwrap_or("-").to_owned();
            let sn = json["order_sn"].as_str().map(str::to_owned);
            let press = match (status, code.as_str(), sn) {
                (202, _, Some(sn)) => Press::Won(sn),
                (409, "duplicate", Some(sn)) => Press::Named(sn),
                (403 | 404 | 410, _, _) => Press::Final,
                (429, _, _) | (503, "paused" | "circuit_open" | "shop_closed", _) => Press::Later,
                _ => Press::Uncertain,
            };
            (format!("{status} {code}"), press)
        }
    }
}

impl Ledger {
    /// Notes one press's answer; true when it tells the buyer something final (a win, their
    /// order named, sold out or not on sale).
    fn noted(&mut self, user: u64, label: String, press: Press) -> bool {
        *self.answers.entry(label).or_default() += 1;
        match press {
            Press::Won(sn) => self.won.push(sn),
            Press::Named(sn) => {
                self.named.insert(sn);
            }
            Press::Final => {}
            Press::Later => return false,
            Press::Uncertain => {
                self.uncertain.insert(user);
                self.troubled(Instant::now());
                return false;
            }
        }
        true
    }
}

/// One buyer: presses until told something final (at most [`PRESSES`] times, 200 ms
/// apart), at `target(attempt)`.
pub async fn buyer(
    env: &TestEnv,
    http: &reqwest::Client,
    item: u64,
    user: u64,
    target: &(dyn Fn(u64, u32) -> SocketAddr + Sync),
    answered: &AtomicU64,
) -> Ledger {
    let mut ledger = Ledger::default();
    for attempt in 0..PRESSES {
        let (label, answer) = press(env, http, item, user, target(user, attempt)).await;
        answered.fetch_add(1, Ordering::Relaxed);
        if ledger.noted(user, label, answer) {
            return ledger;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ledger
}

/// A crowd of `users`, 32 pressing at once; `answered` counts answers so that a fault
/// can be timed to the middle of it.
pub async fn crowd(
    env: &TestEnv,
    item: u64,
    users: impl IntoIterator<Item = u64>,
    target: &(dyn Fn(u64, u32) -> SocketAddr + Sync),
    answered: &AtomicU64,
) -> Ledger {
    crowd_of(env, item, users, target, answered, 32).await
}

/// A crowd of `users`, `at_once` pressing at the same time (each on a connection of its
/// own, as many browsers would).
pub async fn crowd_of(
    env: &TestEnv,
    item: u64,
    users: impl IntoIterator<Item = u64>,
    target: &(dyn Fn(u64, u32) -> SocketAddr + Sync),
    answered: &AtomicU64,
    at_once: usize,
) -> Ledger {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let ledgers: Vec<Ledger> = futures::stream::iter(users)
        .map(|user| buyer(env, &http, item, user, target, answered))
        .buffer_unordered(at_once)
        .collect()
        .await;
    let mut all = Ledger::default();
    for ledger in ledgers {
        all.merge(ledger);
    }
    all
}

/// `presses` presses at `addr`, `at_once` at the same time (each on a connection of its
/// own), by `users` users in turn (user 1, 2, …, `users`, 1, …): each presses again
/// whatever they were told, as a crowd hammering the button does.
pub async fn pressing(
    env: &TestEnv,
    item: u64,
    users: u64,
    presses: u64,
    addr: SocketAddr,
    at_once: usize,
) -> Ledger {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let answers: Vec<(u64, (String, Press))> = futures::stream::iter(0..presses)
        .map(|n| {
            let user = 1 + n % users;
            let http = &http;
            async move { (user, press(env, http, item, user, addr).await) }
        })
        .buffer_unordered(at_once)
        .collect()
        .await;
    let mut ledger = Ledger::default();
    for (user, (label, answer)) in answers {
        ledger.noted(user, label, answer);
    }
    ledger
}

/// Runs `fault` once `after` answers have come, while the crowd presses on; returns
/// when the fault began.
pub async fn mid_burst<F: std::future::Future<Output = ()>>(
    answered: &AtomicU64,
    after: u64,
    fault: F,
) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.load(Ordering::Relaxed) < after {
        assert!(Instant::now() < deadline, "the crowd never got that far");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let began = Instant::now();
    fault.await;
    began
}

/// What buyers saw and how long the way back took, for the fault matrix (docs/faults.md).
pub fn measured(fault: &str, began: Instant, ledger: &Ledger) {
    let trouble = ledger.trouble.map(|(first, last)| {
        (
            first.saturating_duration_since(began),
            last.saturating_duration_since(began),
        )
    });
    eprintln!(
        "fault matrix: {fault}: answers that could not tell from +{:?} to +{:?} after the fault; everything in MySQL {:?} after it",
        trouble.map(|t| t.0),
        trouble.map(|t| t.1),
        began.elapsed()
    );
}

/// Buyers who could not tell whether they won ask for their order, as the storefront
/// does after a lost answer.
pub async fn ask_uncertain(env: &TestEnv, server: &TestServer, item: u64, ledger: &mut Ledger) {
    let users: Vec<u64> = ledger.uncertain.iter().copied().collect();
    for user in users {
        let (status, json) = env
            .get(server, &format!("/api/items/{item}/my-order"), Some(user))
            .await;
        if status == 200 {
            ledger
                .named
                .insert(json["order_sn"].as_str().unwrap().to_owned());
        }
    }
}

/// Waits until nothing is on its way: nothing pending in Redis, the order queue empty,
/// and MySQL holding every unit Redis counts as sold.
pub async fn quiet(env: &TestEnv, server: &TestServer, item: u64, amqp: &str, limit: Duration) {
    let queue = env.topology().orders_queue;
    eventually(limit, "quiescent", || async {
        let stats = env.stats(server, item).await;
        let depth = queue_depth_on(amqp, &queue).await;
        let held = stats["orders"]["unpaid"].as_u64().unwrap_or(0)
            + stats["orders"]["paid"].as_u64().unwrap_or(0);
        if stats["pending"] == 0 && stats["sold"].as_u64() == Some(held) && depth == Some(0) {
            Ok(())
        } else {
            Err(format!("{stats} queue {depth:?}"))
        }
    })
    .await;
}

/// After a fault on a sale of item 1: buyers left uncertain ask for their orders,
/// everything drains, what buyers saw and how long it took is printed (`fault`), and the
/// total check runs.
pub async fn after_fault(
    env: &TestEnv,
    server: &TestServer,
    total: u32,
    amqp: &str,
    fault: &str,
    began: Instant,
    ledger: &mut Ledger,
) {
    ask_uncertain(env, server, 1, ledger).await;
    quiet(env, server, 1, amqp, Duration::from_secs(60)).await;
    measured(fault, began, ledger);
    total_check(env, server, 1, total, ledger).await;
}

/// What MySQL holds against what buyers were told.
pub struct Tally {
    /// `202`s with no row.
    pub lost: Vec<String>,
    /// Rows no answer explains (not a `202`, not named by a `409` or `my-order`, not a
    /// buyer left uncertain).
    pub unexpected: Vec<(String, u64, String)>,
    /// Live rows beyond the item's units.
    pub oversold: usize,
}

/// The [`Tally`] of item `item` (`total` units), printed.
pub async fn tally(env: &TestEnv, item: u64, total: u32, ledger: &Ledger) -> Tally {
    let facts = env.order_facts(item, total, &ledger.won).await;
    let lost: Vec<String> = seckill::testing::invariants::missing(&ledger.won, &facts)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let rows = env.orders(item).await;
    let won: HashSet<&str> = ledger.won.iter().map(String::as_str).collect();
    let unexpected: Vec<(String, u64, String)> = rows
        .iter()
        .filter(|(sn, user, _)| {
            !won.contains(sn.as_str())
                && !ledger.named.contains(sn)
                && !ledger.uncertain.contains(user)
        })
        .cloned()
        .collect();
    let oversold = facts.oversold() as usize;
    eprintln!(
        "total check, item {item}: {} answers {:?}; {} rows; {} won; {} uncertain buyers; lost {}; unexpected {}; oversold {oversold}",
        ledger.answers.values().sum::<u64>(),
        ledger.answers,
        rows.len(),
        won.len(),
        ledger.uncertain.len(),
        lost.len(),
        unexpected.len(),
    );
    Tally {
        lost,
        unexpected,
        oversold,
    }
}

/// The total check: every `202` is exactly one row (lost = 0), every row is explained by
/// a `202`, a `409` or `my-order` naming it, or a buyer left uncertain (unexpected = 0);
/// then invariants 1–4 of CONTRACT §7.
pub async fn total_check(
    env: &TestEnv,
    server: &TestServer,
    item: u64,
    total: u32,
    ledger: &Ledger,
) {
    let tally = tally(env, item, total, ledger).await;
    assert!(
        tally.lost.is_empty(),
        "202s with no row in MySQL: {:?}",
        tally.lost
    );
    assert!(
        tally.unexpected.is_empty(),
        "rows no answer explains: {:?}",
        tally.unexpected
    );
    env.assert_invariants(server, item, total, &ledger.won)
        .await;
}

/// Units of the item a [`fault_mid_burst`] sells.
pub const BURST_UNITS: u32 = 500;

/// A crowd of 1,500 buyers on item 1 ([`BURST_UNITS`] units) at one server, `fault` after
/// 200 answers; then the buyers left uncertain ask for their orders, everything drains,
/// what buyers saw is printed (`name`) and the total check runs.
pub async fn fault_mid_burst(
    env: &TestEnv,
    server: &TestServer,
    amqp: &str,
    name: &str,
    fault: impl std::future::Future<Output = ()>,
) -> Ledger {
    env.item(1, BURST_UNITS).on_sale(server).await;
    let answered = AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let (mut ledger, began) = tokio::join!(
        crowd(env, 1, 1..1_501, &at, &answered),
        mid_burst(&answered, 200, fault),
    );
    after_fault(env, server, BURST_UNITS, amqp, name, began, &mut ledger).await;
    ledger
}
