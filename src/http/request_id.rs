//! Request ids: taken from `X-Request-Id` when the client (or nginx) sent a sane one, made
//! up otherwise; echoed in the response header and in every JSON body as `trace_id`; and
//! carried by the request's tracing span, so every log line of a request names it.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;
use tracing::field::{Empty, Value};

use crate::domain::{ItemId, UserId};

pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

tokio::task_local! {
    /// The id of the request this task is serving (set by [`layer`]).
    static TRACE_ID: Arc<str>;
}

/// The current request's id; empty outside a request.
pub fn current() -> Arc<str> {
    TRACE_ID
        .try_with(Arc::clone)
        .unwrap_or_else(|_| Arc::from(""))
}

pub async fn layer(request: Request, next: Next) -> Response {
    let id: Arc<str> = request
        .headers()
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| is_sane(v))
        .map(Arc::from)
        .unwrap_or_else(|| Arc::from(ulid::Ulid::new().to_string()));
    let span = tracing::info_span!(
        "request",
        trace_id = %id,
        method = %request.method(),
        path = %request.uri().path(),
        user_id = Empty,
        item_id = Empty,
    );
    let mut response = TRACE_ID
        .scope(id.clone(), next.run(request).instrument(span))
        .await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(X_REQUEST_ID.clone(), value);
    }
    response
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
