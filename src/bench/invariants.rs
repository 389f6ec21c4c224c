//! docs/contract.md section 7, checked by the bench itself against Redis and MySQL once the
//! order queue has drained — not taken from the server's own word.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;
use serde::Serialize;

use crate::config::Settings;
use crate::domain::{ItemId, Stock};

use crate::items::repo as items;
use crate::items::stock::{StockSnapshot, item_snapshot};
use crate::keys::Keys;
use crate::orders::repo::{self, OrderStatus};
use crate::store::{Db, RedisConns, connect_mysql};

use super::fire::Run;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Held,
    Broken,
    /// Nothing in this run could test it.
    NotExercised,
}

#[derive(Debug, Serialize)]
pub struct Check {
    pub number: u8,
    pub name: &'static str,
    pub outcome: Outcome,
    pub detail: String,
}

fn check(number: u8, name: &'static str, held: bool, detail: String) -> Check {
    let outcome = if held { Outcome::Held } else { Outcome::Broken };
    Check {
        number,
        name,
        outcome,
        detail,
    }
}

/// The orders of one item as MySQL holds them, as far as the checks need them.
struct Orders {
    total: u64,
    unpaid: u64,
    paid: u64,
    /// Rows of the item in any status.
    rows: u64,
    /// Of the order numbers the crowd was answered, those MySQL has.
    answered_found: HashSet<String>,
    /// Of the orders the crowd cancelled, those MySQL has as cancelled.
    cancelled_found: HashSet<String>,
    /// Users holding more live orders than the item's `per_user` (at most a few, for the
    /// report).
    doubled: Vec<u64>,
}

/// Waits for the queue to drain (`pending` = 0 in Redis), then checks the invariants.
pub async fn check_all(
    settings: &Settings,
    item: ItemId,
    run: &Run,
    drain_timeout: Duration,
) -> anyhow::Result<Vec<Check>> {
    let redis = RedisConns::new(settings.redis_url.expose()).context("SECKILL_REDIS_URL")?;
    let db = connect_mysql(settings.database_url.expose()).await?;
    let keys = Keys::new(&settings.namespace);
    let record = items::get(&db, item)
        .await
        .context("reading the item from MySQL")?
        .with_context(|| format!("item {item} is not in MySQL"))?;

    let stock = drain(&redis, &keys, record.stocks(), drain_timeout).await?;
    let orders = orders(&db, item, run).await?;
    let mut checks = judge(&stock, &orders, run, drain_timeout);
    if record.draw_cutoff.is_some() || record.drawn_at.is_some() {
        checks.push(drawn_by_rank(&db, &redis, &keys, &record).await?);
    }
    db.close().await;
    Ok(checks)
}

/// A draw's check: every entry ranked at or below the published cut-off was given a unit
/// (it has an order, in whatever state), and nobody else was.
async fn drawn_by_rank(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    item: &items::Item,
) -> anyhow::Result<Check> {
    let cutoff = item.draw_cutoff.unwrap_or(0);
    let mut ranked: HashSet<u64> = HashSet::new();
    let mut conn = redis.bulk().await.context("connecting to Redis")?;
    for stock in item.stocks() {
        let users: Vec<u64> =
            redis::AsyncCommands::zrangebyscore(&mut conn, keys.entries(stock), "-inf", cutoff)
                .await
                .context("reading the draw's entries")?;
        ranked.extend(users);
    }
    let given: HashSet<u64> = repo::users_with_orders(db, item.id)
        .await
        .context("reading the draw's orders")?
        .into_iter()
        .collect();
    let strays = given.difference(&ranked).count();
    let missed = ranked.difference(&given).count();
    Ok(check(
        6,
        "a draw's units went to its lowest ranks",
        strays == 0 && missed == 0,
        format!(
            "{} entries ranked at or below the cut-off {cutoff}, {} with an order; {strays} orders of others, {missed} of them without one",
            ranked.len(),
            ranked.len() - missed
        ),
    ))
}

