//! The contract's §7 judged over a whole history, not only its end: the stock at each
//! quiescent moment, and at the end every order MySQL holds against every answer the
//! history heard — a `202` whose order was inserted already cancelled is lost, a unit sold
//! twice and cancelled later is an oversell, one `Idempotency-Key` that bought twice is a
//! double purchase — and the sale still selling once every fault healed (liveness).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::support::*;

use super::oracle::Oracle;
use super::world::ITEM;

/// An order as MySQL holds it.
#[derive(sqlx::FromRow, Debug)]
struct Row {
    order_sn: String,
    user_id: u64,
    status: String,
    cancel_reason: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    pay_deadline: DateTime<Utc>,
}

/// An oversell or a double purchase shorter than this is the two clocks' disagreement (an
/// order's time is its API host's, a cancel's is MySQL's), not a unit held twice.
const CLOCKS_AGREE_WITHIN: chrono::Duration = chrono::Duration::milliseconds(100);

/// Invariant 4 at a quiescent moment (`stats` read then): the units in Redis, on sale or
/// held back for a wave still to come by the record, and the live orders in MySQL add up
/// to the total the last warm-up loaded (`loaded`: a changed `total` takes effect with a
/// forced one) — with nothing held back that Redis does not have; and the server's own
/// `consistent` is the contract's equation on the record's total, nothing softer. `Ok`
/// says what added up.
pub async fn stock(env: &TestEnv, stats: &Value, loaded: u32) -> Result<String, String> {
    let (total, plan): (u32, Option<String>) =
        sqlx::query_as("SELECT total, release_plan FROM items WHERE id = ?")
            .bind(ITEM)
            .fetch_one(&env.db)
            .await
            .map_err(|e| format!("the item's record: {e}"))?;
    let now = Utc::now();
    let unreleased: u64 = plan
        .as_deref()
        .and_then(|plan| serde_json::from_str::<Vec<Value>>(plan).ok())
        .into_iter()
        .flatten()
        .filter(|wave| {
            wave["at"]
                .as_str()
                .and_then(|at| at.parse::<DateTime<Utc>>().ok())
                .is_some_and(|at| at > now)
        })
        .filter_map(|wave| wave["units"].as_u64())
        .sum();
    let redis = env.in_redis(ITEM).await;
    let (unpaid, paid): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(CASE WHEN status = 'unpaid' THEN 1 END),
                COUNT(CASE WHEN status = 'paid' THEN 1 END)
           FROM orders WHERE item_id = ?",
    )
    .bind(ITEM)
    .fetch_one(&env.db)
    .await
    .map_err(|e| format!("the orders: {e}"))?;
    let live = (unpaid + paid) as u64;
    let said = format!(
        "{} units in Redis ({unreleased} of them held for a wave) + {unpaid} unpaid + {paid} paid, {loaded} loaded (total {total}), {} pending; stats consistent {}",
        redis.remaining, redis.pending, stats["consistent"]
    );
    let held_back_exists = redis.pending == 0 && redis.remaining >= unreleased;
    if !(held_back_exists && redis.remaining + live == u64::from(loaded)) {
        return Err(format!("stock does not add up (invariant 4): {said}"));
    }
    let consistent = held_back_exists && redis.remaining + live == u64::from(total);
    if stats["consistent"] != consistent {
        return Err(format!(
            "the server's `consistent` is not the contract's equation ({consistent}): {said}; stats {stats}"
        ));
    }
    Ok(said)
}

