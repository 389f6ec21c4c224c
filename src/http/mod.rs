//! The HTTP edge: routes, the layers every request passes, and the pieces handlers share.

pub mod extract;
pub mod health;
pub mod rate_limit;
pub mod reply;
pub mod request_id;

use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use tower::ServiceBuilder;
use tower::limit::GlobalConcurrencyLimitLayer;

use crate::app::AppState;
use crate::error::ApiError;
use crate::{breaker, items, orders, purchase, shops};

/// The contract's budget: an answer within one second, whatever a dependency does.
pub const REQUEST_BUDGET: Duration = Duration::from_secs(1);
/// For operators' bulk work (a warm-up of millions of units, a reconciliation).
const BULK_BUDGET: Duration = Duration::from_secs(120);
/// Request bodies are a few dozen bytes; anything bigger is a mistake or an attack.
const BODY_LIMIT: usize = 64 * 1024;
/// The bulk item calls' bodies: 10,000 items of a few hundred bytes.
const BULK_BODY_LIMIT: usize = 8 * 1024 * 1024;

/// The public API (with health checks). Purchases are counted and timed (shed ones too);
/// beyond `SECKILL_MAX_INFLIGHT` at once they are shed with `503 unavailable` at once
/// rather than queued.
pub fn api_routes(state: &AppState) -> Router<AppState> {
    let shed = ServiceBuilder::new()
        .layer(axum::middleware::from_fn_with_state(
            state.meters.clone(),
            purchase::count,
        ))
        .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
            ApiError::Overloaded
        }))
        .load_shed()
        .layer(GlobalConcurrencyLimitLayer::with_semaphore(
            state.inflight.clone(),
        ));
    Router::new()
        .route("/api/flashbuy", post(purchase::flashbuy).layer(shed))
        .route("/api/orders/{order_sn}", get(orders::api::get_order))
        .route("/api/orders/{order_sn}/pay", post(orders::api::pay_order))
        .route(
            "/api/orders/{order_sn}/cancel",
            post(orders::api::cancel_order),
        )
        .route("/api/items/{item_id}", get(items::api::get_item))
        .route("/api/items/{item_id}/my-order", get(orders::api::my_order))
        .route("/api/shops/{shop_id}/status", get(shops::api::status))
        .merge(health_routes())
}

/// Health checks alone: what a worker-only process (no `api` role) serves.
pub fn health_routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
}

/// The operators' API, and `/metrics` (which moves with it to `SECKILL_ADMIN_ADDR`).
pub fn admin_routes() -> Router<AppState> {
    use items::admin::*;
    Router::new()
        .route(
            "/admin/items",
            put(items::bulk::put_items).layer(DefaultBodyLimit::max(BULK_BODY_LIMIT)),
        )
        .route(
            "/admin/items/warmup",
            post(items::bulk::warmup_items).layer(DefaultBodyLimit::max(BULK_BODY_LIMIT)),
        )
        .route("/admin/items/{item_id}", put(put_item))
        .route("/admin/items/{item_id}/warmup", post(warmup_item))
        .route("/admin/items/{item_id}/pause", post(pause_item))
        .route("/admin/items/{item_id}/resume", post(resume_item))
        .route("/admin/items/{item_id}/stats", get(item_stats))
        .route("/admin/items/{item_id}/reconcile", post(reconcile_item))
        .route("/admin/shops/{shop_id}/hours", put(shops::api::put_hours))
        .route("/admin/shops/{shop_id}/status", put(shops::api::put_status))
        .route("/admin/shops/{shop_id}/refresh", post(shops::api::refresh))
        .route("/admin/circuit", get(breaker::admin::list))
        .route("/admin/circuit/open", post(breaker::admin::open))
        .route("/admin/circuit/close", post(breaker::admin::close))
        .route("/metrics", get(health::metrics))
}

/// Adds the layers every request passes, outermost first: request id and span, the time
/// budget, the body limit; and JSON answers for unknown routes and wrong methods (axum
/// still adds the `Allow` header to the latter).
pub fn finish(routes: Router<AppState>, state: AppState) -> Router {
    routes
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(
            ServiceBuilder::new()
                .layer(axum::middleware::from_fn(request_id::layer))
                .layer(axum::middleware::from_fn(budget))
                .layer(DefaultBodyLimit::max(BODY_LIMIT)),
        )
        .with_state(state)
}

/// The contract's one second for every request, except an operator's bulk work — loading
/// millions of units, reconciling a whole sale, writing or loading thousands of items —
/// which gets [`BULK_BUDGET`].
async fn budget(request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let bulk = path == "/admin/items"
        || (path.starts_with("/admin/items/")
            && (path.ends_with("/warmup") || path.ends_with("/reconcile")));
    let limit = if bulk { BULK_BUDGET } else { REQUEST_BUDGET };
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout.into_response(),
    }
}
