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

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::response::Response;
use futures::FutureExt;
use futures::future::Map;
use tower::Service;

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

/// Adds what every route shares: the body limit, and JSON answers for unknown routes and
/// wrong methods (axum still adds the `Allow` header to the latter). The edge
/// ([`EdgeService`]) goes around the whole router, where it is served.
pub fn finish<S: Clone + Send + Sync + 'static>(routes: Router<S>, state: S) -> Router {
    routes
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// Every request: its id and log fields (see [`request_id`]), within its time budget (see
/// [`budget`]). A service wrapped around the router rather than a middleware inside it: a
/// `from_fn` layer cost every request a boxed clone of the router behind it, a boxed
/// future and a second pass through the router's boxing: 1,280 of a sold-out answer's
/// 31,063 instructions (`loadtest/instructions.sh`).
#[derive(Clone)]
pub struct EdgeService<S>(S);

impl<S> EdgeService<S> {
    pub fn around(inner: S) -> Self {
        Self(inner)
    }
}

/// The answer of a route, whose error type has no value.
type Answer = fn(Result<Response, Infallible>) -> Response;
/// The answer of the edge, whose error type has no value.
type Answered = fn(Response) -> Result<Response, Infallible>;

impl<S> Service<Request> for EdgeService<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Map<request_id::Served<budget::Within<Map<S::Future, Answer>>>, Answered>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let answer: Answer = |answer| match answer {
            Ok(response) => response,
        };
        let served = request_id::serve(request, |request| {
            budget::within(self.0.call(request).map(answer))
        });
        served.map(Ok)
    }
}
