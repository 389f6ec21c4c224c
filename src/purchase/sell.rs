//! The sale of a unit, for a purchase the catalogue in memory could not refuse: the
//! replicas a win will wait for, `grab.lua` in the buyer's bucket (borrowing from a split
//! item's other buckets while it is empty), and a win handed to the publisher once its
//! replicas hold it. `api.rs` is its HTTP surface.

use std::time::Instant;

use chrono::{TimeZone, Utc};

use crate::broker::Outgoing;
use crate::config::WaitPolicy;
use crate::deps::Deps;
use crate::domain::{OrderPlaced, OrderSn, UserId};
use crate::items::catalog::{Catalog, CatalogItem};
use crate::items::transfer::{self, Lending};
use crate::keys::{ItemKeys, Keys};
use crate::marks::{self, Work};
use crate::orders::placed;
use crate::outbox::publisher::OrderPublisher;
use crate::signals::Signals;
use crate::store::{RedisConn, RedisConns, RedisError, Replication, ShortOfReplicas, redis_timed};

use super::grab::{GrabOutcome, IdempotencyKey, bought, give_back, grab};

/// Units a buyer of a split item may borrow into their bucket and lose to others of it
/// before being told to press again (each round moves a unit: the sale goes on).
const MOST_REFILLS: usize = 8;
/// Looks a purchase takes, [`MOVING_WAIT`] apart, while a unit is on its way between
/// buckets, before it answers "press again" (`503`): a loan settles within milliseconds
/// while Redis answers, and a crowd whose units ran out would otherwise hear `503`
/// instead of `410` (`buckets::a_pair_with_one_key_borrowing_hears_its_order_not_503`:
/// 51–56 of its 80 presses heard `503` without these, none with). A loan cut off (a
/// replica short) takes seconds: then `503` at once.
const MOVING_LOOKS: usize = 4;
const MOVING_WAIT: std::time::Duration = std::time::Duration::from_millis(25);

/// How near a wave's time a purchase that memory would refuse asks Redis instead: more
/// than the catalogue's stock refresh (half a second) and a host's clock error.
const WAVE_MARGIN: chrono::Duration = chrono::Duration::seconds(2);

/// What the sale of a unit works with.
pub struct Seller<'a> {
    pub deps: &'a Deps,
    pub catalog: &'a Catalog,
    pub publisher: &'a OrderPublisher,
    /// What purchases measured, for the automatic breaker.
    pub signals: &'a Signals,
}

/// Why a unit was not sold (a sale that was: the order's number).
pub enum NotSold {
    /// Redis (or, before it, memory) said no: sold out, a duplicate, the window, …; a
    /// buyer at their limit while their master is short of replicas hears it too, once
    /// none of their orders is pending.
    Refused(GrabOutcome),
    /// The buyer's master is short of the replicas a win waits for, and the buyer holds
    /// fewer units than their limit, or one of their orders is still pending (it may yet
    /// be given back): nothing was taken.
    WaitingForReplica,
    /// Won, but its replicas did not confirm it in time: the unit was given back where it
    /// still could be (pressing again tells the buyer which).
    Unconfirmed,
    /// A repeated `Idempotency-Key` whose order is still pending: claimed, but its replicas
    /// did not confirm the claim in time. The order is kept and sent once they do; pressing
    /// again with the key then answers it.
    RepeatUnconfirmed,
    /// A buyer at their limit, some of whose orders are still pending: claimed, but their
    /// replicas did not confirm the claims in time. The orders are kept and sent once they
    /// do; pressing again then names them (`409`).
    HeldUnconfirmed,
    Redis(RedisError),
}

impl From<RedisError> for NotSold {
    fn from(e: RedisError) -> Self {
        NotSold::Redis(e)
    }
}

