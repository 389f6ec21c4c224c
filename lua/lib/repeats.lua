-- lib/repeats.lua: prepended to the scripts that answer a press whose `Idempotency-Key`
-- bought before (grab.lua, bought.lua; src/lua.rs).
--
-- With replicas asked for (`SECKILL_REDIS_WAIT_REPLICAS`), the order a key bought may
-- still be taken back: the press that won it waits for its replicas, and gives it back
-- when they do not confirm it in time (give_back.lua, which drops the key's record too).
-- A repeat answered `202` at once would promise an order that may vanish, and so would one
-- answered before the replicas hold it (a failover loses it). So the repeat claims the
-- order as a sender does (its outbox score, the won-at ms negated: src/outbox/mod.rs), in
-- the script that read the key, where no give-back can come between: a give-back keeps a
-- claimed order, and the caller answers `202` once the replicas hold the claim (and the
-- order before it). An order no longer pending is in MySQL (the consumer drops it from
-- `pending` after its insert; a give-back drops the key with it): nothing can take it back.

-- The answer to a repeat of a key that bought `sn`: 'repeat <sn>' when its order is no
-- longer pending, else 'claimed <sn>' once the order is claimed in `outbox` (a claim made
-- before stays as it is). An error, with nothing written, when the pending order has no
-- won-at time.
local function claim_repeat(pending, outbox, sn)
  local order = redis.call('HGET', pending, sn)
  if not order then
    return 'repeat ' .. sn
  end
  local won_at = string.match(order, '"created_at_ms":(%d+)')
  if not won_at then
    return redis.error_reply('pending order ' .. sn .. ' has no created_at_ms: ' .. order)
  end
  -- `LT`: a claim's score stays as it is (as src/outbox/mod.rs claims).
  redis.call('ZADD', outbox, 'LT', '-' .. won_at, sn)
  return 'claimed ' .. sn
end

