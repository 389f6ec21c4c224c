-- ending_keep.lua: look again later at cancels whose order MySQL still shows unpaid.
--
-- KEYS[1] ending  ZSET  order_sn -> ms (written by ending_begin.lua)
-- ARGV[1] cutoff (ms, from ending_due.lua)
-- ARGV[2..] the orders' numbers
--
-- A cancel whose caller gave up (its MySQL call timed out) may still commit: the
-- `UPDATE` can be waiting on a row lock, or on its way over a slow link. If it commits,
-- its unit must come back; so the record of an order still unpaid is not dropped but
-- timed again now (by this server's clock), and the sweep looks at it again after the
-- same wait — until the order is cancelled (its unit comes back), paid, or ended at its
-- pay deadline (which clears the record too). A record written again since it was read
-- (a newer score) is left as it is.
--
-- Returns how many were kept.

local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local cutoff = tonumber(ARGV[1])
local kept = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= cutoff then
    redis.call('ZADD', KEYS[1], ms, ARGV[i])
    kept = kept + 1
  end
end
return kept
