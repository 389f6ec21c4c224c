-- enter.lua: a buyer's entry into a draw, once.
--
-- KEYS[1] meta     HASH  loaded, fenced, paused, start_ms, draw_ms, drawn
-- KEYS[2] entries  ZSET  user_id -> rank (this user's home bucket)
-- ARGV[1] user_id
-- ARGV[2] the user's rank (src/draw/rank.rs)
--
-- Entries close at `draw_ms` by Redis's own TIME, the clock the draw waits for: no host
-- whose clock runs behind can slip an entry in after the winners were picked. And they
-- close for good once the draw is being made (`drawn`, written by src/draw/award.rs before
-- the first unit is given, and by a warm-up of a draw MySQL records as made), whatever
-- `draw_ms` says later: once the seed is public anyone can compute ranks, and an entry
-- taken then could be chosen to win the units winners give back.
--
-- Returns 'entered' (new), 'again' (entered before), 'not_loaded', 'reloading', 'paused',
-- 'not_started' or 'closed'.

local meta = redis.call('HMGET', KEYS[1], 'loaded', 'fenced', 'paused', 'start_ms', 'draw_ms',
  'drawn')
if not meta[1] then
  return 'not_loaded'
end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 'again'
end
if meta[6] then
  return 'closed'
end
if meta[2] then
  return 'reloading'
end
if meta[3] == '1' then
  return 'paused'
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now < tonumber(meta[4]) then
  return 'not_started'
end
if not meta[5] or meta[5] == '' or now >= tonumber(meta[5]) then
  return 'closed'
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 'entered'
