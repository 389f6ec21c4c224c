//! The time budget of a request: the contract's one second, unless its route takes the
//! bulk budget with [`bulk`] where it is registered (an operator's bulk work: loading
//! millions of units, reconciling a whole sale, writing or loading thousands of items).
//! A route registered without it gets the second.

use std::future::Future;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::{UtoipaMethodRouter, UtoipaMethodRouterExt};

use super::error::ApiError;
use super::request_id;

/// The contract's budget: an answer within one second, whatever a dependency does.
pub const REQUEST: Duration = Duration::from_secs(1);
/// For operators' bulk work.
pub const BULK: Duration = Duration::from_secs(120);

/// `route` with the bulk budget.
pub fn bulk<S: Clone + Send + Sync + 'static>(
    route: UtoipaMethodRouter<S>,
) -> UtoipaMethodRouter<S> {
    route.layer(axum::middleware::from_fn(grant_bulk))
}

/// Runs as the route is reached, well inside the first second.
async fn grant_bulk(request: Request, next: Next) -> Response {
    request_id::grant_budget(BULK);
    next.run(request).await
}

/// `run`'s answer, or `503 unavailable` once the request's budget is spent. The edge
/// starts waiting before the route is known (one middleware for every request, not one per
/// route: each costs a boxed service clone); a route that takes a longer budget extends
/// the wait.
pub async fn within(run: impl Future<Output = Response>) -> Response {
    let started = tokio::time::Instant::now();
    let mut run = std::pin::pin!(run);
    if let Ok(response) = tokio::time::timeout_at(started + REQUEST, &mut run).await {
        return response;
    }
    // Asked only now: the common answer, well within the second, never reads it.
    match request_id::granted_budget() {
        Some(granted) if granted > REQUEST => tokio::time::timeout_at(started + granted, run)
            .await
            .unwrap_or_else(|_| ApiError::Timeout.into_response()),
        _ => ApiError::Timeout.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::extract::Request;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    use super::*;

    /// A request whose route takes `took` to answer, granting `grant` first.
    async fn answered(grant: Option<Duration>, took: Duration) -> StatusCode {
        let request = Request::new(Body::empty());
        let response = request_id::serve(request, async |_| {
            within(async {
                if let Some(budget) = grant {
                    request_id::grant_budget(budget);
                }
                tokio::time::sleep(took).await;
                StatusCode::OK.into_response()
            })
            .await
        })
        .await;
        response.status()
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_gets_the_second_unless_it_takes_the_bulk_budget() {
        let second = Duration::from_millis(900);
        let longer = Duration::from_secs(3);
        assert_eq!(answered(None, second).await, StatusCode::OK);
        assert_eq!(
            answered(None, longer).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(answered(Some(BULK), longer).await, StatusCode::OK);
        assert_eq!(
            answered(Some(BULK), BULK + second).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
