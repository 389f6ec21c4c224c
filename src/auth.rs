//! User tokens (HS256 JWTs whose `sub` is the user id) and the operators' bearer token.
//!
//! Tokens are minted with `jsonwebtoken` but verified here with the RustCrypto `hmac` crate
//! it uses underneath: jsonwebtoken derives the HMAC key schedule again and parses the
//! claims twice on every call, which measured a third of the sold-out path's instructions
//! (34k of 100k per request). Here the keyed HMAC is built once and cloned per request,
//! and the claims are parsed once. The checks are jsonwebtoken's: the signature (in
//! constant time), `alg` = HS256, `exp` present and not past (5 s leeway), `sub` present.
//!
//! A token that passed is remembered with its user and `exp`: in a sale the crowd presses
//! again and again with the same token, and a repeat costs a hash lookup instead of the
//! HMAC and two JSON parses (measured: the token was 16.7k of a sold-out answer's 57k
//! instructions). It is remembered by its signature, which only the secret's holder can
//! make (32 bytes a token, where keeping its ~180-byte text raised the server's peak
//! memory by 18 MB at 32k tokens), beside a hash of the signed part it was made for: another text
//! carrying the same signature is verified in full, and fails. Verification is a pure
//! function of the token's text and the secret, so the remembered answer is the one
//! verifying again would give; only `exp` depends on the time, and it is checked on every
//! use. Only tokens that passed go in, so a flood of forged ones cannot push the crowd's
//! out.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use std::hash::BuildHasher;

use quick_cache::DefaultHashBuilder;
use quick_cache::sync::Cache;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::config::Secret;
use crate::domain::UserId;

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    iat: u64,
}

/// Why a token was refused; each is told to the client as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    Missing,
    Expired,
    BadSignature,
    BadSubject,
    Malformed,
}

impl TokenError {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenError::Missing => "missing `Authorization: Bearer <token>` header",
            TokenError::Expired => "token expired",
            TokenError::BadSignature => "token signature does not match",
            TokenError::BadSubject => "token subject is not a user id",
            TokenError::Malformed => "malformed token",
        }
    }
}

/// Seconds a token may be past its `exp` (clocks differ a little).
const LEEWAY_S: u64 = 5;

/// Verified tokens remembered: a sale's pressing crowd — this server is for a hundred
/// thousand people pressing at once, some on two devices (the cache keeps the frequent
/// ones when the crowd is larger). With a crowd of 200,000 pressing a sold-out item again
/// and again, remembering 50,000 cost the answer 18.6 µs of CPU on average, 200,000 cost
/// 17.0, for a peak memory about 10 MB higher (`loadtest/sold_out_crowd.sh`).
const REMEMBERED: usize = 200_000;

/// An HS256 signature's length, in bytes.
const SIGNATURE_LEN: usize = 32;

pub struct Jwt {
    encoding: EncodingKey,
    /// HMAC-SHA256 keyed with the secret, ready to clone for each verification.
    mac: Hmac<Sha256>,
    /// Tokens that passed, by their signature.
    verified: Cache<[u8; SIGNATURE_LEN], Passed>,
    /// Hashes a token's signed part (randomly seeded per process).
    signed_hash: DefaultHashBuilder,
}

/// What a token that passed says, and the hash of the part its signature signed.
#[derive(Debug, Clone, Copy)]
struct Passed {
    user: UserId,
    exp: u64,
    signed_hash: u64,
}

#[derive(Deserialize)]
struct JoseHeader<'a> {
    #[serde(borrow)]
    alg: &'a str,
}

#[derive(Deserialize)]
struct VerifiedClaims {
    sub: Option<String>,
    exp: Option<u64>,
}

impl Jwt {
    pub fn new(secret: &Secret) -> Self {
        let key = secret.expose().as_bytes();
        Self {
            encoding: EncodingKey::from_secret(key),
            // HMAC takes keys of any length; this cannot fail.
            mac: <Hmac<Sha256> as Mac>::new_from_slice(key)
                .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length")),
            verified: Cache::new(REMEMBERED),
            signed_hash: DefaultHashBuilder::default(),
        }
    }

