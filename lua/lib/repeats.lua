-- lib/repeats.lua: prepended to the scripts that answer a press with orders the buyer
-- holds already — a repeat of the `Idempotency-Key` that bought one, a buyer at their
-- limit (grab.lua, bought.lua; src/lua.rs).
--
-- With replicas asked for (`SECKILL_REDIS_WAIT_REPLICAS`), an order still pending may be
-- taken back: the press that won it waits for its replicas, and gives it back when they
-- do not confirm it in time (give_back.lua, which drops the key's record too). An answer
-- naming it at once (a repeat's `202`, a `409 duplicate` or `limit_reached`) would promise
-- an order that may vanish, and so would one given before the replicas hold it (a
-- failover loses it). So the answer claims the order as a sender does (its outbox score,
-- the won-at ms negated: src/outbox/mod.rs), in the script that read the key or the buyer
-- record, where no give-back can come between: a give-back keeps a claimed order, and the
-- caller answers once the replicas hold the claim (and the order before it). An order no
-- longer pending is in MySQL (the consumer drops it from `pending` after its insert; a
-- give-back drops it from the buyer record and the key's record with it): nothing can take
-- it back, and it is named at once.

-- Claims those of the orders `sns` (a list) still in `pending`, in `outbox`, with one
-- `ZADD` (`LT`: a claim made before stays as it is, as src/outbox/mod.rs claims). Returns
-- how many it claimed (0: none is pending, each is in MySQL); or nil and an error reply,
-- with nothing written, when a pending order has no won-at time.
local function claim_pending(pending, outbox, sns)
  local claim = nil
  for i = 1, #sns do
    local order = redis.call('HGET', pending, sns[i])
    if order then
      local won_at = string.match(order, '"created_at_ms":(%d+)')
      if not won_at then
        return nil,
          redis.error_reply('pending order ' .. sns[i] .. ' has no created_at_ms: ' .. order)
      end
      claim = claim or { 'ZADD', outbox, 'LT' }
      claim[#claim + 1] = '-' .. won_at
      claim[#claim + 1] = sns[i]
    end
  end
  if not claim then
    return 0
  end
  redis.call(unpack(claim))
  return (#claim - 3) / 2
end

-- The answer to a repeat of a key that bought `sn`: 'repeat <sn>' when its order is no
-- longer pending, else 'claimed <sn>' once the order is claimed in `outbox`. An error,
-- with nothing written, when the pending order has no won-at time.
local function claim_repeat(pending, outbox, sn)
  local claimed, err = claim_pending(pending, outbox, { sn })
  if err then
    return err
  end
  if claimed == 0 then
    return 'repeat ' .. sn
  end
  return 'claimed ' .. sn
end

-- The answer to a buyer at their limit: `refused` ('duplicate <sn>' or 'limit_reached
-- <sn sn …>', naming the orders `live`) as it is when none of them is pending, else
-- 'claimed_' .. `refused` once those pending are claimed in `outbox`. An error, with
-- nothing written, when a pending order has no won-at time.
local function claim_held(pending, outbox, live, refused)
  local claimed, err = claim_pending(pending, outbox, live)
  if err then
    return err
  end
  if claimed == 0 then
    return refused
  end
  return 'claimed_' .. refused
end
