//! The HTTP edge: the layers every request passes, and the pieces handlers share
//! (extractors, answers, request ids, rate limits, health checks). Each feature brings its
//! own `router()`; `app.rs` merges them.

pub mod error;
pub mod extract;
pub mod openapi;
pub mod rate_limit;
pub mod reply;
pub mod request_id;

use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower::ServiceBuilder;

use crate::auth::Jwt;
use crate::config::Settings;
use crate::http::error::ApiError;

use rate_limit::RateLimits;

/// The contract's budget: an answer within one second, whatever a dependency does.
pub const REQUEST_BUDGET: Duration = Duration::from_secs(1);
/// For operators' bulk work (a warm-up of millions of units, a reconciliation).
const BULK_BUDGET: Duration = Duration::from_secs(120);
/// Request bodies are a few dozen bytes; anything bigger is a mistake or an attack.
const BODY_LIMIT: usize = 64 * 1024;

/// What the edge's extractors read from the server's state. The server's state
/// (`crate::state::AppState`) provides it, so the edge names no feature.
pub trait Edge: Send + Sync {
    fn settings(&self) -> &Settings;
    fn jwt(&self) -> &Jwt;
    fn limits(&self) -> &RateLimits;
}

/// Adds the layers every request passes, outermost first: request id and span with the
/// time budget (one middleware: each costs a boxed service clone per request), the body
/// limit; and JSON answers for unknown routes and wrong methods (axum
/// still adds the `Allow` header to the latter).
pub fn finish<S: Clone + Send + Sync + 'static>(routes: Router<S>, state: S) -> Router {
    routes
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(
            ServiceBuilder::new()
                .layer(axum::middleware::from_fn(edge))
                .layer(DefaultBodyLimit::max(BODY_LIMIT)),
        )
        .with_state(state)
}

/// Every request: its id and span (see [`request_id`]), within its time budget.
async fn edge(request: Request, next: Next) -> Response {
    let limit = budget(request.uri().path());
    request_id::serve(request, async move |request| {
        match tokio::time::timeout(limit, next.run(request)).await {
            Ok(response) => response,
            Err(_) => ApiError::Timeout.into_response(),
        }
    })
    .await
}

/// The contract's one second for every request, except an operator's bulk work — loading
/// millions of units, reconciling a whole sale, writing or loading thousands of items —
/// which gets [`BULK_BUDGET`].
fn budget(path: &str) -> Duration {
    let bulk = path == "/admin/items"
        || (path.starts_with("/admin/items/")
            && (path.ends_with("/warmup") || path.ends_with("/reconcile")));
    if bulk { BULK_BUDGET } else { REQUEST_BUDGET }
}
