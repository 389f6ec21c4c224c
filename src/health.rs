//! `/healthz` (the process answers), `/readyz` (its dependencies answer) and `/metrics`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::deps::Deps;
use crate::state::{AppState, Shared};
use crate::store::mysql_timed;

use crate::http::reply::{envelope, ok};

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
    let (redis_up, mysql_up, rabbitmq_up) = answering(&state).await;
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

/// Whether Redis, MySQL and RabbitMQ answer.
async fn answering(state: &Shared) -> (bool, bool, bool) {
    let Deps {
        db, redis, broker, ..
    } = &state.deps;
    let (redis_ok, mysql_ok) = tokio::join!(
        redis.ping(),
        mysql_timed(sqlx::query("SELECT 1").execute(db))
    );
    (redis_ok.is_ok(), mysql_ok.is_ok(), broker.is_connected())
}

/// How often [`watch`] looks.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Every instance, every five seconds: whether its dependencies answer, how full Redis
/// is, and how many orders and dead letters wait in RabbitMQ — as gauges, for the alerting
/// rules (`monitoring/alerts.yml`) rather than for a probe.
pub async fn watch(state: AppState, shutdown: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(WATCH_EVERY) => {}
        }
        let (redis_up, mysql_up, rabbitmq_up) = answering(&state).await;
        let meters = &state.deps.meters;
        meters.dependency_up("redis", redis_up);
        meters.dependency_up("mysql", mysql_up);
        meters.dependency_up("rabbitmq", rabbitmq_up);
        if let Ok(masters) = state.deps.redis.memory_of_masters().await {
            meters.redis_memory(&masters);
        }
        let (orders, dead) = tokio::join!(
            state.deps.broker.queue_depth(),
            state.deps.broker.dead_letters()
        );
        if let Some(orders) = orders {
            meters.queue_messages("orders", orders);
        }
        if let Some(dead) = dead {
            meters.queue_messages("dead_letters", dead);
        }
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
