//! Every Redis key and channel name, built here and nowhere else.
//!
//! Shape: `{namespace}:{item:ID}:v1:<what>`. The namespace comes first so deployments and
//! tests can share one Redis; the braces are a Redis Cluster hash tag, so all keys of one
//! item live in one slot (one Lua script may touch them all) while items spread over the
//! cluster; `v1` lets a later layout migrate key by key.

use crate::domain::{BUYER_SHARDS, BucketId, ItemId, UserId};

/// Cheap to clone (it is part of every handler's state).
#[derive(Clone, Debug)]
pub struct Keys {
    namespace: std::sync::Arc<str>,
}

impl Keys {
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.into(),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The keys of one bucket of an item (bucket 0: an item not split).
    pub fn bucket(&self, bucket: BucketId) -> ItemKeys {
        let shards = |what: &str| {
            (0..BUYER_SHARDS)
                .map(|i| self.bucket_key(bucket, &format!("{what}:{i}")))
                .collect()
        };
        ItemKeys {
            bucket,
            meta: self.bucket_key(bucket, "meta"),
            tokens: self.bucket_key(bucket, "tokens"),
            pending: self.pending(bucket),
            outbox: self.outbox(bucket),
            due: self.due(bucket),
            replicated: self.replicated(bucket),
            lent: self.lent(bucket),
            transfers: self.bucket_key(bucket, "transfers"),
            legacy_buyers: shards("buyers"),
            buyer_orders: shards("buyer_orders"),
        }
    }

