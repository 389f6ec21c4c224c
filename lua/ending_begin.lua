-- ending_begin.lua: record cancels as begun, timed by this Redis server's clock.
--
-- KEYS[1] ending  ZSET  order_sn -> ms: cancels begun, their units not yet back
-- ARGV[1..]       the orders' numbers
--
-- The time is Redis's (`TIME`), not the caller's: the cut-off sweep judges a record's
-- age by the same clock (`ending_due.lua`), so an API host whose clock runs behind or
-- ahead can neither make a fresh cancel look cut off nor an old one look fresh. A record
-- written again (another cancel of the same order) takes the new time.
--
-- Returns the time written (ms).

local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
for i = 1, #ARGV do
  redis.call('ZADD', KEYS[1], ms, ARGV[i])
end
return ms
