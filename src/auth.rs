//! User tokens (HS256 JWTs whose `sub` is the user id) and the operators' bearer token.

use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, errors::ErrorKind};
use serde::{Deserialize, Serialize};
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

pub struct Jwt {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl Jwt {
    pub fn new(secret: &Secret) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 5;
        Self {
            encoding: EncodingKey::from_secret(secret.expose().as_bytes()),
            decoding: DecodingKey::from_secret(secret.expose().as_bytes()),
            validation,
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
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => TokenError::Expired,
                ErrorKind::InvalidSignature => TokenError::BadSignature,
                _ => TokenError::Malformed,
            })?;
        UserId::parse(&data.claims.sub).ok_or(TokenError::BadSubject)
    }
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