    pub fn mint(&self, user: UserId, ttl: Duration) -> Result<String, jsonwebtoken::errors::Error> {
        let now = jsonwebtoken::get_current_timestamp();
        let claims = Claims {
            sub: user.to_string(),
            exp: now + ttl.as_secs(),
            iat: now,
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
    }

    pub fn verify(&self, token: &str) -> Result<UserId, TokenError> {
        let (signed, signature) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        // Room for what a 43-character signature decodes into, and a little more, so that
        // a longer one reads as a wrong signature rather than as malformed.
        let mut decoded = [0u8; 48];
        let length = URL_SAFE_NO_PAD
            .decode_slice(signature, &mut decoded)
            .map_err(|_| TokenError::Malformed)?;
        let signature = &decoded[..length];
        let signed_hash = self.signed_hash.hash_one(signed);
        // Any other length fails the HMAC: such a token is neither looked up nor kept.
        let key = <[u8; SIGNATURE_LEN]>::try_from(signature).ok();
        let passed = match key.and_then(|key| self.verified.get(&key)) {
            Some(passed) if passed.signed_hash == signed_hash => passed,
            _ => {
                let (user, exp) = self.check(signed, signature)?;
                let passed = Passed {
                    user,
                    exp,
                    signed_hash,
                };
                if let Some(key) = key {
                    self.verified.insert(key, passed);
                }
                passed
            }
        };
        if expired(passed.exp) {
            return Err(TokenError::Expired);
        }
        Ok(passed.user)
    }

    /// The whole verification of a token's signed part and its decoded signature but
    /// `exp`'s time check (an expired token with a bad subject is told it expired, as
    /// jsonwebtoken's order of checks has it). Returns the user and `exp`.
    fn check(&self, signed: &str, signature: &[u8]) -> Result<(UserId, u64), TokenError> {
        let (header, claims) = signed.split_once('.').ok_or(TokenError::Malformed)?;
        let mut mac = self.mac.clone();
        mac.update(signed.as_bytes());
        mac.verify_slice(signature)
            .map_err(|_| TokenError::BadSignature)?;

        let header = URL_SAFE_NO_PAD
            .decode(header)
            .map_err(|_| TokenError::Malformed)?;
        let header: JoseHeader =
            serde_json::from_slice(&header).map_err(|_| TokenError::Malformed)?;
        if header.alg != "HS256" {
            return Err(TokenError::Malformed);
        }
        let claims = URL_SAFE_NO_PAD
            .decode(claims)
            .map_err(|_| TokenError::Malformed)?;
        let claims: VerifiedClaims =
            serde_json::from_slice(&claims).map_err(|_| TokenError::Malformed)?;
        let exp = claims.exp.ok_or(TokenError::Malformed)?;
        match claims.sub.as_deref().and_then(UserId::parse) {
            Some(user) => Ok((user, exp)),
            None if expired(exp) => Err(TokenError::Expired),
            None => Err(TokenError::BadSubject),
        }
    }
}

/// Whether a token whose `exp` is this is past it, leeway included.
fn expired(exp: u64) -> bool {
    exp.saturating_add(LEEWAY_S) < jsonwebtoken::get_current_timestamp()
}

/// The token after `Bearer ` in an `Authorization` header value.
pub fn bearer(header: Option<&str>) -> Result<&str, TokenError> {
    let value = header.ok_or(TokenError::Missing)?;
    let (scheme, token) = value.split_once(' ').ok_or(TokenError::Missing)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(TokenError::Missing);
    }
    Ok(token.trim())
}

