//! The time budget of a request: the contract's one second, unless its route takes the
//! bulk budget with [`bulk`] where it is registered (an operator's bulk work: loading
//! millions of units, reconciling a whole sale, writing or loading thousands of items), or
//! the payment events' with [`payment`]. A route registered without either gets the second.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use utoipa_axum::router::{UtoipaMethodRouter, UtoipaMethodRouterExt};

use super::error::ApiError;
use super::request_id;

/// The contract's budget: an answer within one second, whatever a dependency does.
pub const REQUEST: Duration = Duration::from_secs(1);
/// For operators' bulk work.
pub const BULK: Duration = Duration::from_secs(120);
/// For a payment event: one MySQL transaction of several statements (and a late payment's
/// Redis step), which a slow database stretches past a second. The payment side waits for
/// its answer longer than a buyer (webhooks allow 10 s and more) and sends it again if
/// it gets none.
pub const PAYMENT: Duration = Duration::from_secs(8);

/// `route` with the bulk budget.
pub fn bulk<S: Clone + Send + Sync + 'static>(
    route: UtoipaMethodRouter<S>,
) -> UtoipaMethodRouter<S> {
    route.layer(axum::middleware::from_fn(grant_bulk))
}

/// `route` with the payment events' budget.
pub fn payment<S: Clone + Send + Sync + 'static>(
    route: UtoipaMethodRouter<S>,
) -> UtoipaMethodRouter<S> {
    route.layer(axum::middleware::from_fn(grant_payment))
}

/// Runs as the route is reached, well inside the first second.
async fn grant_bulk(request: Request, next: Next) -> Response {
    request_id::grant_budget(BULK);
    next.run(request).await
}

async fn grant_payment(request: Request, next: Next) -> Response {
    request_id::grant_budget(PAYMENT);
    next.run(request).await
}

pin_project! {
    /// `run`'s answer, or `503 unavailable` once the request's budget is spent (see
    /// [`within`]).
    pub struct Within<F> {
        #[pin]
        run: F,
        #[pin]
        deadline: Sleep,
        started: Instant,
        // Whether the route's own budget was asked for (once, when the second ran out).
        asked: bool,
    }
}

/// `run`'s answer, or `503 unavailable` once the request's budget is spent. The edge
/// starts waiting before the route is known (it goes around the whole router, not a layer
/// on each route: each layer costs a boxed service clone); a route that takes a longer
/// budget extends the wait. A future of its own rather than an `async fn`: one of those
/// keeps `run` twice (as it was given and as it is polled), and every request's future,
/// moved on its way through the layers, carried both copies.
pub fn within<F: Future<Output = Response>>(run: F) -> Within<F> {
    let started = Instant::now();
    Within {
        run,
        deadline: tokio::time::sleep_until(started + REQUEST),
        started,
        asked: false,
    }
}

impl<F: Future<Output = Response>> Future for Within<F> {
    type Output = Response;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response> {
        let mut this = self.project();
        if let Poll::Ready(response) = this.run.poll(cx) {
            return Poll::Ready(response);
        }
        while this.deadline.as_mut().poll(cx).is_ready() {
            // Asked only now: the common answer, well within the second, never reads it.
            match request_id::granted_budget() {
                Some(granted) if granted > REQUEST && !*this.asked => {
                    *this.asked = true;
                    this.deadline.as_mut().reset(*this.started + granted);
                }
                _ => return Poll::Ready(ApiError::Timeout.into_response()),
            }
        }
        Poll::Pending
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
        let response = request_id::serve(request, |_| {
            within(async move {
                if let Some(budget) = grant {
                    request_id::grant_budget(budget);
                }
                tokio::time::sleep(took).await;
                StatusCode::OK.into_response()
            })
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
