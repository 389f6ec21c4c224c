//! The yardsticks for `loadtest/bench.sh`: the least an HTTP server must do for a purchase.
//!
//! `POST /grab` reads `{"item_id": N}` and the `X-User` header and runs the same `grab.lua`
//! call as seckill (`FCALL`) over one multiplexed connection — no auth, no checks, no
//! logs, no publishing. `POST /minimal` does the same with the least a sale can do in Redis
//! (`loadtest/lua/minimal.lua`: no window, no outbox), on an item of its own.
//! `POST /minimal/fresh` runs the minimal script as a buyer never seen before on every
//! request (a counter, not the request, names the buyer): every answer a win, as for a
//! crowd of new buyers with the stock holding out. `GET /hello` answers a constant.
//! seckill's purchase path is measured against `/grab` and `/minimal`, its sold-out path
//! against `/hello`, and a crowd of 300,000 buyers against `/minimal/fresh` and `/hello`.
//!
//! `cargo run --release --example bare -- --addr 127.0.0.1:18081 --units 1000000`

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use redis::aio::ConnectionManager;
use serde::Deserialize;
use serde_json::{Value, json};

use seckill::domain::{BucketId, ItemId, UserId};
use seckill::testing::grab;
use seckill::testing::{ItemKeys, Keys};

#[path = "fixture.rs"]
mod fixture;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:18081")]
    addr: SocketAddr,
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Namespace of the bare server's own item (its keys are deleted at start).
    #[arg(long, default_value = "bare")]
    namespace: String,
    /// Units to load for the bare item.
    #[arg(long, default_value_t = 1_000_000)]
    units: u64,
    /// Units to load for `/minimal/fresh`'s item: one a request it is sent.
    #[arg(long, default_value_t = 1_000_000)]
    fresh_units: u64,
}

#[derive(Clone)]
struct Bare {
    redis: ConnectionManager,
    /// grab.lua's item (1), the minimal script's (2) and `/minimal/fresh`'s (3).
    keys: Arc<(ItemKeys, ItemKeys, ItemKeys)>,
    /// The next new buyer of `/minimal/fresh`.
    fresh: Arc<AtomicU64>,
}

#[derive(Deserialize)]
struct Body {
    item_id: ItemId,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let namespace = Keys::new(&args.namespace);
    let item_keys = |id| {
        ItemId::new(id)
            .map(|item| namespace.bucket(BucketId::whole(item)))
            .ok_or_else(|| anyhow::anyhow!("item {id}"))
    };
    let keys = (item_keys(1)?, item_keys(2)?, item_keys(3)?);
    let mut redis = ConnectionManager::new(redis::Client::open(args.redis.as_str())?).await?;
    fixture::load(&mut redis, &keys.0, args.units).await?;
    fixture::load(&mut redis, &keys.1, args.units).await?;
    fixture::load(&mut redis, &keys.2, args.fresh_units).await?;
    seckill::testing::lua::preload(&mut redis).await?;

    let app = Router::new()
        .route("/grab", post(grab_handler))
        .route("/minimal", post(minimal_handler))
        .route("/minimal/fresh", post(fresh_handler))
        .route("/hello", get(hello).post(hello))
        .with_state(Bare {
            redis,
            keys: Arc::new(keys),
            // Far above the X-User numbers the other routes are sent.
            fresh: Arc::new(AtomicU64::new(1_000_000_000)),
        });
    // The same backlog as seckill's own listener, so the yardstick meets a crowd alike.
    let listener = seckill::testing::listen(args.addr)?;
    eprintln!("bare server on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// A constant, whatever the request: the sold-out path's yardstick gets the same POST
/// (headers and body) as seckill, so that both cost the load generator the same.
async fn hello() -> Json<Value> {
    Json(json!({ "code": "hello" }))
}

fn user(headers: &HeaderMap) -> UserId {
    headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .and_then(UserId::parse)
        .unwrap_or(UserId::new(1))
}

async fn grab_handler(
    State(bare): State<Bare>,
    headers: HeaderMap,
    Json(body): Json<Body>,
) -> (StatusCode, Json<Value>) {
    let user = user(&headers);
    let (order_sn, payload) = fixture::order(body.item_id, user);
    // The very function seckill's purchase handler calls: the same script, keys and args.
    let answer = grab(
        &mut bare.redis.clone(),
        &bare.keys.0,
        (user, 1),
        &order_sn,
        &payload,
        None,
        false,
    )
    .await;
    match answer {
        Ok((outcome, _)) => (StatusCode::OK, Json(json!({ "code": outcome.as_str() }))),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "code": "unavailable" })),
        ),
    }
}

/// The same request against the minimal script: the price of grab.lua's guarantees shows
/// as the distance between this and `/grab`.
async fn minimal_handler(
    State(bare): State<Bare>,
    headers: HeaderMap,
    Json(_): Json<Body>,
) -> (StatusCode, Json<Value>) {
    minimal_answer(&bare, &bare.keys.1, user(&headers)).await
}

/// The minimal script as a new buyer each time: the least a crowd of new buyers costs.
/// The request is read as on the other routes, so that it costs alike.
async fn fresh_handler(State(bare): State<Bare>, Json(_): Json<Body>) -> (StatusCode, Json<Value>) {
    let next = bare.fresh.fetch_add(1, Ordering::Relaxed);
    let user = UserId::new(next);
    minimal_answer(&bare, &bare.keys.2, user).await
}

async fn minimal_answer(bare: &Bare, keys: &ItemKeys, user: UserId) -> (StatusCode, Json<Value>) {
    let now = chrono::Utc::now().timestamp_millis();
    match fixture::minimal(&mut bare.redis.clone(), keys, user, now).await {
        Ok(outcome) => (StatusCode::OK, Json(json!({ "code": outcome }))),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "code": "unavailable" })),
        ),
    }
}
