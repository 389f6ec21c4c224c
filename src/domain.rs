//! The few values every part of the server passes around, as types that can only hold a
//! valid value: ids parsed once at the edge, and the order message itself.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An item on sale. Limited to 13 decimal digits so that an order number, which starts with
/// the item id, always fits the contract's 40 characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct ItemId(u64);

impl ItemId {
    pub const MAX: u64 = 9_999_999_999_999;

    pub fn new(id: u64) -> Option<Self> {
        (1..=Self::MAX).contains(&id).then_some(Self(id))
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl TryFrom<u64> for ItemId {
    type Error = String;

    fn try_from(id: u64) -> Result<Self, Self::Error> {
        Self::new(id).ok_or_else(|| format!("an item id is between 1 and {}", Self::MAX))
    }
}

/// An item id on the command line (`--item 1001`).
impl std::str::FromStr for ItemId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let id: u64 = s.parse().map_err(|_| format!("{s:?} is not an item id"))?;
        Self::try_from(id)
    }
}

impl From<ItemId> for u64 {
    fn from(id: ItemId) -> Self {
        id.0
    }
}

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A buyer, as named by the `sub` claim of their token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UserId(u64);

impl UserId {
    pub fn new(id: u64) -> Self {
        Self(id)
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// Parses the decimal form used in token subjects.
    pub fn parse(s: &str) -> Option<Self> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok().map(Self)
    }

    /// Which of the [`crate::keys::BUYER_SHARDS`] buyer shards records this user.
    pub fn shard(self, shards: u32) -> u32 {
        crc32fast::hash(self.0.to_string().as_bytes()) % shards
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An order number: `{item_id}-{ulid}`, at most 40 characters, unique without coordination
/// (80 random bits per millisecond), sortable by time within an item, and telling which
/// item it belongs to, so a pending order can be found in that item's Redis keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OrderSn {
    text: String,
    item: ItemId,
}

impl OrderSn {
    pub const MAX_LEN: usize = 40;

    pub fn generate(item: ItemId) -> Self {
        let text = format!("{item}-{}", ulid::Ulid::new());
        Self { text, item }
    }

    /// Accepts only the shape [`OrderSn::generate`] makes.
    pub fn parse(s: &str) -> Option<Self> {
        let (item, rest) = s.split_once('-')?;
        if s.len() > Self::MAX_LEN
            || item.starts_with('0')
            || !item.bytes().all(|b| b.is_ascii_digit())
            || ulid::Ulid::from_string(rest).is_err()
        {
            return None;
        }
        let item = item.parse().ok().and_then(ItemId::new)?;
        Some(Self {
            text: s.to_owned(),
            item,
        })
    }

    pub fn item(&self) -> ItemId {
        self.item
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl TryFrom<String> for OrderSn {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s).ok_or_else(|| format!("not an order number: {s:?}"))
    }
}

impl From<OrderSn> for String {
    fn from(sn: OrderSn) -> Self {
        sn.text
    }
}

impl fmt::Display for OrderSn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A won unit on its way to MySQL: written into the Redis outbox by `grab.lua`, published
/// to RabbitMQ, inserted by the consumer. Times are milliseconds since the epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_sn: OrderSn,
    pub item_id: ItemId,
    pub user_id: UserId,
    pub created_at_ms: i64,
    pub pay_deadline_ms: i64,
}

impl OrderPlaced {
    /// What in the order MySQL cannot store faithfully: a DATETIME holds the years 1000 to
    /// 9999, and MariaDB stores a zero date for a time outside them instead of refusing.
    pub fn out_of_range(&self) -> Option<&'static str> {
        // 1000-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z.
        const TIMES: std::ops::RangeInclusive<i64> = -30_610_224_000_000..=253_402_300_799_999;
        if !TIMES.contains(&self.created_at_ms) {
            Some("created_at_ms is outside the years 1000 to 9999")
        } else if !TIMES.contains(&self.pay_deadline_ms) {
            Some("pay_deadline_ms is outside the years 1000 to 9999")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_ids_are_bounded() {
        assert!(serde_json::from_str::<ItemId>("0").is_err());
        assert_eq!(
            serde_json::from_str::<ItemId>("1001").ok(),
            ItemId::new(1001)
        );
        assert!(ItemId::new(0).is_none());
        assert!(ItemId::new(1).is_some());
        assert!(ItemId::new(ItemId::MAX).is_some());
        assert!(ItemId::new(ItemId::MAX + 1).is_none());
    }

    #[test]
    fn user_ids_parse_only_decimal() {
        assert_eq!(UserId::parse("42"), Some(UserId::new(42)));
        assert_eq!(
            UserId::parse("18446744073709551615").map(UserId::get),
            Some(u64::MAX)
        );
        for bad in ["", "-1", "+1", "1.0", " 1", "abc", "18446744073709551616"] {
            assert_eq!(UserId::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        let u = UserId::new(12345);
        assert_eq!(u.shard(16), u.shard(16));
        assert!((0..1000).all(|i| UserId::new(i).shard(16) < 16));
    }

    #[test]
    fn order_numbers_fit_and_round_trip() {
        let largest = OrderSn::generate(ItemId::new(ItemId::MAX).unwrap());
        assert!(largest.as_str().len() <= OrderSn::MAX_LEN, "{largest}");
        let sn = OrderSn::generate(ItemId::new(1001).unwrap());
        assert_eq!(OrderSn::parse(sn.as_str()), Some(sn.clone()));
        assert_eq!(sn.item().get(), 1001);
        assert_ne!(sn, OrderSn::generate(ItemId::new(1001).unwrap()));
    }

    #[test]
    fn order_times_must_fit_a_mysql_datetime() {
        let item = ItemId::new(1).unwrap();
        let order = OrderPlaced {
            order_sn: OrderSn::generate(item),
            item_id: item,
            user_id: UserId::new(1),
            created_at_ms: 1_700_000_000_000,
            pay_deadline_ms: 253_402_300_799_999,
        };
        assert_eq!(order.out_of_range(), None);
        let late = OrderPlaced {
            pay_deadline_ms: 253_402_300_800_000,
            ..order.clone()
        };
        assert!(late.out_of_range().is_some());
        let early = OrderPlaced {
            created_at_ms: -30_610_224_000_001,
            ..order
        };
        assert!(early.out_of_range().is_some());
    }

    #[test]
    fn bad_order_numbers_are_refused() {
        for bad in [
            "",
            "1001",
            "1001-",
            "x-01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "0-01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "01001-01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "1001-not-a-ulid",
        ] {
            assert!(OrderSn::parse(bad).is_none(), "{bad:?}");
        }
        assert!(OrderSn::parse("1001-01ARZ3NDEKTSV4RRFFQ69G5FAV").is_some());
    }
}
