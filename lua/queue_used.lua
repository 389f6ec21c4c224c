-- queue_used.lua: a purchase that took a pass's unit (queue_take.lua) won it
-- (src/purchase/api.rs, after its `202`).
--
-- KEYS[1] state, KEYS[2] held, KEYS[3] used, KEYS[4] sold, KEYS[5] passes (as queue_step.lua)
-- ARGV[1] user_id, ARGV[2] order_sn
--
-- Once per order: a repeated `Idempotency-Key` answers the same order again, and its take
-- goes back as a refusal's does. The unit left the stock and `reserved` together, so the
-- step's bound moves by nothing. A pass that reserves nothing more is done: out of
-- `passes`. Returns 1 when counted now, 0 for an order counted before.
local fresh = redis.call('SADD', KEYS[4], ARGV[2]) == 1
if not fresh and redis.call('ZSCORE', KEYS[5], ARGV[1]) then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  return 0
end
if fresh then
  redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
  if not redis.call('HGET', KEYS[2], ARGV[1]) then
    redis.call('ZREM', KEYS[5], ARGV[1])
  end
end
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved')) or 0
if reserved > 0 then
  redis.call('HSET', KEYS[1], 'reserved', reserved - 1)
end
return fresh and 1 or 0
