//! Circuit breakers: one global and one per item, each at a level —
//! 0 closed, 1 throttle (at most `SECKILL_BREAKER_THROTTLE_RPS` purchases a second per
//! scope and instance; the rest `503 circuit_open`), 2 degrade (no purchases; reads, pay
//! and cancel still served), 3 stop (no purchases and no pay or cancel either).
//!
//! Levels set by hand ([`admin`]) live in Redis ([`store`]), so a restart keeps them and
//! every instance sees a change within a second; the request path reads them from memory
//! ([`Breakers`]). Besides them each instance has a breaker of its own that trips by itself
//! from what that instance measured and recovers through a half-open probe ([`auto`]): it
//! holds back that instance's purchases only, so one instance's trouble with a dependency
//! never stops the sale on the others (a Redis slow for everyone trips every instance's).
//! A hand-set global level is never overridden by the automatic ones.

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
use ulid::Ulid;

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
    /// One instance's automatic breaker: that instance's purchases.
    Instance(Ulid),
}

impl Scope {
    /// The field of its hash in Redis, and the audit log's `scope`.
    pub fn field(self) -> String {
        match self {
            Scope::Global => "global".to_owned(),
            Scope::Item(id) => format!("item:{id}"),
            Scope::Instance(id) => format!("instance:{id}"),
        }
    }

    pub fn parse(field: &str) -> Option<Self> {
        if field == "global" {
            return Some(Scope::Global);
        }
        if let Some(id) = field.strip_prefix("instance:") {
            return Ulid::from_string(id).ok().map(Scope::Instance);
        }
        let id = field.strip_prefix("item:")?.parse().ok()?;
        ItemId::new(id).map(Scope::Item)
    }

    pub fn item(self) -> Option<ItemId> {
        match self {
            Scope::Item(id) => Some(id),
            Scope::Global | Scope::Instance(_) => None,
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

/// This instance's view of the breaker levels: those set by hand, refreshed from Redis in
/// the background, and its own automatic one.
#[derive(Clone)]
pub struct Breakers {
    inner: Arc<Inner>,
}

struct Inner {
    /// This instance, as its automatic breaker's scope names it.
    me: Ulid,
    global: AtomicU8,
    own: AtomicU8,
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
                me: Ulid::new(),
                global: AtomicU8::new(0),
                own: AtomicU8::new(0),
                items: RwLock::new(HashMap::new()),
                throttle: RateLimiter::keyed(Quota::per_second(rate)),
                clock: DefaultClock::default(),
            }),
        }
    }

    /// This instance, as its automatic breaker, its log and the audit log name it.
    pub fn instance(&self) -> Ulid {
        self.inner.me
    }

    /// The scope of this instance's automatic breaker.
    pub fn own_scope(&self) -> Scope {
        Scope::Instance(self.inner.me)
    }

    pub fn level(&self, scope: Scope) -> Level {
        let of = |level: &AtomicU8| {
            Level::try_from(level.load(Ordering::Relaxed)).unwrap_or(Level::Closed)
        };
        match scope {
            Scope::Global => of(&self.inner.global),
            Scope::Instance(id) if id == self.inner.me => of(&self.inner.own),
            // Another instance's automatic breaker holds back that instance only.
            Scope::Instance(_) => Level::Closed,
            Scope::Item(id) => {
                let items = self.inner.items.read().unwrap_or_else(|e| e.into_inner());
                items.get(&id).copied().unwrap_or(Level::Closed)
            }
        }
    }

    /// Sets this instance's automatic breaker (as its controller found or moved it).
    pub fn set_own(&self, level: Level) {
        self.inner.own.store(level as u8, Ordering::Relaxed);
    }

    /// Replaces the view of the levels set by hand (after reading Redis).
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

    /// Whether the breakers let this through; the global one first, then this instance's
    /// own, then the item's.
    pub fn admit(&self, item: ItemId, action: Action) -> Result<(), Open> {
        // The common case, no breaker anywhere, costs two atomic loads and one map read.
        for scope in [Scope::Global, self.own_scope(), Scope::Item(item)] {
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
        for scope in [
            Scope::Global,
            Scope::Item(item()),
            Scope::Instance(Ulid::new()),
        ] {
            assert_eq!(Scope::parse(&scope.field()), Some(scope));
        }
        assert_eq!(Scope::parse("item:0"), None);
        assert_eq!(Scope::parse("items"), None);
        assert_eq!(Scope::parse("instance:somewhere"), None);
    }

    #[test]
    fn an_automatic_breaker_holds_back_its_own_instance_only() {
        let (here, there) = (Breakers::new(2), Breakers::new(2));
        here.set_own(Level::Degrade);
        let refused = here.admit(item(), Action::Purchase).unwrap_err();
        assert_eq!(
            (refused.level, refused.scope),
            (2, here.own_scope().field())
        );
        assert!(here.admit(item(), Action::OrderChange).is_ok());
        assert!(there.admit(item(), Action::Purchase).is_ok());
        assert_eq!(there.level(here.own_scope()), Level::Closed);
        here.set_own(Level::Closed);
        assert!(here.admit(item(), Action::Purchase).is_ok());
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
