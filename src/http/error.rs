//! The one error type of the HTTP edge. Each variant is one `code` of the contract; the
//! `IntoResponse` below is the only place that turns failures into answers, and the only
//! place that logs them (once, with their cause chain). Internal details never reach the
//! client: it gets the code, a plain sentence and the trace id to quote.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::reply::envelope;
use super::request_id;
use crate::domain::OrderSn;
use crate::error::cause_chain;
use crate::store::{DbError, RedisError, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("client clock differs from server time by {skew_ms} ms (tolerance {tolerance_ms} ms)")]
    ClockSkew { skew_ms: i64, tolerance_ms: u64 },
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("no such item")]
    ItemNotFound,
    #[error("no such order")]
    OrderNotFound,
    #[error("no entry of this user in this draw")]
    EntryNotFound,
    #[error("no such route")]
    RouteNotFound,
    #[error("this route does not take that method (see the Allow header)")]
    MethodNotAllowed,
    #[error("the sale has not started: {0}")]
    NotStarted(&'static str),
    #[error("the sale has ended")]
    Ended,
    #[error("user already holds order {order_sn}")]
    Duplicate { order_sn: OrderSn },
    #[error("user holds {} orders of this item, the most one buyer may", order_sns.len())]
    LimitReached { order_sns: Vec<OrderSn> },
    #[error("everything released so far is sold; the next wave opens at {}", next_release_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))]
    BetweenReleases {
        next_release_at: chrono::DateTime<chrono::Utc>,
    },
    #[error("sold out")]
    SoldOut,
    #[error("rate limited")]
    RateLimited { retry_after: Duration },
    #[error("the sale is paused")]
    Paused,
    #[error("the {scope} circuit breaker is at level {level}")]
    CircuitOpen {
        level: u8,
        scope: String,
        retry_after: Duration,
    },
    #[error("the server is at its limit of purchases in flight; try again shortly")]
    Overloaded,
    /// A 409 whose `code` names the conflict (`order_paid`, `already_loaded`, …).
    #[error("{detail}")]
    Conflict { code: Conflict, detail: String },
    #[error("request took longer than the time budget")]
    Timeout,
    #[error("Redis failed")]
    Redis(#[from] RedisError),
    #[error("MySQL failed")]
    Database(#[from] DbError),
    /// No store could answer and nothing is known locally.
    #[error("{0}")]
    Unavailable(String),
    #[error("the shop is closed")]
    ShopClosed,
    #[error("this item has no waiting room")]
    QueueNotFound,
    #[error("this user has no place in the item's waiting room: join it first")]
    NotInQueue,
    #[error("the waiting room opens at {}", opens_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))]
    QueueNotOpen {
        opens_at: chrono::DateTime<chrono::Utc>,
    },
    #[error("{0}")]
    PowFailed(String),
    #[error(
        "this item is sold through its waiting room: join it, and buy with the pass you are given (`X-Queue-Pass`)"
    )]
    QueueRequired,
    #[error("the pass has expired: the place went to the next in line")]
    PassExpired,
    #[error("the pass is not one this server gave this user for this item")]
    PassInvalid,
    #[error("the pass bought what it allows")]
    PassUsed,
    #[error("no such shop")]
    ShopNotFound,
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

/// What a `409` conflicts with, each its own `code`. (A purchase's own 409s — `duplicate`,
/// `limit_reached`, `between_releases` — carry more than a detail: they are variants of
/// [`ApiError`].) `tests/it/ecosystem.rs` holds the OpenAPI document to this list: every
/// variant is documented, and no other conflict is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conflict {
    OrderPaid,
    OrderCancelled,
    Reconciling,
    ReleaseStarted,
    BucketsFixed,
    ShopBusy,
    WarmupRunning,
    AlreadyLoaded,
    SaleLive,
    OrdersInFlight,
    OverHeld,
    Raced,
    ModeFixed,
    PriceFixed,
    DrawFixed,
    QueueFixed,
    StockCommitted,
}

