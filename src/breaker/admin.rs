//! `GET /admin/circuit`, `POST /admin/circuit/open?item=ID&level=N`,
//! `POST /admin/circuit/close?item=ID` (no `item`: the global breaker, which also closes
//! every instance's automatic one). Optional `by` and `reason` parameters go into the audit
//! log.

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::deps::Deps;
use crate::domain::ItemId;
use crate::http::error::{ApiError, Refusal};
use crate::http::extract::{Admin, ApiQuery};
use crate::http::reply::ok;
use crate::state::AppState;

use super::store::{self, AutoState, Setting, Source};
use super::{Level, Scope};

/// A breaker's refusal, as every route answers it.
impl From<super::Open> for ApiError {
    fn from(open: super::Open) -> Self {
        let super::Open {
            level,
            scope,
            retry_after,
        } = open;
        ApiError::CircuitOpen {
            level,
            scope,
            retry_after,
        }
    }
}

/// The audit log's columns: who (`actor`) and why.
const MAX_BY: usize = 100;
const MAX_REASON: usize = 500;

/// The operators' breaker switches.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(open))
        .routes(routes!(close))
}

/// The breakers: the global one, every item's that is not closed, and every instance's
/// automatic breaker that is not closed.
#[derive(ToSchema)]
#[allow(dead_code)] // a schema only: `list` builds it from the stored settings
struct Breakers {
    global: BreakerState,
    items: Vec<BreakerState>,
    /// Tripped by what one instance measured: they hold back that instance's purchases
    /// only.
    instances: Vec<BreakerState>,
}

/// One breaker: its level, and who or what set it (absent for one never set).
#[derive(ToSchema)]
#[allow(dead_code)] // a schema only, as above
struct BreakerState {
    /// `global`, `item:{id}` or `instance:{id}`.
    scope: String,
    /// An item breaker's item.
    item_id: Option<ItemId>,
    /// An instance's automatic breaker: the instance (as its log names it).
    instance: Option<String>,
    level: Level,
    source: Option<Source>,
    /// An automatic breaker: open or half-open.
    state: Option<AutoState>,
    /// An automatic breaker: seconds open before it probes.
    cool_down_s: Option<u64>,
    by: Option<String>,
    reason: Option<String>,
    at: Option<DateTime<Utc>>,
}

/// A breaker set by hand.
#[derive(Serialize, ToSchema)]
struct Changed {
    /// `global`, or `item:{id}`.
    scope: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    item_id: Option<ItemId>,
    level: Level,
    previous_level: Level,
    /// Whether the change is in MySQL's audit log (the change holds either way).
    audited: bool,
}