/// Every order MySQL holds against what the history heard: nothing lost, nothing
/// unexplained, no unit held twice at any moment, no buyer above the limit at any moment.
pub async fn orders(env: &TestEnv, oracle: &mut Oracle) {
    let rows: Vec<Row> = read_patiently("the history's orders", || {
        sqlx::query_as(
            "SELECT order_sn, user_id, status, cancel_reason, created_at, updated_at, pay_deadline
               FROM orders WHERE item_id = ?",
        )
        .bind(ITEM)
        .fetch_all(&env.db)
    })
    .await;
    let by_sn: HashMap<&str, &Row> = rows.iter().map(|r| (r.order_sn.as_str(), r)).collect();
    let mut broken = Vec::new();

    // 3. Every 202 is a row, and a live one until a cancel, its deadline or the sale's end
    // ended it.
    for (user, sn) in &oracle.won {
        match by_sn.get(sn.as_str()) {
            None => broken.push(format!(
                "user {user}'s 202 {sn} has no row in MySQL (invariant 3)"
            )),
            Some(row) if row.user_id != *user => broken.push(format!(
                "user {user}'s 202 {sn} is user {}'s order in MySQL",
                row.user_id
            )),
            Some(row) if row.status == "cancelled" => {
                let explained = match row.cancel_reason.as_deref() {
                    Some("user") => oracle.named.contains(sn),
                    // The timeout and a reconciliation end only orders past their deadline.
                    Some("timeout" | "reconcile") => row.pay_deadline <= row.updated_at,
                    _ => false,
                };
                if !explained {
                    broken.push(format!(
                        "user {user}'s 202 {sn} is cancelled in MySQL ({:?}) with nothing to explain it: inserted already cancelled? (invariant 3)",
                        row.cancel_reason
                    ));
                }
            }
            Some(_) => {}
        }
    }
    // Every row is explained by a 202, an order named to its buyer, a buyer who could not
    // tell, or a draw's entry.
    let won: std::collections::HashSet<&str> =
        oracle.won.iter().map(|(_, sn)| sn.as_str()).collect();
    for row in &rows {
        let explained = won.contains(row.order_sn.as_str())
            || oracle.named.contains(&row.order_sn)
            || oracle.unsure.contains(&row.user_id)
            || oracle.entered.contains(&row.user_id);
        if !explained {
            broken.push(format!(
                "an order no answer explains: {} of user {} ({})",
                row.order_sn, row.user_id, row.status
            ));
        }
    }
    // 5. A cancel answered 200 is a cancelled row.
    for sn in &oracle.cancelled {
        if by_sn
            .get(sn.as_str())
            .is_none_or(|r| r.status != "cancelled")
        {
            broken.push(format!(
                "{sn}'s cancel was answered 200 but MySQL does not have it cancelled (invariant 5)"
            ));
        }
    }

    // 1 and 2 over the history: at no moment more live orders than units, nor a buyer
    // holding more than the limit. An order is live from its win to its cancel.
    let span = |r: &Row| {
        let end = (r.status == "cancelled").then_some(r.updated_at - CLOCKS_AGREE_WITHIN);
        (r.created_at, end)
    };
    let most = most_at_once(rows.iter().map(span));
    if most > u64::from(oracle.total_max) {
        broken.push(format!(
            "{most} orders held units at one moment, of {} units (invariant 1, over the history)",
            oracle.total_max
        ));
    }
    let mut by_user: HashMap<u64, Vec<&Row>> = HashMap::new();
    for row in &rows {
        by_user.entry(row.user_id).or_default().push(row);
    }
    for (user, held) in by_user {
        let most = most_at_once(held.into_iter().map(span));
        if most > u64::from(oracle.per_user_max) {
            broken.push(format!(
                "user {user} held {most} orders at one moment, {} allowed (invariant 2, over the history)",
                oracle.per_user_max
            ));
        }
    }
    for what in broken {
        oracle.violations.push(format!("at the end: {what}"));
    }
}

/// The most intervals (start, end or none) that overlap at one moment.
fn most_at_once(spans: impl Iterator<Item = (DateTime<Utc>, Option<DateTime<Utc>>)>) -> u64 {
    let mut edges: Vec<(DateTime<Utc>, i64)> = Vec::new();
    for (start, end) in spans {
        match end {
            // Ended before it began (a row cancelled on insert, within the clocks' margin):
            // it held nothing.
            Some(end) if end <= start => {}
            Some(end) => edges.extend([(start, 1), (end, -1)]),
            None => edges.push((start, 1)),
        }
    }
    // At one instant an end comes before a start.
    edges.sort();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_count_what_is_held_at_once() {
        let t = |s: i64| DateTime::<Utc>::from_timestamp(s, 0).unwrap();
        assert_eq!(
            most_at_once([(t(0), Some(t(5))), (t(5), None)].into_iter()),
            1
        );
        assert_eq!(
            most_at_once([(t(0), Some(t(6))), (t(5), None)].into_iter()),
            2
        );
        assert_eq!(
            most_at_once([(t(3), Some(t(1))), (t(0), None)].into_iter()),
            1
        );
    }
}
