//! What the waiting room signs, checked in memory: the pass an admitted buyer buys with,
//! and the proof-of-work challenge a join may cost.
//!
//! Both are HMAC-SHA256 under keys derived from `SECKILL_JWT_SECRET` (every instance has
//! it, and a buyer can forge neither without it), each key for one purpose only, so a
//! challenge can never pass for a pass.
//!
//! - A pass: `<item>.<user>.<expires_ms>.<32 hex digits>` — the first 16 bytes of the MAC
//!   over `pass|<item>|<user>|<expires_ms>`. `POST /api/flashbuy` checks it without a
//!   network round trip.
//! - A challenge: `<expires_ms>.<32 hex digits>` over `challenge|<item>|<user>|<expires_ms>`.
//!   Its solution is any `nonce` for which SHA-256(`<challenge>:<nonce>`) begins with
//!   `pow_bits` zero bits: cheap to check, `2^pow_bits` hashes on average to find.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::domain::{ItemId, UserId};

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the MAC a token carries (128 bits: forging one is out of reach).
const MAC_BYTES: usize = 16;
/// How long a challenge may be solved.
pub const CHALLENGE_TTL_MS: i64 = 120_000;

/// The waiting room's signing keys.
#[derive(Clone)]
pub struct Signer {
    passes: [u8; 32],
    challenges: [u8; 32],
}

/// Why a pass does not let its bearer buy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassRefused {
    /// Not a pass of this server, or one of another item or user.
    Invalid,
    /// A pass of this buyer, past its time.
    Expired,
}

/// Why a proof-of-work does not admit a join.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PowRefused {
    #[error("the challenge is not one this server gave this user for this item")]
    Invalid,
    #[error("the challenge expired: ask for a new one")]
    Expired,
    #[error("SHA-256(\"<challenge>:<nonce>\") does not begin with the required zero bits")]
    Unsolved,
}

impl Signer {
    pub fn new(secret: &str) -> Self {
        let derive = |purpose: &str| -> [u8; 32] {
            let mut mac = mac_with(secret.as_bytes());
            mac.update(purpose.as_bytes());
            mac.finalize().into_bytes().into()
        };
        Self {
            passes: derive("seckill waiting room passes v1"),
            challenges: derive("seckill waiting room challenges v1"),
        }
    }

    /// The pass of `user` for `item`, good until `expires_ms`.
    pub fn pass(&self, item: ItemId, user: UserId, expires_ms: i64) -> String {
        let body = format!("{item}.{user}.{expires_ms}");
        let tag = tag(&self.passes, &format!("pass|{item}|{user}|{expires_ms}"));
        format!("{body}.{tag}")
    }

    /// Whether `token` lets `user` buy `item` at `now_ms`; `Ok` with its expiry.
    pub fn check_pass(
        &self,
        token: &str,
        item: ItemId,
        user: UserId,
        now_ms: i64,
    ) -> Result<i64, PassRefused> {
        let mut parts = token.trim().split('.');
        let (Some(item_s), Some(user_s), Some(expires_s), Some(given), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(PassRefused::Invalid);
        };
        let expires_ms: i64 = expires_s.parse().map_err(|_| PassRefused::Invalid)?;
        let message = format!("pass|{item_s}|{user_s}|{expires_s}");
        if !verify(&self.passes, &message, given) {
            return Err(PassRefused::Invalid);
        }
        if item_s != item.to_string() || user_s != user.to_string() {
            return Err(PassRefused::Invalid);
        }
        if now_ms >= expires_ms {
            return Err(PassRefused::Expired);
        }
        Ok(expires_ms)
    }

    /// A challenge for `user` joining `item`'s queue, good until `expires_ms`.
    pub fn challenge(&self, item: ItemId, user: UserId, expires_ms: i64) -> String {
        let tag = tag(
            &self.challenges,
            &format!("challenge|{item}|{user}|{expires_ms}"),
        );
        format!("{expires_ms}.{tag}")
    }

    /// Whether `nonce` solves `challenge` (given to `user` for `item`) with `bits` zero
    /// bits, at `now_ms`.
    pub fn check_solution(
        &self,
        challenge: &str,
        nonce: &str,
        bits: u8,
        item: ItemId,
        user: UserId,
        now_ms: i64,
    ) -> Result<(), PowRefused> {
        let (expires_s, given) = challenge.split_once('.').ok_or(PowRefused::Invalid)?;
        let expires_ms: i64 = expires_s.parse().map_err(|_| PowRefused::Invalid)?;
        let message = format!("challenge|{item}|{user}|{expires_s}");
        if !verify(&self.challenges, &message, given) {
            return Err(PowRefused::Invalid);
        }
        if now_ms >= expires_ms {
            return Err(PowRefused::Expired);
        }
        if !solves(challenge, nonce, bits) {
            return Err(PowRefused::Unsolved);
        }
        Ok(())
    }
}

fn mac_with(key: &[u8]) -> HmacSha256 {
    <HmacSha256 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"))
}

