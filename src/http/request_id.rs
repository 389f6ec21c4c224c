//! Request ids: taken from `X-Request-Id` when the client (or nginx) sent a sane one, made
//! up otherwise; echoed in the response header and in every JSON body as `trace_id`; and
//! given to the log lines (`telemetry::in_request`), so every line of a request names it.
//!
//! Lines name only `trace_id`, `user_id` and `item_id` (as a `span`); failures, logged at
//! the edge, add method and path themselves.

use std::cell::Cell;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, Uri};
use axum::response::Response;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;

use crate::domain::{ItemId, UserId};
use crate::telemetry::{self, InRequest};

pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request this task is serving (set by [`serve`]; its id is the log lines'
/// `telemetry::in_request`).
pub struct Current {
    method: Method,
    uri: Uri,
    /// The budget its route took, when not the default (`super::budget`).
    budget: Cell<Option<Duration>>,
    /// The `code` of its answer, once made (`super::reply::envelope`), for what counts
    /// answers by code (`purchase::api::Counted`). Kept here rather than in the
    /// response's extensions: their first entry costs a map, a table and a box.
    code: Cell<Option<&'static str>>,
}

tokio::task_local! {
    static CURRENT: Current;
}

/// The current request's id; empty outside a request.
pub fn current() -> Arc<str> {
    telemetry::trace_id().unwrap_or_else(|| Arc::from(""))
}

/// The current request's method and path, for a failure's log line.
pub fn method_and_path() -> (String, String) {
    CURRENT
        .try_with(|c| (c.method.to_string(), c.uri.path().to_owned()))
        .unwrap_or_default()
}

/// Gives the current request a budget of its own (`super::budget::bulk`).
pub fn grant_budget(budget: Duration) {
    let _ = CURRENT.try_with(|c| c.budget.set(Some(budget)));
}

/// Notes the `code` of the current request's answer (the last one made wins).
pub fn answered(code: &'static str) {
    let _ = CURRENT.try_with(|c| c.code.set(Some(code)));
}

/// The `code` of the current request's answer, once one was made.
pub fn answer_code() -> Option<&'static str> {
    CURRENT.try_with(|c| c.code.get()).ok().flatten()
}

/// The budget the current request's route took, if any.
pub fn granted_budget() -> Option<Duration> {
    CURRENT.try_with(|c| c.budget.get()).ok().flatten()
}

/// Serves `request` with its id known to [`current`] and to its log lines, and echoed in
/// the answer's `X-Request-Id`. Not an `async fn`, and `serve` not an async closure: each
/// would keep the future it is given twice, and every request's future, moved on its way
/// through the layers, would carry the copies (their moves were a twentieth of a purchase's
/// CPU, measured with `perf`); and a type of its own, so that the edge can name it.
pub fn serve<F: Future<Output = Response>>(
    request: Request,
    serve: impl FnOnce(Request) -> F,
) -> Served<F> {
    let id = request
        .headers()
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| is_sane(v))
        .map_or_else(new_id, Arc::from);
    let current = Current {
        method: request.method().clone(),
        uri: request.uri().clone(),
        budget: Cell::new(None),
        code: Cell::new(None),
    };
    Served {
        header: HeaderValue::from_str(&id).ok(),
        serving: CURRENT.scope(current, telemetry::in_request(id, serve(request))),
    }
}

pin_project! {
    /// A request served by [`serve`].
    pub struct Served<F> {
        #[pin]
        serving: TaskLocalFuture<Current, InRequest<F>>,
        // The `X-Request-Id` the answer gets.
        header: Option<HeaderValue>,
    }
}

impl<F: Future<Output = Response>> Future for Served<F> {
    type Output = Response;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response> {
        let this = self.project();
        let mut response = ready!(this.serving.poll(cx));
        if let Some(value) = this.header.take() {
            response.headers_mut().insert(X_REQUEST_ID.clone(), value);
        }
        Poll::Ready(response)
    }
}

/// A new ULID, encoded on the stack and allocated once.
fn new_id() -> Arc<str> {
    let mut text = [0u8; ulid::ULID_LEN];
    Arc::from(&*ulid::Ulid::new().array_to_str(&mut text))
}

/// Names the buyer (and the item) in the rest of the request's log lines.
pub fn record_user(user: UserId, item: Option<ItemId>) {
    telemetry::record_buyer(user.get(), item.map(ItemId::get));
}

/// Short and plain enough to go into a header, a JSON string and a log line unchanged.
fn is_sane(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_ids_are_taken() {
        assert!(is_sane("abc-123_x.y:z"));
        assert!(!is_sane(""));
        assert!(!is_sane("a b"));
        assert!(!is_sane("a\"b"));
        assert!(!is_sane(&"x".repeat(129)));
    }
}
