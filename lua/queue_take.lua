-- queue_take.lua: a purchase with a pass takes one of the units the pass reserves, before
-- it tries to buy (src/purchase/api.rs). The unit stays reserved — in the state's
-- `reserved`, as `t:<user>` in `held` — until the purchase ends: a win (queue_used.lua) or
-- a refusal (queue_give.lua); or, should its process die in between, until the pass runs
-- out (queue_step.lua drops both of the user's fields).
--
-- KEYS[1] held  HASH  user_id -> units the user's live pass reserves; t:<user_id> -> units
--                     taken by purchases under way
-- ARGV[1] user_id
--
-- Returns 1 when a unit was taken, 0 when the pass reserves none (spent: its purchases
-- bought what it allows — a pass buys at most `per_user`, also after a cancel — or run
-- out).
local held = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) or 0
if held < 1 then
  return 0
end
if held == 1 then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], held - 1)
end
redis.call('HINCRBY', KEYS[1], 't:' .. ARGV[1], 1)
return 1
