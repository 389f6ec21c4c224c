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
    updated_at: DateTime<Utc>,
    pay_deadline: DateTime<Utc>,
}

/// A charge told of (`payment.succeeded`), with its order as MySQL holds it.
#[derive(sqlx::FromRow)]
struct Charge {
    event_id: String,
    outcome: String,
    provider_ref: String,
    status: Option<String>,
    paid_ref: Option<String>,
}

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
            "SELECT order_sn, user_id, status, cancel_reason, updated_at, pay_deadline
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
                        "user {user}'s 202 {sn} is cancelled in MySQL ({:?}) with nothing to explain it (invariant 3)",
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

    // 8. Every charge told of is paid for, owed back or returned: a `payment.succeeded`
    // that paid (or revived) its order leaves it paid by that charge, or refunded; one owed
    // back leaves it `refund_due` or `refunded`; none is left held or half applied.
    // An event held while its order was on its way is applied by the scheduler's next
    // step (each second) once the order is in MySQL.
    for _ in 0..30 {
        let held: i64 = read_patiently("the held payment events", || {
            sqlx::query_scalar("SELECT COUNT(*) FROM payment_events WHERE outcome = 'held'")
                .fetch_one(&env.db)
        })
        .await;
        if held == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let charges: Vec<Charge> = read_patiently("the history's charges", || {
        sqlx::query_as(
            "SELECT e.event_id, e.outcome, e.provider_ref, o.status, o.paid_ref
                   FROM payment_events e LEFT JOIN orders o ON o.order_sn = e.order_sn
                  WHERE e.type = 'payment.succeeded'",
        )
        .fetch_all(&env.db)
    })
    .await;
    for Charge {
        event_id: event,
        outcome,
        provider_ref: charge,
        status,
        paid_ref,
    } in charges
    {
        let kept = match outcome.as_str() {
            "paid" | "revived" => {
                matches!(status.as_deref(), Some("paid" | "refunded"))
                    && paid_ref.as_deref() == Some(charge.as_str())
            }
            "refund_due" => matches!(status.as_deref(), Some("refund_due" | "refunded")),
            "held" | "applying" => false,
            _ => true,
        };
        if !kept {
            broken.push(format!(
                "charge {charge} (event {event}) ended {outcome}, its order {status:?} paid by {paid_ref:?} (invariant 8)"
            ));
        }
    }

    // 1 and 2 over the history: at no moment more live orders than units, nor a buyer
    // holding more than the limit (the server's own judge reads the same facts).
    let id = seckill::domain::ItemId::new(ITEM).expect("an item id");
    match seckill::testing::held_over_time(&env.db, id, oracle.per_user_max).await {
        Err(e) => broken.push(format!("what the orders held over time: {e}")),
        Ok(held) => {
            if held.most_at_once > u64::from(oracle.total_max) {
                broken.push(format!(
                    "{} orders held units at one moment, of {} units (invariant 1, over the history)",
                    held.most_at_once, oracle.total_max
                ));
            }
            for user in held.over_limit {
                broken.push(format!(
                    "user {user} held more than {} orders at one moment (invariant 2, over the history)",
                    oracle.per_user_max
                ));
            }
        }
    }
    for what in broken {
        oracle.violations.push(format!("at the end: {what}"));
    }
}
