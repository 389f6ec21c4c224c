-- queue_give.lua: a purchase that took a pass's unit (queue_take.lua) did not win one
-- (sold out, its rate, a breaker, a repeated key answering an earlier win): the unit goes
-- back to the pass. A pass that ran out meanwhile took its units out of `reserved` with it
-- (queue_step.lua): nothing is left to give back then.
--
-- KEYS[1] held (as queue_take.lua)
-- ARGV[1] user_id
local taking = 't:' .. ARGV[1]
local taken = tonumber(redis.call('HGET', KEYS[1], taking)) or 0
if taken < 1 then
  return 0
end
if taken == 1 then
  redis.call('HDEL', KEYS[1], taking)
else
  redis.call('HSET', KEYS[1], taking, taken - 1)
end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return 1
