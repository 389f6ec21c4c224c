//! The delay queue: one sorted set per bucket of an item, task → when it is due (ms), plus
//! the set of tasks a scheduler has taken under a lease (`lua/claim.lua`). A capability of
//! its own: orders schedule into it, the scheduler works it.
//!
//! Tasks are added when an order reaches MySQL (by the consumer, or by a pay or cancel of
//! a still-pending order), never before: a due task's order is always in MySQL.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{RemindStages, Settings};
use crate::domain::{BucketId, OrderPlaced, OrderSn};
use crate::keys::Keys;
use crate::lua::{CLAIM, FINISH};
use crate::store::{Grouped, RedisError, redis_timed};

/// One thing to do for one order at one time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Task {
    /// Its pay deadline: cancel it if still unpaid.
    Cancel(OrderSn),
    /// A reminder stage (percent of the pay timeout elapsed): tell other services.
    Remind { percent: u8, order_sn: OrderSn },
}

impl Task {
    /// The sorted-set member: `cancel|SN` or `remind:50|SN`.
    pub fn member(&self) -> String {
        match self {
            Task::Cancel(sn) => format!("cancel|{sn}"),
            Task::Remind { percent, order_sn } => format!("remind:{percent}|{order_sn}"),
        }
    }

    pub fn parse(member: &str) -> Option<Self> {
        let (kind, sn) = member.split_once('|')?;
        let order_sn = OrderSn::parse(sn)?;
        match kind {
            "cancel" => Some(Task::Cancel(order_sn)),
            _ => {
                let percent = kind.strip_prefix("remind:")?.parse().ok()?;
                Some(Task::Remind { percent, order_sn })
            }
        }
    }

    pub fn order_sn(&self) -> &OrderSn {
        match self {
            Task::Cancel(sn) | Task::Remind { order_sn: sn, .. } => sn,
        }
    }
}

/// What gets scheduled for each order: its deadline, the reminder stages, and whether
/// wake-up keys are written for keyspace notifications.
#[derive(Clone, Debug)]
pub struct Plan {
    pub stages: RemindStages,
    pub wake_keys: bool,
}

impl Plan {
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            stages: settings.remind_at_percent.clone(),
            wake_keys: settings.keyspace_events,
        }
    }

    /// The order's tasks and when each is due (ms).
    pub fn tasks(&self, order: &OrderPlaced) -> Vec<(Task, i64)> {
        let span = (order.pay_deadline_ms - order.created_at_ms).max(0);
        let mut tasks: Vec<(Task, i64)> = self
            .stages
            .percents()
            .iter()
            .map(|&percent| {
                let at = order.created_at_ms + span * i64::from(percent) / 100;
                let task = Task::Remind {
                    percent,
                    order_sn: order.order_sn.clone(),
                };
                (task, at)
            })
            .collect();
        tasks.push((Task::Cancel(order.order_sn.clone()), order.pay_deadline_ms));
        tasks
    }

    /// Adds the orders' tasks: one `ZADD` per bucket, and one wake-up key per second in which
    /// something falls due (each a group of its own: they are keys of different slots).
    /// Idempotent: adding them twice changes nothing.
    pub fn schedule(&self, grouped: &mut Grouped, keys: &Keys, orders: &[OrderPlaced]) {
        let now_ms = crate::clock::now().timestamp_millis();
        let mut by_stock: BTreeMap<BucketId, Vec<(i64, String)>> = BTreeMap::new();
        let mut wake_seconds = BTreeSet::new();
        for order in orders {
            let tasks = by_stock.entry(order.order_sn.bucket()).or_default();
            for (task, at) in self.tasks(order) {
                if self.wake_keys && at > now_ms {
                    // Expires as the second after `at` begins: its expiry event is the hint.
                    wake_seconds.insert(at.div_euclid(1000) + 1);
                }
                tasks.push((at, task.member()));
            }
        }
        for (stock, tasks) in by_stock {
            // NX: a task a scheduler put back for later keeps its new time.
            let pipe = grouped.group();
            pipe.cmd("ZADD").arg(keys.due(stock)).arg("NX");
            for (at, member) in tasks {
                pipe.arg(at).arg(member);
            }
            pipe.ignore();
        }
        for second in wake_seconds {
            grouped
                .group()
                .cmd("SET")
                .arg(keys.wake(second))
                .arg(1)
                .arg("PXAT")
                .arg(second * 1000)
                .ignore();
        }
    }
}

