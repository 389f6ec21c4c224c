-- queue_used.lua: a purchase that took a pass's unit (queue_take.lua) won it
-- (src/purchase/api.rs, after its `202`).
--
-- KEYS[1] state, KEYS[2] held, KEYS[3] used, KEYS[4] sold, KEYS[5] passes (as queue_step.lua)
-- ARGV[1] user_id, ARGV[2] order_sn
--
-- Once per order: a repeated `Idempotency-Key` answers the same order again, and its unit
-- goes back to the pass as a refusal's does. A win's unit left the stock and `reserved`
-- together, so the step's bound moves by nothing (unless the pass ran out meanwhile: its
-- units left `reserved` then). A pass that reserves nothing more is done: out of
-- `passes`. Returns 1 when counted now, 0 for an order counted before.
local taking = 't:' .. ARGV[1]
local taken = tonumber(redis.call('HGET', KEYS[2], taking)) or 0
local fresh = redis.call('SADD', KEYS[4], ARGV[2]) == 1
if taken > 0 then
  if taken == 1 then
    redis.call('HDEL', KEYS[2], taking)
  else
    redis.call('HSET', KEYS[2], taking, taken - 1)
  end
end
if not fresh then
  if taken > 0 then
    redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  end
  return 0
end
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
if taken > 0 then
  local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved')) or 0
  if reserved > 0 then
    redis.call('HSET', KEYS[1], 'reserved', reserved - 1)
  end
end
if not redis.call('HGET', KEYS[2], ARGV[1]) and not redis.call('HGET', KEYS[2], taking) then
  redis.call('ZREM', KEYS[5], ARGV[1])
end
return 1
