//! `GET /admin/payments/refunds-due`: the charges the shop owes back — late payments with
//! no unit for them, orders charged twice, charges for no known order — until the
//! provider reports each refunded (a `payment.refunded` naming its `provider_ref`).

use axum::extract::State;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::error::ApiError;
use crate::http::extract::Admin;
use crate::http::reply::ok;
use crate::state::AppState;

use super::repo::{self, OwedCharge};

/// Charges one answer lists at most (oldest first).
const MOST_LISTED: u32 = 1_000;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(refunds_due))
}

/// The charges owed back.
#[derive(Serialize, ToSchema)]
struct RefundsDue {
    /// Oldest first, at most 1,000.
    charges: Vec<OwedCharge>,
}

#[utoipa::path(
    get,
    path = "/admin/payments/refunds-due",
    tag = "payments",
    summary = "Charges owed back: refund each with the provider",
    security(("admin" = [])),
    responses((status = 200, description = "`ok`", body = RefundsDue))
)]
/// `GET /admin/payments/refunds-due`
async fn refunds_due(_: Admin, State(state): State<AppState>) -> Result<Response, ApiError> {
    let charges = repo::owed(&state.deps.db, MOST_LISTED).await?;
    Ok(ok("ok", RefundsDue { charges }))
}
