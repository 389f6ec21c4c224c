//! Request ids: taken from `X-Request-Id` when the client (or nginx) sent a sane one, made
//! up otherwise; echoed in the response header and in every JSON body as `trace_id`; and
//! carried by the request's tracing span, so every log line of a request names it.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;
use tracing::field::Empty;

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
