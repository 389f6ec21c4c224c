//! docs/contract.md section 7, invariants 1 to 5, judged from what MySQL and Redis hold once
//! an item is quiet — not from the server's own word. One implementation: `seckill rehearse`
//! gathers the facts its way (in chunks, for a sale of millions), the integration tests
//! theirs (every row), and both judge them here.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use crate::orders::repo::{HeldOverTime, OrderStatus};

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

pub(crate) fn check(number: u8, name: &'static str, held: bool, detail: String) -> Check {
    let outcome = if held { Outcome::Held } else { Outcome::Broken };
    Check {
        number,
        name,
        outcome,
        detail,
    }
}

/// What Redis holds of an item, over its buckets.
#[derive(Debug, Clone, Copy)]
pub struct InRedis {
    /// Units still listed (a wave's still to come among them).
    pub remaining: u64,
    /// Won units whose order is not in MySQL yet.
    pub pending: u64,
}

/// Users holding more live orders than this are named, at most, in a report.
const DOUBLED_SHOWN: usize = 5;

/// The orders of one item as MySQL holds them, as far as the checks need them.
#[derive(Debug)]
pub struct Orders {
    /// The item's units.
    pub total: u64,
    pub unpaid: u64,
    pub paid: u64,
    /// Rows of the item in any status.
    pub rows: u64,
    /// Of the order numbers the crowd was answered, those MySQL has.
    pub answered_found: HashSet<String>,
    /// Of the orders the crowd cancelled, those MySQL has as cancelled.
    pub cancelled_found: HashSet<String>,
    /// Users who held more live orders than the item's `per_user`, now or at any moment
    /// before (a few, for the report).
    pub doubled: Vec<u64>,
    /// The most orders that held a unit at one moment.
    pub most_at_once: u64,
    /// Orders MySQL wrote `cancelled` at once (a second live order it refused): a `202`
    /// among them never became the buyer's order.
    pub written_cancelled: HashSet<String>,
}

impl Orders {
    /// From every row of the item, `(order_sn, user_id, status)`, and what they held over
    /// time: `total` units, at most `per_user` live orders a buyer; `answered` and
    /// `cancelled` are what the crowd was told (`202`s, cancels answered `200`).
    pub fn from_rows<'a>(
        total: u64,
        per_user: u8,
        rows: impl IntoIterator<Item = (&'a str, u64, OrderStatus)>,
        over_time: HeldOverTime,
        told: (&[String], &[String]),
    ) -> Self {
        let (answered, cancelled) = told;
        let answered: HashSet<&str> = answered.iter().map(String::as_str).collect();
        let cancelled: HashSet<&str> = cancelled.iter().map(String::as_str).collect();
        let mut orders = Orders {
            total,
            unpaid: 0,
            paid: 0,
            rows: 0,
            answered_found: HashSet::new(),
            cancelled_found: HashSet::new(),
            doubled: Vec::new(),
            most_at_once: over_time.most_at_once,
            written_cancelled: over_time.written_cancelled.into_iter().collect(),
        };
        let mut held: HashMap<u64, u32> = HashMap::new();
        for (sn, user, status) in rows {
            orders.rows += 1;
            match status {
                OrderStatus::Unpaid => orders.unpaid += 1,
                OrderStatus::Paid => orders.paid += 1,
                // Its unit came back, whatever ended it after: its cancel, or a refund.
                OrderStatus::Cancelled | OrderStatus::RefundDue | OrderStatus::Refunded
                    if cancelled.contains(sn) =>
                {
                    orders.cancelled_found.insert(sn.to_owned());
                }
                OrderStatus::Cancelled | OrderStatus::RefundDue | OrderStatus::Refunded => {}
            }
            if status.holds_unit() {
                *held.entry(user).or_default() += 1;
            }
            if answered.contains(sn) {
                orders.answered_found.insert(sn.to_owned());
            }
        }
        orders.doubled = doubled(held, per_user, &over_time.over_limit);
        orders
    }

    /// Orders that hold a unit (unpaid or paid).
    pub fn live(&self) -> u64 {
        self.unpaid + self.paid
    }

    /// Live orders beyond the item's units.
    pub fn oversold(&self) -> u64 {
        self.live().saturating_sub(self.total)
    }
}

/// Of the live orders each user holds, the users beyond `per_user`, with those who were
/// beyond it at some moment before (`over_time`; the first few).
pub(crate) fn doubled(held: HashMap<u64, u32>, per_user: u8, over_time: &[u64]) -> Vec<u64> {
    let mut doubled: Vec<u64> = held
        .into_iter()
        .filter(|(_, n)| *n > u32::from(per_user))
        .map(|(u, _)| u)
        .chain(over_time.iter().copied())
        .collect();
    doubled.sort_unstable();
    doubled.dedup();
    doubled.truncate(DOUBLED_SHOWN);
    doubled
}

