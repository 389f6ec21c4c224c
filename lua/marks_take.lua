-- marks_take.lua: take the buckets whose background work is due, under a lease.
--
-- KEYS[1] marks  ZSET  bucket -> when it next needs a look (ms; 0 = at once)
-- ARGV[1] now (ms)
-- ARGV[2] lease end (ms): the taken buckets' new score, and the marker that
--         marks_settle.lua compares against
-- ARGV[3] most buckets to take
--
-- A taker that dies leaves its buckets due again when the lease runs out; a second taker
-- meanwhile does not see them.
--
-- Returns the buckets taken.

local taken = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, bucket in ipairs(taken) do
  redis.call('ZADD', KEYS[1], ARGV[2], bucket)
end
return taken
