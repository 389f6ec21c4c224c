//! The yardstick for `loadtest/bench.sh`: the least an HTTP server must do for a purchase.
//!
//! `POST /grab` reads `{"item_id": N}` and the `X-User` header and runs the same
//! `EVALSHA grab.lua` as seckill over one multiplexed connection — no auth, no checks, no
//! logs, no publishing. `GET /hello` answers a constant. seckill's purchase path is
//! measured against the first; its sold-out path against the second.
//!
//! `cargo run --release --example bare -- --addr 127.0.0.1:18081 --units 1000000`

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use redis::aio::ConnectionManager;
use serde::Deserialize;
use serde_json::{Value, json};

use seckill::domain::{ItemId, OrderPlaced, OrderSn, Stock, UserId};
use seckill::keys::{ItemKeys, Keys};
use seckill::purchase::grab::grab;

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
}

#[derive(Clone)]
struct Bare {
    redis: ConnectionManager,
    keys: std::sync::Arc<ItemKeys>,
}

#[derive(Deserialize)]
struct Body {
    item_id: ItemId,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let item = ItemId::new(1).ok_or_else(|| anyhow::anyhow!("item 1"))?;
    let keys = Keys::new(&args.namespace).stock(Stock::whole(item));
    let mut redis = ConnectionManager::new(redis::Client::open(args.redis.as_str())?).await?;
    load(&mut redis, &keys, args.units).await?;
    seckill::lua::preload(&mut redis).await?;

    let app = Router::new()
        .route("/grab", post(grab_handler))
        .route("/hello", get(hello).post(hello))
        .with_state(Bare {
            redis,
            keys: std::sync::Arc::new(keys),
        });
    // The same backlog as seckill's own listener, so the yardstick meets a crowd alike.
    let listener = seckill::app::listen(args.addr)?;
    eprintln!("bare server on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// A constant, whatever the request: the sold-out path's yardstick gets the same POST
/// (headers and body) as seckill, so that both cost the load generator the same.
async fn hello() -> Json<Value> {
    Json(json!({ "code": "hello" }))
}

async fn grab_handler(
    State(bare): State<Bare>,
    headers: HeaderMap,
    Json(body): Json<Body>,
) -> (StatusCode, Json<Value>) {
    let user = headers
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .and_then(UserId::parse)
        .unwrap_or(UserId::new(1));
    let now = chrono::Utc::now().timestamp_millis();
    let order = OrderPlaced {
        order_sn: OrderSn::generate(Stock::whole(body.item_id), false),
        item_id: body.item_id,
        user_id: user,
        created_at_ms: now,
        pay_deadline_ms: now + 1_800_000,
        slot: 0,
    };
    let payload = serde_json::to_string(&order).unwrap_or_default();
    // The very function seckill's purchase handler calls: the same script, keys and args.
    let answer = grab(
        &mut bare.redis.clone(),
        &bare.keys,
        user,
        &order.order_sn,
        &payload,
        None,
    )
    .await;
    match answer {
        Ok(outcome) => (StatusCode::OK, Json(json!({ "code": outcome.as_str() }))),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "code": "unavailable" })),
        ),
    }
}

/// A fresh item: every key of the namespace's item 1 rebuilt, `units` tokens, open window.
async fn load(redis: &mut ConnectionManager, keys: &ItemKeys, units: u64) -> anyhow::Result<()> {
    let mut pipe = redis::pipe();
    pipe.del(&keys.meta)
        .del(&keys.tokens)
        .del(&keys.pending)
        .del(&keys.outbox);
    for key in keys.all_buyer_keys() {
        pipe.del(key);
    }
    pipe.query_async::<()>(redis).await?;
    for start in (0..units).step_by(10_000) {
        let batch: Vec<u64> = (start..(start + 10_000).min(units)).collect();
        redis::cmd("RPUSH")
            .arg(&keys.tokens)
            .arg(batch)
            .query_async::<()>(redis)
            .await?;
    }
    redis::cmd("HSET")
        .arg(&keys.meta)
        .arg(&[
            ("loaded", "1"),
            ("paused", "0"),
            ("start_ms", "0"),
            ("end_ms", "99999999999999"),
        ])
        .query_async::<()>(redis)
        .await?;
    Ok(())
}