/// Tasks a scheduler took, under one lease.
#[derive(Debug)]
pub struct Claimed {
    /// When the lease runs out (ms): also what tells this scheduler's hold from a later
    /// one's (see [`finish`]).
    pub lease_end_ms: i64,
    /// The tasks; entries that are not tasks come back as `Err(member)`, to be dropped.
    pub tasks: Vec<Result<Task, String>>,
}

/// Takes up to `limit` due tasks (and tasks whose lease ran out) for `lease_ms`.
pub async fn claim<C>(
    conn: &mut C,
    keys: &Keys,
    stock: BucketId,
    lease_ms: u64,
    limit: usize,
) -> Result<Claimed, RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    let now = crate::clock::now().timestamp_millis();
    let lease_end_ms = now + lease_ms as i64;
    let members: Vec<String> = redis_timed(
        CLAIM
            .key(keys.due(stock))
            .key(keys.leased(stock))
            .arg(now)
            .arg(lease_end_ms)
            .arg(limit)
            .invoke_async(conn),
    )
    .await?;
    Ok(Claimed {
        lease_end_ms,
        tasks: members
            .into_iter()
            .map(|m| Task::parse(&m).ok_or(m))
            .collect(),
    })
}

/// Done with these tasks (`again_at_ms` = `None`), or not done yet: back in the queue,
/// due at `again_at_ms`. Only tasks still held under the lease that ends at `lease_end_ms`
/// are touched: a scheduler that overran its lease never takes another's hold away.
/// Returns how many were still this scheduler's.
pub async fn finish<C>(
    conn: &mut C,
    keys: &Keys,
    stock: BucketId,
    lease_end_ms: i64,
    members: &[String],
    again_at_ms: Option<i64>,
) -> Result<u64, RedisError>
where
    C: redis::aio::ConnectionLike + Send,
{
    if members.is_empty() {
        return Ok(0);
    }
    redis_timed(
        FINISH
            .key(keys.leased(stock))
            .key(keys.due(stock))
            .arg(lease_end_ms)
            .arg(again_at_ms.map(|ms| ms.to_string()).unwrap_or_default())
            .arg(members)
            .invoke_async(conn),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ItemId, UserId};

    #[test]
    fn tasks_round_trip_through_their_member() {
        let sn = OrderSn::generate(BucketId::whole(ItemId::new(9).unwrap()), false);
        for task in [
            Task::Cancel(sn.clone()),
            Task::Remind {
                percent: 50,
                order_sn: sn.clone(),
            },
        ] {
            assert_eq!(Task::parse(&task.member()), Some(task));
        }
        assert_eq!(Task::parse("cancel|nope"), None);
        assert_eq!(Task::parse(&format!("remind:x|{sn}")), None);
        assert_eq!(Task::parse(&format!("other|{sn}")), None);
    }

    #[test]
    fn reminders_fall_at_their_share_of_the_pay_timeout() {
        let item = ItemId::new(9).unwrap();
        let order = OrderPlaced {
            order_sn: OrderSn::generate(BucketId::whole(item), false),
            item_id: item,
            user_id: UserId::new(1),
            created_at_ms: 10_000,
            pay_deadline_ms: 20_000,
            slot: 0,
        };
        let plan = Plan {
            stages: RemindStages::new(vec![50, 90]),
            wake_keys: false,
        };
        let at: Vec<i64> = plan.tasks(&order).into_iter().map(|(_, at)| at).collect();
        assert_eq!(at, vec![15_000, 19_000, 20_000]);
    }
}
