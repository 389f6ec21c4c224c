//! What a waiting room costs Redis, on a Redis of its own (`loadtest/queue.sh` starts one):
//!
//! 1. `--buyers` join one item's pre-queue (`lua/queue_join.lua`, pipelined): joins a
//!    second, Redis time per join, and Redis memory per waiting buyer (`used_memory`
//!    before and after, over the buyers);
//! 2. `--reads` reads of a random buyer's place (`lua/queue_where.lua`): Redis time per
//!    read, the line at its full length (a place is a `ZRANK`: O(log n));
//! 3. `--admit-seconds` of admission steps every 200 ms (`lua/queue_step.lua`) at
//!    `--admit-per-s`, with stock enough for everyone: buyers let in a second, and Redis
//!    time per step.
//!
//! Prints one JSON report on stdout.
//!
//! `cargo run --release --example queue -- --redis redis://127.0.0.1:16401`

use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::aio::MultiplexedConnection;

use seckill::domain::{ItemId, UserId};
use seckill::testing::lua::{QUEUE_JOIN, QUEUE_WHERE};
use seckill::testing::{BeforeStock, Keys, QueueKeys, StepRules, queue_step};

#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value = "redis://127.0.0.1:16401")]
    redis: String,
    #[arg(long, default_value_t = 1_000_000)]
    buyers: u64,
    #[arg(long, default_value_t = 100_000)]
    reads: u64,
    #[arg(long, default_value_t = 10_000)]
    admit_per_s: u32,
    #[arg(long, default_value_t = 10)]
    admit_seconds: u64,
    /// Calls in flight at once over the one connection.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
}

