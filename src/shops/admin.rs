//! The operators' shop calls: `PUT /admin/shops/{id}/hours`, `PUT /admin/shops/{id}/status`
//! and `POST /admin/shops/{id}/refresh`, each one change under the shop's lock.

use axum::extract::State;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::error::{ApiError, Conflict, Refusal};
use crate::http::extract::{Admin, ApiJson, ApiPath};
use crate::http::reply::ok;
use crate::state::AppState;
use crate::store::{STORABLE, storable};

use super::api::{ShopView, view};
use super::changes::{ChangeError, ShopChange};
use super::hours::{Hours, Override};
use super::repo;

const MAX_REASON: usize = 500;

/// Shop changes, over this instance's stores.
fn changer(state: &AppState) -> ShopChange<'_> {
    ShopChange {
        deps: &state.deps,
        shops: &state.shops,
    }
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Busy => ApiError::Conflict {
                code: Conflict::ShopBusy,
                detail: "another change of this shop is in progress; try again".into(),
            },
            ChangeError::NotFound => ApiError::ShopNotFound,
            ChangeError::NotInRedis { shop } => ApiError::Unavailable(format!(
                "the change is saved in MySQL and logged, but Redis did not take it: instances that \
                 read Redis may show the old status until it does (a scheduler pushes it within a \
                 second of Redis answering; GET /api/shops/{shop}/status shows when it has)"
            )),
            ChangeError::Store(e) => e.into(),
        }
    }
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_hours))
        .routes(routes!(put_status))
        .routes(routes!(refresh))
}

/// `PUT /admin/shops/{id}/hours`
#[utoipa::path(
    put,
    path = "/admin/shops/{shop_id}/hours",
    tag = "shops",
    operation_id = "set_shop_hours",
    summary = "Set a shop's opening hours (a shop not seen before is created)",
    security(("admin" = [])),
    params(("shop_id" = u64, Path)),
    request_body = Hours,
    responses(
        (status = 200, description = "`updated`", body = ShopView),
        (status = 409, description = "`shop_busy`: another change of this shop is in progress", body = Refusal),
    )
)]
async fn put_hours(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<u64>,
    ApiJson(hours): ApiJson<Hours>,
) -> Result<Response, ApiError> {
    if let Some(problem) = hours.problem() {
        return Err(ApiError::bad_request(problem));
    }
    let after = changer(&state)
        .apply(id, "hours", "admin", "hours set", |db| async move {
            repo::set_hours(&db, id, &hours).await
        })
        .await?;
    Ok(ok("updated", view(&after)))
}

/// An operator's override of the hours.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusBody {
    /// `null` clears the override. Required: `{}` is a mistake, not a clear.
    #[serde(deserialize_with = "present")]
    #[schema(required)]
    open: Option<bool>,
    /// When the override ends (in the future, before 2038-01-19T03:14:07Z); none: until cleared.
    #[serde(default)]
    until: Option<DateTime<Utc>>,
    #[serde(default)]
    #[schema(max_length = 500)]
    reason: Option<String>,
    #[serde(default)]
    #[schema(max_length = 100)]
    by: Option<String>,
}

/// `open` must be sent, even as `null` (serde takes a missing `Option` for `None`
/// unless the field has its own deserializer).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Option::<bool>::deserialize(d)
}

/// `PUT /admin/shops/{id}/status`: an operator's override, or `{"open":null}` to clear it.
#[utoipa::path(
    put,
    path = "/admin/shops/{shop_id}/status",
    tag = "shops",
    operation_id = "set_shop_status",
    summary = "An operator's word on a shop, over its hours; `{\"open\": null}` hands back to them",
    security(("admin" = [])),
    params(("shop_id" = u64, Path)),
    request_body = StatusBody,
    responses(
        (status = 200, description = "`updated`", body = ShopView),
        (status = 409, description = "`shop_busy`", body = Refusal),
    )
)]
async fn put_status(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<u64>,
    ApiJson(body): ApiJson<StatusBody>,
) -> Result<Response, ApiError> {
    let reason = body.reason.unwrap_or_default().trim().to_owned();
    let by = body.by.unwrap_or_default().trim().to_owned();
    if reason.chars().count() > MAX_REASON || by.chars().count() > 100 {
        return Err(ApiError::bad_request(
            "`reason`: at most 500 characters; `by`: at most 100",
        ));
    }
    if body.until.is_some_and(|until| until <= crate::clock::now()) {
        return Err(ApiError::bad_request("`until` is in the past"));
    }
    if body.until.is_some_and(|until| !storable(until)) {
        return Err(ApiError::bad_request(format!("`until`: {STORABLE}")));
    }
    let value = body.open.map(|open| Override {
        open,
        until: body.until,
        reason: reason.clone(),
    });
    let by = if by.is_empty() {
        "admin".to_owned()
    } else {
        by
    };
    let why = if reason.is_empty() {
        "status set by hand".to_owned()
    } else {
        reason
    };
    let after = changer(&state)
        .apply(id, "status", &by, &why, |db| async move {
            repo::set_override(&db, id, value.as_ref()).await
        })
        .await?;
    Ok(ok("updated", view(&after)))
}

/// `POST /admin/shops/{id}/refresh`: recompute from MySQL and push it everywhere.
#[utoipa::path(
    post,
    path = "/admin/shops/{shop_id}/refresh",
    tag = "shops",
    operation_id = "refresh_shop",
    summary = "Recompute a shop's status from MySQL and push it everywhere",
    security(("admin" = [])),
    params(("shop_id" = u64, Path)),
    responses(
        (status = 200, description = "`refreshed`", body = ShopView),
        (status = 404, description = "`shop_not_found`", body = Refusal),
        (status = 409, description = "`shop_busy`", body = Refusal),
    )
)]
async fn refresh(
    _: Admin,
    State(state): State<AppState>,
    ApiPath(id): ApiPath<u64>,
) -> Result<Response, ApiError> {
    let after = changer(&state).refresh(id).await?;
    Ok(ok("refreshed", view(&after)))
}
