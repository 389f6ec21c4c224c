-- claim.lua: take due entries of an item's delay queue, each under a lease.
--
-- KEYS[1] due     ZSET  entry -> when it is due (ms)
-- KEYS[2] leased  ZSET  entry -> when its lease runs out (ms)
-- ARGV[1] now (ms)
-- ARGV[2] lease end (ms)
-- ARGV[3] most entries to take
--
-- Entries whose lease ran out (their scheduler died or gave up) are taken first, then due
-- ones. A taken entry stays in `leased` until its scheduler removes it when done, so a
-- scheduler killed mid-work loses nothing, and two schedulers never hold one entry at once.
--
-- Returns the entries taken.

local limit = tonumber(ARGV[3])
local taken = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, limit)
for _, entry in ipairs(taken) do
  redis.call('ZADD', KEYS[2], ARGV[2], entry)
end
if #taken < limit then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, limit - #taken)
  for _, entry in ipairs(due) do
    redis.call('ZREM', KEYS[1], entry)
    redis.call('ZADD', KEYS[2], ARGV[2], entry)
    taken[#taken + 1] = entry
  end
end
return taken