/// What the catalogue already says no to: the window, the pause, the sold-out flag.
pub fn from_memory(item: &CatalogItem, now: chrono::DateTime<Utc>) -> Option<GrabOutcome> {
    if now < item.record.start_at {
        Some(GrabOutcome::NotStarted)
    } else if now >= item.record.end_at || item.record.draw_at.is_some_and(|at| now >= at) {
        // A draw takes no entry after its time (`lua/enter.lua` holds to Redis's clock).
        Some(GrabOutcome::Ended)
    } else if item.record.paused {
        Some(GrabOutcome::Paused)
    } else if item.sold_out(now) {
        // Near a wave Redis decides, by its own clock: a host whose clock runs behind must
        // not keep a wave shut, and the memory of "nothing left" is older than the wave.
        let waves = &item.record.release;
        let near = |at: chrono::DateTime<Utc>| (at - now).abs() <= WAVE_MARGIN;
        match waves.next_at(now) {
            Some(at) if near(at) => None,
            Some(at) => Some(GrabOutcome::BetweenReleases(at.timestamp_millis())),
            None if waves.last_at().is_some_and(near) => None,
            None => Some(GrabOutcome::SoldOut),
        }
    } else {
        None
    }
}

/// Whether an answer naming orders a buyer holds (a repeat of their `Idempotency-Key`, a
/// `409 duplicate` or `limit_reached`) claims those still pending: a win is given back when
/// its replicas do not confirm it in time (`SECKILL_REDIS_WAIT_REPLICAS` under the `refuse`
/// policy; under `degrade` and without replicas nothing is).
fn answers_claim(redis: &RedisConns) -> bool {
    redis
        .wait_rule()
        .is_some_and(|rule| rule.policy == WaitPolicy::Refuse)
}

/// The order a buyer's `Idempotency-Key` bought, for a press memory refused. `None` when it
/// bought nothing; or cannot have, the item never having been loaded (nothing of it was
/// ever on sale: a crowd pressing before the warm-up costs Redis nothing). When Redis
/// cannot say, an error (`503`): the refusal memory gave is not the answer of a key that
/// may hold a unit. An order that may still be given back is claimed and named once its
/// replicas hold the claim, as a grab's repeat is.
pub async fn bought_with(
    redis: &RedisConns,
    keys: &Keys,
    item: &CatalogItem,
    user: UserId,
    key: &str,
) -> Result<Option<OrderSn>, NotSold> {
    if item.never_loaded() {
        return Ok(None);
    }
    let idempotency = IdempotencyKey::of(keys, item, user, key.to_owned());
    if !answers_claim(redis) {
        let mut conn = redis.hot().await?;
        let sn: Option<String> =
            redis_timed(redis::AsyncCommands::get(&mut conn, &idempotency.record)).await?;
        return match sn {
            None => Ok(None),
            Some(sn) => match OrderSn::parse(&sn) {
                Some(order_sn) => Ok(Some(order_sn)),
                None => Err(NotSold::Redis(RedisError::Unexpected(format!(
                    "an Idempotency-Key's record holds {sn:?}"
                )))),
            },
        };
    }
    let home = item.home(user);
    // Taken before the claim, as before a grab (a master short of replicas still gets the
    // claim, which its replicas confirm once they are back).
    let replication = redis.replicas_for(&home.replicated).await.ok();
    let mut conn = redis.hot().await?;
    match bought(&mut conn, home, &idempotency).await? {
        Some(GrabOutcome::RepeatClaimed(order_sn)) => {
            once_held(order_sn, replication).await.map(Some)
        }
        Some(GrabOutcome::Repeat(order_sn)) => Ok(Some(order_sn)),
        _ => Ok(None),
    }
}

/// Whether the replicas taken before a claim hold it (`None`: its master was short of them).
async fn claim_held(replication: Option<Replication>) -> bool {
    match replication {
        Some(replication) => replication.held().await,
        None => false,
    }
}

/// A repeated key's order, claimed while pending: the buyer's once the replicas taken before
/// the claim hold it.
async fn once_held(
    order_sn: OrderSn,
    replication: Option<Replication>,
) -> Result<OrderSn, NotSold> {
    if claim_held(replication).await {
        return Ok(order_sn);
    }
    tracing::info!(%order_sn, "a repeated Idempotency-Key whose order its Redis replicas did not confirm in time: claimed, kept");
    Err(NotSold::RepeatUnconfirmed)
}

