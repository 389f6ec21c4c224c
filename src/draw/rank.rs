//! A draw's fairness, in numbers anyone can check: the seed, its commitment, each entry's
//! rank.
//!
//! The seed (32 random bytes) is made when the item is first written as a draw and kept
//! secret in MySQL; `GET /api/items/{id}` shows its SHA-256 (the commitment) from then on,
//! and the seed itself once the draw is done. An entry's rank is the first six bytes of
//! HMAC-SHA256(key = the seed's bytes, message = the user id in decimal), read as a
//! big-endian integer: fixed by the seed and the user alone, so nobody — operators
//! included — can choose winners after seeing who entered, and anyone holding the seed can
//! check a rank. The lowest ranks win (ties, a chance of one in ~10^14 per pair, by user
//! id as text). Six bytes so that a rank is exact as a Redis sorted-set score (a double).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::domain::UserId;

/// A new secret seed, in hex.
pub fn new_seed() -> Result<String, getrandom::Error> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed)?;
    Ok(hex::encode(seed))
}

/// Why a draw's seed cannot be used: it is not 32 bytes in hex, as [`new_seed`] makes
/// them (an empty key would rank every draw alike, and a commitment to it would promise
/// nothing). Names what is wrong, never the seed: it is secret until the draw.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadSeed {
    #[error("the draw's seed is {0} characters long, not 64 (32 bytes in hex)")]
    Length(usize),
    #[error("the draw's seed is not hex")]
    NotHex,
}

/// The seed's bytes.
fn seed_bytes(seed_hex: &str) -> Result<[u8; 32], BadSeed> {
    let mut seed = [0u8; 32];
    if seed_hex.len() != 2 * seed.len() {
        return Err(BadSeed::Length(seed_hex.chars().count()));
    }
    hex::decode_to_slice(seed_hex, &mut seed).map_err(|_| BadSeed::NotHex)?;
    Ok(seed)
}

/// The commitment shown before the draw: SHA-256 of the seed's bytes, in hex.
pub fn commitment(seed_hex: &str) -> Result<String, BadSeed> {
    Ok(hex::encode(Sha256::digest(seed_bytes(seed_hex)?)))
}

/// An entry's rank (see the module's header); lower wins.
pub fn rank(seed_hex: &str, user: UserId) -> Result<u64, BadSeed> {
    let key = seed_bytes(seed_hex)?;
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(user.get().to_string().as_bytes());
    let digest = mac.finalize().into_bytes();
    Ok(digest[..6]
        .iter()
        .fold(0u64, |rank, byte| (rank << 8) | u64::from(*byte)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn ranks_follow_from_the_seed_and_the_user_alone() {
        let rank = |seed: &str, user| rank(seed, UserId::new(user)).unwrap();
        assert_eq!(rank(SEED, 42), rank(SEED, 42));
        assert_ne!(rank(SEED, 42), rank(SEED, 43));
        let other = "ff".repeat(32);
        assert_ne!(rank(SEED, 42), rank(&other, 42));
        assert!(rank(SEED, 42) < 1 << 48, "exact as a double");
    }

    #[test]
    fn a_malformed_seed_is_an_error_not_an_empty_key() {
        let user = UserId::new(7);
        for (seed, why) in [
            ("", BadSeed::Length(0)),
            ("00", BadSeed::Length(2)),
            (&*"0".repeat(65), BadSeed::Length(65)),
            (&*format!("{}zz", "0".repeat(62)), BadSeed::NotHex),
        ] {
            assert_eq!(rank(seed, user), Err(why.clone()), "{seed:?}");
            assert_eq!(commitment(seed), Err(why), "{seed:?}");
        }
        let message = rank("abc", user).unwrap_err().to_string();
        assert!(!message.contains("abc"), "the seed is secret: {message}");
    }

    #[test]
    fn a_rank_is_what_anyone_can_compute_with_the_seed() {
        // HMAC-SHA256(key = bytes 00..1f, "7"), first six bytes: computed independently
        // (python3: hmac.new(bytes(range(32)), b"7", "sha256").hexdigest()[:12]).
        assert_eq!(rank(SEED, UserId::new(7)), Ok(0x43c8_75c1_027e));
        // sha256(bytes 00..1f).
        assert_eq!(
            commitment(SEED).unwrap(),
            "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd"
        );
    }

    #[test]
    fn seeds_are_new_each_time() {
        let (a, b) = (new_seed().unwrap(), new_seed().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
