//! What one purchase costs Redis, in Redis's own accounting: `usec_per_call` of `EVALSHA`
//! in `INFO commandstats` (the time Redis spent running the script, every command inside
//! it included) over a run of one outcome only — a win, a duplicate, a sold-out answer —
//! and the minimal pop-and-record script beside them. Run by `loadtest/redis_cost.sh`
//! against a Redis of its own: the statistics are reset per phase, and nothing else may
//! call scripts meanwhile.
//!
//! While it runs, the outbox and the pending orders are emptied every 5 ms, as the
//! publisher's confirms and the consumer's writes keep them in a running server (left to
//! grow to every order, each insert costs more than it ever does there).
//!
//! `cargo run --release --example redis_cost -- --redis redis://127.0.0.1:16400 --calls 50000`

use futures::StreamExt;
use redis::aio::MultiplexedConnection;

use seckill::domain::{BucketId, ItemId, UserId};
use seckill::testing::Keys;
use seckill::testing::grab;

#[path = "fixture.rs"]
mod fixture;

#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value = "redis://127.0.0.1:16400")]
    redis: String,
    /// Calls per phase (and the units each item gets).
    #[arg(long, default_value_t = 50_000)]
    calls: u64,
    /// Calls in flight at once over the one connection (pipelined, as a busy server's are).
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let mut redis = redis::Client::open(args.redis.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let namespace = Keys::new("redis_cost");
    let item = ItemId::new(1).ok_or_else(|| anyhow::anyhow!("item 1"))?;
    let keys = namespace.bucket(BucketId::whole(item));
    fixture::load(&mut redis, &keys, args.calls).await?;
    seckill::testing::lua::preload(&mut redis).await?;

    let n = args.calls;
    let clearer = tokio::spawn(keep_emptied(
        redis.clone(),
        [keys.outbox.clone(), keys.pending.clone()],
    ));
    let mut rows = Vec::new();
    // Users 1..=n win every unit, press again (duplicates), then n more find none left.
    for (phase, first, expected) in [
        ("grab.lua, a win", 1, "won"),
        ("grab.lua, a duplicate", 1, "duplicate"),
        ("grab.lua, sold out", n + 1, "sold_out"),
    ] {
        let cost = measured(
            &mut redis,
            n,
            args.in_flight,
            |mut conn, i| {
                let keys = &keys;
                async move {
                    let user = UserId::new(first + i);
                    let (sn, order) = fixture::order(item, user);
                    let (outcome, _) =
                        grab(&mut conn, keys, (user, 1), &sn, &order, None, false).await?;
                    Ok(outcome.as_str().to_owned())
                }
            },
            expected,
        )
        .await?;
        rows.push((phase, cost));
    }
    fixture::load(&mut redis, &keys, n).await?;
    let cost = measured(
        &mut redis,
        n,
        args.in_flight,
        |mut conn, i| {
            let keys = &keys;
            async move {
                let now = chrono::Utc::now().timestamp_millis();
                Ok(fixture::minimal(&mut conn, keys, UserId::new(1 + i), now).await?)
            }
        },
        "won",
    )
    .await?;
    rows.push(("minimal script, a win", cost));
    clearer.abort();
    fixture::clear(&mut redis, &keys).await?;

    println!(
        "\nRedis time per call (INFO commandstats usec_per_call, {n} calls each, {} in flight)\n",
        args.in_flight
    );
    println!("| script | µs of Redis per call |");
    println!("|---|---|");
    for (phase, usec) in rows {
        println!("| {phase} | {usec:.2} |");
    }
    Ok(())
}

/// Empties `keys` every 5 ms (their deletions are not script calls, so not counted).
async fn keep_emptied(mut redis: MultiplexedConnection, keys: [String; 2]) {
    loop {
        if let Err(e) = redis::cmd("DEL")
            .arg(&keys)
            .query_async::<()>(&mut redis)
            .await
        {
            eprintln!("emptying the outbox and pending orders: {e}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Runs `call(conn, i)` for i in 0..n, `in_flight` at a time, checks every answer is
/// `expected`, and returns Redis's µs per script call over the run.
async fn measured<F, Fut>(
    redis: &mut MultiplexedConnection,
    n: u64,
    in_flight: usize,
    call: F,
    expected: &str,
) -> anyhow::Result<f64>
where
    F: Fn(MultiplexedConnection, u64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(redis)
        .await?;
    let answers: Vec<anyhow::Result<String>> = futures::stream::iter(0..n)
        .map(|i| call(redis.clone(), i))
        .buffer_unordered(in_flight)
        .collect()
        .await;
    for answer in answers {
        let answer = answer?;
        anyhow::ensure!(
            answer == expected,
            "expected {expected}, Redis answered {answer}"
        );
    }
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await?;
    script_usec_per_call(&stats)
        .ok_or_else(|| anyhow::anyhow!("no script calls in INFO commandstats:\n{stats}"))
}

/// `usec_per_call` of the script commands (`evalsha`, `fcall`) in `INFO commandstats`.
fn script_usec_per_call(stats: &str) -> Option<f64> {
    let (mut usec, mut calls) = (0.0, 0.0);
    for line in stats.lines() {
        let Some((name, fields)) = line.split_once(':') else {
            continue;
        };
        if !matches!(name, "cmdstat_evalsha" | "cmdstat_fcall") {
            continue;
        }
        for field in fields.split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => calls += v.parse::<f64>().ok()?,
                Some(("usec", v)) => usec += v.parse::<f64>().ok()?,
                _ => {}
            }
        }
    }
    (calls > 0.0).then(|| usec / calls)
}