impl Seller<'_> {
    /// The Redis step and what came of it, for a purchase memory could not refuse: the
    /// order's number when the buyer won (or, for a repeated `Idempotency-Key`, the one it
    /// won).
    pub async fn sell(
        &self,
        item: &CatalogItem,
        user: UserId,
        now: chrono::DateTime<Utc>,
        key: Option<String>,
    ) -> Result<OrderSn, NotSold> {
        let idempotency = key.map(|key| IdempotencyKey::of(&self.deps.keys, item, user, key));
        // Before the grab (`SECKILL_REDIS_WAIT_REPLICAS`): the replicas a win will wait for,
        // on the master serving the buyer's bucket now. While that master is short of them no
        // unit is taken there — it could never be confirmed.
        let replication = match self
            .deps
            .redis
            .replicas_for(&item.home(user).replicated)
            .await
        {
            Ok(replication) => replication,
            Err(short) => {
                // A key that bought is answered its order first, as when memory refuses the
                // press: `202` once it is in MySQL, `503` while it is pending (claimed, its
                // master short of the replicas that would confirm the claim).
                if let Some(idempotency) = &idempotency {
                    let keys = &self.deps.keys;
                    let bought = bought_with(&self.deps.redis, keys, item, user, &idempotency.key);
                    if let Some(order_sn) = bought.await? {
                        return Ok(order_sn);
                    }
                }
                return Err(self.short_of_replicas(item, user, short).await);
            }
        };
        // Numbered in the buyer's home bucket, where every purchase of theirs goes ("one per
        // user" is decided there).
        let order = item
            .record
            .order_for(item.home(user).bucket, user, now.timestamp_millis());
        let order_json = order.to_json();
        let idempotency = idempotency.as_ref();
        match self
            .run_grab(item, &order, &order_json, idempotency)
            .await?
        {
            GrabOutcome::Won { slot } => {
                let won = Won {
                    order,
                    order_json,
                    slot,
                    idempotency,
                };
                self.accept(item, won, replication).await
            }
            GrabOutcome::Repeat(order_sn) => Ok(order_sn),
            // Not answered before the replicas hold it: the original's give-back keeps a
            // claimed order, a failover before they hold it loses the claim with the order.
            GrabOutcome::RepeatClaimed(order_sn) => once_held(order_sn, Some(replication)).await,
            // The same for a `409` naming orders still pending.
            GrabOutcome::HeldClaimed(refused) => {
                if claim_held(Some(replication)).await {
                    return Err(NotSold::Refused(*refused));
                }
                tracing::info!(refused = ?refused, "orders a 409 names whose claims their Redis replicas did not confirm in time: claimed, kept");
                Err(NotSold::HeldUnconfirmed)
            }
            GrabOutcome::SoldOut => {
                self.sold_out(item);
                Err(NotSold::Refused(GrabOutcome::SoldOut))
            }
            other => Err(NotSold::Refused(other)),
        }
    }

    /// Remembers that Redis found the item sold out; when this instance thought otherwise,
    /// the others learn it from an announcement rather than waiting for their refresh to
    /// come round to the item (in the background: the buyer does not wait for it).
    fn sold_out(&self, item: &CatalogItem) {
        if item.mark_sold_out() {
            let (catalog, item_id) = (self.catalog.clone(), item.record.id);
            tokio::spawn(async move {
                if let Err(e) = catalog.announce(item_id).await {
                    tracing::debug!(error = %e, "could not announce a sell-out; other instances find it themselves");
                }
            });
        }
    }

    /// The Redis step: `grab.lua` in the buyer's bucket (borrowing from the others of a split
    /// item while it is empty), timed, counted and logged.
    async fn run_grab(
        &self,
        item: &CatalogItem,
        order: &OrderPlaced,
        order_json: &str,
        idempotency: Option<&IdempotencyKey>,
    ) -> Result<GrabOutcome, NotSold> {
        let started = Instant::now();
        let mut conn = self.deps.redis.hot().await?;
        let home = item.home(order.user_id);
        let attempt = Attempt {
            order,
            per_user: item.record.per_user,
            order_json,
            idempotency,
            claims: answers_claim(&self.deps.redis),
        };
        let grabbed = attempt.grab(&mut conn, home).await;
        let outcome = if item.record.split() {
            let lending = Lending {
                redis: &self.deps.redis,
                keys: &self.deps.keys,
            };
            let refill = Refill {
                item,
                catalog: self.catalog,
                attempt: &attempt,
                lending,
            };
            refill.grab(&mut conn, grabbed).await
        } else {
            grabbed.map(|(outcome, _)| outcome)
        };
        let took = started.elapsed();
        self.signals.purchase(took, outcome.is_err());
        self.deps.meters.redis_grab_seconds.record(took);
        let duration_ms = took.as_secs_f64() * 1e3;
        // Every unit sold leaves an info line (as many as the stock); the crowd of refusals
        // does not flood the log unless asked for (`RUST_LOG=seckill=debug`).
        match &outcome {
            Ok(GrabOutcome::Won { .. }) => {
                tracing::info!(outcome = "won", duration_ms, "redis_grab")
            }
            Ok(o) => tracing::debug!(outcome = o.as_str(), duration_ms, "redis_grab"),
            // The failure itself is logged once, at the edge (`ApiError`), with its cause.
            Err(_) => tracing::debug!(outcome = "error", duration_ms, "redis_grab"),
        }
        Ok(outcome?)
    }

    /// A press while the buyer's master is short of replicas: the truth where it costs a
    /// read or two (they hold their limit, each order in MySQL: `409`), else `503` until
    /// the replicas are back.
    ///
    /// An order still pending is not named: the press that won it may yet give it back (its
    /// replicas cannot confirm it while they are short). Not claimed either, as a grab
    /// claims it: no claim can be confirmed on this master now, so the answer would be `503`
    /// all the same, and the claim would only keep the unit from going back on sale for a
    /// press that was itself told `503`. Once in MySQL (moments after its `202`) or given
    /// back, pressing again tells.
    async fn short_of_replicas(
        &self,
        item: &CatalogItem,
        user: UserId,
        short: ShortOfReplicas,
    ) -> NotSold {
        tracing::debug!(reason = %short, "purchase refused before the grab");
        let (redis, home) = (&self.deps.redis, item.home(user));
        let mut held = placed::held_by(redis, home, user).await.unwrap_or_default();
        let limit = usize::from(item.record.per_user.max(1));
        if held.len() < limit {
            return NotSold::WaitingForReplica;
        }
        let in_mysql = placed::none_pending(redis, home, user, &held).await;
        if !in_mysql.unwrap_or(false) {
            return NotSold::WaitingForReplica;
        }
        NotSold::Refused(match held.pop() {
            Some(order_sn) if limit == 1 => GrabOutcome::Duplicate(order_sn),
            last => GrabOutcome::LimitReached(held.into_iter().chain(last).collect()),
        })
    }

    /// A win: once its replicas hold it (with `SECKILL_REDIS_WAIT_REPLICAS`), the order goes
    /// to the publisher and the buyer hears `202`.
    async fn accept(
        &self,
        item: &CatalogItem,
        won: Won<'_>,
        replication: Replication,
    ) -> Result<OrderSn, NotSold> {
        let Won {
            mut order,
            mut order_json,
            slot,
            idempotency,
        } = won;
        if slot > 0 {
            // As grab.lua stored it: the order's place goes with it to MySQL.
            order.slot = slot;
            order_json = order.to_json();
        }
        // Not answered, and not handed to the publisher, before the replicas hold it: a
        // failover could otherwise put the unit back on sale while MySQL gets its order.
        if !replication.held().await {
            // Given back while it is still where it was won, so that no unit waits for a
            // confirmation that may never come. Unless someone entered it in the outbox to send
            // it (then it is kept and sent), or a failover loses the give-back (then it is kept,
            // and the safety sweep sends it once its replicas hold it): either way pressing
            // again tells the buyer (409, or their key's 202). A kept order's bucket is marked
            // for the relay at once: a claim (a repeat of the key's, or the buyer's other
            // press answered about the orders they hold) is sent once its replicas hold it,
            // not when the safety sweep comes round to the bucket.
            let home = item.home(order.user_id);
            let given_back = async {
                let mut conn = self.deps.redis.hot().await?;
                let given_back =
                    give_back(&mut conn, home, order.user_id, &order.order_sn, idempotency).await?;
                if !given_back {
                    marks::mark(&mut conn, &self.deps.keys, Work::Relay, [home.bucket]).await?;
                }
                Ok::<_, RedisError>(given_back)
            };
            let given_back = given_back.await;
            tracing::info!(order_sn = %order.order_sn, given_back = ?given_back.as_ref().ok(), "a win its Redis replicas did not confirm in time");
            return Err(NotSold::Unconfirmed);
        }
        self.deps.meters.won.increment(1);
        self.publisher.offer(Outgoing {
            order_sn: order.order_sn.clone(),
            payload: order_json,
            won_at_ms: order.created_at_ms,
        });
        Ok(order.order_sn)
    }
}

