//! The crowd: presses the buy button, as fast as its connections allow or at a fixed rate,
//! and records every answer and its latency.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use tokio::sync::Semaphore;
use url::Url;

use crate::domain::ItemId;

/// Latencies are recorded in microseconds, from 1 µs to a minute, to 3 significant digits.
const HIGHEST_US: u64 = 60_000_000;
/// How long one request may take before it counts as a `timeout`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The width of one slice of the latency timeline.
pub const SLICE: Duration = Duration::from_millis(100);
/// The longest wait before a retry, whatever `Retry-After` says.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(1);

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("constant bounds hdrhistogram accepts")
}

/// Who presses, how often and when.
pub struct Crowd {
    pub target: Url,
    pub item: ItemId,
    /// One token per user; press `i` is user `i % tokens.len()`.
    pub tokens: Vec<String>,
    pub requests: u64,
    pub concurrency: u64,
    pub rate: Option<u32>,
    pub retries: u32,
    pub cancel_percent: u8,
    pub start_at: DateTime<Utc>,
}

/// Everything the crowd saw.
pub struct Run {
    pub started: DateTime<Utc>,
    pub elapsed: Duration,
    pub presses: u64,
    /// Requests sent, retries included.
    pub attempts: u64,
    pub retries: u64,
    /// Answers by HTTP status and `code` (status 0: no HTTP answer at all).
    pub answers: BTreeMap<(u16, String), u64>,
    pub latency: Histogram<u64>,
    /// Latency of the answers that arrived in each [`SLICE`] of the run.
    pub timeline: Vec<Histogram<u64>>,
    /// The order numbers of every `202 queued`, in the order they arrived.
    pub won: Vec<String>,
    /// Orders this run cancelled (`--cancel-percent`).
    pub cancelled: Vec<String>,
    /// Cancellations that did not answer 200, by status and code.
    pub cancel_failures: BTreeMap<(u16, String), u64>,
}

struct Shared {
    http: reqwest::Client,
    buy: Url,
    target: Url,
    body: String,
    tokens: Vec<String>,
    retries: u32,
    cancel_percent: u8,
    t0: Instant,
    pressed: AtomicU64,
    wins: AtomicU64,
    attempts: AtomicU64,
    tally: Mutex<Tally>,
}

struct Tally {
    answers: BTreeMap<(u16, String), u64>,
    latency: Histogram<u64>,
    timeline: Vec<Histogram<u64>>,
    won: Vec<String>,
    cancelled: Vec<String>,
    cancel_failures: BTreeMap<(u16, String), u64>,
    retries: u64,
}

/// One HTTP answer, as far as the rehearsal cares.
struct Answer {
    status: u16,
    code: String,
    order_sn: Option<String>,
    retry_after: Option<Duration>,
}

impl Answer {
    fn retryable(&self) -> bool {
        matches!(self.status, 0 | 429 | 502 | 503 | 504)
    }
}

#[derive(Deserialize)]
struct Body {
    code: Option<String>,
    order_sn: Option<String>,
}

impl Crowd {
    pub async fn fire(self) -> anyhow::Result<Run> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(usize::try_from(self.concurrency).unwrap_or(usize::MAX))
            .tcp_nodelay(true)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .context("building the HTTP client")?;
        let buy = self
            .target
            .join("/api/flashbuy")
            .context("the purchase URL")?;
        wait_for_start(self.start_at).await;