/// `GET /admin/circuit`: the global breaker, and every item breaker and instance's automatic
/// breaker that is not closed.
#[utoipa::path(
    get,
    path = "/admin/circuit",
    tag = "circuit",
    operation_id = "list_breakers",
    summary = "Every breaker that is not closed, and the global one",
    security(("admin" = [])),
    responses((status = 200, description = "`ok`", body = Breakers))
)]
async fn list(_: Admin, State(state): State<AppState>) -> Result<Response, ApiError> {
    let Deps { redis, keys, .. } = &state.deps;
    let settings = store::load_all(redis, keys).await?;
    let automatic = store::load_automatic(redis, keys).await?;
    let describe = |scope: Scope, setting: Option<&Setting>| {
        let mut entry = match setting {
            Some(s) => serde_json::to_value(s).unwrap_or(Value::Null),
            None => json!({ "level": Level::Closed }),
        };
        entry["scope"] = json!(scope.field());
        match scope {
            Scope::Item(item) => entry["item_id"] = json!(item),
            Scope::Instance(id) => entry["instance"] = json!(id.to_string()),
            Scope::Global => {}
        }
        entry
    };
    let global = describe(Scope::Global, settings.get(&Scope::Global));
    let mut items: Vec<(ItemId, Value)> = settings
        .iter()
        .filter_map(|(scope, s)| scope.item().map(|id| (id, describe(*scope, Some(s)))))
        .collect();
    items.sort_by_key(|(id, _)| *id);
    let items: Vec<Value> = items.into_iter().map(|(_, v)| v).collect();
    let mut instances: Vec<(String, Value)> = automatic
        .iter()
        .map(|(scope, s)| (scope.field(), describe(*scope, Some(s))))
        .collect();
    instances.sort_by(|(a, _), (b, _)| a.cmp(b));
    let instances: Vec<Value> = instances.into_iter().map(|(_, v)| v).collect();
    Ok(ok(
        "ok",
        json!({ "global": global, "items": items, "instances": instances }),
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OpenQuery {
    /// The item's breaker; without it, the global one.
    item: Option<ItemId>,
    /// 1 throttle, 2 degrade, 3 stop.
    #[param(minimum = 1, maximum = 3)]
    level: u8,
    /// Who, for the audit log.
    #[param(max_length = 100)]
    by: Option<String>,
    /// Why, for the audit log.
    #[param(max_length = 500)]
    reason: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CloseQuery {
    /// The item's breaker; without it, the global one.
    item: Option<ItemId>,
    #[param(max_length = 100)]
    by: Option<String>,
    #[param(max_length = 500)]
    reason: Option<String>,
}

/// `POST /admin/circuit/open?item=ID&level=N`
#[utoipa::path(
    post,
    path = "/admin/circuit/open",
    tag = "circuit",
    operation_id = "open_breaker",
    summary = "Open a breaker (persisted; every instance obeys within a second; the global one replaces every automatic one)",
    security(("admin" = [])),
    params(OpenQuery),
    responses(
        (status = 200, description = "`opened`", body = Changed),
        (status = 404, description = "`item_not_found`", body = Refusal),
    )
)]
async fn open(
    _: Admin,
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<OpenQuery>,
) -> Result<Response, ApiError> {
    let level = match Level::try_from(query.level) {
        Ok(Level::Closed) | Err(_) => {
            return Err(ApiError::bad_request(
                "`level`: 1 (throttle), 2 (degrade) or 3 (stop); to close use /admin/circuit/close",
            ));
        }
        Ok(level) => level,
    };
    change(&state, query.item, level, query.by, query.reason, "opened").await
}

/// `POST /admin/circuit/close?item=ID`
#[utoipa::path(
    post,
    path = "/admin/circuit/close",
    tag = "circuit",
    operation_id = "close_breaker",
    summary = "Close a breaker (the global one also closes every automatic one)",
    security(("admin" = [])),
    params(CloseQuery),
    responses(
        (status = 200, description = "`closed`", body = Changed),
        (status = 404, description = "`item_not_found`", body = Refusal),
    )
)]
async fn close(
    _: Admin,
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<CloseQuery>,
) -> Result<Response, ApiError> {
    change(
        &state,
        query.item,
        Level::Closed,
        query.by,
        query.reason,
        "closed",
    )
    .await
}

async fn change(
    state: &AppState,
    item: Option<ItemId>,
    level: Level,
    by: Option<String>,
    reason: Option<String>,
    code: &'static str,
) -> Result<Response, ApiError> {
    let by = text("by", by, "admin", MAX_BY)?;
    let reason = text("reason", reason, "set by hand", MAX_REASON)?;
    let scope = match item {
        Some(id) => {
            state.catalog.get(id).await?.ok_or(ApiError::ItemNotFound)?;
            Scope::Item(id)
        }
        None => Scope::Global,
    };
    let by_hand = store::ByHand {
        deps: &state.deps,
        breakers: &state.breakers,
    };
    let (previous, audited) = by_hand.set(scope, level, &by, &reason).await?;
    let body = Changed {
        scope: scope.field(),
        item_id: item,
        level,
        previous_level: previous,
        audited,
    };
    Ok(ok(code, body))
}

/// An optional free-text parameter, trimmed and bounded.
fn text(name: &str, value: Option<String>, default: &str, most: usize) -> Result<String, ApiError> {
    let value = value.map(|v| v.trim().to_owned()).unwrap_or_default();
    if value.chars().count() > most {
        return Err(ApiError::bad_request(format!(
            "`{name}`: at most {most} characters"
        )));
    }
    Ok(if value.is_empty() {
        default.to_owned()
    } else {
        value
    })
}
