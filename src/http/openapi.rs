//! The OpenAPI 3.1 document of the HTTP API, served at `GET /api/openapi.json` and
//! committed as `openapi.json`. Each handler describes itself (`#[utoipa::path]`) and every
//! router is made with `utoipa_axum::routes!`, so a route cannot be served undescribed.
//! What every answer shares is added here, once: the `code` and `trace_id` of the
//! envelope, the `X-Request-Id` header, and the refusals any call can meet (400 for bad
//! input, 401 without a valid token, 503 and 500) — handlers list only their own.

use axum::Router;
use axum::http::header;
use axum::routing::get;
use serde_json::{Value, json};
use utoipa::openapi::link::{Link, LinkBuilder};
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{AllOfBuilder, Object, ObjectBuilder, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Components, Header};
use utoipa::openapi::{Content, ContentBuilder, HttpMethod, OpenApi, Ref, RefOr};
use utoipa::{OpenApi as _, ToSchema};

const PATH: &str = "/api/openapi.json";

/// The document's fixed parts; the paths come from the routers.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "seckill",
        description = "A flash-sale server: buyers press `POST /api/flashbuy`, the first \
            `total` win a unit each, everyone else is told at once. Every answer under `/api` \
            and `/admin` is a JSON object with `code` and `trace_id` (also sent as the \
            `X-Request-Id` header). Admin calls (`/admin`, `/metrics`) move to their own \
            listener when `SECKILL_ADMIN_ADDR` is set.",
        license(name = "MIT"),
    ),
    tags(
        (name = "purchase", description = "Buying a unit"),
        (name = "orders", description = "A buyer's orders: read, pay, cancel"),
        (name = "catalogue", description = "What a storefront shows"),
        (name = "items", description = "Operators: items, warm-ups, stats, reconciliation"),
        (name = "shops", description = "Operators: shop hours and status"),
        (name = "circuit", description = "Operators: circuit breakers"),
        (name = "health", description = "Probes, metrics and this document"),
    ),
    components(schemas(Envelope, crate::http::error::Refusal)),
)]
struct Fixed;

/// What every answer under `/api` and `/admin` starts with.
#[derive(ToSchema)]
#[allow(dead_code)] // a schema only: answers are spliced by `reply::envelope`
struct Envelope {
    /// What happened, one word of the contract (`queued`, `sold_out`, `bad_request`, …).
    code: String,
    /// This request's id, equal to the `X-Request-Id` header: quote it when reporting.
    trace_id: String,
}

/// The whole document, as served: the fixed parts, the routers' paths, this document's own
/// path, and the conventions every answer follows.
pub fn document(parts: impl IntoIterator<Item = OpenApi>) -> Value {
    let mut json = serde_json::to_value(described(parts)).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot serialize the OpenAPI document");
        Value::Null
    });
    unsigned(&mut json);
    json
}

fn described(parts: impl IntoIterator<Item = OpenApi>) -> OpenApi {
    let mut doc = Fixed::openapi();
    for part in parts {
        doc.merge(part);
    }
    doc.paths.paths.insert(PATH.into(), own_path());
    shared_components(doc.components.get_or_insert_with(Default::default));
    for (path, item) in doc.paths.paths.iter_mut() {
        let enveloped = path != PATH && path != "/metrics";
        for (method, operation) in operations(item) {
            if enveloped {
                shared_refusals(operation);
            }
            for (status, response) in operation.responses.responses.iter_mut() {
                if let RefOr::T(response) = response {
                    finish_response(status, response, enveloped);
                }
            }
            links(method, path, operation);
        }
    }
    doc
}

/// The refusals any call of its kind can meet: (component name, status, description).
const SHARED: [(&str, &str, &str); 4] = [
    (
        "BadRequest",
        "400",
        "`bad_request`: a parameter, header or body is malformed (`detail` names it)",
    ),
    (
        "Unauthorized",
        "401",
        "`unauthorized`: missing, bad or expired token",
    ),
    (
        "Internal",
        "500",
        "`internal`: a failure of the server's own; quote the `trace_id`",
    ),
    (
        "Unavailable",
        "503",
        "`unavailable`: a dependency did not answer within the one-second budget; \
         `Retry-After` says when to try again",
    ),
];

/// The security schemes, the headers every answer may carry and the shared refusals.
fn shared_components(components: &mut Components) {
    for (name, scheme) in [
        (
            "user",
            "A buyer's JWT (HS256, `sub` = user id, `exp` required)",
        ),
        ("admin", "`SECKILL_ADMIN_TOKEN`"),
    ] {
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.description = Some(scheme.into());
        if name == "user" {
            http.bearer_format = Some("JWT".into());
        }
        components.add_security_scheme(name, SecurityScheme::Http(http));
    }
    for (name, kind, description) in [
        (
            "X-Request-Id",
            Type::String,
            "This request's id: the one sent, or a new one (equal to `trace_id`)",
        ),
        (
            "Retry-After",
            Type::Integer,
            "Seconds to wait before trying again",
        ),
    ] {
        let mut header = Header::new(ObjectBuilder::new().schema_type(kind).build());
        header.description = Some(description.into());
        components.headers.insert(name.into(), header.into());
    }
    for (name, status, description) in SHARED {
        let mut response = refusal(description);
        finish_response(status, &mut response, true);
        components.responses.insert(name.into(), response.into());
    }
}

/// The shared refusals an operation can meet, where its handler did not name them: 400
/// when it takes input, 401 when it needs a token, 500 and 503 always.
fn shared_refusals(operation: &mut Operation) {
    let takes_input = operation.parameters.as_ref().is_some_and(|p| !p.is_empty())
        || operation.request_body.is_some();
    let has_token = operation.security.is_some();
    for (name, status, _) in SHARED {
        let applies = match status {
            "400" => takes_input,
            "401" => has_token,
            _ => true,
        };
        if applies {
            operation
                .responses
                .responses
                .entry(status.into())
                .or_insert_with(|| RefOr::Ref(Ref::new(format!("#/components/responses/{name}"))));
        }
    }
}

