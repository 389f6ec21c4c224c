//! The signature on a payment event, in the scheme Stripe made common: the header
//! `Seckill-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>`.
//! Checked over the raw bytes before anything reads them; every configured secret is
//! tried (rotation), every `v1` the header carries too, each comparison in constant time
//! (`Mac::verify_slice`).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::Secret;

/// The header's name.
pub const HEADER: &str = "Seckill-Signature";

/// How far an event's `t` may be from this server's clock, either way: an event older than
/// this is a replay (or a clock badly off), and is refused.
pub const TOLERANCE_S: i64 = 300;

/// Why an event's signature was refused: each a metric's `reason`, and what the `401`
/// says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    NoSecret,
    Missing,
    Malformed,
    Stale,
    Mismatch,
}

impl Refused {
    /// What the `401` says.
    pub fn detail(self) -> &'static str {
        match self {
            Refused::NoSecret => {
                "no payment secret is configured (SECKILL_PAYMENT_SECRET): every event is refused"
            }
            Refused::Missing => "the Seckill-Signature header is missing",
            Refused::Malformed => {
                "the Seckill-Signature header is not `t=<unix seconds>,v1=<hex HMAC-SHA256>`"
            }
            Refused::Stale => "the signature's time is more than 300 s from the server's",
            Refused::Mismatch => "no configured secret signs this body with that time",
        }
    }

    /// The metric's `reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::NoSecret => "no_secret",
            Refused::Missing => "missing",
            Refused::Malformed => "malformed",
            Refused::Stale => "stale",
            Refused::Mismatch => "mismatch",
        }
    }
}

/// The header for `body`, signed with `secret` at `t` (unix seconds): what a payment
/// provider sends, and `seckill pay`.
pub fn sign(secret: &str, t: i64, body: &[u8]) -> String {
    let mac = mac(secret, t, body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// Checks `header` over `body` against every secret, at `now` (unix seconds).
pub fn verify(
    header: Option<&str>,
    body: &[u8],
    secrets: &[Secret],
    now: i64,
) -> Result<(), Refused> {
    if secrets.is_empty() {
        return Err(Refused::NoSecret);
    }
    let header = header.ok_or(Refused::Missing)?;
    let (t, signatures) = parse(header)?;
    if now.abs_diff(t) > TOLERANCE_S.unsigned_abs() {
        return Err(Refused::Stale);
    }
    let signed = secrets.iter().any(|secret| {
        signatures
            .iter()
            .any(|sig| mac(secret.expose(), t, body).verify_slice(sig).is_ok())
    });
    if signed {
        Ok(())
    } else {
        Err(Refused::Mismatch)
    }
}

/// `t` and every `v1` of a header; other schemes (`v0`, …) are passed over.
fn parse(header: &str) -> Result<(i64, Vec<Vec<u8>>), Refused> {
    let mut t = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        let (key, value) = part.trim().split_once('=').ok_or(Refused::Malformed)?;
        match key {
            "t" => t = Some(value.parse::<i64>().map_err(|_| Refused::Malformed)?),
            "v1" => signatures.push(hex::decode(value).map_err(|_| Refused::Malformed)?),
            _ => {}
        }
    }
    match t {
        Some(t) if !signatures.is_empty() => Ok((t, signatures)),
        _ => Err(Refused::Malformed),
    }
}

fn mac(secret: &str, t: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn secrets(all: &[&str]) -> Vec<Secret> {
        all.iter().map(|s| Secret::new(*s)).collect()
    }

    #[test]
    fn a_body_signed_with_any_configured_secret_passes() {
        let body = br#"{"event_id":"e1"}"#;
        let header = sign("new", NOW, body);
        assert_eq!(
            verify(Some(&header), body, &secrets(&["old", "new"]), NOW),
            Ok(())
        );
        assert_eq!(
            verify(Some(&header), body, &secrets(&["new"]), NOW + 300),
            Ok(())
        );
    }

    #[test]
    fn anything_else_is_refused_with_its_reason() {
        let body = br#"{"event_id":"e1"}"#;
        let header = sign("s", NOW, body);
        let s = secrets(&["s"]);
        assert_eq!(
            verify(Some(&header), body, &[], NOW),
            Err(Refused::NoSecret)
        );
        assert_eq!(verify(None, body, &s, NOW), Err(Refused::Missing));
        assert_eq!(
            verify(Some("v1=ab"), body, &s, NOW),
            Err(Refused::Malformed)
        );
        assert_eq!(
            verify(Some("t=x,v1=ab"), body, &s, NOW),
            Err(Refused::Malformed)
        );
        assert_eq!(
            verify(Some("t=1,v1=zz"), body, &s, NOW),
            Err(Refused::Malformed)
        );
        assert_eq!(
            verify(Some(&header), body, &s, NOW + 301),
            Err(Refused::Stale)
        );
        assert_eq!(
            verify(Some(&header), body, &s, NOW - 301),
            Err(Refused::Stale)
        );
        assert_eq!(
            verify(Some(&header), body, &secrets(&["other"]), NOW),
            Err(Refused::Mismatch)
        );
        let altered = br#"{"event_id":"e2"}"#;
        assert_eq!(
            verify(Some(&header), altered, &s, NOW),
            Err(Refused::Mismatch)
        );
        // A signature over the same body at another time does not pass for this one.
        let other_time =
            sign("s", NOW - 1, body).replace(&format!("t={}", NOW - 1), &format!("t={NOW}"));
        assert_eq!(
            verify(Some(&other_time), body, &s, NOW),
            Err(Refused::Mismatch)
        );
    }

    #[test]
    fn one_good_signature_among_several_passes() {
        let body = b"{}";
        let good = sign("s", NOW, body);
        let v1 = good.split_once(",v1=").map(|(_, v)| v).unwrap_or_default();
        let header = format!("t={NOW},v1={},v0=whatever,v1={v1}", "00".repeat(32));
        assert_eq!(verify(Some(&header), body, &secrets(&["s"]), NOW), Ok(()));
    }
}
