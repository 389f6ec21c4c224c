//! What an operator sends for an item (`PUT /admin/items/{id}`, and each of a bulk
//! `PUT /admin/items`), and its checks: a bad field is named and nothing is written.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::domain::{BucketId, ItemId};
use crate::http::error::ApiError;
use crate::store::{STORABLE, storable, to_millis};

use super::repo::ItemDraft;
use super::waves::Waves;
use crate::items::queue_plan::{QueuePlan, QueueSetting};

/// The most units one item may have (a million units is about 60 MB of Redis).
const MAX_TOTAL: u32 = 10_000_000;
const MAX_PAY_TIMEOUT_S: u32 = 7 * 24 * 3600;

/// An item as an operator writes it. (The bounds below are the ones `validate` checks.)
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemBody {
    /// Needed in a bulk `PUT /admin/items`; in `PUT /admin/items/{id}` it may repeat the
    /// path's.
    #[serde(default)]
    id: Option<ItemId>,
    #[schema(min_length = 1, max_length = 200, example = "Lucky bag")]
    name: String,
    /// A shop not seen before is created, open, with no hours.
    #[schema(minimum = 1, example = 1)]
    shop_id: u64,
    #[schema(minimum = 1, maximum = 10_000_000, example = 1000)]
    total: u32,
    /// Between 1970 and 2038-01-19T03:14:07Z (MySQL's `TIMESTAMP`).
    start_at: DateTime<Utc>,
    /// After `start_at`, within the same range.
    end_at: DateTime<Utc>,
    #[schema(example = 9900)]
    price_cents: u64,
    /// Seconds a buyer has to pay before the order is cancelled and its unit sold again.
    #[serde(default = "default_pay_timeout")]
    #[schema(minimum = 1, maximum = 604_800, default = 1800)]
    pay_timeout_s: u32,
    /// Redis buckets for a hot item (1–64).
    #[serde(default = "default_buckets")]
    #[schema(minimum = 1, maximum = 64, default = 1)]
    buckets: u8,
    /// Live orders (pending, unpaid or paid) one buyer may hold, one unit each (1–100).
    #[serde(default = "default_per_user")]
    #[schema(minimum = 1, maximum = 100, default = 1)]
    per_user: u8,
    /// Waves: tranches added to the sale at their times, on top of `total − Σ units` on
    /// sale from `start_at` (each `at` within the window, increasing; `Σ units ≤ total`).
    #[serde(default)]
    release: Waves,
    /// `draw`: entries until `draw_at`, then `total` winners drawn by rank
    /// (docs/sale-shapes.md); `sale` (the default): first come, first served.
    #[serde(default)]
    mode: Mode,
    /// A draw's time, within the window (default `end_at`).
    #[serde(default)]
    draw_at: Option<DateTime<Utc>>,
    /// A waiting room in front of the sale (docs/sale-shapes.md, "A waiting room"):
    /// buyers join a line and buy with the pass they are given in their turn.
    #[serde(default)]
    queue: Option<QueuePlan>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
enum Mode {
    #[default]
    Sale,
    Draw,
}

/// The most live orders one buyer may hold of an item.
const MAX_PER_USER: u8 = 100;

fn default_per_user() -> u8 {
    1
}

fn default_buckets() -> u8 {
    1
}

fn default_pay_timeout() -> u32 {
    1800
}

impl ItemBody {
    pub fn id(&self) -> Option<ItemId> {
        self.id
    }

    pub fn validate(self) -> Result<ItemDraft, ApiError> {
        let name = self.name.trim().to_owned();
        if name.is_empty() || name.chars().count() > 200 {
            return Err(ApiError::bad_request("`name`: 1 to 200 characters"));
        }
        if self.shop_id == 0 {
            return Err(ApiError::bad_request("`shop_id`: must be positive"));
        }
        if !(1..=MAX_TOTAL).contains(&self.total) {
            return Err(ApiError::bad_request(format!("`total`: 1 to {MAX_TOTAL}")));
        }
        if let Some((field, _)) = [("start_at", self.start_at), ("end_at", self.end_at)]
            .into_iter()
            .find(|(_, at)| !storable(*at))
        {
            return Err(ApiError::bad_request(format!("`{field}`: {STORABLE}")));
        }
        if self.start_at >= self.end_at {
            return Err(ApiError::bad_request("`end_at` must be after `start_at`"));
        }
        if !(1..=MAX_PAY_TIMEOUT_S).contains(&self.pay_timeout_s) {
            return Err(ApiError::bad_request(format!(
                "`pay_timeout_s`: 1 to {MAX_PAY_TIMEOUT_S}"
            )));
        }
        if !(1..=BucketId::MAX_BUCKETS).contains(&self.buckets) {
            return Err(ApiError::bad_request(format!(
                "`buckets`: 1 to {}",
                BucketId::MAX_BUCKETS
            )));
        }
        if !(1..=MAX_PER_USER).contains(&self.per_user) {
            return Err(ApiError::bad_request(format!(
                "`per_user`: 1 to {MAX_PER_USER}"
            )));
        }
        let draw_at = self.draw()?;
        if let Some(plan) = &self.queue {
            plan.check().map_err(ApiError::bad_request)?;
            if draw_at.is_some() {
                return Err(ApiError::bad_request(
                    "`queue`: a draw ranks its entries itself; a waiting room is for sales",
                ));
            }
        }
        let release = self.release.to_millis();
        release
            .check(self.start_at, self.end_at, self.total)
            .map_err(ApiError::bad_request)?;
        Ok(ItemDraft {
            name,
            shop_id: self.shop_id,
            total: self.total,
            start_at: self.start_at,
            end_at: self.end_at,
            price_cents: self.price_cents,
            pay_timeout_s: self.pay_timeout_s,
            buckets: self.buckets,
            per_user: self.per_user,
            release,
            draw_at,
            draw_seed: match draw_at {
                Some(_) => Some(crate::draw::rank::new_seed().map_err(anyhow::Error::from)?),
                None => None,
            },
            queue: QueueSetting(self.queue),
            queue_seed: match self.queue {
                Some(_) => Some(crate::draw::rank::new_seed().map_err(anyhow::Error::from)?),
                None => None,
            },
        })
    }

    /// A draw's time (to the millisecond), checked against the rest of the item.
    fn draw(&self) -> Result<Option<DateTime<Utc>>, ApiError> {
        if self.mode == Mode::Sale {
            return match self.draw_at {
                Some(_) => Err(ApiError::bad_request(
                    "`draw_at`: only with \"mode\": \"draw\"",
                )),
                None => Ok(None),
            };
        }
        // To the millisecond, as MySQL keeps both. A draw at the end is drawn then, after
        // it: its first round gives units whenever the scheduler gets to it (`lua/award.lua`).
        let at = to_millis(self.draw_at.unwrap_or(self.end_at));
        if at <= self.start_at || at > to_millis(self.end_at) {
            return Err(ApiError::bad_request(
                "`draw_at`: after `start_at`, at or before `end_at` (default `end_at`)",
            ));
        }
        if !self.release.is_empty() {
            return Err(ApiError::bad_request(
                "`release`: a draw gives its units at once; waves are for sales",
            ));
        }
        if self.per_user != 1 {
            return Err(ApiError::bad_request(
                "`per_user`: a draw gives one unit per entry (1)",
            ));
        }
        Ok(Some(at))
    }
}
