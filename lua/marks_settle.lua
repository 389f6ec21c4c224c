-- marks_settle.lua: after a pass, set when each bucket it took next needs a look.
--
-- KEYS[1] marks  ZSET  bucket -> when it next needs a look (ms; 0 = at once)
-- ARGV[1] the marker marks_take.lua set (the lease end)
-- ARGV[2..] pairs: bucket, next look (ms), or '' for none
--
-- A bucket still holding the marker was not marked while the pass worked: it gets its
-- next look, or leaves the set. One marked meanwhile (score 0, written after its new work)
-- keeps the earlier of the two, so work added during the pass is never settled away.

local marker = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local bucket, next_at = ARGV[i], ARGV[i + 1]
  local score = redis.call('ZSCORE', KEYS[1], bucket)
  if score and tonumber(score) == marker then
    if next_at == '' then
      redis.call('ZREM', KEYS[1], bucket)
    else
      redis.call('ZADD', KEYS[1], next_at, bucket)
    end
  elseif next_at ~= '' then
    redis.call('ZADD', KEYS[1], 'LT', next_at, bucket)
  end
end
return 0