/// The order numbers answered `202` that MySQL does not have.
pub fn missing<'a>(answered: &'a [String], orders: &Orders) -> Vec<&'a str> {
    let mut missing: Vec<&str> = answered
        .iter()
        .map(String::as_str)
        .filter(|sn| !orders.answered_found.contains(*sn))
        .collect();
    missing.sort_unstable();
    missing.dedup();
    missing
}

/// Invariants 1 to 5 over the item's orders and its stock in Redis; `answered` are the
/// order numbers of every `202`, `cancelled` those of every cancel answered `200`;
/// `drain_timeout` is how long the caller waited for pending orders (for the report).
pub fn judge(
    stock: &InRedis,
    orders: &Orders,
    answered: &[String],
    cancelled: &[String],
    drain_timeout: Duration,
) -> Vec<Check> {
    vec![
        no_oversell(stock, orders),
        no_double_purchase(orders),
        nothing_lost(stock, orders, answered, drain_timeout),
        stock_adds_up(stock, orders),
        cancelled_units_come_back(stock, orders, cancelled),
    ]
}

fn no_oversell(stock: &InRedis, orders: &Orders) -> Check {
    let live = orders.live();
    check(
        1,
        "no oversell",
        live + stock.pending <= orders.total && orders.most_at_once <= orders.total,
        format!(
            "{live} unpaid or paid + {} pending ≤ {} units; at most {} held at one moment",
            stock.pending, orders.total, orders.most_at_once
        ),
    )
}

fn no_double_purchase(orders: &Orders) -> Check {
    check(
        2,
        "no double purchase",
        orders.doubled.is_empty(),
        if orders.doubled.is_empty() {
            "no user held more live orders than `per_user` at any moment".to_owned()
        } else {
            format!(
                "users who held more live orders than `per_user`: {:?}",
                orders.doubled
            )
        },
    )
}

/// Every `202` is a row, once; rows nobody was told of are named (not a failure).
fn nothing_lost(
    stock: &InRedis,
    orders: &Orders,
    answered: &[String],
    drain_timeout: Duration,
) -> Check {
    let distinct: HashSet<&str> = answered.iter().map(String::as_str).collect();
    let twice = answered.len() - distinct.len();
    let missing = missing(answered, orders);
    let found = (distinct.len() - missing.len()) as u64;
    let unseen = orders.rows.saturating_sub(found);
    let mut detail = format!("{} answers 202, {} of them in MySQL", answered.len(), found);
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
    // A 202 whose order MySQL wrote cancelled at once never was the buyer's order.
    let mut written_cancelled: Vec<&str> = distinct
        .iter()
        .copied()
        .filter(|sn| orders.written_cancelled.contains(*sn))
        .collect();
    written_cancelled.sort_unstable();
    if !written_cancelled.is_empty() {
        let shown: Vec<_> = written_cancelled.iter().take(5).collect();
        detail += &format!(
            "; {} answered 202 but written cancelled at once (a second live order MySQL refused): {shown:?}",
            written_cancelled.len()
        );
    }
    if unseen > 0 {
        detail += &format!(
            "; {unseen} rows whose 202 never reached the caller (an answer lost on the way)"
        );
    }
    let held = twice == 0 && missing.is_empty() && written_cancelled.is_empty();
    check(3, "nothing lost", held, detail)
}

