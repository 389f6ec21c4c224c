//! The shape of every answer under `/api` and `/admin`: a JSON object with `code` and
//! `trace_id`, plus whatever the answer carries.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::request_id;

#[derive(Serialize)]
struct Envelope<'a, T> {
    code: &'a str,
    trace_id: &'a str,
    #[serde(flatten)]
    body: T,
}

/// `body` must serialize as a JSON object (a struct, a map or `json!({..})`).
pub fn envelope<T: Serialize>(status: StatusCode, code: &str, body: T) -> Response {
    let trace_id = request_id::current();
    match serde_json::to_vec(&Envelope {
        code,
        trace_id: &trace_id,
        body,
    }) {
        Ok(bytes) => {
            let mut response = (status, bytes).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot serialize a response");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// `200` with `code` and the body.
pub fn ok<T: Serialize>(code: &str, body: T) -> Response {
    envelope(StatusCode::OK, code, body)
}
