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
    /// The smallest id.
    pub const MIN: Self = Self(1);

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

/// A bucket's address: where an item's units live in Redis, the item itself (bucket 0, every item has it) or
/// one of the further buckets of a hot item spread over several (`"buckets": K`). Each
/// bucket's keys carry their own hash tag, so on a cluster they land on their own slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketId {
    pub item: ItemId,
    pub index: u8,
}

impl BucketId {
    /// Most buckets an item may have.
    pub const MAX_BUCKETS: u8 = 64;

    /// Bucket 0: the whole item, for an item not split.
    pub fn whole(item: ItemId) -> Self {
        Self { item, index: 0 }
    }

    pub fn new(item: ItemId, index: u8) -> Self {
        Self { item, index }
    }

    /// Every bucket of an item split into `buckets`.
    pub fn all(item: ItemId, buckets: u8) -> impl Iterator<Item = BucketId> + Clone + use<> {
        (0..buckets.max(1)).map(move |index| Self { item, index })
    }

    /// The bucket that keeps `user`'s record of an item split into `buckets`: the one all of
    /// their purchases of it go to, so "one unit per user" is decided in one place.
    pub fn home(item: ItemId, user: UserId, buckets: u8) -> Self {
        Self {
            item,
            index: user.bucket(buckets),
        }
    }

    /// `units` shared over `buckets` as evenly as can be, the first ones one more. Each
    /// bucket's share never shrinks as `units` grows, so a part of the units (a wave still
    /// to come) spread the same way never exceeds a bucket's share of the whole.
    pub fn spread(units: u64, buckets: usize) -> Vec<u64> {
        let n = buckets.max(1) as u64;
        (0..n)
            .map(|b| units / n + u64::from(b < units % n))
            .collect()
    }

    /// Parses [`BucketId`]'s display form: `ID` or `ID.B`.
    pub fn parse(s: &str) -> Option<Self> {
        let (item, bucket) = match s.split_once('.') {
            Some((item, bucket)) => (item, bucket.parse().ok()?),
            None => (s, 0),
        };
        let item = ItemId::new(item.parse().ok()?)?;
        (bucket < Self::MAX_BUCKETS).then_some(Self {
            item,
            index: bucket,
        })
    }
}

/// `ID` for bucket 0 (as an item was named before buckets), `ID.B` for the others.
impl fmt::Display for BucketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            0 => self.item.fmt(f),
            b => write!(f, "{}.{b}", self.item),
        }
    }
}

/// How many buyer sets an item's buyers are spread over (`crc32(user) % BUYER_SHARDS`), so
/// that no single Redis value grows with the whole crowd.
pub const BUYER_SHARDS: u32 = 16;

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

    /// Which of the [`BUYER_SHARDS`] buyer shards records this user.
    pub fn shard(self, shards: u32) -> u32 {
        crc32fast::hash(self.0.to_string().as_bytes()) % shards
    }

    /// The user's home bucket of an item split into `buckets` (see [`BucketId::home`]): from
    /// the bits of the hash above the buyer shard's, so a bucket's buyers still spread over
    /// every shard.
    pub fn bucket(self, buckets: u8) -> u8 {
        let hash = crc32fast::hash(self.0.to_string().as_bytes());
        ((hash / BUYER_SHARDS) % u32::from(buckets.max(1))) as u8
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
    stock: BucketId,
}

/// Where in a ULID's 80 random bits the bucket of a bucketed item's order sits (the top 6).
const BUCKET_SHIFT: u32 = 74;

impl OrderSn {
    pub const MAX_LEN: usize = 40;

