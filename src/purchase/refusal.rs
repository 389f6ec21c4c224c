//! How a purchase that did not win is answered: each outcome of the grab as one code of
//! the contract (the HTTP surface of `grab.rs`, shared by `api.rs` and `entry.rs`).

use crate::http::error::ApiError;
use crate::items::catalog::CatalogItem;

use super::grab::GrabOutcome;
use super::sell::NotSold;

/// The answer to a sale that did not happen.
pub fn not_sold(not_sold: NotSold, item: &CatalogItem) -> ApiError {
    match not_sold {
        NotSold::Refused(outcome) => refusal(outcome, item),
        NotSold::WaitingForReplica => ApiError::Unavailable(
            "the sale is waiting for a Redis replica to come back; try again shortly".into(),
        ),
        NotSold::Unconfirmed => ApiError::Unavailable(
            "your purchase could not be confirmed in time; press again to buy, or to find your order if it went through".into(),
        ),
        NotSold::RepeatUnconfirmed => ApiError::Unavailable(
            "the order your Idempotency-Key bought is not confirmed yet; press again with it shortly".into(),
        ),
        NotSold::HeldUnconfirmed => ApiError::Unavailable(
            "an order you hold of this item is not confirmed yet; press again shortly".into(),
        ),
        NotSold::Redis(e) => ApiError::Redis(e),
    }
}

/// The answer to every outcome but a win, whether memory or a script decided it.
pub fn refusal(outcome: GrabOutcome, item: &CatalogItem) -> ApiError {
    match outcome {
        GrabOutcome::Duplicate(order_sn) => ApiError::Duplicate { order_sn },
        GrabOutcome::LimitReached(order_sns) => ApiError::LimitReached { order_sns },
        GrabOutcome::SoldOut => ApiError::SoldOut,
        GrabOutcome::BetweenReleases(at_ms) => ApiError::BetweenReleases {
            next_release_at: chrono::DateTime::from_timestamp_millis(at_ms).unwrap_or_default(),
        },
        GrabOutcome::StillMoving => {
            ApiError::Unavailable("units are moving between the item's buckets; press again".into())
        }
        GrabOutcome::Paused => ApiError::Paused,
        // Loaded once and gone: Redis lost it, and an operator has to rebuild it. The
        // buyer did nothing wrong, and pressing again later may well work.
        GrabOutcome::NotLoaded if item.record.loaded_at.is_some() => {
            ApiError::Unavailable("the item's units are being restored; try again shortly".into())
        }
        GrabOutcome::NotLoaded => ApiError::NotStarted("the item's units are not loaded yet"),
        GrabOutcome::Reloading => {
            ApiError::Unavailable("the item's units are being reloaded; try again shortly".into())
        }
        GrabOutcome::NotStarted => ApiError::NotStarted("the sale has not opened yet"),
        GrabOutcome::Ended => ApiError::Ended,
        GrabOutcome::Won { .. } | GrabOutcome::Repeat(_) | GrabOutcome::RepeatClaimed(_) => {
            ApiError::Internal(anyhow::anyhow!("a win answered as a refusal"))
        }
        // Answered once the replicas hold the claims (`Seller::sell`), as what it wraps.
        GrabOutcome::HeldClaimed(_) => ApiError::Internal(anyhow::anyhow!(
            "a claim answered before its replicas hold it"
        )),
    }
}
