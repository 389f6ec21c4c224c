//! `POST /api/payments/events`: the payment side's callback. The signature is checked
//! over the raw body before anything reads it (`signature.rs`); the event is then applied
//! (`apply.rs`).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::budget;
use crate::http::error::{ApiError, Refusal};
use crate::http::reply::envelope;
use crate::state::AppState;

use super::apply::{self, Applied, PaymentError};
use super::event::PaymentEvent;
use super::signature::{self, HEADER};

impl From<PaymentError> for ApiError {
    fn from(e: PaymentError) -> Self {
        match e {
            PaymentError::Unavailable(why) => ApiError::Unavailable(why.into()),
            PaymentError::Store(e) => e.into(),
        }
    }
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(budget::payment(routes!(payment_event)))
}

#[utoipa::path(
    post,
    path = "/api/payments/events",
    tag = "payments",
    summary = "A payment event from the party that took the money (signed)",
    request_body = PaymentEvent,
    params(
        ("Seckill-Signature" = String, Header,
         description = "`t=<unix seconds>,v1=<hex HMAC-SHA256(secret, \"<t>.<raw body>\")>`"),
    ),
    responses(
        (status = 200, description = "`paid`, `revived`, `already_paid`, `already_recorded`, `already_refunded`, `charged_twice`, `refund_due`, `refunded`, `partial_refund`, `settled`, `ignored` or `noted`: what the event did (the same again for a repeat of its `event_id`)", body = Applied),
        (status = 202, description = "`held`: the order is still on its way to MySQL; the event is applied once it is there", body = Applied),
        (status = 400, description = "`bad_request`: the body is not an event (nothing recorded)", body = Refusal),
        (status = 401, description = "`unauthorized`: no valid signature (nothing recorded)", body = Refusal),
        (status = 404, description = "`order_not_found`: recorded (a charge for no order is owed back)", body = Applied),
        (status = 422, description = "`amount_mismatch`: the amount or currency is not the order's; recorded (a charge so is owed back), the order unchanged", body = Applied),
        (status = 503, description = "`unavailable`: nothing recorded; send it again", body = Refusal),
    )
)]
/// `POST /api/payments/events`
async fn payment_event(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let deps = &state.deps;
    let header = headers.get(HEADER).and_then(|v| v.to_str().ok());
    let now = crate::clock::now().timestamp();
    if let Err(refused) = signature::verify(header, &body, &deps.settings.payment_secret, now) {
        deps.meters.payment_refused(refused.reason());
        tracing::warn!(
            reason = refused.reason(),
            "payment event refused: bad signature"
        );
        return Err(ApiError::Unauthorized(refused.detail()));
    }
    let event = PaymentEvent::parse(&body).map_err(ApiError::BadRequest)?;
    let applied = apply::receive(deps, &event).await?;
    let status = StatusCode::from_u16(applied.status).unwrap_or(StatusCode::OK);
    Ok(envelope(status, applied.code(), &applied))
}
