//! A payment event's body, read only after its signature passed, and checked whole: a
//! bad one is a `400` naming the field, recorded nowhere.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use utoipa::ToSchema;

/// What the payment side says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, ToSchema)]
pub enum EventType {
    /// The money was taken: the order is paid (or, late, revived or owed back).
    #[serde(rename = "payment.succeeded")]
    Succeeded,
    /// The money was returned: a paid order is `refunded`, its unit back.
    #[serde(rename = "payment.refunded")]
    Refunded,
    /// A payment attempt failed: recorded; the order waits for its deadline.
    #[serde(rename = "payment.failed")]
    Failed,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Succeeded => "payment.succeeded",
            EventType::Refunded => "payment.refunded",
            EventType::Failed => "payment.failed",
        }
    }
}

/// `POST /api/payments/events`'s body.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PaymentEvent {
    /// The provider's id of this event: the same id again is a repeat (1–255 printable
    /// ASCII characters).
    pub event_id: String,
    #[serde(rename = "type")]
    pub kind: EventType,
    /// The order paid for: `order_sn` of the `202`.
    pub order_sn: String,
    /// In the currency's smallest unit; must be the order's price.
    pub amount_cents: u64,
    /// ISO 4217, as `SECKILL_CURRENCY`.
    pub currency: String,
    pub occurred_at: DateTime<Utc>,
    /// The provider's reference of the charge (the same on the charge's refund), 1–255
    /// printable ASCII characters.
    pub provider_ref: String,
}

impl PaymentEvent {
    /// Reads a body, naming what is wrong.
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        let event: PaymentEvent =
            serde_json::from_slice(body).map_err(|e| format!("the event's body: {e}"))?;
        let reference = |name: &str, value: &str| {
            let ok = (1..=255).contains(&value.len())
                && value.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "{name} must be 1 to 255 printable ASCII characters"
                ))
            }
        };
        reference("event_id", &event.event_id)?;
        reference("provider_ref", &event.provider_ref)?;
        if event.order_sn.is_empty() || event.order_sn.len() > 40 {
            return Err("order_sn must be 1 to 40 characters".into());
        }
        if event.currency.len() != 3 || !event.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err("currency must be three capital letters (ISO 4217)".into());
        }
        if event.amount_cents > i64::MAX as u64 {
            return Err("amount_cents is too large".into());
        }
        if !crate::store::storable(event.occurred_at) {
            return Err(format!("occurred_at must be {}", crate::store::STORABLE));
        }
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(overrides: &[(&str, serde_json::Value)]) -> Vec<u8> {
        let mut event = serde_json::json!({
            "event_id": "evt_1", "type": "payment.succeeded", "order_sn": "1-01ABC",
            "amount_cents": 19900, "currency": "CNY",
            "occurred_at": "2026-12-05T10:00:00Z", "provider_ref": "ch_1"
        });
        for (field, value) in overrides {
            event[*field] = value.clone();
        }
        event.to_string().into_bytes()
    }

    #[test]
    fn a_good_event_reads() {
        let event = PaymentEvent::parse(&body(&[])).unwrap();
        assert_eq!(event.kind, EventType::Succeeded);
        assert_eq!(event.amount_cents, 19_900);
    }

    #[test]
    fn a_bad_one_names_its_field() {
        for (field, value, named) in [
            (
                "type",
                serde_json::json!("payment.maybe"),
                "unknown variant",
            ),
            ("event_id", serde_json::json!(""), "event_id"),
            ("provider_ref", serde_json::json!("a\u{7}b"), "provider_ref"),
            ("currency", serde_json::json!("cny"), "currency"),
            ("amount_cents", serde_json::json!(-1), "invalid value"),
            (
                "occurred_at",
                serde_json::json!("yesterday"),
                "input contains invalid characters",
            ),
            ("order_sn", serde_json::json!("x".repeat(41)), "order_sn"),
            ("extra", serde_json::json!(1), "unknown field"),
            (
                "occurred_at",
                serde_json::json!("0001-01-01T00:00:00Z"),
                "occurred_at",
            ),
        ] {
            let why = PaymentEvent::parse(&body(&[(field, value)])).unwrap_err();
            assert!(why.contains(named), "{field}: {why}");
        }
    }
}