impl Conflict {
    pub const ALL: [Conflict; 17] = [
        Conflict::OrderPaid,
        Conflict::OrderCancelled,
        Conflict::Reconciling,
        Conflict::ReleaseStarted,
        Conflict::BucketsFixed,
        Conflict::ShopBusy,
        Conflict::WarmupRunning,
        Conflict::AlreadyLoaded,
        Conflict::SaleLive,
        Conflict::OrdersInFlight,
        Conflict::OverHeld,
        Conflict::Raced,
        Conflict::ModeFixed,
        Conflict::PriceFixed,
        Conflict::DrawFixed,
        Conflict::QueueFixed,
        Conflict::StockCommitted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Conflict::OrderPaid => "order_paid",
            Conflict::OrderCancelled => "order_cancelled",
            Conflict::Reconciling => "reconciling",
            Conflict::ReleaseStarted => "release_started",
            Conflict::BucketsFixed => "buckets_fixed",
            Conflict::ShopBusy => "shop_busy",
            Conflict::WarmupRunning => "warmup_running",
            Conflict::AlreadyLoaded => "already_loaded",
            Conflict::SaleLive => "sale_live",
            Conflict::OrdersInFlight => "orders_in_flight",
            Conflict::OverHeld => "over_held",
            Conflict::Raced => "raced",
            Conflict::ModeFixed => "mode_fixed",
            Conflict::PriceFixed => "price_fixed",
            Conflict::DrawFixed => "draw_fixed",
            Conflict::QueueFixed => "queue_fixed",
            Conflict::StockCommitted => "stock_committed",
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Database(e) => ApiError::Database(e),
            StoreError::Redis(e) => ApiError::Redis(e),
        }
    }
}

