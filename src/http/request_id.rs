//! Request ids: taken from `X-Request-Id` when the client (or nginx) sent a sane one, made
//! up otherwise; echoed in the response header and in every JSON body as `trace_id`; and
//! carried by the request's tracing span, so every log line of a request names it.
//!
//! The span holds only `trace_id`, `user_id` and `item_id`: the log formatter encodes a
//! span's fields on every request, logged or not (method and path cost 7% of the sold-out
//! path's instructions). Failures, logged at the edge, add method and path themselves.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, Uri};
use axum::response::Response;
use tracing::Instrument;
use tracing::field::{Empty, Value};

use crate::domain::{ItemId, UserId};

pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request this task is serving (set by [`serve`]).
struct Current {
    trace_id: Arc<str>,
    method: Method,
    uri: Uri,
    /// The budget its route took, when not the default (`super::budget`).
    budget: Cell<Option<Duration>>,
}

tokio::task_local! {
    static CURRENT: Current;
}

/// The current request's id; empty outside a request.
pub fn current() -> Arc<str> {
    CURRENT
        .try_with(|c| c.trace_id.clone())
        .unwrap_or_else(|_| Arc::from(""))
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

/// The budget the current request's route took, if any.
pub fn granted_budget() -> Option<Duration> {
    CURRENT.try_with(|c| c.budget.get()).ok().flatten()
}

/// Serves `request` inside its span, with its id known to [`current`] and echoed in the
/// answer's `X-Request-Id`.
pub async fn serve(request: Request, serve: impl AsyncFnOnce(Request) -> Response) -> Response {
    let id = request
        .headers()
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| is_sane(v))
        .map_or_else(new_id, Arc::from);
    // As a `&str`, not `%id`: a Display value goes through `fmt`'s machinery.
    let span = tracing::info_span!("request", trace_id = &*id, user_id = Empty, item_id = Empty);
    let current = Current {
        trace_id: id.clone(),
        method: request.method().clone(),
        uri: request.uri().clone(),
        budget: Cell::new(None),
    };
    let mut response = CURRENT
        .scope(current, serve(request).instrument(span))
        .await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(X_REQUEST_ID.clone(), value);
    }
    response
}

/// A new ULID, encoded on the stack and allocated once.
fn new_id() -> Arc<str> {
    let mut text = [0u8; ulid::ULID_LEN];
    Arc::from(&*ulid::Ulid::new().array_to_str(&mut text))
}

/// Fills the request span's `user_id` (and `item_id`) in one call: the JSON log formatter
/// re-reads and re-writes a span's stored fields on every record, so one call, not two.
pub fn record_user(user: UserId, item: Option<ItemId>) {
    let span = tracing::Span::current();
    let Some(fields) = span.metadata().map(|m| m.fields()) else {
        return;
    };
    let (Some(user_field), Some(item_field)) = (fields.field("user_id"), fields.field("item_id"))
    else {
        return;
    };
    let user = user.get();
    match item {
        Some(item) => {
            let item = item.get();
            span.record_all(&fields.value_set(&[
                (&user_field, Some(&user as &dyn Value)),
                (&item_field, Some(&item as &dyn Value)),
            ]));
        }
        None => {
            span.record_all(&fields.value_set(&[(&user_field, Some(&user as &dyn Value))]));
        }
    }
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
