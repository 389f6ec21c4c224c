//! docs/contract.md section 7, checked by the rehearsal itself against Redis and MySQL once the
//! order queue has drained — not taken from the server's own word. The facts are gathered
//! here; [`crate::invariants`] judges them.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::ProgressBar;

use crate::config::Settings;
use crate::domain::{BucketId, ItemId};

use crate::invariants::{Check, InRedis, Orders, check, doubled, judge};
use crate::items::repo as items;
use crate::items::stock::item_snapshot;
use crate::keys::Keys;
use crate::orders::repo;
use crate::store::{Db, RedisConns, connect_mysql};

use super::fire::Run;

/// Waits for the queue to drain (`pending` = 0 in Redis), then checks the invariants.
pub async fn check_all(
    settings: &Settings,
    item: ItemId,
    run: &Run,
    drain_timeout: Duration,
) -> anyhow::Result<Vec<Check>> {
    let redis = RedisConns::new(settings.redis_url.expose()).context("SECKILL_REDIS_URL")?;
    let db = connect_mysql(settings.database_url.expose()).await?;
    let keys = Keys::new(&settings.namespace);
    let record = items::get(&db, item)
        .await
        .context("reading the item from MySQL")?
        .with_context(|| format!("item {item} is not in MySQL"))?;

    let in_redis = drain(&redis, &keys, record.bucket_ids(), drain_timeout).await?;
    let orders = orders(&db, item, run).await?;
    let mut checks = judge(&in_redis, &orders, &run.won, &run.cancelled, drain_timeout);
    if record.draw_cutoff.is_some() || record.drawn_at.is_some() {
        checks.push(drawn_by_rank(&db, &redis, &keys, &record).await?);
    }
    db.close().await;
    Ok(checks)
}

/// A draw's check: every entry ranked at or below the published cut-off was given a unit
/// (it has an order, in whatever state), and nobody else was.
async fn drawn_by_rank(
    db: &Db,
    redis: &RedisConns,
    keys: &Keys,
    item: &items::Item,
) -> anyhow::Result<Check> {
    let cutoff = item.draw_cutoff.unwrap_or(0);
    let mut ranked: HashSet<u64> = HashSet::new();
    let mut conn = redis.bulk().await.context("connecting to Redis")?;
    for stock in item.bucket_ids() {
        let users: Vec<u64> =
            redis::AsyncCommands::zrangebyscore(&mut conn, keys.entries(stock), "-inf", cutoff)
                .await
                .context("reading the draw's entries")?;
        ranked.extend(users);
    }
    let given: HashSet<u64> = repo::users_with_orders(db, item.id)
        .await
        .context("reading the draw's orders")?
        .into_iter()
        .collect();
    let strays = given.difference(&ranked).count();
    let missed = ranked.difference(&given).count();
    Ok(check(
        6,
        "a draw's units went to its lowest ranks",
        strays == 0 && missed == 0,
        format!(
            "{} entries ranked at or below the cut-off {cutoff}, {} with an order; {strays} orders of others, {missed} of them without one",
            ranked.len(),
            ranked.len() - missed
        ),
    ))
}

/// Polls Redis until no won unit waits for its order row, or the time is up.
async fn drain(
    redis: &RedisConns,
    keys: &Keys,
    stocks: impl Iterator<Item = BucketId> + Clone,
    limit: Duration,
) -> anyhow::Result<InRedis> {
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(100));
    let deadline = Instant::now() + limit;
    let stock = loop {
        let mut conn = redis
            .bulk()
            .await
            .context("connecting to Redis to read the item's stock")?;
        let stock = item_snapshot(&mut conn, keys, stocks.clone())
            .await
            .context("reading the item's stock in Redis")?;
        if stock.pending == 0 || Instant::now() >= deadline {
            break stock;
        }
        bar.set_message(format!(
            "waiting for the order queue to drain: {} orders not yet in MySQL",
            stock.pending
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    bar.finish_and_clear();
    Ok(InRedis {
        remaining: stock.remaining,
        pending: stock.pending,
    })
}

/// Order numbers per `IN (…)` query.
const SNS_PER_QUERY: usize = 1_000;

async fn orders(db: &Db, item: ItemId, run: &Run) -> anyhow::Result<Orders> {
    let record = items::get(db, item)
        .await
        .context("reading the item from MySQL")?
        .with_context(|| format!("item {item} is not in MySQL"))?;
    let total = record.total;
    let counts = repo::count_by_status(db, item)
        .await
        .context("counting the item's orders in MySQL")?;

    let mut held: HashMap<u64, u32> = HashMap::new();
    for order in repo::live_orders(db, item)
        .await
        .context("reading the item's live orders from MySQL")?
    {
        *held.entry(order.user_id).or_default() += 1;
    }
    let over_time = repo::held_over_time(db, item, record.per_user)
        .await
        .context("reading what the item's orders held over time from MySQL")?;
    let doubled = doubled(held, record.per_user, &over_time.over_limit);

    let mut answered_found = HashSet::with_capacity(run.won.len());
    for sns in run.won.chunks(SNS_PER_QUERY) {
        let sns: Vec<&str> = sns.iter().map(String::as_str).collect();
        answered_found.extend(
            repo::existing(db, &sns)
                .await
                .context("looking the answered orders up in MySQL")?,
        );
    }
    let mut cancelled_found = HashSet::new();
    for sns in run.cancelled.chunks(SNS_PER_QUERY) {
        let sns: Vec<&str> = sns.iter().map(String::as_str).collect();
        let rows = repo::find_many(db, &sns)
            .await
            .context("looking the cancelled orders up in MySQL")?;
        cancelled_found.extend(
            rows.into_iter()
                .filter(|row| !row.status.holds_unit())
                .map(|row| row.order_sn.as_str().to_owned()),
        );
    }
    Ok(Orders {
        total: total.into(),
        unpaid: counts.unpaid,
        paid: counts.paid,
        rows: counts.rows(),
        answered_found,
        cancelled_found,
        doubled,
        most_at_once: over_time.most_at_once,
        written_cancelled: over_time.written_cancelled.into_iter().collect(),
    })
}
