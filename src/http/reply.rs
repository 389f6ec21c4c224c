//! The shape of every answer under `/api` and `/admin`: a JSON object with `code` and
//! `trace_id`, plus whatever the answer carries.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::request_id;

/// `body` must serialize as a JSON object (a struct, a map or `json!({..})`); its fields
/// follow `code` and `trace_id`. (Spliced rather than `#[serde(flatten)]`, which buffers
/// every field through serde's generic content type: this runs on every answer.)
pub fn envelope<T: Serialize>(status: StatusCode, code: &'static str, body: T) -> Response {
    match spliced(code, &request_id::current(), &body) {
        Ok(bytes) => {
            // Built here rather than by `Vec<u8>::into_response`, whose content type would
            // only be replaced.
            let mut response = Response::new(Body::from(bytes));
            *response.status_mut() = status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            request_id::answered(code);
            response
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot serialize a response");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

fn spliced<T: Serialize>(code: &str, trace_id: &str, body: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"{\"code\":");
    serde_json::to_writer(&mut out, code)?;
    out.extend_from_slice(b",\"trace_id\":");
    serde_json::to_writer(&mut out, trace_id)?;
    // The body's own fields follow, in place of its opening brace.
    let start = out.len();
    serde_json::to_writer(&mut out, body)?;
    match &out[start..] {
        b"{}" => {
            out.truncate(start);
            out.push(b'}');
        }
        [b'{', ..] => out[start] = b',',
        _ => {
            return Err(serde::ser::Error::custom(
                "a response body must be a JSON object",
            ));
        }
    }
    Ok(out)
}

/// `200` with `code` and the body.
pub fn ok<T: Serialize>(code: &'static str, body: T) -> Response {
    envelope(StatusCode::OK, code, body)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::spliced;

    #[test]
    fn code_and_trace_id_come_first_then_the_body() {
        let bytes = spliced("queued", "t1", &json!({ "order_sn": "1-X", "item_id": 1 })).unwrap();
        let value: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            value,
            json!({ "code": "queued", "trace_id": "t1", "order_sn": "1-X", "item_id": 1 })
        );
        let empty: Value =
            serde_json::from_slice(&spliced("ok", "t\"2", &json!({})).unwrap()).unwrap();
        assert_eq!(empty, json!({ "code": "ok", "trace_id": "t\"2" }));
        assert!(spliced("ok", "t", &json!([1])).is_err());
    }
}