/// Polls Redis until no won unit waits for its order row, or the time is up.
async fn drain(
    redis: &RedisConns,
    keys: &Keys,
    stocks: impl Iterator<Item = Stock> + Clone,
    limit: Duration,
) -> anyhow::Result<StockSnapshot> {
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(100));
    let deadline = Instant::now() + limit;
    let stock = loop {
        let mut conn = redis
            .bulk()
            .await
            .context("connecting to Redis to read the item's stock")?;
        let stock = item_snapshot(&mut conn, keys, stocks.clone())
            .await
            .context("reading the item's stock in Redis")?;
        if stock.pending == 0 || Instant::now() >= deadline {
            break stock;
        }
        bar.set_message(format!(
            "waiting for the order queue to drain: {} orders not yet in MySQL",
            stock.pending
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    bar.finish_and_clear();
    Ok(stock)
}

/// Order numbers per `IN (…)` query.
const SNS_PER_QUERY: usize = 1_000;

async fn orders(db: &Db, item: ItemId, run: &Run) -> anyhow::Result<Orders> {
    let record = items::get(db, item)
        .await
        .context("reading the item from MySQL")?
        .with_context(|| format!("item {item} is not in MySQL"))?;
    let total = record.total;
    let counts = repo::count_by_status(db, item)
        .await
        .context("counting the item's orders in MySQL")?;

    let mut held: HashMap<u64, u32> = HashMap::new();
    for order in repo::live_orders(db, item)
        .await
        .context("reading the item's live orders from MySQL")?
    {
        *held.entry(order.user_id).or_default() += 1;
    }
    let mut doubled: Vec<u64> = held
        .into_iter()
        .filter(|(_, n)| *n > u32::from(record.per_user))
        .map(|(u, _)| u)
        .collect();
    doubled.sort_unstable();
    doubled.truncate(5);

    let mut answered_found = HashSet::with_capacity(run.won.len());
    for sns in run.won.chunks(SNS_PER_QUERY) {
        let sns: Vec<&str> = sns.iter().map(String::as_str).collect();
        answered_found.extend(
            repo::existing(db, &sns)
                .await
                .context("looking the answered orders up in MySQL")?,
        );
    }
    let mut cancelled_found = HashSet::new();
    for sns in run.cancelled.chunks(SNS_PER_QUERY) {
        let sns: Vec<&str> = sns.iter().map(String::as_str).collect();
        let rows = repo::find_many(db, &sns)
            .await
            .context("looking the cancelled orders up in MySQL")?;
        cancelled_found.extend(
            rows.into_iter()
                .filter(|row| row.status == OrderStatus::Cancelled)
                .map(|row| row.order_sn.as_str().to_owned()),
        );
    }
    Ok(Orders {
        total: total.into(),
        unpaid: counts.unpaid,
        paid: counts.paid,
        rows: counts.unpaid + counts.paid + counts.cancelled,
        answered_found,
        cancelled_found,
        doubled,
    })
}

fn judge(stock: &StockSnapshot, orders: &Orders, run: &Run, drain_timeout: Duration) -> Vec<Check> {
    vec![
        no_oversell(stock, orders),
        no_double_purchase(orders),
        nothing_lost(stock, orders, run, drain_timeout),
        stock_adds_up(stock, orders),
        cancelled_units_come_back(stock, orders, run),
    ]
}

/// Orders that hold a unit (unpaid or paid).
fn live(orders: &Orders) -> u64 {
    orders.unpaid + orders.paid
}

fn no_oversell(stock: &StockSnapshot, orders: &Orders) -> Check {
    let live = live(orders);
    check(
        1,
        "no oversell",
        live + stock.pending <= orders.total,
        format!(
            "{live} unpaid or paid + {} pending ≤ {} units",
            stock.pending, orders.total
        ),
    )
}

fn no_double_purchase(orders: &Orders) -> Check {
    check(
        2,
        "no double purchase",
        orders.doubled.is_empty(),
        if orders.doubled.is_empty() {
            "no user holds two live orders".to_owned()
        } else {
            format!(
                "users holding more live orders than `per_user`: {:?}",
                orders.doubled
            )
        },
    )
}

/// Every `202` is a row, once; rows nobody was told of are named (not a failure).
fn nothing_lost(
    stock: &StockSnapshot,
    orders: &Orders,
    run: &Run,
    drain_timeout: Duration,
) -> Check {
    let answered: HashSet<&str> = run.won.iter().map(String::as_str).collect();
    let twice = run.won.len() - answered.len();
    let missing: Vec<&str> = answered
        .iter()
        .filter(|sn| !orders.answered_found.contains(**sn))
        .copied()
        .collect();
    let found = (answered.len() - missing.len()) as u64;
    let unseen = orders.rows.saturating_sub(found);
    let mut detail = format!("{} answers 202, {} of them in MySQL", run.won.len(), found);
    if twice > 0 {
        detail += &format!("; {twice} order numbers answered twice");
    }
    if !missing.is_empty() {
        let shown: Vec<_> = missing.iter().take(5).collect();
        detail += &format!("; missing: {shown:?}");
        if stock.pending > 0 {
            detail += &format!(
                " ({} orders still pending after {} s: is a consumer running?)",
                stock.pending,
                drain_timeout.as_secs()
            );
        }
    }
    if unseen > 0 {
        detail += &format!(
            "; {unseen} rows whose 202 never reached the bench (an answer lost on the way)"
        );
    }
    check(3, "nothing lost", twice == 0 && missing.is_empty(), detail)
}

fn stock_adds_up(stock: &StockSnapshot, orders: &Orders) -> Check {
    let live = live(orders);
    check(
        4,
        "stock adds up",
        stock.pending == 0 && stock.remaining + live == orders.total,
        format!(
            "{} remaining in Redis + {} unpaid + {} paid = {} (total {}), {} pending",
            stock.remaining,
            orders.unpaid,
            orders.paid,
            stock.remaining + live,
            orders.total,
            stock.pending
        ),
    )
}

fn cancelled_units_come_back(stock: &StockSnapshot, orders: &Orders, run: &Run) -> Check {
    if run.cancelled.is_empty() {
        return Check {
            number: 5,
            name: "cancelled units come back",
            outcome: Outcome::NotExercised,
            detail: "this run cancelled nothing (--cancel-percent does)".to_owned(),
        };
    }
    let not_cancelled = run
        .cancelled
        .iter()
        .filter(|sn| !orders.cancelled_found.contains(*sn))
        .count();
    // With invariant 4, a cancelled order's unit is counted in `remaining` (or sold again).
    check(
        5,
        "cancelled units come back",
        not_cancelled == 0 && stock.remaining + live(orders) == orders.total,
        format!(
            "{} orders cancelled by the crowd, {} of them cancelled in MySQL; their units \
             are back in the count of invariant 4",
            run.cancelled.len(),
            run.cancelled.len() - not_cancelled
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::bench::fire::histogram;

    fn run(won: &[&str], cancelled: &[&str]) -> Run {
        Run {
            started: chrono::Utc::now(),
            elapsed: Duration::from_secs(1),
            presses: won.len() as u64,
            attempts: won.len() as u64,
            retries: 0,
            answers: BTreeMap::new(),
            latency: histogram(),
            timeline: Vec::new(),
            won: won.iter().map(|s| s.to_string()).collect(),
            cancelled: cancelled.iter().map(|s| s.to_string()).collect(),
            cancel_failures: BTreeMap::new(),
        }
    }

    fn stock(remaining: u64, pending: u64) -> StockSnapshot {
        StockSnapshot {
            loaded: true,
            loaded_at_ms: Some(1),
            remaining,
            sold: 0,
            pending,
            reloading: false,
        }
    }

    /// Three units: a and b unpaid, c cancelled (its unit back), one remaining.
    fn orders() -> Orders {
        Orders {
            total: 3,
            unpaid: 2,
            paid: 0,
            rows: 3,
            answered_found: ["a", "b", "c"].map(str::to_owned).into(),
            cancelled_found: ["c".to_owned()].into(),
            doubled: Vec::new(),
        }
    }

    fn outcomes(checks: &[Check]) -> Vec<Outcome> {
        checks.iter().map(|c| c.outcome).collect()
    }

    const HELD: Outcome = Outcome::Held;
    const BROKEN: Outcome = Outcome::Broken;
    const WAIT: Duration = Duration::from_secs(1);

    #[test]
    fn a_clean_sale_holds_everything() {
        let checks = judge(
            &stock(1, 0),
            &orders(),
            &run(&["a", "b", "c"], &["c"]),
            WAIT,
        );
        assert_eq!(outcomes(&checks), [HELD; 5]);
        let checks = judge(&stock(1, 0), &orders(), &run(&["a", "b", "c"], &[]), WAIT);
        assert_eq!(checks[4].outcome, Outcome::NotExercised);
    }

    #[test]
    fn each_broken_invariant_is_named() {
        let sale = run(&["a", "b", "c"], &["c"]);
        // More live orders than units.
        let mut over = orders();
        over.unpaid = 4;
        assert_eq!(
            outcomes(&judge(&stock(0, 0), &over, &sale, WAIT))[0],
            BROKEN
        );
        // A user with two live orders.
        let mut doubled = orders();
        doubled.doubled = vec![42];
        let checks = judge(&stock(1, 0), &doubled, &sale, WAIT);
        assert_eq!(checks[1].outcome, BROKEN);
        assert!(checks[1].detail.contains("42"));
        // A 202 that never became a row, and one order number answered twice.
        let checks = judge(
            &stock(1, 0),
            &orders(),
            &run(&["a", "b", "c", "d"], &["c"]),
            WAIT,
        );
        assert_eq!(checks[2].outcome, BROKEN);
        assert!(checks[2].detail.contains("\"d\""), "{}", checks[2].detail);
        let checks = judge(&stock(1, 0), &orders(), &run(&["a", "a"], &[]), WAIT);
        assert_eq!(checks[2].outcome, BROKEN);
        // A unit missing from the count, or orders still pending.
        assert_eq!(
            judge(&stock(0, 0), &orders(), &sale, WAIT)[3].outcome,
            BROKEN
        );
        assert_eq!(
            judge(&stock(1, 1), &orders(), &sale, WAIT)[3].outcome,
            BROKEN
        );
        // An order the crowd cancelled that MySQL still holds.
        let checks = judge(
            &stock(1, 0),
            &orders(),
            &run(&["a", "b", "c"], &["b"]),
            WAIT,
        );
        assert_eq!(checks[4].outcome, BROKEN);
    }
}
