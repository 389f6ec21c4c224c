//! `seckill pay`: what a payment provider does, from the command line — a `payment.*`
//! event for an order, signed with the first `SECKILL_PAYMENT_SECRET`, sent to a running
//! server. The amount is the order's item's price, read from MySQL (the item is in the
//! order's number), so it works for an order still on its way there too.

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde_json::json;

use crate::config::Settings;
use crate::domain::OrderSn;
use crate::store::connect_mysql;

use super::signature;

#[derive(Args, Clone, Debug)]
pub struct PayArgs {
    /// The order paid for (`order_sn` of its `202`).
    #[arg(long)]
    order: String,
    /// What the provider reports.
    #[arg(long = "type", value_enum, default_value_t = Kind::Succeeded)]
    kind: Kind,
    /// The amount, in the currency's smallest unit; default: the item's price.
    #[arg(long)]
    amount_cents: Option<u64>,
    /// The charge's reference (the same on its refund); default: a new one.
    #[arg(long)]
    provider_ref: Option<String>,
    /// The event's id (a repeat of one changes nothing); default: a new one.
    #[arg(long)]
    event_id: Option<String>,
    /// The server; default: `http://` and SECKILL_HTTP_ADDR.
    #[arg(long)]
    url: Option<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Kind {
    Succeeded,
    Refunded,
    Failed,
}

/// Sends the event and prints the server's answer; `Ok(false)` when it was not a 2xx.
pub async fn pay(args: PayArgs, settings: &Settings) -> anyhow::Result<bool> {
    let secret = settings
        .payment_secret
        .first()
        .context("SECKILL_PAYMENT_SECRET is not set: there is nothing to sign the event with")?;
    let sn = OrderSn::parse(&args.order)
        .with_context(|| format!("{:?} is not an order number", args.order))?;
    let amount_cents = match args.amount_cents {
        Some(amount) => amount,
        None => {
            let db = connect_mysql(settings.database_url.expose()).await?;
            let item = crate::items::repo::get(&db, sn.item())
                .await?
                .with_context(|| format!("item {} of order {sn} is not in MySQL", sn.item()))?;
            item.price_cents
        }
    };
    let kind = match args.kind {
        Kind::Succeeded => "payment.succeeded",
        Kind::Refunded => "payment.refunded",
        Kind::Failed => "payment.failed",
    };
    let new_id = || ulid::Ulid::new().to_string().to_lowercase();
    let body = json!({
        "event_id": args.event_id.unwrap_or_else(|| format!("evt_cli_{}", new_id())),
        "type": kind,
        "order_sn": sn.as_str(),
        "amount_cents": amount_cents,
        "currency": settings.currency,
        "occurred_at": chrono::Utc::now(),
        "provider_ref": args.provider_ref.unwrap_or_else(|| format!("ch_cli_{}", new_id())),
    })
    .to_string();
    let header = signature::sign(
        secret.expose(),
        chrono::Utc::now().timestamp(),
        body.as_bytes(),
    );
    let base = args
        .url
        .unwrap_or_else(|| format!("http://{}", settings.http_addr));
    let url = format!("{}/api/payments/events", base.trim_end_matches('/'));
    let response = reqwest::Client::new()
        .post(&url)
        .header(signature::HEADER, header)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .with_context(|| format!("sending the event to {url}"))?;
    let status = response.status();
    let answer = response
        .text()
        .await
        .context("reading the server's answer")?;
    println!("{} {answer}", status.as_u16());
    Ok(status.is_success())
}
