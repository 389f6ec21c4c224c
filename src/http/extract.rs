//! Extractors: authentication and validation happen here, so handlers only see good input.
//! Each refusal is one `code` of the contract, with a detail naming what is wrong.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::auth::{admin_token_matches, bearer};
use crate::domain::UserId;
use crate::http::error::ApiError;

use super::Edge;
use super::rate_limit::{Limited, client_ip};

/// A JSON body, whatever its `Content-Type` (curl users forget it), refused with a 400
/// that names the field at fault.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("request body: {}", e.body_text())))?;
        // Every body of this API is an object. (serde would also read `[1001]` as a struct.)
        if bytes.trim_ascii_start().first() != Some(&b'{') {
            return Err(ApiError::bad_request("request body must be a JSON object"));
        }
        // Read plainly first; only a body that fails is read again to find the field at
        // fault (tracking the path cost a sold-out answer 1k of its instructions).
        if let Ok(value) = serde_json::from_slice(&bytes) {
            return Ok(ApiJson(value));
        }
        let mut json = serde_json::Deserializer::from_slice(&bytes);
        serde_path_to_error::deserialize(&mut json)
            .map(ApiJson)
            .map_err(|e| {
                let path = e.path().to_string();
                if path == "." {
                    ApiError::bad_request(format!("request body: {}", e.inner()))
                } else {
                    ApiError::bad_request(format!("request body: `{path}`: {}", e.inner()))
                }
            })
    }
}

/// Path parameters, refused with a 400.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        ApiError::bad_request(format!("path: {}", e.body_text()))
    }
}

/// Query parameters, refused with a 400.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        ApiError::bad_request(format!("query: {}", e.body_text()))
    }
}

/// A user with a valid token.
pub struct AuthUser(pub UserId);

impl<S: Edge> FromRequestParts<S> for AuthUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let user = bearer(header)
            .and_then(|token| state.jwt().verify(token))
            .map_err(|e| ApiError::Unauthorized(e.as_str()))?;
        Ok(AuthUser(user))
    }
}

/// A user allowed to attempt a purchase now: the client IP within its rate (checked
/// before the token, so a flood of bad tokens is limited too), a valid token, the user
/// within theirs.
pub struct Buyer(pub UserId);

impl<S: Edge> FromRequestParts<S> for Buyer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        limited_user(parts, state, Limited::Purchase)
            .await
            .map(Buyer)
    }
}

/// A user looking for their order of an item: limited like a buyer, on a budget of its own.
pub struct OrderSeeker(pub UserId);

impl<S: Edge> FromRequestParts<S> for OrderSeeker {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        limited_user(parts, state, Limited::OrderLookup)
            .await
            .map(OrderSeeker)
    }
}

async fn limited_user<S: Edge>(
    parts: &mut Parts,
    state: &S,
    what: Limited,
) -> Result<UserId, ApiError> {
    if state.limits().per_ip_enabled(what)
        && let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>()
    {
        state
            .limits()
            .check_ip(what, client_ip(state.settings(), *peer, &parts.headers))?;
    }
    let AuthUser(user) = AuthUser::from_request_parts(parts, state).await?;
    state.limits().check_user(what, user)?;
    Ok(user)
}

/// A reader without a token, within the per-IP read rate (`SECKILL_READ_RATE_PER_IP`):
/// every id this instance does not know costs a store look-up, so one client cannot make
/// them without limit.
pub struct Reader;

impl<S: Edge> FromRequestParts<S> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        if state.limits().reads_limited()
            && let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>()
        {
            state
                .limits()
                .check_read(client_ip(state.settings(), *peer, &parts.headers))?;
        }
        Ok(Reader)
    }
}

/// A request whose `X-Client-Time` (ms since the epoch) is within the tolerated skew of
/// server time: a guard, its value unused (the sale's window is judged by Redis's clock).
pub struct ClientTime;

impl<S: Edge> FromRequestParts<S> for ClientTime {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let value = parts.headers.get("x-client-time").ok_or_else(|| {
            ApiError::bad_request("missing X-Client-Time header (ms since the epoch)")
        })?;
        let client_ms: i64 = value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| {
                ApiError::bad_request("X-Client-Time is not a number of ms since the epoch")
            })?;
        let skew_ms = client_ms.saturating_sub(crate::clock::now_ms());
        if skew_ms.unsigned_abs() > state.settings().clock_skew_ms {
            return Err(ApiError::ClockSkew {
                skew_ms,
                tolerance_ms: state.settings().clock_skew_ms,
            });
        }
        Ok(ClientTime)
    }
}

/// The optional `Idempotency-Key` of a purchase: 1–64 printable ASCII characters.
pub struct Idempotency(pub Option<String>);

/// The longest `Idempotency-Key` taken.
const MAX_IDEMPOTENCY_KEY: usize = 64;

impl<S: Send + Sync> FromRequestParts<S> for Idempotency {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let Some(value) = parts.headers.get("idempotency-key") else {
            return Ok(Idempotency(None));
        };
        let bytes = value.as_bytes();
        if bytes.is_empty()
            || bytes.len() > MAX_IDEMPOTENCY_KEY
            || !bytes.iter().all(|b| (b' '..=b'~').contains(b))
        {
            return Err(ApiError::bad_request(format!(
                "Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"
            )));
        }
        Ok(Idempotency(Some(
            String::from_utf8_lossy(bytes).into_owned(),
        )))
    }
}

/// An operator: `Authorization: Bearer $SECKILL_ADMIN_TOKEN`.
pub struct Admin;

impl<S: Edge> FromRequestParts<S> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Some(expected) = &state.settings().admin_token else {
            return Err(ApiError::Unauthorized(
                "the admin API is off: set SECKILL_ADMIN_TOKEN",
            ));
        };
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match bearer(header) {
            Ok(given) if admin_token_matches(expected, given) => Ok(Admin),
            _ => Err(ApiError::Unauthorized("admin token missing or wrong")),
        }
    }
}
