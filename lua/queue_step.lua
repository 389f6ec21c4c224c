-- queue_step.lua: one admission step of an item's waiting room (src/queue/admit.rs).
--
-- KEYS[1] line    ZSET  user_id -> place (queue_join.lua)
-- KEYS[2] state   HASH  cursor (how many were let in, in the line's order), reserved
--                       (units the live passes may still buy), last_ms and carry_milli
--                       (the rate's allowance), rate_from_ms / rate_n / rate_milli (the
--                       measured rate), expired (passes that ran out unused), paused,
--                       reload_until (a forced warm-up's hold: queue_reload.lua)
-- KEYS[3] passes  ZSET  user_id -> pass expiry (ms)
-- KEYS[4] held    HASH  user_id -> units that user's live pass reserves (and t:<user_id>)
-- KEYS[5] sold    SET   order_sns bought with a pass (queue_used.lua)
-- KEYS[6] used    HASH  user_id -> wins bought with a pass (queue_used.lua)
--
-- `reserved` is the units of the live passes (`held`: user -> units) plus those taken for
-- a purchase under way (`held`: t:<user> -> units; queue_take.lua): a purchase's unit is
-- counted until its win or refusal says what became of it (queue_used.lua,
-- queue_give.lua), or its pass runs out.
-- ARGV[1] start_ms, ARGV[2] end_ms
-- ARGV[3] admit_per_s, ARGV[4] pass_ttl_ms, ARGV[5] per_user
-- ARGV[6] available: units unsold (listed, plus waves still to come), read just before
-- ARGV[7] sold_at_read: SCARD of KEYS[5] read before ARGV[6]
-- ARGV[8] grace_ms: a pass's reservation outlives its expiry by this much (hosts'
--         clocks differ: a buyer's purchase may be let through a little after it)
-- ARGV[9] held: 1 while the sale itself cannot sell (paused, being reloaded): nobody is
--         let in to a sale that would refuse them
-- ARGV[10] reloads_at_read: the state's `reload_gen` read before ARGV[6]; a forced
--         warm-up held the line since (queue_reload.lua), so ARGV[6] may be the stock it
--         replaced: nobody is let in on it
--
-- Atomic, so two schedulers never let one buyer in twice or out of order, and one killed
-- mid-step let in all of its step or none. The bound: the units the live passes reserve
-- never exceed what is unsold. Wins bought with a pass since `available` was read moved
-- both figures (queue_used.lua): they are taken off `available` here; a unit sold since
-- but not yet reported is still counted in `reserved` — counted twice, so the bound errs
-- toward letting fewer in, never more.
--
-- Nobody sees a pass of this step yet: those let in are shown (the state's `shown`) once
-- the queue's replicas hold the step (queue_show.lua), so a failover never takes back a
-- pass somebody holds.
--
-- Returns { admitted now, cursor, reserved, shown }, or { -1 } when nobody ever joined (or
-- the sale was retired, its keys gone): nothing is written then.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return { -1 }
end
local now = queue_now()
local reserved = tonumber(redis.call('HGET', KEYS[2], 'reserved')) or 0

-- Passes past their time (and the grace) give their reservation back.
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[8]))
local unused = 0
for _, user in ipairs(gone) do
  -- Its units, and those taken by purchases under way (one cut off never settles them).
  reserved = reserved - (tonumber(redis.call('HGET', KEYS[4], user)) or 0)
    - (tonumber(redis.call('HGET', KEYS[4], 't:' .. user)) or 0)
  redis.call('HDEL', KEYS[4], user, 't:' .. user)
  redis.call('ZREM', KEYS[3], user)
  if not redis.call('HGET', KEYS[6], user) then
    unused = unused + 1
  end
end
if unused > 0 then
  redis.call('HINCRBY', KEYS[2], 'expired', unused)
end
if reserved < 0 then
  reserved = 0
end

local st = redis.call('HMGET', KEYS[2], 'cursor', 'last_ms', 'carry_milli', 'paused',
  'rate_from_ms', 'rate_n', 'shown', 'reload_until', 'reload_gen')
local cursor = tonumber(st[1]) or 0
local rate = tonumber(ARGV[3])
local full = rate * 1000
local last = tonumber(st[2])
local allowance
if last == nil then
  -- The first step starts the clock: never a second's worth at once on top of the next.
  allowance = 0
else
  allowance = (tonumber(st[3]) or 0) + rate * (now - last)
  if allowance > full then
    allowance = full
  end
end

local admitted = 0
-- Nobody more while the last admissions wait for the replicas (their passes unseen, and
-- running out): see queue_show.lua.
local unshown = cursor > (tonumber(st[7]) or 0)
-- Nobody while a forced warm-up reloads the units (it counted the passes out), nor on a
-- stock read before one held the line.
local reloading = now < (tonumber(st[8]) or 0)
  or (tonumber(st[9]) or 0) ~= (tonumber(ARGV[10]) or 0)
if st[4] ~= '1' and ARGV[9] ~= '1' and not unshown and not reloading and now >= tonumber(ARGV[1])
  and now < tonumber(ARGV[2]) then
  local room = tonumber(ARGV[6]) - (redis.call('SCARD', KEYS[5]) - tonumber(ARGV[7]))
    - reserved
  local per_user = tonumber(ARGV[5])
  local want = math.floor(allowance / 1000)
  local waiting = redis.call('ZCARD', KEYS[1]) - cursor
  if want > waiting then
    want = waiting
  end
  if want > 0 then
    local next_in = redis.call('ZRANGE', KEYS[1], cursor, cursor + want - 1)
    local expires = now + tonumber(ARGV[4])
    for _, user in ipairs(next_in) do
      local units = per_user
      if room < per_user then
        -- The last units, fewer than one buyer may take: to one buyer, alone, once every
        -- other pass is resolved (it may take them all, and nobody else is counting on them).
        if room <= 0 or reserved > 0 then
          break
        end
        units = room
      end
      reserved = reserved + units
      room = room - units
      redis.call('HSET', KEYS[4], user, units)
      redis.call('ZADD', KEYS[3], expires, user)
      admitted = admitted + 1
    end
  end
  allowance = allowance - admitted * 1000
  cursor = cursor + admitted
else
  allowance = 0
end

-- The measured rate: admissions over windows of at least 5 s.
local rate_from = tonumber(st[5]) or now
local rate_n = (tonumber(st[6]) or 0) + admitted
if now - rate_from >= 5000 then
  redis.call('HSET', KEYS[2], 'rate_milli', math.floor(rate_n * 1000000 / (now - rate_from)))
  rate_from = now
  rate_n = 0
end
redis.call('HSET', KEYS[2], 'cursor', cursor, 'reserved', reserved, 'last_ms', now,
  'carry_milli', allowance, 'rate_from_ms', rate_from, 'rate_n', rate_n)
return { admitted, cursor, reserved, tonumber(redis.call('HGET', KEYS[2], 'shown')) or 0 }