impl ApiError {
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::BadRequest(detail.into())
    }

    /// The answer's `code` (also for one entry of a bulk answer).
    pub fn code(&self) -> &'static str {
        self.status_and_code().1
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        use ApiError::*;
        match self {
            BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ClockSkew { .. } => (StatusCode::BAD_REQUEST, "clock_skew"),
            Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ItemNotFound => (StatusCode::NOT_FOUND, "item_not_found"),
            OrderNotFound => (StatusCode::NOT_FOUND, "order_not_found"),
            EntryNotFound => (StatusCode::NOT_FOUND, "entry_not_found"),
            RouteNotFound => (StatusCode::NOT_FOUND, "not_found"),
            MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            NotStarted(_) => (StatusCode::FORBIDDEN, "not_started"),
            Ended => (StatusCode::FORBIDDEN, "ended"),
            Duplicate { .. } => (StatusCode::CONFLICT, "duplicate"),
            LimitReached { .. } => (StatusCode::CONFLICT, "limit_reached"),
            BetweenReleases { .. } => (StatusCode::CONFLICT, "between_releases"),
            SoldOut => (StatusCode::GONE, "sold_out"),
            RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Paused => (StatusCode::SERVICE_UNAVAILABLE, "paused"),
            CircuitOpen { .. } => (StatusCode::SERVICE_UNAVAILABLE, "circuit_open"),
            Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Conflict { code, .. } => (StatusCode::CONFLICT, code.as_str()),
            Timeout | Redis(_) | Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ShopClosed => (StatusCode::SERVICE_UNAVAILABLE, "shop_closed"),
            ShopNotFound => (StatusCode::NOT_FOUND, "shop_not_found"),
            QueueNotFound => (StatusCode::NOT_FOUND, "queue_not_found"),
            NotInQueue => (StatusCode::NOT_FOUND, "not_in_queue"),
            QueueNotOpen { .. } => (StatusCode::FORBIDDEN, "queue_not_open"),
            PowFailed(_) => (StatusCode::FORBIDDEN, "pow_failed"),
            QueueRequired => (StatusCode::FORBIDDEN, "queue_required"),
            PassExpired => (StatusCode::FORBIDDEN, "pass_expired"),
            PassInvalid => (StatusCode::FORBIDDEN, "pass_invalid"),
            PassUsed => (StatusCode::FORBIDDEN, "pass_used"),
            Database(e) if e.is_unavailable() => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Database(_) | Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// What the client is told. Dependencies are named (operators need that) but their
    /// error text is not sent.
    pub fn detail(&self) -> String {
        self.fixed_detail()
            .map_or_else(|| self.to_string(), str::to_owned)
    }

    /// The detail of a failure whose cause is not for the client; `None`: the error's own
    /// message says it.
    fn fixed_detail(&self) -> Option<&'static str> {
        match self {
            ApiError::Redis(_) => Some("Redis did not answer; try again shortly"),
            ApiError::Database(e) if e.is_unavailable() => {
                Some("MySQL did not answer; try again shortly")
            }
            ApiError::Database(_) | ApiError::Internal(_) => {
                Some("internal error; quote the trace_id when reporting it")
            }
            _ => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::RateLimited { retry_after } => Some(*retry_after),
            ApiError::Paused | ApiError::ShopClosed => Some(Duration::from_secs(5)),
            ApiError::BetweenReleases { next_release_at } => Some(
                (*next_release_at - crate::clock::now())
                    .to_std()
                    .unwrap_or_default(),
            ),
            ApiError::CircuitOpen { retry_after, .. } => Some(*retry_after),
            _ if self.status_and_code().0 == StatusCode::SERVICE_UNAVAILABLE => {
                Some(Duration::from_secs(1))
            }
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        // A refusal by design (paused, a breaker, load shedding) is not a failure: at
        // `error` it would flood the log exactly when a sale is being held back.
        let refusal = matches!(
            self,
            ApiError::Paused
                | ApiError::CircuitOpen { .. }
                | ApiError::Overloaded
                | ApiError::ShopClosed
        );
        if status.is_server_error() && !refusal {
            let (method, path) = request_id::method_and_path();
            tracing::error!(code, method, path, error = %cause_chain(&self), "request failed");
        } else if tracing::enabled!(tracing::Level::DEBUG) {
            let (method, path) = request_id::method_and_path();
            tracing::debug!(code, method, path, error = %self, "request refused");
        }
        let mut body = Refusal {
            detail: Detail(&self),
            order_sn: None,
            order_sns: None,
            next_release_at: None,
            level: None,
            scope: None,
        };
        match &self {
            ApiError::Duplicate { order_sn } => body.order_sn = Some(order_sn),
            ApiError::LimitReached { order_sns } => body.order_sns = Some(order_sns),
            ApiError::BetweenReleases { next_release_at } => {
                body.next_release_at = Some(*next_release_at);
            }
            ApiError::CircuitOpen { level, scope, .. } => {
                body.level = Some(*level);
                body.scope = Some(scope);
            }
            _ => {}
        }
        let mut response = envelope(status, code, &body);
        if let Some(after) = self.retry_after() {
            // Whole seconds, at least one: clients treat 0 as "now".
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

/// An error's [`ApiError::detail`], written straight into the answer: the crowd of a sale
/// is refused, and a `String` of its own cost each refusal an allocation and a copy.
struct Detail<'a>(&'a ApiError);

impl Serialize for Detail<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.fixed_detail() {
            Some(detail) => serializer.serialize_str(detail),
            None => serializer.collect_str(self.0),
        }
    }
}

// A struct rather than a JSON map: the crowd of a sale is answered with one.
/// What follows `code` and `trace_id` in a refusal.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Refusal<'a> {
    /// A plain sentence naming what is wrong.
    #[schema(value_type = String)]
    detail: Detail<'a>,
    /// `duplicate`: the order the buyer already holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    order_sn: Option<&'a OrderSn>,
    /// `limit_reached`: the buyer's live orders of the item.
    #[serde(skip_serializing_if = "Option::is_none")]
    order_sns: Option<&'a [OrderSn]>,
    /// `between_releases`: when the next wave goes on sale (`Retry-After` counts the
    /// seconds to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    next_release_at: Option<chrono::DateTime<chrono::Utc>>,
    /// `circuit_open`: the breaker's level (1 throttle, 2 degrade, 3 stop).
    #[serde(skip_serializing_if = "Option::is_none")]
    level: Option<u8>,
    /// `circuit_open`: `global`, `item:{id}`, or `instance:{id}` (the answering instance's
    /// automatic breaker: another instance may sell).
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<&'a str>,
}
