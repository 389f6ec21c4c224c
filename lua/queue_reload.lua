-- queue_reload.lua: a forced warm-up holds an item's waiting room while it reloads the
-- units (src/warmup/mod.rs), or lets it go.
--
-- KEYS[1] state  HASH  (queue_step.lua)
-- ARGV[1] "hold" or "free"
--
-- "hold" sets `reload_until` (Redis's clock, two minutes on: a warm-up that dies holding
-- it lets go by itself), counts the hold in `reload_gen`, and returns the units the live
-- passes reserve, read in the same step: queue_step.lua lets nobody in while the hold
-- lasts, nor ever on a stock it read before a hold (its `reload_gen` then differs), so no
-- pass is given on the old stock after this read and the reload may count on `reserved`
-- only shrinking. "free" drops `reload_until` (returns 0).
if ARGV[1] == 'free' then
  redis.call('HDEL', KEYS[1], 'reload_until')
  return 0
end
redis.call('HSET', KEYS[1], 'reload_until', queue_now() + 120000)
redis.call('HINCRBY', KEYS[1], 'reload_gen', 1)
return tonumber(redis.call('HGET', KEYS[1], 'reserved')) or 0
