//! Circuit breakers: one global and one per item, each at a level —
//! 0 closed, 1 throttle (at most `SECKILL_BREAKER_THROTTLE_RPS` purchases a second per
//! scope and instance; the rest `503 circuit_open`), 2 degrade (no purchases; reads, pay
//! and cancel still served), 3 stop (no purchases and no pay or cancel either).
//!
//! Levels live in Redis ([`store`]), so a restart keeps them and every instance sees a
//! change within a second; the request path reads them from memory ([`Breakers`]). An
//! operator sets them by hand ([`admin`]); the global one also trips by itself from
//! measured signals and recovers through a half-open probe ([`auto`]). A hand-set level is
//! never overridden by the automatic one.

pub mod admin;
pub mod auto;
pub mod store;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::{Deserialize, Serialize};

use crate::domain::ItemId;

/// How strongly a breaker holds back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "u8", try_from = "u8")]
pub enum Level {
    Closed = 0,
    Throttle = 1,
    Degrade = 2,
    Stop = 3,
}

impl From<Level> for u8 {
    fn from(level: Level) -> u8 {
        level as u8
    }
}

impl TryFrom<u8> for Level {
    type Error = String;

    fn try_from(n: u8) -> Result<Self, Self::Error> {
        match n {
            0 => Ok(Level::Closed),
            1 => Ok(Level::Throttle),
            2 => Ok(Level::Degrade),
            3 => Ok(Level::Stop),
            _ => Err(format!("a breaker level is 0 to 3, not {n}")),
        }
    }
}

/// A level as the API shows it: its number.
impl utoipa::PartialSchema for Level {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::Integer)
            .minimum(Some(0))
            .maximum(Some(3))
            .description(Some("0 closed, 1 throttle, 2 degrade, 3 stop"))
            .into()
    }
}
impl utoipa::ToSchema for Level {}

/// What a breaker covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    Global,
    Item(ItemId),
}

impl Scope {
    /// The field of the breakers hash in Redis, and the audit log's `scope`.
    pub fn field(self) -> String {
        match self {
            Scope::Global => "global".to_owned(),
            Scope::Item(id) => format!("item:{id}"),
        }
    }

    pub fn parse(field: &str) -> Option<Self> {
        if field == "global" {
            return Some(Scope::Global);
        }
        let id = field.strip_prefix("item:")?.parse().ok()?;
        ItemId::new(id).map(Scope::Item)
    }

    pub fn item(self) -> Option<ItemId> {
        match self {
            Scope::Global => None,
            Scope::Item(id) => Some(id),
        }
    }
}

/// What a request wants to do, as far as breakers care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Purchase,
    /// Pay or cancel.
    OrderChange,
}

/// A breaker that refused: its level, its scope (`global`, `item:{id}`) and when to try
/// again. Answered as `503 circuit_open` (`admin.rs`).
#[derive(Debug)]
pub struct Open {
    pub level: u8,
    pub scope: String,
    pub retry_after: Duration,
}

/// Every instance's view of the breaker levels, refreshed from Redis in the background.
#[derive(Clone)]
pub struct Breakers {
    inner: Arc<Inner>,
}

struct Inner {
    global: AtomicU8,
    items: RwLock<HashMap<ItemId, Level>>,
    throttle: DefaultKeyedRateLimiter<Scope>,
    clock: DefaultClock,
}

impl Breakers {
    /// `throttle_rps`: purchases a second admitted per scope at level 1.
    pub fn new(throttle_rps: u32) -> Self {
        let rate = NonZeroU32::new(throttle_rps.max(1)).unwrap_or(NonZeroU32::MIN);
        Self {
            inner: Arc::new(Inner {
                global: AtomicU8::new(0),
                items: RwLock::new(HashMap::new()),
                throttle: RateLimiter::keyed(Quota::per_second(rate)),
                clock: DefaultClock::default(),
            }),
        }
    }