    /// [`ItemKeys::pending`] alone, for background work that needs no other key.
    pub fn pending(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "pending")
    }

    /// [`ItemKeys::outbox`] alone.
    pub fn outbox(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "outbox")
    }

    /// SET of `order_sn`s RabbitMQ confirmed and the consumer has not yet written (taken out
    /// of the outbox on the confirm, out of here with their `pending` entry): what tells a
    /// confirmed order from one no sender took (`src/outbox/mod.rs`).
    pub fn confirmed(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "confirmed")
    }

    /// [`ItemKeys::due`] alone.
    pub fn due(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "due")
    }

    /// [`ItemKeys::lent`] alone.
    pub fn lent(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "lent")
    }

    /// ZSET of cancels begun: `order_sn` → when (ms). Written before the `UPDATE` that
    /// cancels, removed once the unit is back (or the order turned out not cancelled), so
    /// a cancel cut off between MySQL and Redis is finished by a sweep.
    pub fn ending(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "ending")
    }

    /// ZSET of tasks a scheduler has taken: task → when its lease runs out (ms).
    pub fn leased(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "leased")
    }

    /// Every key a sale leaves in one bucket: what retiring it deletes (`src/items/retire.rs`).
    /// A new kind of per-bucket key belongs here too, or retired sales leave it behind (the
    /// retention test counts the keys left).
    pub fn sale_state(&self, bucket: BucketId) -> Vec<String> {
        let keys = self.bucket(bucket);
        let mut all = vec![
            keys.meta,
            keys.tokens,
            keys.pending,
            keys.outbox,
            self.confirmed(bucket),
            keys.due,
            keys.replicated,
            keys.lent,
            keys.transfers,
            self.ending(bucket),
            self.leased(bucket),
            self.entries(bucket),
            self.awarded(bucket),
        ];
        all.extend(keys.legacy_buyers);
        all.extend(keys.buyer_orders);
        all
    }

    /// What one warm-up run fills before `swap.lua` puts it in place of the live keys: its
    /// own copies, so two runs can never touch each other's.
    pub fn loading(&self, bucket: BucketId, run: &str) -> LoadingKeys {
        let shards = |what: &str| {
            (0..BUYER_SHARDS)
                .map(|i| self.bucket_key(bucket, &format!("{what}:{i}:loading:{run}")))
                .collect()
        };
        LoadingKeys {
            tokens: self.bucket_key(bucket, &format!("tokens:loading:{run}")),
            buyer_orders: shards("buyer_orders"),
        }
    }

    /// STRING: the order a buyer's `Idempotency-Key` bought, in their home bucket (beside
    /// their buyer record, so `grab.lua` writes both at once); it expires after a day, and
    /// so needs no place in [`Keys::sale_state`].
    pub fn idempotency(&self, bucket: BucketId, user: UserId, key: &str) -> String {
        self.bucket_key(bucket, &format!("idem:{user}:{key}"))
    }

    /// ZSET of a draw's entries whose home is this bucket: user → rank
    /// (`src/items/draw.rs`).
    pub fn entries(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "entries")
    }

    /// HASH of a draw's winners whose home is this bucket: user → the order they were
    /// given. A winner is given a unit once, ever (a cancelled one passes it on).
    pub fn awarded(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "awarded")
    }

    /// STRING held by whoever draws the item's winners right now (`SET NX PX`).
    pub fn draw_lock(&self, item: ItemId) -> String {
        self.bucket_key(BucketId::whole(item), "drawing")
    }

    /// STRING held by the warm-up of the item running right now (`SET NX PX`).
    pub fn warmup_lock(&self, item: ItemId) -> String {
        self.bucket_key(BucketId::whole(item), "warming")
    }

    /// STRING counter bumped before a `WAIT`: a write on the item's own Redis master, so
    /// the `WAIT` after it covers every earlier write there (the won unit among them).
    pub fn replicated(&self, bucket: BucketId) -> String {
        self.bucket_key(bucket, "replicated")
    }

    /// STRING held by whoever reconciles the item right now (`SET NX PX`).
    pub fn reconcile_lock(&self, item: ItemId) -> String {
        self.bucket_key(BucketId::whole(item), "reconciling")
    }

    /// The keys of an item's waiting room (`src/queue/`): a hash tag of their own, so a
    /// busy queue and its item's purchases need not share a Redis Cluster node.
    pub fn queue(&self, item: ItemId) -> QueueKeys {
        let key = |what: &str| format!("{}:{{queue:{item}}}:v1:{what}", self.namespace);
        QueueKeys {
            line: key("line"),
            state: key("state"),
            passes: key("passes"),
            held: key("held"),
            used: key("used"),
            sold: key("sold"),
            replicated: key("replicated"),
        }
    }

    /// `{ns}:{item:ID}:v1:…` for bucket 0, `{ns}:{item:ID.B}:v1:…` for bucket B: a hash
    /// tag of its own per bucket.
    fn bucket_key(&self, bucket: BucketId, what: &str) -> String {
        format!("{}:{{item:{bucket}}}:v1:{what}", self.namespace)
    }

    /// SET of the buckets that have state in Redis, as [`BucketId`] displays them (`ID`, or
    /// `ID.B` for a further bucket of a split item); the relay and the scheduler walk it.
    pub fn items_index(&self) -> String {
        format!("{}:items:v1", self.namespace)
    }

    /// ZSET of the draws to come and under way: item id → `draw_at` (ms). See
    /// `src/draw/schedule.rs`.
    pub fn draws(&self) -> String {
        format!("{}:draws:v1", self.namespace)
    }

    /// ZSET of the buckets a kind of background work must look at: bucket (as
    /// [`BucketId`] displays it) → when (ms; 0 = at once). See `src/marks.rs`.
    pub fn marks(&self, work: &str) -> String {
        format!("{}:marks:v1:{}", self.namespace, work)
    }

    /// STRING: a shop as JSON (the Redis layer of the shop status).
    pub fn shop(&self, id: u64) -> String {
        format!("{}:shop:v1:{id}", self.namespace)
    }

    /// STRING held by whoever changes the shop right now (`SET NX PX`, random token).
    pub fn shop_lock(&self, id: u64) -> String {
        format!("{}:shop:v1:{id}:lock", self.namespace)
    }

    /// HASH of the circuit breakers set by hand that are not closed: `global` / `item:ID` →
    /// setting JSON.
    pub fn breakers(&self) -> String {
        format!("{}:circuit:v1", self.namespace)
    }

    /// HASH of every instance's automatic breaker that is not closed: `instance:ID` →
    /// setting JSON. Each instance obeys its own entry only; the others are there for the
    /// operators (`GET /admin/circuit`).
    pub fn automatic_breakers(&self) -> String {
        format!("{}:circuit-auto:v1", self.namespace)
    }

    /// Pub/sub channel on which a breaker change is announced to every instance.
    pub fn breaker_events_channel(&self) -> String {
        format!("{}:circuit-events:v1", self.namespace)
    }

    /// Pub/sub channel on which "item N changed" is announced to every instance.
    pub fn item_events_channel(&self) -> String {
        format!("{}:item-events:v1", self.namespace)
    }

    /// A key that expires when the second `epoch_s` begins: its expiry event wakes the
    /// schedulers for the delay-queue entries due then (one key per second, not per order).
    pub fn wake(&self, epoch_s: i64) -> String {
        format!("{}{epoch_s}", self.wake_prefix())
    }

    /// What every [`Keys::wake`] key starts with.
    pub fn wake_prefix(&self) -> String {
        format!("{}:wake:v1:", self.namespace)
    }

    /// Matches every key of this namespace (for tests and tear-down, never on a hot path).
    pub fn all_pattern(&self) -> String {
        format!("{}:*", self.namespace)
    }
}

/// The keys of one item's waiting room (see `lua/queue_step.lua` for what each holds).
#[derive(Clone, Debug)]
pub struct QueueKeys {
    pub line: String,
    pub state: String,
    pub passes: String,
    pub held: String,
    pub used: String,
    pub sold: String,
    /// STRING bumped before a `WAIT` on the queue's master (as [`Keys::replicated`]).
    pub replicated: String,
}

impl QueueKeys {
    /// Every one of them: what retiring the sale deletes.
    pub fn all(&self) -> [&str; 7] {
        [
            &self.line,
            &self.state,
            &self.passes,
            &self.held,
            &self.used,
            &self.sold,
            &self.replicated,
        ]
    }
}