        let shared = Arc::new(Shared {
            http,
            buy,
            target: self.target.clone(),
            body: format!(r#"{{"item_id":{}}}"#, self.item),
            tokens: self.tokens,
            retries: self.retries,
            cancel_percent: self.cancel_percent,
            t0: Instant::now(),
            pressed: AtomicU64::new(0),
            wins: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            tally: Mutex::new(Tally {
                answers: BTreeMap::new(),
                latency: histogram(),
                timeline: Vec::new(),
                won: Vec::new(),
                cancelled: Vec::new(),
                cancel_failures: BTreeMap::new(),
                retries: 0,
            }),
        });
        let started = Utc::now();
        let bar = progress_bar(self.requests)?;
        let ticker = tokio::spawn(tick(shared.clone(), bar.clone()));

        match self.rate {
            None => closed(&shared, self.requests, self.concurrency).await,
            Some(rate) => open(&shared, self.requests, self.concurrency, rate).await,
        }
        ticker.abort();
        // Wait until the aborted ticker has let go of `shared`.
        let _ = ticker.await;
        let elapsed = shared.t0.elapsed();
        bar.set_position(shared.pressed.load(Ordering::Relaxed));
        bar.finish_and_clear();

        let shared = Arc::into_inner(shared).context("a press outlived the run")?;
        let attempts = shared.attempts.load(Ordering::Relaxed);
        let tally = shared
            .tally
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(Run {
            started,
            elapsed,
            presses: self.requests,
            attempts,
            retries: tally.retries,
            answers: tally.answers,
            latency: tally.latency,
            timeline: tally.timeline,
            won: tally.won,
            cancelled: tally.cancelled,
            cancel_failures: tally.cancel_failures,
        })
    }
}

/// Closed model: `concurrency` users press one after the other, each waiting for its answer.
async fn closed(shared: &Arc<Shared>, requests: u64, concurrency: u64) {
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..concurrency.min(requests))
        .map(|_| {
            let shared = shared.clone();
            let next = next.clone();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= requests {
                        break;
                    }
                    press(&shared, i, Instant::now()).await;
                }
            })
        })
        .collect();
    for worker in workers {
        // A press never panics; a join error could only be a panic worth seeing.
        if let Err(e) = worker.await {
            tracing::error!(error = %e, "a rehearsal worker failed");
        }
    }
}

/// Open model: presses are due at a fixed rate whether or not earlier ones were answered;
/// at most `concurrency` are in flight, and a press's latency counts from when it was due.
async fn open(shared: &Arc<Shared>, requests: u64, concurrency: u64, rate: u32) {
    let slots = Arc::new(Semaphore::new(
        usize::try_from(concurrency).unwrap_or(usize::MAX),
    ));
    let interval = Duration::from_secs(1) / rate;
    let mut presses = Vec::new();
    for i in 0..requests {
        let due = shared.t0 + interval * u32::try_from(i).unwrap_or(u32::MAX);
        tokio::time::sleep_until(due.into()).await;
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let shared = shared.clone();
        presses.push(tokio::spawn(async move {
            press(&shared, i, due).await;
            drop(slot);
        }));
    }
    for press in presses {
        if let Err(e) = press.await {
            tracing::error!(error = %e, "a rehearsal press failed");
        }
    }
}

/// One user pressing buy (and again after a retryable answer, `--retries` times).
async fn press(shared: &Shared, i: u64, due: Instant) {
    let user = usize::try_from(i % shared.tokens.len() as u64).unwrap_or_default();
    let token = &shared.tokens[user];
    let mut since = due;
    for attempt in 0..=shared.retries {
        shared.attempts.fetch_add(1, Ordering::Relaxed);
        let answer = buy(shared, token).await;
        let latency = since.elapsed();
        shared.record(&answer, latency, attempt > 0);
        if answer.status == 202
            && let Some(sn) = &answer.order_sn
        {
            let win = shared.wins.fetch_add(1, Ordering::Relaxed);
            if win % 100 < u64::from(shared.cancel_percent) {
                cancel(shared, token, sn).await;
            }
        }
        if !answer.retryable() || attempt == shared.retries {
            break;
        }
        let wait = answer
            .retry_after
            .unwrap_or(Duration::from_millis(200))
            .min(MAX_RETRY_WAIT);
        tokio::time::sleep(wait).await;
        since = Instant::now();
    }
    shared.pressed.fetch_add(1, Ordering::Relaxed);
}

