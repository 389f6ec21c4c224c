//! The HTTP edge: the layers every request passes, and the pieces handlers share
//! (extractors, answers, request ids, rate limits, health checks). Each feature brings its
//! own `router()`; `app.rs` merges them.

pub mod budget;
pub mod error;
pub mod extract;
pub mod openapi;
pub mod rate_limit;
pub mod reply;
pub mod request_id;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::Next;
use axum::response::Response;
use tower::ServiceBuilder;

use crate::auth::Jwt;
use crate::config::Settings;
use crate::http::error::ApiError;

use rate_limit::RateLimits;

/// Request bodies are a few dozen bytes; anything bigger is a mistake or an attack.
const BODY_LIMIT: usize = 64 * 1024;

/// What the edge's extractors read from the server's state. The server's state
/// (`crate::state::AppState`) provides it, so the edge names no feature.
pub trait Edge: Send + Sync {
    fn settings(&self) -> &Settings;
    fn jwt(&self) -> &Jwt;
    fn limits(&self) -> &RateLimits;
}

/// Adds the layers every request passes, outermost first: request id (and its log lines'
/// fields) with the time budget (one middleware: each costs a boxed service clone per
/// request), the body limit; and JSON answers for unknown routes and wrong methods (axum
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

/// Every request: its id and span (see [`request_id`]), within its time budget (see
/// [`budget`]). Built of futures that hold what they run once (no `async` here).
fn edge(request: Request, next: Next) -> impl Future<Output = Response> {
    request_id::serve(request, |request| budget::within(next.run(request)))
}