/// Compares in constant time, so response timing reveals nothing of the token.
pub fn admin_token_matches(expected: &Secret, given: &str) -> bool {
    expected.expose().as_bytes().ct_eq(given.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt() -> Jwt {
        Jwt::new(&Secret::new("test-secret"))
    }

    #[test]
    fn minted_tokens_verify() {
        let token = jwt()
            .mint(UserId::new(42), Duration::from_secs(60))
            .unwrap();
        assert_eq!(jwt().verify(&token), Ok(UserId::new(42)));
    }

    #[test]
    fn forged_and_expired_tokens_are_refused() {
        let other = Jwt::new(&Secret::new("another-secret"));
        let forged = other.mint(UserId::new(1), Duration::from_secs(60)).unwrap();
        assert_eq!(jwt().verify(&forged), Err(TokenError::BadSignature));

        let now = jsonwebtoken::get_current_timestamp();
        let old = Claims {
            sub: "1".into(),
            exp: now - 120,
            iat: now - 180,
        };
        let expired = jsonwebtoken::encode(&Header::default(), &old, &jwt().encoding).unwrap();
        assert_eq!(jwt().verify(&expired), Err(TokenError::Expired));

        let odd = Claims {
            sub: "alice".into(),
            exp: now + 60,
            iat: now,
        };
        let odd = jsonwebtoken::encode(&Header::default(), &odd, &jwt().encoding).unwrap();
        assert_eq!(jwt().verify(&odd), Err(TokenError::BadSubject));
        assert_eq!(jwt().verify("not.a.token"), Err(TokenError::Malformed));
    }

    /// What jsonwebtoken itself decides, for the same token.
    fn reference(token: &str) -> bool {
        let mut validation = jsonwebtoken::Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = LEEWAY_S;
        let key = jsonwebtoken::DecodingKey::from_secret(b"test-secret");
        jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation).is_ok()
    }

    #[test]
    fn verification_agrees_with_jsonwebtoken() {
        let now = jsonwebtoken::get_current_timestamp();
        let sign = |header: &Header, claims: &serde_json::Value| {
            jsonwebtoken::encode(header, claims, &jwt().encoding).unwrap()
        };
        let hs256 = Header::new(Algorithm::HS256);
        let valid = sign(
            &hs256,
            &serde_json::json!({ "sub": "7", "exp": now + 60, "iat": now }),
        );
        let mut tampered = valid.clone();
        tampered.insert(tampered.len() - 3, 'A');
        let tokens = [
            valid.clone(),
            tampered,
            sign(&hs256, &serde_json::json!({ "sub": "7", "exp": now - 3 })),
            sign(&hs256, &serde_json::json!({ "sub": "7", "exp": now - 60 })),
            sign(&hs256, &serde_json::json!({ "sub": "7" })),
            sign(
                &Header::new(Algorithm::HS384),
                &serde_json::json!({ "sub": "7", "exp": now + 60 }),
            ),
            // alg "none" with the original signature, and with none at all.
            format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
                valid.split_once('.').unwrap().1
            ),
            format!(
                "{}.{}.",
                URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
                valid.split('.').nth(1).unwrap()
            ),
            "a.b".into(),
            "".into(),
        ];
        for token in &tokens {
            assert_eq!(jwt().verify(token).is_ok(), reference(token), "{token}");
        }
        assert_eq!(jwt().verify(&valid), Ok(UserId::new(7)));
    }

    #[test]
    fn a_remembered_token_is_still_judged_by_its_text_and_its_exp() {
        let jwt = jwt();
        let token = jwt.mint(UserId::new(9), Duration::from_secs(60)).unwrap();
        assert_eq!(jwt.verify(&token), Ok(UserId::new(9)));
        assert_eq!(jwt.verify(&token), Ok(UserId::new(9)), "remembered");
        // Another text is verified on its own, however close to a remembered one.
        let mut tampered = token.clone();
        tampered.insert(tampered.len() - 3, 'A');
        assert_eq!(jwt.verify(&tampered), Err(TokenError::BadSignature));
        let (signed, signature) = token.rsplit_once('.').unwrap();
        assert_eq!(jwt.verify(signed), Err(TokenError::Malformed));
        // A remembered signature on another signed part is no pass.
        let (header, _) = signed.split_once('.').unwrap();
        let now = jsonwebtoken::get_current_timestamp();
        let claims = format!(r#"{{"sub":"8","exp":{}}}"#, now + 60);
        let other = format!("{header}.{}.{signature}", URL_SAFE_NO_PAD.encode(claims));
        assert_eq!(jwt.verify(&other), Err(TokenError::BadSignature));
        assert_eq!(jwt.verify(&token), Ok(UserId::new(9)), "still remembered");
        // A remembered token whose time has passed is refused.
        let key: [u8; SIGNATURE_LEN] = URL_SAFE_NO_PAD
            .decode(signature)
            .unwrap()
            .try_into()
            .unwrap();
        let mut passed = jwt.verified.get(&key).unwrap();
        passed.exp = now - LEEWAY_S - 1;
        jwt.verified.insert(key, passed);
        assert_eq!(jwt.verify(&token), Err(TokenError::Expired));
    }

    #[test]
    fn bearer_header_is_parsed() {
        assert_eq!(bearer(Some("Bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some("bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some("Basic abc")), Err(TokenError::Missing));
        assert_eq!(bearer(Some("Bearer ")), Err(TokenError::Missing));
        assert_eq!(bearer(None), Err(TokenError::Missing));
    }

    #[test]
    fn admin_tokens_compare() {
        let expected = Secret::new("s3cret");
        assert!(admin_token_matches(&expected, "s3cret"));
        assert!(!admin_token_matches(&expected, "s3cre"));
        assert!(!admin_token_matches(&expected, "s3cret!"));
    }
}
