//! `/healthz` (the process answers), `/readyz` (its dependencies answer) and `/metrics`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::{AppState, Shared};
use crate::store::mysql_timed;

use super::reply::{envelope, ok};

/// Health checks: what every process serves, a worker-only one (no `api` role) too.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// `/metrics`, which moves with the operators' API to `SECKILL_ADMIN_ADDR`.
pub fn metrics_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Nothing beyond `code` and `trace_id`.
#[derive(Serialize, ToSchema)]
struct Alive {}

/// Each dependency: `up` or `down`.
#[derive(Serialize, ToSchema)]
struct Dependencies {
    #[schema(value_type = String, pattern = "^(up|down)$")]
    redis: &'static str,
    #[schema(value_type = String, pattern = "^(up|down)$")]
    mysql: &'static str,
    #[schema(value_type = String, pattern = "^(up|down)$")]
    rabbitmq: &'static str,
}

/// Whether the dependencies answer.
#[derive(Serialize, ToSchema)]
struct Readiness {
    /// When not ready: which do not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    /// When not ready: the ones down (`redis`, `mysql`, `rabbitmq`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    down: Vec<&'static str>,
    dependencies: Dependencies,
}

/// The process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    responses((status = 200, description = "`ok`", body = Alive))
)]
async fn healthz() -> Response {
    ok("ok", Alive {})
}

/// Redis, MySQL and RabbitMQ answer.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    responses(
        (status = 200, description = "`ready`", body = Readiness),
        (status = 503, description = "`unavailable`: `down` names what does not answer", body = Readiness),
    )
)]
async fn readyz(State(state): State<AppState>) -> Response {
    let Shared {
        db, redis, broker, ..
    } = &*state;
    let (redis_ok, mysql_ok) = tokio::join!(
        redis.ping(),
        mysql_timed(sqlx::query("SELECT 1").execute(db))
    );
    let (redis_up, mysql_up, rabbitmq_up) =
        (redis_ok.is_ok(), mysql_ok.is_ok(), broker.is_connected());
    let down: Vec<&'static str> = [
        ("redis", redis_up),
        ("mysql", mysql_up),
        ("rabbitmq", rabbitmq_up),
    ]
    .into_iter()
    .filter_map(|(name, up)| (!up).then_some(name))
    .collect();
    let word = |up: bool| if up { "up" } else { "down" };
    let readiness = Readiness {
        detail: (!down.is_empty()).then(|| format!("not answering: {}", down.join(", "))),
        down,
        dependencies: Dependencies {
            redis: word(redis_up),
            mysql: word(mysql_up),
            rabbitmq: word(rabbitmq_up),
        },
    };
    if readiness.down.is_empty() {
        ok("ready", readiness)
    } else {
        envelope(StatusCode::SERVICE_UNAVAILABLE, "unavailable", readiness)
    }
}

/// `GET /metrics`: Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "health",
    summary = "Prometheus metrics (with the admin API on `SECKILL_ADMIN_ADDR` when set)",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"))
)]
async fn metrics() -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::telemetry::metrics().render(),
    )
}