/// A won unit, as `accept` takes it.
struct Won<'a> {
    order: OrderPlaced,
    order_json: String,
    /// Its place in the buyer's record.
    slot: u8,
    idempotency: Option<&'a IdempotencyKey>,
}

/// One purchase's `grab.lua` call, made again after each unit borrowed.
struct Attempt<'a> {
    order: &'a OrderPlaced,
    /// The item's `per_user`, as this instance's catalogue has it.
    per_user: u8,
    order_json: &'a str,
    idempotency: Option<&'a IdempotencyKey>,
    /// Whether an answer naming orders the buyer holds claims those still pending.
    claims: bool,
}

impl Attempt<'_> {
    /// The outcome, and the loans `home` had made when it had no unit (`grab::grab`).
    async fn grab(
        &self,
        conn: &mut RedisConn,
        home: &ItemKeys,
    ) -> Result<(GrabOutcome, u64), RedisError> {
        let order = self.order;
        grab(
            conn,
            home,
            (order.user_id, self.per_user),
            &order.order_sn,
            self.order_json,
            self.idempotency,
            self.claims,
        )
        .await
    }
}

/// A split item's purchase while the buyer's own bucket is empty.
struct Refill<'a> {
    item: &'a CatalogItem,
    catalog: &'a Catalog,
    attempt: &'a Attempt<'a>,
    lending: Lending<'a>,
}