async fn buy(shared: &Shared, token: &str) -> Answer {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let sent = shared
        .http
        .post(shared.buy.clone())
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("x-client-time", now_ms.to_string())
        .body(shared.body.clone())
        .send()
        .await;
    read(sent).await
}

async fn cancel(shared: &Shared, token: &str, order_sn: &str) {
    let answer = match shared
        .target
        .join(&format!("/api/orders/{order_sn}/cancel"))
    {
        Ok(url) => read(shared.http.post(url).bearer_auth(token).send().await).await,
        Err(e) => Answer {
            status: 0,
            code: format!("bad_url: {e}"),
            order_sn: None,
            retry_after: None,
        },
    };
    let mut tally = shared.tally();
    if answer.status == 200 {
        tally.cancelled.push(order_sn.to_owned());
    } else {
        *tally
            .cancel_failures
            .entry((answer.status, answer.code))
            .or_default() += 1;
    }
}

async fn read(sent: reqwest::Result<reqwest::Response>) -> Answer {
    let response = match sent {
        Ok(response) => response,
        Err(e) => {
            let code = if e.is_timeout() {
                "timeout"
            } else {
                "connection_failed"
            };
            return Answer {
                status: 0,
                code: code.to_owned(),
                order_sn: None,
                retry_after: None,
            };
        }
    };
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .map(Duration::from_secs);
    let body = response.bytes().await.unwrap_or_default();
    let (code, order_sn) = match serde_json::from_slice::<Body>(&body) {
        Ok(Body { code, order_sn }) => (code.unwrap_or_else(|| "(no code)".to_owned()), order_sn),
        Err(_) => ("(not json)".to_owned(), None),
    };
    Answer {
        status,
        code,
        order_sn,
        retry_after,
    }
}

impl Shared {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, answer: &Answer, latency: Duration, retry: bool) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let slice = usize::try_from(self.t0.elapsed().as_millis() / SLICE.as_millis())
            .unwrap_or(usize::MAX);
        let mut tally = self.tally();
        *tally
            .answers
            .entry((answer.status, answer.code.clone()))
            .or_default() += 1;
        tally.latency.saturating_record(us);
        if tally.timeline.len() <= slice {
            tally.timeline.resize_with(slice + 1, histogram);
        }
        tally.timeline[slice].saturating_record(us);
        if retry {
            tally.retries += 1;
        }
        if answer.status == 202
            && let Some(sn) = &answer.order_sn
        {
            tally.won.push(sn.clone());
        }
    }
}

/// Waits for the start instant, counting down on the terminal.
async fn wait_for_start(start_at: DateTime<Utc>) {
    let Ok(wait) = (start_at - Utc::now()).to_std() else {
        return;
    };
    let bar = ProgressBar::new_spinner();
    bar.set_message(format!(
        "everyone presses at {}",
        start_at.format("%H:%M:%S%.3f UTC")
    ));
    bar.enable_steady_tick(Duration::from_millis(100));
    tokio::time::sleep(wait).await;
    bar.finish_and_clear();
}

fn progress_bar(presses: u64) -> anyhow::Result<ProgressBar> {
    let bar = ProgressBar::new(presses).with_style(
        ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{bar:40}] {pos}/{len} presses · {msg}",
        )
        .context("progress bar template")?
        .progress_chars("=> "),
    );
    Ok(bar)
}

/// Keeps the progress bar's position and message fresh while the crowd presses.
async fn tick(shared: Arc<Shared>, bar: ProgressBar) {
    let mut every = tokio::time::interval(Duration::from_millis(250));
    loop {
        every.tick().await;
        let seconds = shared.t0.elapsed().as_secs_f64().max(0.001);
        let attempts = shared.attempts.load(Ordering::Relaxed);
        bar.set_position(shared.pressed.load(Ordering::Relaxed));
        bar.set_message(format!(
            "{:.0} requests/s · {} won",
            attempts as f64 / seconds,
            shared.wins.load(Ordering::Relaxed)
        ));
    }
}
