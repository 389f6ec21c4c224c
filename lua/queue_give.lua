-- queue_give.lua: a purchase that took a pass's unit (queue_take.lua) did not win one
-- (sold out, its rate, a breaker, a repeated key answering an earlier win): the unit goes
-- back to the pass — or, should the pass have run out meanwhile, out of `reserved`.
--
-- KEYS[1] state, KEYS[2] held, KEYS[3] passes (as queue_step.lua)
-- ARGV[1] user_id
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  return 1
end
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved')) or 0
if reserved > 0 then
  redis.call('HSET', KEYS[1], 'reserved', reserved - 1)
end
return 0