/// The keys of one item. Built once per item and kept in the item catalog, so the hot path
/// formats no strings.
#[derive(Clone, Debug)]
pub struct ItemKeys {
    /// Which item and bucket these are the keys of.
    pub bucket: BucketId,
    /// HASH: `loaded` (ms), `total` (units this bucket holds, sold or not: less the
    /// listed units, those sold), `paused` (0/1), `start_ms`, `end_ms`; `loaded_on` (the run id of the Redis server
    /// that took the load: another one serving it means a failover or a restart since);
    /// `fenced` (a warm-up's run id while it replaces the units: nothing sells);
    /// `per_user`, `waves`, `draw_ms`; a draw's `drawn` (entries closed: `lua/enter.lua`)
    /// and `first_round_done` (no unit after `end_ms`: `lua/award.lua`); and `rules`, what
    /// `grab.lua` checks of all these packed into one field (`lua/lib/rules.lua`), which
    /// every writer of them keeps.
    pub meta: String,
    /// LIST of unsold units; `LPOP` sells one.
    pub tokens: String,
    /// HASH `order_sn` → order JSON: won, not yet written to MySQL.
    pub pending: String,
    /// ZSET `order_sn` → won-at ms (negative once claimed: `src/outbox/mod.rs`): handed to a
    /// sender and not yet confirmed by RabbitMQ (the relay's work list).
    pub outbox: String,
    /// ZSET delay queue: task (`cancel|SN`, `remind:50|SN`) → when it is due (ms). Tasks a
    /// scheduler has taken wait in [`Keys::leased`] until done or their lease runs out.
    pub due: String,
    /// STRING bumped before a `WAIT` (see [`Keys::replicated`]).
    pub replicated: String,
    /// HASH of units this bucket lent to another of the item's buckets and that have not
    /// arrived for sure: transfer id → `home|unit|ms` (see `lua/lend.lua`).
    pub lent: String,
    /// HASH of transfers into this bucket: transfer id → `in` (the unit arrived) or `void`
    /// (it never will: its lender took it back). Only transfers under way or cut off: the
    /// request that settles its own transfer drops its entry (`items::transfer`).
    pub transfers: String,
    /// ZSET per shard that servers before 2026-12-03 kept beside `buyer_orders` (`user_id`
    /// → won-at ms) and nothing read. During a rolling upgrade the old servers may still
    /// write it; retiring the sale deletes it ([`Keys::sale_state`]).
    legacy_buyers: Vec<String>,
    /// HASH per shard: `user_id` → the orders they hold, by place (for `409 duplicate`;
    /// `lua/lib/places.lua`).
    buyer_orders: Vec<String>,
}

/// A warm-up run's copies of an item's units and buyer records (see [`Keys::loading`]).
#[derive(Clone, Debug)]
pub struct LoadingKeys {
    pub tokens: String,
    buyer_orders: Vec<String>,
}

impl LoadingKeys {
    pub fn buyer_orders(&self, user: UserId) -> &str {
        &self.buyer_orders[user.shard(BUYER_SHARDS) as usize]
    }

    /// Every shard of the buyer records, in the order of [`ItemKeys::buyer_order_shards`].
    pub fn buyer_order_shards(&self) -> &[String] {
        &self.buyer_orders
    }
}

impl ItemKeys {
    pub fn buyer_orders(&self, user: UserId) -> &str {
        &self.buyer_orders[user.shard(BUYER_SHARDS) as usize]
    }

    /// Every shard of the user → order records.
    pub fn buyer_order_shards(&self) -> &[String] {
        &self.buyer_orders
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_namespace_hash_tag_and_version() {
        let keys = Keys::new("ns").bucket(BucketId::whole(ItemId::new(1001).unwrap()));
        assert_eq!(keys.tokens, "ns:{item:1001}:v1:tokens");
        let user = UserId::new(7);
        let shard = user.shard(BUYER_SHARDS);
        assert_eq!(
            keys.buyer_orders(user),
            format!("ns:{{item:1001}}:v1:buyer_orders:{shard}")
        );
        assert_eq!(keys.buyer_order_shards().len(), BUYER_SHARDS as usize);
        assert!(
            keys.buyer_order_shards()
                .iter()
                .all(|k| k.starts_with("ns:{item:1001}:v1:"))
        );
        // Retiring a sale deletes the buyer sets servers before 2026-12-03 wrote too.
        let state = Keys::new("ns").sale_state(BucketId::whole(ItemId::new(1001).unwrap()));
        assert!(state.contains(&format!("ns:{{item:1001}}:v1:buyers:{shard}")));
        let bucket = Keys::new("ns").bucket(BucketId::new(ItemId::new(1001).unwrap(), 3));
        assert_eq!(bucket.tokens, "ns:{item:1001.3}:v1:tokens");
    }
}
