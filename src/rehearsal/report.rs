//! The rehearsal's report: printed for people, written as JSON for the go/no-go review.

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use serde::Serialize;

use super::RehearsalArgs;
use super::fire::{Run, SLICE};
use super::setup::ItemInfo;
use crate::invariants::{Check, Outcome};

#[derive(Debug, Serialize)]
pub struct Report {
    /// Where the purchases went (the server, or nginx).
    pub target: String,
    pub item_id: u64,
    pub units: u64,
    pub users: u64,
    pub presses: u64,
    pub concurrency: u64,
    pub rate: Option<u32>,
    /// Retries allowed per press (`--retries`) and the share of winners who cancelled.
    pub max_retries: u32,
    pub cancel_percent: u8,
    pub started_at: DateTime<Utc>,
    pub duration_s: f64,
    /// Requests sent, retries included.
    pub requests: u64,
    pub retries: u64,
    pub requests_per_s: f64,
    pub won: u64,
    pub cancelled: u64,
    pub answers: Vec<Count>,
    pub cancel_failures: Vec<Count>,
    pub latency_ms: Latency,
    /// One entry per 100 ms of the run.
    pub timeline: Vec<Slice>,
    pub invariants: Vec<Check>,
    /// Every invariant held (none broken).
    pub passed: bool,
}

#[derive(Debug, Serialize)]
pub struct Count {
    pub status: u16,
    pub code: String,
    pub count: u64,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
    pub mean: f64,
}

#[derive(Debug, Serialize)]
pub struct Slice {
    /// Seconds since the first press at the slice's start.
    pub at_s: f64,
    pub answers: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Self {
        Self {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p99_9: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

fn counts(map: &std::collections::BTreeMap<(u16, String), u64>) -> Vec<Count> {
    map.iter()
        .map(|((status, code), count)| Count {
            status: *status,
            code: code.clone(),
            count: *count,
        })
        .collect()
}

impl Report {
    pub fn new(
        args: &RehearsalArgs,
        target: &url::Url,
        item: &ItemInfo,
        run: &Run,
        invariants: Vec<Check>,
    ) -> Self {
        let seconds = run.elapsed.as_secs_f64().max(f64::EPSILON);
        let timeline = run
            .timeline
            .iter()
            .enumerate()
            .map(|(i, h)| Slice {
                at_s: (SLICE * u32::try_from(i).unwrap_or(u32::MAX)).as_secs_f64(),
                answers: h.len(),
                p50_ms: ms(h.value_at_quantile(0.5)),
                p99_ms: ms(h.value_at_quantile(0.99)),
                max_ms: ms(h.max()),
            })
            .collect();
        Self {
            target: target.to_string(),
            item_id: item.id.get(),
            units: item.total,
            users: args.users,
            presses: run.presses,
            concurrency: args.concurrency,
            rate: args.rate,
            max_retries: args.retries,
            cancel_percent: args.cancel_percent,
            started_at: run.started,
            duration_s: seconds,
            requests: run.attempts,
            retries: run.retries,
            requests_per_s: run.attempts as f64 / seconds,
            won: run.won.len() as u64,
            cancelled: run.cancelled.len() as u64,
            answers: counts(&run.answers),
            cancel_failures: counts(&run.cancel_failures),
            latency_ms: Latency::of(&run.latency),
            timeline,
            passed: invariants.iter().all(|c| c.outcome != Outcome::Broken),
            invariants,
        }
    }

    /// The report on stdout, for a person.
    pub fn print(&self) {
        println!(
            "{} · item {} · {} units · {} users · {} presses at {}",
            self.target,
            self.item_id,
            self.units,
            self.users,
            self.presses,
            match self.rate {
                Some(rate) => format!("{rate}/s (at most {} in flight)", self.concurrency),
                None => format!("{} connections", self.concurrency),
            }
        );
        println!();
        println!("answers");
        for count in &self.answers {
            let status = match count.status {
                0 => "---".to_owned(),
                s => s.to_string(),
            };
            println!("  {status} {:<22} {:>9}", count.code, count.count);
        }
        if !self.cancel_failures.is_empty() {
            println!("cancellations that failed");
            for count in &self.cancel_failures {
                println!("  {} {:<22} {:>9}", count.status, count.code, count.count);
            }
        }
        println!();
        println!(
            "{} requests ({} retries) in {:.2} s = {:.0} requests/s · {} won · {} cancelled",
            self.requests,
            self.retries,
            self.duration_s,
            self.requests_per_s,
            self.won,
            self.cancelled
        );
        let l = &self.latency_ms;
        println!(
            "latency ms  p50 {:.2} · p90 {:.2} · p99 {:.2} · p99.9 {:.2} · max {:.2}",
            l.p50, l.p90, l.p99, l.p99_9, l.max
        );
        println!();
        println!("invariants (docs/contract.md §7, read from Redis and MySQL)");
        for check in &self.invariants {
            let mark = match check.outcome {
                Outcome::Held => "✔",
                Outcome::Broken => "✘",
                Outcome::NotExercised => "–",
            };
            println!(
                "  {mark} {}. {}: {}",
                check.number, check.name, check.detail
            );
        }
        println!();
        println!(
            "{}",
            if self.passed {
                "GO: every invariant held"
            } else {
                "NO GO: an invariant is broken"
            }
        );
    }
}