impl Refill<'_> {
    /// Borrows from the item's other buckets and grabs again: "sold out" only once no
    /// bucket had a unit to lend.
    async fn grab(
        &self,
        conn: &mut RedisConn,
        mut grabbed: Result<(GrabOutcome, u64), RedisError>,
    ) -> Result<GrabOutcome, RedisError> {
        let item = self.item;
        let home = item.home(self.attempt.order.user_id);
        // The last round's buckets, all empty, each with the loans it had made then.
        let mut last_round: Option<Vec<(u8, u64)>> = None;
        let mut borrowed_one = false;
        // Looks that found a unit on its way.
        let mut moving = 0;
        for _ in 0..MOST_REFILLS {
            let (outcome, home_lends) = grabbed?;
            // Nothing for sale in the buyer's bucket (or nothing until a wave): maybe in
            // another.
            let Some(wave) = empty_until(&outcome) else {
                return Ok(self.decided(home, borrowed_one, outcome));
            };
            item.mark_empty(home.bucket.index, wave);
            let lenders = self.lenders(home);
            let borrowed = transfer::borrow(conn, home, lenders.into_iter(), self.lending).await?;
            for (bucket, _) in &borrowed.empty {
                item.mark_empty(*bucket, wave);
            }
            if borrowed.moved {
                borrowed_one = true;
                last_round = None;
            } else {
                // A unit lent a moment ago and still on its way may be on sale in a bucket
                // asked before its lender, so "sold out" is not said then: press again —
                // unless a last look at home decides for this buyer: the unit on its way
                // arrived, or it went to their own other press (a double click, a retried
                // key), whose order they are owed rather than a 503.
                // A loan settles within milliseconds while Redis answers: the purchase
                // waits for one still moving a few times before answering "press again".
                if borrowed.stalled || borrowed.moving {
                    let (outcome, lends) = self.attempt.grab(conn, home).await?;
                    if empty_until(&outcome).is_none() {
                        return Ok(self.decided(home, borrowed_one, outcome));
                    }
                    // A loan cut off (or a bucket paused, not loaded) does not settle in
                    // milliseconds, and borrowing again would only cut off another.
                    moving += 1;
                    if borrowed.stalled || moving == MOVING_LOOKS {
                        return Ok(GrabOutcome::StillMoving);
                    }
                    tokio::time::sleep(MOVING_WAIT).await;
                    grabbed = Ok((outcome, lends));
                    continue;
                }
                // A loan can also begin and end between two of the asks, from a bucket not
                // yet asked to one asked already (or to this one: its buyer had borrowed a
                // unit and then did not need it), and the unit move on again in the next
                // round. So "sold out" only after two rounds that found every bucket empty
                // with no loan made in between: then no unit can have slipped past both (a
                // cost only on the way there: memory answers the presses after it).
                let mut round = borrowed.empty;
                round.push((home.bucket.index, home_lends));
                if same_round(&mut last_round, round) {
                    return Ok(outcome);
                }
            }
            // Someone else of this bucket may take the unit first: then borrow again.
            grabbed = self.attempt.grab(conn, home).await;
        }
        match grabbed?.0 {
            GrabOutcome::SoldOut => Ok(GrabOutcome::StillMoving),
            other => Ok(other),
        }
    }

    /// The buckets to borrow from: every other one, the fullest first by the last refresh.
    fn lenders(&self, home: &ItemKeys) -> Vec<&ItemKeys> {
        let item = self.item;
        let mut lenders: Vec<&ItemKeys> = item
            .buckets
            .iter()
            .filter(|b| b.bucket != home.bucket)
            .collect();
        let now = crate::clock::now();
        lenders.sort_by_key(|b| std::cmp::Reverse(item.remaining_in(b.bucket.index, now)));
        lenders
    }

    /// An outcome that decides the purchase, after this purchase borrowed a unit
    /// (`borrowed_one`) or not: a unit borrowed and not won stays on sale at home
    /// ([`Refill::left_at_home`]).
    fn decided(&self, home: &ItemKeys, borrowed_one: bool, outcome: GrabOutcome) -> GrabOutcome {
        if borrowed_one && !matches!(outcome, GrabOutcome::Won { .. }) {
            self.left_at_home(home);
        }
        outcome
    }

    /// A unit this purchase borrowed and did not take (the buyer's other press took one
    /// meanwhile) is on sale at home: the buckets this and other instances remember as
    /// empty must not add up to "sold out" while it is there.
    fn left_at_home(&self, home: &ItemKeys) {
        self.item.mark_stocked(home.bucket.index);
        let (catalog, id) = (self.catalog.clone(), self.item.record.id);
        tokio::spawn(async move {
            if let Err(e) = catalog.announce(id).await {
                tracing::debug!(error = %e, "could not announce a unit left in a bucket; other instances find it at their refresh");
            }
        });
    }
}

/// Whether this round of looks found every bucket empty with the same loans made as the
/// last round (each bucket's number and `lends`); remembers this one for the next.
fn same_round(last: &mut Option<Vec<(u8, u64)>>, mut round: Vec<(u8, u64)>) -> bool {
    round.sort_unstable();
    if last.as_ref() == Some(&round) {
        return true;
    }
    *last = Some(round);
    false
}

/// For a grab that found nothing on sale in its bucket, until when: `Some(None)` for no
/// time said (sold out there), `Some(Some(at))` for the wave Redis named — every bucket
/// lists every wave, so none has anything on sale before it; `None` for any other outcome.
fn empty_until(outcome: &GrabOutcome) -> Option<Option<chrono::DateTime<Utc>>> {
    match outcome {
        GrabOutcome::SoldOut => Some(None),
        GrabOutcome::BetweenReleases(at_ms) => Some(Utc.timestamp_millis_opt(*at_ms).single()),
        _ => None,
    }
}
