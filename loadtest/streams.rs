//! Many buyers waiting on one instance's event streams (`loadtest/queue_crowd.sh` runs
//! it): `--streams` buyers (the first lines of `--tokens`) join the item's line, each
//! opens `GET /api/items/{id}/queue/me/events` and keeps reading it for `--hold-s`
//! seconds. The server's process (`--pid`) is read from `/proc` along the way: its
//! resident memory before the streams and with all of them open, and the CPU it used over
//! the hold. Prints one JSON report on stdout.
//!
//! `cargo run --release --example streams -- --api http://127.0.0.1:18094 --tokens t.txt --item 5 --pid 1234`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;

#[derive(clap::Parser)]
struct Args {
    #[arg(long)]
    api: String,
    /// One buyer's JWT per line.
    #[arg(long)]
    tokens: std::path::PathBuf,
    #[arg(long, default_value_t = 5)]
    item: u64,
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    #[arg(long, default_value_t = 30)]
    hold_s: u64,
    /// The server's process id, read from /proc.
    #[arg(long)]
    pid: u32,
    /// Joins and stream openings in flight at once.
    #[arg(long, default_value_t = 128)]
    in_flight: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let tokens: Vec<String> = std::fs::read_to_string(&args.tokens)?
        .lines()
        .filter(|l| !l.is_empty())
        .take(args.streams)
        .map(str::to_owned)
        .collect();
    anyhow::ensure!(
        tokens.len() == args.streams,
        "{} tokens for {} streams",
        tokens.len(),
        args.streams
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let base = format!("{}/api/items/{}/queue", args.api, args.item);

    let began = Instant::now();
    join_all(&http, &base, &tokens, args.in_flight).await?;
    let join_s = began.elapsed().as_secs_f64();
    eprintln!("{} joined in {join_s:.1} s", tokens.len());

    let rss_before = rss_kb(args.pid)?;
    let began = Instant::now();
    let Streams {
        readers,
        events,
        ended,
    } = open_all(&http, &format!("{base}/me/events"), &tokens, args.in_flight).await?;
    let open_s = began.elapsed().as_secs_f64();
    eprintln!("{} streams open in {open_s:.1} s", readers.len());
    // Settled: every stream has had its first event.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_open = rss_kb(args.pid)?;
    let (ticks_before, events_before) = (cpu_ticks(args.pid)?, events.load(Ordering::Relaxed));
    let held = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.hold_s)).await;
    let hold_s = held.elapsed().as_secs_f64();
    let ticks = cpu_ticks(args.pid)? - ticks_before;
    let pushed = events.load(Ordering::Relaxed) - events_before;
    let still_open = readers.len() as u64 - ended.load(Ordering::Relaxed);
    for reader in readers {
        reader.abort();
    }
    let hz = clock_ticks_per_s()?;
    let report = serde_json::json!({
        "streams": args.streams,
        "streams_open_through_the_hold": still_open,
        "join_s": join_s,
        "open_s": open_s,
        "server_rss_kb_before": rss_before,
        "server_rss_kb_open": rss_open,
        "server_bytes_per_stream": (rss_open.saturating_sub(rss_before) * 1024) as f64 / args.streams as f64,
        "hold_s": hold_s,
        "server_cpu_share_of_a_core_while_held": ticks as f64 / hz / hold_s,
        "events_pushed_while_held": pushed,
        "events_per_s_while_held": pushed as f64 / hold_s,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Every buyer joins the line, `in_flight` at a time; the first refusal ends the run.
async fn join_all(
    http: &reqwest::Client,
    base: &str,
    tokens: &[String],
    in_flight: usize,
) -> anyhow::Result<()> {
    let joined: Vec<anyhow::Result<()>> = futures::stream::iter(tokens)
        .map(|token| async move {
            let response = http.post(base).bearer_auth(token).send().await?;
            let status = response.status();
            anyhow::ensure!(
                status.is_success(),
                "join: {status} {}",
                response.text().await?
            );
            Ok(())
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    joined.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// The open event streams: a reader task each, counting the events read and the streams
/// the server ended.
struct Streams {
    readers: Vec<tokio::task::JoinHandle<()>>,
    events: Arc<AtomicU64>,
    ended: Arc<AtomicU64>,
}

/// Every buyer opens the event stream at `url`, `in_flight` at a time, and keeps reading it.
async fn open_all(
    http: &reqwest::Client,
    url: &str,
    tokens: &[String],
    in_flight: usize,
) -> anyhow::Result<Streams> {
    let opened: Vec<anyhow::Result<reqwest::Response>> = futures::stream::iter(tokens)
        .map(|token| async move {
            let response = http.get(url).bearer_auth(token).send().await?;
            let status = response.status();
            anyhow::ensure!(status.is_success(), "stream: {status}");
            Ok(response)
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let (events, ended) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut readers = Vec::with_capacity(opened.len());
    for response in opened {
        let mut response = response?;
        let (events, ended) = (events.clone(), ended.clone());
        readers.push(tokio::spawn(async move {
            while let Ok(Some(chunk)) = response.chunk().await {
                let blocks = chunk.windows(2).filter(|w| w == b"\n\n").count();
                events.fetch_add(blocks as u64, Ordering::Relaxed);
            }
            ended.fetch_add(1, Ordering::Relaxed);
        }));
    }
    Ok(Streams {
        readers,
        events,
        ended,
    })
}

/// The process's resident memory (`VmRSS`, kB).
fn rss_kb(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS for process {pid}"))
}

/// Clock ticks (user + system) the process has used.
fn cpu_ticks(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: {stat}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(n - 3)
            .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: {stat}"))?
            .parse()?)
    };
    Ok(field(14)? + field(15)?)
}

fn clock_ticks_per_s() -> anyhow::Result<f64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()?;
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}
