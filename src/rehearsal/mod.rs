//! `seckill rehearse`: rehearses a sale against a running server and proves its outcome.
//!
//! It sets up (or reuses) an item through the admin API, fires a crowd of users at
//! `POST /api/flashbuy`, reports answers and latency, and then — once the order queue has
//! drained — checks the invariants of docs/contract.md section 7 against Redis and MySQL itself.
//! The same report goes to `report.json` and `report.svg` for a go/no-go review.

mod chart;
mod fire;
mod invariants;
mod report;
mod setup;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use url::Url;

use crate::auth::Jwt;
use crate::config::Settings;
use crate::domain::{ItemId, UserId};

pub use report::Report;

/// How the crowd behaves. Every default is the standard rehearsal of docs/rehearsal.md.
#[derive(clap::Args, Debug, Clone)]
pub struct RehearsalArgs {
    /// Base URL the purchases go to: the server, or nginx in front of it.
    /// [default: http://SECKILL_HTTP_ADDR]
    #[arg(long)]
    pub target: Option<Url>,
    /// Base URL of the admin API (set-up and stats). [default: the target]
    #[arg(long)]
    pub admin_url: Option<Url>,
    /// The item to sell. Without it each run sets up a new item (its id taken from the clock).
    #[arg(long)]
    pub item: Option<ItemId>,
    /// Set the item up with this many units (PUT, then a forced warm-up). Given --item
    /// without --units, the item must already exist and be loaded. [default for a new item: 1000]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub units: Option<u32>,
    /// Spread the units over this many Redis buckets (a hot item; see docs/architecture.md, "A hot
    /// item over many buckets"), when --units sets the item up.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub buckets: u8,
    /// Live orders one user may hold (`per_user`, 1–100), when --units sets the item up:
    /// users pressing more than once then buy more than once, up to it.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub per_user: u8,
    /// Waves, when --units sets the item up: `+SECONDS:UNITS` after the start, comma
    /// separated (`+10:300,+20:300`); the rest of the units are on sale from the start.
    /// Presses between waves answer `409 between_releases`.
    #[arg(long, value_parser = parse_waves)]
    pub release: Option<Waves>,
    /// A draw, when --units sets the item up: presses are entries until this many seconds
    /// after the start, then the units go to the entries of lowest rank; the rehearsal waits
    /// for the draw and checks that they did.
    #[arg(long, value_name = "SECONDS", conflicts_with_all = ["release", "per_user"])]
    pub draw: Option<u32>,
    /// The shop a new item belongs to (a shop not seen before is created, open).
    #[arg(long, default_value_t = 1)]
    pub shop: u64,
    /// How many distinct users press (ids first-user .. first-user + users - 1).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub users: u64,
    /// The first user id.
    #[arg(long, default_value_t = 1)]
    pub first_user: u64,
    /// How many presses in all; press i is user i mod users, so each user presses
    /// requests / users times, spread over the run. 0 only checks the invariants of an
    /// existing item (after a k6 or JMeter run, say).
    #[arg(long, default_value_t = 20_000)]
    pub requests: u64,
    /// Connections (requests in flight at once).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Press at this fixed rate (per second) instead of as fast as the connections allow;
    /// latency then counts from when a press was due, so a slow server cannot hide its queue.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: Option<u32>,
    /// How many times a press is retried after 429, 502–504 or a failed connection (after
    /// Retry-After, at most 1 s).
    #[arg(long, default_value_t = 0)]
    pub retries: u32,
    /// When everyone presses: an RFC 3339 instant, or +N (seconds from now). A new item's
    /// sale starts then too. [default: now]
    #[arg(long, value_parser = parse_start_at)]
    pub start_at: Option<DateTime<Utc>>,
    /// Percentage of winners who cancel at once, so that their units sell again (exercises
    /// invariant 5).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub cancel_percent: u8,
    /// Folder for report.json and report.svg (created if missing).
    #[arg(long, default_value = "bench-report")]
    pub out: PathBuf,
    /// How long to wait for the order queue to drain before checking the invariants.
    #[arg(long, default_value_t = 120)]
    pub drain_timeout_s: u64,
}

/// Waves as --release gives them: seconds after the start and units.
#[derive(Clone, Debug)]
pub struct Waves(pub Vec<(u32, u32)>);

