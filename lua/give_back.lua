-- give_back.lua: undo a won purchase whose unit its replicas did not confirm in time
-- (`SECKILL_REDIS_WAIT_REPLICAS`), unless someone is sending its order already.
--
-- KEYS[1] meta          HASH  fenced
-- KEYS[2] tokens        LIST  unsold units
-- KEYS[3] buyer_orders  HASH  user_id -> the user's live orders (the user's shard)
-- KEYS[4] pending       HASH  order_sn -> order JSON
-- KEYS[5] outbox        ZSET  order_sn -> won-at ms: an order handed over for sending
-- KEYS[6] idempotency   STRING the order the buyer's key bought (only with ARGV[3])
-- ARGV[1] user_id
-- ARGV[2] order_sn
-- ARGV[3] the buyer's Idempotency-Key, '' for none: its record goes too, so pressing again
--         with it buys afresh rather than answering an order that is gone
--
-- Only the purchase that won the order calls this, and only when it did not answer 202
-- and did not hand the order to its publisher. Anyone else who sends a pending order
-- first enters it in the outbox (the safety sweep, for an order no publisher took; a
-- buyer's pay or cancel of it, a repeat of its Idempotency-Key, or another press of its
-- buyer that would name it in a 409, which claim it: src/outbox/mod.rs, lib/repeats.lua),
-- so an order in the outbox, whatever its score, is never taken back: it is kept and
-- sent, and the buyer learns of it by pressing again (409, or the key's 202). (Servers up
-- to commit 668f7da entered every win in the outbox and looked for a claim's negative
-- score; their own wins are still in it, and only they give those back.) While a warm-up
-- replaces the item's units (`fenced`) the order is kept too: the warm-up counts it, and
-- the sweep sends it. Every check comes before the first write (free_place,
-- lib/places.lua, changes nothing when it finds no place).
--
-- Returns 'given_back' (the unit is on sale again, the order gone) or 'kept'.

if redis.call('HEXISTS', KEYS[1], 'fenced') == 1 then
  return 'kept'
end
if redis.call('ZSCORE', KEYS[5], ARGV[2]) then
  return 'kept'
end
if not free_place(KEYS[3], ARGV[1], ARGV[2]) then
  return 'kept'
end
redis.call('HDEL', KEYS[4], ARGV[2])
redis.call('RPUSH', KEYS[2], 'g:' .. ARGV[2])
if ARGV[3] and ARGV[3] ~= '' and redis.call('GET', KEYS[6]) == ARGV[2] then
  redis.call('DEL', KEYS[6])
end
return 'given_back'