    pub fn level(&self, scope: Scope) -> Level {
        match scope {
            Scope::Global => {
                Level::try_from(self.inner.global.load(Ordering::Relaxed)).unwrap_or(Level::Closed)
            }
            Scope::Item(id) => {
                let items = self.inner.items.read().unwrap_or_else(|e| e.into_inner());
                items.get(&id).copied().unwrap_or(Level::Closed)
            }
        }
    }

    /// Replaces the whole view (after reading Redis).
    pub fn set_all(&self, levels: &HashMap<Scope, Level>) {
        let global = levels.get(&Scope::Global).copied().unwrap_or(Level::Closed);
        self.inner.global.store(global as u8, Ordering::Relaxed);
        let items: HashMap<ItemId, Level> = levels
            .iter()
            .filter_map(|(scope, level)| scope.item().map(|id| (id, *level)))
            .filter(|(_, level)| *level != Level::Closed)
            .collect();
        *self.inner.items.write().unwrap_or_else(|e| e.into_inner()) = items;
    }

    /// Whether the breakers let this through; the global one first, then the item's.
    pub fn admit(&self, item: ItemId, action: Action) -> Result<(), Open> {
        // The common case, no breaker anywhere, costs one atomic load and one map read.
        for scope in [Scope::Global, Scope::Item(item)] {
            let level = self.level(scope);
            let refused = match (level, action) {
                (Level::Closed, _) => None,
                (Level::Throttle, Action::Purchase) => self.throttled(scope),
                (Level::Throttle | Level::Degrade, Action::OrderChange) => None,
                (Level::Degrade | Level::Stop, Action::Purchase) => Some(Duration::from_secs(5)),
                (Level::Stop, Action::OrderChange) => Some(Duration::from_secs(5)),
            };
            if let Some(retry_after) = refused {
                return Err(Open {
                    level: level as u8,
                    scope: scope.field(),
                    retry_after,
                });
            }
        }
        Ok(())
    }

    /// At level 1: `None` while the scope is within its rate, else how long to wait.
    fn throttled(&self, scope: Scope) -> Option<Duration> {
        self.inner
            .throttle
            .check_key(&scope)
            .err()
            .map(|not_until| not_until.wait_time_from(self.inner.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item() -> ItemId {
        ItemId::new(7).unwrap()
    }

    #[test]
    fn scopes_round_trip_through_their_field() {
        for scope in [Scope::Global, Scope::Item(item())] {
            assert_eq!(Scope::parse(&scope.field()), Some(scope));
        }
        assert_eq!(Scope::parse("item:0"), None);
        assert_eq!(Scope::parse("items"), None);
    }

    #[test]
    fn levels_hold_back_more_as_they_rise() {
        let breakers = Breakers::new(2);
        assert!(breakers.admit(item(), Action::Purchase).is_ok());
        let mut levels = HashMap::from([(Scope::Item(item()), Level::Throttle)]);
        breakers.set_all(&levels);
        // A burst of the rate, then refusals.
        let admitted = (0..10)
            .filter(|_| breakers.admit(item(), Action::Purchase).is_ok())
            .count();
        assert_eq!(admitted, 2);
        assert!(breakers.admit(item(), Action::OrderChange).is_ok());
        // Another item is not affected by this item's breaker.
        assert!(
            breakers
                .admit(ItemId::new(8).unwrap(), Action::Purchase)
                .is_ok()
        );
        levels.insert(Scope::Item(item()), Level::Degrade);
        breakers.set_all(&levels);
        assert!(breakers.admit(item(), Action::Purchase).is_err());
        assert!(breakers.admit(item(), Action::OrderChange).is_ok());
        levels.insert(Scope::Global, Level::Stop);
        breakers.set_all(&levels);
        let other = ItemId::new(8).unwrap();
        assert!(breakers.admit(other, Action::Purchase).is_err());
        assert!(breakers.admit(other, Action::OrderChange).is_err());
        breakers.set_all(&HashMap::new());
        assert!(breakers.admit(item(), Action::Purchase).is_ok());
    }
}
