-- queue_show.lua: those let in up to `cursor` may see their passes (src/queue/admit.rs,
-- once the queue's replicas hold the step that let them in).
--
-- KEYS[1] state  HASH  (queue_step.lua)
-- ARGV[1] cursor
--
-- Only ever forward: two schedulers' steps may finish their waits out of order.
local shown = tonumber(redis.call('HGET', KEYS[1], 'shown')) or 0
if tonumber(ARGV[1]) > shown then
  redis.call('HSET', KEYS[1], 'shown', ARGV[1])
end
return 0
