-- queue_used.lua: a purchase bought with a pass won a unit (src/purchase/api.rs, after
-- its `202`): one unit of the buyer's reservation is spent.
--
-- KEYS[1] state, KEYS[2] held, KEYS[3] used, KEYS[4] sold (as queue_step.lua)
-- ARGV[1] user_id, ARGV[2] order_sn
--
-- Once per order (a repeated `Idempotency-Key` answers the same order again). The unit
-- left the stock and the reservation together, so the step's bound moves by nothing.
-- Returns 1 when counted now, 0 when counted before.
if redis.call('SADD', KEYS[4], ARGV[2]) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
local held = tonumber(redis.call('HGET', KEYS[2], ARGV[1])) or 0
if held > 0 then
  if held == 1 then
    redis.call('HDEL', KEYS[2], ARGV[1])
  else
    redis.call('HSET', KEYS[2], ARGV[1], held - 1)
  end
  local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved')) or 0
  if reserved > 0 then
    redis.call('HSET', KEYS[1], 'reserved', reserved - 1)
  end
end
return 1