/// A fixed seed: the ranks, and so the line, are the same on every run.
const SEED: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const STEP_EVERY: Duration = Duration::from_millis(200);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let mut redis = redis::Client::open(args.redis.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let item = ItemId::new(1).ok_or_else(|| anyhow::anyhow!("item 1"))?;
    let keys = Keys::new("queue_bench").queue(item);
    let now_ms = chrono::Utc::now().timestamp_millis();
    // The pre-queue open, the sale an hour away: every join takes a rank place.
    let (opens_ms, start_ms, end_ms) = (now_ms - 1_000, now_ms + 3_600_000, now_ms + 7_200_000);

    let memory_before = used_memory(&mut redis).await?;
    reset_stats(&mut redis).await?;
    let began = Instant::now();
    join_all(&redis, &keys, &args, (opens_ms, start_ms, end_ms)).await?;
    let join_seconds = began.elapsed().as_secs_f64();
    let join_usec = script_usec_per_call(&mut redis).await?;
    let memory_after = used_memory(&mut redis).await?;

    reset_stats(&mut redis).await?;
    let began = Instant::now();
    read_places(&redis, &keys, &args).await?;
    let read_seconds = began.elapsed().as_secs_f64();
    let read_usec = script_usec_per_call(&mut redis).await?;

    reset_stats(&mut redis).await?;
    let (admitted, admit_seconds, steps) = admit(&mut redis, &keys, &args).await?;
    let step_usec = script_usec_per_call(&mut redis).await?;

    #[allow(clippy::cast_precision_loss)]
    let per = |a: f64, b: u64| a / b as f64;
    let report = serde_json::json!({
        "buyers": args.buyers,
        "joins_per_s": per(args.buyers as f64, 1) / join_seconds,
        "join_redis_usec": join_usec,
        "redis_bytes_per_waiting_buyer": per(memory_after.saturating_sub(memory_before) as f64, args.buyers),
        "reads": args.reads,
        "reads_per_s": args.reads as f64 / read_seconds,
        "read_redis_usec": read_usec,
        "admit_per_s_set": args.admit_per_s,
        "admitted": admitted,
        "admitted_per_s": admitted as f64 / admit_seconds,
        "steps": steps,
        "step_redis_usec": step_usec,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// `--buyers` buyers join the line by the queue's script, `--in-flight` at a time, each
/// taking a rank place: the pre-queue open, the sale ahead (its open, start and end in ms).
async fn join_all(
    redis: &MultiplexedConnection,
    keys: &QueueKeys,
    args: &Args,
    (opens_ms, start_ms, end_ms): (i64, i64, i64),
) -> anyhow::Result<()> {
    let joins: Vec<anyhow::Result<()>> = futures::stream::iter(1..=args.buyers)
        .map(|user| {
            let (mut redis, keys) = (redis.clone(), keys.clone());
            async move {
                let rank = seckill::testing::draw::rank(SEED, UserId::new(user))?;
                let place: Vec<i64> = QUEUE_JOIN
                    .key(&keys.line)
                    .key(&keys.state)
                    .key(&keys.passes)
                    .key(&keys.used)
                    .arg(user)
                    .arg(rank)
                    .arg(start_ms)
                    .arg(opens_ms)
                    .arg(end_ms)
                    .invoke_async(&mut redis)
                    .await?;
                anyhow::ensure!(place.first() == Some(&2), "join {user}: {place:?}");
                Ok(())
            }
        })
        .buffer_unordered(args.in_flight)
        .collect()
        .await;
    joins.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// `--reads` reads of a buyer's place, spread over the whole line.
async fn read_places(
    redis: &MultiplexedConnection,
    keys: &QueueKeys,
    args: &Args,
) -> anyhow::Result<()> {
    let reads: Vec<anyhow::Result<()>> = futures::stream::iter(0..args.reads)
        .map(|i| {
            let (mut redis, keys) = (redis.clone(), keys.clone());
            // Spread over the whole line (a multiplicative hash of i).
            let user = 1 + (i.wrapping_mul(2_654_435_761) % args.buyers);
            async move {
                let place: Vec<i64> = QUEUE_WHERE
                    .key(&keys.line)
                    .key(&keys.state)
                    .key(&keys.passes)
                    .key(&keys.used)
                    .arg(user)
                    .invoke_async(&mut redis)
                    .await?;
                anyhow::ensure!(place.first() == Some(&1), "read {user}: {place:?}");
                Ok(())
            }
        })
        .buffer_unordered(args.in_flight)
        .collect()
        .await;
    reads.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// Steps every [`STEP_EVERY`] for `--admit-seconds`, the sale started and stock for all:
/// how many were let in, over how long, in how many steps.
async fn admit(
    redis: &mut MultiplexedConnection,
    keys: &QueueKeys,
    args: &Args,
) -> anyhow::Result<(u64, f64, u64)> {
    let now_ms = chrono::Utc::now().timestamp_millis();
    let mut tick = tokio::time::interval(STEP_EVERY);
    let began = Instant::now();
    let (mut admitted, mut steps) = (0u64, 0u64);
    while began.elapsed() < Duration::from_secs(args.admit_seconds) {
        tick.tick().await;
        let rules = StepRules {
            start_ms: now_ms - 1_000,
            end_ms: now_ms + 3_600_000,
            admit_per_s: args.admit_per_s,
            pass_ttl_ms: 300_000,
            per_user: 1,
            held: false,
        };
        // Stock for everyone; no win counted, no warm-up holding the line.
        let before = BeforeStock {
            sold: 0,
            reloads: 0,
        };
        let stepped = queue_step(redis, keys, rules, args.buyers, before)
            .await?
            .ok_or_else(|| anyhow::anyhow!("the step found nobody in line"))?;
        // As the scheduler does once the replicas hold the step (none here).
        let _: i64 = redis::cmd("HSET")
            .arg(&keys.state)
            .arg("shown")
            .arg(stepped.cursor)
            .query_async(redis)
            .await?;
        admitted += stepped.admitted;
        steps += 1;
    }
    Ok((admitted, began.elapsed().as_secs_f64(), steps))
}

async fn used_memory(redis: &mut MultiplexedConnection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(redis).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no used_memory in INFO memory"))
}

async fn reset_stats(redis: &mut MultiplexedConnection) -> anyhow::Result<()> {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(redis)
        .await?;
    Ok(())
}

/// `usec_per_call` of `evalsha` in `INFO commandstats` since the last reset.
async fn script_usec_per_call(redis: &mut MultiplexedConnection) -> anyhow::Result<f64> {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await?;
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|fields| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("usec_per_call="))
                .and_then(|v| v.parse().ok())
        })
        .ok_or_else(|| anyhow::anyhow!("no evalsha in INFO commandstats:\n{stats}"))
}
