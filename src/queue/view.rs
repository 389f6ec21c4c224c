//! What a buyer in the waiting room is told (`GET …/queue/me`, its stream, a join's
//! answer): their state, their place, the wait, and — once let in — the pass.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::UserId;
use crate::items::repo::Item;

use super::line::Standing;
use super::pass::Signer;
use crate::items::queue_plan::QueuePlan;

/// Where the buyer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// In line; `position` says where.
    Waiting,
    /// Let in: `pass` buys (`X-Queue-Pass` on `POST /api/flashbuy`) until `pass_expires_at`.
    Admitted,
    /// No unit can come back (every unit paid for, or the sale over): the wait is over.
    SoldOut,
    /// Let in, and the pass ran out unused: the place went to the next in line.
    Expired,
    /// Let in, and bought with the pass.
    Done,
}

/// A buyer's place in the waiting room.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct QueueView {
    pub state: QueueState,
    /// 1-based place among those still waiting (`null` once let in). Before `start_at`,
    /// among those who joined so far, by rank: final at `start_at`.
    pub position: Option<u64>,
    /// Buyers ahead (`null` once let in).
    pub ahead: Option<u64>,
    /// Seconds until this buyer's turn at the measured admission rate (`null`: not
    /// waiting, or nobody is being let in now — see `units_held_until`).
    pub estimated_wait_s: Option<u64>,
    /// Admission is held by an operator.
    pub paused: bool,
    /// While everything unsold is taken by passes and unpaid orders that may still give
    /// units back: when the last of those is known (its pay deadline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub units_held_until: Option<DateTime<Utc>>,
    /// The pass (state `admitted`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass_expires_at: Option<DateTime<Utc>>,
}

/// What `standing` means for `user` of `item` (queued by `plan`).
pub fn view(
    standing: &Standing,
    item: &Item,
    plan: &QueuePlan,
    user: UserId,
    signer: &Signer,
) -> Option<QueueView> {
    let index = standing.index?;
    let mut view = QueueView {
        state: QueueState::Waiting,
        position: None,
        ahead: None,
        estimated_wait_s: None,
        paused: standing.paused,
        units_held_until: None,
        pass: None,
        pass_expires_at: None,
    };
    if index < standing.cursor {
        let live = standing
            .pass_expires_ms
            .filter(|expires| *expires > standing.now_ms);
        view.state = match live {
            Some(expires) if standing.used < u64::from(item.per_user) => {
                view.pass = Some(signer.pass(item.id, user, expires));
                view.pass_expires_at = DateTime::from_timestamp_millis(expires);
                QueueState::Admitted
            }
            _ if standing.used > 0 => QueueState::Done,
            _ => QueueState::Expired,
        };
        return Some(view);
    }
    let ahead = index - standing.cursor;
    if standing.sold_out {
        view.state = QueueState::SoldOut;
        return Some(view);
    }
    view.position = Some(ahead + 1);
    view.ahead = Some(ahead);
    view.units_held_until = standing
        .known_by_ms
        .and_then(DateTime::from_timestamp_millis);
    let start_ms = item.start_at.timestamp_millis();
    view.estimated_wait_s = if standing.paused {
        None
    } else if standing.now_ms < start_ms {
        // Before the start: the time to it, then the turns ahead at the set rate.
        let to_start = u64::try_from(start_ms - standing.now_ms).unwrap_or(0) / 1000;
        Some(to_start + (ahead + 1).div_ceil(u64::from(plan.admit_per_s)))
    } else if standing.rate_milli > 0 {
        Some(((ahead + 1) * 1000).div_ceil(standing.rate_milli))
    } else {
        None
    };
    Some(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(per_user: u8, start_ms: i64) -> Item {
        let at = |ms| DateTime::from_timestamp_millis(ms).unwrap();
        Item {
            id: crate::domain::ItemId::new(1).unwrap(),
            shop_id: 1,
            name: "x".into(),
            total: 10,
            price_cents: 100,
            start_at: at(start_ms),
            end_at: at(start_ms + 3_600_000),
            pay_timeout_s: 60,
            buckets: 1,
            per_user,
            release: Default::default(),
            draw_at: None,
            draw_seed: None,
            drawn_at: None,
            draw_cutoff: None,
            queue: crate::items::queue_plan::QueueSetting(Some(PLAN)),
            queue_seed: None,
            paused: false,
            loaded_at: None,
            retired_at: None,
            unsold: None,
        }
    }

    fn standing(index: u64, cursor: u64) -> Standing {
        Standing {
            index: Some(index),
            cursor,
            pass_expires_ms: None,
            used: 0,
            sold_out: false,
            known_by_ms: None,
            rate_milli: 0,
            now_ms: 10_000,
            paused: false,
            waiting: 0,
        }
    }

    const PLAN: QueuePlan = QueuePlan {
        admit_per_s: 10,
        pass_ttl_s: 60,
        opens_before_s: 60,
        pow_bits: 0,
    };

    #[test]
    fn a_place_is_counted_from_the_cursor() {
        let signer = Signer::new("s");
        let user = UserId::new(1);
        let mut at = standing(7, 3);
        at.rate_milli = 2_000;
        let seen = view(&at, &item(1, 0), &PLAN, user, &signer).unwrap();
        assert_eq!(
            (seen.state, seen.position, seen.ahead, seen.estimated_wait_s),
            (QueueState::Waiting, Some(5), Some(4), Some(3))
        );
        at.sold_out = true;
        let seen = view(&at, &item(1, 0), &PLAN, user, &signer).unwrap();
        assert_eq!((seen.state, seen.position), (QueueState::SoldOut, None));
    }

    #[test]
    fn before_the_start_the_wait_counts_the_time_to_it() {
        let signer = Signer::new("s");
        let seen = view(
            &standing(24, 0),
            &item(1, 40_000),
            &PLAN,
            UserId::new(1),
            &signer,
        )
        .unwrap();
        // 30 s to the start, then 25 turns at 10 a second: 3 s.
        assert_eq!(seen.estimated_wait_s, Some(33));
    }

    #[test]
    fn once_let_in_the_pass_decides() {
        let signer = Signer::new("s");
        let user = UserId::new(1);
        let mut at = standing(2, 3);
        at.pass_expires_ms = Some(20_000);
        let seen = view(&at, &item(2, 0), &PLAN, user, &signer).unwrap();
        assert_eq!(seen.state, QueueState::Admitted);
        let pass = seen.pass.unwrap();
        let item_id = item(2, 0).id;
        assert_eq!(signer.check_pass(&pass, item_id, user, 10_000), Ok(20_000));
        at.used = 1;
        assert_eq!(
            view(&at, &item(2, 0), &PLAN, user, &signer).unwrap().state,
            QueueState::Admitted,
            "one of two bought"
        );
        at.used = 2;
        assert_eq!(
            view(&at, &item(2, 0), &PLAN, user, &signer).unwrap().state,
            QueueState::Done
        );
        at.used = 0;
        at.pass_expires_ms = None;
        assert_eq!(
            view(&at, &item(2, 0), &PLAN, user, &signer).unwrap().state,
            QueueState::Expired
        );
    }
}