fn parse_waves(s: &str) -> Result<Waves, String> {
    s.split(',')
        .map(|wave| {
            let (at, units) = wave
                .trim()
                .strip_prefix('+')
                .and_then(|w| w.split_once(':'))
                .ok_or_else(|| format!("{wave:?}: a wave is +SECONDS:UNITS"))?;
            let at = at
                .trim_end_matches('s')
                .parse()
                .map_err(|_| format!("{wave:?}: seconds are a whole number"))?;
            let units = units
                .parse()
                .map_err(|_| format!("{wave:?}: units are a whole number"))?;
            Ok((at, units))
        })
        .collect::<Result<_, _>>()
        .map(Waves)
}

fn parse_start_at(s: &str) -> Result<DateTime<Utc>, String> {
    if let Some(seconds) = s.strip_prefix('+') {
        let seconds: u64 = seconds
            .trim_end_matches('s')
            .parse()
            .map_err(|_| format!("{s:?}: +N means N seconds from now"))?;
        let seconds = i64::try_from(seconds).map_err(|_| format!("{s:?}: too far away"))?;
        return Ok(Utc::now() + chrono::Duration::seconds(seconds));
    }
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{s:?} is neither +N nor an RFC 3339 instant: {e}"))
}

/// Runs the rehearsal; `Ok(true)` when every invariant held.
pub async fn run(args: RehearsalArgs, settings: Settings) -> anyhow::Result<bool> {
    let target = match &args.target {
        Some(url) => url.clone(),
        None => Url::parse(&format!("http://{}", settings.http_addr))
            .context("SECKILL_HTTP_ADDR as a URL")?,
    };
    let admin_url = args.admin_url.clone().unwrap_or_else(|| target.clone());
    for url in [&target, &admin_url] {
        // Built without TLS: a rehearsal runs next to the servers or their nginx.
        anyhow::ensure!(
            url.scheme() == "http",
            "{url}: the rehearsal speaks plain http; aim it at the servers or nginx from inside"
        );
    }
    let admin = setup::Admin::new(admin_url, settings.admin_token.as_ref())?;

    let start_at = args.start_at.unwrap_or_else(Utc::now);
    let item = setup::prepare(&admin, &args, start_at).await?;
    eprintln!(
        "item {} ({:?}): {} units, {} loaded in Redis",
        item.id, item.name, item.total, item.remaining
    );

    let jwt = Jwt::new(&settings.jwt_secret);
    let ttl = Duration::from_secs(3600) + (start_at - Utc::now()).to_std().unwrap_or_default();
    let tokens = (0..args.users)
        .map(|i| jwt.mint(UserId::new(args.first_user.saturating_add(i)), ttl))
        .collect::<Result<Vec<_>, _>>()
        .context("minting user tokens")?;

    let crowd = fire::Crowd {
        target: target.clone(),
        item: item.id,
        tokens,
        requests: args.requests,
        concurrency: args.concurrency,
        rate: args.rate,
        retries: args.retries,
        cancel_percent: args.cancel_percent,
        start_at,
    };
    let run = crowd.fire().await?;
    if args.draw.is_some() {
        setup::wait_for_draw(&admin, item.id, Duration::from_secs(args.drain_timeout_s)).await?;
    }

    let checks = invariants::check_all(
        &settings,
        item.id,
        &run,
        Duration::from_secs(args.drain_timeout_s),
    )
    .await?;

    let report = Report::new(&args, &target, &item, &run, checks);
    report.print();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let json = args.out.join("report.json");
    std::fs::write(&json, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    let svg = args.out.join("report.svg");
    chart::draw(&svg, &report, &run).with_context(|| format!("drawing {}", svg.display()))?;
    eprintln!("report: {} and {}", json.display(), svg.display());
    Ok(report.passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_at_is_relative_or_rfc3339() {
        for relative in ["+5", "+5s"] {
            let delta = (parse_start_at(relative).unwrap() - Utc::now()).num_milliseconds();
            assert!((4_000..=5_000).contains(&delta), "{relative}: {delta}");
        }
        assert_eq!(
            parse_start_at("2026-12-12T10:00:00+08:00").unwrap(),
            "2026-12-12T02:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        for bad in ["+", "+x", "10:00", "tomorrow"] {
            assert!(parse_start_at(bad).is_err(), "{bad}");
        }
    }
}