    /// `ITEM-ULID` for an item in one bucket, as always; `ITEM_ULID` for a bucket of a
    /// split item, the bucket in the ULID's top random bits — so the number says where its
    /// order's records are and still fits 40 characters.
    pub fn generate(stock: BucketId, split: bool) -> Self {
        let mut ulid = ulid::Ulid::new();
        if split {
            let random = (ulid.random() & !(0x3f << BUCKET_SHIFT))
                | (u128::from(stock.index) << BUCKET_SHIFT);
            ulid = ulid::Ulid::from_parts(ulid.timestamp_ms(), random);
        }
        // Written in place, not by `format!`: every purchase that reaches Redis numbers
        // the order it may win.
        let mut text = String::with_capacity(Self::MAX_LEN);
        text.push_str(itoa::Buffer::new().format(stock.item.get()));
        text.push(if split { '_' } else { '-' });
        text.push_str(ulid.array_to_str(&mut [0; ulid::ULID_LEN]));
        Self { text, stock }
    }

    /// Accepts only the shapes [`OrderSn::generate`] makes.
    pub fn parse(s: &str) -> Option<Self> {
        let (item, rest, split) = match s.split_once('-') {
            Some((item, rest)) => (item, rest, false),
            None => {
                let (item, rest) = s.split_once('_')?;
                (item, rest, true)
            }
        };
        if s.len() > Self::MAX_LEN
            || item.starts_with('0')
            || !item.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let ulid = ulid::Ulid::from_string(rest).ok()?;
        let item = item.parse().ok().and_then(ItemId::new)?;
        let bucket = if split {
            (ulid.random() >> BUCKET_SHIFT) as u8
        } else {
            0
        };
        Some(Self {
            text: s.to_owned(),
            stock: BucketId::new(item, bucket),
        })
    }

    pub fn item(&self) -> ItemId {
        self.stock.item
    }

