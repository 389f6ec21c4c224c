//! Rate limits per user and per client IP (GCRA, in memory, per instance): purchases and
//! a buyer's order look-ups per user and per IP, reads without a token per IP.
//!
//! `governor` directly rather than through `tower-governor`: the user key comes out of
//! the JWT, which the purchase extractor verifies anyway, and a refusal must be the
//! contract's JSON (`429 rate_limited`, `trace_id`, `Retry-After`), which tower-governor's
//! error hook cannot build (it never sees the request).

use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::HeaderMap;
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::domain::UserId;
use crate::http::error::ApiError;

pub struct RateLimits {
    per_user: Option<DefaultKeyedRateLimiter<UserId>>,
    per_ip: Option<DefaultKeyedRateLimiter<IpAddr>>,
    /// A buyer looking for their order of an item: limited like purchases, on a budget of
    /// its own (looking never costs a press).
    lookups_per_user: Option<DefaultKeyedRateLimiter<UserId>>,
    lookups_per_ip: Option<DefaultKeyedRateLimiter<IpAddr>>,
    /// Reads without a token, per client IP: each unknown id costs a store look-up.
    reads_per_ip: Option<DefaultKeyedRateLimiter<IpAddr>>,
}

/// What a limit is for.
#[derive(Clone, Copy, Debug)]
pub enum Limited {
    Purchase,
    /// `GET /api/items/{id}/my-order`.
    OrderLookup,
}

impl RateLimits {
    pub fn new(settings: &Settings) -> Self {
        Self {
            per_user: limiter(settings.rate_per_user),
            per_ip: limiter(settings.rate_per_ip),
            lookups_per_user: limiter(settings.rate_per_user),
            lookups_per_ip: limiter(settings.rate_per_ip),
            reads_per_ip: limiter(settings.read_rate_per_ip),
        }
    }

    fn user_limiter(&self, what: Limited) -> Option<&DefaultKeyedRateLimiter<UserId>> {
        match what {
            Limited::Purchase => self.per_user.as_ref(),
            Limited::OrderLookup => self.lookups_per_user.as_ref(),
        }
    }

    fn ip_limiter(&self, what: Limited) -> Option<&DefaultKeyedRateLimiter<IpAddr>> {
        match what {
            Limited::Purchase => self.per_ip.as_ref(),
            Limited::OrderLookup => self.lookups_per_ip.as_ref(),
        }
    }

    /// Whether reads without a token are limited at all.
    pub fn reads_limited(&self) -> bool {
        self.reads_per_ip.is_some()
    }

    pub fn check_read(&self, ip: IpAddr) -> Result<(), ApiError> {
        check(self.reads_per_ip.as_ref(), &ip)
    }

    pub fn check_user(&self, what: Limited, user: UserId) -> Result<(), ApiError> {
        check(self.user_limiter(what), &user)
    }

    /// Whether there is a per-IP limit at all (finding the client IP costs a little).
    pub fn per_ip_enabled(&self, what: Limited) -> bool {
        self.ip_limiter(what).is_some()
    }

    pub fn check_ip(&self, what: Limited, ip: IpAddr) -> Result<(), ApiError> {
        check(self.ip_limiter(what), &ip)
    }

    /// Forgets keys that have been quiet, so memory follows the active crowd.
    pub async fn housekeeping(&self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
            for limiter in self.per_user.iter().chain(self.lookups_per_user.iter()) {
                limiter.retain_recent();
                limiter.shrink_to_fit();
            }
            let per_ip = [&self.per_ip, &self.lookups_per_ip, &self.reads_per_ip];
            for limiter in per_ip.into_iter().flatten() {
                limiter.retain_recent();
                limiter.shrink_to_fit();
            }
        }
    }
}

/// `rate` per second with bursts of twice that; 0 turns the limit off.
fn limiter<K: Hash + Eq + Clone>(rate: u32) -> Option<DefaultKeyedRateLimiter<K>> {
    let rate = NonZeroU32::new(rate)?;
    let burst = rate.saturating_mul(NonZeroU32::MIN.saturating_add(1));
    Some(RateLimiter::keyed(
        Quota::per_second(rate).allow_burst(burst),
    ))
}

fn check<K: Hash + Eq + Clone>(
    limiter: Option<&DefaultKeyedRateLimiter<K>>,
    key: &K,
) -> Result<(), ApiError> {
    let Some(limiter) = limiter else {
        return Ok(());
    };
    limiter
        .check_key(key)
        .map_err(|not_until| ApiError::RateLimited {
            retry_after: not_until.wait_time_from(limiter.clock().now()),
        })
}

/// The client's address: the peer, or — when the peer is a trusted proxy — the last
/// address in `X-Forwarded-For` that is not itself a trusted proxy.
pub fn client_ip(settings: &Settings, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
    let peer = peer.ip();
    if !settings.is_trusted_proxy(peer) {
        return peer;
    }
    let forwarded = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|part| part.trim().parse::<IpAddr>().ok())
        .collect::<Vec<_>>();
    forwarded
        .into_iter()
        .rev()
        .find(|ip| !settings.is_trusted_proxy(*ip))
        .unwrap_or(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(per_user: u32) -> Settings {
        let mut s = Settings::from_env().unwrap();
        s.rate_per_user = per_user;
        s
    }

    #[test]
    fn a_user_gets_a_burst_of_twice_the_rate_then_429() {
        let limits = RateLimits::new(&settings(5));
        let user = UserId::new(1);
        for _ in 0..10 {
            assert!(limits.check_user(Limited::Purchase, user).is_ok());
        }
        match limits.check_user(Limited::Purchase, user) {
            Err(ApiError::RateLimited { retry_after }) => {
                assert!(retry_after <= Duration::from_secs(1))
            }
            other => panic!("expected 429, got {other:?}"),
        }
        assert!(limits.check_user(Limited::Purchase, UserId::new(2)).is_ok());
        // Looking for one's order has a budget of its own.
        assert!(limits.check_user(Limited::OrderLookup, user).is_ok());
    }

    #[test]
    fn zero_turns_the_limit_off() {
        let limits = RateLimits::new(&settings(0));
        assert!((0..1000).all(|_| limits.check_user(Limited::Purchase, UserId::new(1)).is_ok()));
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let s = settings(5);
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", "203.0.113.9, 127.0.0.1".parse().unwrap());
        let proxy: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let stranger: SocketAddr = "198.51.100.1:5000".parse().unwrap();
        assert_eq!(
            client_ip(&s, proxy, &headers),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client_ip(&s, stranger, &headers), stranger.ip());
        assert_eq!(client_ip(&s, proxy, &HeaderMap::new()), proxy.ip());
    }
}
