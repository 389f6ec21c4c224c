//! `GET /admin/circuit`, `POST /admin/circuit/open?item=ID&level=N`,
//! `POST /admin/circuit/close?item=ID` (no `item`: the global breaker). Optional `by` and
//! `reason` parameters go into the audit log.

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::domain::ItemId;
use crate::error::ApiError;
use crate::http::extract::{Admin, ApiQuery};
use crate::http::reply::ok;
use crate::state::{AppState, Shared};

use super::store::{self, Setting};
use super::{Level, Scope};

const MAX_TEXT: usize = 500;

/// The operators' breaker switches.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/circuit", get(list))
        .route("/admin/circuit/open", post(open))
        .route("/admin/circuit/close", post(close))
}

/// `GET /admin/circuit`: the global breaker, and every item breaker that is not closed.
async fn list(_: Admin, State(state): State<AppState>) -> Result<Response, ApiError> {
    let Shared { redis, keys, .. } = &*state;
    let settings = store::load_all(redis, keys).await?;
    let describe = |scope: Scope, setting: Option<&Setting>| {
        let mut entry = match setting {
            Some(s) => serde_json::to_value(s).unwrap_or(Value::Null),
            None => json!({ "level": Level::Closed }),
        };
        entry["scope"] = json!(scope.field());
        if let Some(item) = scope.item() {
            entry["item_id"] = json!(item);
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
    Ok(ok("ok", json!({ "global": global, "items": items })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenQuery {
    item: Option<ItemId>,
    level: u8,
    by: Option<String>,
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloseQuery {
    item: Option<ItemId>,
    by: Option<String>,
    reason: Option<String>,
}

/// `POST /admin/circuit/open?item=ID&level=N`
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
    let by = text("by", by, "admin")?;
    let reason = text("reason", reason, "set by hand")?;
    let scope = match item {
        Some(id) => {
            state.catalog.get(id).await?.ok_or(ApiError::ItemNotFound)?;
            Scope::Item(id)
        }
        None => Scope::Global,
    };
    let (previous, audited) = store::set_manual(
        &state.redis,
        &state.db,
        &state.keys,
        scope,
        level,
        &by,
        &reason,
    )
    .await?;
    // This instance obeys before it answers; the others within a second.
    let settings = store::load_all(&state.redis, &state.keys).await?;
    state.breakers.set_all(&store::levels(&settings));
    tracing::warn!(
        scope = scope.field(),
        previous = previous as u8,
        level = level as u8,
        by,
        reason,
        "circuit breaker set by hand"
    );
    let mut body = json!({
        "scope": scope.field(),
        "level": level,
        "previous_level": previous,
        "audited": audited.is_ok(),
    });
    if let Some(id) = item {
        body["item_id"] = json!(id);
    }
    Ok(ok(code, body))
}

/// An optional free-text parameter, trimmed and bounded.
fn text(name: &str, value: Option<String>, default: &str) -> Result<String, ApiError> {
    let value = value.map(|v| v.trim().to_owned()).unwrap_or_default();
    if value.chars().count() > MAX_TEXT {
        return Err(ApiError::bad_request(format!(
            "`{name}`: at most {MAX_TEXT} characters"
        )));
    }
    Ok(if value.is_empty() {
        default.to_owned()
    } else {
        value
    })
}