/// The token's MAC: its first [`MAC_BYTES`], in hex.
fn tag(key: &[u8], message: &str) -> String {
    let mut mac = mac_with(key);
    mac.update(message.as_bytes());
    hex::encode(&mac.finalize().into_bytes()[..MAC_BYTES])
}

/// Whether `given` (hex) is the MAC of `message`, compared in constant time.
fn verify(key: &[u8], message: &str, given: &str) -> bool {
    let mut bytes = [0u8; MAC_BYTES];
    if given.len() != 2 * MAC_BYTES || hex::decode_to_slice(given, &mut bytes).is_err() {
        return false;
    }
    let mut mac = mac_with(key);
    mac.update(message.as_bytes());
    mac.verify_truncated_left(&bytes).is_ok()
}

/// Whether SHA-256(`<challenge>:<nonce>`) begins with `bits` zero bits.
pub fn solves(challenge: &str, nonce: &str, bits: u8) -> bool {
    let digest = Sha256::digest(format!("{challenge}:{nonce}").as_bytes());
    let mut left = u32::from(bits);
    for byte in digest {
        if left == 0 {
            return true;
        }
        if left >= 8 {
            if byte != 0 {
                return false;
            }
            left -= 8;
        } else {
            return byte.leading_zeros() >= left;
        }
    }
    left == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (ItemId, UserId) {
        (ItemId::new(7).unwrap(), UserId::new(42))
    }

    #[test]
    fn a_pass_buys_for_its_user_and_item_until_it_expires() {
        let signer = Signer::new("secret");
        let (item, user) = ids();
        let pass = signer.pass(item, user, 1_000);
        assert_eq!(signer.check_pass(&pass, item, user, 999), Ok(1_000));
        assert_eq!(
            signer.check_pass(&pass, item, user, 1_000),
            Err(PassRefused::Expired)
        );
        let other_user = UserId::new(43);
        assert_eq!(
            signer.check_pass(&pass, item, other_user, 0),
            Err(PassRefused::Invalid)
        );
        let other_item = ItemId::new(8).unwrap();
        assert_eq!(
            signer.check_pass(&pass, other_item, user, 0),
            Err(PassRefused::Invalid)
        );
    }

    #[test]
    fn a_pass_cannot_be_stretched_or_forged() {
        let signer = Signer::new("secret");
        let (item, user) = ids();
        let pass = signer.pass(item, user, 1_000);
        let stretched = pass.replacen(".1000.", ".9999999999999.", 1);
        assert_eq!(
            signer.check_pass(&stretched, item, user, 0),
            Err(PassRefused::Invalid)
        );
        let foreign = Signer::new("another secret").pass(item, user, 1_000);
        assert_eq!(
            signer.check_pass(&foreign, item, user, 0),
            Err(PassRefused::Invalid)
        );
        for junk in ["", "7.42.1000", "7.42.1000.zz", "a.b.c.d.e"] {
            assert_eq!(
                signer.check_pass(junk, item, user, 0),
                Err(PassRefused::Invalid),
                "{junk:?}"
            );
        }
        // A challenge never passes for a pass, nor the other way round.
        let challenge = signer.challenge(item, user, 1_000);
        let tag = challenge.split_once('.').unwrap().1;
        assert_eq!(
            signer.check_pass(&format!("7.42.1000.{tag}"), item, user, 0),
            Err(PassRefused::Invalid)
        );
    }

    #[test]
    fn a_solution_is_checked_against_its_challenge() {
        let signer = Signer::new("secret");
        let (item, user) = ids();
        let challenge = signer.challenge(item, user, 10_000);
        let nonce = (0u64..)
            .map(|n| n.to_string())
            .find(|n| solves(&challenge, n, 8))
            .unwrap();
        let check = |challenge: &str, nonce: &str, user, now| {
            signer.check_solution(challenge, nonce, 8, item, user, now)
        };
        assert_eq!(check(&challenge, &nonce, user, 0), Ok(()));
        assert_eq!(
            check(&challenge, &nonce, user, 10_000),
            Err(PowRefused::Expired)
        );
        assert_eq!(
            check(&challenge, &nonce, UserId::new(43), 0),
            Err(PowRefused::Invalid)
        );
        let unsolved = (0u64..)
            .map(|n| n.to_string())
            .find(|n| !solves(&challenge, n, 8))
            .unwrap();
        assert_eq!(
            check(&challenge, &unsolved, user, 0),
            Err(PowRefused::Unsolved)
        );
    }

    #[test]
    fn zero_bits_are_counted_from_the_first_byte() {
        // SHA-256("abc:0") = 0x4d…: one leading zero bit.
        let first = Sha256::digest(b"abc:0")[0];
        let zeros = first.leading_zeros() as u8;
        assert!(solves("abc", "0", zeros));
        assert!(!solves("abc", "0", zeros + 1));
        assert!(solves("anything", "at all", 0));
    }
}
