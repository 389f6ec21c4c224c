//! What buyers were told during a burst with a fault, and the total check against it:
//! a Jepsen-style history (every answer, reduced to what the check needs), crowds that
//! press again as real buyers do, the check that the sale lives on through a fault (only
//! the answers the fault matrix allows, within its bounds, and every unit sold after it),
//! and the check that every `202` is exactly one row and no row is unexplained. Shared by
//! the fault suite and the cluster tests.

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
    /// When buyers first and last heard a `503`, whatever its code.
    unavailable: Option<(Instant, Instant)>,
    /// Units a [`top_up`] crowd bought after the fault's burst (in `won` too).
    pub topped_up: usize,
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
        if let Some((first, last)) = other.unavailable {
            self.refused(first);
            self.refused(last);
        }
        self.topped_up += other.topped_up;
    }

    fn troubled(&mut self, at: Instant) {
        self.trouble = Some(widened(self.trouble, at));
    }

    fn refused(&mut self, at: Instant) {
        self.unavailable = Some(widened(self.unavailable, at));
    }
}

/// The span from `first` to `last`, widened to take in `at`.
fn widened(span: Option<(Instant, Instant)>, at: Instant) -> (Instant, Instant) {
    match span {
        Some((first, last)) => (first.min(at), last.max(at)),
        None => (at, at),
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
        if label.starts_with("503") {
            self.refused(Instant::now());
        }
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

/// What [`measured`] measured of a fault: since it began, when buyers first and last got
/// an answer that could not tell, and a `503` of any code, and how long until now
/// (everything in MySQL, when called once the item is quiet).
pub struct Measured {
    pub trouble: Option<(Duration, Duration)>,
    pub unavailable: Option<(Duration, Duration)>,
    pub drained: Duration,
}

/// What buyers saw and how long the way back took, for the fault matrix (docs/faults.md).
pub fn measured(fault: &str, began: Instant, ledger: &Ledger) -> Measured {
    let since = |span: Option<(Instant, Instant)>| {
        span.map(|(first, last)| {
            (
                first.saturating_duration_since(began),
                last.saturating_duration_since(began),
            )
        })
    };
    let (trouble, unavailable) = (since(ledger.trouble), since(ledger.unavailable));
    let drained = began.elapsed();
    eprintln!(
        "fault matrix: {fault}: answers that could not tell from +{:?} to +{:?} after the fault, 503s from +{:?} to +{:?}; everything in MySQL {drained:?} after it",
        trouble.map(|t| t.0),
        trouble.map(|t| t.1),
        unavailable.map(|t| t.0),
        unavailable.map(|t| t.1),
    );
    Measured {
        trouble,
        unavailable,
        drained,
    }
}

/// Answers of a sale going on as usual: a unit, or sold out.
pub const SELLING: &[&str] = &["202 queued", "410 sold_out"];

/// What the fault matrix (docs/faults.md) promises buyers across one fault, asserted by
/// [`after_fault`]: the answers they may hear, until when answers may fail to tell, and
/// how soon every order is in MySQL. Each test states its own, with the margin it allows a
/// loaded 2-core CI machine over the figure docs/faults.md gives.
pub struct Liveness<'a> {
    /// The fault, as the fault matrix's line printed for it names it.
    pub fault: &'a str,
    /// Answers buyers may hear (`"202 queued"`, `"409 duplicate"`, `"503 unavailable"`,
    /// `"transport"`, …: status and code, as [`Ledger::answers`] counts them); any other
    /// fails the test.
    pub allowed: &'static [&'static str],
    /// The last answer that could not tell, and the last `503` of any code, came at most
    /// this long after the fault began (what can come at all is up to `allowed`).
    pub trouble_within: Duration,
    /// Every order in MySQL, and nothing pending, at most this long after the fault began.
    pub drained_within: Duration,
}

impl<'a> Liveness<'a> {
    /// Buyers hear only [`SELLING`]: the fault goes unnoticed; every order in MySQL
    /// within `drained_within`.
    pub fn unnoticed(fault: &'a str, drained_within: Duration) -> Self {
        Liveness {
            fault,
            allowed: SELLING,
            trouble_within: Duration::ZERO,
            drained_within,
        }
    }

