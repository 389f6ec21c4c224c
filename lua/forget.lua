-- forget.lua: drop members of a sorted set that are not newer than a cutoff.
--
-- KEYS[1] the sorted set (an item's `ending` set of cancels begun)
-- ARGV[1] cutoff score (ms)
-- ARGV[2..] members
--
-- A member written again since it was read (a newer cancel of the same order) has a
-- newer score and stays.
--
-- Returns how many were dropped.

local cutoff = tonumber(ARGV[1])
local dropped = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= cutoff then
    redis.call('ZREM', KEYS[1], ARGV[i])
    dropped = dropped + 1
  end
end
return dropped
