//! The item a rehearsal sells: set up through the admin API, or an existing one.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use indicatif::ProgressBar;
use reqwest::Method;
use serde_json::{Value, json};
use url::Url;

use crate::config::Secret;
use crate::domain::ItemId;

use super::RehearsalArgs;

/// Units of a new item when `--units` is not given.
const DEFAULT_UNITS: u32 = 1000;

/// The admin API of the server under test.
pub struct Admin {
    http: reqwest::Client,
    base: Url,
    token: String,
}

impl Admin {
    pub fn new(base: Url, token: Option<&Secret>) -> anyhow::Result<Self> {
        let token = token
            .context(
                "SECKILL_ADMIN_TOKEN is not set: the rehearsal sets up the item and reads its \
                 stats through the admin API",
            )?
            .expose()
            .to_owned();
        // A warm-up may take up to the server's two-minute operator budget.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(130))
            .build()
            .context("building the admin HTTP client")?;
        Ok(Self { http, base, token })
    }

    /// Calls the admin API; a non-2xx answer is an error naming the call and the answer.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let url = self
            .base
            .join(path)
            .with_context(|| format!("URL for {path}"))?;
        let mut request = self
            .http
            .request(method.clone(), url.clone())
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {url}: is the server running there?"))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("{method} {url} answered {status}: {body}");
        }
        Ok(body)
    }
}

/// The item as the rehearsal sees it before the first press.
#[derive(Debug, Clone)]
pub struct ItemInfo {
    pub id: ItemId,
    pub name: String,
    pub total: u64,
    pub remaining: u64,
}

/// Waits (up to `limit`) until the item's draw is done: its seed is published.
pub async fn wait_for_draw(admin: &Admin, id: ItemId, limit: Duration) -> anyhow::Result<()> {
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(100));
    let deadline = Instant::now() + limit;
    loop {
        let item = admin
            .call(Method::GET, &format!("/api/items/{id}"), None)
            .await?;
        if item["draw_seed"].is_string() {
            bar.finish_and_clear();
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "item {id}: not drawn within {limit:?} (is a scheduler running?)"
        );
        bar.set_message(format!(
            "waiting for the draw at {}",
            item["draw_at"].as_str().unwrap_or("?")
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sets the item up (or checks the existing one) and answers what it holds.
pub async fn prepare(
    admin: &Admin,
    args: &RehearsalArgs,
    start_at: DateTime<Utc>,
) -> anyhow::Result<ItemInfo> {
    let id = match args.item {
        Some(id) => id,
        None => new_item_id()?,
    };
    if args.item.is_none() || args.units.is_some() {
        set_up(admin, args, id, start_at).await?;
    }
    let stats = admin
        .call(Method::GET, &format!("/admin/items/{id}/stats"), None)
        .await
        .with_context(|| format!("item {id}: does it exist? (--units sets it up)"))?;
    let item = admin
        .call(Method::GET, &format!("/api/items/{id}"), None)
        .await?;
    let number = |v: &Value, what: &str| {
        v.as_u64()
            .with_context(|| format!("item {id}: {what} is not a number: {v}"))
    };
    Ok(ItemInfo {
        id,
        name: item["name"].as_str().unwrap_or_default().to_owned(),
        total: number(&stats["total"], "total")?,
        remaining: number(&stats["remaining"], "remaining")?,
    })
}

/// Writes item `id` as the arguments say (its window from `start_at`), and loads it.
async fn set_up(
    admin: &Admin,
    args: &RehearsalArgs,
    id: ItemId,
    start_at: DateTime<Utc>,
) -> anyhow::Result<()> {
    let units = args.units.unwrap_or(DEFAULT_UNITS);
    let release: Vec<Value> = args
        .release
        .iter()
        .flat_map(|w| &w.0)
        .map(|(after, units)| {
            json!({
                "at": start_at + chrono::Duration::seconds(i64::from(*after)),
                "units": units,
            })
        })
        .collect();
    // An item that exists keeps its price once loaded (`409 price_fixed`): set it up
    // again at that price. (A missing item answers 404: a new one.)
    let price_cents = match args.item {
        Some(id) => admin
            .call(Method::GET, &format!("/api/items/{id}"), None)
            .await
            .ok()
            .and_then(|item| item["price_cents"].as_u64()),
        None => None,
    }
    .unwrap_or(PRICE_CENTS);
    let mut body = json!({
        "name": format!("bench item {id}"),
        "shop_id": args.shop,
        "total": units,
        // Started a moment before the presses, so the first one is on time.
        "start_at": start_at - chrono::Duration::milliseconds(500),
        "end_at": start_at + chrono::Duration::hours(1),
        "price_cents": price_cents,
        "buckets": args.buckets,
        "per_user": args.per_user,
        "release": release,
    });
    if let Some(after) = args.draw {
        body["mode"] = json!("draw");
        body["draw_at"] = json!(start_at + chrono::Duration::seconds(i64::from(after)));
    }
    admin
        .call(Method::PUT, &format!("/admin/items/{id}"), Some(body))
        .await?;
    // Paused while it loads: a forced warm-up refuses a live sale (`sale_live`), and
    // an existing item's new total would otherwise stand in MySQL unloaded.
    admin
        .call(Method::POST, &format!("/admin/items/{id}/pause"), None)
        .await?;
    admin
        .call(
            Method::POST,
            &format!("/admin/items/{id}/warmup?force=true"),
            None,
        )
        .await
        .with_context(|| {
            format!("item {id} stays paused: resume it (POST /admin/items/{id}/resume) once loaded")
        })?;
    admin
        .call(Method::POST, &format!("/admin/items/{id}/resume"), None)
        .await?;
    Ok(())
}

/// The price of an item a rehearsal sets up.
const PRICE_CENTS: u64 = 100;

/// A fresh item id per run: milliseconds since 2026 plus a trillion, far from hand-made ids.
fn new_item_id() -> anyhow::Result<ItemId> {
    let ms = u64::try_from(Utc::now().timestamp_millis() - 1_767_225_600_000).unwrap_or_default();
    ItemId::new(1_000_000_000_000 + ms).context("item id from the clock")
}