/// Remaining units (a wave's still to come among them) + unpaid + paid = total, with
/// nothing pending.
fn stock_adds_up(stock: &InRedis, orders: &Orders) -> Check {
    let live = orders.live();
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

fn cancelled_units_come_back(stock: &InRedis, orders: &Orders, cancelled: &[String]) -> Check {
    if cancelled.is_empty() {
        return Check {
            number: 5,
            name: "cancelled units come back",
            outcome: Outcome::NotExercised,
            detail: "this run cancelled nothing (--cancel-percent does)".to_owned(),
        };
    }
    let not_cancelled: Vec<&str> = cancelled
        .iter()
        .map(String::as_str)
        .filter(|sn| !orders.cancelled_found.contains(*sn))
        .collect();
    // Units are alike: each cancelled order's unit is back when every unit is either
    // listed (on sale again) or held by a live order (sold again, or never cancelled).
    let accounted = stock.remaining + orders.live();
    let mut detail = format!(
        "{} orders cancelled, {} of them cancelled in MySQL; {} listed + {} unpaid or paid \
         = {accounted} of {} units",
        cancelled.len(),
        cancelled.len() - not_cancelled.len(),
        stock.remaining,
        orders.live(),
        orders.total
    );
    if accounted < orders.total {
        detail += &format!(
            "; {} units neither on sale nor sold again",
            orders.total - accounted
        );
    } else if accounted > orders.total {
        detail += &format!("; {} units back twice", accounted - orders.total);
    }
    if !not_cancelled.is_empty() {
        let shown: Vec<_> = not_cancelled.iter().take(5).collect();
        detail += &format!("; not cancelled in MySQL: {shown:?}");
    }
    check(
        5,
        "cancelled units come back",
        not_cancelled.is_empty() && accounted == orders.total,
        detail,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the crowd was told: the order numbers of its `202`s and of its cancels.
    struct Told(Vec<String>, Vec<String>);

    fn run(won: &[&str], cancelled: &[&str]) -> Told {
        let owned = |sns: &[&str]| sns.iter().map(|s| s.to_string()).collect();
        Told(owned(won), owned(cancelled))
    }

    fn judge(stock: &InRedis, orders: &Orders, told: &Told, wait: Duration) -> Vec<Check> {
        super::judge(stock, orders, &told.0, &told.1, wait)
    }

    fn stock(remaining: u64, pending: u64) -> InRedis {
        InRedis { remaining, pending }
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
            most_at_once: 2,
            written_cancelled: HashSet::new(),
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
        // Over the history: more orders held at one moment than units (an oversell
        // cancelled later), and a 202 whose order MySQL wrote cancelled at once.
        let mut once_over = orders();
        once_over.most_at_once = 4;
        let checks = judge(&stock(1, 0), &once_over, &sale, WAIT);
        assert_eq!(checks[0].outcome, BROKEN);
        assert!(checks[0].detail.contains("at most 4 held at one moment"));
        let mut written = orders();
        written.written_cancelled = ["b".to_owned()].into();
        let checks = judge(&stock(1, 0), &written, &sale, WAIT);
        assert_eq!(checks[2].outcome, BROKEN);
        assert!(
            checks[2].detail.contains("written cancelled at once"),
            "{}",
            checks[2].detail
        );
        // An order the crowd cancelled that MySQL still holds.
        let checks = judge(
            &stock(1, 0),
            &orders(),
            &run(&["a", "b", "c"], &["b"]),
            WAIT,
        );
        assert_eq!(checks[4].outcome, BROKEN);
        assert!(checks[4].detail.contains("\"b\""), "{}", checks[4].detail);
    }

    #[test]
    fn a_cancelled_unit_that_never_came_back_is_named() {
        // c is cancelled in MySQL, but its unit is neither listed nor sold again.
        let sale = run(&["a", "b", "c"], &["c"]);
        let checks = judge(&stock(0, 0), &orders(), &sale, WAIT);
        assert_eq!(checks[4].outcome, BROKEN);
        assert!(
            checks[4]
                .detail
                .contains("1 units neither on sale nor sold again"),
            "{}",
            checks[4].detail
        );
        // Sold again instead: c's unit went to d.
        let mut sold_again = orders();
        sold_again.unpaid = 3;
        sold_again.rows = 4;
        let checks = judge(&stock(0, 0), &sold_again, &sale, WAIT);
        assert_eq!(checks[4].outcome, HELD, "{}", checks[4].detail);
        // Listed twice: the unit came back once too often.
        let checks = judge(&stock(2, 0), &orders(), &sale, WAIT);
        assert_eq!(checks[4].outcome, BROKEN);
        assert!(
            checks[4].detail.contains("back twice"),
            "{}",
            checks[4].detail
        );
    }

    #[test]
    fn rows_become_the_facts_judged() {
        let rows = [
            ("a", 1, OrderStatus::Unpaid),
            ("b", 1, OrderStatus::Paid),
            ("c", 2, OrderStatus::Cancelled),
            ("d", 3, OrderStatus::Unpaid),
            ("e", 3, OrderStatus::Cancelled),
        ];
        let told = run(&["a", "b", "c", "x"], &["c"]);
        let over_time = |over_limit: Vec<u64>| HeldOverTime {
            most_at_once: 3,
            over_limit,
            written_cancelled: vec!["e".to_owned()],
        };
        let orders = Orders::from_rows(4, 1, rows, over_time(vec![]), (&told.0, &told.1));
        assert_eq!(
            (orders.unpaid, orders.paid, orders.rows, orders.live()),
            (2, 1, 5, 3)
        );
        assert_eq!(orders.doubled, [1], "user 1 holds two live orders");
        assert_eq!(orders.cancelled_found, ["c".to_owned()].into());
        assert_eq!(missing(&told.0, &orders), ["x"]);
        assert_eq!(orders.oversold(), 0);
        assert_eq!(orders.written_cancelled, ["e".to_owned()].into());
        let two_each = Orders::from_rows(2, 2, rows, over_time(vec![]), (&told.0, &told.1));
        assert!(two_each.doubled.is_empty());
        assert_eq!(two_each.oversold(), 1);
        // User 2 held two at one moment, though one of them is cancelled now.
        let once_doubled = Orders::from_rows(4, 1, rows, over_time(vec![2]), (&told.0, &told.1));
        assert_eq!(once_doubled.doubled, [1, 2]);
    }
}