/// utoipa writes a `u64` as `int64` with a minimum of 0, but the ids, prices and counts
/// the server takes go past `int64`'s maximum (they are `BIGINT UNSIGNED` in MySQL): the
/// document says what the server accepts.
fn unsigned(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("format") == Some(&json!("int64")) && map.get("minimum") == Some(&json!(0)) {
                map.remove("format");
                map.entry("maximum").or_insert(json!(u64::MAX));
            }
            map.values_mut().for_each(unsigned);
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned),
        _ => {}
    }
}

/// `GET /api/openapi.json`, serving `document` (made once, at start).
pub fn router<S: Clone + Send + Sync + 'static>(document: &Value) -> Router<S> {
    let json = serde_json::to_string_pretty(document).unwrap_or_default();
    Router::new().route(
        PATH,
        get(move || {
            let json = json.clone();
            async move { ([(header::CONTENT_TYPE, "application/json")], json) }
        }),
    )
}

/// This document's own entry.
fn own_path() -> PathItem {
    let mut operation = Operation::new();
    operation.operation_id = Some("openapi".into());
    operation.tags = Some(vec!["health".into()]);
    operation.summary = Some("This document (OpenAPI 3.1)".into());
    let response = ResponseBuilder::new()
        .description("The OpenAPI document")
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::Object)))
                .build(),
        )
        .build();
    operation
        .responses
        .responses
        .insert("200".into(), response.into());
    PathItem::new(HttpMethod::Get, operation)
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = (HttpMethod, &mut Operation)> {
    [
        (HttpMethod::Get, item.get.as_mut()),
        (HttpMethod::Put, item.put.as_mut()),
        (HttpMethod::Post, item.post.as_mut()),
        (HttpMethod::Delete, item.delete.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, operation)| operation.map(|o| (method, o)))
}

/// A response whose body is a [`Refusal`](crate::http::error::Refusal).
fn refusal(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Refusal")))
                .build(),
        )
        .build()
}

/// Every answer carries `X-Request-Id`; a JSON one under the envelope also `code` and
/// `trace_id`; a `429` or `503` may say `Retry-After`.
fn finish_response(status: &str, response: &mut Response, enveloped: bool) {
    let shared_header = |name: &str| RefOr::Ref(Ref::new(format!("#/components/headers/{name}")));
    response
        .headers
        .insert("X-Request-Id".into(), shared_header("X-Request-Id"));
    if status == "429" || status == "503" {
        response
            .headers
            .insert("Retry-After".into(), shared_header("Retry-After"));
    }
    if !enveloped {
        return;
    }
    let codes = codes_in(&response.description);
    for content in response.content.values_mut() {
        if let RefOr::T(Content {
            schema: Some(schema),
            ..
        }) = content
        {
            let body = std::mem::replace(schema, RefOr::T(Object::new().into()));
            let mut all = AllOfBuilder::new().item(Ref::from_schema_name("Envelope"));
            if !codes.is_empty() {
                let code = ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(codes.clone()));
                all = all.item(ObjectBuilder::new().property("code", code).required("code"));
            }
            *schema = all.item(body).into();
        }
    }
}

/// The codes a response's description names before its first colon (`` `paused` /
/// `circuit_open`: … ``): the answer's `code` is one of them, and the document says so.
fn codes_in(description: &str) -> Vec<&str> {
    let head = description.split(':').next().unwrap_or_default();
    head.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        })
        .collect()
}

/// Links for Schemathesis's stateful runs (and client generators): an order number from a
/// win, or from a repeat press, leads to the order's calls; an item written leads to its
/// warm-up, its page and the buyer's order of it.
fn links(method: HttpMethod, path: &str, operation: &mut Operation) {
    const ORDER: &[&str] = &["get_order", "pay_order", "cancel_order"];
    const ITEM: &[&str] = &["warmup_item", "get_item", "item_stats", "my_order"];
    let found: &[(&str, &str, &str, &[&str])] = match (method, path) {
        (HttpMethod::Post, "/api/flashbuy") => &[
            ("202", "order_sn", "$response.body#/order_sn", ORDER),
            ("409", "order_sn", "$response.body#/order_sn", ORDER),
        ],
        (HttpMethod::Put, "/admin/items/{item_id}") => &[
            ("201", "item_id", "$request.path.item_id", ITEM),
            ("200", "item_id", "$request.path.item_id", ITEM),
        ],
        _ => return,
    };
    for (status, parameter, source, targets) in found {
        if let Some(RefOr::T(response)) = operation.responses.responses.get_mut(*status) {
            for target in *targets {
                response
                    .links
                    .insert((*target).into(), link(target, parameter, source).into());
            }
        }
    }
}

fn link(operation_id: &str, parameter: &str, source: &str) -> Link {
    LinkBuilder::new()
        .operation_id(operation_id)
        .parameter(parameter, source)
        .build()
}

#[cfg(test)]
mod tests {
    use super::codes_in;

    #[test]
    fn a_description_names_its_codes_before_the_colon() {
        assert_eq!(codes_in("`queued`: the user won"), ["queued"]);
        assert_eq!(
            codes_in("`paused` / `circuit_open`: held back; `Retry-After` set"),
            ["paused", "circuit_open"]
        );
        assert_eq!(codes_in("`ok`"), ["ok"]);
        assert!(codes_in("Prometheus text format").is_empty());
    }
}
