//! `/healthz` (the process answers), `/readyz` (its dependencies answer) and `/metrics`.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use serde_json::json;

use crate::state::{AppState, Shared};
use crate::store::mysql_timed;

use super::reply::{envelope, ok};

/// Health checks: what every process serves, a worker-only one (no `api` role) too.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// `/metrics`, which moves with the operators' API to `SECKILL_ADMIN_ADDR`.
pub fn metrics_router() -> Router<AppState> {
    Router::new().route("/metrics", get(metrics))
}

async fn healthz() -> Response {
    ok("ok", json!({}))
}

async fn readyz(State(state): State<AppState>) -> Response {
    let Shared {
        db, redis, broker, ..
    } = &*state;
    let (redis_ok, mysql_ok) = tokio::join!(
        redis.ping(),
        mysql_timed(sqlx::query("SELECT 1").execute(db))
    );
    let checks = [
        ("redis", redis_ok.is_ok()),
        ("mysql", mysql_ok.is_ok()),
        ("rabbitmq", broker.is_connected()),
    ];
    let down: Vec<&str> = checks
        .iter()
        .filter(|(_, up)| !up)
        .map(|(name, _)| *name)
        .collect();
    let status: serde_json::Map<String, serde_json::Value> = checks
        .iter()
        .map(|(name, up)| (name.to_string(), json!(if *up { "up" } else { "down" })))
        .collect();
    if down.is_empty() {
        ok("ready", json!({ "dependencies": status }))
    } else {
        envelope(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            json!({
                "detail": format!("not answering: {}", down.join(", ")),
                "down": down,
                "dependencies": status,
            }),
        )
    }
}

/// `GET /metrics`: Prometheus text format.
async fn metrics() -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::telemetry::metrics().render(),
    )
}
