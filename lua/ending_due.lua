-- ending_due.lua: the cancels begun long enough ago that their caller has given up.
--
-- KEYS[1] ending  ZSET  order_sn -> ms (written by ending_begin.lua)
-- ARGV[1] age in ms: records begun at least this long ago, by this server's clock
-- ARGV[2] most records returned
--
-- Returns {cutoff, order_sn, ...}: the cutoff (ms) goes back with the records to
-- forget.lua or ending_keep.lua, which leave alone any record written again since.

local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local cutoff = ms - tonumber(ARGV[1])
local due = redis.call('ZRANGE', KEYS[1], '-inf', cutoff, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
table.insert(due, 1, tostring(cutoff))
return due