    /// The bucket whose Redis keys hold this order's records.
    pub fn bucket(&self) -> BucketId {
        self.stock
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// When the order was won, in ms since the epoch: its ULID's time (the clock of the
    /// instance that sold it).
    pub fn won_at_ms(&self) -> i64 {
        self.text
            .split(['-', '_'])
            .nth(1)
            .and_then(|ulid| ulid::Ulid::from_string(ulid).ok())
            .map_or(0, |ulid| {
                i64::try_from(ulid.timestamp_ms()).unwrap_or(i64::MAX)
            })
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
    /// The place in the buyer's record the order holds (items with `per_user` > 1; `grab.lua`
    /// adds it to the JSON when not 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slot: u8,
}

fn is_zero(slot: &u8) -> bool {
    *slot == 0
}

impl OrderPlaced {
    /// Its JSON, exactly as `serde_json::to_string` writes it (a test holds the two equal),
    /// written directly: every purchase that reaches Redis carries it, and serde's
    /// serializer cost a quarter of what building the `FCALL` does.
    pub fn to_json(&self) -> String {
        let mut json = String::with_capacity(160);
        let mut number = itoa::Buffer::new();
        // An order number is digits, capitals, `-` and `_` (`OrderSn::parse`): nothing
        // to escape.
        json.push_str("{\"order_sn\":\"");
        json.push_str(self.order_sn.as_str());
        json.push_str("\",\"item_id\":");
        json.push_str(number.format(self.item_id.get()));
        json.push_str(",\"user_id\":");
        json.push_str(number.format(self.user_id.get()));
        json.push_str(",\"created_at_ms\":");
        json.push_str(number.format(self.created_at_ms));
        json.push_str(",\"pay_deadline_ms\":");
        json.push_str(number.format(self.pay_deadline_ms));
        if !is_zero(&self.slot) {
            json.push_str(",\"slot\":");
            json.push_str(number.format(self.slot));
        }
        json.push('}');
        json
    }

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
        let largest = ItemId::new(ItemId::MAX).unwrap();
        for split in [false, true] {
            let sn = OrderSn::generate(BucketId::new(largest, 63), split);
            assert!(sn.as_str().len() <= OrderSn::MAX_LEN, "{sn}");
        }
        let item = ItemId::new(1001).unwrap();
        let sn = OrderSn::generate(BucketId::whole(item), false);
        assert_eq!(OrderSn::parse(sn.as_str()), Some(sn.clone()));
        assert_eq!(sn.item().get(), 1001);
        assert_eq!(sn.bucket(), BucketId::whole(item));
        assert_ne!(sn, OrderSn::generate(BucketId::whole(item), false));
        for bucket in [0, 1, 17, 63] {
            let sn = OrderSn::generate(BucketId::new(item, bucket), true);
            assert_eq!(OrderSn::parse(sn.as_str()), Some(sn.clone()));
            assert_eq!(sn.bucket(), BucketId::new(item, bucket), "{sn}");
        }
    }

    #[test]
    fn stocks_round_trip_and_home_buckets_spread() {
        let item = ItemId::new(7).unwrap();
        for stock in [BucketId::whole(item), BucketId::new(item, 5)] {
            assert_eq!(BucketId::parse(&stock.to_string()), Some(stock));
        }
        assert_eq!(BucketId::whole(item).to_string(), "7");
        assert_eq!(BucketId::parse("7.64"), None);
        let mut seen = [0u32; 8];
        for user in 0..8_000 {
            let stock = BucketId::home(item, UserId::new(user), 8);
            seen[stock.index as usize] += 1;
            assert_eq!(BucketId::home(item, UserId::new(user), 1).index, 0);
        }
        assert!(seen.iter().all(|n| (800..1200).contains(n)), "{seen:?}");
    }

    #[test]
    fn order_times_must_fit_a_mysql_datetime() {
        let item = ItemId::new(1).unwrap();
        let order = OrderPlaced {
            order_sn: OrderSn::generate(BucketId::whole(item), false),
            item_id: item,
            user_id: UserId::new(1),
            created_at_ms: 1_700_000_000_000,
            pay_deadline_ms: 253_402_300_799_999,
            slot: 0,
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
    fn an_order_is_written_as_serde_writes_it() {
        let item = ItemId::new(ItemId::MAX).unwrap();
        for (bucket, slot, created_at_ms) in [(0, 0, 1_700_000_000_000), (5, 3, -1), (63, 255, 0)] {
            let order = OrderPlaced {
                order_sn: OrderSn::generate(BucketId::new(item, bucket), bucket > 0),
                item_id: item,
                user_id: UserId::new(u64::MAX),
                created_at_ms,
                pay_deadline_ms: i64::MAX,
                slot,
            };
            assert_eq!(order.to_json(), serde_json::to_string(&order).unwrap());
            assert_eq!(
                serde_json::from_str::<OrderPlaced>(&order.to_json()).unwrap(),
                order
            );
        }
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

/// How the ids look in the OpenAPI document (`crate::http::openapi`): the ranges and
/// shapes the parsers above accept.
mod schemas {
    use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
    use utoipa::openapi::{KnownFormat, RefOr, SchemaFormat};
    use utoipa::{PartialSchema, ToSchema};

    use super::{ItemId, OrderSn, UserId};

    fn integer(description: &str) -> ObjectBuilder {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(0))
            .description(Some(description))
    }

    impl PartialSchema for ItemId {
        fn schema() -> RefOr<Schema> {
            integer("An item id (1 to 13 digits)")
                .minimum(Some(1))
                .maximum(Some(ItemId::MAX))
                .examples([1001])
                .into()
        }
    }
    impl ToSchema for ItemId {}

    impl PartialSchema for UserId {
        fn schema() -> RefOr<Schema> {
            integer("A user id (the token's `sub`)").into()
        }
    }
    impl ToSchema for UserId {}

    impl PartialSchema for OrderSn {
        fn schema() -> RefOr<Schema> {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some(
                    "An order number: the item id, `-` (or `_` for a split item) and a ULID",
                ))
                .pattern(Some("^[1-9][0-9]{0,12}[-_][0-7][0-9A-HJKMNP-TV-Z]{25}$"))
                .max_length(Some(OrderSn::MAX_LEN))
                .examples(["1001-01JEZ8Q4S5W0M3V2X6Y7Z8A9BC"])
                .into()
        }
    }
    impl ToSchema for OrderSn {}
}