    /// Asserts what buyers heard and how long the way back took against the promise.
    pub fn assert_kept(&self, measured: &Measured, ledger: &Ledger) {
        let fault = self.fault;
        assert_answers(fault, self.allowed, ledger);
        for (what, span) in [
            ("an answer that could not tell", measured.trouble),
            ("a 503", measured.unavailable),
        ] {
            if let Some((_, last)) = span {
                assert!(
                    last <= self.trouble_within,
                    "{fault}: {what} {last:?} after the fault (allowed: {:?}); answers {:?}",
                    self.trouble_within,
                    ledger.answers
                );
            }
        }
        assert!(
            measured.drained <= self.drained_within,
            "{fault}: every order in MySQL only {:?} after the fault (allowed: {:?})",
            measured.drained,
            self.drained_within
        );
    }
}

/// Every answer in the ledger is one of `allowed`.
pub fn assert_answers(what: &str, allowed: &[&str], ledger: &Ledger) {
    let other: BTreeMap<&String, &u64> = ledger
        .answers
        .iter()
        .filter(|(answer, _)| !allowed.contains(&answer.as_str()))
        .collect();
    assert!(
        other.is_empty(),
        "{what}: answers outside {allowed:?}: {other:?} (all: {:?})",
        ledger.answers
    );
}

/// The first user of the top-up crowds: beyond any test's own buyers.
const TOP_UP_FROM: u64 = 5_000_000;

/// After a fault's burst, fresh buyers press at `server` until item `item` is sold out:
/// as many as units are listed in Redis and a few more, in rounds (a second apart, the
/// contract's time for every instance to forget "sold out") while units remain, at most
/// four. Returns what they heard; the caller asserts what they should have.
pub async fn top_up(env: &TestEnv, server: &TestServer, item: u64) -> Ledger {
    let answered = AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let mut ledger = Ledger::default();
    let mut next = TOP_UP_FROM;
    for round in 0..4 {
        let left = env.in_redis(item).await.remaining;
        if left == 0 {
            break;
        }
        if round > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let users = next..next + left + 8;
        next = users.end;
        ledger.merge(crowd(env, item, users, &at, &answered).await);
    }
    ledger
}

/// The sale goes on to its last unit: a [`top_up`] crowd hears only [`SELLING`], and once
/// quiet nothing is listed and every unit is an unpaid or paid order. Its answers join
/// `ledger` (for the total check).
pub async fn sells_out(
    env: &TestEnv,
    server: &TestServer,
    item: u64,
    total: u32,
    amqp: &str,
    ledger: &mut Ledger,
) {
    let mut topped = top_up(env, server, item).await;
    assert_answers("the top-up crowd after the fault", SELLING, &topped);
    topped.topped_up = topped.won.len();
    ledger.merge(topped);
    quiet(env, server, item, amqp, Duration::from_secs(60)).await;
    let stats = env.stats(server, item).await;
    let held = stats["orders"]["unpaid"].as_u64().unwrap_or(0)
        + stats["orders"]["paid"].as_u64().unwrap_or(0);
    assert_eq!(
        (stats["remaining"].as_u64(), held),
        (Some(0), u64::from(total)),
        "not every unit sold after the fault: {stats}; answers {:?}",
        ledger.answers
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

/// After a fault on a sale of item 1 that `began` then: buyers left uncertain ask for
/// their orders, everything drains, what buyers saw and how long it took is printed and
/// held to `liveness`; then fresh buyers buy every unit left ([`sells_out`]), and the
/// total check runs over every answer.
pub async fn after_fault(
    env: &TestEnv,
    server: &TestServer,
    total: u32,
    amqp: &str,
    began: Instant,
    ledger: &mut Ledger,
    liveness: &Liveness<'_>,
) {
    ask_uncertain(env, server, 1, ledger).await;
    let limit = liveness.drained_within.max(Duration::from_secs(60));
    quiet(env, server, 1, amqp, limit).await;
    let measured = measured(liveness.fault, began, ledger);
    liveness.assert_kept(&measured, ledger);
    sells_out(env, server, 1, total, amqp, ledger).await;
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
/// 200 answers; then [`after_fault`] with `liveness`. Returns every answer (the top-up
/// crowd's too).
pub async fn fault_mid_burst(
    env: &TestEnv,
    server: &TestServer,
    amqp: &str,
    fault: impl std::future::Future<Output = ()>,
    liveness: &Liveness<'_>,
) -> Ledger {
    env.item(1, BURST_UNITS).on_sale(server).await;
    let answered = AtomicU64::new(0);
    let at = |_: u64, _: u32| server.addr;
    let (mut ledger, began) = tokio::join!(
        crowd(env, 1, 1..1_501, &at, &answered),
        mid_burst(&answered, 200, fault),
    );
    after_fault(env, server, BURST_UNITS, amqp, began, &mut ledger, liveness).await;
    ledger
}
